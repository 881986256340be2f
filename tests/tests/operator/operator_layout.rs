//! A `--shards` change under churn, as a rolling upgrade makes it: two replicas with
//! `--shards 2` serve the VMs, two with `--shards 3` start beside them, VMs are created and
//! deleted meanwhile, and the old replicas stop one after the other (SIGTERM). The new
//! layout takes over only once the old one released its last Lease (`leader::layout`): no VM
//! ever has plugin calls from two replicas interleaved, none is left behind, none leaks.

use std::collections::BTreeSet;

use anyhow::ensure;
use futures::future::try_join_all;
use kube::api::DeleteParams;
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::operator::{Env, Operator};

use crate::operator_bin;
use crate::operator_sharding::{
    calls_by_vm, delete_all_leaving_nothing, handovers, is_ready, provider, wait_vms,
};

/// Created before the new replicas start.
const FIRST: usize = 20;
/// Created while the layouts change.
const CHURN: usize = 20;

fn replicas(env: &Env, shards: &str, prefix: &str) -> anyhow::Result<Vec<Operator>> {
    (0..2)
        .map(|i| {
            env.operator()
                // Every VM re-checked each second: both layouts would call for every VM
                // while they run side by side, were they not fenced.
                .args_from(["--shards", shards, "--resync-period", "1s"])
                .env("POD_NAME", format!("{prefix}-{i}"))
                .start(operator_bin())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_count_change_under_churn_hands_over_without_overlap() -> anyhow::Result<()> {
    let env = Env::new("layout").await?;
    let cloud = Cloud::start(Config::default()).await?;
    let provider = provider(&env, &cloud).await?;
    let create = |names: Vec<String>| {
        let (env, provider) = (&env, &provider);
        async move {
            try_join_all(names.iter().map(|name| async move {
                env.create_vm(env.vm(name, provider).image(cloud::IMAGE))
                    .await
            }))
            .await
        }
    };

    let mut old = replicas(&env, "2", "old")?;
    create((0..FIRST).map(|i| format!("vm-{i}")).collect()).await?;
    wait_vms(&env, "the first VMs Ready", |vms| {
        vms.len() == FIRST && vms.iter().all(is_ready)
    })
    .await?;

    let new = replicas(&env, "3", "new")?;
    for replica in &new {
        replica.metrics_addr().await?;
    }
    // A resync round of the old layout with the new one up and campaigning.
    let before: usize = old.iter().map(|r| r.provider_calls().len()).sum();
    let started = std::time::Instant::now();
    while old.iter().map(|r| r.provider_calls().len()).sum::<usize>() < before + FIRST {
        ensure!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the old replicas stopped re-checking their VMs"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Churn while both layouts run: new VMs, and deletions of some of the first.
    let churn = async {
        for i in FIRST..FIRST + CHURN {
            create(vec![format!("vm-{i}")]).await?;
            if i % 4 == 0 {
                let victim = format!("vm-{}", i - FIRST);
                env.vms().delete(&victim, &DeleteParams::default()).await?;
            }
        }
        anyhow::Ok(())
    };
    let rollout = async {
        for replica in &mut old {
            replica.terminate().await?;
        }
        anyhow::Ok(())
    };
    tokio::try_join!(churn, rollout)?;
    let deleted: BTreeSet<String> = (FIRST..FIRST + CHURN)
        .filter(|i| i % 4 == 0)
        .map(|i| format!("vm-{}", i - FIRST))
        .collect();
    let remaining = FIRST + CHURN - deleted.len();
    wait_vms(&env, "the new layout serving every VM", |vms| {
        vms.len() == remaining && vms.iter().all(is_ready)
    })
    .await?;

    delete_all_leaving_nothing(&env, &cloud).await?;

    let operators: Vec<Operator> = old.into_iter().chain(new).collect();
    let mut handed_over = 0;
    for (name, calls) in calls_by_vm(&operators) {
        let order = handovers(&calls);
        let mut seen = BTreeSet::new();
        ensure!(
            order.iter().all(|replica| seen.insert(*replica)),
            "{name}: calls from replicas in the order {order:?}, interleaved: {calls:?}"
        );
        // Replicas 0 and 1 are the old layout, 2 and 3 the new.
        if order.first().is_some_and(|r| *r < 2) && order.last().is_some_and(|r| *r >= 2) {
            handed_over += 1;
        }
    }
    ensure!(
        handed_over > 0,
        "no VM went from the old layout to the new one"
    );
    eprintln!("{handed_over} VMs handed from --shards 2 to --shards 3 without overlap");
    Ok(())
}
