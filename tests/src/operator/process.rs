//! `vmop run` as a child process: started with its JSON log in a file, killed when dropped or
//! when the test process dies, and its plugin calls counted from the log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::DEADLINE;
use super::scrape::{Scrape, scrape};

/// The operator's log filter (`RUST_LOG`) unless a test sets its own: info, and each plugin
/// call at debug (what [`Operator::provider_calls`] reads).
pub const LOG_FILTER: &str = "info,vmop::provider_call=debug";

/// Set (to anything) to keep each operator's log after its test, and print where it is: the
/// way to read what an operator did in a test that failed.
pub const KEEP_LOGS: &str = "VMOP_TEST_KEEP_LOGS";

/// How to start an [`Operator`].
#[derive(Debug, Clone)]
pub struct OperatorArgs {
    pub kubeconfig: PathBuf,
    pub plugin_dir: PathBuf,
    /// Watched namespace and operator namespace.
    pub namespace: String,
    pub selector: String,
    /// Extra `vmop run` flags.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl OperatorArgs {
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args_from<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts `vmop run` from `bin` (`env!("CARGO_BIN_EXE_vmop-operator")` in a test).
    pub fn start(&self, bin: &Path) -> anyhow::Result<Operator> {
        let mut log_dir = tempfile::Builder::new()
            .prefix("vmop-operator-")
            .tempdir()?;
        let log_path = log_dir.path().join("operator.log");
        if std::env::var_os(KEEP_LOGS).is_some() {
            log_dir.disable_cleanup(true);
            eprintln!("{}: operator log {}", self.namespace, log_path.display());
        }
        let log = std::fs::File::create(&log_path)?;
        let mut command = tokio::process::Command::new(bin);
        command
            .args(["--log-format", "json", "run"])
            .arg("--plugin-dir")
            .arg(&self.plugin_dir)
            .args(["--namespace", &self.namespace])
            .args(["--operator-namespace", &self.namespace])
            .args(["--provider-config-selector", &self.selector])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", LOG_FILTER)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        crate::child::die_with_parent(command.as_std_mut(), crate::child::Group::Inherit);
        let child = command
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        Ok(Operator {
            child,
            log_path,
            _log_dir: log_dir,
        })
    }
}

/// `vmop run` as a child process; killed when dropped.
#[derive(Debug)]
pub struct Operator {
    child: tokio::process::Child,
    log_path: PathBuf,
    _log_dir: tempfile::TempDir,
}

/// One plugin call the operator logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCall {
    /// When the call ended (RFC 3339, from the log line).
    pub timestamp: String,
    pub provider: String,
    pub vm: String,
    pub op: String,
    pub outcome: String,
    /// How long the call took (from its start to the log line's `timestamp`).
    pub elapsed_ms: u64,
}

/// The plugin calls in a JSON log (`vmop::provider_call` debug lines): a child process's, or a
/// Pod's as `kubectl logs` shows it.
pub fn provider_calls_in(log: &str) -> Vec<ProviderCall> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v.get("target").and_then(|t| t.as_str()) == Some("vmop::provider_call"))
        .filter_map(|v| {
            let fields = v.get("fields")?;
            let field = |k: &str| {
                fields
                    .get(k)
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            Some(ProviderCall {
                timestamp: v
                    .get("timestamp")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_owned(),
                provider: field("provider"),
                vm: field("vm"),
                op: field("op"),
                outcome: field("outcome"),
                elapsed_ms: fields
                    .get("elapsed_ms")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
            })
        })
        .collect()
}

impl ProviderCall {
    /// When the call started: its log line's time less how long it took. A call in flight when
    /// its process froze ends after the freeze; it started before.
    pub fn started(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let end: k8s_openapi::jiff::Timestamp = self.timestamp.parse().ok()?;
        let elapsed = i64::try_from(self.elapsed_ms).ok()?;
        end.checked_sub(k8s_openapi::jiff::SignedDuration::from_millis(elapsed))
            .ok()
    }

    /// The VM's name (the log names it `namespace/name`).
    pub fn vm_name(&self) -> &str {
        self.vm.rsplit('/').next().unwrap_or_default()
    }
}

impl Operator {
    /// Waits for the process to exit by itself.
    pub async fn wait_exit(&mut self) -> anyhow::Result<ExitStatus> {
        match tokio::time::timeout(DEADLINE, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => bail!(
                "the operator did not exit within {DEADLINE:?}; log:\n{}",
                self.log()
            ),
        }
    }

    /// Sends `signal` (a name `kill -s` knows: `TERM`, `STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.child.id().context("the operator has exited")?;
        let status = std::process::Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .context("failed to run kill")?;
        anyhow::ensure!(status.success(), "kill -s {signal} {pid} failed: {status}");
        Ok(())
    }

    /// Stops the process as Kubernetes stops a Pod (SIGTERM) and waits for it to exit.
    pub async fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal("TERM")?;
        self.wait_exit().await
    }

    /// Kills the process and waits for it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Everything the operator logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The plugin calls logged so far (`vmop::provider_call` debug lines).
    pub fn provider_calls(&self) -> Vec<ProviderCall> {
        provider_calls_in(&self.log())
    }

    /// Plugin calls made for VM `name` (in the test namespace).
    pub fn calls_for(&self, name: &str) -> Vec<ProviderCall> {
        self.provider_calls()
            .into_iter()
            .filter(|c| c.vm.rsplit('/').next() == Some(name))
            .collect()
    }

    /// Where the operator serves `/metrics` (it binds a free port), from the log line announcing
    /// it; waits for that line.
    pub async fn metrics_addr(&self) -> anyhow::Result<SocketAddr> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let addr = self.log().lines().find_map(|line| {
                let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
                let fields = v.get("fields")?;
                if fields.get("message")?.as_str()? != "serving /metrics, /healthz and /readyz" {
                    return None;
                }
                fields.get("local_addr")?.as_str()?.parse().ok()
            });
            if let Some(addr) = addr {
                return Ok(addr);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "the operator never logged its metrics address; log:\n{}",
                    self.log()
                );
            }
        }
    }

    /// Scrapes `/metrics` until `condition` holds for the scrape.
    pub async fn wait_metrics(
        &self,
        what: &str,
        condition: impl Fn(&Scrape) -> bool,
    ) -> anyhow::Result<Scrape> {
        let addr = self.metrics_addr().await?;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let metrics = scrape(addr).await?;
            if condition(&metrics) {
                return Ok(metrics);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "the operator's metrics never satisfied: {what}; last scrape:\n{}",
                    metrics.text
                );
            }
        }
    }

    /// One scrape of `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<Scrape> {
        scrape(self.metrics_addr().await?).await
    }

    /// Waits until `condition` holds for the logged plugin calls, polling the log file.
    pub async fn wait_calls(
        &self,
        what: &str,
        condition: impl Fn(&[ProviderCall]) -> bool,
    ) -> anyhow::Result<Vec<ProviderCall>> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let calls = self.provider_calls();
            if condition(&calls) {
                return Ok(calls);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the operator's plugin calls never satisfied: {what}; calls: {calls:#?}");
            }
        }
    }
}
