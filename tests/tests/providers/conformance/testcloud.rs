//! The `testcloud` provider (`providers/testcloud`, written only on the SDK) and its Python
//! twin against the loopback testcloud (`vmop_tests::cloud`): the whole conformance kit, then
//! what the kit does not call (power, update, a throttled cloud).

use std::time::Duration;

use anyhow::{Context as _, ensure};
use vmop::conformance::Options;
use vmop::plugin::{CallError, Phase, ProviderError, UpdateOutcome, VmSpec};
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::fixtures::vm_spec;

const GUEST: &str = "vmop_provider_testcloud";
const TOKEN: &str = "t0ken";

fn options_for(cloud: &Cloud) -> anyhow::Result<Options> {
    super::options(
        cloud.endpoint(),
        &[("endpoint", cloud.endpoint())],
        &[("token", TOKEN)],
        cloud::IMAGE,
    )
}

async fn passes_every_check(guest: &str) -> anyhow::Result<()> {
    let cloud = Cloud::start(Config::default().with_token(TOKEN)).await?;
    let report = super::run(guest, &options_for(&cloud)?).await?;
    super::passed_every_check(&report)?;
    let stats = cloud.stats();
    ensure!(
        cloud.live().is_empty() && stats.created == 1 && stats.unauthorized > 0,
        "{guest}: one machine made and deleted, the falsified token refused: {stats:?}"
    );
    Ok(())
}

#[tokio::test]
async fn testcloud_provider_passes_every_check() -> anyhow::Result<()> {
    passes_every_check(GUEST).await
}

/// The same provider in Python (`providers/testcloud/python/app.py`), the guide's example.
#[tokio::test]
async fn python_testcloud_provider_passes_every_check() -> anyhow::Result<()> {
    passes_every_check("vmop_provider_testcloud_py").await
}

fn spec(cpu: u32) -> VmSpec {
    vm_spec("3b0c3a52-0000-4000-8000-000000000001")
        .named("team-a", "web")
        .image(cloud::IMAGE)
        .cpu(cpu)
        .memory_mib(1024)
        .user_data("#cloud-config\n")
        .label("app", "web")
        .parameter("tags", "team=a")
        .build()
}

/// Power and update through the sandbox: stop/start are idempotent, a resize of a running
/// machine asks for a restart, of a stopped one is applied; the machine carries vmop's tags.
#[tokio::test]
async fn power_and_update_follow_the_contract() -> anyhow::Result<()> {
    let cloud = Cloud::start(Config::default().with_token(TOKEN)).await?;
    let ctx = options_for(&cloud)?.ctx;
    let (_dir, plugin) = crate::support::load(GUEST).await?;
    let made = plugin.create(&ctx, &spec(1)).await?;
    let machine = cloud.machines().into_iter().next().context("no machine")?;
    let tag = |k: &str| machine.tags.get(k).map(String::as_str);
    ensure!(
        tag("vmop.dev/uid") == Some(spec(1).uid.as_str())
            && tag("team") == Some("a")
            && tag("app") == Some("web")
            && machine.user_data.as_deref() == Some("#cloud-config\n"),
        "{machine:?}"
    );
    ensure!(
        plugin.update(&ctx, &made.id, &spec(4)).await? == UpdateOutcome::NeedsRestart,
        "a running machine cannot be resized"
    );
    ensure!(
        plugin.update(&ctx, &made.id, &spec(1)).await? == UpdateOutcome::Applied,
        "its own size is a no-op"
    );
    for _ in 0..2 {
        plugin.stop(&ctx, &made.id).await?;
    }
    let stopped = plugin.get(&ctx, &made.id).await?.context("gone")?;
    ensure!(stopped.phase == Phase::Stopped, "{stopped:?}");
    ensure!(plugin.update(&ctx, &made.id, &spec(4)).await? == UpdateOutcome::Applied);
    plugin.start(&ctx, &made.id).await?;
    let started = plugin.get(&ctx, &made.id).await?.context("gone")?;
    ensure!(started.phase == Phase::Running, "{started:?}");
    ensure!(cloud.machines().first().map(|m| m.cpu) == Some(4));
    plugin.delete(&ctx, &made.id).await?;
    let missing = plugin.start(&ctx, &made.id).await;
    ensure!(
        matches!(
            missing,
            Err(CallError::Provider(ProviderError::InvalidSpec(_)))
        ),
        "{missing:?}"
    );
    Ok(())
}

/// A cloud over its request rate answers 429 with Retry-After: the provider says
/// `rate-limited` with that delay.
#[tokio::test]
async fn a_throttled_cloud_is_rate_limited_with_its_delay() -> anyhow::Result<()> {
    let cloud = Cloud::start(Config::default().with_rate_limit(0.5, 1)).await?;
    let ctx = super::options(
        cloud.endpoint(),
        &[("endpoint", cloud.endpoint())],
        &[],
        cloud::IMAGE,
    )?
    .ctx;
    let (_dir, plugin) = crate::support::load(GUEST).await?;
    ensure!(plugin.get(&ctx, "tc-1").await?.is_none());
    match plugin.get(&ctx, "tc-1").await {
        Err(CallError::Provider(ProviderError::RateLimited { retry_after, .. })) => {
            ensure!(
                (Duration::from_secs(1)..=Duration::from_secs(2)).contains(&retry_after),
                "{retry_after:?}"
            );
        }
        other => anyhow::bail!("expected rate-limited, got {other:?}"),
    }
    ensure!(cloud.stats().throttled == 1, "{:?}", cloud.stats());
    Ok(())
}
