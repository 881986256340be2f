//! Day-2 schedules for the simulation: the fake plugin declares a random subset of `update`
//! and `power` (and may resize live or only when stopped) and may declare a launch-only
//! parameter `subnet`; the user edits memory, powerState, updateStrategy and `subnet` while
//! faults run; someone powers the machine at the cloud; in some schedules another VM claims
//! the machine at the cloud (its ownership mark changes).
//!
//! Checked after every step: no call whose capability is missing, no write (`update`, `start`,
//! `stop`) twice in one reconcile, at most one live machine, no write (`delete` included) to a
//! machine marked as another VM's, no `update` asked while the spec's `subnet` differs from the
//! machine's, and no `status.applied` recording a `subnet` other than the machine's. After the
//! faults stop: the machine has the power state, size and `subnet` the spec asks, or the VM
//! says why not (`RestartRequired=True` under `updateStrategy: Manual`, `PowerNotSupported`,
//! `UpdateNotSupported`, `InvalidSpec` for a changed `subnet`, `ReplacementRequired` from a
//! plugin whose `update` answers needs-replacement (the machine is never replaced),
//! `AdoptionConflict` once its machine was claimed); then deleting the VM leaves nothing of
//! its own behind, and the claimed machine to its new owner.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use vmop::api::{PowerState, UpdateStrategy, VirtualMachine, VirtualMachineStatus};
use vmop::controller::vm::Attempts;

use super::{Abilities, SETTLE_STEPS, STEPS, SUBNET, UID, World, advance, reconcile};

/// The uid of the VM that claims the machine in some schedules.
const OTHER: &str = "another-vm-uid";

const SIZES: [&str; 3] = ["512Mi", "1Gi", "2Gi"];

fn mib(memory: &Quantity) -> u64 {
    match memory.0.as_str() {
        "1Gi" => 1024,
        "2Gi" => 2048,
        _ => 512,
    }
}

/// The user edits the spec: a new generation.
fn edit(world: &mut World) {
    let Some(mut vm) = world.latest().cloned() else {
        return;
    };
    let what = world
        .rng
        .below(if world.abilities.launch_only { 4 } else { 3 });
    let spec = &mut vm.spec;
    let note = match what {
        3 => {
            let subnet = ["a", "b"].get(world.rng.below(3) as usize).copied();
            match subnet {
                Some(subnet) => spec.parameters.insert(SUBNET.into(), subnet.into()),
                None => spec.parameters.remove(SUBNET),
            };
            format!("user sets parameter subnet {subnet:?}")
        }
        0 => {
            let size = SIZES
                .get(world.rng.below(3) as usize)
                .copied()
                .unwrap_or("512Mi");
            spec.memory = Quantity(size.into());
            format!("user sets memory {size}")
        }
        1 => {
            spec.power_state = match spec.power_state {
                PowerState::Running => PowerState::Stopped,
                PowerState::Stopped => PowerState::Running,
            };
            format!("user sets powerState {:?}", spec.power_state)
        }
        _ => {
            spec.update_strategy = match spec.update_strategy {
                UpdateStrategy::Manual => UpdateStrategy::Restart,
                UpdateStrategy::Restart => UpdateStrategy::Manual,
            };
            format!("user sets updateStrategy {:?}", spec.update_strategy)
        }
    };
    vm.metadata.generation = Some(vm.metadata.generation.unwrap_or(1) + 1);
    world.note(note);
    world.commit(vm);
}

/// Someone powers the machine off or on at the cloud.
fn flip_power_outside(world: &mut World) {
    if let Some(m) = world.machines.iter_mut().find(|m| m.live && m.uid == UID) {
        m.running = !m.running;
        let (id, on) = (m.id.clone(), m.running);
        world.note(format!(
            "someone powers {id} {}",
            if on { "on" } else { "off" }
        ));
    }
}

/// Another VM claims the VM's live machine at the cloud (it changes the ownership mark).
pub(super) fn claim_outside(world: &mut World) {
    if let Some(m) = world.machines.iter_mut().find(|m| m.live && m.uid == UID) {
        m.uid = OTHER.into();
        let id = m.id.clone();
        world.stolen = true;
        world.note(format!("another VM claims {id} at the cloud"));
    }
}

fn synced_reason(vm: &VirtualMachine) -> Option<String> {
    synced_reason_of(vm.status.as_ref()?)
}

fn synced_reason_of(status: &VirtualMachineStatus) -> Option<String> {
    let synced = status.conditions.iter().find(|c| c.type_ == "Synced")?;
    (synced.status == "False").then(|| synced.reason.clone())
}

fn restart_required(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "RestartRequired" && c.status == "True")
    })
}

/// `status.applied` records the launch-only `subnet` the recorded machine was made with.
fn applied_subnet_is_the_machines(world: &World) -> Result<(), String> {
    let Some(status) = world.latest().and_then(|vm| vm.status.as_ref()) else {
        return Ok(());
    };
    let (Some(id), Some(applied)) = (&status.id, &status.applied) else {
        return Ok(());
    };
    let Some(machine) = world.machines.iter().find(|m| &m.id == id && m.live) else {
        return Ok(());
    };
    let recorded = applied.parameters.get(SUBNET);
    if recorded != machine.subnet.as_ref() {
        return Err(format!(
            "status.applied records subnet {recorded:?} for {id}, made with {:?}",
            machine.subnet
        ));
    }
    Ok(())
}

/// Whether the machine matches the spec, or the VM says why it cannot.
fn converged(world: &World) -> Result<(), String> {
    let vm = world.latest().ok_or("the VM is gone")?;
    let live: Vec<_> = world
        .machines
        .iter()
        .filter(|m| m.live && m.uid == UID)
        .collect();
    if live.is_empty() && world.stolen {
        // Its machine was claimed: left alone, and the VM says so, or first that the spec
        // asks another launch-only `subnet` (refused before any call).
        let subnet = vm.spec.parameters.get(SUBNET).and_then(|v| v.as_str());
        let relaunch = world
            .machines
            .iter()
            .any(|m| m.live && m.uid != UID && m.subnet.as_deref() != subnet);
        return match synced_reason(vm).as_deref() {
            Some("AdoptionConflict") => Ok(()),
            Some("InvalidSpec") if relaunch => Ok(()),
            other => Err(format!(
                "the machine was claimed by another VM, and the VM says {other:?}"
            )),
        };
    }
    let [machine] = live.as_slice() else {
        return Err(format!("{} live machines after settling", live.len()));
    };
    // A changed launch-only `subnet` is refused before any call, and nothing else is done
    // until it is reverted: the VM says so, and only when it is so.
    let subnet = vm.spec.parameters.get(SUBNET).and_then(|v| v.as_str());
    let refused = synced_reason(vm).as_deref() == Some("InvalidSpec");
    if machine.subnet.as_deref() != subnet || refused {
        return match (machine.subnet.as_deref() != subnet, refused) {
            (true, true) => Ok(()),
            (changed, _) => Err(format!(
                "machine made with subnet {:?}, spec asks {subnet:?}, Synced {:?} (changed: \
                 {changed})",
                machine.subnet,
                synced_reason(vm)
            )),
        };
    }
    let abilities = world.abilities;
    let want_running = vm.spec.power_state == PowerState::Running;
    let unsupported =
        synced_reason(vm).is_some_and(|r| r == "PowerNotSupported" || r == "UpdateNotSupported");
    // A change that needs a new machine is said first; the power state is said once it is gone.
    let replacing = synced_reason(vm).as_deref() == Some("ReplacementRequired");
    if machine.running != want_running && (abilities.power || !(unsupported || replacing)) {
        return Err(format!(
            "machine running={} but powerState {:?} (abilities {abilities:?}, Synced {:?})",
            machine.running,
            vm.spec.power_state,
            synced_reason(vm)
        ));
    }
    let want = mib(&vm.spec.memory);
    if machine.memory_mib != want {
        let waiting = vm.spec.update_strategy == UpdateStrategy::Manual
            && machine.running
            && restart_required(vm);
        // A machine found after its create's answer was lost has no known `applied`: without
        // `update` there is no way to know its size, and it is taken as the spec's (documented
        // on `status.applied`).
        let unknowable =
            !abilities.update && vm.status.as_ref().is_some_and(|s| s.applied.is_none());
        // Never replaced: the one machine keeps its size and the VM says a new one is needed.
        let replacement =
            abilities.replace_only && synced_reason(vm).as_deref() == Some("ReplacementRequired");
        if !(waiting || unsupported || unknowable || replacement) {
            return Err(format!(
                "machine has {} MiB, spec {want} MiB, and the VM says nothing (abilities \
                 {abilities:?}, strategy {:?}, RestartRequired {}, Synced {:?})",
                machine.memory_mib,
                vm.spec.update_strategy,
                restart_required(vm),
                synced_reason(vm)
            ));
        }
    }
    Ok(())
}

/// One day-2 schedule.
pub(super) async fn run(world: &mut World) -> Result<(), String> {
    world.abilities = Abilities {
        update: world.rng.chance(70),
        power: world.rng.chance(70),
        live_resize: world.rng.chance(30),
        replace_only: world.rng.chance(15),
        consistent_get: world.rng.chance(50),
        launch_only: world.rng.chance(50),
    };
    let abilities = world.abilities;
    let claims = world.rng.chance(20);
    world.note(format!(
        "plugin abilities {abilities:?}{}",
        if claims { ", another VM claims" } else { "" }
    ));
    let mut attempts = Attempts::new();
    for step in 0..STEPS + SETTLE_STEPS {
        if step == STEPS {
            world.faults = false;
            world.note("faults and edits stop".into());
        }
        if world.faults {
            if world.rng.chance(12) {
                edit(world);
            }
            if world.rng.chance(4) {
                flip_power_outside(world);
            }
            if claims && !world.stolen && world.rng.chance(3) {
                claim_outside(world);
            }
        }
        reconcile(world, &mut attempts);
        if let Some(v) = world.violations.first() {
            return Err(format!("step {step}: {v}"));
        }
        applied_subnet_is_the_machines(world).map_err(|v| format!("step {step}: {v}"))?;
        if world.live_for_uid() > 1 {
            return Err(format!("duplicated at step {step}"));
        }
        let by = Duration::from_secs(world.rng.below(15));
        advance(world, by).await;
    }
    // Settled is quiet: more reconciles write nothing (a VM whose conditions alternate, each
    // reconcile undoing what the last one said, writes its status every time).
    let settled = world
        .latest()
        .and_then(|vm| vm.status.clone())
        .unwrap_or_default();
    for _ in 0..3 {
        reconcile(world, &mut attempts);
        advance(world, Duration::from_secs(20)).await;
        let now = world
            .latest()
            .and_then(|vm| vm.status.clone())
            .unwrap_or_default();
        if !vmop::api::conditions::same(&settled, &now) {
            return Err(format!(
                "the status still changes after settling: Synced {:?} -> {:?}",
                synced_reason_of(&settled),
                synced_reason_of(&now)
            ));
        }
    }
    converged(world)?;
    let mut vm = world.latest().cloned().ok_or("no object")?;
    vm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    world.note("user deletes the VM".into());
    world.commit(vm);
    for _ in 0..SETTLE_STEPS {
        reconcile(world, &mut attempts);
        if let Some(v) = world.violations.first() {
            return Err(v.clone());
        }
        advance(world, Duration::from_secs(5)).await;
    }
    if !world.gone() {
        return Err("the VM is still there after deletion (stuck)".into());
    }
    if world.live_for_uid() > 0 {
        return Err("a live machine was left behind (leaked)".into());
    }
    let claimed_left = world
        .machines
        .iter()
        .any(|m| m.live && m.uid == OTHER && m.deleting_until.is_none());
    if world.stolen && !claimed_left {
        return Err("the machine another VM claimed was deleted".into());
    }
    Ok(())
}
