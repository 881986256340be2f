//! The control plane of the lease-timed fleet schedules (`fleet.rs`, `timed.rs`): the fake API
//! server's Leases and, per replica process, what `host/src/leader/` runs against them, as
//! state machines each stepped when its own process's clock says it is due.
//!
//! - An elector per Lease (`elector.rs`, `record.rs`): a candidate reads the Lease every retry
//!   period and takes it only once it has seen the same version for the lease duration by its
//!   own clock (or it is free, or missing); a holder renews every retry period, and steps down
//!   when a renewal finds another holder or is fenced out, or once its last successful
//!   renewal is older than the renew deadline by its own clock. A hold is valid only until
//!   that deadline (`validity.rs`): [`Control::believes`] is what a reconcile checks before it
//!   is polled (`held.rs`, `while_holding`), [`Control::holders`] what the checks go by. An
//!   attempt reads the Lease and decides at one step and writes, conditionally on the version
//!   it read, at a later one (up to 2 s later; later still if the process freezes between):
//!   a hold it wins is valid from the attempt's start, and a rival's write in between makes
//!   it conflict.
//! - Shard campaigns (`shards.rs`, `assignment.rs`): every retry period a replica renews its
//!   member Lease, computes its roles from the live members of its layout (primary; standby,
//!   gated until the primary's member Lease is silent for three retry periods), hands over
//!   (stops reconciling, then releases) what a live member ranks first for, and campaigns for
//!   the rest. Now and then one role is wrong (a view skewed by clocks or a lagging list):
//!   membership decides who campaigns, never who holds.
//! - The leader layout (`cli/run.rs` `lead`): every replica campaigns for the one Lease; the
//!   controllers start (a new `Attempts`, a fresh list) once it is held, and losing it ends
//!   the process, which is restarted.
//! - The layout follower (`layout.rs`) and the real [`Fence`] (`fence.rs`): every retry period
//!   a replica reads the layout Lease; its own layout in force opens its fence at that
//!   generation; another one in force, with every Lease of it free (released, missing, or
//!   unchanged for the lease duration as this replica observed it), starts a switch, which
//!   writes at a later step, each write conditional on the version read: every outgoing Lease
//!   released and stamped with the next generation, then the layout Lease. Any conflict
//!   abandons it. An elector may create, take or renew a Lease only as its fence admits, and
//!   stamps what it writes.
//!
//! A process runs, is frozen (SIGSTOP: nothing of it is stepped, its clock runs on), is down
//! (restarted later as a new process with a new identity), or retired by a rollout. Its Lease
//! calls may fail for a while (partitioned from the API server, not from the cloud).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use vmop::leader::layout::{LAYOUT_ANNOTATION, Layout, shard_lease};
use vmop::leader::shards::shard_of;
use vmop::leader::{Fence, LeaseConfig};

use crate::World;

/// The group (`--leader-election-id`): the leader Lease, `<group>-shard-<n>`, `<group>-layout`.
const GROUP: &str = "vmop";
/// The annotation `fence.rs` stamps (private there; [`Control::new`] checks it against
/// [`Fence::stamp`]).
const GENERATION: &str = "vmop.dev/layout-generation";
/// `shards.rs`: a member renewed within this many retry periods is alive.
const ALIVE_RETRIES: u32 = 3;
/// Parts per million: a clock's rate.
const PPM: u64 = 1_000_000;

/// The product's Lease timings (`LeaseConfig::new`: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy)]
pub(super) struct Timings {
    pub(super) lease: Duration,
    pub(super) renew: Duration,
    pub(super) retry: Duration,
}

impl Timings {
    pub(super) fn product() -> Self {
        let config = LeaseConfig::new(GROUP, "vmop-system", "sim");
        Timings {
            lease: config.lease_duration,
            renew: config.renew_deadline,
            retry: config.retry_period,
        }
    }

    /// The slowest a holder's clock may run against a candidate's, in ppm of it, for the
    /// holder to stop no later than the candidate takes over: `renew_deadline / lease`.
    pub(super) fn bound_ppm(self) -> u64 {
        let ppm = self.renew.as_nanos() * u128::from(PPM) / self.lease.as_nanos().max(1);
        u64::try_from(ppm).unwrap_or(PPM)
    }
}

/// One process's monotonic clock: it reads 0 when the process starts and runs at `ppm`
/// millionths of the simulation's clock, frozen or not (a SIGSTOP does not stop it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    pub(super) ppm: u64,
    start: Duration,
}

impl Clock {
    /// What this clock reads at `now` (the simulation's clock).
    fn local(self, now: Duration) -> Duration {
        let ns = now.saturating_sub(self.start).as_nanos() * u128::from(self.ppm) / u128::from(PPM);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The first moment of the simulation's clock at which this clock reads `local` or more.
    fn global(self, local: Duration) -> Duration {
        let ns = (local.as_nanos() * u128::from(PPM)).div_ceil(u128::from(self.ppm.max(1)));
        self.start + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

/// `record.rs`: the version of a Lease last seen, and when (by this process's clock).
#[derive(Debug, Clone)]
struct Observed {
    version: Option<String>,
    at: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Create,
    Take,
    Renew,
    Wait,
}

/// `record::decide`: expiry is judged from when this process first saw the record's version,
/// plus the record's duration, by this process's clock; never from `renewTime`.
fn decide(
    lease: Option<&Lease>,
    identity: &str,
    observed: &mut Option<Observed>,
    now: Duration,
    default: Duration,
) -> Decision {
    let Some(lease) = lease else {
        *observed = None;
        return Decision::Create;
    };
    let version = lease.metadata.resource_version.clone();
    let first_seen = match observed.take() {
        Some(seen) if seen.version == version => seen.at,
        _ => now,
    };
    *observed = Some(Observed {
        version,
        at: first_seen,
    });
    match holder(lease) {
        None => Decision::Take,
        Some(h) if h == identity => Decision::Renew,
        Some(_) => {
            let duration = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|secs| u64::try_from(secs).ok())
                .filter(|secs| *secs > 0)
                .map_or(default, Duration::from_secs);
            if now >= first_seen + duration {
                Decision::Take
            } else {
                Decision::Wait
            }
        }
    }
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn version(lease: &Lease) -> Option<String> {
    lease.metadata.resource_version.clone()
}

/// The layout generation `lease` is stamped with (`fence::stamped`).
fn stamp_of(lease: &Lease) -> u64 {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GENERATION))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

/// `record::created` / `record::held`: `lease` (or a new one) held by `identity`.
fn held_by(lease: Option<&Lease>, identity: &str, duration: Duration) -> Lease {
    let mut lease = lease.cloned().unwrap_or_default();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(identity.to_owned());
    spec.lease_duration_seconds = i32::try_from(duration.as_secs()).ok();
    lease
}

/// `record::released`: no holder, 1 s.
fn released(lease: &Lease) -> Lease {
    let mut lease = lease.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    lease
}

fn parse_layout(text: &str) -> Option<Layout> {
    match text.strip_prefix("shards=") {
        Some(count) => count.parse().ok().filter(|c| *c > 0).map(Layout::Shards),
        None => (text == "leader").then_some(Layout::Leader),
    }
}

/// How many shards a layout has (the leader layout: one, shard 0).
pub(super) fn count_of(layout: Layout) -> u32 {
    match layout {
        Layout::Leader => 1,
        Layout::Shards(count) => count,
    }
}

/// The fake API server's Leases.
#[derive(Debug, Default)]
struct Store {
    leases: BTreeMap<String, Lease>,
    version: u64,
}

impl Store {
    fn get(&self, name: &str) -> Option<&Lease> {
        self.leases.get(name)
    }

    /// Writes `lease` as `name` if its resourceVersion is still `read` (`None`: only if there
    /// is none, a create); false on a conflict (409).
    fn write(&mut self, name: &str, mut lease: Lease, read: Option<&str>) -> bool {
        let current = self
            .leases
            .get(name)
            .and_then(|l| l.metadata.resource_version.as_deref());
        if current != read {
            return false;
        }
        self.version += 1;
        lease.metadata.name = Some(name.to_owned());
        lease.metadata.resource_version = Some(self.version.to_string());
        self.leases.insert(name.to_owned(), lease);
        true
    }
}

/// `assignment.rs`: what a replica does about one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Primary,
    Standby { primary_alive: bool },
    None,
}

impl Role {
    fn may_take(self) -> bool {
        matches!(
            self,
            Role::Primary
                | Role::Standby {
                    primary_alive: false
                }
        )
    }
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// `assignment::assign`: rendezvous ranking, loads differing by at most one.
fn assign<'a>(members: &[&'a String], count: u32) -> Vec<&'a str> {
    let n = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
    let (low, extra) = (count / n, count % n);
    let mut load: BTreeMap<&str, u32> = BTreeMap::new();
    let mut above_low = 0;
    (0..count)
        .filter_map(|shard| {
            let key = shard.to_be_bytes();
            let mut ranked: Vec<&str> = members.iter().map(|m| m.as_str()).collect();
            ranked.sort_by_cached_key(|m| (std::cmp::Reverse(fnv1a(&[&key, m.as_bytes()])), *m));
            let chosen = ranked.into_iter().find(|m| {
                let l = load.get(m).copied().unwrap_or(0);
                l < low || (l == low && above_low < extra)
            })?;
            let l = load.entry(chosen).or_default();
            if *l == low {
                above_low += 1;
            }
            *l += 1;
            Some(chosen)
        })
        .collect()
}

/// Each shard's primary and standby.
type Table = Vec<(String, Option<String>)>;

/// `assignment::roles` for every member at once: each shard's primary (what [`assign`] gives
/// it) and standby (what the assignment without that primary would).
fn table(members: &[String], count: u32) -> Table {
    let all: Vec<&String> = members.iter().collect();
    let primaries = assign(&all, count);
    let mut without: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    primaries
        .iter()
        .enumerate()
        .map(|(shard, primary)| {
            let standbys = without.entry(primary).or_insert_with(|| {
                let rest: Vec<&String> = all.iter().copied().filter(|m| m != primary).collect();
                assign(&rest, count)
            });
            let standby = standbys.get(shard).map(|s| (*s).to_owned());
            ((*primary).to_owned(), standby)
        })
        .collect()
}

/// `me`'s role for each shard of `table`, given how long ago each member renewed.
fn roles(
    me: &str,
    table: &[(String, Option<String>)],
    members: &BTreeMap<String, Duration>,
    alive: Duration,
) -> Vec<Role> {
    table
        .iter()
        .map(|(primary, standby)| {
            if primary == me {
                Role::Primary
            } else if standby.as_deref() == Some(me) {
                Role::Standby {
                    primary_alive: members.get(primary).is_some_and(|age| *age < alive),
                }
            } else {
                Role::None
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Campaign {
    /// Campaigning (or standing by): the next attempt is due at `next`.
    Waiting { next: Duration },
    /// Holding: valid until `renewed_at + renew_deadline`; the next renewal is due at `next`.
    Leading {
        renewed_at: Duration,
        next: Duration,
    },
}

/// The write an attempt decided on when it read the Lease: it goes out at `at` (the
/// simulation's clock), later if the process is frozen then, conditional on the version read.
#[derive(Debug)]
struct Pending {
    at: Duration,
    /// When the attempt started, by the process's clock: a hold it wins is valid from then.
    started: Duration,
    lease: Lease,
    read: Option<String>,
    /// The holder it takes the Lease over from.
    from: Option<String>,
}

/// `elector.rs`: one Lease's election in one process. Times are the process's clock.
#[derive(Debug)]
struct Elector {
    lease: String,
    observed: Option<Observed>,
    /// The gate (`with_gate`): it may create or take the Lease (renewing is always allowed).
    open: bool,
    state: Campaign,
    pending: Option<Pending>,
}

impl Elector {
    fn new(lease: String, open: bool, now: Duration) -> Self {
        Elector {
            lease,
            observed: None,
            open,
            state: Campaign::Waiting { next: now },
            pending: None,
        }
    }

    /// When it acts next (the simulation's clock): its pending write or its next attempt, or
    /// its renew deadline if that comes first.
    fn due(&self, timings: Timings, clock: Clock) -> Duration {
        let next = match (&self.pending, self.state) {
            (Some(pending), _) => pending.at,
            (None, Campaign::Waiting { next } | Campaign::Leading { next, .. }) => {
                clock.global(next)
            }
        };
        match self.state {
            Campaign::Leading { renewed_at, .. } => {
                next.min(clock.global(renewed_at + timings.renew))
            }
            Campaign::Waiting { .. } => next,
        }
    }

    /// The published deadline of its hold (`Validity`'s `until`), while it leads.
    fn until(&self, timings: Timings) -> Option<Duration> {
        match self.state {
            Campaign::Leading { renewed_at, .. } => Some(renewed_at + timings.renew),
            Campaign::Waiting { .. } => None,
        }
    }
}

/// A layout switch that read every outgoing Lease free and writes at `at`.
#[derive(Debug)]
struct Switch {
    at: Duration,
    from: Layout,
    layout_version: Option<String>,
    next: u64,
    /// The outgoing Leases and the version each was read at (`None`: missing).
    leases: Vec<(String, Option<String>)>,
}

/// What a replica process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    Running,
    /// Stopped (SIGSTOP): nothing of it runs; the scheduler resumes it at `until` or later.
    Frozen {
        until: Duration,
    },
    /// Dead: a new process starts at `at`.
    Down {
        at: Duration,
    },
    /// Replaced by a rollout, for good.
    Retired,
}

/// One replica process's view of the control plane.
#[derive(Debug)]
pub(super) struct Process {
    identity: String,
    /// Process generation of this replica (restarts), for its identity.
    generation: u32,
    pub(super) layout: Layout,
    pub(super) clock: Clock,
    pub(super) run: Run,
    /// Its Lease calls fail until then (the simulation's clock).
    cut_until: Duration,
    fence: Fence,
    follower_next: Duration,
    follower_seen: BTreeMap<String, Observed>,
    switch: Option<Switch>,
    manager_next: Duration,
    /// When its member Lease was last renewed (the simulation's clock: wall clocks agree).
    member_renewed: Option<Duration>,
    electors: BTreeMap<u32, Elector>,
    /// The shards announced held (`Shards::mark`); the leader layout: 0 while it leads.
    pub(super) held: BTreeSet<u32>,
}

impl Process {
    pub(super) fn can_run(&self) -> bool {
        self.run == Run::Running
    }

    /// Alive, frozen or not.
    pub(super) fn alive(&self) -> bool {
        matches!(self.run, Run::Running | Run::Frozen { .. })
    }
}

/// Resets `process` (replica `p`) to a new process starting at `now`.
fn begin(process: &mut Process, p: usize, now: Duration, fenced: bool) {
    process.identity = format!("r{p}.{}", process.generation);
    process.clock.start = now;
    process.run = Run::Running;
    process.fence = if fenced {
        Fence::Closed
    } else {
        Fence::Unfenced
    };
    process.follower_next = Duration::ZERO;
    process.follower_seen.clear();
    process.switch = None;
    process.manager_next = Duration::ZERO;
    process.member_renewed = None;
    process.electors.clear();
    process.held.clear();
    if process.layout == Layout::Leader {
        process
            .electors
            .insert(0, Elector::new(GROUP.to_owned(), true, Duration::ZERO));
    }
}

/// What the fleet must do about a step of the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    /// The process holds the shard now (leader layout: its controllers start): the acquisition
    /// hook and a fresh list before any reconcile of it.
    Acquired(usize, u32),
    /// The process no longer holds the shard: its reconciles of it are dropped.
    Lost(usize, u32),
    /// The process ended (crash, exit, stop): every reconcile of it is dropped.
    Ended(usize),
    /// A new process of the replica started (new memory, new identity).
    Restarted(usize),
}

/// What can be due in the control plane.
#[derive(Debug, Clone, Copy)]
pub(super) enum Actor {
    Elector(usize, u32),
    Manager(usize),
    Follower(usize),
    Switch(usize),
    Restart(usize),
}

enum Attempt {
    /// Written: renewed, created, taken free, or taken over from `from`; valid from `started`.
    Holding {
        started: Duration,
        from: Option<String>,
    },
    /// Read and decided: the write goes out at a later step.
    Sent,
    HeldBy(String),
    Failed,
}

/// The control plane: the Leases and every replica process's part in them.
#[derive(Debug)]
pub(super) struct Control {
    pub(super) timings: Timings,
    store: Store,
    pub(super) processes: Vec<Process>,
    uids: Vec<String>,
    /// Reconciles and hand-overs check the renew deadline by their own clock (`Validity`);
    /// without it, only what the elector last published.
    validity: bool,
    /// Replicas follow the layout Lease and fence their electors.
    fenced: bool,
    /// A switch stamps the outgoing Leases before it publishes the layout.
    stamped: bool,
    /// A replica whose layout is in force republishes it at the newest stamp on its Leases
    /// (what a switch abandoned midway left).
    republish: bool,
    /// The range process clock rates are drawn from, in ppm.
    rates: (u64, u64),
    /// Member Leases of processes gone without deleting them: identity, layout, last renewal.
    ghosts: Vec<(String, Layout, Duration)>,
    /// The assignments computed lately ([`table`]), by shard count and members.
    tables: Vec<((u32, Vec<String>), Table)>,
}

/// How the control plane is set up for a schedule.
#[derive(Debug, Clone, Copy)]
pub(super) struct Setup {
    pub(super) validity: bool,
    pub(super) fenced: bool,
    pub(super) stamped: bool,
    pub(super) republish: bool,
    pub(super) rates: (u64, u64),
}

impl Control {
    pub(super) fn new(setup: Setup, uids: Vec<String>) -> Self {
        let mut probe = Lease::default();
        Fence::Open(7).stamp(&mut probe);
        assert_eq!(
            stamp_of(&probe),
            7,
            "the model reads the stamp Fence::stamp writes"
        );
        assert!(
            Fence::Open(6).admits(None) && !Fence::Open(6).admits(Some(&probe)),
            "the model's fence is the product's"
        );
        Control {
            timings: Timings::product(),
            store: Store::default(),
            processes: Vec::new(),
            uids,
            validity: setup.validity,
            fenced: setup.fenced,
            stamped: setup.stamped,
            republish: setup.republish,
            rates: setup.rates,
            ghosts: Vec::new(),
            tables: Vec::new(),
        }
    }

    fn draw_rate(&self, world: &mut World) -> u64 {
        let (lo, hi) = self.rates;
        // Often at an extreme, where a bound is tested.
        match world.rng.below(10) {
            0..=1 => lo,
            2..=3 => hi,
            _ => lo + world.rng.below(hi - lo + 1),
        }
    }

    /// A new replica process of `layout`, starting now; its index.
    pub(super) fn spawn(&mut self, world: &mut World, layout: Layout) -> usize {
        let p = self.processes.len();
        let ppm = self.draw_rate(world);
        let mut process = Process {
            identity: String::new(),
            generation: 0,
            layout,
            clock: Clock {
                ppm,
                start: world.now,
            },
            run: Run::Running,
            cut_until: Duration::ZERO,
            fence: Fence::Closed,
            follower_next: Duration::ZERO,
            follower_seen: BTreeMap::new(),
            switch: None,
            manager_next: Duration::ZERO,
            member_renewed: None,
            electors: BTreeMap::new(),
            held: BTreeSet::new(),
        };
        begin(&mut process, p, world.now, self.fenced);
        world.note(format!(
            "replica {p} starts as {} ({layout}, clock at {ppm} ppm)",
            process.identity
        ));
        self.processes.push(process);
        p
    }

    fn actors(&self) -> Vec<(Duration, Actor)> {
        let mut due = Vec::new();
        for (p, process) in self.processes.iter().enumerate() {
            match process.run {
                Run::Running => {}
                Run::Down { at } => {
                    due.push((at, Actor::Restart(p)));
                    continue;
                }
                Run::Frozen { .. } | Run::Retired => continue,
            }
            let clock = process.clock;
            for (s, elector) in &process.electors {
                due.push((elector.due(self.timings, clock), Actor::Elector(p, *s)));
            }
            if matches!(process.layout, Layout::Shards(_)) {
                due.push((clock.global(process.manager_next), Actor::Manager(p)));
            }
            if self.fenced {
                match &process.switch {
                    Some(switch) => due.push((switch.at, Actor::Switch(p))),
                    None => due.push((clock.global(process.follower_next), Actor::Follower(p))),
                }
            }
        }
        due
    }

    /// What runs next, if anything falls due by `target`, and when: the earliest due (or
    /// `now`, when something is overdue: a process just resumed), of those due by then a
    /// random one (a resumed process's timers fire at once, in no set order).
    pub(super) fn pick(
        &self,
        rng: &mut crate::Rng,
        now: Duration,
        target: Duration,
    ) -> Option<(Duration, Actor)> {
        let due = self.actors();
        let at = due.iter().map(|(at, _)| *at).min()?.max(now);
        if at > target {
            return None;
        }
        let ready: Vec<Actor> = due
            .into_iter()
            .filter(|(due, _)| *due <= at)
            .map(|(_, actor)| actor)
            .collect();
        let actor = ready.get(rng.below(ready.len() as u64) as usize).copied()?;
        Some((at, actor))
    }

    /// Runs `actor` at the world's now.
    pub(super) fn run(&mut self, world: &mut World, actor: Actor) -> Vec<Effect> {
        let now = world.now;
        match actor {
            Actor::Elector(p, s) => self.step_elector(world, p, s),
            Actor::Manager(p) => self.step_manager(world, p),
            Actor::Follower(p) => {
                self.step_follower(world, p);
                Vec::new()
            }
            Actor::Switch(p) => {
                self.step_switch(world, p);
                Vec::new()
            }
            Actor::Restart(p) => {
                let ppm = self.draw_rate(world);
                let fenced = self.fenced;
                let Some(process) = self.processes.get_mut(p) else {
                    return Vec::new();
                };
                if let Some(renewed) = process.member_renewed {
                    // Its member Lease stays until it expires.
                    self.ghosts
                        .push((process.identity.clone(), process.layout, renewed));
                }
                process.generation += 1;
                process.clock.ppm = ppm;
                begin(process, p, now, fenced);
                world.note(format!(
                    "replica {p} restarts as {} (clock at {ppm} ppm)",
                    process.identity
                ));
                vec![Effect::Restarted(p)]
            }
        }
    }

    /// The read of an attempt of `p`'s elector for shard `s` (`elector.rs` `attempt`): the
    /// fence, then the decision; a write to make goes out at a later step.
    fn read(&mut self, world: &mut World, p: usize, s: u32) -> Attempt {
        let now = world.now;
        let Control {
            store,
            processes,
            timings,
            ..
        } = self;
        let Some(process) = processes.get_mut(p) else {
            return Attempt::Failed;
        };
        if now < process.cut_until {
            return Attempt::Failed;
        }
        let t = process.clock.local(now);
        let fence = process.fence;
        let identity = process.identity.clone();
        let Some(elector) = process.electors.get_mut(&s) else {
            return Attempt::Failed;
        };
        let current = store.get(&elector.lease);
        if !fence.admits(current) {
            return Attempt::HeldBy("(fenced)".into());
        }
        let decision = decide(current, &identity, &mut elector.observed, t, timings.lease);
        match decision {
            Decision::Wait => {
                return Attempt::HeldBy(current.and_then(holder).unwrap_or_default().to_owned());
            }
            Decision::Create | Decision::Take if !elector.open => {
                return Attempt::HeldBy("(nobody; standing by)".into());
            }
            Decision::Create | Decision::Take | Decision::Renew => {}
        }
        let mut lease = held_by(current, &identity, timings.lease);
        fence.stamp(&mut lease);
        // The read's answer in flight, and the write's way out.
        let latency = if world.rng.chance(85) {
            world.rng.below(200)
        } else {
            world.rng.below(2_000)
        };
        elector.pending = Some(Pending {
            at: now + Duration::from_millis(latency),
            started: t,
            lease,
            read: current.and_then(version),
            from: current
                .and_then(holder)
                .filter(|h| *h != identity)
                .map(str::to_owned),
        });
        Attempt::Sent
    }

    /// The write of `p`'s elector for `s`, conditional on the version its read saw.
    fn write(&mut self, p: usize, s: u32, now: Duration) -> Attempt {
        let Control {
            store, processes, ..
        } = self;
        let Some(process) = processes.get_mut(p) else {
            return Attempt::Failed;
        };
        let cut = now < process.cut_until;
        let Some(elector) = process.electors.get_mut(&s) else {
            return Attempt::Failed;
        };
        let Some(pending) = elector.pending.take() else {
            return Attempt::Failed;
        };
        if cut || !store.write(&elector.lease, pending.lease, pending.read.as_deref()) {
            return Attempt::Failed;
        }
        Attempt::Holding {
            started: pending.started,
            from: pending.from,
        }
    }

    fn step_elector(&mut self, world: &mut World, p: usize, s: u32) -> Vec<Effect> {
        let now = world.now;
        let timings = self.timings;
        let Some((t, state, pending)) = self.processes.get(p).and_then(|process| {
            let elector = process.electors.get(&s)?;
            let pending = elector.pending.as_ref().map(|w| (w.at, w.started));
            Some((process.clock.local(now), elector.state, pending))
        }) else {
            return Vec::new();
        };
        // `timeout_at(deadline, renew)`: the deadline first; a write not yet out is dropped.
        if let Campaign::Leading { renewed_at, .. } = state
            && t >= renewed_at + timings.renew
        {
            return self.stand_down(world, p, s, "its renew deadline passed".into());
        }
        let waiting = matches!(state, Campaign::Waiting { .. });
        let attempt = match pending {
            Some((at, _)) if now < at => return Vec::new(),
            // `timeout(renew_deadline, attempt)` while campaigning.
            Some((_, started)) if waiting && t >= started + timings.renew => {
                self.drop_pending(p, s);
                Attempt::Failed
            }
            Some(_) => self.write(p, s, now),
            None => {
                let (Campaign::Waiting { next } | Campaign::Leading { next, .. }) = state;
                if t < next {
                    return Vec::new();
                }
                self.read(world, p, s)
            }
        };
        match (state, attempt) {
            (_, Attempt::Sent) => Vec::new(),
            (Campaign::Leading { .. }, Attempt::Holding { started, .. }) => {
                self.set_state(
                    p,
                    s,
                    Campaign::Leading {
                        renewed_at: started,
                        next: started + timings.retry,
                    },
                );
                Vec::new()
            }
            (Campaign::Leading { .. }, Attempt::HeldBy(by)) => {
                self.stand_down(world, p, s, format!("held by {by}"))
            }
            (Campaign::Leading { renewed_at, .. }, Attempt::Failed) => {
                self.set_state(
                    p,
                    s,
                    Campaign::Leading {
                        renewed_at,
                        next: t + timings.retry,
                    },
                );
                Vec::new()
            }
            (Campaign::Waiting { .. }, Attempt::Holding { started, from }) => {
                self.set_state(
                    p,
                    s,
                    Campaign::Leading {
                        renewed_at: started,
                        next: started + timings.retry,
                    },
                );
                if let Some(process) = self.processes.get_mut(p) {
                    process.held.insert(s);
                }
                let lease = self.lease_name(p, s);
                let how = match from {
                    Some(from) => format!(" from {}", self.expired(&from, s, now)),
                    None => String::new(),
                };
                world.note(format!("replica {p} takes {lease}{how}"));
                if let Some(overlap) = self.overlap(p, s, now) {
                    world.violations.push(overlap);
                }
                vec![Effect::Acquired(p, s)]
            }
            (Campaign::Waiting { .. }, Attempt::HeldBy(_) | Attempt::Failed) => {
                self.set_state(
                    p,
                    s,
                    Campaign::Waiting {
                        next: t + timings.retry,
                    },
                );
                Vec::new()
            }
        }
    }

    fn drop_pending(&mut self, p: usize, s: u32) {
        if let Some(elector) = self
            .processes
            .get_mut(p)
            .and_then(|process| process.electors.get_mut(&s))
        {
            elector.pending = None;
        }
    }

    fn set_state(&mut self, p: usize, s: u32, state: Campaign) {
        if let Some(elector) = self
            .processes
            .get_mut(p)
            .and_then(|process| process.electors.get_mut(&s))
        {
            elector.state = state;
        }
    }

    fn lease_name(&self, p: usize, s: u32) -> String {
        self.processes
            .get(p)
            .and_then(|process| process.electors.get(&s))
            .map(|e| e.lease.clone())
            .unwrap_or_default()
    }

    /// `p`'s elector for `s` stops leading and campaigns again at once; the leader layout's
    /// process exits (`lead`), to be restarted.
    fn stand_down(&mut self, world: &mut World, p: usize, s: u32, why: String) -> Vec<Effect> {
        let now = world.now;
        let lease = self.lease_name(p, s);
        let Some(process) = self.processes.get_mut(p) else {
            return Vec::new();
        };
        let t = process.clock.local(now);
        if process.layout == Layout::Leader {
            let at = now + Duration::from_millis(500 + world.rng.below(8_000));
            world.note(format!(
                "replica {p} loses {lease} ({why}) and exits; restarts at {}s",
                at.as_secs()
            ));
            process.electors.clear();
            process.held.clear();
            process.member_renewed = None;
            process.run = Run::Down { at };
            return vec![Effect::Ended(p)];
        }
        if let Some(elector) = process.electors.get_mut(&s) {
            elector.state = Campaign::Waiting { next: t };
            elector.pending = None;
        }
        world.note(format!("replica {p} loses {lease} ({why})"));
        if process.held.remove(&s) {
            vec![Effect::Lost(p, s)]
        } else {
            Vec::new()
        }
    }

    /// `elector.rs` `release`: clears the holder if it is still this process.
    fn release(store: &mut Store, process: &Process, lease: &str, now: Duration) {
        if now < process.cut_until {
            return;
        }
        let Some(current) = store.get(lease) else {
            return;
        };
        if holder(current) != Some(process.identity.as_str()) {
            return;
        }
        let read = version(current);
        let lease_now = released(current);
        store.write(lease, lease_now, read.as_deref());
    }

    /// One tick of `shards.rs` `run` for `p`.
    fn step_manager(&mut self, world: &mut World, p: usize) -> Vec<Effect> {
        let now = world.now;
        let timings = self.timings;
        let Some(process) = self.processes.get(p) else {
            return Vec::new();
        };
        let Layout::Shards(count) = process.layout else {
            return Vec::new();
        };
        let t = process.clock.local(now);
        let cut = now < process.cut_until;
        let layout = process.layout;
        let identity = process.identity.clone();
        if let Some(process) = self.processes.get_mut(p) {
            process.manager_next = t + timings.retry;
            if !cut {
                process.member_renewed = Some(now);
            }
        }
        if cut {
            return Vec::new();
        }
        let alive = |renewed: Duration| {
            let age = now.saturating_sub(renewed);
            (age < timings.lease).then_some(age)
        };
        let mut members: BTreeMap<String, Duration> = self
            .processes
            .iter()
            .filter(|q| q.layout == layout)
            .filter_map(|q| Some((q.identity.clone(), alive(q.member_renewed?)?)))
            .chain(
                self.ghosts
                    .iter()
                    .filter(|(_, l, _)| *l == layout)
                    .filter_map(|(identity, _, renewed)| {
                        Some((identity.clone(), alive(*renewed)?))
                    }),
            )
            .collect();
        members.insert(identity.clone(), Duration::ZERO);
        let key = (count, members.keys().cloned().collect::<Vec<_>>());
        let table = match self.tables.iter().find(|(k, _)| *k == key) {
            Some((_, table)) => table.clone(),
            None => {
                let table = table(&key.1, count);
                if self.tables.len() >= 16 {
                    self.tables.remove(0);
                }
                self.tables.push((key, table.clone()));
                table
            }
        };
        let mut roles = roles(&identity, &table, &members, timings.retry * ALIVE_RETRIES);
        // A wrong view now and then: membership decides who campaigns, never who holds.
        if world.faults && world.rng.chance(3) {
            let shard = world.rng.below(u64::from(count)) as usize;
            let role = match world.rng.below(3) {
                0 => Role::Primary,
                1 => Role::Standby {
                    primary_alive: false,
                },
                _ => Role::None,
            };
            if let Some(slot) = roles.get_mut(shard) {
                *slot = role;
            }
        }
        let mut effects = Vec::new();
        for (s, role) in (0..count).zip(roles) {
            let holding = self.believes(p, s, now);
            let open = role.may_take();
            let Control {
                store, processes, ..
            } = self;
            let Some(process) = processes.get_mut(p) else {
                break;
            };
            if role == Role::None || (holding && !open) {
                if let Some(elector) = process.electors.remove(&s) {
                    if process.held.remove(&s) {
                        world.note(format!("replica {p} hands {} over", elector.lease));
                        effects.push(Effect::Lost(p, s));
                    }
                    Self::release(store, process, &elector.lease, now);
                }
                continue;
            }
            if let Some(elector) = process.electors.get_mut(&s) {
                elector.open = open;
                continue;
            }
            process
                .electors
                .insert(s, Elector::new(shard_lease(GROUP, s), open, t));
        }
        effects
    }

    /// One tick of `layout.rs`'s follower for `p`: read the layout Lease; open the fence at
    /// its generation if it is `p`'s layout (republishing it at the newest stamp on its Leases,
    /// `adopt_stranded_stamps`); else start a switch if every outgoing Lease is free.
    fn step_follower(&mut self, world: &mut World, p: usize) {
        let now = world.now;
        let timings = self.timings;
        let republish = self.republish;
        let Control {
            store, processes, ..
        } = self;
        let Some(process) = processes.get_mut(p) else {
            return;
        };
        let t = process.clock.local(now);
        process.follower_next = t + timings.retry;
        if now < process.cut_until {
            // Keeps the last fence: safety rests on the stamps.
            return;
        }
        let name = format!("{GROUP}-layout");
        let Some(current) = store.get(&name) else {
            let newest = process
                .layout
                .lease_names(GROUP)
                .iter()
                .filter_map(|n| store.get(n))
                .map(stamp_of)
                .max()
                .unwrap_or(0);
            let generation = newest + 1;
            let mut lease = held_by(None, &process.identity, timings.lease);
            Fence::Open(generation).stamp(&mut lease);
            lease
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(LAYOUT_ANNOTATION.to_owned(), process.layout.to_string());
            process.fence = if store.write(&name, lease, None) {
                world.note(format!(
                    "replica {p} records layout {} at generation {generation}",
                    process.layout
                ));
                Fence::Open(generation)
            } else {
                Fence::Closed
            };
            return;
        };
        let generation = stamp_of(current);
        let in_force = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LAYOUT_ANNOTATION))
            .and_then(|text| parse_layout(text));
        match in_force {
            Some(layout) if layout == process.layout => {
                process.follower_seen.clear();
                let newest = layout
                    .lease_names(GROUP)
                    .iter()
                    .filter_map(|n| store.get(n))
                    .map(stamp_of)
                    .fold(generation, u64::max);
                if !republish || newest == generation {
                    process.fence = Fence::Open(generation);
                    return;
                }
                let read = version(current);
                let mut lease = current.clone();
                Fence::Open(newest).stamp(&mut lease);
                process.fence = if store.write(&name, lease, read.as_deref()) {
                    world.note(format!(
                        "replica {p} republishes layout {layout} at the stranded generation \
                         {newest} (was {generation})"
                    ));
                    Fence::Open(newest)
                } else {
                    Fence::Closed
                };
            }
            Some(old) => {
                let mut leases = Vec::new();
                for lease_name in old.lease_names(GROUP) {
                    let lease = store.get(&lease_name);
                    let mut seen = process.follower_seen.remove(&lease_name);
                    let decision = decide(lease, &process.identity, &mut seen, t, timings.lease);
                    if let Some(seen) = seen {
                        process.follower_seen.insert(lease_name.clone(), seen);
                    }
                    match decision {
                        Decision::Create | Decision::Take => {
                            leases.push((lease_name, lease.and_then(version)));
                        }
                        Decision::Wait | Decision::Renew => {
                            process.fence = Fence::Closed;
                            return;
                        }
                    }
                }
                let latency = Duration::from_millis(world.rng.below(1_500));
                process.switch = Some(Switch {
                    at: now + latency,
                    from: old,
                    layout_version: version(current),
                    next: generation + 1,
                    leases,
                });
            }
            None => process.fence = Fence::Closed,
        }
    }

    /// The writes of `p`'s switch, each conditional on the version it read.
    fn step_switch(&mut self, world: &mut World, p: usize) {
        let now = world.now;
        let stamped = self.stamped;
        let Control {
            store, processes, ..
        } = self;
        let Some(process) = processes.get_mut(p) else {
            return;
        };
        let Some(switch) = process.switch.take() else {
            return;
        };
        if now < process.cut_until {
            return;
        }
        let next = Fence::Open(switch.next);
        if stamped {
            for (name, read) in &switch.leases {
                let mut lease = match store.get(name) {
                    Some(current) => released(current),
                    None => Lease::default(),
                };
                next.stamp(&mut lease);
                if !store.write(name, lease, read.as_deref()) {
                    world.note(format!(
                        "replica {p}'s switch from {} conflicts on {name}",
                        switch.from
                    ));
                    process.fence = Fence::Closed;
                    return;
                }
            }
        }
        let name = format!("{GROUP}-layout");
        let Some(mut lease) = store.get(&name).cloned() else {
            process.fence = Fence::Closed;
            return;
        };
        lease.spec.get_or_insert_default().holder_identity = Some(process.identity.clone());
        next.stamp(&mut lease);
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(LAYOUT_ANNOTATION.to_owned(), process.layout.to_string());
        if store.write(&name, lease, switch.layout_version.as_deref()) {
            world.note(format!(
                "replica {p} switches the layout from {} to {} at generation {}",
                switch.from, process.layout, switch.next
            ));
            process.follower_seen.clear();
            process.fence = next;
        } else {
            process.fence = Fence::Closed;
        }
    }

    /// Freezes `p` (SIGSTOP) until at least `until`.
    pub(super) fn freeze(&mut self, world: &mut World, p: usize, until: Duration) {
        if let Some(process) = self.processes.get_mut(p).filter(|q| q.can_run()) {
            process.run = Run::Frozen { until };
            world.note(format!(
                "replica {p} freezes (SIGSTOP) until {}s or later",
                until.as_secs()
            ));
        }
    }

    /// Resumes `p` (SIGCONT): its overdue timers fire, in no set order.
    pub(super) fn resume(&mut self, world: &mut World, p: usize) {
        if let Some(process) = self.processes.get_mut(p)
            && matches!(process.run, Run::Frozen { .. })
        {
            process.run = Run::Running;
            world.note(format!("replica {p} resumes (SIGCONT)"));
        }
    }

    /// `p`'s Lease calls fail until `until`.
    pub(super) fn cut(&mut self, world: &mut World, p: usize, until: Duration) {
        if let Some(process) = self.processes.get_mut(p).filter(|q| q.can_run()) {
            process.cut_until = until;
            world.note(format!(
                "replica {p} cannot reach the API server until {}s",
                until.as_secs()
            ));
        }
    }

    /// Ends every partition now.
    pub(super) fn heal(&mut self) {
        for process in &mut self.processes {
            process.cut_until = Duration::ZERO;
        }
    }

    /// `p` dies (SIGKILL, a crash): nothing released. A new process starts after `after`;
    /// `None`: the replica is retired (a rollout's old pod killed).
    pub(super) fn crash(
        &mut self,
        world: &mut World,
        p: usize,
        after: Option<Duration>,
    ) -> Vec<Effect> {
        let now = world.now;
        let Some(process) = self.processes.get_mut(p).filter(|q| q.run != Run::Retired) else {
            return Vec::new();
        };
        process.electors.clear();
        process.held.clear();
        process.switch = None;
        match after {
            Some(after) => {
                process.run = Run::Down { at: now + after };
                world.note(format!(
                    "replica {p} dies; restarts at {}s",
                    (now + after).as_secs()
                ));
            }
            None => {
                process.run = Run::Retired;
                if let Some(renewed) = process.member_renewed.take() {
                    self.ghosts
                        .push((process.identity.clone(), process.layout, renewed));
                }
                world.note(format!("replica {p} is killed for good"));
            }
        }
        vec![Effect::Ended(p)]
    }

    /// `p` stops gracefully (SIGTERM): its reconciles stop, its Leases are released (if the
    /// API server answers), its member Lease deleted; then it restarts after `after`, or is
    /// retired.
    pub(super) fn stop(
        &mut self,
        world: &mut World,
        p: usize,
        after: Option<Duration>,
    ) -> Vec<Effect> {
        let now = world.now;
        let Control {
            store, processes, ..
        } = self;
        let Some(process) = processes.get_mut(p).filter(|q| q.can_run()) else {
            return Vec::new();
        };
        process.held.clear();
        let electors = std::mem::take(&mut process.electors);
        for elector in electors.values() {
            Self::release(store, process, &elector.lease, now);
        }
        if now >= process.cut_until {
            process.member_renewed = None;
        } else if let (None, Some(renewed)) = (after, process.member_renewed.take()) {
            self.ghosts
                .push((process.identity.clone(), process.layout, renewed));
        }
        process.switch = None;
        process.run = match after {
            Some(after) => Run::Down { at: now + after },
            None => Run::Retired,
        };
        world.note(match after {
            Some(after) => format!(
                "replica {p} stops gracefully; restarts at {}s",
                (now + after).as_secs()
            ),
            None => format!("replica {p} stops gracefully for good"),
        });
        vec![Effect::Ended(p)]
    }

    /// The shard of `uid` under `p`'s layout.
    pub(super) fn shard(&self, p: usize, uid: &str) -> Option<u32> {
        let process = self.processes.get(p)?;
        Some(match process.layout {
            Layout::Leader => 0,
            Layout::Shards(count) => shard_of(uid, count),
        })
    }

    /// Whether `p`'s hold on shard `s` is valid at `now` by its own clock (`Validity`): it
    /// leads, and its last renewal's deadline has not passed. A frozen process keeps it until
    /// then; a dead one has none.
    pub(super) fn valid(&self, p: usize, s: u32, now: Duration) -> bool {
        let Some(process) = self.processes.get(p).filter(|q| q.alive()) else {
            return false;
        };
        let local = process.clock.local(now);
        process
            .electors
            .get(&s)
            .and_then(|e| e.until(self.timings))
            .is_some_and(|until| local < until)
    }

    /// Whether `p` reconciles shard `s` now (`Shards::holding`): announced held, and valid;
    /// without the validity check, announced held and leading as the elector last said.
    pub(super) fn believes(&self, p: usize, s: u32, now: Duration) -> bool {
        let Some(process) = self.processes.get(p).filter(|q| q.alive()) else {
            return false;
        };
        if !process.held.contains(&s) {
            return false;
        }
        if self.validity {
            self.valid(p, s, now)
        } else {
            process
                .electors
                .get(&s)
                .is_some_and(|e| matches!(e.state, Campaign::Leading { .. }))
        }
    }

    /// The processes holding `uid`'s shard validly now, each under its own layout.
    pub(super) fn holders(&self, uid: &str, now: Duration) -> Vec<usize> {
        (0..self.processes.len())
            .filter(|p| self.shard(*p, uid).is_some_and(|s| self.valid(*p, s, now)))
            .collect()
    }

    /// Every VM reconciled by some running process.
    pub(super) fn serves_all(&self, now: Duration) -> bool {
        self.uids.iter().all(|uid| {
            (0..self.processes.len()).any(|p| {
                self.processes.get(p).is_some_and(Process::can_run)
                    && self.shard(p, uid).is_some_and(|s| self.believes(p, s, now))
            })
        })
    }

    /// After `p` took shard `s`: a VM of it also validly held by another process.
    fn overlap(&self, p: usize, s: u32, now: Duration) -> Option<String> {
        for (vm, uid) in self.uids.iter().enumerate() {
            if self.shard(p, uid) != Some(s) {
                continue;
            }
            let holders = self.holders(uid, now);
            if holders.len() < 2 {
                continue;
            }
            let who: Vec<String> = holders
                .iter()
                .map(|q| self.describe(*q, uid, now))
                .collect();
            return Some(format!(
                "vm-{vm} held by two replicas at once: {}",
                who.join("; ")
            ));
        }
        None
    }

    /// The holder `identity` a Lease (shard `s` of its layout) was just taken over from, and
    /// how long ago its own hold ended (by the simulation's clock).
    fn expired(&self, identity: &str, s: u32, now: Duration) -> String {
        let Some(process) = self.processes.iter().find(|q| q.identity == identity) else {
            return format!("{identity} (gone)");
        };
        let until = process
            .electors
            .get(&s)
            .and_then(|e| e.until(self.timings))
            .filter(|_| process.alive());
        match until {
            Some(until) => {
                let ended = process.clock.global(until);
                let margin = now.checked_sub(ended).map_or_else(
                    || format!("still held {:?} more", ended - now),
                    |ago| format!("held until {ago:?} ago"),
                );
                format!("{identity} ({margin}, clock {} ppm)", process.clock.ppm)
            }
            None => format!("{identity} (not leading)"),
        }
    }

    /// `q`'s hold on `uid`'s shard, for a report.
    pub(super) fn describe(&self, q: usize, uid: &str, now: Duration) -> String {
        let Some(process) = self.processes.get(q) else {
            return format!("replica {q}");
        };
        let s = self.shard(q, uid).unwrap_or(0);
        let until = process.electors.get(&s).and_then(|e| e.until(self.timings));
        let until = until.map_or("(not leading)".to_owned(), |u| format!("{u:?}"));
        format!(
            "replica {q} ({}, {:?}, clock {} ppm) holds {} until {until} by its clock, which \
             reads {:?}",
            process.layout,
            process.run,
            process.clock.ppm,
            self.lease_name(q, s),
            process.clock.local(now)
        )
    }

    /// A Lease of the layout in force stamped with a generation that was never published:
    /// a switch away from it stamped some outgoing Leases, then conflicted on another and gave
    /// up (`layout.rs` `switch`), and no fence of the layout in force admits that Lease again.
    pub(super) fn stranded(&self) -> Option<String> {
        let layout = self.store.get(&format!("{GROUP}-layout"))?;
        let generation = stamp_of(layout);
        let in_force = layout
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LAYOUT_ANNOTATION))
            .and_then(|text| parse_layout(text))?;
        in_force.lease_names(GROUP).into_iter().find_map(|name| {
            let stamp = self.store.get(&name).map_or(0, stamp_of);
            (stamp > generation).then(|| {
                format!(
                    "{name} is stamped with generation {stamp}, which was never published: \
                     the layout in force ({in_force} at generation {generation}) can never \
                     take it (a switch away stamped it, then conflicted on a later Lease)"
                )
            })
        })
    }

    /// Every process's layout.
    pub(super) fn layouts(&self) -> Vec<Layout> {
        self.processes.iter().map(|p| p.layout).collect()
    }
}
