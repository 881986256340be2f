//! `vmop plan` on the real control plane, moto and the ec2 plugin: each pending action is
//! printed, nothing is written (no new instance in moto, no object changed), and once the
//! operator has converged the plan is empty and exits 0. The same for the day-2 actions
//! (adopt, update, restart, start, stop, paused, and a refused launch-only parameter change).

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use vmop::api::{DeletionPolicy, PowerState, UpdateStrategy};
use vmop_tests::operator::Env;

use crate::{day2, operator_bin};

/// Runs `vmop plan -o json` for the test's namespace: exit code and action per VM.
async fn plan(env: &Env) -> anyhow::Result<(i32, BTreeMap<String, String>)> {
    let args = env.operator();
    let output = tokio::process::Command::new(operator_bin())
        .args(["plan", "-o", "json", "-n", &args.namespace])
        .arg("--plugin-dir")
        .arg(&args.plugin_dir)
        .args(["--operator-namespace", &args.namespace])
        .env("KUBECONFIG", &args.kubeconfig)
        .output()
        .await?;
    let code = output.status.code().context("plan was killed")?;
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "plan printed no JSON (exit {code}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    let actions = rows
        .iter()
        .filter_map(|r| {
            Some((
                r.get("name")?.as_str()?.to_owned(),
                r.get("action")?.as_str()?.to_owned(),
            ))
        })
        .collect();
    Ok((code, actions))
}

/// `vmop plan` as people read it (the table), for the test's namespace.
async fn plan_table(env: &Env) -> anyhow::Result<String> {
    let args = env.operator();
    let output = tokio::process::Command::new(operator_bin())
        .args(["plan", "-n", &args.namespace])
        .arg("--plugin-dir")
        .arg(&args.plugin_dir)
        .args(["--operator-namespace", &args.namespace])
        .env("KUBECONFIG", &args.kubeconfig)
        .output()
        .await?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Every instance moto holds for this test's namespace, with its state.
fn instances(env: &Env) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let args = env.operator();
    let mut all = Vec::new();
    for id in env
        .moto
        .instance_ids_with_tag("vmop.dev/namespace", &args.namespace)?
    {
        let state = env.moto.instance_state(&id)?;
        all.push((id, state));
    }
    Ok(all)
}

/// resourceVersion of every VM in the namespace.
async fn versions(env: &Env) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(env
        .vms()
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|vm| (vm.name_any(), vm.resource_version().unwrap_or_default()))
        .collect())
}

#[tokio::test]
async fn plan_prints_each_pending_action_and_writes_nothing() -> anyhow::Result<()> {
    let env = Env::new("plan").await?;
    let provider = env.standard_provider("aws").await?;
    let mut operator = env.operator().start(operator_bin())?;
    for name in ["steady", "lost", "leaving"] {
        env.create_vm(env.vm(name, &provider)).await?;
    }
    let mut ids = BTreeMap::new();
    for name in ["steady", "lost", "leaving"] {
        let vm = env.wait_ready(name).await?;
        ids.insert(name, vm.status.and_then(|s| s.id).context("no id")?);
    }
    operator.kill().await?;

    // One of each pending action, with no operator running.
    env.create_vm(env.vm("new", &provider)).await?;
    let lost = ids.get("lost").context("lost")?;
    env.moto
        .ec2("TerminateInstances", &[("InstanceId.1", lost.as_str())])?;
    env.vms()
        .delete("leaving", &DeleteParams::default())
        .await?;
    let orphan = env
        .vm("orphaned", &provider)
        .deletion_policy(DeletionPolicy::Orphan);
    env.create_vm(orphan).await?;
    env.vms()
        .patch(
            "orphaned",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["vmop.dev/cleanup"]}})),
        )
        .await?;
    env.vms()
        .delete("orphaned", &DeleteParams::default())
        .await?;

    let instances_before = instances(&env)?;
    let before = versions(&env).await?;
    let (code, actions) = plan(&env).await?;
    ensure!(
        code == 2,
        "plan exited {code} with changes pending: {actions:?}"
    );
    let expect = [
        ("steady", "nothing"),
        ("new", "create"),
        ("lost", "recreate"),
        ("leaving", "delete"),
        ("orphaned", "orphan"),
    ];
    for (name, action) in expect {
        ensure!(
            actions.get(name).map(String::as_str) == Some(action),
            "{name}: planned {:?}, expected {action} (all: {actions:?})",
            actions.get(name)
        );
    }
    ensure!(
        versions(&env).await? == before,
        "plan changed a VirtualMachine"
    );
    ensure!(
        instances(&env)? == instances_before,
        "plan changed the cloud"
    );

    // The operator does what the plan said; then there is nothing left to do.
    let _operator = env.operator().start(operator_bin())?;
    env.wait_ready("new").await?;
    env.wait_vm("lost", "recreated", |vm| {
        vm.and_then(|v| v.status.as_ref()?.id.clone())
            .is_some_and(|id| id != *lost)
    })
    .await?;
    env.wait_gone("leaving").await?;
    env.wait_gone("orphaned").await?;
    env.wait_ready("lost").await?;
    let (code, actions) = plan(&env).await?;
    ensure!(
        code == 0 && actions.values().all(|a| a == "nothing"),
        "after convergence the plan is not empty (exit {code}): {actions:?}"
    );
    Ok(())
}

/// State and instance type of each instance, as moto reports them.
fn machines(env: &Env, ids: &[String]) -> anyhow::Result<Vec<(Option<String>, Option<String>)>> {
    ids.iter()
        .map(|id| {
            Ok((
                env.moto.instance_state(id)?,
                day2::instance_field(&env.moto, id, "instanceType")?,
            ))
        })
        .collect()
}

#[tokio::test]
async fn plan_prints_day2_actions_and_writes_nothing() -> anyhow::Result<()> {
    let env = Env::new("plan-day2").await?;
    let provider = env.standard_provider("aws").await?;
    let mut operator = env.operator().start(operator_bin())?;
    let names = [
        "steady", "grow", "halt", "wake", "restart", "pending", "held", "pinned",
    ];
    let (subnet_a, subnet_b) = (day2::subnet(&env.moto, 31)?, day2::subnet(&env.moto, 32)?);
    for name in names {
        let vm = env.vm(name, &provider);
        let vm = match name {
            "pinned" => vm.parameter("subnetId", subnet_a.as_str()),
            "wake" => vm.power_state(PowerState::Stopped),
            // `update` answers needs-restart (EC2 resizes stopped instances only): under
            // Restart the operator carries it out after planning `update`.
            "grow" => vm.update_strategy(UpdateStrategy::Restart),
            _ => vm,
        };
        env.create_vm(vm).await?;
    }
    let mut ids = Vec::new();
    for name in names {
        let vm = env
            .wait_vm(name, "settled", |vm| {
                vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
                    let want = if name == "wake" {
                        vmop::api::VmPhase::Stopped
                    } else {
                        vmop::api::VmPhase::Running
                    };
                    s.phase == Some(want)
                })
            })
            .await?
            .context("VM vanished")?;
        ids.push(vm.status.and_then(|s| s.id).context("no id")?);
    }
    for name in ["restart", "pending"] {
        day2::patch_vm(&env, name, json!({"spec": {"memory": "1Gi"}})).await?;
        env.wait_vm_condition(name, "RestartRequired", "True", None)
            .await?;
    }
    operator.kill().await?;

    // One of each day-2 action, with no operator running.
    day2::patch_vm(&env, "grow", json!({"spec": {"memory": "1Gi"}})).await?;
    day2::patch_vm(&env, "halt", json!({"spec": {"powerState": "Stopped"}})).await?;
    day2::patch_vm(&env, "wake", json!({"spec": {"powerState": "Running"}})).await?;
    day2::patch_vm(
        &env,
        "restart",
        json!({"spec": {"updateStrategy": "Restart"}}),
    )
    .await?;
    day2::patch_vm(
        &env,
        "held",
        json!({"spec": {"memory": "1Gi"}, "metadata": {"annotations": {"vmop.dev/paused": "true"}}}),
    )
    .await?;
    // A launch-only parameter changed: refused, never an update.
    day2::patch_vm(
        &env,
        "pinned",
        json!({"spec": {"parameters": {"subnetId": subnet_b}}}),
    )
    .await?;
    let outside = day2::run_instance(&env.moto, "t3.nano")?;
    env.create_vm(env.vm("adoptee", &provider).external_id(&outside))
        .await?;
    ids.push(outside);

    let machines_before = machines(&env, &ids)?;
    let before = versions(&env).await?;
    println!("{}", plan_table(&env).await?);
    let (code, actions) = plan(&env).await?;
    ensure!(
        code == 2,
        "plan exited {code} with changes pending: {actions:?}"
    );
    let expect = [
        ("steady", "nothing"),
        ("grow", "update"),
        ("halt", "stop"),
        ("wake", "start"),
        ("restart", "restart"),
        ("held", "paused"),
        ("pending", "wait"),
        ("adoptee", "adopt"),
        ("pinned", "blocked"),
    ];
    for (name, action) in expect {
        ensure!(
            actions.get(name).map(String::as_str) == Some(action),
            "{name}: planned {:?}, expected {action} (all: {actions:?})",
            actions.get(name)
        );
    }
    ensure!(
        versions(&env).await? == before,
        "plan changed a VirtualMachine"
    );
    ensure!(
        machines(&env, &ids)? == machines_before,
        "plan changed the cloud"
    );

    // The operator does what the plan said; then only the paused VM and the one waiting for a
    // restart are left, neither a change.
    let _operator = env.operator().start(operator_bin())?;
    for name in ["grow", "restart"] {
        env.wait_vm(name, "resized and running", |vm| {
            vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
                s.applied.as_ref().is_some_and(|a| a.memory_mib == 1024)
                    && s.phase == Some(vmop::api::VmPhase::Running)
            })
        })
        .await?;
    }
    env.wait_vm("halt", "stopped", |vm| {
        vm.and_then(|vm| vm.status.as_ref())
            .is_some_and(|s| s.phase == Some(vmop::api::VmPhase::Stopped))
    })
    .await?;
    env.wait_ready("wake").await?;
    env.wait_ready("adoptee").await?;
    env.wait_vm_condition("restart", "RestartRequired", "False", None)
        .await?;
    // The refusal the plan announced; reverted, the VM is in sync again.
    env.wait_vm_condition("pinned", "Synced", "False", Some("InvalidSpec"))
        .await?;
    let reverted = day2::patch_vm(
        &env,
        "pinned",
        json!({"spec": {"parameters": {"subnetId": subnet_a}}}),
    )
    .await?;
    env.wait_vm("pinned", "in sync at the reverted generation", |vm| {
        vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Synced"
                    && c.status == "True"
                    && c.observed_generation == reverted.metadata.generation
            })
        })
    })
    .await?;
    let (code, actions) = plan(&env).await?;
    ensure!(
        code == 0
            && actions.iter().all(|(name, a)| a
                == match name.as_str() {
                    "held" => "paused",
                    "pending" => "wait",
                    _ => "nothing",
                }),
        "after convergence the plan is not empty (exit {code}): {actions:?}"
    );
    Ok(())
}
