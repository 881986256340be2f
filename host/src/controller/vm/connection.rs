//! The connection ConfigMap (`spec.connectionConfigMap`): `id`, `phase` and `addresses` of the
//! machine for workloads that need to find it.
//!
//! # Guarantees
//!
//! - The ConfigMap carries a controller owner reference to its VirtualMachine, so the garbage
//!   collector deletes it with the VM, and the controller's `owns` watch rebuilds it when
//!   someone deletes or edits it.
//! - A ConfigMap of that name that this VM does not control is never overwritten
//!   ([`Error::ConfigMapConflict`]).
//! - Nothing is written when the ConfigMap already holds the right data.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::{MANAGER, VirtualMachine, VirtualMachineStatus};
use crate::controller::error::Error;

/// Label on every ConfigMap vmop writes; the `owns` watch selects on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "vmop");
/// Label naming the VirtualMachine a ConfigMap describes.
pub const VM_LABEL: &str = "vmop.dev/virtualmachine";

/// Label selector of vmop's ConfigMaps.
pub fn selector() -> String {
    format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)
}

/// Creates or updates the VM's connection ConfigMap, if it asks for one.
pub async fn ensure(
    client: &Client,
    vm: &VirtualMachine,
    status: &VirtualMachineStatus,
) -> Result<(), Error> {
    let Some(target) = &vm.spec.connection_config_map else {
        return Ok(());
    };
    let namespace = vm.namespace().ok_or(Error::Metadata("namespace"))?;
    let owner = vm.controller_owner_ref(&()).ok_or(Error::Metadata("uid"))?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let data = data(status);
    let labels = BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        (VM_LABEL.to_owned(), vm.name_any()),
    ]);
    if let Some(existing) = api
        .get_opt(&target.name)
        .await
        .map_err(Error::kube("read the connection ConfigMap"))?
    {
        let controlled = existing
            .owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == owner.uid);
        if !controlled {
            return Err(Error::ConfigMapConflict {
                name: target.name.clone(),
            });
        }
        let has_labels = labels
            .iter()
            .all(|(k, v)| existing.labels().get(k) == Some(v));
        if existing.data.as_ref() == Some(&data) && has_labels {
            return Ok(());
        }
    }
    let desired = ConfigMap {
        metadata: ObjectMeta {
            name: Some(target.name.clone()),
            namespace: Some(namespace),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    };
    // k8s-openapi serializes apiVersion and kind, as server-side apply requires.
    api.patch(
        &target.name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&desired),
    )
    .await
    .map_err(Error::kube("write the connection ConfigMap"))?;
    Ok(())
}

/// `id`, `phase` and `addresses` (comma-separated, most useful first).
fn data(status: &VirtualMachineStatus) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("id".to_owned(), status.id.clone().unwrap_or_default()),
        (
            "phase".to_owned(),
            status
                .phase
                .map(|p| p.as_str().to_owned())
                .unwrap_or_default(),
        ),
        ("addresses".to_owned(), status.addresses.join(",")),
    ])
}
