//! Starting one component: pick free ports, spawn it, wait until a readiness probe passes.
//! When the component lost a port race (it exits saying the address is in use), start it
//! again on new ports.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ports;
use super::process::{Process, ProcessError};

/// Attempts per component before a port race is reported as an error.
const MAX_ATTEMPTS: usize = 4;
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Bound on one probe, so a hung connection cannot eat the whole deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("failed to find a free loopback port for {name}")]
    Port {
        name: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("failed to start {name}")]
    Spawn {
        name: &'static str,
        #[source]
        source: ProcessError,
    },
    #[error("{name} exited ({status}) before it was ready; end of {log}:\n{tail}")]
    Exited {
        name: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "{name} was not ready within {timeout:?} (last probe: {last_probe}); end of {log}:\n{tail}"
    )]
    Timeout {
        name: &'static str,
        timeout: Duration,
        last_probe: String,
        log: PathBuf,
        tail: String,
    },
}

/// What to start and how to tell it is ready.
#[derive(Debug)]
pub struct Component<'a> {
    pub name: &'static str,
    pub program: &'a Path,
    pub log: PathBuf,
    /// How many free ports its arguments need.
    pub ports: usize,
    pub timeout: Duration,
}

/// A started, ready component and the ports it was given.
#[derive(Debug)]
pub struct Launched {
    pub process: Process,
    pub ports: Vec<u16>,
}

impl Component<'_> {
    /// Starts the component with `args(ports)` and waits until `probe(ports)` succeeds. A probe
    /// failure is a description of what is not ready yet.
    pub async fn launch<Args, Probe, Fut>(
        &self,
        args: Args,
        mut probe: Probe,
    ) -> Result<Launched, LaunchError>
    where
        Args: Fn(&[u16]) -> Vec<OsString>,
        Probe: FnMut(Vec<u16>) -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let name = self.name;
        let mut attempt = 1;
        loop {
            let ports = (0..self.ports)
                .map(|_| ports::free_port())
                .collect::<io::Result<Vec<_>>>()
                .map_err(|source| LaunchError::Port { name, source })?;
            let started = Instant::now();
            eprintln!("controlplane: starting {name} (ports {ports:?})");
            let process = Process::spawn(self.program, args(&ports), self.log.clone())
                .map_err(|source| LaunchError::Spawn { name, source })?;
            match self.wait_ready(&process, || probe(ports.clone())).await {
                Ok(()) => {
                    eprintln!(
                        "controlplane: {name} ready in {:.1} s (pid {}, log {})",
                        started.elapsed().as_secs_f64(),
                        process.pid(),
                        self.log.display()
                    );
                    return Ok(Launched { process, ports });
                }
                Err(LaunchError::Exited { tail, .. })
                    if attempt < MAX_ATTEMPTS && ports::is_bind_failure(&tail) =>
                {
                    eprintln!("controlplane: {name} lost a race for its ports; retrying");
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Waits until `probe` succeeds for `process` (already started), it exits, or the timeout
    /// passes.
    pub(super) async fn wait_ready<Probe, Fut>(
        &self,
        process: &Process,
        mut probe: Probe,
    ) -> Result<(), LaunchError>
    where
        Probe: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            if let Some(status) = process.exit_status() {
                return Err(LaunchError::Exited {
                    name: self.name,
                    status: status.to_string(),
                    log: self.log.clone(),
                    tail: process.log_tail(),
                });
            }
            let last_probe = match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(not_ready)) => not_ready,
                Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(LaunchError::Timeout {
                    name: self.name,
                    timeout: self.timeout,
                    last_probe,
                    log: self.log.clone(),
                    tail: process.log_tail(),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// Joins arguments given as `&str` and `String` into what [`Process::spawn`] takes.
pub fn args<I, S>(items: I) -> Vec<OsString>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    items.into_iter().map(Into::into).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component run by `sh -c script` in `dir`, ready once the file `ready` exists there.
    async fn launch_script(dir: &Path, script: &str) -> Result<Launched, LaunchError> {
        let component = Component {
            name: "fake",
            program: Path::new("/bin/sh"),
            log: dir.join("fake.log"),
            ports: 1,
            timeout: Duration::from_secs(10),
        };
        let ready = dir.join("ready");
        component
            .launch(
                |_| args(["-c".to_owned(), format!("cd {} && {script}", dir.display())]),
                |_| {
                    let ready = ready.clone();
                    async move {
                        match ready.exists() {
                            true => Ok(()),
                            false => Err("no ready file".to_owned()),
                        }
                    }
                },
            )
            .await
    }

    #[tokio::test]
    async fn a_lost_port_race_is_retried_on_new_ports() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let script = "if [ -e tried ]; then touch ready; exec sleep 60; \
                      else touch tried; echo 'bind: address already in use'; exit 1; fi";
        let launched = launch_script(dir.path(), script).await?;
        anyhow::ensure!(launched.process.exit_status().is_none(), "not running");
        Ok(())
    }

    #[tokio::test]
    async fn an_early_exit_reports_the_end_of_the_log() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let script = "echo attempt >> attempts; echo 'fatal: no etcd'; exit 3";
        match launch_script(dir.path(), script).await {
            Err(LaunchError::Exited { tail, status, .. }) => {
                anyhow::ensure!(tail.contains("fatal: no etcd"), "tail {tail:?}");
                anyhow::ensure!(status.contains('3'), "status {status:?}");
            }
            other => anyhow::bail!("expected an early exit, got {other:?}"),
        }
        let attempts = std::fs::read_to_string(dir.path().join("attempts"))?;
        anyhow::ensure!(attempts.lines().count() == 1, "retried: {attempts:?}");
        Ok(())
    }

    #[tokio::test]
    async fn endless_port_races_give_up() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let script = "echo attempt >> attempts; echo 'bind: address already in use'; exit 1";
        let result = launch_script(dir.path(), script).await;
        anyhow::ensure!(
            matches!(result, Err(LaunchError::Exited { .. })),
            "got {result:?}"
        );
        let attempts = std::fs::read_to_string(dir.path().join("attempts"))?;
        anyhow::ensure!(attempts.lines().count() == MAX_ATTEMPTS, "{attempts:?}");
        Ok(())
    }

    #[tokio::test]
    async fn a_component_never_ready_times_out_with_its_log() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let component = Component {
            name: "stuck",
            program: Path::new("/bin/sh"),
            log: dir.path().join("stuck.log"),
            ports: 0,
            timeout: Duration::from_millis(300),
        };
        let log = component.log.clone();
        let result = component
            .launch(
                |_| args(["-c", "echo waiting for godot; exec sleep 60"]),
                // Fails only once the line is logged, so the deadline passes after it.
                |_| {
                    let log = log.clone();
                    async move {
                        while !crate::controlplane::process::log_tail(&log).contains("godot") {
                            tokio::time::sleep(POLL_INTERVAL).await;
                        }
                        Err("never".to_owned())
                    }
                },
            )
            .await;
        match result {
            Err(LaunchError::Timeout {
                tail, last_probe, ..
            }) => {
                anyhow::ensure!(tail.contains("waiting for godot"), "tail {tail:?}");
                anyhow::ensure!(last_probe == "never", "last probe {last_probe:?}");
                Ok(())
            }
            other => anyhow::bail!("expected a timeout, got {other:?}"),
        }
    }
}
