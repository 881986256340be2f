//! The adaptive call budget on the real parts: a testcloud that answers 429 beyond 5 requests a
//! second, and a ProviderConfig allowing 100. Creating 20 VMs at once is a throttle storm; the
//! operator's budget (`vmop_provider_call_budget`) halves with the cloud's answers instead of
//! retrying into them, every VM still becomes Ready with exactly one machine, and once the
//! storm is over (drift checks every 30 s, under the cloud's limit) the
//! budget climbs back to the configured 100. Deleting them all leaves no machine.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::ensure;
use futures::future::try_join_all;
use kube::api::ListParams;
use vmop::api::ProviderConfig;
use vmop_tests::cloud::{self, Cloud, Config, Ec2Limits, RateLimit};
use vmop_tests::operator::{Env, LOG_FILTER, Operator, ProviderCall};

use crate::operator_bin;
use crate::operator_sharding::{delete_all_leaving_nothing, is_ready, provider_with};

const VMS: usize = 20;
const CONFIGURED: f64 = 100.0;
const DEADLINE: Duration = Duration::from_secs(180);
/// The debug lines of requeues that wait for a token, besides the harness's log filter.
const HELD_BACK_LOGGED: &str = "vmop::controller::runtime::error_policy=debug";

async fn budget(operator: &Operator, provider: &str) -> anyhow::Result<Option<f64>> {
    let scrape = operator.metrics().await?;
    let value = scrape.sum(
        "vmop_provider_call_budget",
        &[("provider_config", provider)],
    );
    // A series not yet written reads as 0: no call made yet.
    Ok((value > 0.0).then_some(value))
}

/// Creates [`VMS`] VMs at once and waits until all are Ready, calling `sample` on each poll;
/// returns when the creates were done.
async fn create_all_until_ready(
    env: &Env,
    provider: &str,
    mut sample: impl AsyncFnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Instant> {
    let names: Vec<String> = (0..VMS).map(|i| format!("vm-{i}")).collect();
    try_join_all(names.iter().map(|name| {
        let vm = env.vm(name, provider).image(cloud::IMAGE);
        async move { env.create_vm(vm).await }
    }))
    .await?;
    let started = Instant::now();
    loop {
        sample().await?;
        let vms = env.vms().list(&ListParams::default()).await?.items;
        if vms.len() == VMS && vms.iter().all(is_ready) {
            return Ok(started);
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "not all Ready after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttle_storm_shrinks_the_budget_and_it_recovers_without_a_leak() -> anyhow::Result<()>
{
    let env = Env::new("budget").await?;
    let cloud = Cloud::start(Config::default().with_rate_limit(5.0, 5)).await?;
    let provider = provider_with(&env, &cloud, CONFIGURED as u32).await?;
    let operator = env
        .operator()
        .args_from(["--resync-period", "30s"])
        .start(operator_bin())?;

    // The storm: the lowest budget seen until every VM is Ready.
    let mut lowest = CONFIGURED;
    let started = create_all_until_ready(&env, &provider, async || {
        if let Some(now) = budget(&operator, &provider).await? {
            lowest = lowest.min(now);
        }
        Ok(())
    })
    .await?;
    let stats = cloud.stats();
    eprintln!(
        "{VMS} VMs Ready in {:.1} s: {} requests, {} answered 429; lowest budget {lowest:.2}/s",
        started.elapsed().as_secs_f64(),
        stats.requests,
        stats.throttled
    );
    ensure!(stats.throttled > 0, "the cloud never throttled: no storm");
    ensure!(
        lowest < CONFIGURED / 2.0,
        "the budget stayed at {lowest} through {} throttle answers",
        stats.throttled
    );
    ensure!(
        cloud.machines().len() == VMS,
        "{} machines made for {VMS} VMs",
        cloud.machines().len()
    );

    // After the storm: back to the configured budget.
    let calm = Instant::now();
    loop {
        if budget(&operator, &provider).await? == Some(CONFIGURED) {
            break;
        }
        ensure!(
            calm.elapsed() < DEADLINE,
            "the budget never recovered: {:?}",
            budget(&operator, &provider).await?
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "budget back to {CONFIGURED}/s {:.1} s after the storm",
        calm.elapsed().as_secs_f64()
    );

    delete_all_leaving_nothing(&env, &cloud).await
}

/// A cloud that throttles mutating calls on a bucket of its own (EC2's model: 8 at once and 4 a
/// second here, reads 20), and 20 VMs created at once. Without `mutatingRequestsPerSecond` the
/// creates run into the cloud's mutating bucket (429s); paced at the cloud's rate with a smaller
/// burst (4: the difference covers up to a second of a request's way to the cloud, during which
/// the cloud's full bucket refills nothing) they never do, and every VM becomes Ready with its
/// one machine. Deleted at once, paced the same way, a VM whose delete waits for a token is not
/// read meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn creates_paced_to_the_clouds_mutating_bucket_are_never_throttled() -> anyhow::Result<()> {
    let ample = RateLimit {
        per_second: 1000.0,
        burst: 1000,
    };
    let limits = Ec2Limits {
        read: RateLimit {
            per_second: 20.0,
            burst: 100,
        },
        mutate: RateLimit {
            per_second: 4.0,
            burst: 8,
        },
        run: ample,
        terminate: ample,
    };
    let mut throttled = Vec::new();
    for paced in [false, true] {
        let env = Env::new(if paced { "paced" } else { "unpaced" }).await?;
        let cloud = Cloud::start(Config::default().with_ec2(limits)).await?;
        let provider = provider_with(&env, &cloud, 100).await?;
        if paced {
            let mut pc: ProviderConfig = env.provider_configs().get(&provider).await?;
            pc.spec.limits.mutating_requests_per_second = Some(4);
            pc.spec.limits.mutating_burst = Some(4);
            env.apply_provider_config(&pc).await?;
        }
        // The requeues of calls held back by the budget are logged at debug.
        let operator = env
            .operator()
            .env("RUST_LOG", format!("{LOG_FILTER},{HELD_BACK_LOGGED}"))
            .start(operator_bin())?;
        let started = create_all_until_ready(&env, &provider, async || Ok(())).await?;
        let stats = cloud.stats();
        eprintln!(
            "paced={paced}: {VMS} VMs Ready in {:.1} s; {} mutating calls, {} answered 429",
            started.elapsed().as_secs_f64(),
            stats.mutates,
            stats.throttled_mutates
        );
        ensure!(
            cloud.machines().len() == VMS,
            "{} machines for {VMS} VMs",
            cloud.machines().len()
        );
        throttled.push(stats.throttled_mutates);
        let before = operator.provider_calls().len();
        delete_all_leaving_nothing(&env, &cloud).await?;
        if paced {
            let held_back = operator
                .log()
                .lines()
                .filter(|l| l.contains("not yet: requeued") && l.contains("call delete throttled"))
                .count();
            deletes_waiting_for_the_budget_read_nothing(
                operator.provider_calls().get(before..).unwrap_or_default(),
                held_back,
            )?;
        }
    }
    ensure!(
        throttled.first().is_some_and(|n| *n > 0),
        "unpaced creates were never throttled: the test shows nothing"
    );
    ensure!(
        throttled.get(1) == Some(&0),
        "paced creates were throttled {:?} times",
        throttled.get(1)
    );
    Ok(())
}

/// Each VM's calls in a deletion paced by the mutating budget, up to its `delete` that was
/// sent: a delete held back for a token (`held_back` of them, from the log) was not asked, so
/// the machine this process made is still deleted without a `get` first. Fails if no delete
/// was held back.
fn deletes_waiting_for_the_budget_read_nothing(
    calls: &[ProviderCall],
    held_back: usize,
) -> anyhow::Result<()> {
    let vms: BTreeSet<&str> = calls
        .iter()
        .filter(|c| c.op == "delete")
        .map(|c| c.vm.as_str())
        .collect();
    let read: Vec<&str> = vms
        .iter()
        .copied()
        .filter(|vm| {
            calls
                .iter()
                .filter(|c| c.vm == *vm)
                .take_while(|c| c.op != "delete")
                .any(|c| c.op == "get")
        })
        .collect();
    eprintln!(
        "deletion: {} VMs, {held_back} deletes held back for the mutating budget, {} VMs read before their delete",
        vms.len(),
        read.len()
    );
    ensure!(
        held_back > 0,
        "no delete waited for the budget: the check shows nothing"
    );
    ensure!(
        read.is_empty(),
        "VMs read before their delete while it waited for the budget: {read:?}"
    );
    Ok(())
}
