//! Deletion without a way to reach the cloud: a missing ProviderConfig keeps the finalizer and
//! says why, so the machine is never silently orphaned; once it is back, deletion completes.

use std::path::Path;

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use kube::api::DeleteParams;
use vmop::api::VM_FINALIZER;
use vmop_tests::operator::Env;

fn operator_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vmop-operator"))
}

#[tokio::test]
async fn missing_provider_config_keeps_the_finalizer_until_it_returns() -> anyhow::Result<()> {
    let env = Env::new("blocked").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env.operator().start(operator_bin())?;
    env.create_vm(&env.vm("stuck", &provider)).await?;
    let id = env
        .wait_ready("stuck")
        .await?
        .status
        .and_then(|s| s.id)
        .context("no id")?;
    let pc = env.provider_configs().get(&provider).await?;

    env.provider_configs()
        .delete(&provider, &DeleteParams::default())
        .await?;
    env.vms().delete("stuck", &DeleteParams::default()).await?;
    let blocked = env
        .wait_vm("stuck", "blocked on the missing ProviderConfig", |vm| {
            vm.is_some_and(|vm| {
                vm.metadata.deletion_timestamp.is_some()
                    && vm.status.as_ref().is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == "Synced"
                                && c.status == "False"
                                && c.reason == "ProviderConfigNotFound"
                                && c.message.starts_with("cannot delete the external machine")
                        })
                    })
            })
        })
        .await?
        .context("the VM was deleted without its ProviderConfig")?;
    ensure!(
        blocked.finalizers().iter().any(|f| f == VM_FINALIZER),
        "finalizer dropped: {:?}",
        blocked.finalizers()
    );
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("running"),
        "instance {id} is {state:?}"
    );
    let events = env.vm_events("stuck").await?;
    ensure!(
        events
            .iter()
            .any(|(reason, _)| reason == "ProviderConfigNotFound"),
        "events: {events:?}"
    );

    let mut back = pc.clone();
    back.metadata = kube::api::ObjectMeta {
        name: pc.metadata.name.clone(),
        labels: pc.metadata.labels.clone(),
        ..Default::default()
    };
    back.status = None;
    env.apply_provider_config(&back).await?;
    env.wait_gone("stuck").await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "instance {id} is {state:?}"
    );
    Ok(())
}
