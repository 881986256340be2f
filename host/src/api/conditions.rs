//! `metav1.Condition` helpers shared by both resources.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// `Ready`: for a VirtualMachine, the external machine is observed running; for a
/// ProviderConfig, its plugin is loaded and its Secret resolved.
pub const READY: &str = "Ready";
/// `Synced`: the last reconcile of a VirtualMachine succeeded; its reason names the error class
/// when it did not.
pub const SYNCED: &str = "Synced";
/// `RestartRequired`: a change of a VirtualMachine (cpu, memory, parameters) can only be applied
/// to a stopped machine and `spec.updateStrategy` is not `Restart` (KubeVirt's name).
pub const RESTART_REQUIRED: &str = "RestartRequired";
/// `Synced` reason: the spec's change needs a new machine, which the operator never makes.
pub const REPLACEMENT_REQUIRED: &str = "ReplacementRequired";

/// `True`, `False` or `Unknown`, as `metav1.ConditionStatus` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Builds a condition stamped with the current time.
pub fn new(
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// Inserts or replaces the condition of `new.type_`.
///
/// `lastTransitionTime` changes only when `status` changes: a condition that keeps its status
/// but gets a new reason or message keeps the time it last flipped, as `meta.SetStatusCondition`
/// in apimachinery does.
pub fn set(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = new;
        }
        None => conditions.push(new),
    }
}

/// The condition of the given type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of the given type is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == Status::True.as_str())
}

/// A status that carries conditions.
pub trait Conditioned: Clone + PartialEq {
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

impl Conditioned for Vec<Condition> {
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        self
    }
}

impl Conditioned for super::VirtualMachineStatus {
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl Conditioned for super::ProviderConfigStatus {
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

/// Whether `a` and `b` say the same thing: equal apart from the conditions' transition times.
/// A status write that would change nothing else is not sent.
pub fn same<S: Conditioned>(a: &S, b: &S) -> bool {
    let strip = |s: &S| {
        let mut s = s.clone();
        for c in s.conditions_mut() {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64, mut c: Condition) -> Condition {
        c.last_transition_time = Time(Timestamp::from_second(secs).unwrap());
        c
    }

    #[test]
    fn same_status_keeps_transition_time() {
        let mut conds = vec![at(100, new(READY, Status::False, "Creating", "a", Some(1)))];
        set(
            &mut conds,
            at(200, new(READY, Status::False, "Waiting", "b", Some(2))),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time.0.as_second(), 100);
        assert_eq!(conds[0].reason, "Waiting");
        assert_eq!(conds[0].message, "b");
        assert_eq!(conds[0].observed_generation, Some(2));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut conds = vec![at(100, new(READY, Status::False, "Creating", "", Some(1)))];
        set(
            &mut conds,
            at(200, new(READY, Status::True, "Running", "", Some(1))),
        );
        assert_eq!(conds[0].last_transition_time.0.as_second(), 200);
        assert!(is_true(&conds, READY));
    }

    #[test]
    fn other_types_are_untouched() {
        let mut conds = vec![at(100, new(READY, Status::True, "Running", "", Some(1)))];
        set(
            &mut conds,
            at(
                200,
                new(SYNCED, Status::False, "Unauthorized", "no", Some(1)),
            ),
        );
        assert_eq!(conds.len(), 2);
        assert!(is_true(&conds, READY));
        assert!(!is_true(&conds, SYNCED));
    }

    #[test]
    fn same_ignores_transition_time_only() {
        let a = vec![at(1, new(READY, Status::True, "Running", "", Some(1)))];
        let b = vec![at(2, new(READY, Status::True, "Running", "", Some(1)))];
        let c = vec![at(2, new(READY, Status::True, "Running", "", Some(2)))];
        assert!(same(&a, &b));
        assert!(!same(&a, &c));
    }
}
