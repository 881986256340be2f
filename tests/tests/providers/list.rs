//! `list` (contract 0.3) of the providers that declare it, through the sandbox against their
//! live loopback backends: the Rust and Python ec2 providers on moto, the Rust and Python
//! testcloud providers on the testcloud.
//!
//! Seven machines of this cluster page as five and two (`listPageSize=5`), each listed once and
//! exactly as `get` answers it, with the cluster mark and the creation time the cloud keeps;
//! another cluster's machine, an unmarked one and a deleted one are never listed; a machine
//! created between two pages is listed at most once; a call that names no cluster lists
//! nothing. The testcloud provider built for contract 0.2 declares no `list` and marks no
//! cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail, ensure};
use vmop::plugin::{
    CallContext, CallError, CallLimits, EgressPolicy, ListedMachine, Plugin, ProviderError,
    ProviderSettings, VmSpec,
};
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::fixtures::vm_spec;
use vmop_tests::moto::Moto;

use crate::support::load;

const CLUSTER: &str = "cluster-a";
const OTHER_CLUSTER: &str = "cluster-b";
const CLUSTER_TAG: &str = "vmop.dev/cluster";
/// An AMI moto serves by default.
const AMI: &str = "ami-12c6146b";
/// Pages of this many: seven machines are two pages.
const PAGE_SIZE: &str = "5";
/// A host never follows more pages than this here: the listings are a few machines long.
const MAX_PAGES: usize = 10;

/// The call context of a ProviderConfig at `endpoint` (and only it allowed) in `cluster`, its
/// Secret handed to the plugin.
fn context(
    endpoint: &str,
    settings: &[(&str, &str)],
    secrets: &[(&str, &str)],
    cluster: &str,
) -> anyhow::Result<CallContext> {
    let pairs = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    Ok(CallContext {
        settings: ProviderSettings {
            settings: pairs(settings),
            secrets: pairs(secrets),
            cluster: cluster.to_owned(),
        },
        egress: EgressPolicy::parse([endpoint.to_owned()])?,
        limits: CallLimits::default(),
        label: "list-test".to_owned(),
    })
}

fn spec(n: u32, image: &str) -> VmSpec {
    vm_spec(&format!("5a1e0000-0000-4000-8000-{n:012}"))
        .named("team-a", &format!("vm-{n}"))
        .image(image)
        .cpu(1)
        .memory_mib(1024)
        .build()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Checks a listed machine's creation time, given the run's window (ms since the epoch).
type CreatedAt<'a> = &'a dyn Fn(&ListedMachine, (u64, u64)) -> anyhow::Result<()>;

/// One backend's calls for [`pages_through_the_cluster`]: `settings` and `secrets` of the
/// ProviderConfig (the page size is added), and how to check a listed machine's creation time.
struct Backend<'a> {
    endpoint: String,
    settings: Vec<(&'a str, String)>,
    secrets: &'a [(&'a str, &'a str)],
    image: &'a str,
    created_at: CreatedAt<'a>,
}

impl Backend<'_> {
    fn context(&self, cluster: &str, page_size: Option<&str>) -> anyhow::Result<CallContext> {
        let mut settings: Vec<(&str, &str)> = self
            .settings
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        settings.extend(page_size.map(|size| ("listPageSize", size)));
        context(&self.endpoint, &settings, self.secrets, cluster)
    }
}

/// The machines of each page of `ctx`'s listing from `cursor` on, up to the page without a
/// `next`.
async fn pages(
    plugin: &Plugin,
    ctx: &CallContext,
    mut cursor: Option<String>,
) -> anyhow::Result<Vec<Vec<ListedMachine>>> {
    let mut pages = Vec::new();
    loop {
        let page = plugin.list(ctx, cursor.as_deref()).await?;
        pages.push(page.machines);
        match page.next {
            None => return Ok(pages),
            Some(next) => cursor = Some(next),
        }
        ensure!(pages.len() < MAX_PAGES, "no end after {MAX_PAGES} pages");
    }
}

fn ids(machines: &[ListedMachine]) -> Vec<&str> {
    machines.iter().map(|m| m.status.id.as_str()).collect()
}

/// The scenario of the module docs against one provider and backend; deletes what it made.
async fn pages_through_the_cluster(guest: &str, backend: &Backend<'_>) -> anyhow::Result<()> {
    let (_dir, plugin) = load(guest).await?;
    ensure!(plugin.info().has("list"), "{guest}: {:?}", plugin.info());
    let ours = backend.context(CLUSTER, Some(PAGE_SIZE))?;
    let theirs = backend.context(OTHER_CLUSTER, None)?;
    let nobodys = backend.context("", None)?;
    let started = now_ms();

    let mut made = Vec::new();
    for n in 0..8 {
        made.push(plugin.create(&ours, &spec(n, backend.image)).await?.id);
    }
    let foreign = plugin.create(&theirs, &spec(100, backend.image)).await?.id;
    let unmarked = plugin.create(&nobodys, &spec(200, backend.image)).await?.id;
    let deleted = made.pop().context("made nothing")?;
    plugin.delete(&ours, &deleted).await?;

    let first = plugin.list(&ours, None).await?;
    let between = plugin.create(&ours, &spec(300, backend.image)).await?.id;
    let next = first
        .next
        .clone()
        .context("a first page of 5 of 7 has a next")?;
    let rest = pages(&plugin, &ours, Some(next)).await?;
    let ended = now_ms();

    ensure!(
        first.machines.len() == 5,
        "{guest}: first page {:?}",
        ids(&first.machines)
    );
    let listed: Vec<&ListedMachine> = first.machines.iter().chain(rest.iter().flatten()).collect();
    let mut seen = BTreeSet::new();
    for machine in &listed {
        let id = machine.status.id.as_str();
        ensure!(seen.insert(id), "{guest}: {id} listed twice");
        ensure!(
            made.iter().any(|m| m == id) || id == between,
            "{guest}: listed {id}, which is not this cluster's live machine (foreign {foreign}, \
             unmarked {unmarked}, deleted {deleted})"
        );
        let got = plugin.get(&ours, id).await?;
        ensure!(
            got.as_ref() == Some(&machine.status),
            "{guest}: listed {:?}, get answers {got:?}",
            machine.status
        );
        ensure!(
            machine.cluster.as_deref() == Some(CLUSTER),
            "{guest}: {machine:?}"
        );
        (backend.created_at)(machine, (started, ended)).with_context(|| guest.to_owned())?;
    }
    let missing: Vec<&String> = made.iter().filter(|m| !seen.contains(m.as_str())).collect();
    ensure!(missing.is_empty(), "{guest}: never listed {missing:?}");

    let their_pages = pages(&plugin, &theirs, None).await?;
    let their_ids: Vec<&str> = their_pages.iter().flat_map(|p| ids(p)).collect();
    ensure!(
        their_ids == [foreign.as_str()],
        "{guest}: the other cluster lists {their_ids:?}"
    );
    match plugin.list(&nobodys, None).await {
        Err(CallError::Provider(ProviderError::Permanent(m))) if m.contains("cluster") => {}
        other => bail!("{guest}: a call without a cluster listed {other:?}"),
    }

    for id in made.iter().chain([&between, &foreign, &unmarked]) {
        plugin.delete(&ours, id).await?;
    }
    Ok(())
}

/// Moto keeps `launchTime` to the second.
fn launched_in(machine: &ListedMachine, (started, ended): (u64, u64)) -> anyhow::Result<()> {
    let at = machine.created_at_ms.context("no created-at-ms")?;
    ensure!(
        (started.saturating_sub(1000)..=ended + 1000).contains(&at),
        "{} created at {at}, not within {started}..={ended}",
        machine.status.id
    );
    Ok(())
}

async fn ec2_lists(guest: &str) -> anyhow::Result<()> {
    let moto = Moto::start()?;
    let backend = Backend {
        endpoint: moto.endpoint(),
        settings: vec![
            ("region", "us-east-1".to_owned()),
            ("endpoint", moto.endpoint()),
        ],
        // Moto without authentication takes any key; the plugin signs with it.
        secrets: &[
            ("access_key_id", "AKIAIOSFODNN7EXAMPLE"),
            (
                "secret_access_key",
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            ),
        ],
        image: AMI,
        created_at: &launched_in,
    };
    pages_through_the_cluster(guest, &backend).await?;
    let tagged = moto.instance_ids_with_tag(CLUSTER_TAG, CLUSTER)?;
    ensure!(
        tagged.len() == 9,
        "{guest}: every create of this cluster tagged it: {tagged:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_ec2_provider_lists_its_clusters_instances() -> anyhow::Result<()> {
    ec2_lists("vmop_provider_ec2").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_ec2_provider_lists_its_clusters_instances() -> anyhow::Result<()> {
    ec2_lists("vmop_provider_ec2_py").await
}

/// The listing carries the creation time the testcloud keeps for the machine (its API's
/// `createdAtMs`, `None` while it keeps none).
fn as_the_testcloud_says(cloud: &Cloud, listed: &ListedMachine) -> anyhow::Result<()> {
    let own = cloud
        .machines()
        .into_iter()
        .find(|m| m.id == listed.status.id)
        .context("listed a machine the testcloud does not have")?;
    let said = serde_json::to_value(own)?
        .get("createdAtMs")
        .and_then(serde_json::Value::as_u64);
    ensure!(
        listed.created_at_ms == said,
        "{} listed created at {:?}, the testcloud says {said:?}",
        listed.status.id,
        listed.created_at_ms
    );
    Ok(())
}

async fn testcloud_lists(guest: &str) -> anyhow::Result<()> {
    let cloud = Cloud::start(Config::default()).await?;
    let check = |listed: &ListedMachine, _| as_the_testcloud_says(&cloud, listed);
    let backend = Backend {
        endpoint: cloud.endpoint().to_owned(),
        settings: vec![("endpoint", cloud.endpoint().to_owned())],
        secrets: &[],
        image: cloud::IMAGE,
        created_at: &check,
    };
    pages_through_the_cluster(guest, &backend).await?;
    ensure!(
        cloud.live().is_empty() && cloud.stats().created == 11,
        "{guest}: made 11 machines and deleted them all: {:?}, left {:?}",
        cloud.stats(),
        cloud.live()
    );
    Ok(())
}

#[tokio::test]
async fn rust_testcloud_provider_lists_its_clusters_machines() -> anyhow::Result<()> {
    testcloud_lists("vmop_provider_testcloud").await
}

#[tokio::test]
async fn python_testcloud_provider_lists_its_clusters_machines() -> anyhow::Result<()> {
    testcloud_lists("vmop_provider_testcloud_py").await
}

/// The testcloud provider's source built for contract 0.2 (`testcloud-v02`): a 0.2 plugin the
/// host still loads, which declares no `list` and, having no cluster to read, marks none; the
/// rest of its contract works as the 0.3 build's.
#[tokio::test]
async fn the_0_2_testcloud_provider_marks_no_cluster() -> anyhow::Result<()> {
    let cloud = Cloud::start(Config::default()).await?;
    let (_dir, plugin) = load("vmop_fixture_testcloud_v02").await?;
    let info = plugin.info();
    ensure!(
        info.wit_version == "0.2.0" && !info.has("list") && info.has("power"),
        "{info:?}"
    );
    let ctx = context(
        cloud.endpoint(),
        &[("endpoint", cloud.endpoint())],
        &[],
        CLUSTER,
    )?;
    let made = plugin.create(&ctx, &spec(1, cloud::IMAGE)).await?;
    let machine = cloud.machines().into_iter().next().context("no machine")?;
    ensure!(
        machine.tags.get("vmop.dev/uid").map(String::as_str) == Some(spec(1, "").uid.as_str())
            && !machine.tags.contains_key(CLUSTER_TAG),
        "{machine:?}"
    );
    ensure!(plugin.get(&ctx, &made.id).await? == Some(made.clone()));
    plugin.delete(&ctx, &made.id).await?;
    ensure!(plugin.get(&ctx, &made.id).await?.is_none());
    Ok(())
}
