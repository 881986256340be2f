//! Drift: an instance terminated behind the operator's back is noticed at the next periodic
//! check and recreated, with an `ExternalVMLost` Event.

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use vmop_tests::operator::{Env, has_condition};

use crate::operator_bin;

#[tokio::test]
async fn terminated_instance_is_recreated_with_an_event() -> anyhow::Result<()> {
    let env = Env::new("drift").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env
        .operator()
        .args_from(["--resync-period", "2s"])
        .start(operator_bin())?;
    let created = env.create_vm(env.vm("drifty", &provider)).await?;
    let uid = created.uid().context("no uid")?;
    let first = env
        .wait_ready("drifty")
        .await?
        .status
        .and_then(|s| s.id)
        .context("Ready without id")?;

    env.moto
        .ec2("TerminateInstances", &[("InstanceId.1", &first)])?;

    let replaced = env
        .wait_vm("drifty", "Ready on a new instance", |vm| {
            vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
                s.id.as_deref().is_some_and(|id| id != first)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .await?
        .context("VM vanished")?;
    let second = replaced.status.and_then(|s| s.id).context("no id")?;
    ensure!(
        env.live_instances(&uid)? == vec![second.clone()],
        "live instances for {uid}: {:?}",
        env.live_instances(&uid)?
    );
    env.wait_vm_event_where(
        "drifty",
        "ExternalVMLost naming the lost id",
        |reason, note| reason == "ExternalVMLost" && note.contains(&first),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn phase_changes_made_outside_are_mirrored() -> anyhow::Result<()> {
    let env = Env::new("mirror").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env
        .operator()
        .args_from(["--resync-period", "2s"])
        .start(operator_bin())?;
    env.create_vm(env.vm("stoppable", &provider)).await?;
    let id = env
        .wait_ready("stoppable")
        .await?
        .status
        .and_then(|s| s.id)
        .context("Ready without id")?;

    // Stopped is mirrored and then corrected (spec.powerState: Running) within a reconcile:
    // the watch must be listening before the stop to see it.
    let mut history = env.vm_history("stoppable").await?;
    env.moto.ec2("StopInstances", &[("InstanceId.1", &id)])?;
    let stopped = history
        .until("Ready=False (Stopped)", |vm| {
            has_condition(vm, "Ready", "False", Some("Stopped"))
        })
        .await?;
    let status = stopped.status.context("no status")?;
    ensure!(
        status.phase == Some(vmop::api::VmPhase::Stopped) && status.id.as_deref() == Some(&id),
        "status after the stop: {status:?}"
    );
    env.wait_vm_event_where("stoppable", "PhaseChanged to Stopped", |reason, note| {
        reason == "PhaseChanged" && note.contains("Stopped")
    })
    .await?;
    Ok(())
}
