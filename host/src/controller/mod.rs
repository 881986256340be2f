//! The VirtualMachine and ProviderConfig reconcilers, and their wiring.
//!
//! - [`vm`]: the VirtualMachine reconciler (finalizer, create/get/delete, status, ConfigMap).
//! - [`provider_config`]: the ProviderConfig reconciler (plugin, Secret, `vmCount`).
//! - [`error`], [`error_policy`], [`backoff`]: failures and when to try again.
//! - [`limiter`]: per-ProviderConfig rate and concurrency limits around every plugin call.
//! - [`index`], [`watches`]: which VMs a ProviderConfig, Secret or plugin change concerns.

pub mod attempts;
pub mod backoff;
pub mod calls;
pub mod connection;
pub mod context;
pub mod decide;
pub mod effects;
pub mod error;
pub mod error_policy;
pub mod index;
pub mod limiter;
pub mod locations;
pub mod plan;
pub mod provider;
pub mod provider_config;
pub mod relist;
pub mod sharding;
mod task;
pub mod vm;
pub mod vm_status;
pub mod watches;

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, store::WriterDropped};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::Instrument;

pub use context::{Context, Options};

use crate::api::{ProviderConfig, SlimVirtualMachine, VirtualMachine};
use crate::leader::shards::{self, ShardConfig};
use crate::plugin::{Connections, PluginRegistry};
use crate::telemetry::events::{EventSink, chain};
use crate::telemetry::health::Readiness;
use crate::telemetry::metrics::{ControllerKind, Metrics, PhaseCounts, ReconcileResult};
use crate::telemetry::spans::reconcile_span;
use backoff::Backoffs;
use error::{Error, Retry};
use index::VmIndex;
use kube::runtime::controller::Action;
use limiter::Limiters;
use provider::Resolver;
use watches::Fanout;

/// Trailing debounce of ProviderConfig reconciles.
const PROVIDER_CONFIG_DEBOUNCE: std::time::Duration = std::time::Duration::from_secs(1);

/// How to run the controllers.
#[derive(Debug, Clone)]
pub struct Config {
    /// Watch VirtualMachines in this namespace only; `None` watches all.
    pub namespace: Option<String>,
    /// Reconciles running at once per controller; 0 means unbounded. The same object is never
    /// reconciled twice at once either way.
    pub max_concurrent_reconciles: u16,
    /// Handle only ProviderConfigs matching this label selector (several operators in one
    /// cluster each take their own); `None` handles all.
    pub provider_config_selector: Option<String>,
    /// `reportingInstance` of Events (the pod name); `None` uses the host name.
    pub instance: Option<String>,
    pub options: Options,
    pub metrics: Metrics,
    /// Set once the caches are filled and the controllers start.
    pub readiness: Readiness,
    /// Active-active: reconcile only the shards this replica holds (`--shards`).
    pub sharding: Option<ShardConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the {0} cache stopped before it was filled")]
    CacheNotReady(&'static str, #[source] WriterDropped),
}

/// Runs both controllers until `shutdown` completes (then finishes the reconciles in flight).
pub async fn run(
    client: Client,
    registry: PluginRegistry,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (pc_tx, pc_rx) = futures::channel::mpsc::unbounded();
    let (vm_tx, vm_rx) = futures::channel::mpsc::unbounded();
    let (configs, configs_writer) = reflector::store();
    let (secrets, secrets_writer) = reflector::store();
    let backoff = config.options.backoff;
    let held = config
        .sharding
        .as_ref()
        .map(|sharding| shards::shards(sharding.count));
    let ctx = Arc::new(Context {
        client: client.clone(),
        resolver: Resolver {
            configs: configs.clone(),
            secrets: secrets.clone(),
            registry: registry.clone(),
            limiters: Limiters::default(),
            connections: Connections::default(),
            operator_namespace: config.options.operator_namespace.clone(),
        },
        events: EventSink::new(client.clone(), config.instance.clone()),
        metrics: config.metrics.clone(),
        index: Arc::new(VmIndex::new(pc_tx.clone())),
        options: config.options.clone(),
        vm_backoffs: Backoffs::new(backoff),
        vm_slow_backoffs: Backoffs::new(config.options.slow_backoff),
        pc_backoffs: Backoffs::new(backoff),
        attempts: attempts::Attempts::new(),
        locations: locations::Locations::default(),
        shards: held.clone(),
    });

    let requeue = (vm_tx.clone(), pc_tx.clone());
    let requeue_entered = vm_tx.clone();
    let fanout = Fanout {
        ctx: ctx.clone(),
        vms: vm_tx,
        configs: pc_tx,
    };
    let pc_watch = provider_config_watch(&config);
    let fanout = tokio::spawn(watches::run(
        fanout,
        registry,
        pc_watch.clone(),
        configs_writer,
        secrets_writer,
    ));
    let ready = async {
        configs
            .wait_until_ready()
            .await
            .map_err(|e| RunError::CacheNotReady("ProviderConfig", e))?;
        secrets
            .wait_until_ready()
            .await
            .map_err(|e| RunError::CacheNotReady("Secret", e))
    };
    if let Err(e) = ready.await {
        fanout.abort();
        return Err(e);
    }
    tracing::info!(
        namespace = config.namespace.as_deref().unwrap_or("(all)"),
        operator_namespace = %ctx.options.operator_namespace,
        "caches filled, starting the controllers"
    );
    config.readiness.set_ready(true);

    let shutdown = shutdown.boxed().shared();
    // Sharded, the VM watch asks for the held shards' VMs, and lists again when they change.
    let held_changes = held.as_ref().map(|shards| shards.subscribe());
    let vm_client = match (&held, &held_changes) {
        (Some(shards), Some(changes)) => {
            sharding::scoped_client(client.clone(), changes.clone(), shards.count())
        }
        _ => client.clone(),
    };
    let (vm_api, cm_api): (Api<SlimVirtualMachine>, Api<ConfigMap>) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(vm_client, ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(vm_client), Api::all(client.clone())),
    };
    let (vm_reader, vm_writer) = reflector::store();
    let phases: reflector::Store<VirtualMachine> = vm_reader.clone();
    let sharding = match (config.sharding.clone(), held) {
        (Some(sharding), Some(held)) => {
            let hooks = sharding::hooks(
                vm_reader.clone(),
                configs.clone(),
                ctx.index.clone(),
                requeue.0,
                requeue.1,
                sharding.count,
            );
            Some(tokio::spawn(shards::run(
                client.clone(),
                sharding,
                config.metrics.clone(),
                held,
                hooks,
                shutdown.clone(),
            )))
        }
        _ => None,
    };
    ctx.metrics.count_virtual_machines_with(move || {
        phases
            .state()
            .iter()
            .map(|vm| vm.status.as_ref().and_then(|s| s.phase))
            .collect::<PhaseCounts>()
    });
    for kind in [
        ControllerKind::VirtualMachine,
        ControllerKind::ProviderConfig,
    ] {
        ctx.metrics
            .set_max_concurrent_reconciles(kind, config.max_concurrent_reconciles);
    }
    let index = ctx.index.clone();
    // Only spec changes, deletion (which bumps the generation) and the steering annotations
    // (`vm::trigger_key`) trigger a reconcile: the
    // reconciler's own writes (finalizer, annotation, status) carry on within the same
    // reconcile, and a trigger on them would only re-read a view older than those writes.
    // A consistent list (not the API server's possibly lagging cache): a new epoch must not
    // start from a view older than its predecessor's writes (see `attempts.rs`).
    let vm_watch = watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
    let (vm_events, requeue_entered) = match held_changes {
        Some(changes) => (
            relist::watch_restarting(vm_api, vm_watch, changes).boxed(),
            Some(requeue_entered),
        ),
        None => (relist::watch(vm_api, vm_watch).boxed(), None),
    };
    let entered = index.clone();
    let vm_triggers = vm_events
        .map_ok(move |event| {
            let event = relist::unwrap_slim(event);
            index.observe(&event);
            event
        })
        .reflect(vm_writer)
        // After the store holds the new list: the VMs a sharded watch's relist brought in
        // (shards acquired) are reconciled, including those the trigger predicate saw before.
        .map_ok(move |event| {
            if matches!(event, watcher::Event::InitDone) {
                let vms = entered.take_entered();
                if let Some(tx) = &requeue_entered {
                    for vm in vms {
                        let _ = tx.unbounded_send(vm);
                    }
                }
            }
            event
        })
        .applied_objects()
        // Generation, and the annotations users steer a VM with (pause, reconcile now, poll).
        .predicate_filter(vm::trigger_key, Default::default());
    let controller_config =
        controller::Config::default().concurrency(config.max_concurrent_reconciles);
    let connections = relist::watch(
        cm_api,
        watcher::Config::default().labels(&connection::selector()),
    )
    .touched_objects();
    // kube's default trigger backoff grows to 30 s on repeated watch errors (as while an API
    // server restarts) and stops reading every trigger, the VM watch included, meanwhile.
    let vms = Controller::for_stream(vm_triggers, vm_reader)
        .owns_stream(connections)
        .trigger_backoff(relist::ShortBackoff::default())
        .reconcile_on(vm_rx)
        .with_config(controller_config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_vm, error_policy::vm, ctx.clone())
        .for_each(|result| {
            log_outcome("VirtualMachine", result);
            future::ready(())
        });
    let (pc_reader, pc_writer) = reflector::store();
    let pc_triggers = relist::watch(Api::<ProviderConfig>::all(client), pc_watch)
        .reflect(pc_writer)
        .applied_objects();
    let pcs = Controller::for_stream(pc_triggers, pc_reader)
        .trigger_backoff(relist::ShortBackoff::default())
        .reconcile_on(pc_rx)
        // `vmCount` follows VM creations and deletions: batch bursts of them into one write.
        .with_config(controller_config.debounce(PROVIDER_CONFIG_DEBOUNCE))
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile_provider_config,
            error_policy::provider_config,
            ctx.clone(),
        )
        .for_each(|result| {
            log_outcome("ProviderConfig", result);
            future::ready(())
        });
    futures::join!(task::run_as_task(vms), task::run_as_task(pcs));
    fanout.abort();
    if let Some(sharding) = sharding {
        // Stopped by the same shutdown: wait for the Leases to be handed over.
        let _ = sharding.await;
    }
    Ok(())
}

async fn reconcile_vm(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let guard = ctx
        .metrics
        .reconcile_started(ControllerKind::VirtualMachine);
    let span = vm_span(&vm);
    let result = sharding::while_holding(
        ctx.shards.as_deref(),
        sharding::vm_shard(&vm),
        vm::reconcile(vm.clone(), ctx.clone()),
    )
    .instrument(span)
    .await;
    guard.finish(ReconcileResult::of(&result), is_terminal(&result));
    result
}

async fn reconcile_provider_config(
    pc: Arc<ProviderConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let guard = ctx
        .metrics
        .reconcile_started(ControllerKind::ProviderConfig);
    let span = provider_config_span(&pc);
    let result = sharding::while_holding(
        ctx.shards.as_deref(),
        |_| sharding::PROVIDER_CONFIG_SHARD,
        provider_config::reconcile(pc, ctx.clone()),
    )
    .instrument(span)
    .await;
    guard.finish(ReconcileResult::of(&result), is_terminal(&result));
    result
}

/// The span of a VirtualMachine's reconcile (and of its error policy).
fn vm_span(vm: &VirtualMachine) -> tracing::Span {
    reconcile_span(
        ControllerKind::VirtualMachine,
        vm.metadata.namespace.as_deref(),
        &vm.name_any(),
        Some(&vm.spec.provider_config_ref.name),
    )
}

/// The span of a ProviderConfig's reconcile (and of its error policy); cluster-scoped, so no
/// namespace, and the object is the provider config itself.
fn provider_config_span(pc: &ProviderConfig) -> tracing::Span {
    let name = pc.name_any();
    reconcile_span(ControllerKind::ProviderConfig, None, &name, Some(&name))
}

/// An error that is not retried until something changes (controller-runtime's terminal error).
fn is_terminal(result: &Result<Action, Error>) -> bool {
    matches!(result, Err(e) if e.retry() == Retry::AwaitChange)
}

fn provider_config_watch(config: &Config) -> watcher::Config {
    match &config.provider_config_selector {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    }
}

fn log_outcome<K, E1: std::error::Error + 'static, E2: std::error::Error + 'static>(
    kind: &str,
    result: Result<(reflector::ObjectRef<K>, Action), controller::Error<E1, E2>>,
) where
    K: reflector::Lookup,
    K::DynamicType: std::fmt::Debug,
{
    match result {
        Ok((object, action)) => tracing::debug!(kind, %object, ?action, "reconciled"),
        // Reconcile failures were logged by the error policy.
        Err(controller::Error::ReconcilerFailed(..)) => {}
        Err(controller::Error::ObjectNotFound(object)) => {
            tracing::debug!(kind, %object, "object gone before its reconcile")
        }
        Err(e) => tracing::warn!(kind, error = %chain(&e), "controller error"),
    }
}
