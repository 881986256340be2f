//! Pausing and steering a VM by annotation, on the real control plane, moto and ec2.wasm:
//! `vmop.dev/paused` stops every plugin call (counted in `/metrics`) until it is removed;
//! `vmop.dev/reconcile-requested-at` is echoed in status; `vmop.dev/poll-interval` re-checks a
//! settled machine sooner than the resync period, and a value outside the duration grammar is
//! refused on its VM alone.

use anyhow::{Context as _, ensure};
use serde_json::json;
use vmop::api::VmPhase;
use vmop_tests::operator::{Env, Scrape};

use crate::day2::{condition, patch_vm};
use crate::operator_bin;

fn calls(m: &Scrape, provider: &str) -> f64 {
    m.sum(
        "vmop_provider_calls_total",
        &[("provider_config", provider)],
    )
}

async fn handled(env: &Env, name: &str, token: &str) -> anyhow::Result<vmop::api::VirtualMachine> {
    env.wait_vm(name, &format!("handling reconcile request {token}"), |vm| {
        vm.and_then(|vm| vm.status.as_ref())
            .is_some_and(|s| s.last_handled_reconcile_at.as_deref() == Some(token))
    })
    .await?
    .context("VM vanished")
}

#[tokio::test]
async fn a_paused_vm_gets_no_plugin_call_until_resumed() -> anyhow::Result<()> {
    let env = Env::new("day2-pause").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    env.create_vm(env.vm("p", &provider)).await?;
    let id = env
        .wait_ready("p")
        .await?
        .status
        .and_then(|s| s.id)
        .context("no id")?;

    patch_vm(
        &env,
        "p",
        json!({"metadata": {"annotations": {"vmop.dev/paused": "true"}}}),
    )
    .await?;
    let vm = env
        .wait_vm_condition("p", "Synced", "False", Some("ReconcilePaused"))
        .await?;
    ensure!(
        condition(&vm, "Ready").is_some_and(|c| c.0 == "True"),
        "pausing says nothing about the machine: {:?}",
        condition(&vm, "Ready")
    );
    let paused_at = calls(&operator.metrics().await?, &provider);

    // A spec change and a reconcile request while paused: reconciled, yet no call.
    patch_vm(
        &env,
        "p",
        json!({
            "spec": {"powerState": "Stopped"},
            "metadata": {"annotations": {"vmop.dev/reconcile-requested-at": "while-paused"}},
        }),
    )
    .await?;
    handled(&env, "p", "while-paused").await?;
    let still = calls(&operator.metrics().await?, &provider);
    ensure!(
        still == paused_at,
        "plugin calls while paused: {paused_at} -> {still}"
    );
    ensure!(
        env.moto.instance_state(&id)?.as_deref() == Some("running"),
        "stopped while paused"
    );

    // Removing the annotation resumes: the pending stop happens.
    patch_vm(
        &env,
        "p",
        json!({"metadata": {"annotations": {"vmop.dev/paused": null}}}),
    )
    .await?;
    env.wait_vm("p", "stopped after resuming", |vm| {
        vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
            s.phase == Some(VmPhase::Stopped)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Synced" && c.status == "True")
        })
    })
    .await?;
    let resumed = calls(&operator.metrics().await?, &provider);
    ensure!(resumed > still, "no plugin call after resuming");
    Ok(())
}

#[tokio::test]
async fn poll_interval_annotation_rechecks_sooner_than_the_resync_period() -> anyhow::Result<()> {
    let env = Env::new("day2-poll").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env
        .operator()
        .args_from(["--resync-period", "1h", "--min-poll-interval", "1s"])
        .start(operator_bin())?;
    let vm = env
        .vm("fast", &provider)
        .annotation("vmop.dev/poll-interval", "1s");
    env.create_vm(vm).await?;
    let id = env
        .wait_ready("fast")
        .await?
        .status
        .and_then(|s| s.id)
        .context("no id")?;
    // Stopped outside: only a re-check (never due for an hour otherwise) notices and corrects it.
    env.moto.ec2("StopInstances", &[("InstanceId.1", &id)])?;
    env.wait_vm("fast", "noticing the stop", |vm| {
        vm.and_then(|vm| vm.status.as_ref())
            .is_some_and(|s| s.phase == Some(VmPhase::Stopped))
    })
    .await?;
    env.wait_ready("fast").await?;
    ensure!(env.moto.instance_state(&id)?.as_deref() == Some("running"));
    Ok(())
}

/// A poll interval outside the duration grammar, or one no clock can add (it used to overflow
/// the requeue's jitter and panic the operator, for every tenant), is refused on its own VM
/// before any plugin call (`Synced=False`, reason `InvalidSpec`); the same operator process
/// serves the other VMs, and the VM itself once the annotation is fixed.
#[tokio::test]
async fn a_bad_poll_interval_is_refused_on_its_vm_and_the_operator_serves_the_others()
-> anyhow::Result<()> {
    let env = Env::new("day2-badpoll").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    for (name, value) in [("huge", "18446744073709551615s"), ("typo", "5 minutes")] {
        let vm = env
            .vm(name, &provider)
            .annotation("vmop.dev/poll-interval", value);
        env.create_vm(vm).await?;
    }
    for name in ["huge", "typo"] {
        let vm = env
            .wait_vm_condition(name, "Synced", "False", Some("InvalidSpec"))
            .await?;
        let synced = condition(&vm, "Synced").map(|c| c.2).unwrap_or_default();
        ensure!(
            synced.contains("vmop.dev/poll-interval"),
            "the condition names the annotation: {synced}"
        );
        ensure!(
            operator.calls_for(name).is_empty(),
            "plugin calls for {name}: {:?}",
            operator.calls_for(name)
        );
    }
    env.create_vm(env.vm("fine", &provider)).await?;
    env.wait_ready("fine").await?;
    patch_vm(
        &env,
        "huge",
        json!({"metadata": {"annotations": {"vmop.dev/poll-interval": "30s"}}}),
    )
    .await?;
    env.wait_ready("huge").await?;
    Ok(())
}
