//! The operator under test, on the real control plane, with the real EC2 plugin against moto.
//!
//! [`Env`] is one test's world: a namespace (holding its VMs and, as the operator namespace,
//! its credentials Secret), a moto server, a plugin directory with the EC2 plugin, and
//! ProviderConfigs labelled for this test only. [`Operator`] is `vmop run` as a child process,
//! restricted to that namespace and those ProviderConfigs, so tests of one binary can run in
//! parallel on the shared control plane.

mod history;
mod process;
pub mod scrape;
pub mod writes;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Resource, ResourceExt};
use vmop::api::{
    CredentialsMode, Limits, PluginSource, ProviderConfig, ProviderConfigSpec, SecretRef,
    VirtualMachine,
};

pub use history::History;
pub use process::{KEEP_LOGS, LOG_FILTER, Operator, OperatorArgs, ProviderCall, provider_calls_in};
pub use scrape::Scrape;

use crate::controlplane::ControlPlane;
use crate::fixtures::{self, VirtualMachineBuilder};
use crate::moto::{AwsCredentials, Moto};

/// Generous: the machine may be busy compiling; a passing test never waits this long.
pub const DEADLINE: Duration = Duration::from_secs(120);
/// An AMI moto serves by default.
pub const IMAGE: &str = "ami-12c6146b";
/// The tag the EC2 plugin puts the VM's uid in.
pub const UID_TAG: &str = "vmop.dev/uid";
/// The label selecting one test's ProviderConfigs.
pub const TEST_LABEL: &str = "vmop.dev/test";
/// `creationGracePeriodSeconds` of the tests' ProviderConfigs.
pub const TEST_GRACE_SECONDS: u32 = 2;
/// File name of the EC2 plugin in the plugin directory.
pub const PLUGIN_FILE: &str = "ec2.wasm";
const FIELD_MANAGER: &str = "vmop-tests";

/// Installs (server-side apply) both CRDs and waits until they are served.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in vmop::cli::crds::all() {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("failed to apply CRD {name}"))?;
        tokio::time::timeout(
            DEADLINE,
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} was not Established in time"))??;
    }
    Ok(())
}

/// One test's namespace, moto, plugin directory and ProviderConfigs.
pub struct Env {
    pub control_plane: &'static ControlPlane,
    pub client: Client,
    pub namespace: String,
    pub moto: Moto,
    /// The credentials moto accepts when it authenticates (`None`: it accepts anything).
    pub credentials: Option<AwsCredentials>,
    pub plugin_dir: tempfile::TempDir,
}

impl Env {
    /// A namespace named after `prefix` on the binary's shared control plane, CRDs installed,
    /// moto accepting any credentials.
    pub async fn new(prefix: &str) -> anyhow::Result<Env> {
        Self::build(ControlPlane::shared().await?, prefix, false).await
    }

    /// Like [`Env::new`], with moto checking SigV4 signatures against an IAM user's key
    /// ([`Env::credentials`]).
    pub async fn with_auth(prefix: &str) -> anyhow::Result<Env> {
        Self::build(ControlPlane::shared().await?, prefix, true).await
    }

    /// Like [`Env::new`], on `control_plane` ([`ControlPlane::isolated`] or
    /// [`ControlPlane::dedicated`]) instead of the shared one.
    pub async fn on(control_plane: &'static ControlPlane, prefix: &str) -> anyhow::Result<Env> {
        Self::build(control_plane, prefix, false).await
    }

    async fn build(
        control_plane: &'static ControlPlane,
        prefix: &str,
        auth: bool,
    ) -> anyhow::Result<Env> {
        let (client, namespace) = control_plane.test_namespace(prefix).await?;
        install_crds(&client).await?;
        let (moto, credentials) = if auth {
            let (moto, credentials) = Moto::start_with_auth()?;
            (moto, Some(credentials))
        } else {
            (Moto::start()?, None)
        };
        let plugin_dir = tempfile::tempdir()?;
        let wasm = crate::wasm::path("vmop_provider_ec2")?;
        std::fs::copy(wasm, plugin_dir.path().join(PLUGIN_FILE))
            .with_context(|| format!("failed to copy {}", wasm.display()))?;
        Ok(Env {
            control_plane,
            client,
            namespace,
            moto,
            credentials,
            plugin_dir,
        })
    }

    /// A ProviderConfig name unique to this test.
    pub fn provider_config_name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.namespace)
    }

    /// Creates the credentials Secret `name` in the test namespace (the operator namespace).
    pub async fn create_secret(
        &self,
        name: &str,
        credentials: &AwsCredentials,
    ) -> anyhow::Result<()> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            string_data: Some(BTreeMap::from([
                (
                    "access_key_id".to_owned(),
                    credentials.access_key_id.clone(),
                ),
                (
                    "secret_access_key".to_owned(),
                    credentials.secret_access_key.clone(),
                ),
            ])),
            ..Secret::default()
        };
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .with_context(|| format!("failed to create Secret {name}"))?;
        Ok(())
    }

    /// A ProviderConfig for moto with the credentials Secret `secret`, labelled for this test.
    pub fn provider_config(&self, suffix: &str, secret: &str) -> ProviderConfig {
        let mut pc = ProviderConfig::new(
            &self.provider_config_name(suffix),
            ProviderConfigSpec {
                plugin: PluginSource {
                    path: PLUGIN_FILE.to_owned(),
                    sha256: None,
                },
                config: BTreeMap::from([
                    ("region".to_owned(), "us-east-1".to_owned()),
                    ("endpoint".to_owned(), self.moto.endpoint()),
                ]),
                credentials_secret_ref: Some(SecretRef {
                    namespace: self.namespace.clone(),
                    name: secret.to_owned(),
                }),
                // The host signs; the ec2 plugin holds no key.
                credentials: CredentialsMode::AwsSigV4,
                // moto's loopback address is named literally, which permits it.
                allowed_hosts: vec![self.moto.endpoint()],
                allow_private_networks: false,
                // moto has no read-after-write lag: a short grace keeps deletions quick.
                limits: Limits {
                    creation_grace_period_seconds: TEST_GRACE_SECONDS,
                    ..Limits::default()
                },
                orphan_policy: Default::default(),
            },
        );
        pc.metadata.labels = Some(BTreeMap::from([(
            TEST_LABEL.to_owned(),
            self.namespace.clone(),
        )]));
        pc
    }

    /// Creates or replaces a ProviderConfig (server-side apply).
    pub async fn apply_provider_config(&self, pc: &ProviderConfig) -> anyhow::Result<()> {
        let mut pc = pc.clone();
        pc.metadata.managed_fields = None;
        pc.metadata.resource_version = None;
        self.provider_configs()
            .patch(
                &pc.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&pc),
            )
            .await
            .with_context(|| format!("failed to apply ProviderConfig {}", pc.name_any()))?;
        Ok(())
    }

    /// Secret `name` and ProviderConfig `suffix` using it, with moto's credentials (or dummy
    /// ones when moto does not authenticate). Returns the ProviderConfig's name.
    pub async fn standard_provider(&self, suffix: &str) -> anyhow::Result<String> {
        let credentials = self.credentials.clone().unwrap_or(AwsCredentials {
            access_key_id: "AKIDTESTTESTTESTTEST".to_owned(),
            secret_access_key: "not-checked".to_owned(),
        });
        let secret = format!("creds-{suffix}");
        self.create_secret(&secret, &credentials).await?;
        let pc = self.provider_config(suffix, &secret);
        self.apply_provider_config(&pc).await?;
        Ok(pc.name_any())
    }

    /// VM `name` in the test namespace on `provider`, with the defaults of
    /// [`fixtures::vm`](crate::fixtures::vm) (1 CPU, 512Mi, moto's default AMI): refine it, then
    /// [`Env::create_vm`] or `build()` it.
    pub fn vm(&self, name: &str, provider: &str) -> VirtualMachineBuilder {
        fixtures::vm(name)
            .namespace(&self.namespace)
            .provider(provider)
    }

    /// Creates `vm` (a [`VirtualMachine`] or a builder) in the test namespace.
    pub async fn create_vm(&self, vm: impl Into<VirtualMachine>) -> anyhow::Result<VirtualMachine> {
        let vm = vm.into();
        self.vms()
            .create(&PostParams::default(), &vm)
            .await
            .with_context(|| format!("failed to create VirtualMachine {}", vm.name_any()))
    }

    pub fn vms(&self) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The uids of the VMs in the test namespace now.
    pub async fn vm_uids(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .vms()
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter_map(|vm| vm.metadata.uid.clone())
            .collect())
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn provider_configs(&self) -> Api<ProviderConfig> {
        Api::all(self.client.clone())
    }

    /// Waits until VM `name` satisfies `condition` (`None`: it does not exist), or fails after
    /// [`DEADLINE`] saying what was awaited and what the VM looked like last.
    pub async fn wait_vm(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(Option<&VirtualMachine>) -> bool,
    ) -> anyhow::Result<Option<VirtualMachine>> {
        wait_for(self.vms(), name, what, condition).await
    }

    /// Waits until VM `name` has condition `type_` with `status` (and `reason`, if given).
    pub async fn wait_vm_condition(
        &self,
        name: &str,
        type_: &str,
        status: &str,
        reason: Option<&str>,
    ) -> anyhow::Result<VirtualMachine> {
        let what = format!("{type_}={status} ({})", reason.unwrap_or("any reason"));
        let vm = self
            .wait_vm(name, &what, |vm| {
                vm.is_some_and(|vm| has_condition(vm, type_, status, reason))
            })
            .await?;
        vm.context("the VM vanished")
    }

    /// Every version of VM `name` written from now on: for a state the operator may leave
    /// again at once, which a wait started after the act could miss ([`History`]).
    pub async fn vm_history(&self, name: &str) -> anyhow::Result<History<VirtualMachine>> {
        History::start(self.vms(), name).await
    }

    /// Waits until VM `name` is Ready.
    pub async fn wait_ready(&self, name: &str) -> anyhow::Result<VirtualMachine> {
        self.wait_vm_condition(name, "Ready", "True", None).await
    }

    /// Waits until VM `name` no longer exists.
    pub async fn wait_gone(&self, name: &str) -> anyhow::Result<()> {
        self.wait_vm(name, "deleted", |vm| vm.is_none())
            .await
            .map(drop)
    }

    /// The operator for this test (namespace-restricted, this test's ProviderConfigs only).
    pub fn operator(&self) -> OperatorArgs {
        OperatorArgs {
            kubeconfig: self.control_plane.kubeconfig().to_path_buf(),
            plugin_dir: self.plugin_dir.path().to_path_buf(),
            namespace: self.namespace.clone(),
            selector: format!("{TEST_LABEL}={}", self.namespace),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Ids of the live (not terminated) instances moto holds for VM uid `uid`.
    pub fn live_instances(&self, uid: &str) -> anyhow::Result<Vec<String>> {
        let mut live = Vec::new();
        for id in self.moto.instance_ids_with_tag(UID_TAG, uid)? {
            match self.moto.instance_state(&id)?.as_deref() {
                Some("terminated" | "shutting-down") | None => {}
                Some(_) => live.push(id),
            }
        }
        Ok(live)
    }

    /// Events recorded about the VM `name`, as `(reason, note)`.
    pub async fn vm_events(&self, name: &str) -> anyhow::Result<Vec<(String, String)>> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let list = events.list(&Default::default()).await?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("VirtualMachine") && r.name.as_deref() == Some(name)
                })
            })
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect())
    }

    /// Waits until VM `name` has an Event with `reason`, or fails after [`DEADLINE`] listing
    /// the Events it has (an Event is written after the status it goes with).
    pub async fn wait_vm_event(&self, name: &str, reason: &str) -> anyhow::Result<()> {
        self.wait_vm_event_where(name, reason, |r, _| r == reason)
            .await
            .map(drop)
    }

    /// Waits until VM `name` has an Event whose `(reason, note)` satisfies `wanted`, and returns
    /// its Events; fails after [`DEADLINE`] naming `what` and listing the Events it has. Tests
    /// wait rather than read once because an Event is written after the status it goes with.
    pub async fn wait_vm_event_where(
        &self,
        name: &str,
        what: &str,
        wanted: impl Fn(&str, &str) -> bool,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let events = self.vm_events(name).await?;
            if events.iter().any(|(r, n)| wanted(r, n)) {
                return Ok(events);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("no {what} Event for {name} within {DEADLINE:?}; its Events: {events:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("namespace", &self.namespace)
            .field("moto", &self.moto)
            .finish_non_exhaustive()
    }
}

/// Whether `vm` has condition `type_` with `status` (and `reason`, if given).
pub fn has_condition(vm: &VirtualMachine, type_: &str, status: &str, reason: Option<&str>) -> bool {
    vm.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .is_some_and(|c| c.status == status && reason.is_none_or(|r| c.reason == r))
}

/// Waits until object `name` satisfies `condition`, with [`DEADLINE`].
pub async fn wait_for<K>(
    api: Api<K>,
    name: &str,
    what: &str,
    condition: impl Fn(Option<&K>) -> bool,
) -> anyhow::Result<Option<K>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    match tokio::time::timeout(DEADLINE, await_condition(api.clone(), name, condition)).await {
        Ok(result) => Ok(result?),
        Err(_) => {
            let last = api.get_opt(name).await.ok().flatten();
            bail!("{name} did not become {what} within {DEADLINE:?}; last seen: {last:#?}")
        }
    }
}
