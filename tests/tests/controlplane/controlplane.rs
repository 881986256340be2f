//! The control-plane harness is real: CRDs, watches, RBAC, service-account tokens, garbage
//! collection and kubectl all work against it.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use vmop_tests::controlplane::{ControlPlane, Options, create_namespace};

/// Generous: the machine may be busy compiling; a test that passes never waits this long.
const DEADLINE: Duration = Duration::from_secs(90);

const WIDGET_GROUP: &str = "harness.vmop.dev";

fn widget_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget");
    ApiResource::from_gvk_with_plural(&gvk, "widgets")
}

/// Installs the test CRD (idempotently, by server-side apply) and waits until it is served.
async fn install_widget_crd(client: &kube::Client) -> anyhow::Result<()> {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("widgets.{WIDGET_GROUP}") },
        "spec": {
            "group": WIDGET_GROUP,
            "scope": "Namespaced",
            "names": { "kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList" },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "properties": { "size": { "type": "integer", "minimum": 0 } },
                    }},
                }},
            }],
        },
    }))?;
    let name = crd.metadata.name.clone().context("CRD without a name")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply("controlplane-test").force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("failed to apply the Widget CRD")?;
    tokio::time::timeout(
        DEADLINE,
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .context("the Widget CRD was not Established in time")??;
    Ok(())
}

fn widget_size(widget: &DynamicObject) -> Option<i64> {
    widget.data.get("spec")?.get("size")?.as_i64()
}

#[tokio::test]
async fn custom_object_is_created_read_and_watched() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    let (client, namespace) = control_plane.test_namespace("crd").await?;
    install_widget_crd(&client).await?;
    let resource = widget_resource();
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource);

    let mut widget = DynamicObject::new("first", &resource).data(json!({ "spec": { "size": 1 } }));
    widget.metadata.namespace = Some(namespace.clone());
    let created = widgets.create(&PostParams::default(), &widget).await?;
    let fetched = widgets.get("first").await?;
    ensure!(widget_size(&fetched) == Some(1), "read back {fetched:?}");

    // Watch from the created version, so only changes made after it are reported.
    let version = created
        .metadata
        .resource_version
        .context("created object without resourceVersion")?;
    let params = WatchParams::default().fields("metadata.name=first");
    let mut events = widgets.watch(&params, &version).await?.boxed();
    widgets
        .patch(
            "first",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 2 } })),
        )
        .await?;
    let observed = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = events.try_next().await? {
            match event {
                WatchEvent::Modified(widget) => return Ok(widget),
                WatchEvent::Error(status) => bail!("watch failed: {status}"),
                _ => {}
            }
        }
        bail!("the watch ended without reporting the change")
    })
    .await
    .context("no watch event for the change")??;
    ensure!(
        widget_size(&observed) == Some(2),
        "watch reported {observed:?}"
    );

    let invalid = DynamicObject::new("invalid", &resource).data(json!({ "spec": { "size": -1 } }));
    match widgets.create(&PostParams::default(), &invalid).await {
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(()),
        other => bail!("the CRD schema did not reject a negative size: {other:?}"),
    }
}

fn is_forbidden<T: std::fmt::Debug>(result: &kube::Result<T>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[tokio::test]
async fn user_without_role_binding_is_denied_until_granted() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    let admin = control_plane.client().await?;
    let namespace = create_namespace(&admin, "rbac").await?;
    let user = format!("user-{namespace}");
    let user_client = ControlPlane::client_for(&control_plane.user_kubeconfig(&user, &[])?).await?;

    let as_user: Api<ConfigMap> = Api::namespaced(user_client, &namespace);
    let denied = as_user.list(&ListParams::default()).await;
    ensure!(
        is_forbidden(&denied),
        "expected 403 for {user}, got {denied:?}"
    );
    let as_admin: Api<ConfigMap> = Api::namespaced(admin.clone(), &namespace);
    as_admin
        .list(&ListParams::default())
        .await
        .context("the admin was denied")?;

    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "read-configmaps" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"] }],
    }))?;
    Api::<Role>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &role)
        .await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("read-configmaps".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "read-configmaps".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.clone(),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    // The RBAC authorizer reads bindings from an informer: wait for it to catch up.
    tokio::time::timeout(DEADLINE, async {
        loop {
            let result = as_user.list(&ListParams::default()).await;
            if !is_forbidden(&result) {
                return result.map(drop);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .context("the RoleBinding never took effect")?
    .context("listing as the granted user failed")?;
    Ok(())
}

#[tokio::test]
async fn service_account_token_authenticates() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    let admin = control_plane.client().await?;
    let namespace = create_namespace(&admin, "token").await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin, &namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("robot".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &account).await?;
    // No audiences: the token is for the apiserver's own audience.
    let request = TokenRequest {
        spec: Some(TokenRequestSpec::default()),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request("robot", &PostParams::default(), &request)
        .await?
        .status
        .and_then(|status| status.token)
        .context("TokenRequest returned no token")?;
    let kubeconfig = control_plane.token_kubeconfig("robot", &token)?;
    let robot: Api<ConfigMap> =
        Api::namespaced(ControlPlane::client_for(&kubeconfig).await?, &namespace);
    // Authenticated (not 401) as the service account, which has no permissions (403).
    match robot.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            let expected = format!("system:serviceaccount:{namespace}:robot");
            ensure!(
                status.message.contains(&expected),
                "denied as someone else: {status:?}"
            );
            Ok(())
        }
        other => bail!("expected 403 for the service account, got {other:?}"),
    }
}

#[tokio::test]
async fn deleting_an_owner_deletes_its_dependent() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    control_plane.ensure_controller_manager().await?;
    let (client, namespace) = control_plane.test_namespace("gc").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let named = |name: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let owner = config_maps
        .create(&PostParams::default(), &named("owner"))
        .await?;
    let mut dependent = named("dependent");
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.context("owner without uid")?,
        ..OwnerReference::default()
    }]);
    let dependent = config_maps
        .create(&PostParams::default(), &dependent)
        .await?;
    let dependent_uid = dependent.metadata.uid.context("dependent without uid")?;

    config_maps
        .delete("owner", &DeleteParams::background())
        .await?;
    tokio::time::timeout(
        DEADLINE,
        await_condition(
            config_maps,
            "dependent",
            conditions::is_deleted(&dependent_uid),
        ),
    )
    .await
    .context("the garbage collector did not delete the dependent in time")??;
    Ok(())
}

#[tokio::test]
async fn kubectl_reads_through_the_written_kubeconfig() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    let (_, namespace) = control_plane.test_namespace("kubectl").await?;
    let mut command = control_plane.kubectl_command();
    command.args(["get", "namespaces", "-o", "name"]);
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        stdout
            .lines()
            .any(|line| line == format!("namespace/{namespace}")),
        "kubectl did not list {namespace}: {stdout}"
    );
    Ok(())
}

#[tokio::test]
async fn dropping_a_control_plane_stops_it_and_removes_its_files() -> anyhow::Result<()> {
    let control_plane = ControlPlane::start().await?;
    let pids = control_plane.pids();
    let dir = control_plane.dir().to_path_buf();
    ensure!(
        pids.len() == 2 && dir.is_dir(),
        "pids {pids:?}, dir {dir:?}"
    );
    drop(control_plane);
    for pid in pids {
        ensure!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} survived the drop"
        );
    }
    ensure!(!dir.exists(), "{} survived the drop", dir.display());
    Ok(())
}

/// The standalone `controlplane` command, started with its stderr in a file.
struct Standalone {
    child: std::process::Child,
    kubeconfig: std::path::PathBuf,
    stderr: std::path::PathBuf,
    _logs: tempfile::TempDir,
}

impl Standalone {
    async fn start() -> anyhow::Result<Self> {
        use std::io::BufRead as _;
        let logs = tempfile::tempdir()?;
        let stderr = logs.path().join("stderr");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_controlplane"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        // Two lines once ready: the kubeconfig path and an export line; EOF if it failed.
        let (first_line, export_line) = tokio::time::timeout(
            DEADLINE,
            tokio::task::spawn_blocking(move || {
                let mut lines = std::io::BufReader::new(stdout).lines();
                let mut next = || lines.next().transpose().map(Option::unwrap_or_default);
                Ok::<_, std::io::Error>((next()?, next()?))
            }),
        )
        .await
        .context("the controlplane command did not become ready")???;
        let kubeconfig = std::path::PathBuf::from(first_line.trim());
        let started = Self {
            child,
            kubeconfig,
            stderr,
            _logs: logs,
        };
        ensure!(
            started.kubeconfig.is_file()
                && export_line == format!("export KUBECONFIG={}", started.kubeconfig.display()),
            "the controlplane command printed {first_line:?}, {export_line:?}; stderr:\n{}",
            started.stderr()
        );
        Ok(started)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its children (etcd, kube-apiserver), found through their parent pid.
    fn children(&self) -> anyhow::Result<Vec<u32>> {
        let mut children = Vec::new();
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if proc_stat(pid).is_some_and(|(_, parent)| parent == self.child.id()) {
                children.push(pid);
            }
        }
        Ok(children)
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// State and parent pid from `/proc/<pid>/stat`; `None` once the process is gone.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; the fields after it are fixed.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Waits until every pid is gone or a zombie (killed, not yet reaped by its new parent).
async fn wait_until_dead(pids: &[u32]) -> anyhow::Result<()> {
    tokio::time::timeout(DEADLINE, async {
        while pids
            .iter()
            .any(|pid| proc_stat(*pid).is_some_and(|(state, _)| state != 'Z'))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .with_context(|| format!("processes {pids:?} are still alive"))
}

#[tokio::test]
async fn standalone_command_serves_until_sigterm_then_cleans_up() -> anyhow::Result<()> {
    let mut standalone = Standalone::start().await?;
    let children = standalone.children()?;
    ensure!(
        children.len() == 2,
        "expected etcd and kube-apiserver: {children:?}"
    );
    let client = ControlPlane::client_for(&standalone.kubeconfig).await?;
    create_namespace(&client, "standalone").await?;

    let status = std::process::Command::new("kill")
        .args(["-TERM", &standalone.child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let exit = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(exit) = standalone.child.try_wait()? {
                return anyhow::Ok(exit);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .context("the controlplane command did not exit after SIGTERM")??;
    ensure!(
        exit.success(),
        "exited {exit}; stderr:\n{}",
        standalone.stderr()
    );
    wait_until_dead(&children).await?;
    let dir = standalone
        .kubeconfig
        .parent()
        .context("kubeconfig without a directory")?;
    ensure!(!dir.exists(), "{} survived SIGTERM", dir.display());
    Ok(())
}

#[tokio::test]
async fn components_die_when_the_standalone_command_is_killed() -> anyhow::Result<()> {
    let mut standalone = Standalone::start().await?;
    let children = standalone.children()?;
    ensure!(
        children.len() == 2,
        "expected etcd and kube-apiserver: {children:?}"
    );
    // SIGKILL: no destructor runs, only PR_SET_PDEATHSIG can stop the children.
    standalone.child.kill()?;
    standalone.child.wait()?;
    wait_until_dead(&children).await
}

#[tokio::test]
async fn an_apiserver_that_cannot_start_is_reported_with_its_log() -> anyhow::Result<()> {
    let options = Options {
        apiserver_args: vec!["--no-such-flag=1".into()],
        ..Options::default()
    };
    let Err(error) = ControlPlane::start_with(options).await else {
        bail!("the apiserver started with an unknown flag");
    };
    let report = format!("{:#}", anyhow::Error::from(error));
    ensure!(
        report.contains("kube-apiserver exited") && report.contains("unknown flag: --no-such-flag"),
        "{report}"
    );
    Ok(())
}
