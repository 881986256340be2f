//! Fleet schedules for the simulation: several replicas of the operator and many VMs over the
//! one fake API server and fake cloud of `simulation.rs`, the VMs split into shards
//! ([`shard_of`]) that move between the replicas. Two kinds:
//!
//! - Hand-over schedules (this file): 1–5 replicas, 1–50 VMs, 1–4 shards. The scheduler moves
//!   the shards itself, and a lost shard is free at once: the harshest hand-over for creates.
//! - Lease-timed schedules (`timed.rs`, over the control plane of `leases.rs`): 1–4 replicas,
//!   1–24 VMs, leader election or 2–4 shards. Who holds what is decided by the replicas'
//!   electors, shard campaigns and layout followers as `host/src/leader/` runs them, with the
//!   product's timings (15 s lease, 10 s renew deadline, 2 s retry period), each replica going
//!   by its own clock: a holder's hold is valid only until its last successful renewal's start
//!   plus the renew deadline by its clock, a candidate takes a Lease over only once it has seen
//!   the same version for the lease duration by its clock. Clocks run at rates of ±5% or ±19%
//!   (the slowest at more than `renew_deadline / lease_duration` of the fastest: inside the
//!   bound). Replicas freeze (SIGSTOP: nothing of them runs, their clocks run on) for up to
//!   40 s and resume, lose the API server (not the cloud) for up to 30 s, die and restart as a
//!   new process, stop gracefully (releasing their Leases), and, in the rollout schedules, roll
//!   from one layout to another (shard count A to B, leader election to shards and back; one
//!   surge pod; old pods stopped or killed), once or twice (the second maybe back).
//!
//! What is modelled, and why:
//!
//! - Each replica has its own create knowledge ([`Attempts`], shared by its reconciles as the
//!   real process shares `ctx.attempts`) and its own informer (a stale view per VM, never going
//!   back).
//! - Reconciles run concurrently: each is the real `drive` as a future, and every effect is two
//!   await points, one before the request is sent and one while its answer is in flight. The
//!   scheduler polls one reconcile at a time by one await point, in a seeded order, so the
//!   reconciles of one replica (and of several) interleave at every await point.
//! - The lease rule, as `leader/shards.rs` and `controller/runtime/sharding.rs` implement it: a
//!   replica reconciles a VM only while it holds its shard; a shard lost (a failed renewal, a
//!   rebalance, a freeze past the lease, a crash) drops that replica's reconciles of its VMs at
//!   whatever await point they are (`while_holding`'s select). Hand-over schedules: a shard has
//!   at most one holder, and another replica acquires it only once the loser's reconciles are
//!   dropped. Lease-timed: every reconcile checks its hold (valid by its replica's clock)
//!   before each await point it passes, as the biased select does for a process resuming from
//!   a freeze; in the leader layout the controllers start (new `Attempts`, a fresh list) on
//!   acquisition, and a loss ends the process. Acquisition calls the hook the real replica
//!   calls (`on_acquiring`: [`Attempts::acquired`]), so that the creation grace period starts
//!   over for the shard's VMs. A reconcile dropped inside `create` leaves its `CreateAttempt`
//!   guard to record a create that may have reached the cloud.
//! - Replicas die at any await point (the fake's crash fates) and come back as a new process
//!   (new `Attempts`); in the hand-over schedules others lose all their shards and keep
//!   running with their memory (a partition or a freeze: their reconciles are dropped, their
//!   `Attempts` kept).
//! - The cloud of `simulation.rs`: lag on `find` and on calls by id (unless the plugin declares
//!   `consistent-get`), answers lost after acting, failures, throttling; someone terminates
//!   machines behind the operator's back. The ProviderConfig does not move here (the single-VM
//!   schedules cover moves).
//! - Day 2, where cheap: some VMs adopt an unmarked machine made outside vmop (`spec.externalId`),
//!   some of them only observe it (`managementPolicy: ObserveOnly`), and users pause and
//!   unpause VMs (`vmop.dev/paused`) while faults run.
//!
//! Checked after every step: at most one live machine marked as any VM's; no machine recorded
//! (`status.id`) by two VMs; never a plugin call by a replica not holding the VM's shard (lease-
//! timed: whose hold is not valid by its own clock, or while another replica's hold on the VM
//! is), nor two replicas inside plugin calls for one VM at once; no call a paused VM or an
//! `ObserveOnly` VM must not make, nor any capability violation of `simulation.rs`. Lease-timed,
//! at every acquisition: no VM held validly by two replicas at once, whatever their layouts.
//! After the faults stop (every shard held, nothing paused; lease-timed: every replica resumed
//! and reachable, the last rollout completed, and every VM reconciled by some replica again
//! within 180 s): every VM has its one machine recorded; then every VM is deleted, and nothing
//! is left: no object (so no finalizer), no live machine marked as a VM's, no adopted machine
//! of a `Full` VM.
//!
//! Not modelled: ProviderConfig moves, spec edits (both in the single-VM schedules). Lease-
//! timed: the reconciles' own timers (the grace period, requeues) run on the shared clock, not
//! their replica's; wall clocks (member Leases' `renewTime`) agree, and a wrong membership view
//! is injected instead (one role now and then); an API server that is slow beyond the gap
//! between an elector's read and its write (up to 2 s); a request a frozen replica had sent:
//! it reached the cloud when it was made, and the in-call check leaves a frozen replica out
//! until it resumes (the caveat of every lease: a request in flight when its sender froze).
//!
//! The informer lists a shard's VMs again on acquisition (as the sharded watch does when the
//! API server serves `shardSelector`), or keeps lagging across it
//! (`fleet_schedules_with_an_informer_lagging_across_hand_overs`, an API server without it).
//! Variants that fail, behind ignored tests in `simulation.rs` ([`Variant`]): without the
//! acquisition hook (the creation grace period not started over on acquisition:
//! `fleet_without_the_acquisition_hook_duplicates`); two VMs naming one machine in
//! `spec.externalId` (adoption checks that no other VM records the machine, then records it,
//! and two reconciles can both pass the check: `fleet_two_vms_adopting_one_machine`); without
//! the validity check (a replica resuming from a freeze past its Lease calls before its elector
//! has stepped down: `fleet_leases_without_the_validity_check_overlap`); clocks far beyond the
//! bound (0.5 to 1.5: a slow holder still holds by its clock when a fast candidate takes over:
//! `fleet_leases_with_clock_skew_beyond_the_bound_overlap`); without the layout fence (each
//! layout's replicas campaign for their own Leases at once:
//! `fleet_rollouts_without_the_layout_fence_overlap`); a switch that publishes the new layout
//! without stamping the outgoing Leases (an old replica whose fence is not updated yet, or
//! that resumes, takes or renews one: `fleet_rollouts_with_an_unstamped_switch_overlap`).
//!
//! A switch that stamps some of the outgoing Leases and then conflicts on another gives up,
//! leaving those stamped with a generation never published (a replica of the old layout
//! switching back right after a switch, while the new layout's replicas take their shards).
//! A replica of the layout in force republishes it at that generation
//! (`layout.rs` `adopt_stranded_stamps`); without that, no replica is admitted to those Leases
//! again and their VMs are never reconciled
//! (`fleet_rollouts_without_the_republish_strand_a_lease`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use vmop::api::{
    ManagementPolicy, PAUSED, VirtualMachine, VirtualMachineSpec, VirtualMachineStatus,
};
use vmop::controller::Error;
use vmop::controller::vm::{Attempts, Effects, Outcome, Severity, drive};
use vmop::leader::shards::shard_of;
use vmop::plugin::{Operation, UpdateOutcome, VmStatus};

use super::{Abilities, Fake, HOME, Machine, Object, World, begin, run_once};

#[path = "leases.rs"]
mod leases;
#[path = "timed.rs"]
mod timed;

pub(super) use timed::{Timed, run as run_timed};

/// Steps of the faulty phase, per VM (plus a floor).
const STEPS_PER_VM: u32 = 30;
const MIN_STEPS: u32 = 120;
/// Rounds after the faults stop: every VM reconciled to the end, then the clock moves on.
const SETTLE_ROUNDS: u32 = 40;
const ROUND: Duration = Duration::from_secs(5);

/// The schedules' variant: the default, or one that shows a known failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// Everything as the product runs it, with an informer that lists a shard's VMs again on
    /// acquisition (as the sharded watch does when the API server serves `shardSelector`).
    Default,
    /// Acquisition does not call [`Attempts::acquired`].
    WithoutHook,
    /// Adopting VMs all name one machine.
    SharedAdoption,
    /// The informer keeps lagging across an acquisition (an API server without
    /// `ShardedListAndWatch`: every replica watches every VM and never lists again).
    LaggingInformer,
    /// Lease-timed: reconciles do not check the renew deadline by their own clock
    /// (`Validity`); they stop only once the elector has stepped down.
    WithoutValidity,
    /// Lease-timed: clock rates far beyond the bound (0.5 to 1.5 of the simulation's).
    SkewBeyondBound,
    /// Lease-timed: no layout fence; every replica campaigns for its own layout's Leases.
    Unfenced,
    /// Lease-timed: a layout switch publishes the new layout without stamping the outgoing
    /// Leases first.
    UnstampedSwitch,
    /// Lease-timed: a replica whose layout is in force does not republish it at a generation a
    /// switch abandoned midway stamped on its Leases.
    WithoutRepublish,
}

/// What the knobs of one schedule are.
#[derive(Debug)]
struct Shape {
    replicas: usize,
    shards: u32,
    vms: usize,
}

/// The world every replica and reconcile reaches, as one process would the API server and the
/// cloud; and what the lease rule needs to be enforced and checked.
struct Shared {
    world: World,
    shards: u32,
    /// The replica holding each shard.
    holders: Vec<Option<usize>>,
    /// The replica inside a plugin call for each VM, by VM index.
    in_call: BTreeMap<usize, usize>,
    /// Replicas whose process died at an await point (a crash fate).
    died: Vec<usize>,
    /// The lease-timed schedules' control plane; then `holders` is unused.
    control: Option<leases::Control>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A reconcile's fake effects between two calls: `simulation.rs`'s [`Fake`] without the world,
/// which it borrows only during a call.
struct Detached {
    uid: String,
    location: String,
    vm: VirtualMachine,
    desired_mib: u64,
    writes: Vec<Operation>,
    deletes: Vec<String>,
    calls: u32,
}

impl Detached {
    fn of(fake: Fake<'_>) -> Self {
        Detached {
            uid: fake.uid,
            location: fake.location,
            vm: fake.vm,
            desired_mib: fake.desired_mib,
            writes: fake.writes,
            deletes: fake.deletes,
            calls: fake.calls,
        }
    }

    /// Runs `act` on the fake attached to `world`, keeping what it changed.
    fn with<T>(&mut self, world: &mut World, act: impl FnOnce(&mut Fake<'_>) -> T) -> T {
        let mut fake = Fake {
            world,
            uid: std::mem::take(&mut self.uid),
            location: std::mem::take(&mut self.location),
            vm: self.vm.clone(),
            crashed: false,
            desired_mib: self.desired_mib,
            desired_subnet: None,
            writes: std::mem::take(&mut self.writes),
            deletes: std::mem::take(&mut self.deletes),
            calls: self.calls,
        };
        let out = act(&mut fake);
        *self = Detached::of(fake);
        out
    }
}

/// Pending once, then ready: one await point the scheduler decides when to pass.
#[derive(Default)]
struct Gate(bool);

impl Future for Gate {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

/// Marks replica `replica` inside a plugin call for VM `vm` until dropped (the call ended, or
/// the reconcile was dropped in it).
struct InCall {
    shared: Arc<Mutex<Shared>>,
    vm: usize,
    replica: usize,
}

impl Drop for InCall {
    fn drop(&mut self) {
        let mut shared = lock(&self.shared);
        if shared.in_call.get(&self.vm) == Some(&self.replica) {
            shared.in_call.remove(&self.vm);
        }
    }
}

/// One reconcile's effects: `simulation.rs`'s fake, reached through the shared world, every
/// call two await points, every plugin call checked against the lease rule and the VM's policy.
struct FleetFx {
    shared: Arc<Mutex<Shared>>,
    replica: usize,
    vm: usize,
    shard: u32,
    /// As the view the reconcile started from says.
    paused: bool,
    observe_only: bool,
    fake: Detached,
}

impl FleetFx {
    /// Checks a plugin call about to be made and marks the replica inside it.
    fn enter(&self, op: Operation) -> InCall {
        let mut shared = lock(&self.shared);
        let (replica, vm, shard) = (self.replica, self.vm, self.shard);
        let mut broken = Vec::new();
        if let Some(control) = &shared.control {
            // Held by its own clock's reading of its last renewal; nobody else's either.
            let now = shared.world.now;
            let uid = &self.fake.uid;
            let holders = control.holders(uid, now);
            let others: Vec<String> = holders
                .iter()
                .filter(|q| **q != replica)
                .map(|q| control.describe(*q, uid, now))
                .collect();
            if !holders.contains(&replica) {
                broken.push(format!(
                    "replica {replica} calls {} for vm-{vm} without a valid hold: {}{}",
                    op.as_str(),
                    control.describe(replica, uid, now),
                    if others.is_empty() {
                        String::new()
                    } else {
                        format!(", while {}", others.join("; "))
                    }
                ));
            } else if !others.is_empty() {
                broken.push(format!(
                    "replica {replica} calls {} for vm-{vm} while {}",
                    op.as_str(),
                    others.join("; ")
                ));
            }
        } else {
            let holder = shared.holders.get(shard as usize).copied().flatten();
            if holder != Some(replica) {
                broken.push(format!(
                    "replica {replica} calls {} for vm-{vm} without holding shard {shard} \
                     (held by {holder:?})",
                    op.as_str()
                ));
            }
        }
        match shared.in_call.get(&vm) {
            Some(other) if *other != replica => broken.push(format!(
                "replicas {other} and {replica} inside plugin calls for vm-{vm} at once"
            )),
            _ => {}
        }
        if self.paused {
            broken.push(format!("{} called for paused vm-{vm}", op.as_str()));
        }
        let writes = matches!(
            op,
            Operation::Create
                | Operation::Delete
                | Operation::Update
                | Operation::Start
                | Operation::Stop
        );
        if self.observe_only && writes {
            broken.push(format!("{} called for ObserveOnly vm-{vm}", op.as_str()));
        }
        shared.world.violations.extend(broken);
        shared.in_call.insert(vm, replica);
        InCall {
            shared: self.shared.clone(),
            vm,
            replica,
        }
    }

    /// Runs `act` on the fake, attached to the shared world meanwhile; what it logs names the
    /// replica and the VM.
    fn with_fake<T>(&mut self, act: impl FnOnce(&mut Fake<'_>) -> T) -> T {
        let mut shared = lock(&self.shared);
        let logged = shared.world.log.len();
        let out = self.fake.with(&mut shared.world, act);
        let who = format!(" r{} vm-{}:", self.replica, self.vm);
        for line in shared.world.log.iter_mut().skip(logged) {
            if let Some(at) = line.find("s ") {
                line.insert_str(at + 1, &who);
            }
        }
        out
    }

    /// One effect: an await point before it is sent, the fake's act (a plugin call when `op`
    /// names one), an await point while its answer is in flight. A crash fate ends the
    /// replica's process: the scheduler drops its reconciles.
    async fn call<T>(
        &mut self,
        op: Option<Operation>,
        act: impl FnOnce(&mut Fake<'_>) -> Option<T> + Send,
    ) -> T {
        Gate::default().await;
        let in_call = op.map(|op| self.enter(op));
        let out = self.with_fake(act);
        Gate::default().await;
        drop(in_call);
        match out {
            Some(out) => out,
            None => {
                lock(&self.shared).died.push(self.replica);
                std::future::pending().await
            }
        }
    }
}

impl Effects for FleetFx {
    async fn location(&mut self) -> Result<String, Error> {
        self.call(Some(Operation::Location), |f| run_once(f.location()))
            .await
    }

    async fn find(&mut self) -> Result<Option<VmStatus>, Error> {
        self.call(Some(Operation::Find), |f| run_once(f.find()))
            .await
    }

    async fn get(&mut self, id: &str) -> Result<Option<VmStatus>, Error> {
        self.call(Some(Operation::Get), |f| run_once(f.get(id)))
            .await
    }

    async fn create(&mut self) -> (Result<VmStatus, Error>, bool) {
        self.call(Some(Operation::Create), |f| run_once(f.create()))
            .await
    }

    async fn delete(&mut self, id: &str) -> Result<(), Error> {
        self.call(Some(Operation::Delete), |f| run_once(f.delete(id)))
            .await
    }

    async fn update(&mut self, id: &str) -> Result<UpdateOutcome, Error> {
        self.call(Some(Operation::Update), |f| run_once(f.update(id)))
            .await
    }

    async fn start(&mut self, id: &str) -> Result<(), Error> {
        self.call(Some(Operation::Start), |f| run_once(f.start(id)))
            .await
    }

    async fn stop(&mut self, id: &str) -> Result<(), Error> {
        self.call(Some(Operation::Stop), |f| run_once(f.stop(id)))
            .await
    }

    async fn claimed_by(&mut self, id: &str) -> Result<Option<String>, Error> {
        self.call(None, |f| run_once(f.claimed_by(id))).await
    }

    async fn write_status(&mut self, status: &VirtualMachineStatus) -> Result<(), Error> {
        self.call(None, |f| run_once(f.write_status(status))).await
    }

    async fn add_finalizer(
        &mut self,
        location: &str,
        parameters: Option<&BTreeMap<String, String>>,
    ) -> Result<(), Error> {
        self.call(None, |f| run_once(f.add_finalizer(location, parameters)))
            .await
    }

    async fn intend(
        &mut self,
        location: &str,
        parameters: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        self.call(None, |f| run_once(f.intend(location, parameters)))
            .await
    }

    async fn remove_finalizer(&mut self) -> Result<(), Error> {
        self.call(None, |f| run_once(f.remove_finalizer())).await
    }

    async fn event(&mut self, severity: Severity, action: &str, reason: &str, note: String) {
        self.with_fake(|f| run_once(f.event(severity, action, reason, note)));
    }
}

/// A reconcile in flight: the real `drive`, with everything it borrows, as one future.
struct Reconcile {
    replica: usize,
    vm: usize,
    /// The VM's shard under the replica's layout.
    shard: u32,
    future: Pin<Box<dyn Future<Output = Result<Outcome, Error>>>>,
}

/// One operator process (or its successor after a crash).
struct Replica {
    attempts: Arc<Attempts>,
    /// Its informer's oldest possible version of each VM.
    floors: Vec<usize>,
    /// Process generation, for the log.
    generation: u32,
}

/// One fleet schedule.
struct Fleet {
    shared: Arc<Mutex<Shared>>,
    replicas: Vec<Replica>,
    reconciles: Vec<Reconcile>,
    /// The uid of each VM, by index.
    uids: Vec<String>,
    /// The machine each adopting VM names, by VM index.
    external: BTreeMap<usize, String>,
    /// Those of them under `managementPolicy: Full`.
    full_adoptions: BTreeMap<usize, String>,
    /// Reconciles that ended, with their outcome (`None`: an error), oldest first.
    ended: Vec<(usize, Option<Outcome>)>,
    variant: Variant,
    /// The paused clock's instant at the world's time zero.
    epoch: tokio::time::Instant,
}

impl Fleet {
    fn world(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// Moves the paused clock up to the world's (it lags only inside [`tick`]).
    async fn catch_up(&self) {
        let now = self.world().world.now;
        let paused = tokio::time::Instant::now().duration_since(self.epoch);
        if let Some(by) = now.checked_sub(paused).filter(|by| !by.is_zero()) {
            tokio::time::advance(by).await;
        }
    }

    fn note(&self, line: String) {
        self.world().world.note(line);
    }

    /// The newest version of each VM: what a list shows.
    fn newest(&self) -> Vec<usize> {
        let shared = self.world();
        shared
            .world
            .objects
            .iter()
            .map(|o| o.versions.len() - 1)
            .collect()
    }

    /// Replica `replica` acquires free shard `shard`: the hook first, as `on_acquiring` runs
    /// before the shard's reconciles may start.
    fn acquire(&mut self, shard: u32, replica: usize) {
        let shards = {
            let mut shared = self.world();
            match shared.holders.get_mut(shard as usize) {
                Some(slot @ None) => *slot = Some(replica),
                _ => return,
            }
            shared.shards
        };
        let newest = self.newest();
        let uids = &self.uids;
        if let Some(r) = self.replicas.get_mut(replica) {
            if self.variant != Variant::WithoutHook {
                r.attempts.acquired(shard, shards);
            }
            if self.variant != Variant::LaggingInformer {
                for (vm, floor) in r.floors.iter_mut().enumerate() {
                    if uids.get(vm).is_some_and(|u| shard_of(u, shards) == shard) {
                        *floor = newest.get(vm).copied().unwrap_or(*floor);
                    }
                }
            }
        }
        self.note(format!("replica {replica} acquires shard {shard}"));
    }

    /// The holder of `shard` loses it: its reconciles of the shard's VMs are dropped where
    /// they are, then the shard is free.
    fn lose(&mut self, shard: u32) {
        let Some(holder) = self.world().holders.get(shard as usize).copied().flatten() else {
            return;
        };
        let shards = self.world().shards;
        let uids = &self.uids;
        self.reconciles.retain(|r| {
            r.replica != holder || uids.get(r.vm).is_none_or(|u| shard_of(u, shards) != shard)
        });
        if let Some(slot) = self.world().holders.get_mut(shard as usize) {
            *slot = None;
        }
        self.note(format!("replica {holder} loses shard {shard}"));
    }

    /// Replica `replica` stops reconciling: every reconcile of it dropped, every shard it
    /// held free. A new process (`fresh`) knows nothing; otherwise (a partition, a freeze)
    /// it keeps its memory.
    fn stop(&mut self, replica: usize, fresh: bool) {
        let held: Vec<u32> = {
            let shared = self.world();
            (0..shared.shards)
                .filter(|s| shared.holders.get(*s as usize).copied().flatten() == Some(replica))
                .collect()
        };
        for shard in held {
            self.lose(shard);
        }
        self.reconciles.retain(|r| r.replica != replica);
        let newest = self.newest();
        if fresh && let Some(r) = self.replicas.get_mut(replica) {
            r.attempts = Arc::new(Attempts::new());
            r.generation += 1;
            // A new process lists afresh.
            r.floors = newest;
        }
        let what = match self.replicas.get(replica) {
            Some(r) if fresh => format!("dies and restarts empty (process {})", r.generation),
            _ => "loses every shard, keeping its memory".to_owned(),
        };
        self.note(format!("replica {replica} {what}"));
    }

    /// Starts a reconcile of VM `vm` on its shard's holder (lease-timed: on every running
    /// replica that takes itself for one), unless one is in flight there.
    fn start(&mut self, vm: usize) {
        let on: Vec<(usize, u32)> = {
            let shared = self.world();
            let uid = self.uids.get(vm).map_or("", String::as_str);
            match &shared.control {
                Some(control) => {
                    let now = shared.world.now;
                    (0..control.processes.len())
                        .filter(|p| control.processes.get(*p).is_some_and(|q| q.can_run()))
                        .filter_map(|p| {
                            let s = control.shard(p, uid)?;
                            control.believes(p, s, now).then_some((p, s))
                        })
                        .collect()
                }
                None => {
                    let shard = shard_of(uid, shared.shards);
                    let holder = shared.holders.get(shard as usize).copied().flatten();
                    holder.map(|r| (r, shard)).into_iter().collect()
                }
            }
        };
        for (replica, shard) in on {
            self.start_on(replica, vm, shard);
        }
    }

    /// Starts a reconcile of VM `vm` (of shard `shard`) on `replica`, unless one is in flight
    /// there.
    fn start_on(&mut self, replica: usize, vm: usize, shard: u32) {
        if self
            .reconciles
            .iter()
            .any(|r| r.replica == replica && r.vm == vm)
        {
            return;
        }
        let Some(r) = self.replicas.get_mut(replica) else {
            return;
        };
        let attempts = r.attempts.clone();
        let Some(floor) = r.floors.get_mut(vm) else {
            return;
        };
        let mut shared = lock(&self.shared);
        let Some(view) = shared.world.view_of(vm, floor) else {
            return;
        };
        let Some((facts, status, fake)) = begin(&mut shared.world, &view, &attempts) else {
            return;
        };
        let rv = view.metadata.resource_version.clone().unwrap_or_default();
        if facts.day2.paused {
            // As `vm::reconcile`: a paused VM is decided before anything else, and its reconcile
            // ends with a status write (left out here) and no call.
            shared.world.note(format!(
                "replica {replica} skips paused vm-{vm} (view rv {rv})"
            ));
            return;
        }
        let fake = Detached::of(fake);
        shared.world.note(format!(
            "replica {replica} reconciles vm-{vm} (view rv {rv})"
        ));
        drop(shared);
        let fx = FleetFx {
            shared: self.shared.clone(),
            replica,
            vm,
            shard,
            paused: view.annotations().get(PAUSED).is_some_and(|v| v == "true"),
            observe_only: view.spec.management_policy == ManagementPolicy::ObserveOnly,
            fake,
        };
        let future = Box::pin(async move {
            let (mut fx, mut status) = (fx, status);
            drive(&view, facts, &attempts, &mut status, &mut fx).await
        });
        self.reconciles.push(Reconcile {
            replica,
            vm,
            shard,
            future,
        });
    }

    /// Passes one await point of reconcile `index`. Lease-timed, the reconcile first checks
    /// its hold (`while_holding`'s biased select): lost, it is dropped where it is.
    fn poll(&mut self, index: usize) {
        let Some(&Reconcile {
            replica, vm, shard, ..
        }) = self.reconciles.get(index)
        else {
            return;
        };
        let (runs, holds) = {
            let shared = self.world();
            match &shared.control {
                Some(control) => (
                    control.processes.get(replica).is_some_and(|q| q.can_run()),
                    control.believes(replica, shard, shared.world.now),
                ),
                None => (true, true),
            }
        };
        if !runs {
            return;
        }
        if !holds {
            self.reconciles.remove(index);
            self.note(format!(
                "  replica {replica} drops its reconcile of vm-{vm}: its hold is lost"
            ));
            return;
        }
        let Some(reconcile) = self.reconciles.get_mut(index) else {
            return;
        };
        let mut cx = TaskContext::from_waker(futures::task::noop_waker_ref());
        let (replica, vm) = (reconcile.replica, reconcile.vm);
        if let Poll::Ready(result) = reconcile.future.as_mut().poll(&mut cx) {
            self.reconciles.remove(index);
            let line = match &result {
                Ok(outcome) => format!("  replica {replica} vm-{vm} -> {outcome:?}"),
                Err(e) => format!("  replica {replica} vm-{vm} -> error {}", e.reason()),
            };
            self.note(line);
            self.ended.push((vm, result.ok()));
        }
        let died = std::mem::take(&mut self.world().died);
        for replica in died {
            if self.world().control.is_some() {
                self.crash(replica);
            } else {
                self.stop(replica, true);
            }
        }
    }

    /// The reconciles whose replica runs (lease-timed: not frozen), by index.
    fn pollable(&self) -> Vec<usize> {
        let shared = self.world();
        let Some(control) = &shared.control else {
            return (0..self.reconciles.len()).collect();
        };
        self.reconciles
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                control
                    .processes
                    .get(r.replica)
                    .is_some_and(|q| q.can_run())
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Runs every reconcile in flight to its end (no faults: each ends).
    fn finish(&mut self) {
        let mut guard = 0;
        while guard < 10_000 {
            let Some(index) = self.pollable().first().copied() else {
                break;
            };
            self.poll(index);
            guard += 1;
        }
    }

    /// The invariants that hold at every step.
    fn check(&self) -> Result<(), String> {
        let shared = self.world();
        let world = &shared.world;
        if let Some(v) = world.violations.first() {
            return Err(v.clone());
        }
        for (vm, uid) in self.uids.iter().enumerate() {
            let live = world.live_for(uid);
            if live > 1 {
                return Err(format!("{live} live machines for vm-{vm} (duplicated)"));
            }
        }
        let mut recorded: BTreeMap<&str, usize> = BTreeMap::new();
        for (vm, object) in world.objects.iter().enumerate() {
            let Some(id) = object
                .latest()
                .and_then(|v| v.status.as_ref())
                .and_then(|s| s.id.as_deref())
            else {
                continue;
            };
            let live = world.machines.iter().any(|m| m.id == id && m.live);
            if let Some(other) = recorded.insert(id, vm)
                && live
            {
                return Err(format!(
                    "machine {id} is recorded by vm-{other} and vm-{vm} (owned by two VMs)"
                ));
            }
        }
        Ok(())
    }

    /// After the faults stop: every VM has its one machine recorded.
    fn converged(&self) -> Result<(), String> {
        let shared = self.world();
        let world = &shared.world;
        for (vm, object) in world.objects.iter().enumerate() {
            let Some(latest) = object.latest() else {
                continue;
            };
            if latest.metadata.deletion_timestamp.is_some() {
                return Err(format!("vm-{vm} is still being deleted (stuck)"));
            }
            let id = latest.status.as_ref().and_then(|s| s.id.clone());
            let want = match self.external.get(&vm) {
                Some(external) => Some(external.clone()),
                None => world
                    .machines
                    .iter()
                    .find(|m| m.live && m.uid == object.uid())
                    .map(|m| m.id.clone()),
            };
            // Another VM adopted the machine first: this one says so and takes nothing.
            let conflict = latest
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Synced"))
                .is_some_and(|c| c.reason == "AdoptionConflict");
            if self.external.contains_key(&vm) && id.is_none() && conflict {
                continue;
            }
            // The machine it names is gone (the VM that adopted it was deleted, and the machine
            // with it): this one says so.
            let gone = want
                .as_ref()
                .is_some_and(|want| !world.machines.iter().any(|m| m.live && &m.id == want));
            let not_found = latest
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Synced"))
                .is_some_and(|c| c.reason == "ExternalVMNotFound");
            if self.external.contains_key(&vm) && id.is_none() && gone && not_found {
                continue;
            }
            if want.is_none() || id != want {
                return Err(format!(
                    "vm-{vm} did not converge: status.id {id:?}, its machine {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// Nothing left after every VM was deleted.
    fn cleaned_up(&self) -> Result<(), String> {
        let shared = self.world();
        let world = &shared.world;
        if let Some(vm) = world.objects.iter().position(|o| !o.gone) {
            return Err(format!(
                "vm-{vm} (and its finalizer) is still there after deletion (stuck)"
            ));
        }
        for (vm, uid) in self.uids.iter().enumerate() {
            if let Some(m) = world.machines.iter().find(|m| m.live && m.uid == *uid) {
                return Err(format!(
                    "machine {} of vm-{vm} was left behind (leaked): {m:?}",
                    m.id
                ));
            }
        }
        // An adopted machine goes with its VM, unless the VM only observed it (or was deleted
        // before it adopted it).
        for (vm, id) in &self.full_adoptions {
            let adopted = world.objects.get(*vm).is_some_and(|o| {
                o.versions
                    .iter()
                    .any(|v| v.status.as_ref().and_then(|s| s.id.as_ref()) == Some(id))
            });
            let left = adopted
                && world
                    .machines
                    .iter()
                    .any(|m| m.id == *id && m.live && m.deleting_until.is_none());
            if left {
                return Err(format!(
                    "machine {id}, adopted by vm-{vm}, was left behind (leaked)"
                ));
            }
        }
        Ok(())
    }
}

/// A VM of the fleet.
fn vm_object(index: usize, uid: String) -> VirtualMachine {
    let mut vm = VirtualMachine::new(
        &format!("vm-{index}"),
        VirtualMachineSpec::new("pc", "img", 1, "1Gi"),
    );
    vm.metadata.namespace = Some("ns".into());
    vm.metadata.uid = Some(uid);
    vm.metadata.resource_version = Some("1".into());
    vm.metadata.generation = Some(1);
    vm
}

/// An unmarked machine made outside vmop, for a VM to adopt.
fn outside_machine(id: String) -> Machine {
    Machine {
        id,
        uid: String::new(),
        location: HOME.into(),
        live: true,
        visible_at: Duration::ZERO,
        by_id_at: Duration::ZERO,
        deleting_until: None,
        running: true,
        memory_mib: 1024,
        subnet: None,
    }
}

/// Builds a fleet schedule's world: its shape, the VMs (some adopting), every shard free.
fn build(mut world: World, variant: Variant) -> Fleet {
    let rng = &mut world.rng;
    let shape = Shape {
        replicas: 1 + rng.below(5) as usize,
        shards: 1 + rng.below(4) as u32,
        vms: if rng.chance(10) {
            1 + rng.below(50) as usize
        } else {
            1 + rng.below(10) as usize
        },
    };
    build_with(world, variant, shape)
}

/// Builds a fleet of `shape`: the plugin's abilities, the VMs (some adopting), the replicas.
fn build_with(mut world: World, variant: Variant, shape: Shape) -> Fleet {
    let rng = &mut world.rng;
    world.abilities = Abilities {
        update: rng.chance(60),
        power: rng.chance(60),
        live_resize: rng.chance(30),
        replace_only: false,
        consistent_get: rng.chance(50),
        launch_only: false,
    };
    let adopting = rng.chance(30);
    world.objects.clear();
    let mut uids = Vec::new();
    let mut external = BTreeMap::new();
    let mut full_adoptions = BTreeMap::new();
    for index in 0..shape.vms {
        let uid = format!("{index:02}-{:08x}", world.rng.next() as u32);
        let mut vm = vm_object(index, uid.clone());
        if adopting && world.rng.chance(25) {
            let id = match variant {
                Variant::SharedAdoption => "ext-shared".to_owned(),
                _ => format!("ext-{index}"),
            };
            if !world.machines.iter().any(|m| m.id == id) {
                world.machines.push(outside_machine(id.clone()));
            }
            vm.spec.external_id = Some(id.clone());
            if world.rng.chance(30) {
                vm.spec.management_policy = ManagementPolicy::ObserveOnly;
            } else {
                full_adoptions.insert(index, id.clone());
            }
            external.insert(index, id);
        }
        uids.push(uid);
        world.objects.push(Object {
            versions: vec![vm],
            gone: false,
        });
    }
    let note = format!(
        "fleet {shape:?}, abilities {:?}, adopting {:?}",
        world.abilities, external
    );
    world.note(note);
    let replicas = (0..shape.replicas)
        .map(|_| Replica {
            attempts: Arc::new(Attempts::new()),
            floors: vec![0; shape.vms],
            generation: 0,
        })
        .collect();
    Fleet {
        shared: Arc::new(Mutex::new(Shared {
            world,
            shards: shape.shards,
            holders: vec![None; shape.shards as usize],
            in_call: BTreeMap::new(),
            died: Vec::new(),
            control: None,
        })),
        replicas,
        reconciles: Vec::new(),
        ended: Vec::new(),
        uids,
        external,
        full_adoptions,
        variant,
        epoch: tokio::time::Instant::now(),
    }
}

/// The user sets `deletionTimestamp` on VM `vm` (the API server keeps it while finalizers
/// stay).
fn delete_vm(fleet: &Fleet, vm: usize) {
    let mut shared = fleet.world();
    let Some(mut latest) = shared
        .world
        .objects
        .get(vm)
        .and_then(Object::latest)
        .cloned()
    else {
        return;
    };
    if latest.metadata.deletion_timestamp.is_some() {
        return;
    }
    latest.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    shared.world.note(format!("user deletes vm-{vm}"));
    shared.world.commit(latest);
}

/// The user sets or removes `vmop.dev/paused` on VM `vm`.
fn set_paused(fleet: &Fleet, vm: usize, paused: bool) {
    let mut shared = fleet.world();
    let Some(mut latest) = shared
        .world
        .objects
        .get(vm)
        .and_then(Object::latest)
        .cloned()
    else {
        return;
    };
    let was = latest
        .annotations()
        .get(PAUSED)
        .is_some_and(|v| v == "true");
    if was == paused {
        return;
    }
    if paused {
        latest
            .annotations_mut()
            .insert(PAUSED.into(), "true".into());
    } else {
        latest.annotations_mut().remove(PAUSED);
    }
    shared
        .world
        .note(format!("user sets vm-{vm} paused={paused}"));
    shared.world.commit(latest);
}

/// Advances the paused clock and the shared world by `by`; lease-timed, the control plane
/// does what falls due meanwhile, each step at its time (the world's clock moves to it, and
/// the paused clock too before anything of vmop reads it).
async fn tick(fleet: &mut Fleet, by: Duration) {
    let target = fleet.world().world.now + by;
    let mut guard = 0;
    loop {
        let effects = {
            let mut shared = fleet.world();
            let Shared { world, control, .. } = &mut *shared;
            let Some(control) = control else {
                break;
            };
            let Some((at, actor)) = control.pick(&mut world.rng, world.now, target) else {
                break;
            };
            if at > world.now {
                let by = at - world.now;
                world.pass(by);
            }
            control.run(world, actor)
        };
        if !effects.is_empty() {
            fleet.catch_up().await;
            fleet.apply(effects);
        }
        guard += 1;
        if guard > 1_000_000 {
            let mut shared = fleet.world();
            shared
                .world
                .violations
                .push("the control plane never settles".into());
            break;
        }
    }
    let now = fleet.world().world.now;
    fleet.world().world.pass(target - now);
    fleet.catch_up().await;
}

/// Reconciles every VM, then each again when its outcome asks (as the real requeue does: an
/// error or a machine on its way after a round, a wait when it is over), the clock moving on
/// a round at a time, until every VM has settled; then once more (a resync).
async fn settle(fleet: &mut Fleet) -> Result<(), String> {
    let vms = fleet.uids.len();
    let mut due: Vec<Option<Duration>> = vec![Some(Duration::ZERO); vms];
    let timed = fleet.world().control.is_some();
    fleet.ended.clear();
    for _ in 0..SETTLE_ROUNDS {
        let now = fleet.world().world.now;
        for (vm, at) in due.iter_mut().enumerate() {
            if at.is_none_or(|at| at > now) {
                continue;
            }
            fleet.start(vm);
            fleet.finish();
            fleet.check()?;
            *at = match fleet.ended.pop().map(|(_, outcome)| outcome) {
                Some(Some(Outcome::Settled(_) | Outcome::Done | Outcome::Paused)) => None,
                Some(Some(Outcome::After(after))) => Some(now + after),
                // An error, a machine on its way, a block.
                Some(_) => Some(now + ROUND),
                // No reconcile: the VM is gone, or (lease-timed) its shard is changing hands.
                None if timed && fleet.world().world.objects.get(vm).is_some_and(|o| !o.gone) => {
                    Some(now + ROUND)
                }
                None => None,
            };
            fleet.ended.clear();
        }
        if due.iter().all(Option::is_none) {
            break;
        }
        tick(fleet, ROUND).await;
    }
    for vm in 0..vms {
        fleet.start(vm);
        fleet.finish();
        fleet.check()?;
    }
    Ok(())
}

/// One fleet schedule: faults, shard moves, crashes, deletions, pauses; then settle, converge,
/// delete everything, settle, nothing left.
pub(super) async fn run(world: World, variant: Variant) -> (Result<(), String>, Vec<String>) {
    let mut fleet = build(world, variant);
    let result = run_fleet(&mut fleet).await;
    let log = std::mem::take(&mut fleet.world().world.log);
    (result, log)
}

async fn run_fleet(fleet: &mut Fleet) -> Result<(), String> {
    let vms = fleet.uids.len();
    let replicas = fleet.replicas.len();
    let shards = fleet.world().shards;
    let steps = MIN_STEPS + STEPS_PER_VM * vms as u32;
    for shard in 0..shards {
        let replica = fleet.world().world.rng.below(replicas as u64) as usize;
        fleet.acquire(shard, replica);
    }
    for step in 0..steps {
        let roll = fleet.world().world.rng.below(100);
        let pick = |fleet: &Fleet, n: usize| fleet.world().world.rng.below(n as u64) as usize;
        match roll {
            0..=29 => {
                let vm = pick(fleet, vms);
                fleet.start(vm);
            }
            30..=74 => {
                if !fleet.reconciles.is_empty() {
                    let index = pick(fleet, fleet.reconciles.len());
                    fleet.poll(index);
                }
            }
            75..=80 => {
                let shard = pick(fleet, shards as usize) as u32;
                fleet.lose(shard);
            }
            81..=88 => {
                let shard = pick(fleet, shards as usize) as u32;
                let replica = pick(fleet, replicas);
                fleet.acquire(shard, replica);
            }
            89 => {
                let replica = pick(fleet, replicas);
                fleet.stop(replica, true);
            }
            90 => {
                let replica = pick(fleet, replicas);
                fleet.stop(replica, false);
            }
            91 if fleet.world().world.rng.chance(30) => {
                let vm = pick(fleet, vms);
                delete_vm(fleet, vm);
            }
            92 => {
                let vm = pick(fleet, vms);
                let paused = fleet.world().world.rng.chance(50);
                set_paused(fleet, vm, paused);
            }
            93 if fleet.world().world.rng.chance(30) => {
                let vm = pick(fleet, vms);
                // An adopted machine lost would be recreated, which is another test's business.
                if fleet.external.contains_key(&vm) {
                    continue;
                }
                let uid = fleet.uids.get(vm).cloned().unwrap_or_default();
                fleet.world().world.terminate_behind_our_back(&uid);
            }
            _ => {
                let by = Duration::from_secs(fleet.world().world.rng.below(8));
                tick(fleet, by).await;
            }
        }
        fleet.check().map_err(|e| format!("step {step}: {e}"))?;
    }
    {
        let mut shared = fleet.world();
        shared.world.faults = false;
        shared
            .world
            .note("faults stop; every shard held, nothing paused".into());
    }
    fleet.finish();
    for shard in 0..shards {
        fleet.acquire(shard, shard as usize % replicas);
    }
    for vm in 0..vms {
        set_paused(fleet, vm, false);
    }
    settle(fleet).await.map_err(|e| format!("settling: {e}"))?;
    fleet.converged()?;
    for vm in 0..vms {
        delete_vm(fleet, vm);
    }
    settle(fleet)
        .await
        .map_err(|e| format!("settling the deletion: {e}"))?;
    // Terminations due by now are over.
    tick(fleet, Duration::ZERO).await;
    fleet.cleaned_up()
}
