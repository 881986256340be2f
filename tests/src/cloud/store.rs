//! The testcloud's state: machines by id with an index by uid, so every request is O(1) in
//! the number of machines (the scale benchmark keeps 10,000 of them).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Whether a machine runs. Machines are `running` as soon as they are created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Power {
    Running,
    Stopped,
}

/// One machine, as the API answers it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
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
    /// Requests answered, throttled and refused ones included.
    pub requests: u64,
    /// Requests answered 429.
    pub throttled: u64,
    /// Requests answered 401.
    pub unauthorized: u64,
}

/// Every machine, by id, and the ids of each uid in creation order.
#[derive(Debug, Default)]
pub struct Store {
    machines: HashMap<String, Machine>,
    by_uid: HashMap<String, Vec<String>>,
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

    /// Removes the machine; `false` when there was none.
    pub fn delete(&mut self, id: &str) -> bool {
        let Some(machine) = self.machines.remove(id) else {
            return false;
        };
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
