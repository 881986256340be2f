//! Day 2 on the real control plane, moto and the real ec2.wasm: per-VM parameters (checked
//! before any call), power state, and resize (`updateStrategy: Restart` or `RestartRequired`).

use anyhow::{Context as _, ensure};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use serde_json::json;
use vmop::api::VmPhase;
use vmop_tests::operator::Env;

use crate::day2::{self, condition, instance_field, patch_vm, subnet};
use crate::operator_bin;

#[tokio::test]
async fn per_vm_parameters_reach_moto_and_bad_ones_are_refused_before_any_call()
-> anyhow::Result<()> {
    let env = Env::new("day2-params").await?;
    let provider = env.standard_provider("aws").await?;
    let (subnet_a, subnet_b) = (subnet(&env.moto, 11)?, subnet(&env.moto, 12)?);
    let operator = env.operator().start(operator_bin())?;

    // The ProviderConfig publishes what its plugin accepts and can do.
    let plugin = day2::published_plugin(&env, &provider, "subnetId").await?;
    for capability in ["update", "power", "user-data"] {
        ensure!(
            plugin.capabilities.iter().any(|c| c == capability),
            "capability {capability} not published: {:?}",
            plugin.capabilities
        );
    }
    ensure!(
        plugin
            .parameters
            .iter()
            .any(|p| p.name == "rootVolumeSizeGiB"
                && p.kind == "integer"
                && !p.description.is_empty()),
        "parameters published: {:?}",
        plugin.parameters
    );

    let one = env
        .vm("one", &provider)
        .parameter("subnetId", subnet_a.as_str());
    let two = env
        .vm("two", &provider)
        .parameter("subnetId", subnet_b.as_str())
        .parameter("rootVolumeSizeGiB", 12);
    let unknown = env.vm("unknown", &provider).parameter("subnet", "subnet-x");
    let typed = env
        .vm("typed", &provider)
        .parameter("rootVolumeSizeGiB", "big");
    for vm in [one, two, unknown, typed] {
        env.create_vm(vm).await?;
    }

    for (name, subnet) in [("one", &subnet_a), ("two", &subnet_b)] {
        let vm = env.wait_ready(name).await?;
        let id = vm
            .status
            .and_then(|s| s.id)
            .context("Ready VM without id")?;
        let actual = instance_field(&env.moto, &id, "subnetId")?;
        ensure!(
            actual.as_deref() == Some(subnet.as_str()),
            "{name}: instance {id} is in subnet {actual:?}, not {subnet}"
        );
    }

    for (name, parameter) in [
        ("unknown", "spec.parameters.subnet "),
        ("typed", "spec.parameters.rootVolumeSizeGiB"),
    ] {
        let vm = env
            .wait_vm_condition(name, "Synced", "False", Some("InvalidSpec"))
            .await?;
        let (_, _, message) = condition(&vm, "Synced").context("no Synced")?;
        ensure!(
            message.contains(parameter),
            "{name}: Synced message {message:?} does not name {parameter}"
        );
        let uid = vm.uid().context("no uid")?;
        ensure!(env.live_instances(&uid)?.is_empty(), "{name} reached moto");
        let calls = operator.calls_for(name);
        ensure!(calls.is_empty(), "{name}: plugin calls made: {calls:?}");
    }
    Ok(())
}

#[tokio::test]
async fn power_state_stops_and_starts_and_drift_correction_keeps_it() -> anyhow::Result<()> {
    let env = Env::new("day2-power").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    env.create_vm(env.vm("pw", &provider)).await?;
    let vm = env.wait_ready("pw").await?;
    let id = vm.status.and_then(|s| s.id).context("no id")?;

    patch_vm(&env, "pw", json!({"spec": {"powerState": "Stopped"}})).await?;
    env.wait_vm("pw", "Stopped", |vm| {
        vm.and_then(|vm| vm.status.as_ref())
            .is_some_and(|s| s.phase == Some(VmPhase::Stopped))
    })
    .await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        matches!(state.as_deref(), Some("stopped" | "stopping")),
        "moto state of {id}: {state:?}"
    );
    // Drift correction respects it: a forced reconcile leaves it stopped and Synced.
    patch_vm(
        &env,
        "pw",
        json!({"metadata": {"annotations": {"vmop.dev/reconcile-requested-at": "t1"}}}),
    )
    .await?;
    let vm = env
        .wait_vm("pw", "handling reconcile request t1", |vm| {
            vm.and_then(|vm| vm.status.as_ref())
                .is_some_and(|s| s.last_handled_reconcile_at.as_deref() == Some("t1"))
        })
        .await?
        .context("VM vanished")?;
    ensure!(
        condition(&vm, "Synced").is_some_and(|c| c.0 == "True"),
        "a stopped VM is not a failure: {:?}",
        condition(&vm, "Synced")
    );
    let stops = operator
        .calls_for("pw")
        .iter()
        .filter(|c| c.op == "stop")
        .count();
    ensure!(stops == 1, "{stops} stop calls");
    ensure!(
        matches!(
            env.moto.instance_state(&id)?.as_deref(),
            Some("stopped" | "stopping")
        ),
        "restarted by drift correction"
    );

    patch_vm(&env, "pw", json!({"spec": {"powerState": "Running"}})).await?;
    let vm = env.wait_ready("pw").await?;
    ensure!(
        vm.status.and_then(|s| s.id).as_deref() == Some(id.as_str()),
        "the machine changed"
    );
    ensure!(env.moto.instance_state(&id)?.as_deref() == Some("running"));
    for reason in ["Stopping", "Starting"] {
        env.wait_vm_event("pw", reason).await?;
    }
    Ok(())
}

#[tokio::test]
async fn resize_restarts_only_under_the_restart_strategy() -> anyhow::Result<()> {
    let env = Env::new("day2-resize").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    env.create_vm(env.vm("auto", &provider)).await?;
    env.create_vm(env.vm("manual", &provider)).await?;
    let mut ids = Vec::new();
    for name in ["auto", "manual"] {
        let vm = env.wait_ready(name).await?;
        let id = vm.status.and_then(|s| s.id).context("no id")?;
        let before = instance_field(&env.moto, &id, "instanceType")?;
        ensure!(before.as_deref() == Some("t3.nano"), "{name}: {before:?}");
        ids.push(id);
    }
    let applied_1gi = |vm: Option<&vmop::api::VirtualMachine>| {
        vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
            s.applied.as_ref().is_some_and(|a| a.memory_mib == 1024)
                && s.phase == Some(VmPhase::Running)
        })
    };

    // Restart: stop, update, start; same machine, new type.
    patch_vm(
        &env,
        "auto",
        json!({"spec": {"memory": "1Gi", "updateStrategy": "Restart"}}),
    )
    .await?;
    env.wait_vm("auto", "resized to 1Gi and running", applied_1gi)
        .await?;
    let auto = &ids[0];
    ensure!(instance_field(&env.moto, auto, "instanceType")?.as_deref() == Some("t3.micro"));
    ensure!(env.moto.instance_state(auto)?.as_deref() == Some("running"));
    let ops: Vec<String> = operator
        .calls_for("auto")
        .into_iter()
        .map(|c| c.op)
        .collect();
    for op in ["stop", "update", "start"] {
        ensure!(ops.iter().any(|o| o == op), "no {op} call: {ops:?}");
    }

    // Manual (default): RestartRequired, no stop, still the old type.
    patch_vm(&env, "manual", json!({"spec": {"memory": "1Gi"}})).await?;
    env.wait_vm_condition(
        "manual",
        "RestartRequired",
        "True",
        Some("UpdateNeedsRestart"),
    )
    .await?;
    let manual = &ids[1];
    ensure!(env.moto.instance_state(manual)?.as_deref() == Some("running"));
    ensure!(instance_field(&env.moto, manual, "instanceType")?.as_deref() == Some("t3.nano"));
    let stops = operator
        .calls_for("manual")
        .iter()
        .filter(|c| c.op == "stop")
        .count();
    ensure!(stops == 0, "manual VM stopped {stops} times");
    // Switching the strategy applies it.
    patch_vm(
        &env,
        "manual",
        json!({"spec": {"updateStrategy": "Restart"}}),
    )
    .await?;
    env.wait_vm("manual", "resized to 1Gi and running", applied_1gi)
        .await?;
    env.wait_vm_condition("manual", "RestartRequired", "False", None)
        .await?;
    ensure!(instance_field(&env.moto, manual, "instanceType")?.as_deref() == Some("t3.micro"));

    // cpu stays mutable in the schema; image does not.
    let refused = patch_vm(&env, "manual", json!({"spec": {"image": "ami-other"}})).await;
    ensure!(refused.is_err(), "image change accepted");
    let vm = patch_vm(
        &env,
        "manual",
        json!({"spec": {"memory": Quantity("1Gi".into())}}),
    )
    .await?;
    ensure!(vm.spec.memory.0 == "1Gi");
    Ok(())
}

/// `kubectl explain` output of `field`, retried until the CRDs are served.
async fn explain(env: &Env, field: &str) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + vmop_tests::operator::DEADLINE;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        tick.tick().await;
        let output = env
            .control_plane
            .kubectl_command()
            .args(["explain", field])
            .output()?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "kubectl explain {field} kept failing: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test]
async fn kubectl_explain_describes_every_day2_field() -> anyhow::Result<()> {
    let env = Env::new("day2-explain").await?;
    for (field, expected) in [
        ("vm.spec.parameters", "status.plugin.parameters"),
        ("vm.spec.powerState", "Stopped"),
        ("vm.spec.updateStrategy", "RestartRequired=True"),
        ("vm.spec.externalId", "AdoptionConflict"),
        ("vm.spec.managementPolicy", "ObserveOnly"),
        ("vm.spec.cpu", "update"),
        ("vm.status.applied", "last made to match"),
        ("vm.status.applied.memoryMiB", "MiB"),
        (
            "vm.status.lastHandledReconcileAt",
            "vmop.dev/reconcile-requested-at",
        ),
        ("vm.status.conditions", "RestartRequired"),
        ("vmpc.status.plugin.capabilities", "power"),
        ("vmpc.status.plugin.parameters", "spec.parameters"),
        ("vmpc.status.plugin.parameters.kind", "string-list"),
    ] {
        let text = explain(&env, field).await?;
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        ensure!(flat.contains(expected), "kubectl explain {field}: {text}");
    }
    Ok(())
}
