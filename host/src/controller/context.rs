//! State shared by every reconcile.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::reflector::ObjectRef;

use crate::api::{ProviderConfig, VirtualMachine};
use crate::controller::provider_config::Resolver;
use crate::controller::provider_config::locations::Locations;
use crate::controller::provider_config::view::CloudViews;
use crate::controller::runtime::backoff::{BackoffConfig, Backoffs};
use crate::controller::runtime::drift_slots::DriftSlots;
use crate::controller::runtime::index::VmIndex;
use crate::controller::vm::Attempts;
use crate::telemetry::events::EventSink;
use crate::telemetry::metrics::Metrics;

/// Tunables of the reconcilers.
#[derive(Debug, Clone)]
pub struct Options {
    /// The operator's namespace: the only one whose Secrets may be read.
    pub operator_namespace: String,
    /// This cluster's identity (`provider-config.cluster`).
    pub cluster_id: String,
    /// Keep a cloud-side view per ProviderConfig whose plugin can `list` (`--cloud-view`).
    pub cloud_view: bool,
    /// How often a healthy VM is re-checked with `get` (drift detection), jittered by 10%.
    pub resync_period: Duration,
    /// How often a VM that is making progress (provisioning, deleting) is re-checked.
    pub poll_interval: Duration,
    /// The shortest re-check period annotation `vmop.dev/poll-interval` may ask for.
    pub min_poll_interval: Duration,
    /// Backoff of transient failures.
    pub backoff: BackoffConfig,
    /// Schedule of failures that await a change which may happen outside Kubernetes
    /// (permanent, invalid spec, unauthorized).
    pub slow_backoff: BackoffConfig,
}

impl Options {
    pub fn new(operator_namespace: impl Into<String>) -> Self {
        Options {
            operator_namespace: operator_namespace.into(),
            cluster_id: String::new(),
            cloud_view: true,
            resync_period: Duration::from_secs(300),
            poll_interval: Duration::from_secs(5),
            min_poll_interval: Duration::from_secs(10),
            backoff: BackoffConfig::default(),
            slow_backoff: BackoffConfig::SLOW,
        }
    }
}

pub struct Context {
    pub client: Client,
    pub resolver: Resolver,
    pub events: EventSink,
    pub metrics: Metrics,
    pub options: Options,
    pub index: Arc<VmIndex>,
    pub vm_backoffs: Backoffs<ObjectRef<VirtualMachine>>,
    pub vm_slow_backoffs: Backoffs<ObjectRef<VirtualMachine>>,
    /// What this process knows about create attempts (grace periods, never-created VMs).
    pub attempts: Attempts,
    pub locations: Locations,
    /// Each ProviderConfig's last listing of its cloud.
    pub views: CloudViews,
    /// VMs to reconcile now (a listing of the cloud saw their machine change).
    pub vm_queue: futures::channel::mpsc::UnboundedSender<ObjectRef<VirtualMachine>>,
    pub pc_backoffs: Backoffs<ObjectRef<ProviderConfig>>,
    /// The reconcile workers drift checks may hold.
    pub drift_slots: DriftSlots,
    /// The shards this replica holds, when sharded; `None` reconciles everything.
    pub shards: Option<Arc<crate::leader::shards::Shards>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
