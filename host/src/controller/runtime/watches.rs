//! Cross-resource triggers: a ProviderConfig, its credentials Secret or its plugin file changing
//! re-enqueues exactly the VirtualMachines that use it (through [`VmIndex`]), and the
//! ProviderConfigs concerned.
//!
//! The ProviderConfig and Secret watches here also fill the caches the reconcilers read
//! (`Resolver::configs`, `Resolver::secrets`), so a VM is re-enqueued only after the cache
//! holds the change that re-enqueued it. The ProviderConfig watch is the only one: it also
//! queues the ProviderConfig controller, which reads the same cache.
//!
//! # Guarantees
//!
//! - A ProviderConfig triggers its VMs when its `generation` changes (spec edits), when it
//!   appears and when it is deleted; status writes do not trigger anything.
//! - A Secret triggers when its `resourceVersion` changes, appears or is deleted.
//! - Deletions missed while a watch was down are detected at the relist.
//! - Triggers act on the store's new state: the reflector applies a relist only at its end
//!   (`InitDone`), so changes seen during a relist are announced then, not as they stream in
//!   (test: `relist_changes_are_announced_once_the_store_holds_them`).
//!
//! [`VmIndex`]: crate::controller::runtime::index::VmIndex

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{Lookup, ObjectRef};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use kube::{Api, Resource};
use tokio::sync::broadcast::error::RecvError;

use super::relist;
use crate::api::{ProviderConfig, VirtualMachine};
use crate::controller::context::Context;
use crate::plugin::PluginRegistry;
use crate::telemetry::events::chain;

/// Which objects of a watch changed, by a key (generation, resourceVersion) per object.
#[derive(Debug)]
pub struct Changes<K: Lookup<DynamicType = ()>> {
    key: fn(&K) -> Option<String>,
    seen: HashMap<ObjectRef<K>, Option<String>>,
    relisted: Option<HashSet<ObjectRef<K>>>,
    /// Changes seen during the relist in progress, announced at its end.
    pending: Vec<ObjectRef<K>>,
}

impl<K: Lookup<DynamicType = ()> + Resource<DynamicType = ()>> Changes<K> {
    pub fn new(key: fn(&K) -> Option<String>) -> Self {
        Changes {
            key,
            seen: HashMap::new(),
            relisted: None,
            pending: Vec::new(),
        }
    }

    /// The objects this event changed, appeared or deleted.
    pub fn observe(&mut self, event: &Event<K>) -> Vec<ObjectRef<K>> {
        match event {
            Event::Apply(obj) => self.upsert(obj).into_iter().collect(),
            Event::InitApply(obj) => {
                if let Some(relisted) = &mut self.relisted {
                    relisted.insert(ObjectRef::from(obj));
                }
                let changed = self.upsert(obj);
                self.pending.extend(changed);
                Vec::new()
            }
            Event::Delete(obj) => {
                let r = ObjectRef::from(obj);
                self.seen.remove(&r);
                vec![r]
            }
            Event::Init => {
                self.relisted = Some(HashSet::new());
                self.pending.clear();
                Vec::new()
            }
            Event::InitDone => {
                let mut changed = std::mem::take(&mut self.pending);
                let Some(relisted) = self.relisted.take() else {
                    return changed;
                };
                let gone: Vec<ObjectRef<K>> = self
                    .seen
                    .keys()
                    .filter(|r| !relisted.contains(*r))
                    .cloned()
                    .collect();
                for r in &gone {
                    self.seen.remove(r);
                }
                changed.extend(gone);
                changed
            }
        }
    }

    fn upsert(&mut self, obj: &K) -> Option<ObjectRef<K>> {
        let r = ObjectRef::from(obj);
        let key = (self.key)(obj);
        match self.seen.insert(r.clone(), key.clone()) {
            Some(old) if old == key => None,
            _ => Some(r),
        }
    }
}

pub fn generation<K: Resource>(obj: &K) -> Option<String> {
    obj.meta().generation.map(|g| g.to_string())
}

pub fn resource_version<K: Resource>(obj: &K) -> Option<String> {
    obj.meta().resource_version.clone()
}

/// Where triggers go.
#[derive(Debug, Clone)]
pub struct Fanout {
    pub ctx: Arc<Context>,
    pub vms: UnboundedSender<ObjectRef<VirtualMachine>>,
    pub configs: UnboundedSender<ObjectRef<ProviderConfig>>,
}

impl Fanout {
    /// Re-enqueues the VMs of ProviderConfig `name`.
    pub fn provider_config_changed(&self, name: &str) {
        if self.ctx.resolver.lookup(name).is_none() {
            self.ctx.resolver.limiters.remove(name);
            self.ctx.locations.remove(name);
            self.ctx.metrics.forget_provider_config(name);
        }
        let vms = self.ctx.index.vms_of(name);
        tracing::debug!(
            provider_config = name,
            vms = vms.len(),
            "ProviderConfig changed"
        );
        for vm in vms {
            // A closed channel means the controller stopped: nothing left to trigger.
            let _ = self.vms.unbounded_send(vm);
        }
    }

    /// Re-enqueues the ProviderConfigs using `secret`, and their VMs.
    pub fn secret_changed(&self, secret: &ObjectRef<Secret>) {
        let users = self.configs_where(|pc| {
            pc.spec.credentials_secret_ref.as_ref().is_some_and(|r| {
                r.name == secret.name && Some(r.namespace.as_str()) == secret.namespace.as_deref()
            })
        });
        for name in users {
            let _ = self.configs.unbounded_send(ObjectRef::new(&name));
            self.provider_config_changed(&name);
        }
    }

    /// Re-enqueues the ProviderConfigs whose plugin is `path`, and their VMs.
    pub fn plugin_changed(&self, path: &Path) {
        let users = self.configs_where(|pc| Path::new(&pc.spec.plugin.path) == path);
        for name in users {
            let _ = self.configs.unbounded_send(ObjectRef::new(&name));
            self.provider_config_changed(&name);
        }
    }

    fn configs_where(&self, pred: impl Fn(&ProviderConfig) -> bool) -> Vec<String> {
        self.ctx
            .resolver
            .configs
            .state()
            .into_iter()
            .filter(|pc| pred(pc))
            .filter_map(|pc| pc.metadata.name.clone())
            .collect()
    }
}

/// Runs the ProviderConfig and Secret watches (filling `configs` and `secrets`) and the plugin
/// change subscription until the process stops.
pub async fn run(
    fanout: Fanout,
    registry: PluginRegistry,
    config_watch: watcher::Config,
    configs: Writer<ProviderConfig>,
    secrets: Writer<Secret>,
) {
    let client = fanout.ctx.client.clone();
    let namespace = fanout.ctx.options.operator_namespace.clone();

    // Spec changes re-enqueue the VMs; any change (status included) the ProviderConfig itself,
    // as a watch of its own would.
    let mut pc_changes = Changes::new(generation::<ProviderConfig>);
    let mut pc_versions = Changes::new(resource_version::<ProviderConfig>);
    let pcs = relist::watch(Api::<ProviderConfig>::all(client.clone()), config_watch)
        .reflect(configs)
        .for_each(|event| {
            match event {
                Ok(event) => {
                    for r in pc_versions.observe(&event) {
                        let _ = fanout.configs.unbounded_send(r);
                    }
                    for r in pc_changes.observe(&event) {
                        fanout.provider_config_changed(&r.name);
                    }
                }
                Err(e) => tracing::warn!(error = %chain(&e), "ProviderConfig watch failed"),
            }
            future::ready(())
        });

    let mut secret_changes = Changes::new(resource_version::<Secret>);
    let secret_watch = relist::watch(
        Api::<Secret>::namespaced(client, &namespace),
        watcher::Config::default(),
    )
    .reflect(secrets)
    .for_each(|event| {
        match event {
            Ok(event) => {
                for r in secret_changes.observe(&event) {
                    fanout.secret_changed(&r);
                }
            }
            Err(e) => tracing::warn!(error = %chain(&e), "Secret watch failed"),
        }
        future::ready(())
    });

    let plugins = async {
        let mut events = registry.subscribe();
        loop {
            match events.recv().await {
                Ok(event) => {
                    tracing::info!(
                        path = %event.path.display(),
                        digest = event.digest.as_deref().unwrap_or("none"),
                        error = event.error.as_deref().unwrap_or(""),
                        "plugin file changed"
                    );
                    fanout.plugin_changed(&event.path);
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "missed plugin change events; re-enqueueing every ProviderConfig"
                    );
                    for name in fanout.configs_where(|_| true) {
                        let _ = fanout.configs.unbounded_send(ObjectRef::new(&name));
                        fanout.provider_config_changed(&name);
                    }
                }
                Err(RecvError::Closed) => return,
            }
        }
    };

    futures::join!(pcs, secret_watch, plugins);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, rv: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(refs: Vec<ObjectRef<ConfigMap>>) -> Vec<String> {
        let mut v: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        v.sort();
        v
    }

    #[test]
    fn only_key_changes_and_deletions_count() {
        let mut c = Changes::new(resource_version::<ConfigMap>);
        assert_eq!(names(c.observe(&Event::Apply(cm("a", "1")))), ["a"]);
        assert!(c.observe(&Event::Apply(cm("a", "1"))).is_empty());
        assert_eq!(names(c.observe(&Event::Apply(cm("a", "2")))), ["a"]);
        assert_eq!(names(c.observe(&Event::Delete(cm("a", "3")))), ["a"]);
        assert_eq!(
            names(c.observe(&Event::Apply(cm("a", "4")))),
            ["a"],
            "a recreated object counts"
        );
    }

    #[test]
    fn relist_changes_are_announced_once_the_store_holds_them() {
        let mut c = Changes::new(resource_version::<ConfigMap>);
        c.observe(&Event::Apply(cm("same", "1")));
        c.observe(&Event::Apply(cm("edited", "1")));
        c.observe(&Event::Apply(cm("gone", "1")));
        assert!(c.observe(&Event::Init).is_empty());
        assert!(c.observe(&Event::InitApply(cm("same", "1"))).is_empty());
        assert!(
            c.observe(&Event::InitApply(cm("edited", "2"))).is_empty(),
            "the reflector has not applied the relist yet: a trigger now would read the old object"
        );
        assert_eq!(names(c.observe(&Event::InitDone)), ["edited", "gone"]);
        assert!(c.observe(&Event::InitDone).is_empty());
    }

    #[test]
    fn the_reflector_applies_a_relist_only_at_its_end() {
        // The premise of the test above, checked on kube's own store.
        let (reader, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Apply(cm("a", "1")));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(cm("a", "2")));
        let rv = |r: &kube::runtime::reflector::Store<ConfigMap>| {
            r.get(&ObjectRef::new("a").within("ns"))
                .and_then(|c| c.metadata.resource_version.clone())
        };
        assert_eq!(rv(&reader).as_deref(), Some("1"));
        writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(rv(&reader).as_deref(), Some("2"));
    }
}
