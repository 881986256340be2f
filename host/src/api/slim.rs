//! [`SlimVirtualMachine`]: a VirtualMachine as the operator reads it from the API server, with
//! `metadata.managedFields` skipped while parsing.
//!
//! The API server sends the managed fields with every object of every watch event and every
//! write answer. No reconciler reads them, the VM cache never kept them, yet parsing them into
//! `ManagedFieldsEntry` values (one `serde_json::Value` tree per manager) and dropping them again
//! a noticeable share of the operator's CPU over the create and delete of thousands of VMs.
//! Skipped here, they are scanned over and never allocated.
//!
//! # Guarantees
//!
//! - Everything else reads as `VirtualMachine`'s own `Deserialize` reads it
//!   (`tests::reads_everything_but_the_managed_fields`); a field added to `ObjectMeta` by a new
//!   k8s-openapi fails to compile here rather than being dropped (`From<Meta>` names every field).
//! - Written, it is exactly the `VirtualMachine` it wraps (`#[serde(transparent)]`; the same
//!   test compares the bytes).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::{Deserialize, Deserializer, Serialize};

use super::{VirtualMachine, VirtualMachineSpec, VirtualMachineStatus};

/// A [`VirtualMachine`] read without its managed fields (see the module docs). Use it as the
/// type of an `Api` whose answers are only read for what a reconciler needs.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(transparent)]
pub struct SlimVirtualMachine(pub VirtualMachine);

impl From<SlimVirtualMachine> for VirtualMachine {
    fn from(slim: SlimVirtualMachine) -> Self {
        slim.0
    }
}

impl Resource for SlimVirtualMachine {
    type DynamicType = ();
    type Scope = <VirtualMachine as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        VirtualMachine::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        VirtualMachine::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        VirtualMachine::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        VirtualMachine::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        VirtualMachine::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// The object on the wire; `apiVersion`, `kind` and unknown fields are skipped, as
/// `VirtualMachine`'s own `Deserialize` skips them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    metadata: Meta,
    spec: VirtualMachineSpec,
    #[serde(default)]
    status: Option<VirtualMachineStatus>,
}

/// `ObjectMeta` without `managedFields`, which is skipped as an unknown field.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        // Every field by name, none by `..Default`: a field k8s-openapi adds must be added here.
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

impl<'de> Deserialize<'de> for SlimVirtualMachine {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        Ok(SlimVirtualMachine(VirtualMachine {
            metadata: wire.metadata.into(),
            spec: wire.spec,
            status: wire.status,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use k8s_openapi::jiff::Timestamp;

    fn full() -> VirtualMachine {
        let json = serde_json::json!({
            "apiVersion": "vmop.dev/v1alpha1",
            "kind": "VirtualMachine",
            "metadata": {
                "annotations": {"a": "1"},
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "deletionGracePeriodSeconds": 0,
                "deletionTimestamp": "2026-12-01T11:00:00Z",
                "finalizers": ["vmop.dev/cleanup"],
                "generateName": "vm-",
                "generation": 3,
                "labels": {"team": "x"},
                "name": "vm-1",
                "namespace": "ns",
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u-o"}],
                "resourceVersion": "42",
                "selfLink": "/apis/vmop.dev/v1alpha1/namespaces/ns/virtualmachines/vm-1",
                "uid": "u-1",
                "unknownField": {"kept": false}
            },
            "spec": {
                "providerConfigRef": {"name": "aws"},
                "image": "ami-1",
                "cpu": 2,
                "memory": 536870912,
                "newerSpecField": true
            },
            "status": {"id": "i-1", "phase": "Running", "observedGeneration": 3}
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn reads_everything_but_the_managed_fields() {
        let expected = full();
        let mut sent = expected.clone();
        sent.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            api_version: Some("vmop.dev/v1alpha1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:status": {"f:id": {}}}))),
            manager: Some("vmop".into()),
            operation: Some("Update".into()),
            subresource: Some("status".into()),
            time: Some(Time(Timestamp::UNIX_EPOCH)),
        }]);
        let bytes = serde_json::to_vec(&sent).unwrap();
        let slim: SlimVirtualMachine = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(slim.0, expected);
        // Every metadata field was set, so none of them was lost on the way.
        let meta = serde_json::to_value(&slim.0.metadata).unwrap();
        assert_eq!(meta.as_object().map(|m| m.len()), Some(14), "{meta}");
        assert_eq!(
            serde_json::to_vec(&slim).unwrap(),
            serde_json::to_vec(&expected).unwrap()
        );
    }

    #[test]
    fn requires_what_virtual_machine_requires() {
        let spec = serde_json::json!({
            "providerConfigRef": {"name": "aws"}, "image": "ami-1", "cpu": 1, "memory": "1Gi"
        });
        for json in [
            serde_json::json!({"metadata": {"name": "a"}, "spec": spec}),
            serde_json::json!({"spec": spec}),
            serde_json::json!({"metadata": {"name": "a"}}),
        ] {
            let slim = serde_json::from_value::<SlimVirtualMachine>(json.clone()).ok();
            let vm = serde_json::from_value::<VirtualMachine>(json.clone()).ok();
            assert_eq!(slim.map(|s| s.0), vm, "{json}");
        }
    }
}
