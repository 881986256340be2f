//! Helpers of the manifest tests: running kubectl and helm, reading YAML manifests, comparing
//! objects.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde::Deserialize as _;
use serde_json::{Value, json};
use vmop_tests::controlplane::ControlPlane;

/// Names the helm binary; skips `tests/helm/build.sh`.
pub const HELM_ENV: &str = "VMOP_HELM";
pub const OPERATOR_NAMESPACE: &str = "vmop-system";
pub const OPERATOR: &str = "system:serviceaccount:vmop-system:vmop";
pub const CRDS: [&str; 2] = ["virtualmachines.vmop.dev", "providerconfigs.vmop.dev"];
/// Generous: the machine may be busy compiling; a test that passes never waits this long.
pub const DEADLINE: Duration = Duration::from_secs(90);
pub const DRY_RUN: [&str; 4] = ["apply", "--server-side", "--dry-run=server", "-f"];

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `command` to completion off the async runtime, feeding it `input` on stdin.
pub async fn run(mut command: Command, input: Option<String>) -> anyhow::Result<Output> {
    let description = format!("{command:?}");
    tokio::task::spawn_blocking(move || {
        command
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        if let Some(input) = input {
            // kubectl reads all of its input before it sends anything: no deadlock on stdout.
            let mut stdin = child.stdin.take().context("no stdin pipe")?;
            stdin.write_all(input.as_bytes())?;
        }
        anyhow::Ok(child.wait_with_output()?)
    })
    .await?
    .with_context(|| format!("failed to run {description}"))
}

/// Stdout of a command that must succeed, else its stderr in the error.
pub fn succeeded(output: &Output, what: &str) -> anyhow::Result<String> {
    ensure!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub async fn kubectl(
    control_plane: &ControlPlane,
    args: &[&str],
    input: Option<String>,
) -> anyhow::Result<Output> {
    let mut command = control_plane.kubectl_command();
    command.args(args).current_dir(repo());
    run(command, input).await
}

/// Installs the CRDs and the operator's namespace for real, idempotently (server-side apply
/// with one field manager), and waits until the CRDs are served.
pub async fn install_prerequisites(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let crds = kubectl(
        control_plane,
        &["apply", "--server-side", "-f", "crds/"],
        None,
    )
    .await?;
    succeeded(&crds, "applying crds/")?;
    let timeout = format!("--timeout={}s", DEADLINE.as_secs());
    let mut wait = vec!["wait", "--for=condition=Established", timeout.as_str()];
    let names: Vec<String> = CRDS.iter().map(|crd| format!("crd/{crd}")).collect();
    wait.extend(names.iter().map(String::as_str));
    succeeded(
        &kubectl(control_plane, &wait, None).await?,
        "waiting for the CRDs",
    )?;
    let namespace = ["apply", "--server-side", "-f", "deploy/namespace.yaml"];
    succeeded(
        &kubectl(control_plane, &namespace, None).await?,
        "applying deploy/namespace.yaml",
    )?;
    Ok(())
}

/// The YAML documents of `text`, empty ones skipped.
pub fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(document).context("invalid YAML")?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// The documents of every `.yaml` file directly in `dir` (what `kubectl apply -f dir` reads).
pub fn documents_in(dir: &str) -> anyhow::Result<Vec<Value>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "yaml"));
    files.sort();
    let mut all = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        all.extend(documents(&text).with_context(|| format!("in {}", file.display()))?);
    }
    ensure!(!all.is_empty(), "no manifests in {dir}");
    Ok(all)
}

/// `documents` as one YAML stream (each document as JSON, which is YAML).
pub fn stream(documents: &[Value]) -> String {
    documents
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Checks a server-side dry-run of `count` objects: all accepted, with no warning (a Pod
/// Security violation by a Deployment is only a warning).
pub fn dry_run_accepted(output: &Output, count: usize, what: &str) -> anyhow::Result<()> {
    let stdout = succeeded(output, what)?;
    let accepted = stdout
        .lines()
        .filter(|line| line.ends_with("(server dry run)"))
        .count();
    ensure!(
        accepted == count,
        "{what}: {accepted} of {count} objects accepted:\n{stdout}"
    );
    let stderr = stderr(output);
    ensure!(
        !stderr.contains("Warning"),
        "{what}: the API server warned:\n{stderr}"
    );
    Ok(())
}

pub fn helm() -> anyhow::Result<PathBuf> {
    static LOCATED: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut located = LOCATED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(helm) = located.as_ref() {
        return Ok(helm.clone());
    }
    let helm = match std::env::var_os(HELM_ENV) {
        Some(path) => PathBuf::from(path),
        None => {
            let script = repo().join("tests/helm/build.sh");
            // Progress on stderr reaches the test's output; the path is stdout's last line.
            let output = Command::new(&script)
                .stderr(Stdio::inherit())
                .output()
                .with_context(|| format!("failed to run {}", script.display()))?;
            let stdout = succeeded(&output, "tests/helm/build.sh")?;
            PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
        }
    };
    ensure!(
        helm.is_file(),
        "no helm binary at {} (set {HELM_ENV} or run tests/helm/build.sh)",
        helm.display()
    );
    *located = Some(helm.clone());
    Ok(helm)
}

/// `helm template vmop charts/vmop --namespace <namespace> <args>`, with helm's own state in a
/// temporary directory.
pub async fn helm_template(namespace: &str, args: &[&str]) -> anyhow::Result<String> {
    let helm = tokio::task::spawn_blocking(helm).await??;
    let home = tempfile::tempdir()?;
    let mut command = Command::new(helm);
    command
        .current_dir(repo())
        .args(["template", "vmop", "charts/vmop", "--namespace", namespace])
        .args(args);
    for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        command.env(var, home.path());
    }
    succeeded(&run(command, None).await?, "helm template")
}

pub fn only<'a>(documents: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    let mut of_kind = documents.iter().filter(|document| document["kind"] == kind);
    match (of_kind.next(), of_kind.next()) {
        (Some(document), None) => Ok(document),
        _ => bail!("expected exactly one {kind}"),
    }
}

/// Labels only Helm adds; everything else must be the same in the chart and in deploy/.
pub const HELM_ONLY_LABELS: [&str; 2] = ["app.kubernetes.io/managed-by", "helm.sh/chart"];

/// Objects by `kind/namespace/name`, without the Helm-only labels.
pub fn by_identity(documents: Vec<Value>) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut objects = BTreeMap::new();
    for mut document in documents {
        strip_helm_labels(document.pointer_mut("/metadata"));
        strip_helm_labels(document.pointer_mut("/spec/template/metadata"));
        let text = |pointer: &str| document.pointer(pointer).and_then(Value::as_str);
        let key = format!(
            "{}/{}/{}",
            text("/kind").unwrap_or_default(),
            text("/metadata/namespace").unwrap_or_default(),
            text("/metadata/name").unwrap_or_default()
        );
        ensure!(
            objects.insert(key.clone(), document).is_none(),
            "{key} appears twice"
        );
    }
    Ok(objects)
}

pub fn strip_helm_labels(metadata: Option<&mut Value>) {
    let labels = metadata
        .and_then(|metadata| metadata.get_mut("labels"))
        .and_then(Value::as_object_mut);
    if let Some(labels) = labels {
        for label in HELM_ONLY_LABELS {
            labels.remove(label);
        }
    }
}

pub fn ensure_same(
    chart: BTreeMap<String, Value>,
    plain: BTreeMap<String, Value>,
    what: &str,
) -> anyhow::Result<()> {
    let chart_keys: Vec<&String> = chart.keys().collect();
    let plain_keys: Vec<&String> = plain.keys().collect();
    ensure!(
        chart_keys == plain_keys,
        "{what}: the chart renders {chart_keys:?}, deploy/ has {plain_keys:?}"
    );
    for (key, rendered) in &chart {
        let expected = plain.get(key).context("checked above")?;
        ensure!(
            rendered == expected,
            "{what}: {key} differs.\nchart:\n{rendered:#}\ndeploy/:\n{expected:#}"
        );
    }
    Ok(())
}

/// A Pod with the Deployment's pod template, in `namespace`.
pub fn pod_of(deployment: &Value, namespace: &str) -> Value {
    let field = |pointer: &str| {
        deployment
            .pointer(&format!("/spec/template{pointer}"))
            .cloned()
            .unwrap_or_default()
    };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "vmop-pod-security",
            "namespace": namespace,
            "labels": field("/metadata/labels"),
        },
        "spec": field("/spec"),
    })
}

/// `object` moved to `namespace`; objects without metadata are left alone (the API server
/// refuses them anyway).
pub fn in_namespace(mut object: Value, namespace: &str) -> Value {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("namespace".to_owned(), json!(namespace));
    }
    object
}

/// Server-side dry-run of `object` by kubectl; its output, whether accepted or refused.
pub async fn dry_run(control_plane: &ControlPlane, object: &Value) -> anyhow::Result<Output> {
    let mut args = DRY_RUN.to_vec();
    args.push("-");
    kubectl(control_plane, &args, Some(object.to_string())).await
}
