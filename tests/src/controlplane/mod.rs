//! A real Kubernetes control plane for tests, like controller-runtime's envtest: etcd and
//! kube-apiserver (and on demand kube-controller-manager) built from Go modules, started on
//! loopback with free ports in a temporary directory.
//!
//! One control plane per test binary ([`ControlPlane::shared`]), one namespace per test
//! ([`create_namespace`]); a test that restarts the API server uses [`ControlPlane::isolated`],
//! one that counts what the API server serves a [`ControlPlane::dedicated`] one. A test that
//! runs Pods asks for a control plane with a node ([`ControlPlane::with_node`],
//! [`ControlPlane::shared_with_node`]; see [`node`]), one that runs replicas that each bind
//! their Pod IP's port for several ([`ControlPlane::with_nodes`]); the others never start one.
//! Every
//! `#[tokio::test]` has its own runtime, so the control plane keeps only paths, URLs and
//! processes; ask it for a fresh [`kube::Client`] in each test.
//!
//! No process outlives the test binary: children die with it (`PR_SET_PDEATHSIG`), and a
//! non-shared control plane kills them when dropped.

mod apiserver;
mod at_exit;
mod binaries;
mod controller_manager;
mod etcd;
mod kubeconfig;
mod launch;
mod namespaces;
pub mod node;
mod pki;
mod ports;
mod process;
mod tempdir;
mod users;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub use binaries::{BIN_DIR_ENV, Binaries, BinariesError};
pub use kubeconfig::{Credentials, KubeconfigError};
pub use launch::LaunchError;
pub use namespaces::create_namespace;
pub use node::{MAX_NODES, NODE_BIN_DIR_ENV, NODE_NAME, Node, NodeError, node_address};
pub use pki::PkiError;
use process::Process;

/// Overrides the readiness deadline of each component, in seconds.
pub const TIMEOUT_ENV: &str = "VMOP_CONTROLPLANE_TIMEOUT";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("failed to locate the control-plane binaries")]
    Binaries(#[source] BinariesError),
    #[error("failed to create the control plane's directory")]
    Dir(#[source] io::Error),
    #[error("failed to create the control plane's certificates")]
    Pki(#[source] PkiError),
    #[error("failed to prepare a kubeconfig")]
    Kubeconfig(#[source] KubeconfigError),
    #[error("failed to start a control-plane component")]
    Launch(#[source] LaunchError),
    #[error("the `default` namespace did not appear within {timeout:?} (last error: {last_error})")]
    DefaultNamespace {
        timeout: Duration,
        last_error: String,
    },
    #[error("failed to create a test namespace")]
    CreateNamespace(#[source] kube::Error),
    #[error("the API server named no test namespace it created")]
    UnnamedNamespace,
    #[error("a blocking start-up task failed")]
    Join(#[source] tokio::task::JoinError),
    #[error("failed to start the node")]
    Node(#[source] NodeError),
}

/// How a control plane is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// Deadline for each component to become ready.
    pub timeout: Duration,
    /// Extra kube-apiserver flags (`--name=value`), after the harness's own: a later
    /// occurrence of a flag overrides an earlier one.
    pub apiserver_args: Vec<String>,
    /// How many nodes to start (0 to [`MAX_NODES`]; each a containerd and a kubelet, named
    /// and addressed `127.0.0.<i+1>`, with one kube-scheduler for all; see [`node`]), with the
    /// controllers Pods need and the ServiceAccount admission plugin. 0 by default: a node
    /// costs seconds and runs containers.
    pub nodes: usize,
}

impl Default for Options {
    /// The deadline comes from `$VMOP_CONTROLPLANE_TIMEOUT` (seconds) if set, else 120 s.
    fn default() -> Self {
        let timeout = std::env::var(TIMEOUT_ENV)
            .ok()
            .and_then(|secs| secs.parse().ok())
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        Self {
            timeout,
            apiserver_args: Vec::new(),
            nodes: 0,
        }
    }
}

static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
static ISOLATED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
static WITH_NODE: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
/// [`ControlPlane::dedicated`] by name. Each cell is leaked once, so that it lives as long as the
/// process, like the statics above.
static DEDICATED: Mutex<BTreeMap<&'static str, &'static tokio::sync::OnceCell<ControlPlane>>> =
    Mutex::new(BTreeMap::new());
static STOP_DEDICATED_AT_EXIT: Once = Once::new();

/// Runs at process exit, so it must not panic: nothing here does.
extern "C" fn stop_shared() {
    stop_static(&SHARED);
}

extern "C" fn stop_isolated() {
    stop_static(&ISOLATED);
}

extern "C" fn stop_with_node() {
    stop_static(&WITH_NODE);
}

extern "C" fn stop_dedicated() {
    let cells: Vec<_> = DEDICATED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .copied()
        .collect();
    for cell in cells {
        stop_static(cell);
    }
}

fn stop_static(cell: &tokio::sync::OnceCell<ControlPlane>) {
    if let Some(control_plane) = cell.get() {
        control_plane.kill();
        // Best effort: a failure only leaves the directory for the next start to remove.
        let _ = std::fs::remove_dir_all(control_plane.dir());
    }
}

/// A running etcd + kube-apiserver (+ optional kube-controller-manager, + optional nodes and
/// their kube-scheduler).
///
/// Fields drop in declaration order: the scheduler is killed, the nodes stop (their
/// containers, mounts and cgroups go), then the other processes are killed, then their
/// directory is removed.
#[derive(Debug)]
pub struct ControlPlane {
    scheduler: Option<Process>,
    nodes: Vec<Node>,
    binaries: Binaries,
    pki: pki::Pki,
    options: Options,
    server_url: String,
    kubeconfig: PathBuf,
    users_dir: PathBuf,
    next_user: AtomicUsize,
    apiserver_port: u16,
    controller_manager: tokio::sync::OnceCell<Process>,
    apiserver: Process,
    etcd: Process,
    dir: TempDir,
}

impl ControlPlane {
    /// The control plane shared by every test of this binary, started on first use. It runs
    /// until the test binary exits; an `atexit` handler then stops it and removes its
    /// directory (if the binary is killed instead, the components die with it and the next
    /// start removes the directory).
    pub async fn shared() -> Result<&'static Self, ControlPlaneError> {
        SHARED
            .get_or_try_init(|| async {
                let control_plane = Self::start().await?;
                at_exit::register(stop_shared);
                Ok(control_plane)
            })
            .await
    }

    /// A second control plane of this binary, separate from [`Self::shared`], for a test that
    /// disturbs it (restarts the apiserver) while other tests use the shared one. Started on
    /// first use, stopped at exit like the shared one.
    pub async fn isolated() -> Result<&'static Self, ControlPlaneError> {
        ISOLATED
            .get_or_try_init(|| async {
                let control_plane = Self::start().await?;
                at_exit::register(stop_isolated);
                Ok(control_plane)
            })
            .await
    }

    /// The control plane with a node shared by the tests of this binary that run Pods, apart
    /// from [`Self::shared`] (which has none). Started on first use, stopped at exit like the
    /// shared one, node included.
    pub async fn shared_with_node() -> Result<&'static Self, ControlPlaneError> {
        WITH_NODE
            .get_or_try_init(|| async {
                let control_plane = Self::with_node().await?;
                at_exit::register(stop_with_node);
                Ok(control_plane)
            })
            .await
    }

    /// Starts a control plane with a node, owned by the caller: dropping it stops the node
    /// (leaving no container, mount or cgroup behind) and the control plane.
    pub async fn with_node() -> Result<Self, ControlPlaneError> {
        Self::with_nodes(1).await
    }

    /// Starts a control plane with `count` nodes (1 to [`MAX_NODES`]), named and addressed
    /// `127.0.0.1`, `127.0.0.2`, ... ([`node_address`]), all Ready, owned by the caller:
    /// dropping it stops them all (leaving no container, mount or cgroup behind) and the
    /// control plane. Pods that declare the same `hostPort` land on different nodes.
    pub async fn with_nodes(count: usize) -> Result<Self, ControlPlaneError> {
        Self::start_with(Options {
            nodes: count,
            ..Options::default()
        })
        .await
    }

    /// A control plane of this binary for the tests that ask for it by `name` only, apart from
    /// [`Self::shared`] and [`Self::isolated`]: for a test that counts what the API server
    /// serves (`apiserver_request_total`), which other tests' work would change. Started on
    /// first use, stopped at exit like the shared one.
    pub async fn dedicated(name: &'static str) -> Result<&'static Self, ControlPlaneError> {
        let cell = *DEDICATED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name)
            .or_insert_with(|| {
                STOP_DEDICATED_AT_EXIT.call_once(|| at_exit::register(stop_dedicated));
                Box::leak(Box::new(tokio::sync::OnceCell::new()))
            });
        cell.get_or_try_init(Self::start).await
    }

    /// Starts a control plane owned by the caller; dropping it stops it and removes its files.
    pub async fn start() -> Result<Self, ControlPlaneError> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Result<Self, ControlPlaneError> {
        let binaries = tokio::task::spawn_blocking(Binaries::locate)
            .await
            .map_err(ControlPlaneError::Join)?
            .map_err(ControlPlaneError::Binaries)?;
        let started = Instant::now();
        let dir = tempdir::create().map_err(ControlPlaneError::Dir)?;
        let pki_dir = dir.path().join("pki");
        let users_dir = dir.path().join("users");
        for sub in [&pki_dir, &users_dir] {
            std::fs::create_dir(sub).map_err(ControlPlaneError::Dir)?;
        }
        let pki = pki::Pki::generate(&pki_dir).map_err(ControlPlaneError::Pki)?;
        let admin = pki
            .client_cert("admin", &["system:masters"], "admin")
            .map_err(ControlPlaneError::Pki)?;
        let kubeconfig = dir.path().join("admin.kubeconfig");
        let write_admin_kubeconfig = |server: &str| {
            let credentials = Credentials::ClientCert {
                cert: &admin.cert,
                key: &admin.key,
            };
            kubeconfig::write(&kubeconfig, server, &pki.ca_cert, "admin", credentials)
        };
        // The port is not known yet; the probes replace the URL.
        write_admin_kubeconfig(&apiserver::url(0)).map_err(ControlPlaneError::Kubeconfig)?;
        let admin_config = kubeconfig::config(&kubeconfig)
            .await
            .map_err(ControlPlaneError::Kubeconfig)?;

        let timeout = options.timeout;
        let etcd = etcd::start(&binaries.etcd(), dir.path(), timeout)
            .await
            .map_err(ControlPlaneError::Launch)?;
        let apiserver = apiserver::start(
            &binaries.kube_apiserver(),
            dir.path(),
            &pki,
            &etcd.client_url,
            &admin_config,
            options.nodes > 0,
            &options.apiserver_args,
            timeout,
        )
        .await
        .map_err(ControlPlaneError::Launch)?;
        let apiserver_port = apiserver.ports.first().copied().unwrap_or_default();
        let server_url = apiserver::url(apiserver_port);
        write_admin_kubeconfig(&server_url).map_err(ControlPlaneError::Kubeconfig)?;

        let mut control_plane = Self {
            scheduler: None,
            nodes: Vec::new(),
            binaries,
            pki,
            options,
            server_url,
            kubeconfig,
            users_dir,
            next_user: AtomicUsize::new(0),
            apiserver_port,
            controller_manager: tokio::sync::OnceCell::new(),
            apiserver: apiserver.process,
            etcd: etcd.launched.process,
            dir,
        };
        control_plane.wait_for_default_namespace().await?;
        let count = control_plane.options.nodes;
        if count > 0 {
            control_plane.ensure_controller_manager().await?;
            let admin = admin_config_for(&control_plane).await?;
            let context = node::Context {
                dir: control_plane.dir.path(),
                pki: &control_plane.pki,
                server_url: &control_plane.server_url,
                admin_kubeconfig: &control_plane.kubeconfig,
                admin: &admin,
                timeout,
            };
            let nodes_started = Instant::now();
            let (nodes, scheduler) = tokio::try_join!(
                node::start_nodes(context, count),
                node::start_scheduler(context),
            )
            .map_err(ControlPlaneError::Node)?;
            if count > 1 {
                eprintln!(
                    "node: {count} nodes Ready in {:.1} s",
                    nodes_started.elapsed().as_secs_f64()
                );
            }
            control_plane.nodes = nodes;
            control_plane.scheduler = Some(scheduler);
        }
        eprintln!(
            "controlplane: ready in {:.1} s at {} (kubeconfig {})",
            started.elapsed().as_secs_f64(),
            control_plane.server_url,
            control_plane.kubeconfig.display()
        );
        Ok(control_plane)
    }

    /// Starts kube-controller-manager (garbage collector and namespace controller; with a node
    /// also [`controller_manager::NODE_CONTROLLERS`], started with the control plane) unless
    /// it already runs. Its garbage collector discovers resource types about every 30 s, so
    /// call this after installing the CRDs whose objects must be collected.
    pub async fn ensure_controller_manager(&self) -> Result<(), ControlPlaneError> {
        self.controller_manager
            .get_or_try_init(|| async {
                let admin = kubeconfig::config(&self.kubeconfig)
                    .await
                    .map_err(ControlPlaneError::Kubeconfig)?;
                let launched = controller_manager::start(
                    &self.binaries.kube_controller_manager(),
                    self.dir.path(),
                    &self.kubeconfig,
                    &admin,
                    match self.options.nodes > 0 {
                        true => controller_manager::NODE_CONTROLLERS,
                        false => controller_manager::CONTROLLERS,
                    },
                    &self.pki.ca_cert,
                    self.options.timeout,
                )
                .await
                .map_err(ControlPlaneError::Launch)?;
                Ok(launched.process)
            })
            .await
            .map(drop)
    }

    /// Restarts kube-apiserver as a crash and a supervisor would: SIGKILL, then the same
    /// binary with the same flags on the same port, against the same etcd (which keeps running,
    /// so every object survives). Returns once `/readyz` answers again. Every client keeps
    /// working after it: the URL, CA and credentials are unchanged.
    pub async fn restart_apiserver(&self) -> Result<(), ControlPlaneError> {
        let admin = kubeconfig::config(&self.kubeconfig)
            .await
            .map_err(ControlPlaneError::Kubeconfig)?;
        apiserver::restart(
            &self.binaries.kube_apiserver(),
            self.dir.path(),
            &self.apiserver,
            self.apiserver_port,
            &admin,
            self.options.timeout,
        )
        .await
        .map_err(ControlPlaneError::Launch)
    }

    /// A client acting as the admin (`system:masters`), bound to the calling runtime.
    pub async fn client(&self) -> Result<kube::Client, ControlPlaneError> {
        kubeconfig::client(&self.kubeconfig)
            .await
            .map_err(ControlPlaneError::Kubeconfig)
    }

    /// The admin kubeconfig, usable by kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The environment a hostNetwork Pod's container needs to reach the apiserver with
    /// in-cluster configuration (`KUBERNETES_SERVICE_HOST` and `_PORT`: 127.0.0.1 and the
    /// apiserver's port; its token and CA come from the usual projected volume). Without it,
    /// in-cluster configuration names the `kubernetes` Service's ClusterIP, where nothing
    /// listens (no kube-proxy; with a node the ClusterIPs are on loopback, so the connection
    /// is refused).
    pub fn in_cluster_env(&self) -> Vec<k8s_openapi::api::core::v1::EnvVar> {
        [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_owned()),
            ("KUBERNETES_SERVICE_PORT", self.apiserver_port.to_string()),
        ]
        .into_iter()
        .map(|(name, value)| k8s_openapi::api::core::v1::EnvVar {
            name: name.to_owned(),
            value: Some(value),
            ..Default::default()
        })
        .collect()
    }

    /// The CA certificate (PEM) that signed the apiserver's serving certificate.
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// The file holding [`Self::ca_pem`].
    pub fn ca_cert_path(&self) -> &Path {
        &self.pki.ca_cert
    }

    /// The directory holding certificates, kubeconfigs, etcd data and component logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The kubectl binary built with the control plane.
    pub fn kubectl(&self) -> PathBuf {
        self.binaries.kubectl()
    }

    /// A kubectl command with `KUBECONFIG` set to the admin kubeconfig.
    pub fn kubectl_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(self.kubectl());
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// The first node (`127.0.0.1`), if this control plane was started with nodes
    /// ([`Options::nodes`]).
    pub fn node(&self) -> Option<&Node> {
        self.nodes.first()
    }

    /// The nodes, node `i` named and addressed `127.0.0.<i+1>`; empty without nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Imports an OCI image archive into every node's containerd at once (see
    /// [`Node::import_image`]). Returns each node's `ctr` output, in node order; the first
    /// failure is the error.
    pub async fn import_image_everywhere(&self, archive: &Path) -> Result<Vec<String>, NodeError> {
        futures::future::try_join_all(self.nodes.iter().map(|node| node.import_image(archive)))
            .await
    }

    /// Log files of the running components (the nodes' too), for diagnosing a failing test.
    pub fn logs(&self) -> Vec<PathBuf> {
        let mut logs = vec![
            self.etcd.log_path().to_path_buf(),
            self.apiserver.log_path().to_path_buf(),
        ];
        logs.extend(
            self.controller_manager
                .get()
                .map(|p| p.log_path().to_path_buf()),
        );
        logs.extend(self.scheduler.iter().map(|p| p.log_path().to_path_buf()));
        logs.extend(self.nodes.iter().flat_map(Node::logs));
        logs
    }

    /// Process ids of the running components (the nodes' containerd and kubelet, and the
    /// scheduler, too).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.etcd.pid(), self.apiserver.pid()];
        pids.extend(self.controller_manager.get().map(Process::pid));
        pids.extend(self.scheduler.iter().map(Process::pid));
        pids.extend(self.nodes.iter().flat_map(Node::pids));
        pids
    }

    /// Stops every component now, the scheduler and the nodes first (the shared instances
    /// never drop).
    pub fn kill(&self) {
        if let Some(scheduler) = &self.scheduler {
            scheduler.kill();
        }
        // Each blocks until its containers, mounts and cgroups are gone.
        for node in &self.nodes {
            node.stop();
        }
        if let Some(controller_manager) = self.controller_manager.get() {
            controller_manager.kill();
        }
        self.apiserver.kill();
        self.etcd.kill();
    }
}

/// The admin client configuration of `control_plane`, read from its kubeconfig.
async fn admin_config_for(control_plane: &ControlPlane) -> Result<kube::Config, ControlPlaneError> {
    kubeconfig::config(&control_plane.kubeconfig)
        .await
        .map_err(ControlPlaneError::Kubeconfig)
}
