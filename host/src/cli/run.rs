//! `vmop run`: the operator, against the cluster in `KUBECONFIG` (or `~/.kube/config`) or the
//! in-cluster service account.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::controller::{self, Options};
use crate::plugin::{CallLimits, EngineConfig, PluginEngine, PluginRegistry, RegistryConfig};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Directory of the plugin files that ProviderConfigs name in `spec.plugin.path`.
    #[arg(long, env = "VMOP_PLUGIN_DIR", default_value = "/plugins")]
    pub plugin_dir: PathBuf,

    /// Writable directory for precompiled plugins (keyed by digest and engine); without it,
    /// every start compiles every plugin.
    #[arg(long, env = "VMOP_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Watch VirtualMachines in this namespace only (default: all namespaces).
    #[arg(long, env = "VMOP_WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// The operator's own namespace: the only one whose Secrets it reads. Defaults to the
    /// namespace of the kubeconfig context or of the in-cluster service account.
    #[arg(long, env = "POD_NAMESPACE")]
    pub operator_namespace: Option<String>,

    /// Reconciles running at once, per resource kind (0: unbounded). The same object is never
    /// reconciled twice at once.
    #[arg(long, env = "VMOP_MAX_CONCURRENT_RECONCILES", default_value_t = 16)]
    pub max_concurrent_reconciles: u16,

    /// How often every VM is re-checked with the provider (drift detection), jittered by 10%.
    /// Units: ms, s, m, h.
    #[arg(long, env = "VMOP_RESYNC_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub resync_period: Duration,

    /// How often a VM on its way (provisioning, deleting) is re-checked.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub poll_interval: Duration,

    /// How often loaded plugin files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub plugin_poll_interval: Duration,

    /// Plugin instances alive at once across all ProviderConfigs (bounds the sum of their
    /// `maxConcurrentCalls`).
    #[arg(long, default_value_t = 64)]
    pub max_plugin_instances: u32,

    /// Handle only ProviderConfigs with these labels (e.g. `vmop.dev/shard=a`), so that several
    /// operators can share a cluster; VMs naming another ProviderConfig report it as not found.
    #[arg(long, env = "VMOP_PROVIDER_CONFIG_SELECTOR")]
    pub provider_config_selector: Option<String>,

    /// `reportingInstance` of the Events the operator writes (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub instance: Option<String>,

    /// Test hook: exit right after a successful create, before recording it.
    #[arg(long, env = "VMOP_TEST_EXIT_AFTER_CREATE", hide = true)]
    pub exit_after_create: bool,
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("failed to build a Kubernetes client from KUBECONFIG or the in-cluster config")?;
    let operator_namespace = args
        .operator_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());

    let engine = PluginEngine::new(&EngineConfig {
        max_instances: args.max_plugin_instances,
        ..EngineConfig::default()
    })?;
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: args.plugin_dir.clone(),
            cache_dir: args.cache_dir.clone(),
            info_limits: CallLimits::default(),
        },
    )
    .with_context(|| {
        format!(
            "failed to open the plugin directory {}",
            args.plugin_dir.display()
        )
    })?;
    let watcher = registry.watch(args.plugin_poll_interval);

    let mut options = Options::new(operator_namespace);
    options.resync_period = args.resync_period;
    options.poll_interval = args.poll_interval;
    options.exit_after_create = args.exit_after_create;
    let config = controller::Config {
        namespace: args.namespace,
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        provider_config_selector: args.provider_config_selector,
        instance: args.instance,
        options,
    };
    tracing::info!(plugin_dir = %args.plugin_dir.display(), "starting vmop");
    let result = controller::run(client, registry, config, shutdown_signal()).await;
    watcher.abort();
    result?;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on SIGTERM (how Kubernetes stops a pod) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    tracing::info!("shutdown requested; finishing the reconciles in flight");
}

/// `<integer><unit>` with unit `ms`, `s`, `m` or `h` (seconds without a unit).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("invalid duration {s:?}: use ms, s, m or h")),
    };
    if d.is_zero() {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("m").is_err());
    }
}
