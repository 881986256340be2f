//! The testcloud's state: machines ordered by id, with an index by uid and one by cluster tag,
//! so every request costs O(log n) in the number of machines, plus O(page) for a listing (the
//! scale benchmark keeps 10,000 of them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use serde::{Deserialize, Serialize};

/// Whether a machine runs. Machines are `running` as soon as they are created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Power {
    Running,
    Stopped,
}

/// The tag naming the cluster (the operator installation) a machine belongs to: the cluster
/// index and `GET /v1/machines?cluster=` filter on it.
pub const CLUSTER_TAG: &str = "vmop.dev/cluster";

/// One machine, as the API answers it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// `tc-` and the creation number in 8 lowercase hex digits (`tc-0000002a`): ids sort
    /// (as strings) in creation order for the first 2^32 machines of a cloud, which is the
    /// order listings page in.
    pub id: String,
    pub uid: String,
    pub image: String,
    pub cpu: u32,
    pub memory_mib: u64,
    pub state: Power,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    pub tags: BTreeMap<String, String>,
    pub addresses: Vec<String>,
    /// The creation sequence number: a stable "oldest first" order among machines of one uid.
    pub created: u64,
}

/// The body of `POST /v1/machines`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewMachine {
    pub uid: String,
    pub image: String,
    pub cpu: u32,
    pub memory_mib: u64,
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Make the machine only if the uid has none: otherwise answer its oldest (a conditional
    /// create, atomic in the store, as clouds' client tokens and request ids make creates).
    #[serde(default)]
    pub if_absent: bool,
}

/// The body of `PATCH /v1/machines/{id}`: the fields to change.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resize {
    #[serde(default)]
    pub cpu: Option<u32>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
}

/// Why a resize was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeError {
    NotFound,
    /// A change to a running machine: the API asks for a stop first.
    Running,
}

/// Counts since the cloud started, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub created: u64,
    pub deleted: u64,
    pub live: u64,
    /// Requests answered, throttled and refused ones included (the harness's own
    /// `/v1/stats` and `/v1/limits` too).
    pub requests: u64,
    /// Requests answered 429.
    pub throttled: u64,
    /// Requests answered 401.
    pub unauthorized: u64,
    /// Calls of the cloud's API that read (`GET`, EC2's non-mutating actions), throttled and
    /// refused ones included; not the harness's routes.
    pub reads: u64,
    /// Calls of the cloud's API that change something (any other method, EC2's mutating
    /// actions), throttled and refused ones included; not the harness's routes.
    pub mutates: u64,
    /// Reads answered 429 (by either throttle).
    pub throttled_reads: u64,
    /// Mutating calls answered 429 (by either throttle).
    pub throttled_mutates: u64,
    /// Of [`Stats::throttled_mutates`], those the EC2-like mode refused for want of a resource
    /// token (`RunInstances`, `TerminateInstances`) while the mutate bucket had one.
    pub throttled_by_resource: u64,
}

/// One page of a listing: the machines, and the id to ask `after` for the next page (`None`:
/// this was the last page).
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub machines: Vec<Machine>,
    pub next: Option<String>,
}

/// Every machine, by id (which is creation order, see [`Machine::id`]), the ids of each uid in
/// creation order, and the ids of each [`CLUSTER_TAG`] value. Tags are fixed at creation, so
/// the cluster index changes only on create and delete.
#[derive(Debug, Default)]
pub struct Store {
    machines: BTreeMap<String, Machine>,
    by_uid: HashMap<String, Vec<String>>,
    by_cluster: HashMap<String, BTreeSet<String>>,
    next: u64,
    pub stats: Stats,
}

impl Store {
    /// The uid's oldest machine when `new.if_absent` and it has one (`false`: not made);
    /// otherwise a new machine (`true`).
    pub fn create_if_absent(&mut self, new: NewMachine) -> (Machine, bool) {
        if new.if_absent
            && let Some(existing) = self.by_uid(&new.uid).into_iter().next()
        {
            return (existing, false);
        }
        (self.create(new), true)
    }

    /// Makes a machine (running at once), whatever the uid already has: keeping `create`
    /// idempotent is then the provider's job, which the conformance kit checks.
    /// [`Store::create_if_absent`] is the conditional create.
    pub fn create(&mut self, new: NewMachine) -> Machine {
        self.next += 1;
        let n = self.next;
        let machine = Machine {
            id: format!("tc-{n:08x}"),
            uid: new.uid,
            image: new.image,
            cpu: new.cpu,
            memory_mib: new.memory_mib,
            state: Power::Running,
            user_data: new.user_data,
            tags: new.tags,
            addresses: vec![format!(
                "10.{}.{}.{}",
                (n >> 16) & 0xff,
                (n >> 8) & 0xff,
                n & 0xff
            )],
            created: n,
        };
        self.by_uid
            .entry(machine.uid.clone())
            .or_default()
            .push(machine.id.clone());
        if let Some(cluster) = machine.tags.get(CLUSTER_TAG) {
            self.by_cluster
                .entry(cluster.clone())
                .or_default()
                .insert(machine.id.clone());
        }
        self.machines.insert(machine.id.clone(), machine.clone());
        self.stats.created += 1;
        self.stats.live += 1;
        machine
    }

    pub fn get(&self, id: &str) -> Option<&Machine> {
        self.machines.get(id)
    }

    /// The machines made for `uid`, oldest first.
    pub fn by_uid(&self, uid: &str) -> Vec<Machine> {
        self.by_uid
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|id| self.machines.get(id))
            .cloned()
            .collect()
    }

    /// Every machine, oldest first (O(n): for inspection, not for the providers' paths).
    pub fn all(&self) -> Vec<Machine> {
        let mut all: Vec<Machine> = self.machines.values().cloned().collect();
        all.sort_by_key(|m| m.created);
        all
    }

    /// At most `limit` machines (at least one is always asked for) in id order, those whose
    /// [`CLUSTER_TAG`] is `cluster` when given, starting strictly after the id `after` when
    /// given (which need not exist any more: a machine deleted between two pages is simply not
    /// there). `next` is the page's last id when more machines follow, else `None`. Costs
    /// O(log n + limit), whatever `after` is.
    pub fn page(&self, cluster: Option<&str>, after: Option<&str>, limit: usize) -> Page {
        let limit = limit.max(1);
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut machines: Vec<Machine> = match cluster {
            None => self
                .machines
                .range::<str, _>((from, Bound::Unbounded))
                .take(limit + 1)
                .map(|(_, m)| m.clone())
                .collect(),
            Some(cluster) => self
                .by_cluster
                .get(cluster)
                .into_iter()
                .flat_map(|ids| ids.range::<str, _>((from, Bound::Unbounded)))
                .filter_map(|id| self.machines.get(id))
                .take(limit + 1)
                .cloned()
                .collect(),
        };
        let next = if machines.len() > limit {
            machines.truncate(limit);
            machines.last().map(|m| m.id.clone())
        } else {
            None
        };
        Page { machines, next }
    }

    /// Removes the machine; `false` when there was none.
    pub fn delete(&mut self, id: &str) -> bool {
        let Some(machine) = self.machines.remove(id) else {
            return false;
        };
        if let Some(cluster) = machine.tags.get(CLUSTER_TAG)
            && let Some(ids) = self.by_cluster.get_mut(cluster)
        {
            ids.remove(id);
            if ids.is_empty() {
                self.by_cluster.remove(cluster);
            }
        }
        if let Some(ids) = self.by_uid.get_mut(&machine.uid) {
            ids.retain(|other| other != id);
            if ids.is_empty() {
                self.by_uid.remove(&machine.uid);
            }
        }
        self.stats.deleted += 1;
        self.stats.live = self.stats.live.saturating_sub(1);
        true
    }

    /// Sets the machine's power state (idempotent); `None` when there is no such machine.
    pub fn power(&mut self, id: &str, state: Power) -> Option<Machine> {
        let machine = self.machines.get_mut(id)?;
        machine.state = state;
        Some(machine.clone())
    }

    /// Applies a resize. A change of a running machine is refused; asking for the current
    /// size is a no-op whatever the state.
    pub fn resize(&mut self, id: &str, resize: &Resize) -> Result<Machine, ResizeError> {
        let machine = self.machines.get_mut(id).ok_or(ResizeError::NotFound)?;
        let cpu = resize.cpu.unwrap_or(machine.cpu);
        let memory_mib = resize.memory_mib.unwrap_or(machine.memory_mib);
        let changed = cpu != machine.cpu || memory_mib != machine.memory_mib;
        if changed && machine.state == Power::Running {
            return Err(ResizeError::Running);
        }
        machine.cpu = cpu;
        machine.memory_mib = memory_mib;
        Ok(machine.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(uid: &str) -> NewMachine {
        NewMachine {
            uid: uid.into(),
            image: "img".into(),
            cpu: 1,
            memory_mib: 512,
            user_data: None,
            tags: BTreeMap::new(),
            if_absent: false,
        }
    }

    fn in_cluster(uid: &str, cluster: &str) -> NewMachine {
        NewMachine {
            tags: BTreeMap::from([(CLUSTER_TAG.to_owned(), cluster.to_owned())]),
            ..new(uid)
        }
    }

    /// Every page of a listing, following `next` from the start.
    fn pages(store: &Store, cluster: Option<&str>, limit: usize) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = store.page(cluster, after.as_deref(), limit);
            out.push(page.machines.iter().map(|m| m.id.clone()).collect());
            match page.next {
                Some(next) => after = Some(next),
                None => return out,
            }
        }
    }

    #[test]
    fn ids_sort_in_creation_order() {
        let mut store = Store::default();
        let ids: Vec<String> = (0..300)
            .map(|i| store.create(new(&i.to_string())).id)
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert_eq!(ids.get(41).map(String::as_str), Some("tc-0000002a"));
    }

    #[test]
    fn pages_list_every_machine_once_in_id_order() {
        let mut store = Store::default();
        let ids: Vec<String> = (0..10)
            .map(|i| store.create(new(&i.to_string())).id)
            .collect();
        let got = pages(&store, None, 3);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 1]);
        assert_eq!(got.concat(), ids);
        // A page that ends exactly at the last machine says so: no empty page after it.
        let got = pages(&store, None, 5);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5]);
        assert_eq!(pages(&store, None, 1000), [ids.clone()].as_slice());
        assert_eq!(pages(&Store::default(), None, 10), [Vec::<String>::new()]);
        let last = store.page(None, ids.last().map(String::as_str), 10);
        assert!(last.machines.is_empty() && last.next.is_none());
    }

    #[test]
    fn a_machine_deleted_between_pages_is_skipped() {
        let mut store = Store::default();
        let ids: Vec<String> = (0..6)
            .map(|i| store.create(new(&i.to_string())).id)
            .collect();
        let [_, a1, a2, a3, a4, _] = ids.as_slice() else {
            panic!("{ids:?}");
        };
        let first = store.page(None, None, 2);
        let after = first.next.clone().unwrap_or_default();
        assert_eq!(&after, a1);
        // The page's own last machine and the next one both go before the next page.
        assert!(store.delete(a1) && store.delete(a2));
        let second = store.page(None, Some(&after), 2);
        let got: Vec<&String> = second.machines.iter().map(|m| &m.id).collect();
        assert_eq!(got, [a3, a4]);
        let third = store.page(None, second.next.as_deref(), 2);
        assert_eq!(third.machines.len(), 1);
        assert_eq!(third.next, None);
    }

    #[test]
    fn the_cluster_filter_pages_through_that_clusters_machines_only() {
        let mut store = Store::default();
        let mut a = Vec::new();
        for i in 0..7 {
            a.push(store.create(in_cluster(&format!("a{i}"), "a")).id);
            store.create(in_cluster(&format!("b{i}"), "b"));
            store.create(new(&format!("none{i}")));
        }
        assert_eq!(pages(&store, Some("a"), 3).concat(), a);
        assert_eq!(pages(&store, Some("b"), 2).concat().len(), 7);
        assert_eq!(pages(&store, None, 4).concat().len(), 21);
        assert_eq!(pages(&store, Some("c"), 3), [Vec::<String>::new()]);
        for id in &a {
            assert!(store.delete(id));
        }
        assert_eq!(pages(&store, Some("a"), 3), [Vec::<String>::new()]);
        assert!(
            !store.by_cluster.contains_key("a"),
            "an empty cluster leaves no entry"
        );
        assert_eq!(pages(&store, Some("b"), 100).concat().len(), 7);
    }

    #[test]
    fn a_conditional_create_answers_the_uids_oldest_machine() {
        let mut store = Store::default();
        let conditional = |uid: &str| NewMachine {
            if_absent: true,
            ..new(uid)
        };
        let (first, made) = store.create_if_absent(conditional("u1"));
        assert!(made);
        let (again, made) = store.create_if_absent(conditional("u1"));
        assert!(!made);
        assert_eq!(again.id, first.id);
        let (_, made) = store.create_if_absent(new("u1"));
        assert!(made, "without if_absent every create makes a machine");
        assert!(store.delete(&first.id));
        let (other, made) = store.create_if_absent(conditional("u1"));
        assert!(!made, "answers the uid's remaining machine");
        assert_ne!(other.id, first.id);
        assert_eq!(store.stats.created, 2);
    }

    #[test]
    fn the_uid_index_follows_creates_and_deletes() {
        let mut store = Store::default();
        let a = store.create(new("u1"));
        let b = store.create(new("u1"));
        store.create(new("u2"));
        let ids: Vec<String> = store.by_uid("u1").into_iter().map(|m| m.id).collect();
        assert_eq!(ids, [a.id.clone(), b.id.clone()]);
        assert!(store.delete(&a.id));
        assert!(!store.delete(&a.id));
        assert_eq!(store.by_uid("u1").len(), 1);
        assert!(store.delete(&b.id));
        assert!(store.by_uid("u1").is_empty());
        assert_eq!(
            (store.stats.created, store.stats.deleted, store.stats.live),
            (3, 2, 1)
        );
    }

    #[test]
    fn a_running_machine_is_resized_only_to_its_own_size() {
        let mut store = Store::default();
        let m = store.create(new("u"));
        let same = Resize {
            cpu: Some(1),
            memory_mib: None,
        };
        assert!(store.resize(&m.id, &same).is_ok());
        let bigger = Resize {
            cpu: Some(4),
            memory_mib: Some(4096),
        };
        assert_eq!(
            store.resize(&m.id, &bigger).err(),
            Some(ResizeError::Running)
        );
        store.power(&m.id, Power::Stopped);
        let resized = store.resize(&m.id, &bigger).ok();
        assert_eq!(resized.map(|m| (m.cpu, m.memory_mib)), Some((4, 4096)));
        assert_eq!(
            store.resize("nope", &same).err(),
            Some(ResizeError::NotFound)
        );
    }
}
