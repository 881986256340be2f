//! `vmop run` as the demo's child process, with readable text logs in a file.
//!
//! It runs in its own process group, so a terminal's Ctrl-C reaches only the demo, which then
//! stops the operator first (SIGTERM, then SIGKILL after a grace period) and the rest after it.
//! If the demo dies without stopping it, the kernel kills it (`PR_SET_PDEATHSIG`).

use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context as _;

/// How much of the end of the log an error message quotes.
const LOG_TAIL_BYTES: u64 = 6000;

/// Where and how to start the operator.
#[derive(Debug)]
pub struct Launch<'a> {
    pub bin: &'a Path,
    pub kubeconfig: &'a Path,
    pub plugin_dir: &'a Path,
    pub cache_dir: &'a Path,
    pub operator_namespace: &'a str,
    pub metrics_addr: SocketAddr,
    pub log: PathBuf,
}

/// The running operator.
#[derive(Debug)]
pub struct Operator {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Launch<'_> {
    /// Spawns the operator. Must be called from a thread that lives as long as the demo (the
    /// main thread): the kernel kills the child when the thread that forked it exits.
    pub fn start(self) -> anyhow::Result<Operator> {
        let log = std::fs::File::create(&self.log)
            .with_context(|| format!("failed to create {}", self.log.display()))?;
        let stdout = log
            .try_clone()
            .with_context(|| format!("failed to reopen {}", self.log.display()))?;
        let mut command = tokio::process::Command::new(self.bin);
        command
            .args(["--log-format", "text", "run"])
            .arg("--plugin-dir")
            .arg(self.plugin_dir)
            .arg("--cache-dir")
            .arg(self.cache_dir)
            .args(["--operator-namespace", self.operator_namespace])
            .arg("--metrics-addr")
            .arg(self.metrics_addr.to_string())
            // Snappy on a local EC2 API: re-check machines on their way every second, and
            // notice an instance terminated behind the operator's back within half a minute.
            .args(["--poll-interval", "1s", "--resync-period", "30s"])
            .env("KUBECONFIG", self.kubeconfig)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .kill_on_drop(true);
        vmop_tests::child::die_with_parent(command.as_std_mut(), vmop_tests::child::Group::Own);
        let child = command
            .spawn()
            .with_context(|| format!("failed to start {}", self.bin.display()))?;
        Ok(Operator {
            child,
            log: self.log,
        })
    }
}

impl Operator {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status if the operator has ended, without blocking.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .context("failed to check whether the operator is running")
    }

    /// Resolves when the operator exits by itself.
    pub async fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        self.child
            .wait()
            .await
            .context("failed to wait for the operator")
    }

    /// The end of the operator's log, for error messages.
    pub fn log_tail(&self) -> String {
        let read = || -> io::Result<String> {
            let mut file = std::fs::File::open(&self.log)?;
            let len = file.metadata()?.len();
            file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        read().unwrap_or_else(|error| format!("<cannot read {}: {error}>", self.log.display()))
    }

    /// Asks the operator to shut down (SIGTERM) and waits up to `grace`, then kills it.
    pub async fn stop(&mut self, grace: Duration) -> anyhow::Result<()> {
        if self.exited()?.is_some() {
            return Ok(());
        }
        if let Some(pid) = self.pid() {
            terminate(pid);
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            eprintln!("demo: the operator did not stop within {grace:?} of SIGTERM; killing it");
            self.child
                .kill()
                .await
                .context("failed to kill the operator")?;
        }
        Ok(())
    }
}

/// Sends SIGTERM; an error only means the process is already gone.
#[allow(unsafe_code)]
fn terminate(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: `kill` has no memory-safety preconditions; `pid` is our own unreaped child, so
    // the id cannot have been reused by another process.
    let _ = unsafe { libc::kill(pid, libc::SIGTERM) };
}
