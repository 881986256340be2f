//! Which VirtualMachines use which ProviderConfig: maintained from the VM watch stream so that
//! a change to a ProviderConfig (or its Secret, or its plugin file) re-enqueues exactly its VMs
//! without scanning every VM.
//!
//! # Guarantees
//!
//! - After a watch (re)list completes (`InitDone`), the index holds exactly the listed VMs.
//! - Every change of a ProviderConfig's set of VMs is announced on the channel given to
//!   [`VmIndex::new`], so the ProviderConfig reconciler can refresh its `vmCount`.
//! - [`VmIndex::take_entered`] answers the VMs the last relist listed that the index did not
//!   hold before it: a sharded replica whose watch lists again for shards it acquired must
//!   reconcile them, and kube's trigger predicate remembers VMs it saw before and passes them
//!   over when they come back unchanged (`a_relist_tells_which_vms_entered`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

use crate::api::{ProviderConfig, VirtualMachine};

type VmRef = ObjectRef<VirtualMachine>;

#[derive(Debug, Default)]
struct Maps {
    by_provider: HashMap<String, HashSet<VmRef>>,
    provider_of: HashMap<VmRef, String>,
    /// The VM recording each machine id (`status.id`).
    by_machine: HashMap<String, VmRef>,
    machine_of: HashMap<VmRef, String>,
    /// Filled by a completed list (`InitDone`), not only by single events.
    listed: bool,
}

impl Maps {
    /// Sets the machine `vm` records.
    fn record(&mut self, vm: &VmRef, machine: Option<&String>) {
        if self.machine_of.get(vm) == machine {
            return;
        }
        if let Some(old) = self.machine_of.remove(vm) {
            self.by_machine.remove(&old);
        }
        if let Some(id) = machine {
            self.machine_of.insert(vm.clone(), id.clone());
            self.by_machine.insert(id.clone(), vm.clone());
        }
    }

    fn apply(&mut self, vm: &VirtualMachine) -> Vec<String> {
        let key = VmRef::from(vm);
        self.record(&key, vm.status.as_ref().and_then(|s| s.id.as_ref()));
        self.upsert(key, vm.spec.provider_config_ref.name.clone())
    }

    /// Sets `vm`'s provider; returns the providers whose set changed.
    fn upsert(&mut self, vm: VmRef, provider: String) -> Vec<String> {
        match self.provider_of.insert(vm.clone(), provider.clone()) {
            Some(old) if old == provider => Vec::new(),
            old => {
                let mut changed = vec![provider.clone()];
                if let Some(old) = old {
                    self.detach(&vm, &old);
                    changed.push(old);
                }
                self.by_provider.entry(provider).or_default().insert(vm);
                changed
            }
        }
    }

    fn remove(&mut self, vm: &VmRef) -> Option<String> {
        self.record(vm, None);
        let provider = self.provider_of.remove(vm)?;
        self.detach(vm, &provider);
        Some(provider)
    }

    fn detach(&mut self, vm: &VmRef, provider: &str) {
        if let Some(set) = self.by_provider.get_mut(provider) {
            set.remove(vm);
            if set.is_empty() {
                self.by_provider.remove(provider);
            }
        }
    }
}

#[derive(Debug)]
pub struct VmIndex {
    current: Mutex<Maps>,
    /// Filled between `Init` and `InitDone` of a relist, then swapped in.
    relisting: Mutex<Option<Maps>>,
    /// The VMs the last completed relist added, until taken.
    entered: Mutex<Vec<VmRef>>,
    changed: UnboundedSender<ObjectRef<ProviderConfig>>,
}

impl VmIndex {
    /// `changed` receives the ProviderConfigs whose set of VMs changed.
    pub fn new(changed: UnboundedSender<ObjectRef<ProviderConfig>>) -> Self {
        VmIndex {
            current: Mutex::default(),
            relisting: Mutex::default(),
            entered: Mutex::default(),
            changed,
        }
    }

    /// Applies one watch event.
    pub fn observe(&self, event: &Event<VirtualMachine>) {
        let changed = match event {
            Event::Apply(vm) => lock(&self.current).apply(vm),
            Event::Delete(vm) => lock(&self.current)
                .remove(&VmRef::from(vm))
                .into_iter()
                .collect(),
            Event::Init => {
                *lock(&self.relisting) = Some(Maps::default());
                Vec::new()
            }
            Event::InitApply(vm) => {
                if let Some(maps) = lock(&self.relisting).as_mut() {
                    maps.apply(vm);
                }
                Vec::new()
            }
            Event::InitDone => match lock(&self.relisting).take() {
                Some(mut new) => {
                    new.listed = true;
                    let mut current = lock(&self.current);
                    let changed = providers_differing(&current, &new);
                    *lock(&self.entered) = new
                        .provider_of
                        .keys()
                        .filter(|vm| !current.provider_of.contains_key(*vm))
                        .cloned()
                        .collect();
                    *current = new;
                    changed
                }
                None => Vec::new(),
            },
        };
        for name in changed {
            // A closed channel means the ProviderConfig controller has stopped: nothing to tell.
            let _ = self.changed.unbounded_send(ObjectRef::new(&name));
        }
    }

    /// The VMs the last completed relist brought in (see the module docs); empty once taken.
    pub fn take_entered(&self) -> Vec<VmRef> {
        std::mem::take(&mut *lock(&self.entered))
    }

    /// The VMs per ProviderConfig among those whose uid `keep` accepts (a sharded replica:
    /// those of the shards it holds).
    pub fn counts_where(&self, keep: impl Fn(&str) -> bool) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for (vm, provider) in &lock(&self.current).provider_of {
            if keep(vm.extra.uid.as_deref().unwrap_or_default()) {
                let n = counts.entry(provider.clone()).or_insert(0u32);
                *n = n.saturating_add(1);
            }
        }
        counts
    }

    /// The VMs referencing the ProviderConfig `name`.
    pub fn vms_of(&self, name: &str) -> Vec<VmRef> {
        lock(&self.current)
            .by_provider
            .get(name)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The uid of every VM this index holds, once a list has completed (`None` before: an
    /// index that has not listed yet would make every machine look like an orphan).
    pub fn uids(&self) -> Option<HashSet<String>> {
        let current = lock(&self.current);
        current.listed.then(|| {
            current
                .provider_of
                .keys()
                .filter_map(|vm| vm.extra.uid.clone())
                .collect()
        })
    }

    /// The VM whose `status.id` is machine `id`, if this index holds one.
    pub fn vm_of_machine(&self, id: &str) -> Option<VmRef> {
        lock(&self.current).by_machine.get(id).cloned()
    }

    /// How many VMs reference the ProviderConfig `name`.
    pub fn count(&self, name: &str) -> usize {
        lock(&self.current)
            .by_provider
            .get(name)
            .map_or(0, HashSet::len)
    }
}

fn providers_differing(a: &Maps, b: &Maps) -> Vec<String> {
    let names: BTreeSet<&String> = a.by_provider.keys().chain(b.by_provider.keys()).collect();
    names
        .into_iter()
        .filter(|n| a.by_provider.get(*n) != b.by_provider.get(*n))
        .cloned()
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::VirtualMachineSpec;
    use futures::{FutureExt, StreamExt};

    fn vm(ns: &str, name: &str, provider: &str) -> VirtualMachine {
        let mut vm =
            VirtualMachine::new(name, VirtualMachineSpec::new(provider, "ami-1", 1, "1Gi"));
        vm.metadata.namespace = Some(ns.into());
        vm
    }

    fn names(refs: Vec<VmRef>) -> Vec<String> {
        let mut names: Vec<String> = refs
            .into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect();
        names.sort();
        names
    }

    fn drain(
        rx: &mut futures::channel::mpsc::UnboundedReceiver<ObjectRef<ProviderConfig>>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(Some(r)) = rx.next().now_or_never() {
            out.push(r.name);
        }
        out.sort();
        out
    }

    #[test]
    fn counts_keep_the_uids_asked_for() {
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        let index = VmIndex::new(tx);
        for (name, provider) in [("one", "aws"), ("two", "aws"), ("three", "gcp")] {
            let mut vm = vm("a", name, provider);
            vm.metadata.uid = Some(format!("uid-{name}"));
            index.observe(&Event::Apply(vm));
        }
        let counts = index.counts_where(|uid| uid != "uid-two");
        assert_eq!(
            counts,
            BTreeMap::from([("aws".to_owned(), 1), ("gcp".to_owned(), 1)])
        );
    }

    #[test]
    fn machines_map_to_the_vm_recording_them() {
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        let index = VmIndex::new(tx);
        assert_eq!(index.uids(), None, "nothing listed yet");
        let mut one = vm("a", "one", "aws");
        one.metadata.uid = Some("u-1".into());
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(one.clone()));
        index.observe(&Event::InitDone);
        assert_eq!(index.uids(), Some(["u-1".to_owned()].into()));
        assert_eq!(index.vm_of_machine("i-1"), None);
        one.status = Some(crate::api::VirtualMachineStatus {
            id: Some("i-1".into()),
            ..Default::default()
        });
        index.observe(&Event::Apply(one.clone()));
        assert_eq!(
            names(index.vm_of_machine("i-1").into_iter().collect()),
            ["a/one"]
        );
        one.status = Some(crate::api::VirtualMachineStatus {
            id: Some("i-2".into()),
            ..Default::default()
        });
        index.observe(&Event::Apply(one.clone()));
        assert_eq!(index.vm_of_machine("i-1"), None, "the old id is forgotten");
        index.observe(&Event::Delete(one));
        assert_eq!(index.vm_of_machine("i-2"), None);
    }

    #[test]
    fn a_relist_tells_which_vms_entered() {
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        let index = VmIndex::new(tx);
        let list = |vms: &[&str]| {
            index.observe(&Event::Init);
            for name in vms {
                index.observe(&Event::InitApply(vm("a", name, "aws")));
            }
            index.observe(&Event::InitDone);
        };
        list(&["one", "two"]);
        assert_eq!(names(index.take_entered()), ["a/one", "a/two"]);
        assert!(index.take_entered().is_empty(), "taken once");
        list(&["two", "three"]);
        assert_eq!(names(index.take_entered()), ["a/three"]);
        list(&["one", "two", "three"]);
        assert_eq!(names(index.take_entered()), ["a/one"], "back after it left");
    }

    #[test]
    fn apply_move_and_delete() {
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        let index = VmIndex::new(tx);
        index.observe(&Event::Apply(vm("a", "one", "aws")));
        index.observe(&Event::Apply(vm("b", "two", "aws")));
        index.observe(&Event::Apply(vm("a", "three", "gcp")));
        assert_eq!(names(index.vms_of("aws")), ["a/one", "b/two"]);
        assert_eq!(index.count("gcp"), 1);
        assert_eq!(drain(&mut rx), ["aws", "aws", "gcp"]);

        // Re-applying an unchanged VM announces nothing.
        index.observe(&Event::Apply(vm("a", "one", "aws")));
        assert!(drain(&mut rx).is_empty());

        index.observe(&Event::Apply(vm("b", "two", "gcp")));
        assert_eq!(names(index.vms_of("aws")), ["a/one"]);
        assert_eq!(drain(&mut rx), ["aws", "gcp"]);

        index.observe(&Event::Delete(vm("a", "one", "aws")));
        assert!(index.vms_of("aws").is_empty());
        assert_eq!(drain(&mut rx), ["aws"]);
    }

    #[test]
    fn relist_replaces_the_index() {
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        let index = VmIndex::new(tx);
        index.observe(&Event::Apply(vm("a", "gone", "aws")));
        index.observe(&Event::Apply(vm("a", "stays", "gcp")));
        drain(&mut rx);

        index.observe(&Event::Init);
        index.observe(&Event::InitApply(vm("a", "stays", "gcp")));
        index.observe(&Event::InitApply(vm("a", "new", "azure")));
        // Until InitDone, the old index is served.
        assert_eq!(index.count("aws"), 1);
        index.observe(&Event::InitDone);
        assert_eq!(index.count("aws"), 0);
        assert_eq!(names(index.vms_of("azure")), ["a/new"]);
        assert_eq!(names(index.vms_of("gcp")), ["a/stays"]);
        assert_eq!(drain(&mut rx), ["aws", "azure"]);
    }
}
