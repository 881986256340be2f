//! Active-active sharding (`--shards`) on the real control plane: three replicas share 300
//! VMs on the loopback testcloud. Every VM is reconciled by exactly one replica; when one is
//! killed, the others take its VMs over within the lease duration; and no VM ever has plugin
//! calls from two replicas interleaved (the overlap detector: per VM, a replica that handed
//! its calls over never calls again; after the kill a survivor may also hand a shard to the
//! other survivor when the assignment over the remaining members moves it). The control
//! plane runs with `ShardedListAndWatch` (KEP-5866): each replica caches only the VMs of the
//! shards it holds (`vmop_virtual_machines` counts them), and the ProviderConfig's `vmCount`,
//! summed over the replicas' counts, is every VM once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::future::try_join_all;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use vmop::api::{Limits, ProviderConfig, VirtualMachine, conditions};
use vmop::leader::shards::shard_of;
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::operator::{Env, Operator, ProviderCall, TEST_GRACE_SECONDS};

use crate::operator_bin;

const REPLICAS: usize = 3;
const VMS: usize = 300;
const SHARDS: &str = "6";
/// The shard Leases' duration (`LeaseConfig::new`'s default).
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
const DEADLINE: Duration = Duration::from_secs(240);
const PLUGIN: &str = "testcloud.wasm";

/// The testcloud plugin in the operator's plugin directory, and a ProviderConfig for `cloud`
/// allowing 1,000 calls a second; returns its name.
pub(crate) async fn provider(env: &Env, cloud: &Cloud) -> anyhow::Result<String> {
    provider_with(env, cloud, 1000).await
}

/// [`provider`] allowing `per_second` calls a second (and as many at once).
pub(crate) async fn provider_with(
    env: &Env,
    cloud: &Cloud,
    per_second: u32,
) -> anyhow::Result<String> {
    std::fs::copy(
        vmop_tests::wasm::path("vmop_provider_testcloud")?,
        env.plugin_dir.path().join(PLUGIN),
    )
    .context("failed to copy the testcloud plugin")?;
    let mut pc = env.provider_config("tc", "unused");
    pc.spec.plugin.path = PLUGIN.to_owned();
    pc.spec.config = [("endpoint".to_owned(), cloud.endpoint().to_owned())].into();
    pc.spec.credentials_secret_ref = None;
    pc.spec.allowed_hosts = vec![cloud.endpoint().to_owned()];
    pc.spec.limits = Limits {
        requests_per_second: per_second,
        burst: per_second,
        max_concurrent_calls: 32,
        creation_grace_period_seconds: TEST_GRACE_SECONDS,
        ..Limits::default()
    };
    env.apply_provider_config(&pc).await?;
    Ok(pc.name_any())
}

/// Deletes every VM and waits until they are gone; fails if a machine is left.
pub(crate) async fn delete_all_leaving_nothing(env: &Env, cloud: &Cloud) -> anyhow::Result<()> {
    env.vms()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_vms(env, "all gone", |vms| vms.is_empty()).await?;
    ensure!(cloud.live().is_empty(), "machines left: {:?}", cloud.live());
    Ok(())
}

pub(crate) fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, conditions::READY))
}

/// Waits until `done` holds for the list of VMs, or fails after [`DEADLINE`].
pub(crate) async fn wait_vms(
    env: &Env,
    what: &str,
    done: impl Fn(&[VirtualMachine]) -> bool,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let vms = env.vms().list(&ListParams::default()).await?.items;
        if done(&vms) {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "{what}: not after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until every replica counts all of them as members (it has then handed over what it
/// no longer ranks first) and every shard is held by exactly one; returns the shards per
/// replica.
pub(crate) async fn wait_spread(
    operators: &[Operator],
    shards: u32,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let started = Instant::now();
    loop {
        let mut held = Vec::new();
        let mut members = Vec::new();
        for operator in operators {
            let scrape = operator.metrics().await?;
            members.push(scrape.sum("vmop_shard_members", &[]));
            held.push(
                (0..shards)
                    .filter(|s| {
                        let lease = format!("vmop-shard-{s}");
                        scrape.sum("leader_election_master_status", &[("name", &lease)]) > 0.0
                    })
                    .collect::<Vec<u32>>(),
            );
        }
        let once = (0..shards).all(|s| held.iter().filter(|h| h.contains(&s)).count() == 1);
        let all_seen = members.iter().all(|m| *m as usize == operators.len());
        if all_seen && once && held.iter().all(|h| !h.is_empty()) {
            return Ok(held);
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "shards never spread over the replicas: held {held:?}, members seen {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until each replica caches exactly the VMs of the shards it holds.
async fn wait_caches(env: &Env, operators: &[Operator], spread: &[Vec<u32>]) -> anyhow::Result<()> {
    let shards: u32 = SHARDS.parse()?;
    let uids = env.vm_uids().await?;
    let want: Vec<usize> = spread
        .iter()
        .map(|held| {
            uids.iter()
                .filter(|uid| held.contains(&shard_of(uid, shards)))
                .count()
        })
        .collect();
    let started = Instant::now();
    loop {
        let mut cached = Vec::new();
        for operator in operators {
            cached.push(operator.metrics().await?.sum("vmop_virtual_machines", &[]) as usize);
        }
        if cached == want {
            eprintln!("VMs cached per replica: {cached:?} (shards {spread:?})");
            return Ok(());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "replicas cache {cached:?} VMs, their shards {spread:?} hold {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the ProviderConfig's `vmCount` is `want`.
async fn wait_vm_count(env: &Env, provider: &str, want: usize) -> anyhow::Result<()> {
    let configs = kube::Api::<ProviderConfig>::all(env.client.clone());
    let started = Instant::now();
    loop {
        let count = configs.get(provider).await?.status.map(|s| s.vm_count);
        if count == Some(u32::try_from(want)?) {
            return Ok(());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "vmCount of {provider} is {count:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One plugin call: when it ended, the replica that made it, and the operation.
pub(crate) type Call = (String, usize, String);

/// Calls per VM name, in time order (a replica's own calls in its log's order).
pub(crate) fn calls_by_vm(operators: &[Operator]) -> BTreeMap<String, Vec<Call>> {
    let mut by_vm: BTreeMap<String, Vec<Call>> = BTreeMap::new();
    for (replica, operator) in operators.iter().enumerate() {
        for ProviderCall {
            timestamp, vm, op, ..
        } in operator.provider_calls()
        {
            // A ProviderConfig's own calls (its cloud listing) are no VM's.
            if vm.starts_with("providerconfig/") {
                continue;
            }
            let name = vm.rsplit('/').next().unwrap_or_default().to_owned();
            by_vm
                .entry(name)
                .or_default()
                .push((timestamp, replica, op));
        }
    }
    for calls in by_vm.values_mut() {
        calls.sort_by(|a, b| a.0.cmp(&b.0));
    }
    by_vm
}

/// The replicas that made calls for `vm`, in the order they took over.
pub(crate) fn handovers(calls: &[Call]) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::new();
    for (_, replica, _) in calls {
        if order.last() != Some(replica) {
            order.push(*replica);
        }
    }
    order
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_share_the_vms_and_take_over_a_killed_ones() -> anyhow::Result<()> {
    let env = Env::new("shards").await?;
    let cloud = Cloud::start(Config::default()).await?;
    let provider = provider(&env, &cloud).await?;
    let mut operators = (0..REPLICAS)
        .map(|i| {
            env.operator()
                // Every reconcile of a settled VM a call (the cloud view answers drift checks
                // without one), so that the calls show who reconciles each VM.
                .args_from([
                    "--shards",
                    SHARDS,
                    "--resync-period",
                    "10m",
                    "--cloud-view",
                    "off",
                ])
                .env("POD_NAME", format!("replica-{i}"))
                .start(operator_bin())
        })
        .collect::<anyhow::Result<Vec<Operator>>>()?;

    // Until each shard has settled on its first-ranked replica, early starters hand shards
    // over to later ones: VMs created meanwhile would rightly change hands.
    let spread = wait_spread(&operators, SHARDS.parse()?).await?;
    eprintln!("shards held per replica: {spread:?}");
    let loads: Vec<usize> = spread.iter().map(Vec::len).collect();
    ensure!(
        loads
            .iter()
            .max()
            .zip(loads.iter().min())
            .is_some_and(|(max, min)| max - min <= 1),
        "unbalanced: {spread:?}"
    );

    let names: Vec<String> = (0..VMS).map(|i| format!("vm-{i}")).collect();
    for chunk in names.chunks(30) {
        try_join_all(chunk.iter().map(|name| {
            let vm = env.vm(name, &provider).image(cloud::IMAGE);
            let env = &env;
            async move { env.create_vm(vm).await }
        }))
        .await?;
    }
    let created = wait_vms(&env, "all Ready", |vms| {
        vms.len() == VMS && vms.iter().all(is_ready)
    })
    .await?;

    let before = calls_by_vm(&operators);
    let mut served = [0usize; REPLICAS];
    for name in &names {
        let calls = before.get(name).map(Vec::as_slice).unwrap_or_default();
        let replicas: BTreeSet<usize> = calls.iter().map(|(_, r, _)| *r).collect();
        ensure!(
            replicas.len() == 1,
            "{name} was reconciled by replicas {replicas:?} (calls {calls:?})"
        );
        for r in replicas {
            if let Some(n) = served.get_mut(r) {
                *n += 1;
            }
        }
    }
    ensure!(
        served.iter().all(|n| *n > 0),
        "a replica reconciled nothing: {served:?}"
    );
    eprintln!(
        "{VMS} VMs Ready in {:.1} s; per replica {served:?}",
        created.as_secs_f64()
    );
    wait_caches(&env, &operators, &spread).await?;
    wait_vm_count(&env, &provider, VMS).await?;

    // Kill replica 0 without a chance to release its Leases.
    let orphaned: Vec<&String> = names
        .iter()
        .filter(|n| before.get(*n).and_then(|c| c.first()).map(|(_, r, _)| *r) == Some(0))
        .collect();
    operators.first_mut().context("no replica")?.kill().await?;
    let killed_at = Instant::now();
    let taken_over = loop {
        let now = calls_by_vm(&operators);
        let pending = orphaned
            .iter()
            .filter(|n| {
                let calls = now.get(**n).map(Vec::as_slice).unwrap_or_default();
                !calls.iter().any(|(_, r, _)| *r != 0)
            })
            .count();
        if pending == 0 {
            break killed_at.elapsed();
        }
        ensure!(
            killed_at.elapsed() < DEADLINE,
            "{pending} of the killed replica's {} VMs never reconciled by another",
            orphaned.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "the killed replica's {} VMs reconciled by the others {:.1} s after the kill (lease {:?})",
        orphaned.len(),
        taken_over.as_secs_f64(),
        LEASE_DURATION
    );
    // The survivors campaign once its member Lease has expired, and take each shard when its
    // Lease has: both count from its last renewal, up to a retry period before the kill.
    ensure!(
        taken_over <= LEASE_DURATION + RETRY_PERIOD * 3,
        "took {taken_over:?} to take over (lease {LEASE_DURATION:?})"
    );

    env.vms()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_vms(&env, "all gone", |vms| vms.is_empty()).await?;
    wait_vm_count(&env, &provider, 0).await?;
    ensure!(cloud.live().is_empty(), "machines left: {:?}", cloud.live());

    for (name, calls) in calls_by_vm(&operators) {
        // One replica, or a handover: once a VM's calls come from another replica, the one
        // before never calls again (never two at once). A survivor may hand a shard to another
        // survivor too, when the assignment over the remaining members moves it.
        let order = handovers(&calls);
        let mut seen = BTreeSet::new();
        let ok = order.iter().all(|replica| seen.insert(*replica));
        ensure!(
            ok,
            "{name}: calls from replicas in the order {order:?}, interleaved: {calls:?}"
        );
        // The testcloud declares `consistent-get`: a replica that made the machine and
        // deletes it confirms the deletion with one `get`, no `find` (`decide.rs`).
        if order.len() == 1 {
            let ops: Vec<&str> = calls
                .iter()
                .map(|(_, _, op)| op.as_str())
                .filter(|op| *op != "location")
                .collect();
            let after_delete = ops
                .iter()
                .rposition(|op| *op == "delete")
                .and_then(|i| ops.get(i..));
            ensure!(
                after_delete == Some(&["delete", "get"][..]),
                "{name}: plugin calls {ops:?} (expected a delete, then one get)"
            );
        }
    }
    Ok(())
}
