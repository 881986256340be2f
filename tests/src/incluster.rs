//! vmop installed in-cluster on the test node (`ControlPlane::with_node`), for the in-cluster
//! test and `scripts/demo.sh --in-cluster`: helm against the control plane, the images built by
//! `scripts/oci_image.py` and imported into the node, the chart values such a node needs
//! (deploy/README.md, "Running on a loopback-only node"), and waits on the operator's Pods.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::controlplane::ControlPlane;
use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// Generous: the machine may be busy compiling; a test that passes never waits this long.
pub const DEADLINE: Duration = Duration::from_secs(180);

/// The operator's namespace, as deploy/namespace.yaml makes it.
pub const NAMESPACE: &str = "vmop-system";
/// The operator image's name (tag `test`) as imported into the node.
pub const OPERATOR_IMAGE: &str = "docker.io/vmop/vmop";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `command` to completion off the async runtime; fails with its output unless it
/// succeeded.
pub async fn run(mut command: Command, what: &str) -> anyhow::Result<String> {
    let description = format!("{command:?}");
    let output: Output = tokio::task::spawn_blocking(move || {
        command.stdin(Stdio::null()).current_dir(repo()).output()
    })
    .await?
    .with_context(|| format!("failed to run {description}"))?;
    ensure!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// helm from `$VMOP_HELM`, else built (or found cached) by `tests/helm/build.sh`.
pub fn helm(control_plane: &ControlPlane) -> anyhow::Result<Command> {
    let helm = match std::env::var_os("VMOP_HELM") {
        Some(helm) => PathBuf::from(helm),
        None => {
            let output = Command::new(repo().join("tests/helm/build.sh"))
                .stderr(Stdio::inherit())
                .output()
                .context("failed to run tests/helm/build.sh")?;
            ensure!(output.status.success(), "tests/helm/build.sh failed");
            let stdout = String::from_utf8_lossy(&output.stdout);
            PathBuf::from(
                stdout
                    .lines()
                    .last()
                    .context("no path from tests/helm/build.sh")?,
            )
        }
    };
    let mut command = Command::new(helm);
    command
        .env("KUBECONFIG", control_plane.kubeconfig())
        .env("HELM_CACHE_HOME", control_plane.dir().join("helm-cache"))
        .env("HELM_CONFIG_HOME", control_plane.dir().join("helm-config"))
        .env("HELM_DATA_HOME", control_plane.dir().join("helm-data"));
    Ok(command)
}

/// The chart values of the test node: hostNetwork on a node that reaches the API server on
/// loopback, images imported into the node (never pulled), `port` free on the node, and one
/// image volume per `(name, reference)` plugin.
pub fn node_values(
    control_plane: &ControlPlane,
    port: u16,
    plugins: &[(&str, &str)],
) -> anyhow::Result<Vec<String>> {
    let url = control_plane.server_url();
    let authority = url
        .strip_prefix("https://")
        .context("the API server URL is https")?;
    let (host, api_port) = authority
        .rsplit_once(':')
        .context("the API server URL has a port")?;
    let mut values = vec![
        format!("image.repository={OPERATOR_IMAGE}"),
        "image.tag=test".to_owned(),
        "image.pullPolicy=Never".to_owned(),
        "hostNetwork=true".to_owned(),
        format!("apiServer.host={host}"),
        format!("apiServer.port={api_port}"),
        format!("metrics.port={port}"),
        "plugins.pullPolicy=Never".to_owned(),
    ];
    for (i, (name, reference)) in plugins.iter().enumerate() {
        values.push(format!("plugins.images[{i}].name={name}"));
        values.push(format!("plugins.images[{i}].reference={reference}"));
    }
    Ok(values)
}

/// The operator's namespace from deploy/namespace.yaml, warning and auditing the restricted
/// Pod Security profile instead of enforcing it: it forbids the host network the node needs.
pub async fn operator_namespace(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let mut kubectl = control_plane.kubectl_command();
    kubectl.args(["apply", "--server-side", "-f", "deploy/namespace.yaml"]);
    run(kubectl, "kubectl apply deploy/namespace.yaml").await?;
    let mut relabel = control_plane.kubectl_command();
    relabel.args([
        "label",
        "--overwrite",
        "namespace",
        NAMESPACE,
        "pod-security.kubernetes.io/enforce=privileged",
        "pod-security.kubernetes.io/warn=restricted",
        "pod-security.kubernetes.io/audit=restricted",
    ]);
    run(relabel, "kubectl label namespace").await?;
    Ok(())
}

/// `helm install vmop charts/vmop` into [`NAMESPACE`] with `values`.
pub async fn install(control_plane: &ControlPlane, values: &[String]) -> anyhow::Result<()> {
    release(control_plane, "install", values, "helm install").await
}

/// `helm upgrade vmop charts/vmop` with `values` (later ones win); `what` names it in errors.
pub async fn upgrade(
    control_plane: &ControlPlane,
    values: &[String],
    what: &str,
) -> anyhow::Result<()> {
    release(control_plane, "upgrade", values, what).await
}

async fn release(
    control_plane: &ControlPlane,
    verb: &str,
    values: &[String],
    what: &str,
) -> anyhow::Result<()> {
    let mut command = helm(control_plane)?;
    command
        .args([verb, "vmop", "charts/vmop", "--namespace", NAMESPACE])
        .args(sets(values));
    run(command, what).await?;
    Ok(())
}

/// `--set` arguments for `values`.
pub fn sets(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| ["--set".to_owned(), v.clone()])
        .collect()
}

/// A free TCP port on 127.0.0.1 (closed again: the Pod binds it).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Writes an OCI archive with `scripts/oci_image.py` (`args`: `operator` or `plugin` with its
/// input flag and `--name`) and imports it into every node; returns what the script printed (a
/// plugin's digest).
pub async fn image(
    control_plane: &ControlPlane,
    args: &[&str],
    out: &Path,
) -> anyhow::Result<String> {
    let mut command = Command::new("python3");
    command
        .arg(repo().join("scripts/oci_image.py"))
        .args(args)
        .arg("--out")
        .arg(out);
    let printed = run(command, "oci_image.py").await?;
    control_plane
        .import_image_everywhere(out)
        .await
        .with_context(|| format!("importing {}", out.display()))?;
    Ok(printed.trim().to_owned())
}

/// The operator's Pods (by the chart's selector labels).
pub async fn operator_pods(client: &kube::Client) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = "app.kubernetes.io/name=vmop";
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        && pod.metadata.deletion_timestamp.is_none()
}

pub fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

/// Waits until `done` holds for the operator's Pods; explains the Pods on a timeout.
pub async fn wait_pods(
    client: &kube::Client,
    control_plane: &ControlPlane,
    what: &str,
    done: impl Fn(&[Pod]) -> bool,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let pods = operator_pods(client).await?;
        if done(&pods) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > DEADLINE {
            let statuses: Vec<String> = pods.iter().map(|p| format!("{:?}", p.status)).collect();
            let tails = control_plane
                .node()
                .map(|n| n.log_tails())
                .unwrap_or_default();
            bail!("{what}: not after {DEADLINE:?}; pods: {statuses:#?}\n{tails}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
