//! [`run`]: the operator's controllers wired together, in named steps: the shared context,
//! the ProviderConfig and Secret caches with the cross-resource triggers, the VM watch (scoped
//! to the held shards when sharded), the shard membership task, and the two controllers.

use std::future::Future;
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::future::{BoxFuture, Shared};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, store::WriterDropped};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use super::context::{Context, Options};
use super::provider_config::Resolver;
use super::reconcile;
use super::runtime::backoff::Backoffs;
use super::runtime::drift_slots::DriftSlots;
use super::runtime::index::VmIndex;
use super::runtime::limiter::Limiters;
use super::runtime::watches::{self, Fanout};
use super::runtime::{error_policy, relist, sharding, task};
use super::vm::{self, Attempts};
use crate::api::{ProviderConfig, SlimVirtualMachine, VirtualMachine};
use crate::leader::shards::{self, ShardConfig, Shards};
use crate::plugin::{Connections, PluginRegistry};
use crate::telemetry::events::{EventSink, chain};
use crate::telemetry::health::Readiness;
use crate::telemetry::metrics::{ControllerKind, Metrics, PhaseCounts};

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

type Shutdown = Shared<BoxFuture<'static, ()>>;

/// The queues of objects to reconcile besides their own watches: cross-resource triggers,
/// shard acquisitions and relists put VMs and ProviderConfigs here.
struct Queues {
    vms: (
        UnboundedSender<ObjectRef<VirtualMachine>>,
        UnboundedReceiver<ObjectRef<VirtualMachine>>,
    ),
    configs: (
        UnboundedSender<ObjectRef<ProviderConfig>>,
        UnboundedReceiver<ObjectRef<ProviderConfig>>,
    ),
}

/// Runs both controllers until `shutdown` completes (then finishes the reconciles in flight).
pub async fn run(
    client: Client,
    registry: PluginRegistry,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let queues = Queues {
        vms: futures::channel::mpsc::unbounded(),
        configs: futures::channel::mpsc::unbounded(),
    };
    let (configs, configs_writer) = reflector::store();
    let (secrets, secrets_writer) = reflector::store();
    let held = config
        .sharding
        .as_ref()
        .map(|sharding| shards::shards(sharding.count));
    let ctx = context(
        &client,
        &registry,
        &config,
        &queues,
        (configs, secrets),
        &held,
    );

    // The one ProviderConfig watch: it fills the cache the resolver reads and triggers both
    // the ProviderConfig controller and the VMs of a changed ProviderConfig.
    let fanout = Fanout {
        ctx: ctx.clone(),
        vms: queues.vms.0.clone(),
        configs: queues.configs.0.clone(),
    };
    let triggers = tokio::spawn(watches::run(
        fanout,
        registry,
        provider_config_watch(&config),
        configs_writer,
        secrets_writer,
    ));
    if let Err(e) = caches_filled(&ctx.resolver).await {
        triggers.abort();
        return Err(e);
    }
    tracing::info!(
        namespace = config.namespace.as_deref().unwrap_or("(all)"),
        operator_namespace = %ctx.options.operator_namespace,
        "caches filled, starting the controllers"
    );
    config.readiness.set_ready(true);

    let shutdown: Shutdown = shutdown.boxed().shared();
    let (vm_triggers, vm_reader) = vm_watch(&client, &config, &ctx, held.as_ref(), &queues);
    let sharding = start_sharding(&client, &config, &ctx, held, &vm_reader, &queues, &shutdown);
    publish_metrics(&ctx, &config, vm_reader.clone());
    let controller_config =
        controller::Config::default().concurrency(config.max_concurrent_reconciles);
    let Queues { vms, configs } = queues;
    let vms = vm_controller(
        &config,
        &ctx,
        (vm_triggers, vm_reader),
        vms.1,
        controller_config.clone(),
        shutdown.clone(),
    );
    let pcs = provider_config_controller(&ctx, configs.1, controller_config, shutdown);
    futures::join!(task::run_as_task(vms), task::run_as_task(pcs));
    triggers.abort();
    if let Some(sharding) = sharding {
        // Stopped by the same shutdown: wait for the Leases to be handed over.
        let _ = sharding.await;
    }
    Ok(())
}

/// The state every reconcile shares.
fn context(
    client: &Client,
    registry: &PluginRegistry,
    config: &Config,
    queues: &Queues,
    (configs, secrets): (Store<ProviderConfig>, Store<Secret>),
    held: &Option<Arc<Shards>>,
) -> Arc<Context> {
    let backoff = config.options.backoff;
    Arc::new(Context {
        client: client.clone(),
        resolver: Resolver {
            configs,
            secrets,
            registry: registry.clone(),
            limiters: Limiters::default(),
            connections: Connections::default(),
            operator_namespace: config.options.operator_namespace.clone(),
            cluster_id: config.options.cluster_id.clone(),
        },
        events: EventSink::new(client.clone(), config.instance.clone()),
        metrics: config.metrics.clone(),
        index: Arc::new(VmIndex::new(queues.configs.0.clone())),
        options: config.options.clone(),
        vm_backoffs: Backoffs::new(backoff),
        vm_slow_backoffs: Backoffs::new(config.options.slow_backoff),
        pc_backoffs: Backoffs::new(backoff),
        attempts: Attempts::new(),
        locations: Default::default(),
        views: Default::default(),
        vm_queue: queues.vms.0.clone(),
        drift_slots: DriftSlots::for_workers(config.max_concurrent_reconciles),
        shards: held.clone(),
    })
}

/// Waits until the ProviderConfig and Secret caches hold their first list.
async fn caches_filled(resolver: &Resolver) -> Result<(), RunError> {
    resolver
        .configs
        .wait_until_ready()
        .await
        .map_err(|e| RunError::CacheNotReady("ProviderConfig", e))?;
    resolver
        .secrets
        .wait_until_ready()
        .await
        .map_err(|e| RunError::CacheNotReady("Secret", e))
}

/// The VM watch, reflected into the store the VM controller reads, and the triggers it yields.
///
/// Only spec changes, deletion (which bumps the generation) and the steering annotations
/// (`vm::trigger_key`) trigger a reconcile: the reconciler's own writes (finalizer,
/// annotation, status) carry on within the same reconcile, and a trigger on them would only
/// re-read a view older than those writes. Sharded, the watch asks for the held shards' VMs
/// and lists again when they change; the VMs a relist brought in are requeued, including those
/// the trigger predicate saw before.
fn vm_watch(
    client: &Client,
    config: &Config,
    ctx: &Context,
    held: Option<&Arc<Shards>>,
    queues: &Queues,
) -> (
    BoxStream<'static, Result<VirtualMachine, watcher::Error>>,
    Store<VirtualMachine>,
) {
    let changes = held.map(|shards| (shards.subscribe(), shards.count()));
    let vm_client = match &changes {
        Some((changes, count)) => sharding::scoped_client(client.clone(), changes.clone(), *count),
        None => client.clone(),
    };
    let api: Api<SlimVirtualMachine> = match &config.namespace {
        Some(ns) => Api::namespaced(vm_client, ns),
        None => Api::all(vm_client),
    };
    // A consistent list (not the API server's possibly lagging cache): a new epoch must not
    // start from a view older than its predecessor's writes (see `vm/attempts.rs`).
    let watch = watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
    let (events, requeue_entered) = match changes {
        Some((changes, _)) => (
            relist::watch_restarting(api, watch, changes).boxed(),
            Some(queues.vms.0.clone()),
        ),
        None => (relist::watch(api, watch).boxed(), None),
    };
    let (reader, writer) = reflector::store();
    let index = ctx.index.clone();
    let entered = ctx.index.clone();
    let triggers = events
        .map_ok(move |event| {
            let event = relist::unwrap_slim(event);
            index.observe(&event);
            event
        })
        .reflect(writer)
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
        .predicate_filter(vm::trigger_key, Default::default())
        .boxed();
    (triggers, reader)
}

/// Sharded: the membership task that acquires and hands over shard Leases, told what to
/// requeue when a shard is acquired.
fn start_sharding(
    client: &Client,
    config: &Config,
    ctx: &Arc<Context>,
    held: Option<Arc<Shards>>,
    vms: &Store<VirtualMachine>,
    queues: &Queues,
    shutdown: &Shutdown,
) -> Option<JoinHandle<()>> {
    let (sharding, held) = config.sharding.clone().zip(held)?;
    let hooks = sharding::hooks(
        vms.clone(),
        ctx.clone(),
        queues.vms.0.clone(),
        queues.configs.0.clone(),
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

/// The gauges read from the caches: VMs by phase, and the concurrency limits.
fn publish_metrics(ctx: &Context, config: &Config, vms: Store<VirtualMachine>) {
    ctx.metrics.count_virtual_machines_with(move || {
        vms.state()
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
}

/// The VirtualMachine controller: the VM watch's triggers, the connection ConfigMaps it owns,
/// and the requeue queue.
fn vm_controller(
    config: &Config,
    ctx: &Arc<Context>,
    (triggers, reader): (
        BoxStream<'static, Result<VirtualMachine, watcher::Error>>,
        Store<VirtualMachine>,
    ),
    requeued: UnboundedReceiver<ObjectRef<VirtualMachine>>,
    controller_config: controller::Config,
    shutdown: Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let cm_api: Api<ConfigMap> = match &config.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let connections = relist::watch(
        cm_api,
        watcher::Config::default().labels(&vm::connection_selector()),
    )
    .touched_objects();
    // kube's default trigger backoff grows to 30 s on repeated watch errors (as while an API
    // server restarts) and stops reading every trigger, the VM watch included, meanwhile.
    Controller::for_stream(triggers, reader)
        .owns_stream(connections)
        .trigger_backoff(relist::ShortBackoff::default())
        .reconcile_on(requeued)
        .with_config(controller_config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::vm, error_policy::vm, ctx.clone())
        .for_each(|result| {
            log_outcome("VirtualMachine", result);
            future::ready(())
        })
}

/// The ProviderConfig controller. It reads the cache the one ProviderConfig watch fills
/// (`watches.rs`), which queues every change of a ProviderConfig, its Secret or its plugin.
fn provider_config_controller(
    ctx: &Arc<Context>,
    queued: UnboundedReceiver<ObjectRef<ProviderConfig>>,
    controller_config: controller::Config,
    shutdown: Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let no_watch = futures::stream::pending::<Result<ProviderConfig, watcher::Error>>();
    Controller::for_stream(no_watch, ctx.resolver.configs.clone())
        .reconcile_on(queued)
        // `vmCount` follows VM creations and deletions: batch bursts of them into one write.
        .with_config(controller_config.debounce(PROVIDER_CONFIG_DEBOUNCE))
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile::provider_config,
            error_policy::provider_config,
            ctx.clone(),
        )
        .for_each(|result| {
            log_outcome("ProviderConfig", result);
            future::ready(())
        })
}

fn provider_config_watch(config: &Config) -> watcher::Config {
    match &config.provider_config_selector {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    }
}

fn log_outcome<K, E1: std::error::Error + 'static, E2: std::error::Error + 'static>(
    kind: &str,
    result: Result<(ObjectRef<K>, Action), controller::Error<E1, E2>>,
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
