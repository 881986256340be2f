//! The deploy manifests (`deploy/`) and the Helm chart (`charts/vmop`) against the real control
//! plane, RBAC and Pod Security admission on: every object passes server-side dry-run, the
//! operator's Deployment passes the restricted profile (and the admission is shown to enforce
//! it), the ServiceAccount holds exactly the permissions the operator needs, and the chart
//! renders the same objects as `deploy/`.
//!
//! helm comes from `$VMOP_HELM`, else from `tests/helm/build.sh` (built from its Go module and
//! cached outside the repository).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde::Deserialize as _;
use serde_json::{Value, json};
use vmop_tests::controlplane::{ControlPlane, create_namespace};

/// Names the helm binary; skips `tests/helm/build.sh`.
const HELM_ENV: &str = "VMOP_HELM";
const OPERATOR_NAMESPACE: &str = "vmop-system";
const OPERATOR: &str = "system:serviceaccount:vmop-system:vmop";
const CRDS: [&str; 2] = ["virtualmachines.vmop.dev", "providerconfigs.vmop.dev"];
/// Generous: the machine may be busy compiling; a test that passes never waits this long.
const DEADLINE: Duration = Duration::from_secs(90);
const DRY_RUN: [&str; 4] = ["apply", "--server-side", "--dry-run=server", "-f"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `command` to completion off the async runtime, feeding it `input` on stdin.
async fn run(mut command: Command, input: Option<String>) -> anyhow::Result<Output> {
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
fn succeeded(output: &Output, what: &str) -> anyhow::Result<String> {
    ensure!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn kubectl(
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
async fn install_prerequisites(control_plane: &ControlPlane) -> anyhow::Result<()> {
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
fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
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
fn documents_in(dir: &str) -> anyhow::Result<Vec<Value>> {
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
fn stream(documents: &[Value]) -> String {
    documents
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Checks a server-side dry-run of `count` objects: all accepted, with no warning (a Pod
/// Security violation by a Deployment is only a warning).
fn dry_run_accepted(output: &Output, count: usize, what: &str) -> anyhow::Result<()> {
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

fn helm() -> anyhow::Result<PathBuf> {
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
async fn helm_template(namespace: &str, args: &[&str]) -> anyhow::Result<String> {
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

#[tokio::test]
async fn deploy_manifests_and_samples_pass_server_side_dry_run() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    install_prerequisites(control_plane).await?;
    for dir in ["deploy", "deploy/alternatives", "deploy/samples"] {
        let count = documents_in(dir)?.len();
        let mut args = DRY_RUN.to_vec();
        args.push(dir);
        let output = kubectl(control_plane, &args, None).await?;
        dry_run_accepted(&output, count, &format!("dry-run of {dir}/"))?;
    }
    Ok(())
}

/// Values that turn every knob away from its default.
const KNOBS: &str = r#"
replicas: 2
logFormat: text
maxConcurrentReconciles: 4
extraArgs: ["--extra=1"]
leaderElection: { enabled: false }
plugins: { mode: initContainer, reference: "registry.example.com/other/plugins:1" }
image: { repository: registry.example.com/other/vmop, tag: "9.9.9" }
serviceAccount: { name: operator }
resources: { requests: { cpu: 50m, memory: 64Mi } }
nodeSelector: { kubernetes.io/os: linux }
tolerations: [{ key: dedicated, operator: Equal, value: vmop, effect: NoSchedule }]
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions: [{ key: kubernetes.io/arch, operator: In, values: [amd64] }]
podAnnotations: { example.com/team: platform }
"#;

#[tokio::test]
async fn rendered_helm_chart_passes_server_side_dry_run() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    install_prerequisites(control_plane).await?;
    let values = tempfile::NamedTempFile::new()?;
    std::fs::write(values.path(), KNOBS)?;
    let values_path = values.path().to_string_lossy().into_owned();
    let admin = control_plane.client().await?;
    let other = create_namespace(&admin, "chart").await?;

    let renders = [
        (
            "defaults, CRDs and Namespace",
            OPERATOR_NAMESPACE,
            vec!["--include-crds", "--set", "namespace.create=true"],
        ),
        (
            "every knob changed",
            OPERATOR_NAMESPACE,
            vec!["--values", values_path.as_str()],
        ),
        ("another namespace", other.as_str(), vec![]),
    ];
    for (what, namespace, args) in renders {
        let rendered = documents(&helm_template(namespace, &args).await?)?;
        let mut dry_run = DRY_RUN.to_vec();
        dry_run.push("-");
        let output = kubectl(control_plane, &dry_run, Some(stream(&rendered))).await?;
        dry_run_accepted(&output, rendered.len(), &format!("chart ({what})"))?;
    }
    Ok(())
}

#[tokio::test]
async fn helm_chart_knobs_reach_the_deployment() -> anyhow::Result<()> {
    let values = tempfile::NamedTempFile::new()?;
    std::fs::write(values.path(), KNOBS)?;
    let values_path = values.path().to_string_lossy().into_owned();
    let rendered =
        documents(&helm_template(OPERATOR_NAMESPACE, &["--values", &values_path]).await?)?;
    let deployment = only(&rendered, "Deployment")?;
    let pod = &deployment["spec"]["template"]["spec"];
    let operator = &pod["containers"][0];
    let args: Vec<&str> = operator["args"]
        .as_array()
        .context("no args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let expected = [
        "run",
        "--plugin-dir=/plugins",
        "--cache-dir=/cache",
        "--log-format=text",
        "--max-concurrent-reconciles=4",
        "--extra=1",
    ];
    ensure!(args == expected, "args {args:?}");
    ensure!(deployment["spec"]["replicas"] == 2, "{deployment:#}");
    ensure!(
        operator["image"] == "registry.example.com/other/vmop:9.9.9",
        "{operator:#}"
    );
    ensure!(
        pod["initContainers"][0]["image"] == "registry.example.com/other/plugins:1"
            && pod["volumes"][0]["emptyDir"].is_object(),
        "plugins not copied by an init container: {pod:#}"
    );
    ensure!(pod["serviceAccountName"] == "operator", "{pod:#}");
    ensure!(
        pod["nodeSelector"]["kubernetes.io/os"] == "linux"
            && pod["tolerations"][0]["key"] == "dedicated"
            && pod["affinity"]["nodeAffinity"].is_object(),
        "scheduling knobs missing: {pod:#}"
    );
    ensure!(
        deployment["spec"]["template"]["metadata"]["annotations"]["example.com/team"] == "platform",
        "{deployment:#}"
    );
    let role = only(&rendered, "Role")?;
    let rules = role["rules"].to_string();
    ensure!(
        !rules.contains("leases"),
        "Lease access without leader election: {rules}"
    );
    let binding = only(&rendered, "ClusterRoleBinding")?;
    ensure!(binding["subjects"][0]["name"] == "operator", "{binding:#}");
    Ok(())
}

fn only<'a>(documents: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    let mut of_kind = documents.iter().filter(|document| document["kind"] == kind);
    match (of_kind.next(), of_kind.next()) {
        (Some(document), None) => Ok(document),
        _ => bail!("expected exactly one {kind}"),
    }
}

/// Labels only Helm adds; everything else must be the same in the chart and in deploy/.
const HELM_ONLY_LABELS: [&str; 2] = ["app.kubernetes.io/managed-by", "helm.sh/chart"];

/// Objects by `kind/namespace/name`, without the Helm-only labels.
fn by_identity(documents: Vec<Value>) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut objects = BTreeMap::new();
    for mut document in documents {
        strip_helm_labels(document.pointer_mut("/metadata"));
        strip_helm_labels(document.pointer_mut("/spec/template/metadata"));
        let meta = &document["metadata"];
        let key = format!(
            "{}/{}/{}",
            document["kind"].as_str().unwrap_or_default(),
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default()
        );
        ensure!(
            objects.insert(key.clone(), document).is_none(),
            "{key} appears twice"
        );
    }
    Ok(objects)
}

fn strip_helm_labels(metadata: Option<&mut Value>) {
    let labels = metadata
        .and_then(|metadata| metadata.get_mut("labels"))
        .and_then(Value::as_object_mut);
    if let Some(labels) = labels {
        for label in HELM_ONLY_LABELS {
            labels.remove(label);
        }
    }
}

fn ensure_same(
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

#[tokio::test]
async fn helm_chart_renders_the_same_objects_as_deploy() -> anyhow::Result<()> {
    let chart =
        documents(&helm_template(OPERATOR_NAMESPACE, &["--set", "namespace.create=true"]).await?)?;
    ensure_same(
        by_identity(chart)?,
        by_identity(documents_in("deploy")?)?,
        "default values",
    )?;

    let chart = documents(
        &helm_template(OPERATOR_NAMESPACE, &["--set", "plugins.mode=initContainer"]).await?,
    )?;
    let deployment = only(&chart, "Deployment")?.clone();
    ensure_same(
        by_identity(vec![deployment])?,
        by_identity(documents_in("deploy/alternatives")?)?,
        "plugins.mode=initContainer",
    )
}

/// The chart's `crds/` (installed once, never deleted with the release) is a link to the
/// repository's generated `crds/`: helm must render exactly those.
#[tokio::test]
async fn helm_chart_ships_the_repository_crds() -> anyhow::Result<()> {
    let rendered = documents(&helm_template(OPERATOR_NAMESPACE, &["--include-crds"]).await?)?;
    let crds: Vec<Value> = rendered
        .into_iter()
        .filter(|document| document["kind"] == "CustomResourceDefinition")
        .collect();
    ensure_same(
        by_identity(crds)?,
        by_identity(documents_in("crds")?)?,
        "CRDs",
    )
}

/// A Pod with the Deployment's pod template, in `namespace`.
fn pod_of(deployment: &Value, namespace: &str) -> Value {
    let template = &deployment["spec"]["template"];
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "vmop-pod-security",
            "namespace": namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    })
}

fn in_namespace(mut object: Value, namespace: &str) -> Value {
    object["metadata"]["namespace"] = json!(namespace);
    object
}

/// Dry-runs `object`; `Err` carries the command's output when the API server refused it.
async fn dry_run(control_plane: &ControlPlane, object: &Value) -> anyhow::Result<Output> {
    let mut args = DRY_RUN.to_vec();
    args.push("-");
    kubectl(control_plane, &args, Some(object.to_string())).await
}

#[tokio::test]
async fn deployment_passes_restricted_pod_security_admission() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    let admin = control_plane.client().await?;
    let restricted = create_namespace(&admin, "restricted").await?;
    let label = [
        "label",
        "namespace",
        restricted.as_str(),
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    ];
    succeeded(
        &kubectl(control_plane, &label, None).await?,
        "labelling the namespace",
    )?;
    let unrestricted = create_namespace(&admin, "unrestricted").await?;

    let namespace = only(&documents_in("deploy")?, "Namespace")?.clone();
    ensure!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted",
        "deploy/namespace.yaml does not enforce the restricted profile: {namespace:#}"
    );

    let deployments = [
        only(&documents_in("deploy")?, "Deployment")?.clone(),
        only(&documents_in("deploy/alternatives")?, "Deployment")?.clone(),
    ];
    for deployment in &deployments {
        let output = dry_run(
            control_plane,
            &in_namespace(deployment.clone(), &restricted),
        )
        .await?;
        dry_run_accepted(&output, 1, "Deployment in a restricted namespace")?;
        // Admission enforces on Pods only (it merely warns for workloads): try the Pod too.
        let output = dry_run(control_plane, &pod_of(deployment, &restricted)).await?;
        dry_run_accepted(&output, 1, "its Pod in a restricted namespace")?;
    }

    // Negatives: the admission really enforces, and it is what refuses them.
    let [image_volume, _] = &deployments;
    let containers = "/spec/template/spec/containers/0/securityContext";
    let violations = [
        ("runAsNonRoot", json!({ "runAsNonRoot": false })),
        (
            "privileged",
            json!({ "privileged": true, "allowPrivilegeEscalation": true }),
        ),
    ];
    for (check, change) in violations {
        let mut deployment = image_volume.clone();
        let context = deployment
            .pointer_mut(containers)
            .and_then(Value::as_object_mut)
            .context("no container securityContext")?;
        context.extend(change.as_object().cloned().unwrap_or_default());

        let output = dry_run(control_plane, &pod_of(&deployment, &restricted)).await?;
        let refusal = stderr(&output);
        ensure!(
            !output.status.success()
                && refusal.contains("violates PodSecurity \"restricted:latest\"")
                && refusal.contains(check),
            "a Pod violating {check} was not refused by Pod Security admission: {refusal}"
        );
        let output = dry_run(
            control_plane,
            &in_namespace(deployment.clone(), &restricted),
        )
        .await?;
        let warning = stderr(&output);
        ensure!(
            output.status.success() && warning.contains("would violate PodSecurity"),
            "no Pod Security warning for a Deployment violating {check}: {warning}"
        );
        // The same Pod is fine where the profile is not enforced.
        let output = dry_run(control_plane, &pod_of(&deployment, &unrestricted)).await?;
        succeeded(&output, "the violating Pod in an unlabelled namespace")?;
    }
    Ok(())
}

/// `kubectl auth can-i` as the operator's ServiceAccount.
async fn operator_can(
    control_plane: &ControlPlane,
    verb: &str,
    resource: &str,
    scope: &[&str],
) -> anyhow::Result<bool> {
    let mut args = vec!["auth", "can-i", verb, resource, "--as", OPERATOR];
    args.extend(scope);
    let output = kubectl(control_plane, &args, None).await?;
    match String::from_utf8_lossy(&output.stdout).trim() {
        "yes" => Ok(true),
        "no" => Ok(false),
        other => bail!(
            "kubectl auth can-i {verb} {resource} {scope:?} answered {other:?}: {}",
            stderr(&output)
        ),
    }
}

#[tokio::test]
async fn service_account_holds_only_what_the_operator_needs() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    install_prerequisites(control_plane).await?;
    for file in ["serviceaccount", "clusterrole", "role"] {
        let path = format!("deploy/{file}.yaml");
        let output = kubectl(
            control_plane,
            &["apply", "--server-side", "-f", &path],
            None,
        )
        .await?;
        succeeded(&output, &format!("applying {path}"))?;
    }
    let admin = control_plane.client().await?;
    let other = create_namespace(&admin, "elsewhere").await?;

    // The RBAC authorizer reads bindings from an informer: wait until it has them.
    let all = ["--all-namespaces"];
    tokio::time::timeout(DEADLINE, async {
        while !operator_can(control_plane, "list", "virtualmachines.vmop.dev", &all).await? {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::Ok(())
    })
    .await
    .context("the operator's bindings never took effect")??;

    let own = ["--namespace", OPERATOR_NAMESPACE];
    let elsewhere = ["--namespace", other.as_str()];
    let status = ["--subresource=status", "--all-namespaces"];
    let allowed: [(&str, &str, &[&str]); 16] = [
        ("watch", "virtualmachines.vmop.dev", &all),
        ("patch", "virtualmachines.vmop.dev", &elsewhere),
        ("patch", "virtualmachines.vmop.dev", &status),
        (
            "update",
            "virtualmachines.vmop.dev",
            &["--subresource=finalizers", "--all-namespaces"],
        ),
        ("list", "providerconfigs.vmop.dev", &[]),
        ("watch", "providerconfigs.vmop.dev", &[]),
        (
            "patch",
            "providerconfigs.vmop.dev",
            &["--subresource=status"],
        ),
        ("create", "events.events.k8s.io", &elsewhere),
        ("patch", "events", &elsewhere),
        ("create", "configmaps", &elsewhere),
        ("delete", "configmaps", &elsewhere),
        ("watch", "configmaps", &all),
        ("get", "secrets", &own),
        ("watch", "secrets", &own),
        ("create", "leases.coordination.k8s.io", &own),
        ("update", "leases.coordination.k8s.io", &own),
    ];
    let denied: [(&str, &str, &[&str]); 17] = [
        ("get", "secrets", &elsewhere),
        ("list", "secrets", &all),
        ("create", "secrets", &own),
        ("delete", "secrets", &own),
        ("list", "pods", &own),
        ("list", "pods", &all),
        ("get", "clusterroles.rbac.authorization.k8s.io", &[]),
        ("create", "clusterroles.rbac.authorization.k8s.io", &[]),
        ("update", "clusterroles.rbac.authorization.k8s.io", &[]),
        (
            "create",
            "clusterrolebindings.rbac.authorization.k8s.io",
            &[],
        ),
        ("create", "rolebindings.rbac.authorization.k8s.io", &own),
        ("create", "virtualmachines.vmop.dev", &elsewhere),
        ("delete", "virtualmachines.vmop.dev", &elsewhere),
        ("update", "providerconfigs.vmop.dev", &[]),
        ("create", "leases.coordination.k8s.io", &elsewhere),
        ("list", "namespaces", &[]),
        ("*", "*", &all),
    ];
    let mut wrong = Vec::new();
    for (expected, cases) in [(true, &allowed[..]), (false, &denied[..])] {
        for (verb, resource, scope) in cases {
            if operator_can(control_plane, verb, resource, scope).await? != expected {
                wrong.push(format!("{verb} {resource} {scope:?}: expected {expected}"));
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "wrong permissions for {OPERATOR}:\n{}",
        wrong.join("\n")
    );
    Ok(())
}
