//! Convergence benchmark (ignored by default; one command):
//!
//! ```text
//! cargo test -p vmop-tests --release --test operator operator_bench -- --ignored --nocapture
//! VMOP_BENCH_VMS=500 cargo test -p vmop-tests --release --test operator operator_bench -- --ignored --nocapture
//! ```
//!
//! N VirtualMachines (200 by default, `VMOP_BENCH_VMS`) go from create to all Ready and from
//! delete to all gone through the operator, the EC2 plugin and moto. Writes to the API server
//! are counted from its own `apiserver_request_total` (POST/PUT/PATCH/APPLY/DELETE, leases
//! excluded) around each phase, on a control plane no other test uses
//! (`ControlPlane::dedicated`). The floor is a bare client in the same run doing the minimum
//! for the same end state without an operator: create each VM, write its status once (id,
//! Ready), delete it.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::TryStreamExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use vmop::api::{Limits, VirtualMachine};
use vmop_tests::controlplane::ControlPlane;
use vmop_tests::fixtures;
use vmop_tests::operator::Env;
use vmop_tests::operator::writes::api_writes as writes;

use crate::operator_bin;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (v - before.get(k).copied().unwrap_or(0.0)).round() as u64,
            )
        })
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn total(d: &BTreeMap<String, u64>) -> u64 {
    d.values().sum()
}

/// Waits (watching, with a deadline) until `done` holds for the set of Ready VM names / the
/// set of existing VM names.
async fn watch_until(
    api: Api<VirtualMachine>,
    deadline: Duration,
    done: impl Fn(&HashSet<String>, &HashSet<String>) -> bool,
) -> anyhow::Result<()> {
    let mut ready = HashSet::new();
    let mut present = HashSet::new();
    // Judged only once the watch has listed everything.
    let mut listed = false;
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(deadline, async {
        while let Some(event) = stream.try_next().await? {
            match event {
                watcher::Event::Apply(vm) | watcher::Event::InitApply(vm) => {
                    let is_ready = vm.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                    present.insert(vm.name_any());
                    if is_ready {
                        ready.insert(vm.name_any());
                    } else {
                        ready.remove(&vm.name_any());
                    }
                }
                watcher::Event::Delete(vm) => {
                    present.remove(&vm.name_any());
                    ready.remove(&vm.name_any());
                }
                watcher::Event::Init => {
                    ready.clear();
                    present.clear();
                    listed = false;
                }
                watcher::Event::InitDone => listed = true,
            }
            if listed && done(&ready, &present) {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the watch ended")
    })
    .await
    .context("the phase did not finish before the deadline")?
}

#[tokio::test]
#[ignore = "benchmark: run with --ignored --nocapture (VMOP_BENCH_VMS=N)"]
async fn convergence_benchmark() -> anyhow::Result<()> {
    let n = env_number("VMOP_BENCH_VMS", 200) as usize;
    let concurrency = env_number("VMOP_BENCH_CONCURRENCY", 32);
    let deadline = Duration::from_secs(env_number("VMOP_BENCH_DEADLINE_SECS", 1800));
    let env = Env::on(ControlPlane::dedicated("bench").await?, "bench").await?;
    let admin = env.client.clone();

    // The floor: a bare client, no operator, its own namespace.
    let bare_ns = vmop_tests::controlplane::create_namespace(&admin, "bench-bare").await?;
    let bare: Api<VirtualMachine> = Api::namespaced(admin.clone(), &bare_ns);
    let before = writes(&admin).await?;
    let started = Instant::now();
    for i in 0..n {
        let vm = fixtures::vm(&format!("vm-{i}"))
            .namespace(&bare_ns)
            .provider("bare")
            .build();
        bare.create(&PostParams::default(), &vm).await?;
        let status = json!({ "status": {
            "id": format!("i-{i}"), "phase": "Running",
            "conditions": [{ "type": "Ready", "status": "True", "reason": "Running", "message": "",
                             "lastTransitionTime": "2026-01-01T00:00:00Z" }],
        }});
        bare.patch_status(
            &vm.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    }
    for i in 0..n {
        bare.delete(&format!("vm-{i}"), &DeleteParams::default())
            .await?;
    }
    let bare_elapsed = started.elapsed();
    let bare_writes = delta(&before, &writes(&admin).await?);

    // The operator.
    let provider = env.standard_provider("aws").await?;
    let mut pc = env.provider_configs().get(&provider).await?;
    pc.spec.limits = Limits {
        requests_per_second: 1000,
        burst: 1000,
        max_concurrent_calls: concurrency as u32,
        ..pc.spec.limits.clone()
    };
    env.apply_provider_config(&pc).await?;
    let operator = env
        .operator()
        .args_from([
            "--max-concurrent-reconciles".to_owned(),
            concurrency.to_string(),
            "--poll-interval".to_owned(),
            "1s".to_owned(),
        ])
        .start(operator_bin())?;
    // Let the operator settle (ProviderConfig loaded) before measuring.
    vmop_tests::operator::wait_for(env.provider_configs(), &provider, "Ready", |pc| {
        pc.and_then(|pc| pc.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await?;

    let before = writes(&admin).await?;
    let started = Instant::now();
    for i in 0..n {
        env.create_vm(env.vm(&format!("vm-{i}"), &provider)).await?;
    }
    watch_until(env.vms(), deadline, |ready, _| ready.len() == n).await?;
    let create_elapsed = started.elapsed();
    let after_create = writes(&admin).await?;

    let started = Instant::now();
    env.vms()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    watch_until(env.vms(), deadline, |_, present| present.is_empty()).await?;
    let delete_elapsed = started.elapsed();
    let after_delete = writes(&admin).await?;

    let create_writes = delta(&before, &after_create);
    let delete_writes = delta(&after_create, &after_delete);
    let all_writes = delta(&before, &after_delete);
    let calls = operator.provider_calls();
    let count_op = |op: &str| calls.iter().filter(|c| c.op == op).count();
    let running = env.moto.ec2(
        "DescribeInstances",
        &[
            ("Filter.1.Name", "tag-key"),
            ("Filter.1.Value.1", "vmop.dev/uid"),
            ("Filter.2.Name", "instance-state-name"),
            ("Filter.2.Value.1", "running"),
        ],
    )?;
    let still_running = running.matches("<instanceId>").count();

    let per_vm = |w: u64| w as f64 / n as f64;
    println!("\n== vmop convergence benchmark: N = {n} VMs, concurrency {concurrency} ==");
    println!(
        "create -> all Ready : {:>8.2} s",
        create_elapsed.as_secs_f64()
    );
    println!(
        "delete -> all gone  : {:>8.2} s",
        delete_elapsed.as_secs_f64()
    );
    println!(
        "API writes, create phase: {} ({:.2}/VM) {create_writes:?}",
        total(&create_writes),
        per_vm(total(&create_writes))
    );
    println!(
        "API writes, delete phase: {} ({:.2}/VM) {delete_writes:?}",
        total(&delete_writes),
        per_vm(total(&delete_writes))
    );
    println!(
        "API writes, operator run: {} ({:.2}/VM)",
        total(&all_writes),
        per_vm(total(&all_writes))
    );
    println!(
        "API writes, bare client : {} ({:.2}/VM) {bare_writes:?} in {:.2} s",
        total(&bare_writes),
        per_vm(total(&bare_writes)),
        bare_elapsed.as_secs_f64()
    );
    println!(
        "ratio operator / bare   : {:.2}",
        total(&all_writes) as f64 / total(&bare_writes).max(1) as f64
    );
    println!(
        "plugin calls: create {} get {} delete {}; instances still running in moto: {still_running}",
        count_op("create"),
        count_op("get"),
        count_op("delete"),
    );
    ensure!(count_op("create") >= n, "fewer creates than VMs");
    ensure!(
        still_running == 0,
        "{still_running} instances survived their VMs"
    );
    Ok(())
}
