//! The deploy manifests (`deploy/`) and the Helm chart (`charts/vmop`) against the real control
//! plane, RBAC and Pod Security admission on: every object passes server-side dry-run, the
//! operator's Deployment passes the restricted profile (and the admission is shown to enforce
//! it), the ServiceAccount holds exactly the permissions the operator needs, and the chart
//! renders the same objects as `deploy/`.
//!
//! helm comes from `$VMOP_HELM`, else from `tests/helm/build.sh` (built from its Go module and
//! cached outside the repository).

mod support;

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};
use support::{
    DEADLINE, DRY_RUN, OPERATOR, OPERATOR_NAMESPACE, by_identity, documents, documents_in, dry_run,
    dry_run_accepted, ensure_same, helm_template, in_namespace, install_prerequisites, kubectl,
    only, pod_of, stderr, stream, succeeded,
};
use vmop_tests::controlplane::{ControlPlane, create_namespace};

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
maxPluginInstances: 8
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
        let mut args = DRY_RUN.to_vec();
        args.push("-");
        let output = kubectl(control_plane, &args, Some(stream(&rendered))).await?;
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
        "--max-plugin-instances=8",
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

#[tokio::test]
async fn helm_chart_refuses_unknown_modes() -> anyhow::Result<()> {
    for (value, message) in [
        (
            "plugins.mode=volume",
            "plugins.mode must be image or initContainer",
        ),
        ("logFormat=xml", "logFormat must be json or text"),
    ] {
        match helm_template(OPERATOR_NAMESPACE, &["--set", value]).await {
            Err(error) if format!("{error:#}").contains(message) => {}
            other => bail!("{value} was not refused with {message:?}: {other:?}"),
        }
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
    let allowed: [(&str, &str, &[&str]); 17] = [
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
        ("watch", "configmaps", &all),
        ("get", "secrets", &own),
        ("list", "secrets", &own),
        ("watch", "secrets", &own),
        ("create", "leases.coordination.k8s.io", &own),
        ("update", "leases.coordination.k8s.io", &own),
        ("get", "namespaces/kube-system", &[]),
    ];
    let denied: [(&str, &str, &[&str]); 19] = [
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
        ("get", "namespaces/default", &[]),
        ("delete", "configmaps", &elsewhere),
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
