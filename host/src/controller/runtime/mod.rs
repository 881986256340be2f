//! What both reconcilers run on: [`relist`] (kube's watcher, relisting after a desync and on a
//! change of the held shards), [`watches`] (a ProviderConfig, its Secret or its plugin file
//! changing re-enqueues exactly its VMs, through [`index`]), [`limiter`] (per-ProviderConfig
//! rate and concurrency around every plugin call), [`drift_slots`] (the workers drift checks
//! may hold), [`backoff`] and [`error_policy`] (when to try again), [`sharding`] (reconcile
//! only the held shards) and [`task`] (a controller as a task of its own).

pub(crate) mod backoff;
pub(crate) mod bucket;
pub(crate) mod drift_slots;
pub(crate) mod error_policy;
pub(crate) mod index;
pub(crate) mod limiter;
pub(crate) mod relist;
pub(crate) mod sharding;
pub(crate) mod task;
pub(crate) mod watches;
