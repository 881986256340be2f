//! `vmop plan` on the real control plane, moto and the ec2 plugin: each pending action is
//! printed, nothing is written (no new instance in moto, no object changed), and once the
//! operator has converged the plan is empty and exits 0.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use vmop_tests::operator::Env;

fn operator_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vmop-operator"))
}

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
        env.create_vm(&env.vm(name, &provider)).await?;
    }
    let mut ids = BTreeMap::new();
    for name in ["steady", "lost", "leaving"] {
        let vm = env.wait_ready(name).await?;
        ids.insert(name, vm.status.and_then(|s| s.id).context("no id")?);
    }
    operator.kill().await?;

    // One of each pending action, with no operator running.
    env.create_vm(&env.vm("new", &provider)).await?;
    let lost = ids.get("lost").context("lost")?;
    env.moto
        .ec2("TerminateInstances", &[("InstanceId.1", lost.as_str())])?;
    env.vms()
        .delete("leaving", &DeleteParams::default())
        .await?;
    let mut orphan = env.vm("orphaned", &provider);
    orphan.spec.deletion_policy = vmop::api::DeletionPolicy::Orphan;
    env.create_vm(&orphan).await?;
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
