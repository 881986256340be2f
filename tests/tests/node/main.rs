//! The test control plane's node (`ControlPlane::with_node`): it starts and gets Ready, runs a
//! hostNetwork Pod under the restricted Pod Security profile's settings (with an image volume)
//! and a Deployment's Pod, runs an image imported at run time that reaches the apiserver with
//! in-cluster configuration, serves Pods' logs through the apiserver, deletes them, and leaves
//! nothing behind when dropped (no cgroup, mount, shim or directory).
//!
//! And three nodes (`ControlPlane::with_nodes`), `127.0.0.1` to `127.0.0.3` on this one host:
//! a Deployment's three replicas that declare the same hostPort land one on each, each with
//! its node's address as its Pod IP; a fourth such Pod finds no node.
//!
//! Each test starts and stops its own control plane (the last checks need it dropped); the two
//! run at once, so those checks look at their own control plane's nodes only.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Event, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use vmop_tests::controlplane::{ControlPlane, NODE_NAME, Node, create_namespace, node_address};

/// Generous: the machine may be busy compiling; a test that passes never waits this long.
const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_node_runs_restricted_host_network_pods_and_leaves_nothing_behind() -> anyhow::Result<()>
{
    let started = Instant::now();
    let control_plane = ControlPlane::with_node()
        .await
        .context("the node must start on this machine")?;
    eprintln!(
        "node test: control plane with a Ready node in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let node = control_plane.node().context("no node")?;
    let client = control_plane.client().await?;
    let namespace = create_namespace(&client, "node").await?;
    wait_for_default_service_account(&client, &namespace).await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    // With an image volume too (containerd >= 2.1): the pause image again, at /image.
    let spec = pod_spec(
        node.pause_image(),
        json!({ "volumes": [{
            "name": "image",
            "image": { "reference": node.pause_image(), "pullPolicy": "Never" },
        }]}),
        json!({ "volumeMounts": [{ "name": "image", "mountPath": "/image" }] }),
    );
    let pod: Pod =
        serde_json::from_value(json!({ "metadata": { "name": "pause" }, "spec": spec }))?;
    let pod_started = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    let running = await_condition(pods.clone(), "pause", is_running_and_ready);
    if tokio::time::timeout(DEADLINE, running).await.is_err() {
        bail!(
            "the Pod did not run within {DEADLINE:?}: {}",
            explain(&client, &namespace, "pause", node).await
        );
    }
    eprintln!(
        "node test: Pod Running and Ready in {:.1} s",
        pod_started.elapsed().as_secs_f64()
    );
    let running = pods.get("pause").await?;
    let status = running.status.context("no status")?;
    ensure!(
        status.host_ip.as_deref() == Some("127.0.0.1")
            && status.pod_ip.as_deref() == Some("127.0.0.1"),
        "a hostNetwork Pod of the node is on loopback: host {:?}, pod {:?}",
        status.host_ip,
        status.pod_ip
    );
    ensure!(
        running.spec.and_then(|s| s.node_name).as_deref() == Some(NODE_NAME),
        "scheduled elsewhere"
    );
    // Logs go apiserver -> kubelet, on loopback; pause writes none.
    let logs = pods.logs("pause", &Default::default()).await?;
    ensure!(logs.is_empty(), "pause wrote {logs:?}");

    delete_and_wait(&pods, "pause").await?;
    run_a_deployment(&client, &namespace, node).await?;
    a_pod_reaches_the_apiserver_in_cluster(&control_plane, &client, &namespace).await?;

    stop_and_assert_nothing_left(control_plane)
}

/// The port every replica declares as containerPort and hostPort (hostNetwork: a port of the
/// node, as the operator's metrics port is).
const HOST_PORT: i32 = 18080;

#[tokio::test]
async fn replicas_with_the_same_host_port_land_one_on_each_of_three_nodes() -> anyhow::Result<()> {
    let started = Instant::now();
    let control_plane = ControlPlane::with_nodes(3)
        .await
        .context("three nodes must start on this machine")?;
    eprintln!(
        "nodes test: control plane with 3 Ready nodes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let client = control_plane.client().await?;
    let names: Vec<String> = (0..3).map(|i| node_address(i).to_string()).collect();
    let own: Vec<&str> = control_plane.nodes().iter().map(Node::name).collect();
    ensure!(own == names, "nodes {own:?}, expected {names:?}");
    ensure!(
        control_plane.node().map(Node::name) == Some(NODE_NAME),
        "node() is not the first"
    );
    // Registered as such: Ready, the InternalIP their name.
    let listed = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let mut registered: Vec<(String, Vec<String>)> = listed
        .items
        .iter()
        .map(|node| {
            let addresses = node
                .status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .filter(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
                .collect();
            (node.metadata.name.clone().unwrap_or_default(), addresses)
        })
        .collect();
    registered.sort();
    let expected: Vec<(String, Vec<String>)> =
        names.iter().map(|n| (n.clone(), vec![n.clone()])).collect();
    ensure!(
        registered == expected,
        "Nodes and InternalIPs {registered:?}"
    );

    // An image imported into every node (the pause image again: it is small).
    let node = control_plane.node().context("no node")?;
    let imported = control_plane
        .import_image_everywhere(&node.binaries().pause_archive())
        .await?;
    ensure!(
        imported.len() == 3,
        "imported into {} nodes",
        imported.len()
    );

    let namespace = create_namespace(&client, "nodes").await?;
    wait_for_default_service_account(&client, &namespace).await?;
    let ports = json!({ "ports": [{
        "name": "metrics",
        "containerPort": HOST_PORT,
        "hostPort": HOST_PORT,
        "protocol": "TCP",
    }]});
    let template = pod_spec(node.pause_image(), json!({}), ports.clone());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "spread" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "spread" } },
            "template": {
                "metadata": { "labels": { "app": "spread" } },
                "spec": template,
            },
        },
    }))?;
    let rollout = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let available = |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref())
            .and_then(|s| s.available_replicas)
            == Some(3)
    };
    let ready = await_condition(deployments.clone(), "spread", available);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let by_label = ListParams::default().labels("app=spread");
    if tokio::time::timeout(DEADLINE, ready).await.is_err() {
        let listed = pods.list(&by_label).await?;
        let mut why = Vec::new();
        for pod in &listed.items {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            why.push(explain(&client, &namespace, name, node).await);
        }
        bail!(
            "the 3 replicas were not available within {DEADLINE:?}:\n{}",
            why.join("\n")
        );
    }
    eprintln!(
        "nodes test: 3 replicas available in {:.1} s",
        rollout.elapsed().as_secs_f64()
    );
    let mut placed: Vec<(String, String, String, String)> = pods
        .list(&by_label)
        .await?
        .items
        .into_iter()
        .map(|pod| {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let status = pod.status.unwrap_or_default();
            (
                node.unwrap_or_default(),
                status.pod_ip.unwrap_or_default(),
                status.host_ip.unwrap_or_default(),
                status.phase.unwrap_or_default(),
            )
        })
        .collect();
    placed.sort();
    let expected: Vec<(String, String, String, String)> = names
        .iter()
        .map(|n| (n.clone(), n.clone(), n.clone(), "Running".to_owned()))
        .collect();
    ensure!(
        placed == expected,
        "one Running replica per node, its podIP and hostIP the node's address: {placed:?}"
    );

    // A fourth Pod with that hostPort finds no node with the port free.
    let extra: Pod = serde_json::from_value(json!({
        "metadata": { "name": "fourth" },
        "spec": pod_spec(node.pause_image(), json!({}), ports),
    }))?;
    pods.create(&PostParams::default(), &extra).await?;
    let unschedulable = |pod: Option<&Pod>| {
        pod.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    };
    let refused = await_condition(pods.clone(), "fourth", unschedulable);
    let refused = tokio::time::timeout(DEADLINE, refused)
        .await
        .context("the fourth Pod was not found unschedulable")??;
    let message = refused
        .and_then(|p| p.status?.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled")
        .and_then(|c| c.message)
        .unwrap_or_default();
    ensure!(
        message.contains("free ports"),
        "unschedulable for another reason: {message}"
    );
    delete_and_wait(&pods, "fourth").await?;

    deployments
        .delete("spread", &DeleteParams::foreground())
        .await?;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let left = pods.list(&by_label).await?;
        if left.items.is_empty() {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the replicas were not deleted: {:?}",
            left.items
                .iter()
                .map(|p| &p.metadata.name)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_and_assert_nothing_left(control_plane)
}

/// Drops the control plane and checks that nothing of it or its nodes is left.
fn stop_and_assert_nothing_left(control_plane: ControlPlane) -> anyhow::Result<()> {
    let dir = control_plane.dir().to_path_buf();
    let cgroup_roots: Vec<String> = control_plane
        .nodes()
        .iter()
        .filter_map(Node::cgroup_root)
        .collect();
    ensure!(
        cgroup_roots.len() == control_plane.nodes().len(),
        "a node without a cgroup root"
    );
    let stopped = Instant::now();
    drop(control_plane);
    eprintln!(
        "node test: stopped in {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    assert_nothing_left(&dir, &cgroup_roots)
}

/// A Pod spec that passes the restricted Pod Security profile's checks on its containers
/// (non-root, RuntimeDefault seccomp, no capabilities, no privilege escalation, read-only
/// root filesystem), on the host's network (which that profile itself forbids: only
/// hostNetwork Pods run on this node). `spec` and `container` add fields to the Pod's spec and
/// its one container.
fn pod_spec(
    image: &str,
    spec: serde_json::Value,
    container: serde_json::Value,
) -> serde_json::Value {
    let container = merged(
        json!({
            "name": "main",
            "image": image,
            "imagePullPolicy": "Never",
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"] },
            },
        }),
        container,
    );
    let base = json!({
        "hostNetwork": true,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65535,
            "runAsGroup": 65535,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": [container],
    });
    merged(base, spec)
}

/// `base` with the fields of `extra` (both objects) added or replaced.
fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(fields), serde_json::Value::Object(extra)) = (base.as_object_mut(), extra) {
        fields.extend(extra);
    }
    base
}

/// A Pod of an image imported at run time (kubectl, as an OCI archive made by
/// `scripts/oci_image.py`: `Node::import_image`) reaches the apiserver with in-cluster
/// configuration (its ServiceAccount token and `kube-root-ca.crt` from the projected volume,
/// `ControlPlane::in_cluster_env`), as an operator Pod would, and exits 0.
async fn a_pod_reaches_the_apiserver_in_cluster(
    control_plane: &ControlPlane,
    client: &kube::Client,
    namespace: &str,
) -> anyhow::Result<()> {
    const IMAGE: &str = "vmop.dev/node/kubectl:test";
    let node = control_plane.node().context("no node")?;
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("kubectl.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/oci_image.py");
    let started = Instant::now();
    let made = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["program", "--program"])
        .arg(control_plane.kubectl())
        .args(["--name", IMAGE, "--out"])
        .arg(&archive)
        .status()
        .await?;
    ensure!(made.success(), "{} failed: {made}", script.display());
    node.import_image(&archive).await?;
    eprintln!(
        "node test: kubectl image made and imported in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let mut env = control_plane.in_cluster_env();
    env.push(EnvVar {
        name: "HOME".to_owned(),
        value: Some("/home".to_owned()),
        ..EnvVar::default()
    });
    let spec = pod_spec(
        IMAGE,
        json!({
            "restartPolicy": "Never",
            "volumes": [{ "name": "home", "emptyDir": {} }],
        }),
        json!({
            "args": ["get", "--raw", "/readyz"],
            "env": env,
            "volumeMounts": [{ "name": "home", "mountPath": "/home" }],
        }),
    );
    let pod: Pod =
        serde_json::from_value(json!({ "metadata": { "name": "kubectl" }, "spec": spec }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &pod).await?;
    let ended = |pod: Option<&Pod>| {
        let phase = pod.and_then(|p| p.status.as_ref()?.phase.clone());
        matches!(phase.as_deref(), Some("Succeeded" | "Failed"))
    };
    let done = tokio::time::timeout(DEADLINE, await_condition(pods.clone(), "kubectl", ended));
    let phase = match done.await {
        Ok(Ok(pod)) => pod.and_then(|p| p.status?.phase),
        _ => None,
    };
    let logs = pods
        .logs("kubectl", &Default::default())
        .await
        .unwrap_or_default();
    if phase.as_deref() != Some("Succeeded") || logs.trim() != "ok" {
        bail!(
            "kubectl in a Pod ended {phase:?} saying {logs:?}: {}",
            explain(client, namespace, "kubectl", node).await
        );
    }
    delete_and_wait(&pods, "kubectl").await
}

/// A one-replica Deployment of the pause image becomes available (deployment and replicaset
/// controllers, scheduler, kubelet), then goes with its Pods.
async fn run_a_deployment(
    client: &kube::Client,
    namespace: &str,
    node: &Node,
) -> anyhow::Result<()> {
    let image = node.pause_image();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "pause" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "pause" } },
            "template": {
                "metadata": { "labels": { "app": "pause" } },
                "spec": pod_spec(image, json!({}), json!({})),
            },
        },
    }))?;
    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let available = |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref())
            .and_then(|s| s.available_replicas)
            == Some(1)
    };
    let ready = await_condition(deployments.clone(), "pause", available);
    if tokio::time::timeout(DEADLINE, ready).await.is_err() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let listed = pods
            .list(&ListParams::default().labels("app=pause"))
            .await?;
        let name = listed.items.first().and_then(|p| p.metadata.name.clone());
        bail!(
            "the Deployment was not available within {DEADLINE:?}: {}",
            explain(
                client,
                namespace,
                name.as_deref().unwrap_or("<no Pod>"),
                node
            )
            .await
        );
    }
    eprintln!(
        "node test: Deployment available in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let foreground = DeleteParams::foreground();
    deployments.delete("pause", &foreground).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let left = pods
            .list(&ListParams::default().labels("app=pause"))
            .await?;
        if left.items.is_empty() {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the Deployment's Pods were not deleted: {:?}",
            left.items
                .iter()
                .map(|p| &p.metadata.name)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Pod's status and events, and the ends of kubelet's and containerd's logs.
async fn explain(client: &kube::Client, namespace: &str, name: &str, node: &Node) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let status = match pods.get_opt(name).await {
        Ok(pod) => serde_json::to_string_pretty(&pod.and_then(|p| p.status)).unwrap_or_default(),
        Err(error) => format!("GET failed: {error}"),
    };
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let selector = format!("involvedObject.name={name}");
    let events = match events.list(&ListParams::default().fields(&selector)).await {
        Ok(list) => list
            .items
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(error) => format!("listing events failed: {error}"),
    };
    format!("status {status}\nevents:\n{events}\n{}", node.log_tails())
}

fn is_running_and_ready(pod: Option<&Pod>) -> bool {
    let Some(status) = pod.and_then(|p| p.status.as_ref()) else {
        return false;
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    status.phase.as_deref() == Some("Running") && ready
}

/// The ServiceAccount admission plugin refuses Pods until the namespace's `default`
/// ServiceAccount exists, which the serviceaccount controller makes soon after the namespace.
async fn wait_for_default_service_account(
    client: &kube::Client,
    namespace: &str,
) -> anyhow::Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    tokio::time::timeout(
        DEADLINE,
        await_condition(accounts, "default", conditions::is_created()),
    )
    .await
    .context("no default ServiceAccount within the deadline")??;
    Ok(())
}

async fn delete_and_wait(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let uid = pods.get(name).await?.metadata.uid.context("no uid")?;
    pods.delete(name, &DeleteParams::default()).await?;
    tokio::time::timeout(
        DEADLINE,
        await_condition(pods.clone(), name, conditions::is_deleted(&uid)),
    )
    .await
    .context("the Pod was not deleted within the deadline")??;
    eprintln!(
        "node test: Pod deleted in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// After the control plane with its nodes is dropped: its directory is gone, nothing is
/// mounted below it, no process names it, and none of its nodes' cgroup roots (`/vmop-node-...`)
/// is left in any hierarchy.
fn assert_nothing_left(dir: &Path, cgroup_roots: &[String]) -> anyhow::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dir_text = dir.display().to_string();
    ensure!(
        !mountinfo.contains(&dir_text),
        "mounts left under {dir_text}:\n{mountinfo}"
    );
    ensure!(!dir.exists(), "{dir_text} is left");
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        for entry in std::fs::read_dir(hierarchy.path())?.flatten() {
            let name = format!("/{}", entry.file_name().to_string_lossy());
            ensure!(
                !cgroup_roots.contains(&name),
                "cgroup {} is left",
                entry.path().display()
            );
        }
    }
    for process in std::fs::read_dir("/proc")?.flatten() {
        let cmdline = std::fs::read(process.path().join("cmdline")).unwrap_or_default();
        ensure!(
            !String::from_utf8_lossy(&cmdline).contains(&dir_text),
            "process {} still names {dir_text}",
            process.file_name().to_string_lossy()
        );
    }
    Ok(())
}
