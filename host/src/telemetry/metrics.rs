//! Prometheus metrics: controller-runtime's names where they apply (so existing dashboards for
//! Go operators work unchanged), plus `vmop_*` for provider calls, plugin loads and VMs.
//!
//! Every label value comes from a closed set ([`ControllerKind`], [`ReconcileResult`],
//! [`Operation`], [`CallOutcome`], [`LoadOutcome`], [`crate::api::VmPhase`]) except `provider_config` (the
//! name of a cluster-scoped ProviderConfig, of which an admin creates a handful) and the lease
//! `name` (one per operator): no object names, ids or error messages, so series stay bounded.
//!
//! prometheus-client appends `_total` to counters itself and the unit to metrics registered with
//! one: `controller_runtime_reconcile` is exported as `controller_runtime_reconcile_total`,
//! `controller_runtime_reconcile_time` with [`Unit::Seconds`] as
//! `controller_runtime_reconcile_time_seconds` (`tests/tests/sandbox/telemetry.rs` pins every exported name).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::labels::OperationLabel;
pub use super::labels::{CallOutcome, ControllerKind, LoadOutcome, ReconcileResult};
use super::phases::PhaseCollector;
pub use super::phases::PhaseCounts;
use vmop_runtime::{LoadError, LoadObserver, Operation};

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets.
const RECONCILE_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];
/// Provider calls: milliseconds against a local API up to the default 30 s call timeout.
const CALL_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Plugin loads: a cached artifact maps in milliseconds, a cold compile takes seconds.
const LOAD_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// `Content-Type` of [`Format::OpenMetrics`].
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Text exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 (what Prometheus asks for first), ending in `# EOF`.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4.
    Prometheus,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }

    /// OpenMetrics when the scraper's `Accept` header offers it, else Prometheus text.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("failed to encode the metrics")]
    Encode(#[source] std::fmt::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ControllerLabels {
    controller: ControllerKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReconcileLabels {
    controller: ControllerKind,
    result: ReconcileResult,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LeaderLabels {
    name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProviderConfigLabels {
    provider_config: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    provider_config: String,
    operation: OperationLabel,
    outcome: CallOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LoadLabels {
    outcome: LoadOutcome,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Debug)]
struct Inner {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    terminal_errors: Family<ControllerLabels, Counter>,
    reconcile_time: HistogramFamily<ControllerLabels>,
    max_concurrent: Family<ControllerLabels, Gauge>,
    active_workers: Family<ControllerLabels, Gauge>,
    leader: Family<LeaderLabels, Gauge>,
    shard_members: Gauge,
    call_duration: HistogramFamily<CallLabels>,
    calls: Family<CallLabels, Counter>,
    call_budget: Family<ProviderConfigLabels, Gauge<f64, AtomicU64>>,
    write_budget: Family<ProviderConfigLabels, Gauge<f64, AtomicU64>>,
    cloud_machines: Family<ProviderConfigLabels, Gauge>,
    orphans: Family<ProviderConfigLabels, Gauge>,
    plugin_load: HistogramFamily<LoadLabels>,
    phases: Arc<PhaseCollector>,
}

/// The operator's metrics; cheap to clone, every clone records into the same registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::default();
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            reconciles.clone(),
        );
        let reconcile_errors = Family::default();
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            reconcile_errors.clone(),
        );
        let terminal_errors = Family::default();
        registry.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            terminal_errors.clone(),
        );
        let reconcile_time: HistogramFamily<_> =
            Family::new_with_constructor(|| Histogram::new(RECONCILE_BUCKETS));
        registry.register_with_unit(
            "controller_runtime_reconcile_time",
            "Length of time per reconciliation per controller",
            Unit::Seconds,
            reconcile_time.clone(),
        );
        let max_concurrent = Family::default();
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            max_concurrent.clone(),
        );
        let active_workers = Family::default();
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            active_workers.clone(),
        );
        let leader = Family::default();
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            leader.clone(),
        );
        let shard_members = Gauge::default();
        registry.register(
            "vmop_shard_members",
            "Live replicas of the shard group as this replica last counted them (0 when not sharded); shards are spread over these",
            shard_members.clone(),
        );
        let call_duration: HistogramFamily<_> =
            Family::new_with_constructor(|| Histogram::new(CALL_BUCKETS));
        registry.register_with_unit(
            "vmop_provider_call_duration",
            "Duration of provider plugin calls, sandbox set-up included",
            Unit::Seconds,
            call_duration.clone(),
        );
        let calls = Family::default();
        registry.register(
            "vmop_provider_calls",
            "Total number of provider plugin calls",
            calls.clone(),
        );
        let call_budget = Family::default();
        registry.register(
            "vmop_provider_call_budget",
            "Plugin calls per second a ProviderConfig may make now: its requestsPerSecond, halved by each throttle answer of the cloud and climbing back without one",
            call_budget.clone(),
        );
        let write_budget = Family::default();
        registry.register(
            "vmop_provider_mutating_call_budget",
            "Plugin calls that change machines per second a ProviderConfig may make now (with mutatingRequestsPerSecond set): halved by each throttle answer to such a call, climbing back without one",
            write_budget.clone(),
        );
        let cloud_machines = Family::default();
        registry.register(
            "vmop_cloud_machines",
            "Machines with this cluster's mark in the last complete listing of a ProviderConfig's cloud (plugins with capability list)",
            cloud_machines.clone(),
        );
        let orphans = Family::default();
        registry.register(
            "vmop_orphans",
            "Machines in the last complete listing of a ProviderConfig's cloud with this cluster's mark and no VirtualMachine",
            orphans.clone(),
        );
        let plugin_load: HistogramFamily<_> =
            Family::new_with_constructor(|| Histogram::new(LOAD_BUCKETS));
        registry.register_with_unit(
            "vmop_plugin_load",
            "Duration of plugin loads (read, verify, compile or load from cache, info call)",
            Unit::Seconds,
            plugin_load.clone(),
        );
        let phases = Arc::new(PhaseCollector::default());
        registry.register_collector(Box::new(phases.clone()));
        Metrics {
            inner: Arc::new(Inner {
                registry,
                reconciles,
                reconcile_errors,
                terminal_errors,
                reconcile_time,
                max_concurrent,
                active_workers,
                leader,
                shard_members,
                call_duration,
                calls,
                call_budget,
                write_budget,
                cloud_machines,
                orphans,
                plugin_load,
                phases,
            }),
        }
    }

    /// The exposition text of every metric.
    pub fn encode(&self, format: Format) -> Result<String, MetricsError> {
        let mut text = String::new();
        match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &self.inner.registry)
            }
            Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(
                &mut text,
                &self.inner.registry,
            ),
        }
        .map_err(MetricsError::Encode)?;
        Ok(text)
    }

    /// Records the configured concurrency of a controller (0 means unbounded, as configured).
    pub fn set_max_concurrent_reconciles(&self, controller: ControllerKind, max: u16) {
        self.inner
            .max_concurrent
            .get_or_create(&ControllerLabels { controller })
            .set(i64::from(max));
    }

    /// Counts an active worker until the returned guard is finished or dropped. Finish it with
    /// the reconcile's result; a guard dropped unfinished (the reconcile was cancelled, e.g. on
    /// losing leadership) only releases the worker.
    pub fn reconcile_started(&self, controller: ControllerKind) -> ReconcileGuard {
        let labels = ControllerLabels { controller };
        self.inner.active_workers.get_or_create(&labels).inc();
        ReconcileGuard {
            metrics: self.clone(),
            controller,
            started: Instant::now(),
        }
    }

    /// Records one finished provider call.
    pub fn provider_call(
        &self,
        provider_config: &str,
        operation: Operation,
        outcome: CallOutcome,
        duration: Duration,
    ) {
        let labels = CallLabels {
            provider_config: provider_config.to_owned(),
            operation: OperationLabel(operation),
            outcome,
        };
        self.inner.calls.get_or_create(&labels).inc();
        self.inner
            .call_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// Drops the series of a deleted ProviderConfig.
    pub fn forget_provider_config(&self, provider_config: &str) {
        for operation in Operation::ALL {
            for outcome in CallOutcome::ALL {
                let labels = CallLabels {
                    provider_config: provider_config.to_owned(),
                    operation: OperationLabel(operation),
                    outcome,
                };
                self.inner.calls.remove(&labels);
                self.inner.call_duration.remove(&labels);
            }
        }
        let labels = ProviderConfigLabels {
            provider_config: provider_config.to_owned(),
        };
        self.inner.call_budget.remove(&labels);
        self.inner.write_budget.remove(&labels);
        self.inner.cloud_machines.remove(&labels);
        self.inner.orphans.remove(&labels);
    }

    /// Sets `vmop_provider_mutating_call_budget` of a ProviderConfig (calls per second).
    pub fn set_write_budget(&self, provider_config: &str, per_second: f64) {
        self.inner
            .write_budget
            .get_or_create(&ProviderConfigLabels {
                provider_config: provider_config.to_owned(),
            })
            .set(per_second);
    }

    /// Sets `vmop_cloud_machines` and `vmop_orphans` of a ProviderConfig from its last listing.
    pub fn set_cloud_view(&self, provider_config: &str, machines: usize, orphans: usize) {
        let labels = ProviderConfigLabels {
            provider_config: provider_config.to_owned(),
        };
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner
            .cloud_machines
            .get_or_create(&labels)
            .set(gauge(machines));
        self.inner
            .orphans
            .get_or_create(&labels)
            .set(gauge(orphans));
    }

    /// Sets `vmop_provider_call_budget` of a ProviderConfig (calls per second).
    pub fn set_call_budget(&self, provider_config: &str, per_second: f64) {
        self.inner
            .call_budget
            .get_or_create(&ProviderConfigLabels {
                provider_config: provider_config.to_owned(),
            })
            .set(per_second);
    }

    /// Records one plugin load that did real work (not a hit of the in-memory table).
    pub fn plugin_load(&self, outcome: LoadOutcome, duration: Duration) {
        self.inner
            .plugin_load
            .get_or_create(&LoadLabels { outcome })
            .observe(duration.as_secs_f64());
    }

    /// This registry's loads as `vmop_plugin_load_seconds` (see [`LoadObserver`]).
    pub fn load_observer(&self) -> Arc<dyn LoadObserver> {
        Arc::new(self.clone())
    }

    /// `vmop_shard_members`: the members this replica spreads the shards over, once it has
    /// handed over the shards it no longer ranks first.
    pub fn set_shard_members(&self, members: usize) {
        self.inner
            .shard_members
            .set(i64::try_from(members).unwrap_or(i64::MAX));
    }

    /// `leader_election_master_status{name}`: 1 while this process holds the lease.
    pub fn set_leader(&self, lease_name: &str, leading: bool) {
        self.inner
            .leader
            .get_or_create(&LeaderLabels {
                name: lease_name.to_owned(),
            })
            .set(i64::from(leading));
    }

    /// Installs the source of `vmop_virtual_machines`, called on every scrape (e.g. counting
    /// the phases in the VirtualMachine reflector store). Replaces an earlier source.
    pub fn count_virtual_machines_with(
        &self,
        source: impl Fn() -> PhaseCounts + Send + Sync + 'static,
    ) {
        self.inner.phases.set_source(Box::new(source));
    }

    fn reconcile_finished(
        &self,
        controller: ControllerKind,
        result: ReconcileResult,
        terminal: bool,
        elapsed: Duration,
    ) {
        let labels = ControllerLabels { controller };
        self.inner
            .reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        if result == ReconcileResult::Error {
            self.inner.reconcile_errors.get_or_create(&labels).inc();
            if terminal {
                self.inner.terminal_errors.get_or_create(&labels).inc();
            }
        }
        self.inner
            .reconcile_time
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

/// One reconcile in flight; see [`Metrics::reconcile_started`].
#[derive(Debug)]
#[must_use = "finish the guard with the reconcile's result"]
pub struct ReconcileGuard {
    metrics: Metrics,
    controller: ControllerKind,
    started: Instant,
}

impl LoadObserver for Metrics {
    fn loaded(&self, result: Result<(), &LoadError>, took: Duration) {
        self.plugin_load(LoadOutcome::of(result), took);
    }
}

impl ReconcileGuard {
    /// Records the reconcile's result and duration. `terminal` marks an error that is not
    /// retried until something changes (controller-runtime's terminal errors).
    pub fn finish(self, result: ReconcileResult, terminal: bool) {
        self.metrics
            .reconcile_finished(self.controller, result, terminal, self.started.elapsed());
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        self.metrics
            .inner
            .active_workers
            .get_or_create(&ControllerLabels {
                controller: self.controller,
            })
            .dec();
    }
}
