//! The operator's API writes per VM lifecycle, counted, not timed: the writes a plain
//! controller-runtime operator makes (finalizer added, status written once, finalizer removed)
//! and no more: a routine create or delete writes no Event. Counted from the API server's own
//! `apiserver_request_total`, which counts every client's writes: the test runs on a control
//! plane no other test uses (`ControlPlane::dedicated`), and subtracts its own create and
//! delete.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use vmop::api::ProviderConfig;
use vmop_tests::controlplane::ControlPlane;
use vmop_tests::operator::writes::{api_writes, to};
use vmop_tests::operator::{Env, wait_for};

use crate::operator_bin;

const VMS: usize = 5;

#[tokio::test]
async fn a_vm_lifecycle_costs_the_peers_writes_and_no_event() -> anyhow::Result<()> {
    let env = Env::on(ControlPlane::dedicated("writes").await?, "writes").await?;
    // The instant provider (the trivial guest, whose `get` answers "none" once asked to), as
    // in the peer comparison: no cloud latency, no boot phases.
    std::fs::copy(
        vmop_tests::wasm::path("trivial")?,
        env.plugin_dir.path().join("trivial.wasm"),
    )?;
    let mut pc = env.provider_config("instant", "unused");
    pc.spec.plugin.path = "trivial.wasm".to_owned();
    pc.spec.config = BTreeMap::from([("get".to_owned(), "none".to_owned())]);
    pc.spec.credentials_secret_ref = None;
    pc.spec.allowed_hosts = Vec::new();
    env.apply_provider_config(&pc).await?;
    let provider = pc.name_any();
    let operator = env.operator().start(operator_bin())?;
    // Let the ProviderConfig settle first: its status is per ProviderConfig, not per VM.
    wait_for(
        env.provider_configs(),
        &provider,
        "Ready=True",
        |pc: Option<&ProviderConfig>| {
            pc.and_then(|pc| pc.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
    )
    .await?;
    // Its `PluginLoaded` Event is written after that status: wait for it, or it may land in the
    // counted window.
    let events: kube::Api<Event> = kube::Api::all(env.client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some("PluginLoaded")
                && e.regarding
                    .as_ref()
                    .is_some_and(|r| r.name.as_deref() == Some(provider.as_str()))
        })
    {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no PluginLoaded Event for {provider}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let before = api_writes(&env.client).await?;
    for i in 0..VMS {
        env.create_vm(env.vm(&format!("vm-{i}"), &provider)).await?;
    }
    for i in 0..VMS {
        env.wait_ready(&format!("vm-{i}")).await?;
    }
    // The status is written without managedFields: the API server kept everyone's, and
    // names the operator's writes after it (`vmop::api::MANAGER`, from its user agent).
    let vm = env.vms().get("vm-0").await?;
    let managers: Vec<_> = vm
        .managed_fields()
        .iter()
        .map(|m| (m.manager.clone(), m.subresource.clone()))
        .collect();
    let ours = |sub: Option<&str>| {
        managers.iter().any(|(manager, s)| {
            manager.as_deref() == Some(vmop::api::MANAGER) && s.as_deref() == sub
        })
    };
    ensure!(
        ours(Some("status")) && ours(None),
        "managed fields after the operator's writes: {managers:?}"
    );
    for i in 0..VMS {
        env.vms()
            .delete(&format!("vm-{i}"), &DeleteParams::default())
            .await?;
    }
    for i in 0..VMS {
        env.wait_gone(&format!("vm-{i}")).await?;
    }
    let after = api_writes(&env.client).await?;
    let delta: BTreeMap<String, f64> = after
        .iter()
        .map(|(key, n)| (key.clone(), n - before.get(key).copied().unwrap_or(0.0)))
        .collect();
    let per_vm = |n: f64| n / VMS as f64;
    // The test itself creates and deletes each VM: one POST and one DELETE of virtualmachines.
    let objects = per_vm(to(&delta, "virtualmachines")) - 2.0;
    let status = per_vm(to(&delta, "virtualmachines/status"));
    let events = per_vm(to(&delta, "events"));
    let puts = per_vm(delta.get("PUT virtualmachines").copied().unwrap_or(0.0));
    let patches = per_vm(delta.get("PATCH virtualmachines").copied().unwrap_or(0.0));
    println!(
        "operator writes per VM lifecycle: virtualmachines {objects} ({puts} PUT, {patches} \
         PATCH), status {status}, events {events} (peer: 2 PUTs, 1, 0)"
    );
    ensure!(
        objects == 2.0,
        "finalizer writes per VM: {objects} (expected 2: add, remove)"
    );
    // The finalizer is added with a merge patch (a PUT of the cached object would rewrite
    // what the user wrote) and its removal, which deletes the object, is a PUT: cheaper for
    // the API server (`effects.rs` `Live::release`).
    ensure!(
        puts == 1.0 && patches == 1.0,
        "finalizer writes per VM: {puts} PUT, {patches} PATCH (expected 1 and 1: {delta:?})"
    );
    ensure!(status == 1.0, "status writes per VM: {status} (expected 1)");
    ensure!(events == 0.0, "Events per VM: {events} (expected none)");
    // And the plugin calls: one `create`; at deletion the machine this process made is
    // deleted without a `get` first (`decide.rs`, `Facts::sole_machine`), then `get` and
    // `find` confirm it is gone (asked again if the creation grace period is not over).
    for i in 0..VMS {
        let ops: Vec<String> = operator
            .calls_for(&format!("vm-{i}"))
            .into_iter()
            .map(|c| c.op)
            .filter(|op| op != "location")
            .collect();
        ensure!(
            ops.get(..2) == Some(&["create".to_owned(), "delete".to_owned()][..])
                && ops.iter().filter(|op| *op == "delete").count() == 1
                && ops.ends_with(&["get".to_owned(), "find".to_owned()]),
            "plugin calls of vm-{i}: {ops:?} (expected create, delete, then get and find)"
        );
    }
    Ok(())
}
