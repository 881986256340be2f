//! What [`decide`](super::decide) names: the [`Action`] a VM needs, and who else manages a
//! machine ([`Claimant`]).

use std::time::Duration;

use super::LaunchOnlyChange;
use crate::plugin::VmStatus;

/// Who else manages a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimant {
    /// The VirtualMachine (`namespace/name`) in the cluster that records it in `status.id`.
    VirtualMachine(String),
    /// The uid in the machine's ownership mark (`vm-status.owner`), which may belong to a
    /// VirtualMachine no longer in the cluster.
    Uid(String),
}

impl std::fmt::Display for Claimant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claimant::VirtualMachine(name) => write!(f, "VirtualMachine {name}"),
            Claimant::Uid(uid) => write!(
                f,
                "the VirtualMachine with uid {uid} (the machine's ownership mark)"
            ),
        }
    }
}

/// What the VM needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The machine is there (possibly found under an id not recorded yet): mirror it.
    Observe(VmStatus),
    /// No machine has been recorded: create it (idempotent on the uid) at `location`.
    Create { location: String },
    /// Before creating at `location`, record that creates go there (no create can have made a
    /// machine elsewhere) and with the spec's parameters (annotation
    /// `vmop.dev/create-parameters`: what a machine found without a create answer was made with).
    Intend { location: String },
    /// The recorded machine is confirmed lost: create a new one at `location`.
    Recreate { lost: String, location: String },
    /// Deleting: ask the provider to delete the machine with this id.
    Delete(String),
    /// Deleting: the provider is deleting it; watch it go.
    AwaitDeletion(VmStatus),
    /// Deleting: no machine exists; drop the finalizer.
    Release,
    /// Deleting with `deletionPolicy: Orphan`: drop the finalizer, leave the machine.
    Orphan,
    /// The provider says "none", but that cannot be believed for `remaining` more.
    AwaitAbsence { remaining: Duration },
    /// The provider says "none" from another location than the recorded one.
    LocationChanged { recorded: String, current: String },
    /// Annotation `vmop.dev/paused`: no call, no change.
    Paused,
    /// `spec.externalId` names this machine, which no other VM records: record it as ours.
    Adopt { machine: VmStatus, location: String },
    /// The machine (`spec.externalId`, or the one recorded) is another VM's: never take it
    /// over, never act on it.
    AdoptionConflict { id: String, owner: Claimant },
    /// Deleting a VM whose recorded machine carries another VM's ownership mark: drop the
    /// finalizer and leave the machine to its owner.
    Disown { id: String, owner: String },
    /// A launch-only parameter changed after creation: refused (`InvalidSpec`) before any
    /// call; the machine and `status.applied` stay as they are.
    LaunchOnly(Vec<LaunchOnlyChange>),
    /// The machine to adopt or observe does not exist (never created: not ours to create).
    NotFound { id: Option<String> },
    /// Make the machine match `desired` (cpu, memory, parameters) with `update`.
    Update(VmStatus),
    /// Stop the machine: `spec.powerState: Stopped`, or (`restart`) to apply an update that
    /// needs it stopped.
    Stop { machine: VmStatus, restart: bool },
    /// Start the machine: `spec.powerState: Running`.
    Start(VmStatus),
    /// The spec's change needs a new machine (`update` answered needs-replacement for this
    /// generation): never replaced, said in a condition; the machine is otherwise kept as the
    /// spec asks (its power state).
    ReplacementRequired(VmStatus),
    /// The spec asks for something the plugin cannot do (`capability` is missing): never
    /// called, said in a condition.
    Unsupported {
        machine: VmStatus,
        capability: &'static str,
        what: &'static str,
    },
}
