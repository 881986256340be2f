//! The demo's Kubernetes objects. They are the samples of `deploy/samples/` (compiled in, so the
//! demo shows those very files working) with the moto endpoint put in, and applied server-side
//! so that applying them twice is harmless.

use std::fmt::Debug;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use vmop::api::{ConnectionConfigMap, ProviderConfig, ProviderConfigRef, VirtualMachine};

/// The operator's namespace: it holds the credentials Secret, the only Secrets vmop may read.
pub const OPERATOR_NAMESPACE: &str = "vmop-system";
/// Where the demo's VirtualMachines live.
pub const DEMO_NAMESPACE: &str = "demo";
/// The ProviderConfig pointing the ec2 plugin at moto.
pub const PROVIDER_CONFIG: &str = "ec2-moto";
/// The plugin file the ProviderConfig names, in the operator's plugin directory.
pub const PLUGIN_FILE: &str = "ec2.wasm";
/// The demo's machines: name, vCPUs, memory.
pub const VMS: [(&str, u32, &str); 3] = [
    ("web-1", 1, "1Gi"),
    ("web-2", 2, "4Gi"),
    ("db-1", 4, "16Gi"),
];

const FIELD_MANAGER: &str = "vmop-demo";
const PROVIDER_CONFIG_SAMPLE: &str =
    include_str!("../../../../deploy/samples/ec2-providerconfig.yaml");
const SECRET_SAMPLE: &str = include_str!("../../../../deploy/samples/ec2-credentials.yaml");
const VM_SAMPLE: &str = include_str!("../../../../deploy/samples/virtualmachine.yaml");

/// Every object of the demo, ready to apply.
#[derive(Debug)]
pub struct Objects {
    pub namespaces: Vec<Namespace>,
    pub secret: Secret,
    pub provider_config: ProviderConfig,
    pub vms: Vec<VirtualMachine>,
}

impl Objects {
    /// The samples, pointed at the EC2 API at `endpoint` (`http://127.0.0.1:<port>`).
    pub fn for_endpoint(endpoint: &str) -> anyhow::Result<Self> {
        let namespaces = [OPERATOR_NAMESPACE, DEMO_NAMESPACE]
            .map(|name| Namespace {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            })
            .to_vec();

        let mut secret: Secret = parse("ec2-credentials.yaml", SECRET_SAMPLE)?;
        secret.metadata.namespace = Some(OPERATOR_NAMESPACE.to_owned());

        let mut provider_config: ProviderConfig =
            parse("ec2-providerconfig.yaml", PROVIDER_CONFIG_SAMPLE)?;
        provider_config.metadata.name = Some(PROVIDER_CONFIG.to_owned());
        let spec = &mut provider_config.spec;
        spec.plugin.path = PLUGIN_FILE.to_owned();
        spec.config
            .insert("endpoint".to_owned(), endpoint.to_owned());
        spec.config
            .insert("region".to_owned(), "us-east-1".to_owned());
        spec.allowed_hosts = vec![endpoint.to_owned()];
        if let Some(secret_ref) = spec.credentials_secret_ref.as_mut() {
            secret_ref.namespace = OPERATOR_NAMESPACE.to_owned();
            secret_ref.name = secret.name_any();
        }

        let template: VirtualMachine = parse("virtualmachine.yaml", VM_SAMPLE)?;
        let vms = VMS
            .iter()
            .map(|&(name, cpu, memory)| {
                let mut vm = template.clone();
                vm.metadata = ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(DEMO_NAMESPACE.to_owned()),
                    ..ObjectMeta::default()
                };
                vm.spec.provider_config_ref = ProviderConfigRef {
                    name: PROVIDER_CONFIG.to_owned(),
                };
                // An AMI moto serves by default (the sample's id is a placeholder).
                vm.spec.image = vmop_tests::operator::IMAGE.to_owned();
                vm.spec.cpu = cpu;
                vm.spec.memory = Quantity(memory.to_owned());
                vm.spec.connection_config_map = Some(ConnectionConfigMap {
                    name: format!("{name}-connection"),
                });
                vm
            })
            .collect();

        Ok(Self {
            namespaces,
            secret,
            provider_config,
            vms,
        })
    }

    /// Applies every object; namespaces first, the VirtualMachines last.
    pub async fn apply(&self, client: &Client) -> anyhow::Result<()> {
        for namespace in &self.namespaces {
            apply(&Api::all(client.clone()), namespace).await?;
        }
        apply(
            &Api::namespaced(client.clone(), OPERATOR_NAMESPACE),
            &self.secret,
        )
        .await?;
        apply(&Api::all(client.clone()), &self.provider_config).await?;
        for vm in &self.vms {
            apply(&Api::namespaced(client.clone(), DEMO_NAMESPACE), vm).await?;
        }
        Ok(())
    }
}

fn parse<K: DeserializeOwned>(file: &str, yaml: &str) -> anyhow::Result<K> {
    serde_norway::from_str(yaml).with_context(|| format!("deploy/samples/{file} does not parse"))
}

async fn apply<K>(api: &Api<K>, object: &K) -> anyhow::Result<()>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("failed to apply {kind} {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_the_demo_objects_pointed_at_the_endpoint() {
        let endpoint = "http://127.0.0.1:5000";
        let objects = Objects::for_endpoint(endpoint).unwrap();

        let spec = &objects.provider_config.spec;
        assert_eq!(
            spec.config.get("endpoint").map(String::as_str),
            Some(endpoint)
        );
        assert_eq!(spec.allowed_hosts, vec![endpoint.to_owned()]);
        let secret_ref = spec.credentials_secret_ref.as_ref().unwrap();
        assert_eq!(
            (secret_ref.namespace.as_str(), secret_ref.name.as_str()),
            (OPERATOR_NAMESPACE, objects.secret.name_any().as_str())
        );
        assert_eq!(
            objects.secret.namespace().as_deref(),
            Some(OPERATOR_NAMESPACE)
        );

        let names: Vec<_> = objects.vms.iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["web-1", "web-2", "db-1"]);
        for vm in &objects.vms {
            assert_eq!(vm.namespace().as_deref(), Some(DEMO_NAMESPACE));
            assert_eq!(vm.spec.provider_config_ref.name, PROVIDER_CONFIG);
        }
        let sizes: Vec<_> = objects
            .vms
            .iter()
            .map(|vm| (vm.spec.cpu, vm.spec.memory.0.as_str()))
            .collect();
        assert_eq!(sizes, [(1, "1Gi"), (2, "4Gi"), (4, "16Gi")]);
    }
}
