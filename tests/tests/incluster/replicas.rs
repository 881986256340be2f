//! Several replicas as Pods, one per node (three nodes on loopback addresses, each replica
//! binding its node's address): leader election across two replicas, the leader Pod deleted
//! with `kubectl delete pod` and the other taking over while VMs keep being made; then a
//! rolling `helm upgrade` to `shards=3` with three replicas under churn. Every Pod's log is
//! followed from its start (`kubectl logs -f`), and per VM the plugin calls must pass from one
//! Pod to another only after the new one began holding the VM (the leader Lease, or the VM's
//! shard) after the previous one's last call started: never two Pods at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use vmop::api::{ProviderConfig, VirtualMachine};
use vmop::leader::shards::shard_of;
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::controlplane::ControlPlane;
use vmop_tests::fixtures;
use vmop_tests::incluster::{
    DEADLINE, NAMESPACE, free_port, image, install, is_ready, node_values, operator_namespace,
    operator_pods, run, upgrade, wait_pods,
};
use vmop_tests::operator::provider_calls_in;

use crate::{
    APPS, PLUGIN_PATH, apps_namespace, provider_config, vm_ready, wait_provider, wait_vms,
};

const PLUGIN: &str = "docker.io/vmop/testcloud-plugin:replicas";
const SHARDS: u32 = 3;

/// Follows every operator Pod's log into a file of its own, from the Pod's start to its end.
struct Followers {
    dir: PathBuf,
    /// Each Pod followed, with its `--shards` count (none: leader election).
    started: Arc<Mutex<BTreeMap<String, Option<u32>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Followers {
    fn start(control_plane: &ControlPlane, client: kube::Client, dir: &Path) -> Followers {
        let kubectl = (
            control_plane.kubectl(),
            control_plane.kubeconfig().to_path_buf(),
        );
        let dir = dir.to_path_buf();
        let started = Arc::new(Mutex::new(BTreeMap::new()));
        let task = tokio::spawn({
            let (dir, started) = (dir.clone(), started.clone());
            async move {
                loop {
                    for pod in operator_pods(&client).await.unwrap_or_default() {
                        let name = pod.name_any();
                        let new = started
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(name.clone(), shards_of(&pod))
                            .is_none();
                        if new {
                            tokio::spawn(follow(
                                kubectl.clone(),
                                client.clone(),
                                name,
                                dir.clone(),
                            ));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        Followers { dir, started, task }
    }

    /// Each Pod's log so far and its shard count, by Pod name.
    fn logs(&self) -> BTreeMap<String, (String, Option<u32>)> {
        let pods = self
            .started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        pods.into_iter()
            .map(|(name, shards)| {
                let log = std::fs::read_to_string(self.dir.join(&name)).unwrap_or_default();
                (name, (log, shards))
            })
            .collect()
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `kubectl logs -f` of `pod` into `dir/<pod>`, again until the Pod is gone (it fails while
/// the container has not started; each run writes the whole log).
async fn follow(
    (kubectl, kubeconfig): (PathBuf, PathBuf),
    client: kube::Client,
    pod: String,
    dir: PathBuf,
) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, NAMESPACE);
    loop {
        let mut command = std::process::Command::new(&kubectl);
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["logs", "-f", "-n", NAMESPACE, &pod]);
        if let Ok(log) = run(command, "kubectl logs -f").await {
            let _ = std::fs::write(dir.join(&pod), log);
        }
        match pods.get_opt(&pod).await {
            Ok(Some(p)) if p.metadata.deletion_timestamp.is_none() => {}
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The `--shards` count of a Pod's operator container; none under leader election.
fn shards_of(pod: &k8s_openapi::api::core::v1::Pod) -> Option<u32> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.args.iter().flatten())
        .find_map(|a| a.strip_prefix("--shards=")?.parse().ok())
}

/// When a Pod began holding the leader Lease (`None`) or a shard.
type Hold = (Timestamp, Option<u32>);

/// A Pod's holds: when it began holding the leader Lease (`None`: every VM) or a shard.
fn holds(log: &str) -> Vec<Hold> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let at = Timestamp::from_str(v.get("timestamp")?.as_str()?).ok()?;
            let fields = v.get("fields")?;
            match fields.get("message")?.as_str()? {
                "became the leader" if fields.get("lease")?.as_str()? == "vmop" => Some((at, None)),
                "holding shard" => {
                    let shard = u32::try_from(fields.get("shard")?.as_u64()?).ok()?;
                    Some((at, Some(shard)))
                }
                _ => None,
            }
        })
        .collect()
}

/// Per VM name: when each plugin call started, and by which Pod, in time order.
fn calls(
    logs: &BTreeMap<String, (String, Option<u32>)>,
) -> BTreeMap<String, Vec<(Timestamp, String)>> {
    let mut by_vm: BTreeMap<String, Vec<(Timestamp, String)>> = BTreeMap::new();
    for (pod, (log, _)) in logs {
        for call in provider_calls_in(log) {
            if let Some(started) = call.started() {
                by_vm
                    .entry(call.vm_name().to_owned())
                    .or_default()
                    .push((started, pod.clone()));
            }
        }
    }
    for calls in by_vm.values_mut() {
        calls.sort();
    }
    by_vm
}

/// Hand-overs of a VM's calls to a Pod whose hold of the VM began before the previous Pod's
/// last call started; and how many hand-overs there were.
fn overlaps(
    logs: &BTreeMap<String, (String, Option<u32>)>,
    uids: &BTreeMap<String, String>,
) -> (Vec<String>, usize) {
    let holds: BTreeMap<&String, (Vec<Hold>, Option<u32>)> = logs
        .iter()
        .map(|(pod, (log, shards))| (pod, (holds(log), *shards)))
        .collect();
    let mut found = Vec::new();
    let mut handovers = 0;
    for (name, calls) in calls(logs) {
        let Some(uid) = uids.get(&name) else {
            continue;
        };
        for pair in calls.windows(2) {
            let [(last, before), (first, after)] = pair else {
                continue;
            };
            if before == after {
                continue;
            }
            handovers += 1;
            let Some((held, shards)) = holds.get(after) else {
                continue;
            };
            let shard = shards.map(|count| shard_of(uid, count));
            let since = held
                .iter()
                .filter(|(at, scope)| at <= first && (scope.is_none() || *scope == shard))
                .map(|(at, _)| *at)
                .max();
            if since.is_none_or(|since| since <= *last) {
                found.push(format!(
                    "{name}: {after} called at {first} under a hold from {since:?}; {before} had called at {last}"
                ));
            }
        }
    }
    (found, handovers)
}

async fn create_vms(
    vms: &Api<VirtualMachine>,
    names: impl IntoIterator<Item = String>,
) -> anyhow::Result<()> {
    for name in names {
        let vm = fixtures::vm(&name)
            .namespace(APPS)
            .provider("testcloud")
            .image(cloud::IMAGE)
            .build();
        vms.create(&PostParams::default(), &vm).await?;
    }
    Ok(())
}

/// Adds the uid of every VM there now (the overlap check needs each VM's shard).
async fn record_uids(
    vms: &Api<VirtualMachine>,
    uids: &mut BTreeMap<String, String>,
) -> anyhow::Result<()> {
    for vm in vms.list(&ListParams::default()).await?.items {
        uids.insert(vm.name_any(), vm.uid().unwrap_or_default());
    }
    Ok(())
}

/// The leader Lease's holder, as a Pod name (identities are `<pod>_<random>`).
async fn leader(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    Ok(leases
        .get_opt("vmop")
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .and_then(|h| h.split('_').next().map(str::to_owned))
        .filter(|h| !h.is_empty()))
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_on_three_nodes_fail_over_and_change_to_shards_without_overlap()
-> anyhow::Result<()> {
    let owned = ControlPlane::with_nodes(3)
        .await
        .context("three nodes must start on this machine")?;
    let control_plane = &owned;
    let client = control_plane.client().await?;
    let dir = tempfile::tempdir()?;
    image(
        control_plane,
        &[
            "operator",
            "--binary",
            env!("CARGO_BIN_EXE_vmop-operator"),
            "--name",
            "docker.io/vmop/vmop:test",
        ],
        &dir.path().join("vmop.tar"),
    )
    .await?;
    let wasm = vmop_tests::wasm::path("vmop_provider_testcloud")?
        .display()
        .to_string();
    let digest = image(
        control_plane,
        &["plugin", "--wasm", &wasm, "--name", PLUGIN],
        &dir.path().join("plugin.tar"),
    )
    .await?;

    operator_namespace(control_plane).await?;
    apps_namespace(&client).await?;
    let logs_dir = tempfile::tempdir()?;
    let followers = Followers::start(control_plane, client.clone(), logs_dir.path());
    let mut values = node_values(control_plane, free_port()?, &[("testcloud", PLUGIN)])?;
    values.push("replicas=2".to_owned());
    values.push("logLevel=info\\,vmop::provider_call=debug".to_owned());
    install(control_plane, &values).await?;
    wait_pods(&client, control_plane, "two replicas Ready", |pods| {
        pods.len() == 2 && pods.iter().all(is_ready)
    })
    .await?;

    let cloud = Cloud::start(Config::default()).await?;
    let configs: Api<ProviderConfig> = Api::all(client.clone());
    provider_config(&configs, "testcloud", PLUGIN_PATH, &digest, &cloud).await?;
    wait_provider(&configs, "testcloud", "the plugin loaded", |r| {
        r.0 == "True"
    })
    .await?;
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), APPS);
    create_vms(&vms, (0..10).map(|i| format!("vm-{i}"))).await?;
    wait_vms(&vms, "ten VMs Ready", |list| {
        list.len() == 10 && list.iter().all(vm_ready)
    })
    .await?;
    let mut uids = BTreeMap::new();
    record_uids(&vms, &mut uids).await?;

    // The leader's Pod deleted as a user would: the other takes over; VMs made meanwhile.
    let old = leader(&client)
        .await?
        .context("nobody holds the leader Lease")?;
    let mut delete = control_plane.kubectl_command();
    delete.args(["delete", "pod", "-n", NAMESPACE, &old, "--wait=false"]);
    let deleted = Instant::now();
    run(delete, "kubectl delete pod").await?;
    create_vms(&vms, (10..15).map(|i| format!("vm-{i}"))).await?;
    let failover = loop {
        if let Some(now) = leader(&client).await?
            && now != old
        {
            break deleted.elapsed();
        }
        ensure!(
            deleted.elapsed() < DEADLINE,
            "nobody took the leader Lease over from {old}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "in-cluster: leader failover after kubectl delete pod: {:.1} s",
        failover.as_secs_f64()
    );
    wait_vms(&vms, "fifteen VMs Ready after the failover", |list| {
        list.len() == 15 && list.iter().all(vm_ready)
    })
    .await?;
    record_uids(&vms, &mut uids).await?;

    // A rolling upgrade to three shards on three replicas, VMs made and deleted meanwhile.
    let mut sharded = values.clone();
    sharded.push("replicas=3".to_owned());
    sharded.push(format!("shards={SHARDS}"));
    sharded.push(format!("metrics.port={}", free_port()?));
    upgrade(control_plane, &sharded, "helm upgrade to shards").await?;
    create_vms(&vms, (15..20).map(|i| format!("vm-{i}"))).await?;
    for i in 0..3 {
        vms.delete(&format!("vm-{i}"), &DeleteParams::default())
            .await?;
    }
    let shard_pods = |pods: &[k8s_openapi::api::core::v1::Pod]| {
        pods.len() == 3
            && pods
                .iter()
                .all(|p| is_ready(p) && shards_of(p) == Some(SHARDS))
    };
    let rolled = wait_pods(
        &client,
        control_plane,
        "three sharded replicas Ready",
        shard_pods,
    )
    .await?;
    eprintln!(
        "in-cluster: rolling upgrade to {SHARDS} shards done in {:.1} s",
        rolled.as_secs_f64()
    );
    wait_vms(&vms, "seventeen VMs Ready under shards", |list| {
        list.len() == 17 && list.iter().all(vm_ready)
    })
    .await?;
    record_uids(&vms, &mut uids).await?;

    // And from three shards to four, again under churn.
    let mut four = sharded.clone();
    four.push("shards=4".to_owned());
    four.push(format!("metrics.port={}", free_port()?));
    upgrade(control_plane, &four, "helm upgrade to four shards").await?;
    create_vms(&vms, (20..23).map(|i| format!("vm-{i}"))).await?;
    for i in 3..5 {
        vms.delete(&format!("vm-{i}"), &DeleteParams::default())
            .await?;
    }
    let rolled = wait_pods(
        &client,
        control_plane,
        "three replicas with four shards Ready",
        |pods| pods.len() == 3 && pods.iter().all(|p| is_ready(p) && shards_of(p) == Some(4)),
    )
    .await?;
    eprintln!(
        "in-cluster: rolling upgrade from 3 to 4 shards done in {:.1} s",
        rolled.as_secs_f64()
    );
    wait_vms(&vms, "eighteen VMs Ready under four shards", |list| {
        list.len() == 18 && list.iter().all(vm_ready)
    })
    .await?;
    record_uids(&vms, &mut uids).await?;

    vms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_vms(&vms, "all VMs gone", |list| list.is_empty()).await?;
    ensure!(cloud.live().is_empty(), "machines left: {:?}", cloud.live());
    ensure!(
        cloud.stats().created == 23,
        "{} machines made for 23 VMs",
        cloud.stats().created
    );

    let logs = followers.logs();
    let (found, handovers) = overlaps(&logs, &uids);
    eprintln!(
        "in-cluster: {} Pods' logs, {handovers} hand-overs of VMs between Pods",
        logs.len()
    );
    ensure!(found.is_empty(), "overlapping calls:\n{}", found.join("\n"));
    ensure!(handovers > 0, "no VM changed Pods: nothing was checked");
    drop(followers);
    drop(owned);
    Ok(())
}
