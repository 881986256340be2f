//! A replica frozen (SIGSTOP) past its shard Leases and then continued, on the real control
//! plane with three `--shards` replicas re-checking every VM each second: the others take its
//! shards over while it is frozen, and once it runs again it makes no plugin call for a VM
//! another replica now holds. A frozen process cannot tell that time passed until it runs;
//! what it must not do is act before it checked (`leader::held`, the hold's validity).
//!
//! The overlap detector reads the replicas' logs: per VM, the plugin calls in time order, and
//! per replica when it started holding each shard. Whenever a VM's calls pass from one replica
//! to another, the new one must have started holding the VM's shard after the previous
//! replica's last call; a replica that resumes calling under a hold from before the hand-over
//! fails it.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::future::try_join_all;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use vmop::leader::shards::shard_of;
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::operator::{Env, Operator};

use crate::operator_bin;
use crate::operator_sharding::{
    delete_all_leaving_nothing, is_ready, provider, wait_spread, wait_vms,
};

const REPLICAS: usize = 3;
const SHARDS: u32 = 3;
const VMS: usize = 30;
const DEADLINE: Duration = Duration::from_secs(120);

/// When each replica started holding each shard (log lines "holding shard").
fn holds(operator: &Operator) -> Vec<(Timestamp, u32)> {
    operator
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| {
            let fields = v.get("fields")?;
            (fields.get("message")?.as_str()? == "holding shard").then_some(())?;
            let shard = u32::try_from(fields.get("shard")?.as_u64()?).ok()?;
            let at = Timestamp::from_str(v.get("timestamp")?.as_str()?).ok()?;
            Some((at, shard))
        })
        .collect()
}

/// Per VM name: when each plugin call started, and by which replica, in time order. A call's
/// start, not its end: one in flight when its process froze ends after the freeze, and may
/// reach the cloud then (the caveat of every lease); what must not happen is a call *started*
/// under a hold that has passed.
fn calls(operators: &[Operator]) -> BTreeMap<String, Vec<(Timestamp, usize)>> {
    let mut by_vm: BTreeMap<String, Vec<(Timestamp, usize)>> = BTreeMap::new();
    for (replica, operator) in operators.iter().enumerate() {
        for call in operator.provider_calls() {
            if let Some(started) = call.started() {
                by_vm
                    .entry(call.vm_name().to_owned())
                    .or_default()
                    .push((started, replica));
            }
        }
    }
    for calls in by_vm.values_mut() {
        calls.sort();
    }
    by_vm
}

/// Every hand-over of a VM's calls from one replica to another where the new replica's hold
/// of the VM's shard began before the previous replica's last call started.
fn overlaps(operators: &[Operator], shard_by_name: &BTreeMap<String, u32>) -> Vec<String> {
    let holds: Vec<Vec<(Timestamp, u32)>> = operators.iter().map(holds).collect();
    let mut found = Vec::new();
    for (name, calls) in calls(operators) {
        let Some(&shard) = shard_by_name.get(&name) else {
            continue;
        };
        for pair in calls.windows(2) {
            let [(last, before), (first, after)] = pair else {
                continue;
            };
            if before == after {
                continue;
            }
            let held_since = holds
                .get(*after)
                .and_then(|h| h.iter().filter(|(at, s)| *s == shard && at <= first).max());
            if held_since.is_none_or(|(since, _)| since <= last) {
                found.push(format!(
                    "{name} (shard {shard}): replica {after} called at {first} under a hold from \
                     {held_since:?}, replica {before} had called at {last}"
                ));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_replica_resumes_without_calling_for_vms_it_no_longer_holds() -> anyhow::Result<()>
{
    let env = Env::new("freeze").await?;
    let cloud = Cloud::start(Config::default()).await?;
    let provider = provider(&env, &cloud).await?;
    let operators = (0..REPLICAS)
        .map(|i| {
            env.operator()
                // Every re-check a call (the cloud view answers drift checks without one), so
                // that the calls show who reconciles each VM.
                .args_from([
                    "--shards",
                    &SHARDS.to_string(),
                    "--resync-period",
                    "1s",
                    "--cloud-view",
                    "off",
                ])
                .env("POD_NAME", format!("replica-{i}"))
                .start(operator_bin())
        })
        .collect::<anyhow::Result<Vec<Operator>>>()?;
    // Every shard settled on its first-ranked replica: nothing changes hands but by the freeze.
    let spread = wait_spread(&operators, SHARDS).await?;
    let names: Vec<String> = (0..VMS).map(|i| format!("vm-{i}")).collect();
    try_join_all(names.iter().map(|name| {
        let vm = env.vm(name, &provider).image(cloud::IMAGE);
        let env = &env;
        async move { env.create_vm(vm).await }
    }))
    .await?;
    wait_vms(&env, "all Ready", |vms| {
        vms.len() == VMS && vms.iter().all(is_ready)
    })
    .await?;
    let shard_by_name: BTreeMap<String, u32> = env
        .vms()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|vm| {
            let uid = vm.uid().unwrap_or_default();
            (vm.name_any(), shard_of(&uid, SHARDS))
        })
        .collect();

    // Freeze the holder of vm-0's shard, mid-work (it re-checks its VMs every second).
    let vm0_shard = *shard_by_name.get("vm-0").context("vm-0's shard")?;
    let frozen = spread
        .iter()
        .position(|held| held.contains(&vm0_shard))
        .context("nobody holds vm-0's shard")?;
    let frozen_operator = operators.get(frozen).context("no such replica")?;
    let its_shards = spread.get(frozen).cloned().unwrap_or_default();
    let its_vms: Vec<&String> = names
        .iter()
        .filter(|n| {
            shard_by_name
                .get(*n)
                .is_some_and(|s| its_shards.contains(s))
        })
        .collect();
    frozen_operator.signal("STOP")?;
    let stopped_at = Timestamp::now();
    let started = Instant::now();
    // Until the others re-checked every one of its VMs: they hold its shards now.
    loop {
        let now = calls(&operators);
        let pending = its_vms
            .iter()
            .filter(|n| {
                !now.get(**n)
                    .is_some_and(|c| c.iter().any(|(at, r)| *r != frozen && *at > stopped_at))
            })
            .count();
        if pending == 0 {
            break;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "{pending} of the frozen replica's {} VMs never reached another replica",
            its_vms.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "the frozen replica's {} VMs taken over after {:.1} s",
        its_vms.len(),
        started.elapsed().as_secs_f64()
    );
    frozen_operator.signal("CONT")?;
    // Let it run again until it has noticed: it logs the loss of the shards it held.
    let resumed = Instant::now();
    while !frozen_operator.log().contains("no longer holding shard") {
        ensure!(
            resumed.elapsed() < DEADLINE,
            "the resumed replica never gave up its shards"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And a few more rounds of re-checks by everyone.
    let before: usize = calls(&operators).values().map(Vec::len).sum();
    while calls(&operators).values().map(Vec::len).sum::<usize>() < before + 2 * VMS {
        ensure!(
            resumed.elapsed() < DEADLINE,
            "the replicas stopped re-checking"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    delete_all_leaving_nothing(&env, &cloud).await?;
    let found = overlaps(&operators, &shard_by_name);
    ensure!(found.is_empty(), "overlapping calls:\n{}", found.join("\n"));
    Ok(())
}
