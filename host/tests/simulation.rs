//! A deterministic simulation of the VM reconciler (the FoundationDB way): the real decision
//! loop (`vmop::controller::vm::drive`, which calls `decide`) runs against an in-memory cloud
//! and API server under a paused clock, through thousands of seeded random schedules of
//! faults:
//!
//! - the cloud lags (a new machine stays invisible to `find` and `create`'s own idempotency
//!   check for up to [`MAX_LAG`], as moto's tag search does, and to everything by id, `get`
//!   and `delete` included, for up to [`MAX_ID_LAG`], past the grace period, as EC2's
//!   `InvalidInstanceID.NotFound` for a fresh id; not at all when the schedule's plugin
//!   declares `consistent-get`), loses responses after acting, fails transiently, throttles,
//!   and takes a while to delete;
//! - the operator crashes at any await point (before or after the effect lands), restarting
//!   with a new epoch of knowledge;
//! - the operator reads a stale view of the VM (its informer lags, monotonically);
//! - API writes fail, or land with their answer lost;
//! - the ProviderConfig moves to another location and back;
//! - a drift check's first `get` is answered from the cloud view's listing (as
//!   `provider_config::view` allows), which may still show a machine deleted behind the
//!   operator's back since it was taken; a listing never answers "absent".
//!
//! Invariants checked after every step: at most one live machine per VM, and no machine asked
//! to `delete` twice in one reconcile (a drive that forgot an earlier delete would alternate
//! between two machines while reads lag). After the script
//! ends (the VM deleted, faults stopped, the move reverted): no live machine and no object
//! (so no finalizer) left. A VM whose machine was made while the ProviderConfig pointed
//! elsewhere reports `LocationChanged` after the revert; the simulated user then does what the
//! condition says and points the ProviderConfig back at that location.
//!
//! `simulation/day2.rs` adds day-2 schedules (capabilities, power, resize under both update
//! strategies, edits during faults): no call lacks its capability, no write is asked twice in
//! one reconcile, and the machine converges to the spec or the VM says why not.
//!
//! `simulation/fleet.rs` adds fleets: several replicas and VMs over one API server and cloud,
//! their shards handed over by the scheduler, or (`simulation/timed.rs` over the control plane
//! of `simulation/leases.rs`) held by the replicas' own elections, each replica going by its
//! own clock, while replicas freeze, lose the API server, die, and roll from one layout
//! (leader election, a shard count) to another. Never two replicas holding or calling for one
//! VM at once; every VM converges.
//!
//! A failing seed prints its schedule. `VMOP_SIM_SEED=N` replays one seed (and prints its
//! schedule); `VMOP_SIM_SEEDS=N` sets how many seeds run (default 10,000; the day-2 and
//! lagging-informer schedules run a fifth of them, the lease-timed and rollout schedules a
//! tenth, to keep the binary's run time reasonable).

#[path = "simulation/day2.rs"]
mod day2;
#[path = "simulation/fleet.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use vmop::api::{
    CREATE_LOCATION, CREATE_PARAMETERS, VM_FINALIZER, VirtualMachine, VirtualMachineSpec,
    VirtualMachineStatus, create_parameters_value,
};
use vmop::controller::Error;
use vmop::controller::vm::Attempts;
use vmop::controller::vm::{Effects, Severity};
use vmop::controller::vm::{Facts, drive, facts, is_drift_check, vm_spec};
use vmop::plugin::{
    CallError, Operation, Parameter, ParameterKind, Phase, PluginInfo, ProviderError,
    UpdateOutcome, VmStatus,
};

const GRACE: Duration = Duration::from_secs(30);
/// Read-after-write lag of the fake cloud: within the grace period, as the contract requires.
const MAX_LAG: Duration = Duration::from_secs(20);
/// Lag of reads and writes by id without `consistent-get`: may outlast the grace period, as
/// the fault matrix's "NotFound for ids < 20 s old" does; `find` is what sees the machine then.
const MAX_ID_LAG: Duration = Duration::from_secs(45);
const UID: &str = "0b9f6c1e-uid";
const HOME: &str = "loc-a";
const ELSEWHERE: &str = "loc-b";
/// Steps of faults per schedule, then steps to converge.
const STEPS: u32 = 60;
const SETTLE_STEPS: u32 = 40;

/// splitmix64: small, seedable, good enough to spread schedules.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

#[derive(Debug, Clone)]
struct Machine {
    id: String,
    /// Its ownership mark (ec2's `vmop.dev/uid` tag): what `find` searches and `get` reports
    /// as `owner`; another VM may claim the machine by changing it (`day2.rs`).
    uid: String,
    location: String,
    /// Not terminated.
    live: bool,
    /// When `find` (and `create`'s idempotency check) start to see it.
    visible_at: Duration,
    /// When calls by id (`get`, `delete`, `update`, power) start to see it; a `delete` before
    /// then answers "already gone" and does nothing, as the ec2 plugin does on EC2's NotFound.
    by_id_at: Duration,
    /// While terminating, reads see phase Deleting until then.
    deleting_until: Option<Duration>,
    /// Powered on (`start`/`stop`, or someone at the cloud).
    running: bool,
    /// Its size, as `update` last made it.
    memory_mib: u64,
    /// Launch-only parameter `subnet`, as `create` was handed it (the day-2 schedules).
    subnet: Option<String>,
}

/// What the fake plugin can do (`day2.rs` varies it per seed; the original schedules run
/// with none).
#[derive(Debug, Clone, Copy, Default)]
struct Abilities {
    update: bool,
    power: bool,
    /// `update` resizes a running machine (else it answers needs-restart).
    live_resize: bool,
    /// `update` can only make a new machine: it answers needs-replacement to any change.
    replace_only: bool,
    /// `consistent-get`: calls by id see a machine as soon as `create` answered it.
    consistent_get: bool,
    /// The plugin declares a launch-only parameter `subnet`: `update` must never be asked
    /// while the spec's differs from the machine's.
    launch_only: bool,
}

/// The world one schedule runs in.
struct World {
    rng: Rng,
    now: Duration,
    machines: Vec<Machine>,
    next_id: u32,
    location: String,
    faults: bool,
    /// The fake API server's VirtualMachines: one here, one per VM in `simulation/fleet.rs`.
    objects: Vec<Object>,
    /// The oldest version of the VM the operator's informer may still show.
    informer_floor: usize,
    /// The create in progress reached the cloud's state.
    acted: bool,
    log: Vec<String>,
    abilities: Abilities,
    /// Contract breaches seen by the fake plugin (a call lacking its capability, a write
    /// asked twice in one reconcile).
    violations: Vec<String>,
    /// Another VM claimed the VM's machine at the cloud (`day2.rs`).
    stolen: bool,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut vm = VirtualMachine::new("web", VirtualMachineSpec::new("pc", "img", 1, "1Gi"));
        vm.metadata.namespace = Some("ns".into());
        vm.metadata.uid = Some(UID.into());
        vm.metadata.resource_version = Some("1".into());
        vm.metadata.generation = Some(1);
        World {
            rng: Rng(seed),
            now: Duration::ZERO,
            machines: Vec::new(),
            next_id: 0,
            location: HOME.into(),
            faults: true,
            objects: vec![Object {
                versions: vec![vm],
                gone: false,
            }],
            informer_floor: 0,
            acted: false,
            log: Vec::new(),
            abilities: Abilities::default(),
            violations: Vec::new(),
            stolen: false,
        }
    }

    /// The VM of the single-VM schedules, as the API server has it now.
    fn latest(&self) -> Option<&VirtualMachine> {
        self.objects.first().and_then(Object::latest)
    }

    /// Whether the VM of the single-VM schedules is gone.
    fn gone(&self) -> bool {
        self.latest().is_none()
    }

    fn object(&self, uid: &str) -> Option<&Object> {
        self.objects.iter().find(|o| o.uid() == uid)
    }

    fn note(&mut self, line: String) {
        self.log
            .push(format!("t={:>5}s {line}", self.now.as_secs()));
    }

    /// Stores a new version of the object with `vm`'s uid (bumping its resourceVersion);
    /// answers the new resourceVersion.
    fn commit(&mut self, mut vm: VirtualMachine) -> Option<String> {
        let uid = vm.metadata.uid.clone().unwrap_or_default();
        let object = self.objects.iter_mut().find(|o| o.uid() == uid)?;
        let rv = (object.versions.len() + 1).to_string();
        vm.metadata.resource_version = Some(rv.clone());
        let releasing = vm.metadata.deletion_timestamp.is_some() && vm.finalizers().is_empty();
        object.versions.push(vm);
        if releasing {
            object.gone = true;
            self.note(format!("  api: object {uid} gone"));
        }
        Some(rv)
    }

    /// What the operator's informer shows of the single-VM schedules' VM.
    fn view(&mut self) -> Option<VirtualMachine> {
        let mut floor = self.informer_floor;
        let view = self.view_of(0, &mut floor);
        self.informer_floor = floor;
        view
    }

    /// What an informer whose oldest possible version of object `index` is `floor` shows:
    /// some version between its floor and the newest (a lagging watch never goes back).
    fn view_of(&mut self, index: usize, floor: &mut usize) -> Option<VirtualMachine> {
        let object = self.objects.get(index).filter(|o| !o.gone)?;
        let newest = object.versions.len() - 1;
        let at = if self.faults && self.rng.chance(30) {
            *floor + self.rng.below((newest - *floor + 1) as u64) as usize
        } else {
            newest
        };
        *floor = at;
        self.objects.get(index)?.versions.get(at).cloned()
    }

    fn live_for_uid(&self) -> usize {
        self.live_for(UID)
    }

    /// The live machines marked as `uid`'s.
    fn live_for(&self, uid: &str) -> usize {
        self.machines
            .iter()
            .filter(|m| m.live && m.uid == uid)
            .count()
    }

    /// What a read of `m` at `at` answers, `by_id` (`get`) or by mark (`find`).
    fn seen(&self, m: &Machine, at: &str, by_id: bool) -> Option<VmStatus> {
        let visible_at = if by_id { m.by_id_at } else { m.visible_at };
        if !m.live || self.now < visible_at || m.location != at {
            return None;
        }
        let phase = match m.deleting_until {
            Some(until) if self.now < until => Phase::Deleting,
            Some(_) => return None,
            None if m.running => Phase::Running,
            None => Phase::Stopped,
        };
        Some(VmStatus {
            id: m.id.clone(),
            phase,
            addresses: Vec::new(),
            message: None,
            // Tagged with the uid it was made for, as ec2 does; unmarked if made outside vmop.
            owner: (!m.uid.is_empty()).then(|| m.uid.clone()),
        })
    }

    /// Someone deletes `uid`'s machine at the cloud: the operator must notice and recreate.
    fn terminate_behind_our_back(&mut self, uid: &str) {
        let now = self.now;
        if let Some(m) = self.machines.iter_mut().find(|m| m.live && m.uid == uid) {
            m.deleting_until = Some(now);
            m.live = false;
            let id = m.id.clone();
            self.note(format!("someone terminates {id} at the cloud"));
        }
    }

    /// The clock (already advanced) moved on by `by`.
    fn pass(&mut self, by: Duration) {
        self.now += by;
        self.tick();
    }

    /// Finishes terminations whose time has come.
    fn tick(&mut self) {
        let now = self.now;
        for m in &mut self.machines {
            if m.deleting_until.is_some_and(|until| now >= until) {
                m.live = false;
            }
        }
    }
}

/// One VirtualMachine as the fake API server stores it.
struct Object {
    /// Every version written, newest last.
    versions: Vec<VirtualMachine>,
    /// Its last finalizer was removed while deleting: the object is gone.
    gone: bool,
}

impl Object {
    fn latest(&self) -> Option<&VirtualMachine> {
        if self.gone {
            None
        } else {
            self.versions.last()
        }
    }

    fn uid(&self) -> &str {
        self.versions
            .first()
            .and_then(|vm| vm.metadata.uid.as_deref())
            .unwrap_or_default()
    }
}

/// How one effect call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Ok,
    /// Fails before acting.
    Fail,
    /// Acts, then the answer is lost (reported as a transient failure).
    Lost,
    /// The operator dies before acting.
    CrashBefore,
    /// The operator dies after acting.
    CrashAfter,
    /// The cloud throttles.
    Throttle,
    /// The ProviderConfig's own limiter has no token: nothing is sent.
    OwnThrottle,
}

struct Fake<'w> {
    world: &'w mut World,
    /// The VM reconciled.
    uid: String,
    /// The ProviderConfig as resolved when the reconcile started: every call of the reconcile
    /// goes there, as the real reconciler's calls all go through one resolved Provider.
    location: String,
    /// The object as this reconcile last read or wrote it.
    vm: VirtualMachine,
    crashed: bool,
    /// `spec.memory` of the view this reconcile started from, in MiB.
    desired_mib: u64,
    /// Its parameter `subnet`.
    desired_subnet: Option<String>,
    /// The write calls (`update`, `start`, `stop`) made in this reconcile.
    writes: Vec<Operation>,
    /// The machines `delete` was asked for in this reconcile.
    deletes: Vec<String>,
    /// Calls made in this reconcile: only a drift check's first observation may come from the
    /// cloud view.
    calls: u32,
}

impl Fake<'_> {
    /// Machine `id` as a listing taken before the last change behind the operator's back may
    /// still show it: present, in the power state it had, even if it is gone since.
    fn listed(&mut self, id: &str) -> Option<VmStatus> {
        let first = self.calls == 0;
        if !(first && self.world.faults && is_drift_check(&self.vm) && self.world.rng.chance(40)) {
            return None;
        }
        let m = self
            .world
            .machines
            .iter()
            .find(|m| m.id == id && m.location == self.location)?;
        let status = VmStatus {
            id: m.id.clone(),
            phase: if m.running {
                Phase::Running
            } else {
                Phase::Stopped
            },
            addresses: Vec::new(),
            message: None,
            owner: (!m.uid.is_empty()).then(|| m.uid.clone()),
        };
        self.world
            .note(format!("  get {id}: from the cloud view's listing"));
        Some(status)
    }

    fn fate(&mut self, can_throttle: bool) -> Fate {
        let w = &mut *self.world;
        if !w.faults {
            return Fate::Ok;
        }
        let roll = w.rng.below(100);
        match roll {
            0..=3 => Fate::CrashBefore,
            4..=7 => Fate::CrashAfter,
            8..=15 => Fate::Fail,
            16..=23 => Fate::Lost,
            24..=28 if can_throttle => Fate::Throttle,
            29..=31 => Fate::OwnThrottle,
            _ => Fate::Ok,
        }
    }

    fn transient(op: Operation) -> Error {
        Error::Call {
            op,
            source: CallError::Provider(ProviderError::Transient("simulated".into())),
        }
    }

    fn throttled(op: Operation) -> Error {
        Error::Call {
            op,
            source: CallError::Provider(ProviderError::RateLimited {
                retry_after: Duration::from_secs(2),
                message: "simulated".into(),
            }),
        }
    }

    /// Runs `act` under `fate`; a crash never returns (the operator is gone).
    async fn perform<T>(
        &mut self,
        op: Operation,
        what: String,
        act: impl FnOnce(&mut Fake<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.calls += 1;
        let fate = self.fate(op != Operation::Location);
        self.world.note(format!("  {what}: {fate:?}"));
        match fate {
            Fate::CrashBefore => self.crash().await,
            Fate::Fail => return Err(Self::transient(op)),
            Fate::Throttle => return Err(Self::throttled(op)),
            Fate::OwnThrottle => {
                return Err(Error::Throttled {
                    op,
                    retry_after: Duration::from_millis(300),
                });
            }
            Fate::Ok | Fate::Lost | Fate::CrashAfter => {}
        }
        let result = act(self);
        match fate {
            Fate::CrashAfter => self.crash().await,
            Fate::Lost => Err(Self::transient(op)),
            _ => result,
        }
    }

    async fn crash<T>(&mut self) -> T {
        self.crashed = true;
        std::future::pending::<T>().await
    }

    async fn create_machine(&mut self) -> Result<VmStatus, Error> {
        self.perform(Operation::Create, "create".into(), |f| {
            f.world.acted = true;
            let at = f.location.clone();
            let uid = f.uid.clone();
            let w = &mut *f.world;
            // Idempotent on the uid only as far as the cloud's lagging reads show (the ec2
            // provider's tag search against moto, which ignores ClientToken): a machine made
            // moments ago and not visible yet is not found, and a second one is made.
            let now = w.now;
            let existing = w.machines.iter().find(|m| {
                m.live
                    && m.uid == uid
                    && m.location == at
                    && m.deleting_until.is_none()
                    && now >= m.visible_at
            });
            let id = match existing {
                Some(m) => m.id.clone(),
                None => {
                    w.next_id += 1;
                    let id = format!("i-{}", w.next_id);
                    let lag = Duration::from_secs(w.rng.below(MAX_LAG.as_secs() + 1));
                    let id_lag = if w.abilities.consistent_get {
                        Duration::ZERO
                    } else {
                        Duration::from_secs(w.rng.below(MAX_ID_LAG.as_secs() + 1))
                    };
                    w.machines.push(Machine {
                        id: id.clone(),
                        uid: uid.clone(),
                        location: at,
                        live: true,
                        visible_at: w.now + lag,
                        by_id_at: w.now + id_lag,
                        deleting_until: None,
                        running: true,
                        memory_mib: f.desired_mib,
                        subnet: f.desired_subnet.clone(),
                    });
                    id
                }
            };
            Ok(VmStatus {
                id,
                phase: Phase::Running,
                addresses: Vec::new(),
                message: None,
                owner: Some(uid),
            })
        })
        .await
    }

    /// Records a write call, and a violation when the plugin lacks its capability or it was
    /// already made in this reconcile.
    fn write_call(&mut self, op: Operation, id: &str, capable: bool) {
        self.not_foreign(op, id);
        if !capable {
            self.world
                .violations
                .push(format!("{} called without its capability", op.as_str()));
        }
        if self.writes.contains(&op) {
            self.world
                .violations
                .push(format!("{} called twice in one reconcile", op.as_str()));
        }
        self.writes.push(op);
    }

    /// Records a violation when machine `id` carries another VM's mark: the operator never
    /// writes to another VM's machine (outside changes come only between reconciles, so the
    /// reconcile's own `get` has seen the mark). An unmarked machine (made outside vmop) is
    /// nobody's.
    fn not_foreign(&mut self, op: Operation, id: &str) {
        let uid = &self.uid;
        if let Some(m) = self
            .world
            .machines
            .iter()
            .find(|m| m.id == id && !m.uid.is_empty() && m.uid != *uid)
        {
            let message = format!("{} called on {}, which {} owns", op.as_str(), m.id, m.uid);
            self.world.violations.push(message);
        }
    }

    /// The live, visible machine `id` at this reconcile's location.
    fn machine(&mut self, id: &str) -> Option<&mut Machine> {
        let (now, at) = (self.world.now, self.location.clone());
        self.world.machines.iter_mut().find(|m| {
            m.id == id
                && m.live
                && m.location == at
                && m.deleting_until.is_none()
                && now >= m.by_id_at
        })
    }

    async fn power(&mut self, op: Operation, id: &str, on: bool) -> Result<(), Error> {
        self.write_call(op, id, self.world.abilities.power);
        self.perform(op, format!("{} {id}", op.as_str()), move |f| {
            match f.machine(id) {
                Some(m) => {
                    m.running = on;
                    Ok(())
                }
                None => Err(Fake::transient(op)),
            }
        })
        .await
    }

    fn guarded(&mut self, change: impl FnOnce(&mut VirtualMachine)) -> Result<(), Error> {
        let Some(latest) = self.world.object(&self.uid).and_then(Object::latest) else {
            return Err(conflict());
        };
        if latest.metadata.resource_version != self.vm.metadata.resource_version {
            return Err(conflict());
        }
        let mut next = latest.clone();
        change(&mut next);
        let rv = self.world.commit(next.clone());
        self.vm = next;
        self.vm.metadata.resource_version = rv;
        Ok(())
    }
}

fn conflict() -> Error {
    Error::Kube {
        action: "write",
        source: kube::Error::Api(
            kube::core::Status::failure("conflict", "Conflict")
                .with_code(409)
                .boxed(),
        ),
    }
}

impl Effects for Fake<'_> {
    async fn location(&mut self) -> Result<String, Error> {
        let what = "location".to_owned();
        self.perform(Operation::Location, what, |f| Ok(f.location.clone()))
            .await
    }

    async fn find(&mut self) -> Result<Option<VmStatus>, Error> {
        self.perform(Operation::Find, "find".into(), |f| {
            let w = &*f.world;
            Ok(w.machines
                .iter()
                .filter(|m| m.uid == f.uid)
                .find_map(|m| w.seen(m, &f.location, false)))
        })
        .await
    }

    async fn get(&mut self, id: &str) -> Result<Option<VmStatus>, Error> {
        if let Some(listed) = self.listed(id) {
            return Ok(Some(listed));
        }
        self.perform(Operation::Get, format!("get {id}"), |f| {
            let w = &*f.world;
            Ok(w.machines
                .iter()
                .filter(|m| m.id == id)
                .find_map(|m| w.seen(m, &f.location, true)))
        })
        .await
    }

    async fn create(&mut self) -> (Result<VmStatus, Error>, bool) {
        let result = self.create_machine().await;
        // A failure before acting may or may not have been sent (a refused connection, or a
        // 5xx): claim "not sent" only for some of them, and only when nothing acted.
        let acted = self.world.acted;
        self.world.acted = false;
        let unsent_proof = matches!(result, Err(Error::Throttled { .. }))
            || (!acted && result.is_err() && self.world.rng.chance(50));
        (result, !unsent_proof)
    }
    async fn delete(&mut self, id: &str) -> Result<(), Error> {
        self.not_foreign(Operation::Delete, id);
        if self.deletes.iter().any(|d| d == id) {
            let message = format!("delete {id} asked twice in one reconcile");
            self.world.violations.push(message);
        }
        self.deletes.push(id.to_owned());
        self.perform(Operation::Delete, format!("delete {id}"), |f| {
            let until = f.world.now + Duration::from_secs(f.world.rng.below(8));
            if let Some(m) = f.machine(id) {
                m.deleting_until = Some(until);
            }
            Ok(())
        })
        .await
    }

    async fn update(&mut self, id: &str) -> Result<UpdateOutcome, Error> {
        self.write_call(Operation::Update, id, self.world.abilities.update);
        let subnet = self.desired_subnet.clone();
        if let Some(m) = self
            .world
            .machines
            .iter()
            .find(|m| m.id == id && m.subnet != subnet)
        {
            let message = format!(
                "update of {id} asked with launch-only subnet {subnet:?}; it was made with {:?}",
                m.subnet
            );
            self.world.violations.push(message);
        }
        let desired = self.desired_mib;
        self.perform(Operation::Update, format!("update {id}"), move |f| {
            let live_resize = f.world.abilities.live_resize;
            let replace_only = f.world.abilities.replace_only;
            let uid = f.uid.clone();
            let Some(m) = f.machine(id) else {
                return Err(Fake::transient(Operation::Update));
            };
            // As ec2's `update`: an unmarked machine (adopted) is marked as this VM's; one
            // marked as another's is a transient error.
            if !m.uid.is_empty() && m.uid != uid {
                return Err(Fake::transient(Operation::Update));
            }
            m.uid = uid;
            if m.memory_mib == desired {
                Ok(UpdateOutcome::Applied)
            } else if replace_only {
                Ok(UpdateOutcome::NeedsReplacement)
            } else if !m.running || live_resize {
                m.memory_mib = desired;
                Ok(UpdateOutcome::Applied)
            } else {
                Ok(UpdateOutcome::NeedsRestart)
            }
        })
        .await
    }

    async fn start(&mut self, id: &str) -> Result<(), Error> {
        self.power(Operation::Start, id, true).await
    }

    async fn stop(&mut self, id: &str) -> Result<(), Error> {
        self.power(Operation::Stop, id, false).await
    }

    async fn claimed_by(&mut self, id: &str) -> Result<Option<String>, Error> {
        let id = id.to_owned();
        self.perform(Operation::Get, format!("claimed_by {id}"), move |f| {
            // The API server's VirtualMachines, as the real list reads them: another VM whose
            // status records the machine.
            let claimant = f
                .world
                .objects
                .iter()
                .filter(|o| o.uid() != f.uid)
                .filter_map(Object::latest)
                .find(|vm| vm.status.as_ref().and_then(|s| s.id.as_deref()) == Some(&*id));
            Ok(claimant.map(|vm| format!("ns/{}", vm.name_any())))
        })
        .await
    }

    async fn write_status(&mut self, status: &VirtualMachineStatus) -> Result<(), Error> {
        let status = status.clone();
        self.perform(Operation::Get, "write status".into(), move |f| {
            f.guarded(|vm| vm.status = Some(status))
        })
        .await
    }

    async fn add_finalizer(
        &mut self,
        location: &str,
        parameters: Option<&BTreeMap<String, String>>,
    ) -> Result<(), Error> {
        let location = location.to_owned();
        let parameters = parameters.map(create_parameters_value);
        self.perform(Operation::Get, "add finalizer".into(), move |f| {
            f.guarded(|vm| {
                vm.metadata
                    .finalizers
                    .get_or_insert_with(Vec::new)
                    .push(VM_FINALIZER.into());
                let annotations = vm.annotations_mut();
                annotations.insert(CREATE_LOCATION.into(), location);
                if let Some(parameters) = parameters {
                    annotations.insert(CREATE_PARAMETERS.into(), parameters);
                }
            })
        })
        .await
    }

    async fn intend(
        &mut self,
        location: &str,
        parameters: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        let location = location.to_owned();
        let parameters = create_parameters_value(parameters);
        self.perform(Operation::Get, format!("intend {location}"), move |f| {
            f.guarded(|vm| {
                let annotations = vm.annotations_mut();
                annotations.insert(CREATE_LOCATION.into(), location);
                annotations.insert(CREATE_PARAMETERS.into(), parameters);
            })
        })
        .await
    }

    async fn remove_finalizer(&mut self) -> Result<(), Error> {
        self.perform(Operation::Get, "remove finalizer".into(), |f| {
            f.guarded(|vm| {
                if let Some(list) = &mut vm.metadata.finalizers {
                    list.retain(|x| x != VM_FINALIZER);
                }
            })
        })
        .await
    }

    async fn event(&mut self, _: Severity, _: &str, reason: &str, _: String) {
        self.world.note(format!("  event {reason}"));
    }
}

/// Polls a future whose every await resolves at once, except a crash, which never does.
fn run_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut cx = TaskContext::from_waker(futures::task::noop_waker_ref());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// One reconcile of the VM, as the operator would run it now.
fn reconcile(world: &mut World, attempts: &mut Attempts) {
    let Some(view) = world.view() else {
        return;
    };
    let rv = view.metadata.resource_version.clone().unwrap_or_default();
    world.note(format!("reconcile (view rv {rv})"));
    let Some((facts, mut status, mut fake)) = begin(world, &view, attempts) else {
        return;
    };
    let outcome = run_once(drive(&view, facts, attempts, &mut status, &mut fake));
    let crashed = fake.crashed;
    match outcome {
        Some(Ok(outcome)) => world.note(format!("  -> {outcome:?}")),
        Some(Err(e)) => world.note(format!("  -> error {}", e.reason())),
        None => {
            assert!(crashed, "drive awaited something that never resolved");
            world.note("  -> operator crashed; restarting with a new epoch".into());
            *attempts = Attempts::new();
            world.informer_floor = world.objects.first().map_or(0, |o| o.versions.len() - 1);
        }
    }
}

/// The fake plugin's `info()`: it declares what the schedule's abilities say.
fn plugin_info(abilities: Abilities) -> PluginInfo {
    PluginInfo {
        name: "sim".into(),
        version: "0".into(),
        wit_version: "0.2.0".into(),
        capabilities: [
            ("update", abilities.update),
            ("power", abilities.power),
            ("consistent-get", abilities.consistent_get),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(c, _)| c.to_owned())
        .collect(),
        parameters: abilities
            .launch_only
            .then(|| Parameter {
                name: SUBNET.into(),
                kind: ParameterKind::Text,
                description: "where the machine is attached, at launch only".into(),
                mutable: false,
            })
            .into_iter()
            .collect(),
    }
}

/// The fake plugin's launch-only parameter, when [`Abilities::launch_only`].
const SUBNET: &str = "subnet";

/// A reconcile of `view` as the operator starts one: the facts built from what `attempts`
/// knows and the fake plugin declares, the status it starts from, and the fake effects it
/// runs against (every call to the ProviderConfig's location now).
fn begin<'w>(
    world: &'w mut World,
    view: &VirtualMachine,
    attempts: &Attempts,
) -> Option<(Facts, VirtualMachineStatus, Fake<'w>)> {
    let info = plugin_info(world.abilities);
    let Ok(spec) = vm_spec(view, &info) else {
        world
            .violations
            .push("the simulated VM has no valid spec".into());
        return None;
    };
    let facts = facts(view, attempts, GRACE, Some((&info, &spec)));
    let status = view.status.clone().unwrap_or_default();
    let location = world.location.clone();
    let fake = Fake {
        world,
        uid: view.metadata.uid.clone().unwrap_or_default(),
        location,
        vm: view.clone(),
        crashed: false,
        desired_mib: spec.memory_mib,
        desired_subnet: spec.parameters.get(SUBNET).cloned(),
        writes: Vec::new(),
        deletes: Vec::new(),
        calls: 0,
    };
    Some((facts, status, fake))
}

/// Advances the paused clock and the world together.
async fn advance(world: &mut World, by: Duration) {
    tokio::time::advance(by).await;
    world.pass(by);
}

struct Schedule {
    delete_at: u32,
    move_at: Option<(u32, u32)>,
}

fn schedule(rng: &mut Rng) -> Schedule {
    // Often soon after the first create, while the machine may still be invisible.
    let delete_at = if rng.chance(40) {
        1 + rng.below(6) as u32
    } else {
        5 + rng.below(u64::from(STEPS - 5)) as u32
    };
    let move_at = rng.chance(30).then(|| {
        let from = rng.below(u64::from(STEPS)) as u32;
        (from, from + 1 + rng.below(20) as u32)
    });
    Schedule { delete_at, move_at }
}

/// Runs one seed: what went wrong, if anything, and the schedule as it ran.
async fn simulate(seed: u64) -> (Result<(), String>, Vec<String>) {
    let mut world = World::new(seed);
    let result = run_schedule(&mut world).await;
    (result, std::mem::take(&mut world.log))
}

async fn run_schedule(world: &mut World) -> Result<(), String> {
    let plan = schedule(&mut world.rng);
    world.abilities.consistent_get = world.rng.chance(50);
    if world.abilities.consistent_get {
        world.note("plugin declares consistent-get".into());
    }
    let mut attempts = Attempts::new();
    for step in 0..STEPS + SETTLE_STEPS {
        if step == STEPS {
            world.faults = false;
            world.location = HOME.into();
            world.note("faults stop, location home".into());
        }
        if step == plan.delete_at.min(STEPS) && !world.gone() {
            let mut vm = world.latest().cloned().ok_or("no object")?;
            if vm.metadata.deletion_timestamp.is_none() {
                vm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
                world.note("user deletes the VM".into());
                world.commit(vm);
            }
        }
        if let Some((from, to)) = plan.move_at {
            if step == from {
                world.location = ELSEWHERE.into();
                world.note("ProviderConfig moves".into());
            } else if step == to {
                world.location = HOME.into();
                world.note("ProviderConfig moves back".into());
            }
        }
        if step >= STEPS
            && let Some(back) = world.latest().and_then(blocked_at)
        {
            world.note(format!("user points the ProviderConfig back at {back}"));
            world.location = back;
        }
        reconcile(world, &mut attempts);
        if let Some(v) = world.violations.first() {
            return Err(format!("step {step}: {v}"));
        }
        let live = world.live_for_uid();
        if live > 1 {
            return Err(format!(
                "{live} live machines for one VM at step {step} (duplicated)"
            ));
        }
        if world.faults && world.rng.chance(4) {
            world.terminate_behind_our_back(UID);
        }
        let by = if world.rng.chance(50) {
            Duration::from_secs(world.rng.below(4))
        } else {
            Duration::from_secs(world.rng.below(15))
        };
        advance(world, by).await;
    }
    if !world.gone() {
        return Err(
            "the VM object (and its finalizer) is still there after the faults stopped (stuck)"
                .into(),
        );
    }
    if world.live_for_uid() > 0 {
        return Err("a live machine was left behind (leaked)".into());
    }
    Ok(())
}

/// Where a VM blocked by `LocationChanged` says its machine may be.
fn blocked_at(vm: &VirtualMachine) -> Option<String> {
    let status = vm.status.as_ref()?;
    let synced = status.conditions.iter().find(|c| c.type_ == "Synced")?;
    if synced.reason != "LocationChanged" {
        return None;
    }
    match &status.id {
        Some(_) => status.location.clone(),
        None => vm.annotations().get(CREATE_LOCATION).cloned(),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The seeds to run: `VMOP_SIM_SEED` alone, else the first `VMOP_SIM_SEEDS` (default 10,000)
/// divided by `divisor`.
fn seeds(divisor: u64) -> Vec<u64> {
    match env_u64("VMOP_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("VMOP_SIM_SEEDS").unwrap_or(10_000) / divisor).collect(),
    }
}

/// Runs `one` for every seed: the failures, each with its schedule as it ran. A single seed's
/// schedule is printed.
#[allow(clippy::print_stdout)] // The replayed schedule and the run's figures are the report.
async fn failures<Fut>(
    name: &str,
    seeds: &[u64],
    mut one: impl FnMut(u64) -> Fut,
) -> Vec<(u64, String, Vec<String>)>
where
    Fut: Future<Output = (Result<(), String>, Vec<String>)>,
{
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    for &seed in seeds {
        let (result, log) = one(seed).await;
        if seeds.len() == 1 {
            println!("{}", log.join("\n"));
        }
        if let Err(why) = result {
            failures.push((seed, why, log));
        }
    }
    println!(
        "{name}: {} seeds, {:?} wall, {} failed",
        seeds.len(),
        started.elapsed(),
        failures.len()
    );
    failures
}

/// Fails with the first failure's schedule and how to replay it.
#[allow(clippy::panic)] // Called from the tests alone: their failure.
fn assert_none_failed(seeds: &[u64], failures: &[(u64, String, Vec<String>)]) {
    if let Some((seed, why, log)) = failures.first() {
        let seeds_failed: Vec<u64> = failures.iter().map(|f| f.0).take(20).collect();
        panic!(
            "{} of {} seeds failed ({seeds_failed:?}...); first: seed {seed}: {why}\n\
             replay with VMOP_SIM_SEED={seed}\n{}",
            failures.len(),
            seeds.len(),
            log.join("\n")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn no_schedule_leaks_duplicates_or_sticks() {
    let seeds = seeds(1);
    let failed = failures("simulation", &seeds, simulate).await;
    assert_none_failed(&seeds, &failed);
}

#[tokio::test(start_paused = true)]
async fn day2_schedules_respect_capabilities_and_converge() {
    let seeds = seeds(5);
    let failed = failures("day-2 simulation", &seeds, |seed| async move {
        let mut world = World::new(seed);
        let result = day2::run(&mut world).await;
        (result, std::mem::take(&mut world.log))
    })
    .await;
    assert_none_failed(&seeds, &failed);
}

/// A machine this process made alone (`Attempts::sole_machine`, which lets deletion skip the
/// first `get`) but that a later `get` showed under another VM's mark is observed before it
/// is deleted, and so left to that VM (`Attempts::observe_first`; without it the deletion
/// asks `delete` of the other VM's machine at once). No faults, so nothing else (a crash, a
/// lost answer) clears `sole_machine` first, as it does in most random schedules.
#[tokio::test(start_paused = true)]
async fn a_machine_seen_under_another_mark_is_observed_before_any_delete() {
    let mut world = World::new(0);
    world.faults = false;
    let mut attempts = Attempts::new();
    for _ in 0..3 {
        reconcile(&mut world, &mut attempts);
        advance(&mut world, Duration::from_secs(5)).await;
    }
    assert_eq!(world.live_for_uid(), 1, "{}", world.log.join("\n"));
    day2::claim_outside(&mut world);
    reconcile(&mut world, &mut attempts);
    let mut vm = world.latest().cloned().expect("the VM exists");
    vm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    world.commit(vm);
    for _ in 0..SETTLE_STEPS {
        reconcile(&mut world, &mut attempts);
        advance(&mut world, Duration::from_secs(5)).await;
    }
    let log = world.log.join("\n");
    assert_eq!(world.violations, Vec::<String>::new(), "{log}");
    assert!(world.gone(), "the VM is still there: {log}");
    assert!(
        world
            .machines
            .iter()
            .any(|m| m.live && m.deleting_until.is_none()),
        "the claimed machine was deleted: {log}"
    );
}

/// Runs the fleet schedules of `variant` for every `divisor`-th part of the seeds.
async fn fleet_seeds(name: &str, variant: fleet::Variant, divisor: u64) {
    let seeds = seeds(divisor);
    let failed = failures(name, &seeds, |seed| fleet::run(World::new(seed), variant)).await;
    assert_none_failed(&seeds, &failed);
}

#[tokio::test(start_paused = true)]
async fn fleet_schedules_keep_one_machine_per_vm_and_one_replica_per_call() {
    fleet_seeds("fleet simulation", fleet::Variant::Default, 1).await;
}

/// What `Attempts::acquired` prevents: without the acquisition hook, a replica taking a shard
/// over believes a lagging "none" at once (its own epoch began long ago), though the replica
/// that lost the shard may have just created. Ignored: it fails on purpose; it shows the fleet
/// schedules find the bug the hook fixes.
#[tokio::test(start_paused = true)]
#[ignore = "fails on purpose: the fleet without the acquisition hook"]
async fn fleet_without_the_acquisition_hook_duplicates() {
    fleet_seeds(
        "fleet simulation without the hook",
        fleet::Variant::WithoutHook,
        1,
    )
    .await;
}

/// Two VMs naming one machine in `spec.externalId`: adoption checks that no other VM records
/// the machine, then records it (check-then-act), so two reconciles in flight at once can both
/// adopt it (5 of 10,000 seeds: 1933, 2300, 2913 and 4949 end with the machine recorded by two
/// VMs, 5150 with `update` asked of it by the VM whose mark it no longer carries). Not fixed in
/// the product: it needs a claim the cloud holds; ignored until it is.
#[tokio::test(start_paused = true)]
#[ignore = "a known product gap: concurrent adoption of one machine by two VMs"]
async fn fleet_two_vms_adopting_one_machine() {
    fleet_seeds(
        "fleet simulation, shared externalId",
        fleet::Variant::SharedAdoption,
        1,
    )
    .await;
}

/// A replica's informer still lagging when it takes a shard over (an API server without the
/// sharded watch: nothing is listed again on acquisition). It shows the VM without the
/// finalizer the previous holder added before it created; the new holder's finalizer patch is
/// refused (409). Before `act.rs` forgot `finalizer_added` on a refused patch, the replica then
/// believed the VM never created: its next reconcile created without `find` or grace (a second
/// machine: seeds 1137, 2082) or, the VM deleted, released the finalizer without a cloud call
/// (a leaked machine: seeds 1820, 3458), 14 of 10,000 seeds. A fifth of the seeds: the
/// default schedules cover the rest of the fleet's behaviour.
#[tokio::test(start_paused = true)]
async fn fleet_schedules_with_an_informer_lagging_across_hand_overs() {
    fleet_seeds(
        "fleet simulation, lagging informer",
        fleet::Variant::LaggingInformer,
        5,
    )
    .await;
}

/// Runs the lease-timed fleet schedules of `variant` for every `divisor`-th part of the seeds.
async fn lease_seeds(name: &str, variant: fleet::Variant, kind: fleet::Timed, divisor: u64) {
    let seeds = seeds(divisor);
    let failed = failures(name, &seeds, |seed| {
        fleet::run_timed(World::new(seed), variant, kind)
    })
    .await;
    assert_none_failed(&seeds, &failed);
}

const LEASES: fleet::Timed = fleet::Timed { rollouts: false };
const ROLLOUTS: fleet::Timed = fleet::Timed { rollouts: true };

/// Lease-timed fleets (`simulation/timed.rs`): Lease expiry by each replica's own clock, the
/// clocks' rates inside the bound, replicas frozen, cut off from the API server, killed and
/// restarted; one layout throughout. A tenth of the seeds.
#[tokio::test(start_paused = true)]
async fn fleet_leases_under_clock_skew_freezes_and_partitions_never_overlap() {
    lease_seeds("fleet, lease-timed", fleet::Variant::Default, LEASES, 10).await;
}

/// What the validity check prevents (`leader/validity.rs`, checked before a reconcile is
/// polled): without it, a replica resuming from a freeze past its Lease keeps calling until its
/// elector has run and stepped down. Ignored: it fails on purpose (206 of 1,000 seeds; seed 9 a
/// leader calls `get` 5 s past its deadline by its clock; seed 68 replica 1, frozen in a
/// reconcile of vm-6 from 44 s to 71 s, calls `location` for it while replica 0, which took
/// `vmop-shard-2` over at 61 s, holds it).
#[tokio::test(start_paused = true)]
#[ignore = "fails on purpose: without the validity check a replica resuming from a freeze past \
            its Lease calls (seed 9), while another replica holds the VM (seed 68)"]
async fn fleet_leases_without_the_validity_check_overlap() {
    lease_seeds(
        "fleet, lease-timed, without validity",
        fleet::Variant::WithoutValidity,
        LEASES,
        10,
    )
    .await;
}

/// Clocks at 0.5 to 1.5 of the simulation's, far beyond the bound (a holder's clock may run
/// at no less than `renew_deadline / lease_duration` = 2/3 of a candidate's): a slow holder cut
/// off from the API server still holds by its clock when a fast candidate takes over. Ignored:
/// it fails on purpose (55 of 1,000 seeds; seed 14: replica 1 at 0.50, partitioned, holds
/// `vmop-shard-1` until 34.4 s by its clock, which reads 29.9 s, when replica 2 at 1.50 takes
/// it over).
#[tokio::test(start_paused = true)]
#[ignore = "fails on purpose: clock skew beyond the bound lets two replicas hold a shard \
            (seed 14)"]
async fn fleet_leases_with_clock_skew_beyond_the_bound_overlap() {
    lease_seeds(
        "fleet, lease-timed, skew beyond the bound",
        fleet::Variant::SkewBeyondBound,
        LEASES,
        10,
    )
    .await;
}

/// Lease-timed fleets rolled from one layout to another (a shard count to another, leader
/// election to shards and back) once or twice during the faults, behind the layout fence
/// (`leader/layout.rs`, `fence.rs`). A tenth of the seeds. After the faults stop, every VM must
/// be served again within the deadline: a switch abandoned midway strands no Lease.
#[tokio::test(start_paused = true)]
async fn fleet_rollouts_that_change_the_layout_never_overlap() {
    lease_seeds("fleet, rollouts", fleet::Variant::Default, ROLLOUTS, 10).await;
}

/// What the layout fence prevents: without it, the new layout's replicas campaign for their
/// Leases at once, beside the old layout's. Ignored: it fails on purpose (550 of 1,000 seeds;
/// seed 3: a `--shards 4` replica takes `vmop-shard-3` while a `--shards 2` replica holds
/// `vmop-shard-1`, both covering vm-2).
#[tokio::test(start_paused = true)]
#[ignore = "fails on purpose: without the layout fence two layouts hold one VM (seed 3)"]
async fn fleet_rollouts_without_the_layout_fence_overlap() {
    lease_seeds(
        "fleet, rollouts, unfenced",
        fleet::Variant::Unfenced,
        ROLLOUTS,
        10,
    )
    .await;
}

/// What the stamps prevent: a switch that publishes the new layout without stamping the
/// outgoing Leases lets an old replica whose fence is stale (cut off from the API server, or
/// frozen) take or renew one after the switch. Ignored: it fails on purpose (56 of 1,000
/// seeds; seed 24: a `--shards 4` replica switches from leader election at 76 s; a leader
/// replica cut off until 77 s, its fence still at the old generation, takes `vmop` at 77 s
/// while `vmop-shard-0` is held, both covering vm-1).
#[tokio::test(start_paused = true)]
#[ignore = "fails on purpose: a switch without stamps lets a stale replica in (seed 24)"]
async fn fleet_rollouts_with_an_unstamped_switch_overlap() {
    lease_seeds(
        "fleet, rollouts, unstamped switch",
        fleet::Variant::UnstampedSwitch,
        ROLLOUTS,
        10,
    )
    .await;
}

/// What republishing the layout at a stranded stamp prevents (`layout.rs`
/// `adopt_stranded_stamps`): a switch stamps the outgoing Leases one by one and gives up at the
/// first conflict, leaving those already stamped with a generation never published; without
/// the republish the layout in force is never admitted to them again, and their VMs are never
/// reconciled. It happens when a replica of the old layout, seeing the new layout's Leases all
/// free right after a switch, switches back while the new layout's replicas take them. Ignored:
/// it fails on purpose (7 of 1,000 seeds before the fix; seed 93: after the switch from
/// `--shards 4` to `--shards 2` at generation 2, a `--shards 4` replica stamps `vmop-shard-0`
/// with generation 3 and conflicts on `vmop-shard-1`).
#[tokio::test(start_paused = true)]
#[ignore = "fails on purpose: without the republish a switch that conflicts midway strands a \
            Lease (seed 93)"]
async fn fleet_rollouts_without_the_republish_strand_a_lease() {
    lease_seeds(
        "fleet, rollouts, without the republish",
        fleet::Variant::WithoutRepublish,
        ROLLOUTS,
        10,
    )
    .await;
}
