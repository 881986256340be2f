//! vmop in-cluster, as a user runs it: its image (the Dockerfile's final stage, written by
//! `scripts/oci_image.py` from this build's binary), its plugin as an OCI image volume, both
//! imported into the test node's containerd, and `helm install charts/vmop` onto that node
//! (`ControlPlane::with_node`). The Pod runs under the namespace's enforced restricted Pod
//! Security profile, reaches the API server through its ServiceAccount, becomes Ready through
//! the chart's readiness probe, serves `/metrics`, logs JSON, reconciles VMs on the loopback
//! testcloud, keeps its compile cache across a container restart, reloads a plugin rolled out
//! by a new image reference, and refuses a wrong digest or a plugin image without the file
//! with a clear condition while the other VMs keep being served.
//!
//! The node has no pod network (loopback only): the chart's `hostNetwork` and
//! `apiServer.host/port` values are set as deploy/README.md explains.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use vmop::api::{ProviderConfig, VirtualMachine, conditions};
use vmop_tests::cloud::{self, Cloud, Config};
use vmop_tests::controlplane::ControlPlane;
use vmop_tests::fixtures;
use vmop_tests::operator::scrape::scrape;

use vmop_tests::incluster::{
    DEADLINE, NAMESPACE, free_port, helm, image, install, is_ready, node_values,
    operator_namespace, operator_pods, restarts, run, upgrade, wait_pods,
};

const PLUGIN_IMAGE: &str = "docker.io/vmop/testcloud-plugin";

mod replicas;

pub(crate) const APPS: &str = "apps";
pub(crate) const PLUGIN_PATH: &str = "testcloud/vmop_provider_testcloud.wasm";
const COMPILED: &str = "plugin compiled";
const FROM_CACHE: &str = "plugin loaded from the precompiled cache, not compiled";

fn ready_condition(pc: &ProviderConfig) -> Option<(String, String, String)> {
    let status = pc.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)?;
    Some((
        ready.status.clone(),
        ready.reason.clone(),
        ready.message.clone(),
    ))
}

/// Waits until ProviderConfig `name`'s Ready condition satisfies `done`.
pub(crate) async fn wait_provider(
    configs: &Api<ProviderConfig>,
    name: &str,
    what: &str,
    done: impl Fn(&(String, String, String)) -> bool,
) -> anyhow::Result<(String, String, String)> {
    let started = Instant::now();
    loop {
        let ready = ready_condition(&configs.get(name).await?);
        if let Some(ready) = ready.as_ref().filter(|r| done(r)) {
            return Ok(ready.clone());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "{what}: ProviderConfig {name} is {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub(crate) async fn wait_vms(
    vms: &Api<VirtualMachine>,
    what: &str,
    done: impl Fn(&[VirtualMachine]) -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let list = vms.list(&ListParams::default()).await?.items;
        if done(&list) {
            return Ok(());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "{what}: not after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub(crate) fn vm_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, conditions::READY))
}

pub(crate) async fn provider_config(
    configs: &Api<ProviderConfig>,
    name: &str,
    path: &str,
    sha256: &str,
    cloud: &Cloud,
) -> anyhow::Result<()> {
    let pc: ProviderConfig = serde_json::from_value(json!({
        "apiVersion": "vmop.dev/v1alpha1",
        "kind": "ProviderConfig",
        "metadata": { "name": name },
        "spec": {
            "plugin": { "path": path, "sha256": sha256.trim_start_matches("sha256:") },
            "config": { "endpoint": cloud.endpoint() },
            "allowedHosts": [cloud.endpoint()],
        },
    }))?;
    configs.create(&PostParams::default(), &pc).await?;
    Ok(())
}

/// Replaces the operator Deployment with one whose Pod has no cache volume (and the `Recreate`
/// strategy: on the one node the new Pod needs the old one's port), and waits for that Pod to
/// say the cache is disabled and become Ready.
async fn without_the_cache_volume(
    client: &kube::Client,
    control_plane: &ControlPlane,
) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStrategy};
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    // The deployment controller writes the object too (its status): a replace made from an
    // older read is refused (409) and made again from a fresh one.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut deployment = deployments.get("vmop").await?;
        let spec = &mut deployment.spec;
        spec.strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".to_owned()),
            rolling_update: None,
        });
        let pod = spec.template.spec.as_mut().context("a Pod template")?;
        if let Some(volumes) = pod.volumes.as_mut() {
            volumes.retain(|v| v.name != "cache");
        }
        for container in &mut pod.containers {
            if let Some(mounts) = container.volume_mounts.as_mut() {
                mounts.retain(|m| m.name != "cache");
            }
        }
        match deployments
            .replace("vmop", &PostParams::default(), &deployment)
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 && Instant::now() < deadline => continue,
            result => {
                result?;
                break;
            }
        }
    }
    let started = Instant::now();
    loop {
        let pods = operator_pods(client).await?;
        let fresh: Vec<_> = pods
            .iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .is_some_and(|v| v.iter().all(|v| v.name != "cache"))
            })
            .collect();
        if let [pod] = fresh.as_slice()
            && is_ready(pod)
        {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let log = pod_log(control_plane, &name, false).await?;
            if log.contains("plugin artifact cache disabled") {
                eprintln!(
                    "in-cluster: a Pod without the cache volume runs with the cache disabled"
                );
                return Ok(());
            }
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "no Ready Pod without the cache volume saying the cache is off"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The namespace of the test's VirtualMachines.
pub(crate) async fn apps_namespace(client: &kube::Client) -> anyhow::Result<()> {
    let apps = Namespace {
        metadata: ObjectMeta {
            name: Some(APPS.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &apps)
        .await?;
    Ok(())
}

/// The operator Pod's log, as `kubectl logs` shows it (`previous`: the container before its
/// last restart).
async fn pod_log(
    control_plane: &ControlPlane,
    pod: &str,
    previous: bool,
) -> anyhow::Result<String> {
    let mut command = control_plane.kubectl_command();
    command.args(["logs", "-n", NAMESPACE, pod]);
    if previous {
        command.arg("--previous");
    }
    run(command, "kubectl logs").await
}

/// `elapsed` of the first log line whose message is `message`.
fn elapsed_of(log: &str, message: &str) -> Option<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.pointer("/fields/message").and_then(|m| m.as_str()) == Some(message))
        .and_then(|v| v.pointer("/fields/elapsed").map(|e| e.to_string()))
}

/// Every rollout on the one node gets a port of its own: the new Pod starts beside the old one
/// (the RollingUpdate strategy), both on the node's network.
fn new_port() -> anyhow::Result<Vec<String>> {
    Ok(vec![format!("metrics.port={}", free_port()?)])
}

/// The running Pod's spec passes the restricted profile but for the host network: a dry-run
/// create in a namespace enforcing it is refused naming only the host network and the host
/// port it implies, and admitted once the host network is off.
async fn restricted_but_for_the_host_network(
    client: &kube::Client,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> anyhow::Result<()> {
    let restricted = Namespace {
        metadata: ObjectMeta {
            name: Some("restricted".to_owned()),
            labels: Some(
                [(
                    "pod-security.kubernetes.io/enforce".to_owned(),
                    "restricted".to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &restricted)
        .await?;
    let mut spec = pod.spec.clone().context("a Pod spec")?;
    spec.node_name = None;
    // Its ServiceAccount lives in vmop-system; admission checks that it exists.
    spec.service_account_name = None;
    spec.service_account = None;
    spec.volumes = spec.volumes.map(|volumes| {
        volumes
            .into_iter()
            .filter(|v| v.projected.is_none())
            .collect()
    });
    for container in &mut spec.containers {
        if let Some(mounts) = container.volume_mounts.as_mut() {
            mounts.retain(|m| !m.mount_path.starts_with("/var/run/secrets"));
        }
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "restricted");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let candidate = |spec: k8s_openapi::api::core::v1::PodSpec| k8s_openapi::api::core::v1::Pod {
        metadata: ObjectMeta {
            name: Some("operator".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        ..Default::default()
    };
    match pods.create(&dry_run, &candidate(spec.clone())).await {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            let message = &status.message;
            // "...: host namespaces (hostNetwork=true), hostPort (container ... uses hostPort N)"
            let violations = message
                .split_once("restricted:latest\": ")
                .map(|(_, list)| list)
                .unwrap_or_default();
            let host_network_only = !violations.is_empty()
                && violations
                    .split("), ")
                    .all(|v| v.starts_with("host namespaces") || v.starts_with("hostPort"));
            ensure!(
                host_network_only,
                "more than the host network violates the restricted profile: {message}"
            );
            eprintln!("in-cluster: restricted profile on the Pod's spec: {message}");
        }
        other => anyhow::bail!("a hostNetwork Pod admitted under restricted: {other:?}"),
    }
    spec.host_network = None;
    spec.dns_policy = None;
    for container in &mut spec.containers {
        for port in container.ports.iter_mut().flatten() {
            port.host_port = None;
        }
    }
    pods.create(&dry_run, &candidate(spec))
        .await
        .context("the Pod's spec without the host network is refused under restricted")?;
    Ok(())
}

/// A copy of the component with a custom section appended: a valid component with another
/// digest, the "new version" of the plugin.
fn another_version(wasm: &[u8]) -> Vec<u8> {
    let name = b"vmop-test-version";
    let payload = b"2";
    let mut section = vec![0u8];
    let size = 1 + name.len() + payload.len();
    section.push(u8::try_from(size).unwrap_or(0));
    section.push(u8::try_from(name.len()).unwrap_or(0));
    section.extend_from_slice(name);
    section.extend_from_slice(payload);
    [wasm, &section].concat()
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_install_runs_vmop_from_its_image_with_plugins_from_image_volumes()
-> anyhow::Result<()> {
    let started = Instant::now();
    let control_plane = ControlPlane::with_node()
        .await
        .context("the node must start on this machine")?;
    let client = control_plane.client().await?;
    eprintln!(
        "in-cluster: control plane with a Ready node in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The images, built here and imported into the node.
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("vmop.tar");
    let built = Instant::now();
    image(
        &control_plane,
        &[
            "operator",
            "--binary",
            env!("CARGO_BIN_EXE_vmop-operator"),
            "--name",
            "docker.io/vmop/vmop:test",
        ],
        &archive,
    )
    .await?;
    eprintln!(
        "in-cluster: operator image {:.1} MiB (this build's binary), built and imported in {:.1} s",
        std::fs::metadata(&archive)?.len() as f64 / f64::from(1 << 20),
        built.elapsed().as_secs_f64()
    );
    // A plugin image holding `file`, named `reference`: its digest.
    let plugin_image = |file: std::path::PathBuf, reference: String, out: &str| {
        let (control_plane, out) = (&control_plane, dir.path().join(out));
        async move {
            let file = file.display().to_string();
            image(
                control_plane,
                &["plugin", "--wasm", &file, "--name", &reference],
                &out,
            )
            .await
        }
    };
    let wasm_path = vmop_tests::wasm::path("vmop_provider_testcloud")?;
    let v1 = plugin_image(
        wasm_path.to_path_buf(),
        format!("{PLUGIN_IMAGE}:v1"),
        "v1.tar",
    )
    .await?;
    let v2_dir = dir.path().join("v2");
    std::fs::create_dir_all(&v2_dir)?;
    let v2_wasm = v2_dir.join("vmop_provider_testcloud.wasm");
    std::fs::write(&v2_wasm, another_version(&std::fs::read(wasm_path)?))?;
    let v2 = plugin_image(v2_wasm, format!("{PLUGIN_IMAGE}:v2"), "v2.tar").await?;
    let readme = dir.path().join("README.txt");
    std::fs::write(&readme, "no plugin here\n")?;
    plugin_image(
        readme,
        "docker.io/vmop/empty-plugin:v1".to_owned(),
        "empty.tar",
    )
    .await?;

    // deploy/namespace.yaml enforces the restricted profile, which forbids the host network
    // this node needs: here it warns and audits it instead, and the Pod's own spec is checked
    // against it below (the host network its only violation).
    operator_namespace(&control_plane).await?;
    apps_namespace(&client).await?;

    let port = free_port()?;
    let v1_reference = format!("{PLUGIN_IMAGE}:v1");
    let values = node_values(&control_plane, port, &[("testcloud", &v1_reference)])?;
    install(&control_plane, &values).await?;
    let to_ready = wait_pods(&client, &control_plane, "the operator Pod Ready", |pods| {
        pods.len() == 1 && pods.iter().all(is_ready)
    })
    .await?;
    eprintln!(
        "in-cluster: helm install to Pod Ready (readiness probe) in {:.1} s",
        to_ready.as_secs_f64()
    );

    // VMs on the loopback testcloud through the plugin mounted from its image.
    let cloud = Cloud::start(Config::default()).await?;
    let configs: Api<ProviderConfig> = Api::all(client.clone());
    provider_config(&configs, "testcloud", PLUGIN_PATH, &v1, &cloud).await?;
    let (_, reason, message) =
        wait_provider(&configs, "testcloud", "plugin v1 loaded", |r| r.0 == "True").await?;
    ensure!(reason == "PluginLoaded", "{reason}: {message}");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), APPS);
    for i in 0..3 {
        let vm = fixtures::vm(&format!("vm-{i}"))
            .namespace(APPS)
            .provider("testcloud")
            .image(cloud::IMAGE)
            .build();
        vms.create(&PostParams::default(), &vm).await?;
    }
    wait_vms(&vms, "three VMs Ready", |list| {
        list.len() == 3 && list.iter().all(vm_ready)
    })
    .await?;

    // /metrics from the Pod, on the node's address.
    let scraped = scrape(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    ensure!(
        scraped.sum("vmop_virtual_machines", &[]) >= 3.0,
        "the Pod's /metrics counts no VM"
    );
    let pod = operator_pods(&client)
        .await?
        .into_iter()
        .next()
        .context("no operator Pod")?;
    let pod_name = pod.metadata.name.clone().context("a Pod name")?;
    restricted_but_for_the_host_network(&client, &pod).await?;
    let log = pod_log(&control_plane, &pod_name, false).await?;
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    ensure!(!lines.is_empty(), "kubectl logs shows nothing");
    for line in &lines {
        serde_json::from_str::<serde_json::Value>(line)
            .with_context(|| format!("not a JSON log line: {line}"))?;
    }
    let compiled = elapsed_of(&log, COMPILED).context("the first start compiled no plugin")?;
    // In the `vmop precompile` child, under the Pod's limits (read-only root, no capabilities).
    ensure!(
        log.lines()
            .any(|l| l.contains(COMPILED) && l.contains(r#""in_child":true"#)),
        "the plugin was not compiled in the child process:\n{log}"
    );

    // The container restarts (killed by the runtime): the compile cache, an emptyDir, survives.
    let container = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .context("no container id")?;
    let id = container
        .rsplit("://")
        .next()
        .context("a container id")?
        .to_owned();
    let node = control_plane.node().context("no node")?;
    let mut kill = node.ctr_command();
    kill.args(["tasks", "kill", "--signal", "SIGKILL", &id]);
    run(kill, "ctr tasks kill").await?;
    wait_pods(
        &client,
        &control_plane,
        "the restarted container Ready",
        |pods| pods.len() == 1 && pods.iter().all(|p| is_ready(p) && restarts(p) == 1),
    )
    .await?;
    let since = Instant::now();
    let cached = loop {
        let restarted = pod_log(&control_plane, &pod_name, false).await?;
        if let Some(cached) = elapsed_of(&restarted, FROM_CACHE) {
            break cached;
        }
        ensure!(
            !restarted.contains(COMPILED) && since.elapsed() < DEADLINE,
            "the restarted container did not load the plugin from its cache:\n{restarted}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!(
        "in-cluster: plugin load in the Pod: compiled {compiled}, after a container restart from the cache {cached}"
    );
    wait_vms(&vms, "VMs Ready after the restart", |list| {
        list.iter().all(vm_ready)
    })
    .await?;

    // A new plugin version: a new image reference rolls the Deployment; the ProviderConfig
    // pinned to its digest loads it.
    upgrade(
        &control_plane,
        &[
            values.clone(),
            new_port()?,
            vec![format!("plugins.images[0].reference={PLUGIN_IMAGE}:v2")],
        ]
        .concat(),
        "helm upgrade to plugin v2",
    )
    .await?;
    wait_pods(
        &client,
        &control_plane,
        "the rolled-out Pod Ready",
        |pods| pods.len() == 1 && pods.iter().all(|p| is_ready(p) && restarts(p) == 0),
    )
    .await?;
    let pin = |sha: &str| json!({ "spec": { "plugin": { "sha256": sha.trim_start_matches("sha256:") } } });
    configs
        .patch(
            "testcloud",
            &PatchParams::default(),
            &Patch::Merge(pin(&v2)),
        )
        .await?;
    let digest2 = v2.trim_start_matches("sha256:").to_owned();
    wait_provider(&configs, "testcloud", "plugin v2 loaded", |r| {
        r.0 == "True" && r.2.contains(&digest2)
    })
    .await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let since = Instant::now();
    loop {
        let listed = events
            .list(&ListParams::default().fields("involvedObject.name=testcloud"))
            .await?
            .items;
        let loaded_v2 = listed.iter().any(|e| {
            e.reason.as_deref() == Some("PluginLoaded")
                && e.message.as_deref().is_some_and(|m| m.contains(&digest2))
        });
        if loaded_v2 {
            break;
        }
        let seen: Vec<_> = listed.iter().map(|e| (&e.reason, &e.message)).collect();
        ensure!(
            since.elapsed() < DEADLINE,
            "no PluginLoaded Event names the new digest: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A wrong digest: refused, said so, no call; back to the right one, served again.
    configs
        .patch(
            "testcloud",
            &PatchParams::default(),
            &Patch::Merge(pin(&"0".repeat(64))),
        )
        .await?;
    let (_, reason, message) =
        wait_provider(&configs, "testcloud", "a wrong digest refused", |r| {
            r.0 == "False"
        })
        .await?;
    eprintln!("in-cluster: wrong digest: {reason}: {message}");
    configs
        .patch(
            "testcloud",
            &PatchParams::default(),
            &Patch::Merge(pin(&v2)),
        )
        .await?;
    wait_provider(&configs, "testcloud", "v2 again", |r| r.0 == "True").await?;

    // A plugin image without the file: its ProviderConfig says so; the others are served.
    let mut with_empty = values.clone();
    with_empty.push("plugins.images[1].name=empty".to_owned());
    with_empty.push("plugins.images[1].reference=docker.io/vmop/empty-plugin:v1".to_owned());
    with_empty.push(format!("plugins.images[0].reference={PLUGIN_IMAGE}:v2"));
    upgrade(
        &control_plane,
        &[with_empty.clone(), new_port()?].concat(),
        "helm upgrade with an empty plugin image",
    )
    .await?;
    wait_pods(
        &client,
        &control_plane,
        "the Pod with two plugin images Ready",
        |pods| pods.len() == 1 && pods.iter().all(is_ready),
    )
    .await?;
    provider_config(
        &configs,
        "empty",
        "empty/vmop_provider_testcloud.wasm",
        &v2,
        &cloud,
    )
    .await?;
    let (_, reason, message) =
        wait_provider(&configs, "empty", "a missing plugin file said so", |r| {
            r.0 == "False"
        })
        .await?;
    eprintln!("in-cluster: plugin image without the file: {reason}: {message}");

    // A missing image: the new Pod cannot start; the old one keeps serving (maxUnavailable 0).
    let mut missing = with_empty.clone();
    missing.push("plugins.images[1].reference=docker.io/vmop/missing-plugin:v1".to_owned());
    upgrade(
        &control_plane,
        &[missing, new_port()?].concat(),
        "helm upgrade with a missing image",
    )
    .await?;
    wait_pods(
        &client,
        &control_plane,
        "a new Pod stuck on its image",
        |pods| pods.len() == 2 && pods.iter().filter(|p| is_ready(p)).count() == 1,
    )
    .await?;
    let vm = fixtures::vm("vm-late")
        .namespace(APPS)
        .provider("testcloud")
        .image(cloud::IMAGE)
        .build();
    vms.create(&PostParams::default(), &vm).await?;
    wait_vms(&vms, "a VM made during the stuck rollout Ready", |list| {
        list.len() == 4 && list.iter().all(vm_ready)
    })
    .await?;
    let mut rollback = helm(&control_plane)?;
    rollback.args(["rollback", "vmop", "--namespace", NAMESPACE]);
    run(rollback, "helm rollback").await?;
    wait_pods(
        &client,
        &control_plane,
        "one Pod after the rollback",
        |pods| pods.len() == 1 && pods.iter().all(is_ready),
    )
    .await?;

    // A Deployment edited to drop the cache volume: the operator says the cache is off, compiles
    // (the root filesystem is read-only) and serves.
    without_the_cache_volume(&client, &control_plane).await?;
    wait_provider(&configs, "testcloud", "loaded without a cache", |r| {
        r.0 == "True"
    })
    .await?;
    wait_vms(&vms, "VMs Ready without a cache", |list| {
        list.iter().all(vm_ready)
    })
    .await?;

    // Everything deleted: no machine left, no finalizer stuck.
    vms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_vms(&vms, "all VMs gone", |list| list.is_empty()).await?;
    ensure!(cloud.live().is_empty(), "machines left: {:?}", cloud.live());
    let mut uninstall = helm(&control_plane)?;
    uninstall.args(["uninstall", "vmop", "--namespace", NAMESPACE, "--wait"]);
    run(uninstall, "helm uninstall").await?;
    Ok(())
}
