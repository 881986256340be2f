//! Cross-resource behaviour: a ProviderConfig change re-reconciles only its VMs; the connection
//! ConfigMap is rebuilt when deleted and garbage-collected with its VM.

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use vmop::api::ProviderConfig;
use vmop_tests::fixtures::VirtualMachineBuilder;
use vmop_tests::operator::{Env, wait_for};

use crate::operator_bin;

#[tokio::test]
async fn provider_config_change_reconciles_only_its_vms() -> anyhow::Result<()> {
    let env = Env::new("fanout").await?;
    let a = env.standard_provider("a").await?;
    let b = env.standard_provider("b").await?;
    let operator = env.operator().start(operator_bin())?;
    env.create_vm(env.vm("on-a", &a)).await?;
    env.create_vm(env.vm("on-b", &b)).await?;
    env.wait_ready("on-a").await?;
    env.wait_ready("on-b").await?;
    for pc in [&a, &b] {
        wait_for(env.provider_configs(), pc, "counting one VM", |pc| {
            pc.and_then(|pc| pc.status.as_ref())
                .is_some_and(|s| s.vm_count == 1)
        })
        .await?;
    }
    let before_a = operator.calls_for("on-a").len();
    let before_b = operator.calls_for("on-b").len();

    let patch = Patch::Merge(json!({ "spec": { "config": { "note": "changed" } } }));
    let changed = env
        .provider_configs()
        .patch(&a, &PatchParams::default(), &patch)
        .await?;
    let generation = changed.metadata.generation;
    operator
        .wait_calls(
            "a new call for the VM of the changed ProviderConfig",
            |calls| calls.iter().filter(|c| c.vm.ends_with("/on-a")).count() > before_a,
        )
        .await?;
    wait_for(
        env.provider_configs(),
        &a,
        "observing the change",
        |pc: Option<&ProviderConfig>| {
            pc.and_then(|pc| pc.status.as_ref())
                .is_some_and(|s| s.observed_generation == generation)
        },
    )
    .await?;
    let after_b = operator.calls_for("on-b");
    ensure!(
        after_b.len() == before_b,
        "the VM of the unchanged ProviderConfig was reconciled too: {after_b:#?}"
    );
    Ok(())
}

fn connection_vm(env: &Env, name: &str, provider: &str) -> VirtualMachineBuilder {
    env.vm(name, provider)
        .connection_config_map(&format!("{name}-connection"))
}

#[tokio::test]
async fn deleted_connection_config_map_is_rebuilt() -> anyhow::Result<()> {
    let env = Env::new("rebuild").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env.operator().start(operator_bin())?;
    env.create_vm(connection_vm(&env, "app", &provider)).await?;
    let id = env
        .wait_ready("app")
        .await?
        .status
        .and_then(|s| s.id)
        .context("no id")?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let has_id = |cm: Option<&ConfigMap>| {
        cm.and_then(|cm| cm.data.as_ref()).and_then(|d| d.get("id")) == Some(&id)
    };
    let first = wait_for(cms.clone(), "app-connection", "holding the id", has_id)
        .await?
        .context("no ConfigMap")?;

    cms.delete("app-connection", &DeleteParams::default())
        .await?;
    let rebuilt = wait_for(cms, "app-connection", "rebuilt", |cm| {
        cm.is_some_and(|cm| cm.uid() != first.uid()) && has_id(cm)
    })
    .await?
    .context("no ConfigMap")?;
    ensure!(
        rebuilt.uid() != first.uid(),
        "the ConfigMap was not recreated"
    );
    Ok(())
}

#[tokio::test]
async fn deleting_the_vm_garbage_collects_its_config_map() -> anyhow::Result<()> {
    let env = Env::new("gc").await?;
    env.control_plane.ensure_controller_manager().await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env.operator().start(operator_bin())?;
    env.create_vm(connection_vm(&env, "gone", &provider))
        .await?;
    env.wait_ready("gone").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for(cms.clone(), "gone-connection", "created", |cm| cm.is_some()).await?;

    env.vms().delete("gone", &DeleteParams::default()).await?;
    env.wait_gone("gone").await?;
    wait_for(cms, "gone-connection", "garbage-collected", |cm| {
        cm.is_none()
    })
    .await?;
    Ok(())
}
