//! Builders for the objects tests make again and again, with the values most tests want:
//!
//! - [`vm`]: a VirtualMachine, `vm("web").provider("aws").cpu(2).memory("1Gi").build()`.
//!   By default 1 CPU, 512Mi, moto's default AMI ([`IMAGE`]), deletion policy `Delete`, no
//!   namespace (a create through `Api::namespaced` puts it in that namespace) and no
//!   ProviderConfig: name one with [`VirtualMachineBuilder::provider`].
//!   [`Env::vm`](crate::operator::Env::vm) starts one in the test's namespace.
//! - [`vm_spec`]: what a plugin is asked to create, `vm_spec("uid-1").cpu(2).build()`.
//!   By default VM `default/web`, 1 CPU, 512 MiB, moto's default AMI, no user data, labels or
//!   parameters.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use vmop::api::{
    ConnectionConfigMap, DeletionPolicy, ManagementPolicy, PowerState, ProviderConfigRef,
    UpdateStrategy, VirtualMachine, VirtualMachineSpec,
};
use vmop::plugin::VmSpec;

use crate::operator::IMAGE;

/// A VirtualMachine named `name`, to be refined and built.
pub fn vm(name: &str) -> VirtualMachineBuilder {
    VirtualMachineBuilder(VirtualMachine::new(
        name,
        VirtualMachineSpec::new("", IMAGE, 1, "512Mi"),
    ))
}

/// See [`vm`].
#[derive(Debug, Clone)]
#[must_use]
pub struct VirtualMachineBuilder(VirtualMachine);

impl VirtualMachineBuilder {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// The ProviderConfig it names (`spec.providerConfigRef.name`).
    pub fn provider(mut self, provider_config: &str) -> Self {
        self.0.spec.provider_config_ref = ProviderConfigRef {
            name: provider_config.to_owned(),
        };
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        self.0.spec.image = image.to_owned();
        self
    }

    pub fn cpu(mut self, cpu: u32) -> Self {
        self.0.spec.cpu = cpu;
        self
    }

    /// `spec.memory` as a Kubernetes quantity (`"1Gi"`).
    pub fn memory(mut self, memory: &str) -> Self {
        self.0.spec.memory = Quantity(memory.to_owned());
        self
    }

    /// One entry of `spec.parameters`.
    pub fn parameter(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.0.spec.parameters.insert(name.to_owned(), value.into());
        self
    }

    pub fn power_state(mut self, power_state: PowerState) -> Self {
        self.0.spec.power_state = power_state;
        self
    }

    pub fn update_strategy(mut self, update_strategy: UpdateStrategy) -> Self {
        self.0.spec.update_strategy = update_strategy;
        self
    }

    pub fn deletion_policy(mut self, deletion_policy: DeletionPolicy) -> Self {
        self.0.spec.deletion_policy = deletion_policy;
        self
    }

    pub fn management_policy(mut self, management_policy: ManagementPolicy) -> Self {
        self.0.spec.management_policy = management_policy;
        self
    }

    /// Adopt the machine `id` (`spec.externalId`) instead of creating one.
    pub fn external_id(mut self, id: &str) -> Self {
        self.0.spec.external_id = Some(id.to_owned());
        self
    }

    /// Publish how to reach the machine in ConfigMap `name`.
    pub fn connection_config_map(mut self, name: &str) -> Self {
        self.0.spec.connection_config_map = Some(ConnectionConfigMap {
            name: name.to_owned(),
        });
        self
    }

    pub fn build(self) -> VirtualMachine {
        self.0
    }
}

impl From<VirtualMachineBuilder> for VirtualMachine {
    fn from(builder: VirtualMachineBuilder) -> Self {
        builder.build()
    }
}

/// The spec of the VM with uid `uid`, as the operator hands it to a plugin.
pub fn vm_spec(uid: &str) -> VmSpecBuilder {
    VmSpecBuilder(VmSpec {
        name: "web".to_owned(),
        namespace: "default".to_owned(),
        uid: uid.to_owned(),
        image: IMAGE.to_owned(),
        cpu: 1,
        memory_mib: 512,
        user_data: None,
        labels: BTreeMap::new(),
        parameters: BTreeMap::new(),
    })
}

/// See [`vm_spec`].
#[derive(Debug, Clone)]
#[must_use]
pub struct VmSpecBuilder(VmSpec);

impl VmSpecBuilder {
    /// The VM's name and namespace.
    pub fn named(mut self, namespace: &str, name: &str) -> Self {
        namespace.clone_into(&mut self.0.namespace);
        name.clone_into(&mut self.0.name);
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        image.clone_into(&mut self.0.image);
        self
    }

    pub fn cpu(mut self, cpu: u32) -> Self {
        self.0.cpu = cpu;
        self
    }

    pub fn memory_mib(mut self, memory_mib: u64) -> Self {
        self.0.memory_mib = memory_mib;
        self
    }

    pub fn user_data(mut self, user_data: &str) -> Self {
        self.0.user_data = Some(user_data.to_owned());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn parameter(mut self, name: &str, value: &str) -> Self {
        self.0.parameters.insert(name.to_owned(), value.to_owned());
        self
    }

    pub fn build(self) -> VmSpec {
        self.0
    }
}
