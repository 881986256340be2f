//! Two replicas with `--leader-elect`: only the Lease holder reconciles; when it dies, the
//! other takes over without duplicating anything.

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use vmop_tests::operator::Env;

use crate::operator_bin;

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over() -> anyhow::Result<()> {
    let env = Env::new("leader").await?;
    let provider = env.standard_provider("aws").await?;
    let args =
        env.operator()
            .args_from(["--leader-elect", "--leader-election-id", "vmop-leader-test"]);
    let mut first = args.start(operator_bin())?;
    let mut second = args.start(operator_bin())?;

    let one = env.create_vm(env.vm("one", &provider)).await?;
    env.wait_ready("one").await?;
    let (leader, standby) = match (
        first.calls_for("one").is_empty(),
        second.calls_for("one").is_empty(),
    ) {
        (false, true) => (&mut first, &mut second),
        (true, false) => (&mut second, &mut first),
        (a, b) => anyhow::bail!(
            "expected exactly one replica to reconcile (first idle: {a}, second idle: {b})"
        ),
    };
    ensure!(
        standby.provider_calls().is_empty(),
        "the standby called the plugin: {:?}",
        standby.provider_calls()
    );

    // The leader dies without releasing the Lease; the standby waits for it to expire.
    leader.kill().await?;
    env.create_vm(env.vm("two", &provider)).await?;
    env.wait_ready("two").await?;
    ensure!(
        !standby.calls_for("two").is_empty(),
        "the standby never reconciled"
    );
    let uid = one.uid().context("no uid")?;
    ensure!(
        env.live_instances(&uid)?.len() == 1,
        "VM one has instances {:?} after the take-over",
        env.live_instances(&uid)?
    );
    Ok(())
}
