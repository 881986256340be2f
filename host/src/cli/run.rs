//! `vmop run`: the operator, against the cluster in `KUBECONFIG` (or `~/.kube/config`) or the
//! in-cluster service account.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use futures::FutureExt;

use crate::api::duration;
use crate::controller::{self, Options};
use crate::leader::layout::{self, Layout};
use crate::leader::shards::ShardConfig;
use crate::leader::{LeaderElector, LeaseConfig, default_identity};
use crate::telemetry::health::Readiness;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::server::{self, ServerState};
use vmop_runtime::precompile::{CHILD_DEADLINE, Compiler};
use vmop_runtime::{CallLimits, EngineConfig, PluginEngine, PluginRegistry, RegistryConfig};

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

    /// This cluster's identity, marked on every machine vmop makes so that a listing of the
    /// cloud tells this cluster's machines from another's (default: the uid of namespace
    /// `kube-system`). Every replica must use the same value; changing it makes the machines
    /// already made look like another cluster's (never this one's orphans).
    #[arg(long, env = "VMOP_CLUSTER_ID", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub cluster_id: Option<String>,

    /// `auto`: keep one listing of the cloud per ProviderConfig whose plugin can `list`
    /// (contract 0.3), refreshed every resync period, from which drift checks read their
    /// machine and orphans are found; `off`: one `get` per VM per period, and no orphan report.
    #[arg(long, env = "VMOP_CLOUD_VIEW", value_enum, default_value_t = CloudView::Auto)]
    pub cloud_view: CloudView,

    /// Reconciles running at once, per resource kind (0: unbounded). The same object is never
    /// reconciled twice at once, and drift checks hold at most three quarters of these, so
    /// that work that changes something always finds one.
    #[arg(long, env = "VMOP_MAX_CONCURRENT_RECONCILES", default_value_t = 16)]
    pub max_concurrent_reconciles: u16,

    /// How often every VM is re-checked with the provider (drift detection), jittered by 10%.
    /// Units: ms, s, m, h.
    #[arg(long, env = "VMOP_RESYNC_PERIOD", default_value = "5m", value_parser = duration::parse_positive)]
    pub resync_period: Duration,

    /// How often a VM on its way (provisioning, deleting) is re-checked.
    #[arg(long, default_value = "5s", value_parser = duration::parse_positive)]
    pub poll_interval: Duration,

    /// The shortest re-check period a VM's annotation `vmop.dev/poll-interval` may ask for
    /// (shorter values are raised to it).
    #[arg(long, env = "VMOP_MIN_POLL_INTERVAL", default_value = "10s", value_parser = duration::parse_positive)]
    pub min_poll_interval: Duration,

    /// First retry of a VM whose provider said only a change can help (permanent, invalid
    /// spec, unauthorized): the cause may be fixed outside Kubernetes, so it is retried on a
    /// schedule doubling from this to one hour, besides on every change.
    #[arg(long, default_value = "2m", value_parser = duration::parse_positive)]
    pub permanent_retry_base: Duration,

    /// How often loaded plugin files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = duration::parse_positive)]
    pub plugin_poll_interval: Duration,

    /// Plugin instances alive at once across all ProviderConfigs (bounds the sum of their
    /// `maxConcurrentCalls`).
    #[arg(long, default_value_t = 16)]
    pub max_plugin_instances: u32,

    /// Handle only ProviderConfigs with these labels (e.g. `vmop.dev/shard=a`), so that several
    /// operators can share a cluster; VMs naming another ProviderConfig report it as not found.
    #[arg(long, env = "VMOP_PROVIDER_CONFIG_SELECTOR")]
    pub provider_config_selector: Option<String>,

    /// `reportingInstance` of the Events the operator writes (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub instance: Option<String>,

    /// Where `/metrics`, `/healthz` and `/readyz` are served (port 0: any free port).
    #[arg(long, env = "VMOP_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Reconcile only while holding the leader Lease (in the operator namespace), so that
    /// several replicas can run with one of them active.
    #[arg(long, env = "VMOP_LEADER_ELECT")]
    pub leader_elect: bool,

    /// Name of the leader Lease (and the prefix of the shard Leases).
    #[arg(long, default_value = "vmop")]
    pub leader_election_id: String,

    /// Active-active: split the VMs into this many shards (by a hash of their uid), one Lease
    /// each, spread over the running replicas; each replica reconciles the shards it holds.
    /// 1 reconciles every VM (with `--leader-elect`, on one replica at a time).
    #[arg(long, env = "VMOP_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024), conflicts_with = "leader_elect")]
    pub shards: u32,
}

/// `--cloud-view`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CloudView {
    Auto,
    Off,
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = super::kube_client().await?;
    let operator_namespace = args
        .operator_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());

    let shutdown = shutdown_signal().boxed().shared();
    let metrics = Metrics::new();
    let readiness = Readiness::new();
    let state = ServerState {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
    };
    let http = server::serve(args.metrics_addr, state, shutdown.clone()).await?;

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
    })?
    .with_observer(metrics.load_observer())
    .with_compiler(Compiler::Child {
        exe: PathBuf::from("/proc/self/exe"),
        deadline: CHILD_DEADLINE,
    });
    let watcher = registry.watch(args.plugin_poll_interval);

    let mut options = Options::new(operator_namespace.clone());
    options.cluster_id = super::cluster_id(&client, args.cluster_id.as_deref()).await?;
    options.cloud_view = args.cloud_view == CloudView::Auto;
    options.resync_period = args.resync_period;
    options.poll_interval = args.poll_interval;
    options.min_poll_interval = args.min_poll_interval;
    options.slow_backoff.base = args.permanent_retry_base;
    let config = controller::Config {
        namespace: args.namespace.clone(),
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        provider_config_selector: args.provider_config_selector.clone(),
        instance: args.instance.clone(),
        options,
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        sharding: (args.shards > 1).then(|| ShardConfig {
            group: args.leader_election_id.clone(),
            count: args.shards,
            lease: LeaseConfig::new(
                &args.leader_election_id,
                &operator_namespace,
                default_identity(),
            ),
        }),
    };
    tracing::info!(plugin_dir = %args.plugin_dir.display(), "starting vmop");
    let result = if args.leader_elect {
        let lease = LeaseConfig::new(
            &args.leader_election_id,
            &operator_namespace,
            default_identity(),
        );
        // Fenced like shards, so that a rollout from `--shards` to `--leader-elect` (or back)
        // never has both layouts reconciling (leader::layout).
        let fencing = layout::start(client.clone(), lease.clone(), Layout::Leader);
        let elector = LeaderElector::new(client.clone(), lease)?
            .with_metrics(metrics)
            .with_fence(fencing.fence());
        lead(elector, readiness, shutdown.clone(), |stop| {
            controller::run(client, registry, config, stop)
        })
        .await
    } else {
        controller::run(client, registry, config, shutdown.clone())
            .await
            .map_err(anyhow::Error::from)
    };
    watcher.abort();
    result?;
    // The server stops with `shutdown`; it has completed when the controllers stopped by it.
    if shutdown.peek().is_some() {
        http.wait().await?;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs `work` while this process holds the leader Lease. A standby replica is ready (it can
/// take over at any time). Losing the Lease ends the process with an error, as
/// controller-runtime does, so that a restart campaigns again from a clean state; `shutdown`
/// stops the work gracefully. Work that ends, with or without an error, releases the Lease for
/// a fast hand-over.
async fn lead<W, F, E>(
    elector: LeaderElector,
    readiness: Readiness,
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
    work: W,
) -> anyhow::Result<()>
where
    W: FnOnce(futures::future::BoxFuture<'static, ()>) -> F,
    F: Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let leadership = elector.start();
    readiness.set_ready(true);
    let mut leading = leadership.subscribe();
    tracing::info!("waiting for the leader Lease");
    tokio::select! {
        _ = shutdown.clone() => {
            leadership.release().await?;
            return Ok(());
        }
        acquired = leading.wait_for(|l| *l) => {
            acquired.context("the leader election stopped")?;
        }
    }
    tracing::info!("leading: starting the controllers");
    // The Lease's own deadline, checked before the work is polled: a process resuming from a
    // freeze stops before it acts, even if the election task has not run yet.
    let mut validity = leadership.validity();
    let lost = async move { validity.lost().await };
    tokio::select! {
        biased;
        () = lost => {
            anyhow::bail!("lost the leader Lease; exiting so that a restart campaigns again")
        }
        result = work(shutdown.clone().boxed()) => {
            // The controllers have stopped either way: hand the Lease over now rather than
            // make a standby wait for it to expire, then report the work's own error first.
            let released = leadership.release().await;
            if let (Err(_), Err(e)) = (&result, &released) {
                tracing::warn!(error = %crate::telemetry::events::chain(e), "failed to release the leader Lease");
            }
            result?;
            released?;
            Ok(())
        }
    }
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
