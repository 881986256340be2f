//! Lease-timed fleet schedules: who holds which shard is decided by the replicas' control
//! plane (`leases.rs`), each replica going by its own clock, while the scheduler freezes,
//! partitions, kills and restarts replicas, rolls them from one layout to another, and
//! interleaves their reconciles as in the other fleet schedules.

use std::sync::Arc;
use std::time::Duration;

use vmop::controller::vm::Attempts;
use vmop::leader::layout::Layout;
use vmop::leader::shards::shard_of;

use super::leases::{Control, Effect, Run, Setup, Timings, count_of};
use super::{Fleet, Replica, Shape, Variant, build_with, delete_vm, set_paused, settle, tick};
use crate::World;

/// Steps of the faulty phase: a floor, plus per VM.
const MIN_STEPS: u32 = 500;
const STEPS_PER_VM: u32 = 30;
/// The longest a freeze (SIGSTOP) and a partition from the API server are planned to last.
const MAX_FREEZE_MS: u64 = 40_000;
const MAX_CUT_MS: u64 = 30_000;
/// Every VM is reconciled by some replica again within this after the faults stop.
const SERVE_WITHIN_SECS: u32 = 180;
/// Clock rates (ppm of the simulation's clock) inside the bound: the slowest runs at more
/// than `renew_deadline / lease_duration` of the fastest (0.81 / 1.19 = 0.68 > 0.67).
const NEAR: (u64, u64) = (950_000, 1_050_000);
const WIDE: (u64, u64) = (810_000, 1_190_000);
/// Far beyond it ([`Variant::SkewBeyondBound`]).
const BEYOND: (u64, u64) = (500_000, 1_500_000);

/// What a lease-timed schedule runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timed {
    /// One or two rollouts to another layout during the faults.
    pub(crate) rollouts: bool,
}

/// A rollout that starts at a step: the Deployment's replicas move to `to`.
#[derive(Debug, Clone, Copy)]
struct Rollout {
    at: u32,
    to: Layout,
}

impl Fleet {
    /// Runs `act` on the control plane and the world.
    fn control<T: Default>(&self, act: impl FnOnce(&mut Control, &mut World) -> T) -> T {
        let mut shared = self.world();
        let super::Shared { world, control, .. } = &mut *shared;
        control.as_mut().map(|c| act(c, world)).unwrap_or_default()
    }

    /// Does what the control plane's steps ask of the replicas.
    pub(super) fn apply(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Acquired(p, s) => {
                    let layout = self.control(|c, _| c.processes.get(p).map(|q| q.layout));
                    let newest = self.newest();
                    let uids = &self.uids;
                    let Some(r) = self.replicas.get_mut(p) else {
                        continue;
                    };
                    match layout {
                        // `lead` starts the controllers now: a new context, a fresh list.
                        Some(Layout::Leader) => {
                            r.attempts = Arc::new(Attempts::new());
                            r.floors = newest;
                        }
                        // `on_acquiring`, and the sharded watch lists the shard again.
                        Some(Layout::Shards(count)) => {
                            r.attempts.acquired(s, count);
                            for (vm, floor) in r.floors.iter_mut().enumerate() {
                                if uids.get(vm).is_some_and(|u| shard_of(u, count) == s) {
                                    *floor = newest.get(vm).copied().unwrap_or(*floor);
                                }
                            }
                        }
                        None => {}
                    }
                }
                Effect::Lost(p, s) => self.reconciles.retain(|r| r.replica != p || r.shard != s),
                Effect::Ended(p) => self.reconciles.retain(|r| r.replica != p),
                Effect::Restarted(p) => {
                    let newest = self.newest();
                    if let Some(r) = self.replicas.get_mut(p) {
                        r.attempts = Arc::new(Attempts::new());
                        r.floors = newest;
                        r.generation += 1;
                    }
                }
            }
        }
    }

    /// `replica`'s process dies (a crash fate, a kill) and is restarted a moment later.
    pub(super) fn crash(&mut self, replica: usize) {
        let effects = self.control(|c, w| {
            let after = Duration::from_millis(1_000 + w.rng.below(9_000));
            c.crash(w, replica, Some(after))
        });
        self.apply(effects);
    }

    /// Freezes `replica` (SIGSTOP) for about `for_ms`. A call it is inside stays where it
    /// is, its answer unread: the call already reached the cloud when it was made here, and
    /// nothing of the replica runs until it resumes, when its reconcile checks its hold
    /// first. The in-call check therefore leaves it out meanwhile (the caveat of every lease:
    /// a request in flight when its sender froze).
    fn freeze(&mut self, replica: usize, for_ms: u64) {
        let mut shared = self.world();
        let super::Shared {
            world,
            control,
            in_call,
            ..
        } = &mut *shared;
        if let Some(control) = control {
            let until = world.now + Duration::from_millis(for_ms);
            control.freeze(world, replica, until);
            in_call.retain(|_, r| *r != replica);
        }
    }

    /// Starts a new replica process of `layout` (a rollout's new pod).
    fn spawn(&mut self, layout: Layout) {
        let p = self.control(|c, w| Some(c.spawn(w, layout)));
        let newest = self.newest();
        if p == Some(self.replicas.len()) {
            self.replicas.push(Replica {
                attempts: Arc::new(Attempts::new()),
                floors: newest,
                generation: 0,
            });
        }
    }

    /// One step of a rollout to `to` with `replicas` replicas (one surge pod): a new pod while
    /// there are no more than `replicas`, else an old one stops, gracefully unless `kill`s
    /// say otherwise. Whether any old pod was left.
    fn roll(&mut self, to: Layout, replicas: usize, kills: bool) -> bool {
        let (old, new): (Vec<(usize, Run)>, usize) = self.control(|c, _| {
            let live = c
                .processes
                .iter()
                .enumerate()
                .filter(|(_, q)| q.run != Run::Retired);
            let old = live
                .clone()
                .filter(|(_, q)| q.layout != to)
                .map(|(p, q)| (p, q.run))
                .collect();
            (old, live.filter(|(_, q)| q.layout == to).count())
        });
        if old.is_empty() {
            return false;
        }
        if old.len() + new <= replicas {
            self.note(format!("rollout to {to}: a new pod"));
            self.spawn(to);
            return true;
        }
        let pick = self.world().world.rng.below(old.len() as u64) as usize;
        let Some(&(p, run)) = old.get(pick) else {
            return true;
        };
        let kill = kills && self.world().world.rng.chance(15);
        let effects = self.control(|c, w| match run {
            Run::Running if !kill => c.stop(w, p, None),
            _ => c.crash(w, p, None),
        });
        self.apply(effects);
        true
    }
}

/// One lease-timed schedule: its control plane and faults as above; with `rollouts`, one or
/// two rollouts to another layout (the second maybe back) start during the faults. Then
/// the faults stop and the last rollout completes; every VM is served again, settles,
/// converges; every VM is deleted, settles, nothing is left.
pub(crate) async fn run(
    mut world: World,
    variant: Variant,
    kind: Timed,
) -> (Result<(), String>, Vec<String>) {
    let Timed { rollouts } = kind;
    const LAYOUTS: [Layout; 4] = [
        Layout::Leader,
        Layout::Shards(2),
        Layout::Shards(3),
        Layout::Shards(4),
    ];
    let rng = &mut world.rng;
    let mut layout = || {
        LAYOUTS
            .get(rng.below(LAYOUTS.len() as u64) as usize)
            .copied()
            .unwrap_or(Layout::Leader)
    };
    let first = layout();
    let mut plan = Vec::new();
    if rollouts {
        let mut to = layout();
        while to == first {
            to = layout();
        }
        let mut second = layout();
        while second == to {
            second = layout();
        }
        plan.push((to, second));
    }
    let shape = Shape {
        replicas: 1 + world.rng.below(4) as usize,
        shards: count_of(first),
        vms: if world.rng.chance(10) {
            1 + world.rng.below(24) as usize
        } else {
            1 + world.rng.below(8) as usize
        },
    };
    let steps = MIN_STEPS + STEPS_PER_VM * shape.vms as u32;
    let plan: Vec<Rollout> = plan
        .into_iter()
        .flat_map(|(to, second)| {
            let rng = &mut world.rng;
            let at = steps / 10 + rng.below(u64::from(steps * 4 / 10)) as u32;
            let mut plan = vec![Rollout { at, to }];
            if rng.chance(30) {
                let then = at + 50 + rng.below(u64::from(steps / 2)) as u32;
                plan.push(Rollout {
                    at: then.min(steps - 1),
                    to: second,
                });
            }
            plan
        })
        .collect();
    let rates = match variant {
        Variant::SkewBeyondBound => BEYOND,
        _ if world.rng.chance(50) => NEAR,
        _ => WIDE,
    };
    let bound = Timings::product().bound_ppm();
    assert!(
        variant == Variant::SkewBeyondBound || rates.0 * 1_000_000 / rates.1 > bound,
        "the default clock rates stay inside the bound"
    );
    world.note(format!(
        "lease-timed: layout {first}, clock rates {rates:?} ppm, rollouts {plan:?}"
    ));
    let replicas = shape.replicas;
    let mut fleet = build_with(world, variant, shape);
    let control = Control::new(
        Setup {
            validity: variant != Variant::WithoutValidity,
            fenced: variant != Variant::Unfenced,
            stamped: variant != Variant::UnstampedSwitch,
            republish: variant != Variant::WithoutRepublish,
            rates,
        },
        fleet.uids.clone(),
    );
    fleet.world().control = Some(control);
    for p in 0..replicas {
        let spawned = fleet.control(|c, w| Some(c.spawn(w, first)));
        debug_assert_eq!(spawned, Some(p));
    }
    let result = run_schedule(&mut fleet, &plan, replicas, steps).await;
    let log = std::mem::take(&mut fleet.world().world.log);
    (result, log)
}

async fn run_schedule(
    fleet: &mut Fleet,
    plan: &[Rollout],
    replicas: usize,
    steps: u32,
) -> Result<(), String> {
    let vms = fleet.uids.len();
    let mut target = None;
    let mut next_action = 0;
    let rng = |fleet: &Fleet, n: u64| fleet.world().world.rng.below(n);
    for step in 0..steps {
        if let Some(rollout) = plan.iter().find(|r| r.at == step) {
            fleet.note(format!("a rollout to {} begins", rollout.to));
            target = Some(rollout.to);
            next_action = step;
        }
        if let Some(to) = target
            && step >= next_action
        {
            fleet.roll(to, replicas, true);
            next_action = step + 20 + rng(fleet, 60) as u32;
        }
        let now = fleet.world().world.now;
        // A frozen replica whose freeze is over resumes within a few steps (SIGCONT): its
        // reconciles may run before its elector does.
        let thawed: Vec<usize> = fleet.control(|c, _| {
            (0..c.processes.len())
                .filter(|p| {
                    c.processes
                        .get(*p)
                        .is_some_and(|q| matches!(q.run, Run::Frozen { until } if until <= now))
                })
                .collect()
        });
        if let Some(p) = thawed.first().copied()
            && rng(fleet, 4) == 0
        {
            fleet.control(|c, w| c.resume(w, p));
        }
        let running: Vec<usize> = fleet.control(|c, _| {
            (0..c.processes.len())
                .filter(|p| c.processes.get(*p).is_some_and(|q| q.can_run()))
                .collect()
        });
        let one_running = |fleet: &Fleet| {
            running
                .get(rng(fleet, running.len() as u64) as usize)
                .copied()
        };
        // Freezes and partitions mostly hit a replica holding something: the hand-overs
        // that timing decides.
        let holding: Vec<usize> = fleet.control(|c, _| {
            running
                .iter()
                .copied()
                .filter(|p| c.processes.get(*p).is_some_and(|q| !q.held.is_empty()))
                .collect()
        });
        let one_holding =
            |fleet: &Fleet| match holding.get(rng(fleet, holding.len() as u64) as usize) {
                Some(p) if rng(fleet, 10) < 7 => Some(*p),
                _ => one_running(fleet),
            };
        match rng(fleet, 100) {
            0..=24 => {
                let vm = rng(fleet, vms as u64) as usize;
                fleet.start(vm);
            }
            25..=59 => {
                let pollable = fleet.pollable();
                if let Some(index) = pollable.get(rng(fleet, pollable.len() as u64) as usize) {
                    fleet.poll(*index);
                }
            }
            85 => {
                if let Some(p) = one_holding(fleet) {
                    let for_ms = rng(fleet, MAX_FREEZE_MS);
                    fleet.freeze(p, for_ms);
                }
            }
            88 => {
                if let Some(p) = one_holding(fleet) {
                    let until = now + Duration::from_millis(rng(fleet, MAX_CUT_MS));
                    fleet.control(|c, w| c.cut(w, p, until));
                }
            }
            89 => {
                if let Some(p) = one_running(fleet) {
                    fleet.crash(p);
                }
            }
            90 => {
                if let Some(p) = one_running(fleet) {
                    let effects = fleet.control(|c, w| {
                        let after = Duration::from_millis(1_000 + w.rng.below(4_000));
                        c.stop(w, p, Some(after))
                    });
                    fleet.apply(effects);
                }
            }
            91 if fleet.world().world.rng.chance(30) => {
                let vm = rng(fleet, vms as u64) as usize;
                delete_vm(fleet, vm);
            }
            92 => {
                let vm = rng(fleet, vms as u64) as usize;
                let paused = fleet.world().world.rng.chance(50);
                set_paused(fleet, vm, paused);
            }
            93 if fleet.world().world.rng.chance(30) => {
                let vm = rng(fleet, vms as u64) as usize;
                if !fleet.external.contains_key(&vm) {
                    let uid = fleet.uids.get(vm).cloned().unwrap_or_default();
                    fleet.world().world.terminate_behind_our_back(&uid);
                }
            }
            _ => {
                let by = if rng(fleet, 10) == 0 {
                    rng(fleet, 5_000)
                } else {
                    rng(fleet, 800)
                };
                tick(fleet, Duration::from_millis(by)).await;
            }
        }
        fleet.check().map_err(|e| format!("step {step}: {e}"))?;
    }
    {
        let mut shared = fleet.world();
        shared.world.faults = false;
        shared.world.note(
            "faults stop: every replica resumed and reachable, the rollout completes, \
             nothing paused"
                .into(),
        );
    }
    let frozen: Vec<usize> = fleet.control(|c, _| {
        (0..c.processes.len())
            .filter(|p| {
                c.processes
                    .get(*p)
                    .is_some_and(|q| matches!(q.run, Run::Frozen { .. }))
            })
            .collect()
    });
    for p in frozen {
        fleet.control(|c, w| c.resume(w, p));
    }
    fleet.control(|c, _| c.heal());
    if let Some(to) = target {
        while fleet.roll(to, replicas, false) {}
    }
    fleet.finish();
    for vm in 0..vms {
        set_paused(fleet, vm, false);
    }
    let mut waited = 0;
    while !fleet.control(|c, w| c.serves_all(w.now)) {
        if waited == SERVE_WITHIN_SECS {
            let stranded = fleet.control(|c, _| c.stranded());
            return Err(format!(
                "not every VM is reconciled by a replica {SERVE_WITHIN_SECS}s after the faults \
                 stopped (stuck): layouts {:?}{}",
                fleet.control(|c, _| c.layouts()),
                stranded.map(|why| format!("; {why}")).unwrap_or_default()
            ));
        }
        tick(fleet, Duration::from_secs(1)).await;
        fleet.check().map_err(|e| format!("serving again: {e}"))?;
        waited += 1;
    }
    settle(fleet).await.map_err(|e| format!("settling: {e}"))?;
    fleet.converged()?;
    for vm in 0..vms {
        delete_vm(fleet, vm);
    }
    settle(fleet)
        .await
        .map_err(|e| format!("settling the deletion: {e}"))?;
    tick(fleet, Duration::ZERO).await;
    fleet.cleaned_up()
}
