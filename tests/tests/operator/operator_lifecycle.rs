//! The operator end to end: ProviderConfig + Secret + VirtualMachine → a real instance in moto
//! through the real EC2 plugin → Ready; `kubectl get` columns; deletion terminates the instance;
//! the operator's `/metrics` counts the reconciles, plugin calls and loads, and VMs per phase.

use anyhow::{Context as _, ensure};
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Api, ResourceExt};
use vmop::api::{DeletionPolicy, ProviderConfig, VmPhase};
use vmop_tests::operator::{Env, Scrape, wait_for};

use crate::operator_bin;

#[tokio::test]
async fn vm_becomes_ready_shows_columns_and_deletion_terminates_the_instance() -> anyhow::Result<()>
{
    let env = Env::new("lifecycle").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    let before = operator.metrics().await?;
    let vm_successes = |m: &Scrape| {
        m.sum(
            "controller_runtime_reconcile_total",
            &[("controller", "virtualmachine"), ("result", "success")],
        )
    };
    let calls = |m: &Scrape, operation: &str| {
        m.sum(
            "vmop_provider_calls_total",
            &[
                ("provider_config", provider.as_str()),
                ("operation", operation),
                ("outcome", "ok"),
            ],
        )
    };

    let vm = env
        .vm("web", &provider)
        .connection_config_map("web-connection");
    let created = env.create_vm(vm).await?;
    let uid = created.uid().context("created VM without uid")?;

    let ready = env.wait_ready("web").await?;
    let status = ready.status.clone().context("Ready VM without status")?;
    let id = status.id.context("Ready VM without status.id")?;
    ensure!(
        status.phase == Some(VmPhase::Running),
        "phase {:?}",
        status.phase
    );
    ensure!(
        env.moto.instance_state(&id)?.as_deref() == Some("running"),
        "moto does not have {id} running"
    );
    ensure!(
        env.live_instances(&uid)? == vec![id.clone()],
        "moto's instances for uid {uid}: {:?}",
        env.live_instances(&uid)?
    );
    ensure!(
        ready
            .finalizers()
            .iter()
            .any(|f| f == vmop::api::VM_FINALIZER),
        "no finalizer on {:?}",
        ready.finalizers()
    );
    operator
        .wait_metrics("vmop_virtual_machines counts a Running VM", |m| {
            m.sum("vmop_virtual_machines", &[("phase", "Running")]) >= 1.0
        })
        .await?;

    // `kubectl get vm` shows the printer columns with the observed values.
    let output = env
        .control_plane
        .kubectl_command()
        .args(["get", "vm", "web", "-n", &env.namespace])
        .output()?;
    let table = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header == ["NAME", "PHASE", "ID", "PROVIDER", "AGE"],
        "kubectl header: {header:?}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        row.get(..4) == Some(&["web", "Running", id.as_str(), provider.as_str()][..]),
        "kubectl row: {row:?}"
    );

    // The ProviderConfig reports its plugin and its one VM.
    let pcs: Api<ProviderConfig> = env.provider_configs();
    let pc = wait_for(pcs, &provider, "counting one VM", |pc| {
        pc.and_then(|pc| pc.status.as_ref())
            .is_some_and(|s| s.vm_count == 1)
    })
    .await?
    .context("ProviderConfig vanished")?;
    let pc_status = pc.status.context("no ProviderConfig status")?;
    let plugin = pc_status
        .plugin
        .context("no plugin in ProviderConfig status")?;
    ensure!(
        plugin.name == "ec2" && plugin.digest.len() == 64,
        "plugin status {plugin:?}"
    );

    // The connection ConfigMap publishes the id.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.client.clone(), &env.namespace);
    let cm = wait_for(cms, "web-connection", "holding the id", |cm| {
        cm.and_then(|cm| cm.data.as_ref()).and_then(|d| d.get("id")) == Some(&id)
    })
    .await?
    .context("ConfigMap vanished")?;
    ensure!(
        cm.owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == uid),
        "ConfigMap not controlled by the VM: {:?}",
        cm.owner_references()
    );

    env.vms().delete("web", &DeleteParams::default()).await?;
    env.wait_gone("web").await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "instance {id} is {state:?} after deletion"
    );
    ensure!(
        env.live_instances(&uid)?.is_empty(),
        "live instances remain for {uid}"
    );

    // The counters moved: the deletion's last reconcile succeeded (the create's ones requeue),
    // create and get reached the plugin, the deleted VM is no longer counted, and the plugin
    // was loaded (not just found in memory).
    let after = operator
        .wait_metrics("the lifecycle's reconciles and calls counted", |m| {
            vm_successes(m) > vm_successes(&before)
                && calls(m, "create") > calls(&before, "create")
                && calls(m, "get") > calls(&before, "get")
                && m.sum("vmop_virtual_machines", &[("phase", "Running")]) == 0.0
        })
        .await?;
    ensure!(
        after.sum("vmop_plugin_load_seconds_count", &[("outcome", "ok")]) >= 1.0,
        "no plugin load recorded:\n{}",
        after.text
    );

    // The plugin calls were logged inside the VM's reconcile span.
    let log = operator.log();
    let create = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|v| v["target"] == "vmop::provider_call" && v["fields"]["op"] == "create")
        .with_context(|| format!("no create call logged:\n{log}"))?;
    let span = &create["span"];
    ensure!(
        span["name"] == "reconcile"
            && span["controller"] == "virtualmachine"
            && span["namespace"] == env.namespace.as_str()
            && span["object"] == "web"
            && span["provider_config"] == provider.as_str(),
        "the create call was not logged in the VM's reconcile span: {create}"
    );
    Ok(())
}

#[tokio::test]
async fn orphan_policy_leaves_the_instance_running() -> anyhow::Result<()> {
    let env = Env::new("orphan").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env.operator().start(operator_bin())?;

    let vm = env
        .vm("keep", &provider)
        .deletion_policy(DeletionPolicy::Orphan);
    env.create_vm(vm).await?;
    let ready = env.wait_ready("keep").await?;
    let id = ready.status.and_then(|s| s.id).context("no id")?;

    env.vms().delete("keep", &DeleteParams::default()).await?;
    env.wait_gone("keep").await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("running"),
        "orphaned instance {id} is {state:?}"
    );
    env.wait_vm_event("keep", "Orphaned").await?;
    Ok(())
}

/// The operator's own writes keep what its cache drops and what its types would change: the
/// cache holds no kubectl last-applied copy (`relist::slim`), and a write built from the cached
/// object (a PUT of the whole object) would delete the user's copy, breaking their next
/// `kubectl apply`, and send `spec.memory: 536870912` back as a string owned by `vmop` (both
/// seen when the finalizer was added with a PUT). The finalizer write is a merge patch for this
/// reason.
#[tokio::test]
async fn the_operators_writes_keep_kubectls_last_applied_copy() -> anyhow::Result<()> {
    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
    let env = Env::new("lastapplied").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env.operator().start(operator_bin())?;

    let mut vm = env.vm("applied", &provider).build();
    let copy = serde_json::to_string(&vm)?;
    vm.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(LAST_APPLIED.to_owned(), copy.clone());
    // Memory as an integer, as a user may write it (`int-or-string`): this binary's type
    // would send it back as a string.
    let mut raw = serde_json::to_value(&vm)?;
    raw["spec"]["memory"] = serde_json::json!(536_870_912);
    let untyped: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.namespace,
        &ApiResource::erase::<vmop::api::VirtualMachine>(&()),
    );
    untyped
        .create(&PostParams::default(), &serde_json::from_value(raw)?)
        .await?;
    let ready = env.wait_ready("applied").await?;
    let stored = untyped.get("applied").await?;
    ensure!(
        stored.data["spec"]["memory"] == serde_json::json!(536_870_912),
        "the operator's writes rewrote spec.memory: {}",
        stored.data["spec"]["memory"]
    );
    ensure!(
        ready.finalizers().iter().any(|f| f == "vmop.dev/cleanup"),
        "no finalizer: {:?}",
        ready.finalizers()
    );
    ensure!(
        ready.annotations().get(LAST_APPLIED) == Some(&copy),
        "the last-applied copy did not survive the operator's writes: {:?}",
        ready.annotations()
    );
    // Nor do they rewrite the spec.
    ensure!(
        ready.metadata.generation == Some(1),
        "the operator's writes changed the spec: generation {:?}",
        ready.metadata.generation
    );
    env.vms()
        .delete("applied", &DeleteParams::default())
        .await?;
    env.wait_gone("applied").await?;
    Ok(())
}

/// `kubectl explain <field>`, waiting (with the harness deadline) until the API server
/// publishes the OpenAPI of a freshly installed CRD, which happens shortly after it is
/// Established.
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
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "kubectl explain {field} kept failing: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

#[tokio::test]
async fn kubectl_explain_describes_the_fields() -> anyhow::Result<()> {
    let env = Env::new("explain").await?;
    for (field, expected) in [
        ("vm.spec.memory", "Kubernetes quantity"),
        ("vm.spec.deletionPolicy", "Orphan"),
        ("vm.status.conditions", "Synced"),
        ("vmpc.spec.allowedHosts", "Empty means no network"),
        ("vmpc.spec.limits.requestsPerSecond", "token bucket"),
    ] {
        let text = explain(&env, field).await?;
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        ensure!(flat.contains(expected), "kubectl explain {field}: {text}");
    }
    Ok(())
}

/// A VM with the longest name Kubernetes allows (253 characters) gets its
/// Events (kube's Recorder made names over 253 characters, so none could be written). The
/// Event is the Warning of a ProviderConfig that does not exist: a routine create writes none.
#[tokio::test]
async fn long_names_get_events() -> anyhow::Result<()> {
    let env = Env::new("longname").await?;
    let _operator = env.operator().start(operator_bin())?;
    let name = format!("l{}g", "o".repeat(251));
    ensure!(name.len() == 253);
    env.create_vm(env.vm(&name, "no-such-provider")).await?;
    env.wait_vm_event(&name, "ProviderConfigNotFound").await
}
