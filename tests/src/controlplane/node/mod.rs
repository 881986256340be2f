//! A real node for the test control plane, so tests can run Pods: containerd (with runc and
//! the project's pause image), kubelet and kube-scheduler, built from Go modules by
//! `tests/node/build.sh` and started on loopback under the control plane's directory.
//!
//! Ask for it with [`ControlPlane::with_node`](super::ControlPlane::with_node) (or
//! `Options { node: true, .. }`); reach it with [`ControlPlane::node`](super::ControlPlane::node).
//! The node is named and addressed `127.0.0.1` ([`NODE_NAME`]): hostNetwork Pods are the only
//! ones it runs (its CNI network is loopback alone), and their `podIP` is 127.0.0.1. Images are
//! never pulled (every registry maps to a closed loopback port): import them with
//! [`Node::import_image`] and use `imagePullPolicy: Never` or `IfNotPresent`.
//!
//! Stopping it (drop, or the control plane's exit handler) leaves nothing: see `teardown.rs`.

mod binaries;
mod cgroups;
mod containerd;
mod images;
mod kubelet;
mod mounts;
mod ready;
mod scheduler;
mod sys;
mod teardown;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use binaries::{NODE_BIN_DIR_ENV, NodeBinaries, NodeBinariesError};
pub use kubelet::NODE_NAME;
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
    #[error("failed to import an image into the node's containerd: {0}")]
    Import(String),
    #[error(transparent)]
    NotReady(Box<NotReady>),
    #[error("a blocking start-up task failed")]
    Join(#[source] tokio::task::JoinError),
}

/// Why the node never got Ready, with the ends of kubelet's and containerd's logs.
#[derive(Debug, thiserror::Error)]
#[error(
    "the node {NODE_NAME} was not Ready within {timeout:?}: {last_seen}\n\
     end of {kubelet_log}:\n{kubelet_tail}\nend of {containerd_log}:\n{containerd_tail}"
)]
pub struct NotReady {
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
    /// The control plane's directory; the node's goes below it.
    pub dir: &'a Path,
    pub pki: &'a Pki,
    pub server_url: &'a str,
    /// The admin kubeconfig, for the scheduler.
    pub admin_kubeconfig: &'a Path,
    pub admin: &'a kube::Config,
    pub timeout: Duration,
}

/// A running node: containerd, kubelet and kube-scheduler, Ready for Pods.
///
/// Stopped when dropped, or by [`Node::stop`] (idempotent).
#[derive(Debug)]
pub struct Node {
    binaries: NodeBinaries,
    dir: PathBuf,
    containerd: containerd::Layout,
    cgroup_root: Option<cgroups::CgroupRoot>,
    processes: Mutex<Processes>,
}

/// The node's processes, taken out as they are stopped.
#[derive(Debug, Default)]
struct Processes {
    scheduler: Option<Process>,
    kubelet: Option<Process>,
    containerd: Option<Process>,
    /// Whether this node counts in `teardown::kubelet_host_dirs`.
    holds_kubelet_host_dirs: bool,
}

impl Node {
    /// Starts containerd, imports the pause image, starts kubelet and kube-scheduler, and
    /// waits until the Node is Ready and untainted. On failure, what was started is stopped.
    pub(super) async fn start(context: Context<'_>) -> Result<Self, NodeError> {
        let started = Instant::now();
        let binaries = tokio::task::spawn_blocking(NodeBinaries::locate)
            .await
            .map_err(NodeError::Join)?
            .map_err(NodeError::Binaries)?;
        let dir = context.dir.join("node");
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
            binaries,
            dir,
            containerd: layout,
            cgroup_root: None,
            processes: Mutex::new(Processes::default()),
        };
        node.cgroup_root = Some(cgroups::CgroupRoot::create().map_err(NodeError::Cgroups)?);
        node.start_components(context).await?;
        eprintln!(
            "node: {NODE_NAME} Ready in {:.1} s (logs in {})",
            started.elapsed().as_secs_f64(),
            node.dir.display()
        );
        Ok(node)
    }

    async fn start_components(&self, context: Context<'_>) -> Result<(), NodeError> {
        let timeout = context.timeout;
        containerd::write_files(&self.binaries, &self.containerd).map_err(|source| {
            NodeError::Files {
                path: self.containerd.dir.clone(),
                source,
            }
        })?;
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
            dir: &self.dir,
            kubeconfig: &kubeconfig,
            containerd_socket: &self.containerd.socket,
        };
        {
            let mut processes = self.lock();
            teardown::kubelet_host_dirs::acquire();
            processes.holds_kubelet_host_dirs = true;
        }
        let kubelet = kubelet::start(&self.binaries.bin("kubelet"), &paths, &cgroup_root, timeout)
            .await
            .map_err(NodeError::Launch)?;
        self.lock().kubelet = Some(kubelet.process);
        let scheduler = scheduler::start(
            &self.binaries.bin("kube-scheduler"),
            &self.dir,
            context.admin_kubeconfig,
            context.admin,
            timeout,
        )
        .await
        .map_err(NodeError::Launch)?;
        self.lock().scheduler = Some(scheduler.process);

        let client = kube::Client::try_from(context.admin.clone()).map_err(|source| {
            NodeError::Kubeconfig(KubeconfigError::Client {
                path: context.admin_kubeconfig.to_path_buf(),
                source,
            })
        })?;
        ready::wait(client, NODE_NAME, timeout, || self.check_alive())
            .await
            .map_err(|last_seen| self.not_ready(timeout, last_seen))
    }

    /// kubelet's kubeconfig: its own client certificate, `system:node:127.0.0.1`. The group is
    /// `system:masters` because the control plane authorizes with RBAC alone (no Node
    /// authorizer), under which no other group lets a kubelet do its work.
    fn kubelet_kubeconfig(&self, context: Context<'_>) -> Result<PathBuf, NodeError> {
        let cert = context
            .pki
            .client_cert(
                &format!("system:node:{NODE_NAME}"),
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
            "node: imported {} in {:.1} s",
            archive.display(),
            started.elapsed().as_secs_f64()
        );
        Ok(output)
    }

    /// The Node's name (and address): `127.0.0.1`.
    pub fn name(&self) -> &str {
        NODE_NAME
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

    /// Log files of containerd, kubelet and kube-scheduler.
    pub fn logs(&self) -> Vec<PathBuf> {
        let processes = self.lock();
        [
            &processes.containerd,
            &processes.kubelet,
            &processes.scheduler,
        ]
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

    /// Process ids of containerd, kubelet and kube-scheduler (not of the shims and containers).
    pub fn pids(&self) -> Vec<u32> {
        let processes = self.lock();
        [
            &processes.containerd,
            &processes.kubelet,
            &processes.scheduler,
        ]
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
        if let Some(scheduler) = processes.scheduler.take() {
            scheduler.kill();
        }
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
            eprintln!("node: teardown left: {}", problems.join("; "));
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
