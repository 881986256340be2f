//! Drift checks leave room for work (`runtime::drift_slots`): an operator with two reconcile
//! workers polls six Ready VMs per object (`--cloud-view off`) every second against a cloud
//! that answers each call after 500 ms, more checks than two workers can make. Only one drift
//! check is ever in flight at once, and a VM created meanwhile still gets a worker and becomes
//! Ready with its one machine.

use std::time::Duration;

use anyhow::ensure;
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::operator::{Env, ProviderCall};

use crate::operator_bin;
use crate::operator_sharding::{delete_all_leaving_nothing, is_ready, provider_with, wait_vms};

const SETTLED: usize = 6;

/// The most `get` calls in flight at once among `calls` (each from its start to its end).
fn most_gets_at_once(calls: &[ProviderCall]) -> usize {
    let mut edges: Vec<(i128, i32)> = calls
        .iter()
        .filter(|c| c.op == "get")
        .filter_map(|c| {
            let start = c.started()?.as_nanosecond();
            let end = c.timestamp.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
            Some([(start, 1), (end.as_nanosecond(), -1)])
        })
        .flatten()
        .collect();
    // An end before a start at the same instant: touching calls do not overlap.
    edges.sort();
    let mut now = 0i32;
    let mut most = 0i32;
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_checks_never_hold_every_worker() -> anyhow::Result<()> {
    let env = Env::new("workers").await?;
    let cloud = Cloud::start(Config::default().with_latency(Duration::from_millis(500))).await?;
    let provider = provider_with(&env, &cloud, 1000).await?;
    let operator = env
        .operator()
        .args_from([
            "--max-concurrent-reconciles",
            "2",
            "--cloud-view",
            "off",
            "--resync-period",
            "1s",
        ])
        .start(operator_bin())?;
    for i in 0..SETTLED {
        env.create_vm(
            env.vm(&format!("settled-{i}"), &provider)
                .image(cloud::IMAGE),
        )
        .await?;
    }
    wait_vms(&env, "all Ready", |vms| {
        vms.len() == SETTLED && vms.iter().all(is_ready)
    })
    .await?;
    // Six checks a second want three workers at 500 ms a call: the drift checks are as many
    // as the workers let them be, and a new VM needs a worker too.
    let before = operator.provider_calls().len();
    env.create_vm(env.vm("newcomer", &provider).image(cloud::IMAGE))
        .await?;
    wait_vms(&env, "the newcomer Ready", |vms| {
        vms.iter()
            .any(|vm| vm.metadata.name.as_deref() == Some("newcomer") && is_ready(vm))
    })
    .await?;
    let gets_since = |calls: &[ProviderCall]| {
        calls
            .get(before..)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.op == "get")
            .count()
    };
    let calls = operator
        .wait_calls("three rounds of drift checks", |calls| {
            gets_since(calls) >= 3 * SETTLED
        })
        .await?;
    let most = most_gets_at_once(calls.get(before..).unwrap_or_default());
    eprintln!(
        "{} drift checks; at most {most} at once",
        gets_since(&calls)
    );
    ensure!(
        most == 1,
        "{most} drift checks in flight at once with two workers: none was left for work"
    );
    ensure!(
        cloud.live().len() == SETTLED + 1,
        "{} machines for {} VMs",
        cloud.live().len(),
        SETTLED + 1
    );
    delete_all_leaving_nothing(&env, &cloud).await
}
