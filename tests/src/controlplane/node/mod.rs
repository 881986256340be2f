//! Real nodes for the test control plane, so tests can run Pods: each node is a containerd
//! (with runc and the project's pause image) and a kubelet, and one kube-scheduler serves them
//! all, built from Go modules by `tests/node/build.sh` and started on loopback under the
//! control plane's directory.
//!
//! Ask for one with [`ControlPlane::with_node`](super::ControlPlane::with_node), for several
//! with [`ControlPlane::with_nodes`](super::ControlPlane::with_nodes) (or
//! `Options { nodes: n, .. }`); reach them with [`ControlPlane::node`](super::ControlPlane::node)
//! (the first) and [`ControlPlane::nodes`](super::ControlPlane::nodes). Node `i` is named and
//! addressed `127.0.0.<i+1>` ([`node_address`]; the first is [`NODE_NAME`]): hostNetwork Pods
//! are the only ones it runs (its CNI network is loopback alone), and their `podIP` is the
//! node's address, so two replicas that each bind `$(POD_IP):<port>` on different nodes do not
//! collide although all nodes share the host's network namespace. Images are never pulled
//! (every registry maps to a closed loopback port): import them with [`Node::import_image`]
//! (or [`ControlPlane::import_image_everywhere`](super::ControlPlane::import_image_everywhere))
//! and use `imagePullPolicy: Never` or `IfNotPresent`.
//!
//! Several nodes coexist on one host because each has its own directory (containerd's root,
//! state and sockets, kubelet's root directory, certificates, Pod logs), its own cgroup root,
//! and its own loopback address for kubelet's ports; what kubelet hard-codes is shared, and
//! kubelets start one at a time for it (`device_plugins.rs`).
//!
//! Stopping it (drop, or the control plane's exit handler) leaves nothing: see `teardown.rs`.

mod binaries;
mod cgroups;
mod containerd;
mod device_plugins;
mod images;
mod kubelet;
mod mounts;
mod ready;
mod scheduler;
mod sys;
mod teardown;

use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

pub use binaries::{NODE_BIN_DIR_ENV, NodeBinaries, NodeBinariesError};
pub use kubelet::{MAX_NODES, NODE_NAME, node_address};
pub(super) use teardown::sweep_stale;

use super::kubeconfig::{self, Credentials, KubeconfigError};
use super::launch::LaunchError;
use super::pki::{Pki, PkiError};
use super::process::Process;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("failed to locate the node's programs")]
    Binaries(#[source] NodeBinariesError),
    #[error("failed to prepare {path}")]
    Files {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to create the node's cgroup root")]
    Cgroups(#[source] io::Error),
    #[error("failed to create kubelet's certificate")]
    Pki(#[source] PkiError),
    #[error("failed to write kubelet's kubeconfig")]
    Kubeconfig(#[source] KubeconfigError),
    #[error("failed to start a node component")]
    Launch(#[source] LaunchError),
    #[error("a control plane has 1 to {MAX_NODES} nodes, not {0}")]
    Count(usize),
    #[error("failed to start kube-scheduler")]
    Scheduler(#[source] LaunchError),
    #[error("failed to import an image into the node's containerd: {0}")]
    Import(String),
    #[error(transparent)]
    NotReady(Box<NotReady>),
    #[error("a blocking start-up task failed")]
    Join(#[source] tokio::task::JoinError),
}

/// Why a node never got Ready, with the ends of kubelet's and containerd's logs.
#[derive(Debug, thiserror::Error)]
#[error(
    "the node {node} was not Ready within {timeout:?}: {last_seen}\n\
     end of {kubelet_log}:\n{kubelet_tail}\nend of {containerd_log}:\n{containerd_tail}"
)]
pub struct NotReady {
    pub node: String,
    pub timeout: Duration,
    pub last_seen: String,
    pub kubelet_log: PathBuf,
    pub kubelet_tail: String,
    pub containerd_log: PathBuf,
    pub containerd_tail: String,
}

/// What of the control plane a node needs to start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Context<'a> {
    /// The control plane's directory; the nodes' go below it (`node-127.0.0.<i+1>`).
    pub dir: &'a Path,
    pub pki: &'a Pki,
    pub server_url: &'a str,
    /// The admin kubeconfig, for the scheduler.
    pub admin_kubeconfig: &'a Path,
    pub admin: &'a kube::Config,
    pub timeout: Duration,
}

/// Starts kube-scheduler, one for all the nodes of a control plane (its log and certificates
/// in the control plane's directory), so that Pods of Deployments (no `nodeName`) land on
/// them. Killed when the returned process drops.
pub(super) async fn start_scheduler(context: Context<'_>) -> Result<Process, NodeError> {
    let binaries = tokio::task::spawn_blocking(NodeBinaries::locate)
        .await
        .map_err(NodeError::Join)?
        .map_err(NodeError::Binaries)?;
    let launched = scheduler::start(
        &binaries.bin("kube-scheduler"),
        context.dir,
        context.admin_kubeconfig,
        context.admin,
        context.timeout,
    )
    .await
    .map_err(NodeError::Scheduler)?;
    Ok(launched.process)
}

/// Starts nodes `0..count` at once (see [`Node::start`]): all Ready, or an error and none left
/// running.
pub(super) async fn start_nodes(
    context: Context<'_>,
    count: usize,
) -> Result<Vec<Node>, NodeError> {
    if !(1..=MAX_NODES).contains(&count) {
        return Err(NodeError::Count(count));
    }
    // Dropping the futures of the others when one fails stops what they started.
    futures::future::try_join_all((0..count).map(|index| Node::start(context, index))).await
}

/// A running node: containerd and kubelet, Ready for Pods (the control plane runs the
/// scheduler).
///
/// Stopped when dropped, or by [`Node::stop`] (idempotent).
#[derive(Debug)]
pub struct Node {
    name: String,
    address: Ipv4Addr,
    binaries: NodeBinaries,
    dir: PathBuf,
    containerd: containerd::Layout,
    cgroup_root: Option<cgroups::CgroupRoot>,
    processes: Mutex<Processes>,
}

/// The node's processes, taken out as they are stopped.
#[derive(Debug, Default)]
struct Processes {
    kubelet: Option<Process>,
    containerd: Option<Process>,
    /// Whether this node counts in `teardown::kubelet_host_dirs`.
    holds_kubelet_host_dirs: bool,
}

impl Node {
    /// Starts node `index` (named and addressed [`node_address`]`(index)`): containerd,
    /// imports the pause image, starts kubelet, and waits until the Node is Ready and
    /// untainted. On failure (or when the future is dropped), what was started is stopped.
    pub(super) async fn start(context: Context<'_>, index: usize) -> Result<Self, NodeError> {
        let started = Instant::now();
        let binaries = tokio::task::spawn_blocking(NodeBinaries::locate)
            .await
            .map_err(NodeError::Join)?
            .map_err(NodeError::Binaries)?;
        let address = node_address(index);
        let name = address.to_string();
        let dir = context
            .dir
            .join(format!("{}{name}", teardown::NODE_DIR_PREFIX));
        std::fs::create_dir_all(&dir).map_err(|source| NodeError::Files {
            path: dir.clone(),
            source,
        })?;
        // Roots left by node processes killed before their teardown.
        for (path, error) in cgroups::remove_stale() {
            eprintln!("node: stale cgroup {} not removed: {error}", path.display());
        }
        let layout = containerd::Layout::new(&dir);
        let mut node = Self {
            name,
            address,
            binaries,
            dir,
            containerd: layout,
            cgroup_root: None,
            processes: Mutex::new(Processes::default()),
        };
        node.cgroup_root = Some(cgroups::CgroupRoot::create().map_err(NodeError::Cgroups)?);
        node.start_components(context).await?;
        eprintln!(
            "node: {} Ready in {:.1} s (logs in {})",
            node.name,
            started.elapsed().as_secs_f64(),
            node.dir.display()
        );
        Ok(node)
    }

    async fn start_components(&self, context: Context<'_>) -> Result<(), NodeError> {
        let timeout = context.timeout;
        containerd::write_files(&self.binaries, &self.containerd, self.address).map_err(
            |source| NodeError::Files {
                path: self.containerd.dir.clone(),
                source,
            },
        )?;
        let containerd = containerd::start(&self.binaries, &self.containerd, timeout)
            .await
            .map_err(NodeError::Launch)?;
        self.lock().containerd = Some(containerd.process);
        self.import_image(&self.binaries.pause_archive()).await?;

        let kubeconfig = self.kubelet_kubeconfig(context)?;
        let cgroup_root = self
            .cgroup_root
            .as_ref()
            .map(cgroups::CgroupRoot::path)
            .unwrap_or_default();
        let paths = kubelet::Paths {
            address: self.address,
            dir: &self.dir,
            kubeconfig: &kubeconfig,
            containerd_socket: &self.containerd.socket,
        };
        {
            let mut processes = self.lock();
            teardown::kubelet_host_dirs::acquire();
            processes.holds_kubelet_host_dirs = true;
        }
        // One kubelet at a time until it listens on its device-plugin socket.
        let start_lock = device_plugins::StartLock::acquire(timeout)
            .await
            .map_err(|source| NodeError::Files {
                path: PathBuf::from(device_plugins::DIR),
                source,
            })?;
        let kubelet_started = SystemTime::now();
        let kubelet = kubelet::start(&self.binaries.bin("kubelet"), &paths, &cgroup_root, timeout)
            .await
            .map_err(NodeError::Launch)?;
        self.lock().kubelet = Some(kubelet.process);
        self.wait_for_device_plugin_socket(kubelet_started, timeout)
            .await?;
        drop(start_lock);

        let client = kube::Client::try_from(context.admin.clone()).map_err(|source| {
            NodeError::Kubeconfig(KubeconfigError::Client {
                path: context.admin_kubeconfig.to_path_buf(),
                source,
            })
        })?;
        ready::wait(client, &self.name, timeout, || self.check_alive())
            .await
            .map_err(|last_seen| self.not_ready(timeout, last_seen))
    }

    /// Waits until the kubelet started at `since` listens on its device-plugin registration
    /// socket (`device_plugins.rs`), it or containerd exits, or `timeout` passes.
    async fn wait_for_device_plugin_socket(
        &self,
        since: SystemTime,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !device_plugins::socket_made_since(since) {
            self.check_alive()
                .map_err(|died| self.not_ready(timeout, died))?;
            if tokio::time::Instant::now() >= deadline {
                let missing = format!("kubelet made no socket in {}", device_plugins::DIR);
                return Err(self.not_ready(timeout, missing));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// kubelet's kubeconfig: its own client certificate, `system:node:<address>`. The group is
    /// `system:masters` because the control plane authorizes with RBAC alone (no Node
    /// authorizer), under which no other group lets a kubelet do its work.
    fn kubelet_kubeconfig(&self, context: Context<'_>) -> Result<PathBuf, NodeError> {
        let cert = context
            .pki
            .client_cert(
                &format!("system:node:{}", self.name),
                &["system:masters"],
                "kubelet",
            )
            .map_err(NodeError::Pki)?;
        let path = self.dir.join("kubelet.kubeconfig");
        let credentials = Credentials::ClientCert {
            cert: &cert.cert,
            key: &cert.key,
        };
        kubeconfig::write(
            &path,
            context.server_url,
            &context.pki.ca_cert,
            "kubelet",
            credentials,
        )
        .map_err(NodeError::Kubeconfig)?;
        Ok(path)
    }

    /// `Err` naming the first of containerd and kubelet that exited, with its log tail.
    fn check_alive(&self) -> Result<(), String> {
        let processes = self.lock();
        for (name, process) in [
            ("containerd", &processes.containerd),
            ("kubelet", &processes.kubelet),
        ] {
            if let Some(status) = process.as_ref().and_then(Process::exit_status) {
                let tail = process.as_ref().map(Process::log_tail).unwrap_or_default();
                return Err(format!("{name} exited ({status}); end of its log:\n{tail}"));
            }
        }
        Ok(())
    }

    fn not_ready(&self, timeout: Duration, last_seen: String) -> NodeError {
        let processes = self.lock();
        let log = |process: &Option<Process>| {
            process.as_ref().map_or_else(
                || (PathBuf::new(), String::new()),
                |p| (p.log_path().to_path_buf(), p.log_tail()),
            )
        };
        let (kubelet_log, kubelet_tail) = log(&processes.kubelet);
        let (containerd_log, containerd_tail) = log(&processes.containerd);
        NodeError::NotReady(Box::new(NotReady {
            node: self.name.clone(),
            timeout,
            last_seen,
            kubelet_log,
            kubelet_tail,
            containerd_log,
            containerd_tail,
        }))
    }

    /// Imports an OCI image archive (e.g. an operator image built as an OCI tarball) into the
    /// node's containerd, where kubelet finds it by the name the archive gives it
    /// (`io.containerd.image.name`, or `org.opencontainers.image.ref.name`). Returns ctr's
    /// output, which names the images imported.
    pub async fn import_image(&self, archive: &Path) -> Result<String, NodeError> {
        let started = Instant::now();
        let output = images::import(&self.binaries.bin("ctr"), &self.containerd.socket, archive)
            .await
            .map_err(NodeError::Import)?;
        eprintln!(
            "node: {}: imported {} in {:.1} s",
            self.name,
            archive.display(),
            started.elapsed().as_secs_f64()
        );
        Ok(output)
    }

    /// The Node's name (and address): `127.0.0.<i+1>` for node `i`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address, its name as an IP: the `hostIP` of its Pods and the `podIP` of its
    /// hostNetwork Pods.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The pause image's name, present on every node: a program that waits for SIGTERM, as
    /// non-root (65535), for Pods that only need to run.
    pub fn pause_image(&self) -> &str {
        self.binaries.pause_image()
    }

    pub fn binaries(&self) -> &NodeBinaries {
        &self.binaries
    }

    /// The node's directory (containerd's and kubelet's files and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's own cgroup root as kubelet names it (`/vmop-node-<pid>-<n>`, a directory of
    /// that name in each cgroup hierarchy), gone once the node stopped.
    pub fn cgroup_root(&self) -> Option<String> {
        self.cgroup_root.as_ref().map(cgroups::CgroupRoot::path)
    }

    /// containerd's socket, for `ctr --address` or a CRI client.
    pub fn containerd_socket(&self) -> &Path {
        &self.containerd.socket
    }

    /// A `ctr` command talking to the node's containerd in the CRI namespace (`k8s.io`).
    pub fn ctr_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(self.binaries.bin("ctr"));
        command
            .arg(format!("--address={}", self.containerd.socket.display()))
            .args(["--namespace", "k8s.io"]);
        command
    }

    /// Log files of containerd and kubelet.
    pub fn logs(&self) -> Vec<PathBuf> {
        let processes = self.lock();
        [&processes.containerd, &processes.kubelet]
            .into_iter()
            .flatten()
            .map(|p| p.log_path().to_path_buf())
            .collect()
    }

    /// The ends of kubelet's and containerd's logs, for the error of a test whose Pod did not
    /// start.
    pub fn log_tails(&self) -> String {
        let processes = self.lock();
        [
            ("kubelet", &processes.kubelet),
            ("containerd", &processes.containerd),
        ]
        .into_iter()
        .filter_map(|(name, process)| process.as_ref().map(|p| (name, p)))
        .map(|(name, p)| {
            format!(
                "end of {name}'s log {}:\n{}",
                p.log_path().display(),
                p.log_tail()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// Process ids of containerd and kubelet (not of the shims and containers).
    pub fn pids(&self) -> Vec<u32> {
        let processes = self.lock();
        [&processes.containerd, &processes.kubelet]
            .into_iter()
            .flatten()
            .map(Process::pid)
            .collect()
    }

    /// Stops the node and removes everything it made (see `teardown.rs`); the node's
    /// directory itself goes with the control plane's. Idempotent; blocks for up to a few
    /// seconds per container.
    pub fn stop(&self) {
        let mut processes = self.lock();
        let running = processes.containerd.is_some() || processes.kubelet.is_some();
        if let Some(kubelet) = processes.kubelet.take() {
            kubelet.kill();
        }
        let state = self.containerd.dir.join("state");
        let shim_sockets = teardown::shim_sockets(&state);
        let mut problems = Vec::new();
        if let Some(containerd) = processes.containerd.take() {
            if containerd.exit_status().is_none() {
                problems.extend(teardown::remove_containers(
                    &self.binaries.bin("ctr"),
                    &self.containerd.socket,
                ));
            }
            teardown::kill_shims_mentioning(&self.containerd.socket.display().to_string());
            containerd.kill();
        }
        problems.extend(teardown::release(&self.dir, self.cgroup_root.as_ref()));
        teardown::remove_shim_sockets(&shim_sockets);
        teardown::remove_log_links(&self.dir);
        if std::mem::take(&mut processes.holds_kubelet_host_dirs) {
            teardown::kubelet_host_dirs::release();
        }
        if running && !problems.is_empty() {
            eprintln!(
                "node: {}: teardown left: {}",
                self.name,
                problems.join("; ")
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Processes> {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}
