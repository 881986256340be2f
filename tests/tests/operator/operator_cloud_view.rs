//! The cloud view on the real parts: the ec2 plugin (contract 0.3, capability `list`) on moto.
//!
//! - Drift checks of a settled VM read its machine from the ProviderConfig's listing: once two
//!   listings have begun after the VM became Ready, no `get` is made for it while listings
//!   succeed, and the listing is one call per page for every VM.
//! - Orphans: a machine made directly with this cluster's marks and the uid of no VM is
//!   reported (`status.orphans`, Event `OrphansFound`) and, under `orphanPolicy: Delete`,
//!   deleted once it is older than the creation grace period; one made moments ago is left
//!   alone while it is inside the grace period; one with another cluster's mark is never
//!   counted nor touched; the VM's own machine is untouched. `vmop plan` lists the orphan.
//! - While listings succeed, a settled VM whose drift check the listing answered is checked
//!   again only ten poll intervals later (the listing reports its machine's changes); the first
//!   listing that fails reconciles it at once, and it calls `get` again once the last listing
//!   is too old to answer, so a machine stopped behind the operator's back meanwhile is seen
//!   and started before the listing fails a second time, not ten poll intervals later.
//! - A plugin built against contract 0.2 (`testcloud-v02`) still runs a VM's whole life, with
//!   no `list` asked of it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kube::api::ListParams;
use vmop::api::{OrphanPolicy, ProviderConfig};
use vmop_tests::cloud::{self, Cloud, Config, Power};
use vmop_tests::operator::{Env, Operator, UID_TAG, wait_for};

use crate::operator_bin;
use crate::operator_sharding::provider_with;

const CLUSTER: &str = "cluster-under-test";
const CLUSTER_TAG: &str = "vmop.dev/cluster";
const GRACE_SECONDS: u32 = 20;
const PERIOD: &str = "2s";
const DEADLINE: Duration = Duration::from_secs(120);

/// Launches an instance on moto directly, marked as vmop's for `uid` in `cluster`.
fn launch(env: &Env, uid: &str, cluster: &str) -> anyhow::Result<String> {
    let body = env.moto.ec2(
        "RunInstances",
        &[
            ("ImageId", vmop_tests::operator::IMAGE),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("InstanceType", "t3.micro"),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", UID_TAG),
            ("TagSpecification.1.Tag.1.Value", uid),
            ("TagSpecification.1.Tag.2.Key", CLUSTER_TAG),
            ("TagSpecification.1.Tag.2.Value", cluster),
        ],
    )?;
    let id = body
        .split("<instanceId>")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .context("RunInstances answered no instance id")?;
    Ok(id.to_owned())
}

fn live(env: &Env, id: &str) -> anyhow::Result<bool> {
    Ok(matches!(
        env.moto.instance_state(id)?.as_deref(),
        Some("pending" | "running" | "stopping" | "stopped")
    ))
}

fn lists(operator: &Operator, pc: &str) -> usize {
    let vm = format!("providerconfig/{pc}");
    operator
        .provider_calls()
        .iter()
        .filter(|c| c.op == "list" && c.vm == vm && c.outcome == "ok")
        .count()
}

fn failed_lists(operator: &Operator, pc: &str) -> usize {
    let vm = format!("providerconfig/{pc}");
    operator
        .provider_calls()
        .iter()
        .filter(|c| c.op == "list" && c.vm == vm && c.outcome != "ok")
        .count()
}

/// Reconciles of the VM controller: every one of a test's single VM.
async fn vm_reconciles(operator: &Operator) -> anyhow::Result<f64> {
    Ok(operator.metrics().await?.sum(
        "controller_runtime_reconcile_total",
        &[("controller", "virtualmachine")],
    ))
}

fn gets_for(operator: &Operator, vm: &str) -> usize {
    operator
        .calls_for(vm)
        .iter()
        .filter(|c| c.op == "get")
        .count()
}

/// Waits until `done` holds, polling every 200 ms, for at most [`DEADLINE`].
async fn until(what: &str, mut done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let started = Instant::now();
    while !done()? {
        ensure!(
            started.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn orphans(env: &Env, pc: &str) -> anyhow::Result<Option<u32>> {
    let pc: ProviderConfig = env.provider_configs().get(pc).await?;
    Ok(pc.status.and_then(|s| s.orphans))
}

async fn wait_orphans(env: &Env, pc: &str, n: u32) -> anyhow::Result<()> {
    wait_for(env.provider_configs(), pc, &format!("{n} orphans"), |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.orphans == Some(n))
    })
    .await?;
    Ok(())
}

async fn has_event(env: &Env, pc: &str, reason: &str) -> anyhow::Result<bool> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), "default");
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pc)
        }))
}

/// `vmop plan -o json` over the whole cluster (orphans are judged against every VM).
async fn plan_rows(env: &Env) -> anyhow::Result<Vec<serde_json::Value>> {
    let args = env.operator();
    let output = tokio::process::Command::new(operator_bin())
        .args(["plan", "-o", "json", "--cluster-id", CLUSTER])
        .arg("--plugin-dir")
        .arg(&args.plugin_dir)
        .args(["--operator-namespace", &args.namespace])
        .env("KUBECONFIG", &args.kubeconfig)
        .output()
        .await?;
    serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "plan printed no JSON: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_checks_read_the_listing_and_orphans_are_reported_and_deleted_by_policy()
-> anyhow::Result<()> {
    let env = Env::new("cloud-view").await?;
    let pc = env.standard_provider("view").await?;
    let mut config: ProviderConfig = env.provider_configs().get(&pc).await?;
    config.spec.orphan_policy = OrphanPolicy::Delete;
    config.spec.limits.creation_grace_period_seconds = GRACE_SECONDS;
    env.apply_provider_config(&config).await?;

    let old_orphan = launch(&env, "0f0f0f0f-0000-4000-8000-00000000dead", CLUSTER)?;
    let other_cluster = launch(
        &env,
        "0f0f0f0f-0000-4000-8000-00000000beef",
        "another-cluster",
    )?;
    let made = Instant::now();

    let operator = env
        .operator()
        .args_from(["--cluster-id", CLUSTER, "--resync-period", PERIOD])
        .start(operator_bin())?;
    env.create_vm(env.vm("web", &pc)).await?;
    let vm = env.wait_ready("web").await?;
    let own = vm.status.and_then(|s| s.id).context("no id recorded")?;

    // Reported first; the machine of another cluster is not counted.
    wait_orphans(&env, &pc, 1).await?;
    ensure!(
        has_event(&env, &pc, "OrphansFound").await?,
        "no OrphansFound Event"
    );

    // Drift checks from the listing: after two listings begun since Ready, three more
    // listings pass without a `get` for the VM.
    let ready_lists = lists(&operator, &pc);
    until("two listings after Ready", || {
        Ok(lists(&operator, &pc) >= ready_lists + 2)
    })
    .await?;
    let gets = gets_for(&operator, "web");
    let from = lists(&operator, &pc);
    until("three more listings", || {
        Ok(lists(&operator, &pc) >= from + 3)
    })
    .await?;
    ensure!(
        gets_for(&operator, "web") == gets,
        "drift checks called get ({} -> {}) while the listing could answer",
        gets,
        gets_for(&operator, "web")
    );

    // Deleted by the policy once older than the grace period.
    until("the old orphan deleted", || Ok(!live(&env, &old_orphan)?)).await?;
    // EC2's launchTime has whole seconds: a machine may read up to one second older.
    let grace = Duration::from_secs(u64::from(GRACE_SECONDS - 1));
    ensure!(
        made.elapsed() >= grace,
        "an orphan was deleted inside the creation grace period ({:?})",
        made.elapsed()
    );
    ensure!(
        has_event(&env, &pc, "OrphanDeleted").await?,
        "no OrphanDeleted Event"
    );

    // A young orphan is reported and left alone for two listings.
    let young = launch(&env, "0f0f0f0f-0000-4000-8000-0000000000aa", CLUSTER)?;
    let young_made = Instant::now();
    wait_orphans(&env, &pc, 1).await?;
    let from = lists(&operator, &pc);
    until("two listings with the young orphan", || {
        Ok(lists(&operator, &pc) >= from + 2)
    })
    .await?;
    ensure!(
        young_made.elapsed() < Duration::from_secs(u64::from(GRACE_SECONDS)),
        "the machine was too slow to show the grace period ({:?})",
        young_made.elapsed()
    );
    ensure!(
        live(&env, &young)?,
        "an orphan inside the grace period was deleted"
    );

    // `vmop plan` lists the orphan it would leave (inside the grace period), not the machine
    // of another cluster.
    let rows = plan_rows(&env).await?;
    let row = |id: &str| {
        rows.iter()
            .find(|r| r["name"] == id && r["provider"] == pc.as_str())
    };
    ensure!(
        row(&young).is_some_and(|r| r["action"] == "orphaned"),
        "plan: {:?}",
        row(&young)
    );
    ensure!(
        row(&other_cluster).is_none(),
        "plan lists another cluster's machine"
    );
    ensure!(
        row(&own).is_none(),
        "plan lists the VM's own machine as an orphan"
    );

    ensure!(
        live(&env, &other_cluster)?,
        "another cluster's machine was deleted"
    );
    ensure!(live(&env, &own)?, "the VM's own machine was deleted");
    ensure!(
        orphans(&env, &pc).await? == Some(1),
        "other cluster's machine counted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_contract_0_2_plugin_runs_a_vms_whole_life() -> anyhow::Result<()> {
    let env = Env::new("contract-02").await?;
    let cloud = Cloud::start(Config::default()).await?;
    let pc = provider_with(&env, &cloud, 100).await?;
    // The same ProviderConfig, with the testcloud plugin built against contract 0.2.
    std::fs::copy(
        vmop_tests::wasm::path("vmop_fixture_testcloud_v02")?,
        env.plugin_dir.path().join("testcloud.wasm"),
    )
    .context("failed to copy the 0.2 plugin")?;
    let operator = env
        .operator()
        .args_from(["--resync-period", PERIOD])
        .start(operator_bin())?;
    let loaded = wait_for(env.provider_configs(), &pc, "loaded", |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.plugin.as_ref())
            .is_some_and(|p| p.wit_version.starts_with("0.2."))
    })
    .await?;
    ensure!(
        loaded
            .and_then(|p| p.status)
            .is_some_and(|s| s.orphans.is_none()),
        "a 0.2 plugin cannot list: no orphan count"
    );
    env.create_vm(env.vm("old", &pc).image(cloud::IMAGE))
        .await?;
    env.wait_ready("old").await?;
    ensure!(
        cloud.machines().len() == 1,
        "{} machines",
        cloud.machines().len()
    );
    env.vms().delete("old", &Default::default()).await?;
    env.wait_gone("old").await?;
    ensure!(cloud.machines().is_empty(), "a machine was left");
    ensure!(
        operator.provider_calls().iter().all(|c| c.op != "list"),
        "list was asked of a 0.2 plugin"
    );
    ensure!(
        operator.calls_for("old").iter().any(|c| c.op == "get"),
        "a 0.2 plugin's VM is observed with get"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn checks_are_spaced_while_listings_succeed_and_resume_when_they_fail() -> anyhow::Result<()>
{
    let env = Env::new("view-steady").await?;
    let cloud = Cloud::start(Config::default()).await?;
    let pc = provider_with(&env, &cloud, 100).await?;
    // A failed listing is retried after the poll interval: long enough that a VM checking
    // for itself at once is seen to do so before the second failure.
    let operator = env
        .operator()
        .args_from(["--resync-period", PERIOD, "--poll-interval", "10s"])
        .start(operator_bin())?;
    env.create_vm(env.vm("steady", &pc).image(cloud::IMAGE))
        .await?;
    let vm = env.wait_ready("steady").await?;
    let id = vm.status.and_then(|s| s.id).context("no id recorded")?;
    let ready_lists = lists(&operator, &pc);
    until("two listings after Ready", || {
        Ok(lists(&operator, &pc) >= ready_lists + 2)
    })
    .await?;

    // Ten listings (ten poll intervals): at most the checks that were already due, not one a
    // period.
    let (from, reconciles) = (lists(&operator, &pc), vm_reconciles(&operator).await?);
    until("ten more listings", || {
        Ok(lists(&operator, &pc) >= from + 10)
    })
    .await?;
    let spaced = vm_reconciles(&operator).await? - reconciles;
    ensure!(
        spaced <= 3.0,
        "{spaced} reconciles of a settled VM over ten successful listings"
    );

    // Right after one of its checks, so that its own next one is ten periods away: listings
    // fail and the machine is stopped behind the operator's back.
    let checked = vm_reconciles(&operator).await?;
    let deadline = Instant::now() + DEADLINE;
    while vm_reconciles(&operator).await? <= checked {
        ensure!(
            Instant::now() < deadline,
            "no drift check within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cloud.refuse_listings(true);
    let (failed, gets) = (failed_lists(&operator, &pc), gets_for(&operator, "steady"));
    ensure!(cloud.power(&id, Power::Stopped), "no machine {id}");
    until("the VM to get its machine again", || {
        Ok(gets_for(&operator, "steady") > gets)
    })
    .await?;
    let failures = failed_lists(&operator, &pc) - failed;
    ensure!(
        failures <= 1,
        "the VM called get only after {failures} failed listings"
    );
    until("the machine started again", || {
        Ok(cloud
            .machines()
            .iter()
            .any(|m| m.id == id && m.state == Power::Running))
    })
    .await?;
    Ok(())
}
