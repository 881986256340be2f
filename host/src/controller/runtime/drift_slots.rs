//! The reconcile workers that drift checks may hold.
//!
//! # Guarantees
//!
//! - At most [`DriftSlots::for_workers`]`(n)` drift checks (the periodic look at a settled VM,
//!   [`crate::controller::vm::is_drift_check`]) are reconciled at once: three quarters of the
//!   `n` workers, at least one, and always at least one fewer than `n` when `n > 1` (no limit
//!   when the workers have none). A check
//!   that finds none free is requeued after [`BUSY_RETRY`] without any call
//!   (`at_most_three_quarters_of_the_workers_check_drift`).
//! - So work that changes something (a create, a delete, a user's edit) always finds a worker,
//!   however many settled VMs are due. Without this, drift checks that the workers cannot keep
//!   up with (10,000 VMs polled every minute with one call of 50–200 ms each need more than 16
//!   workers can do) keep every worker busy and the controller's queue backlogged, and the VMs
//!   that have waited longest in it, new ones among them, never get a worker.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a drift check that found no free slot waits before it tries again (jittered).
pub const BUSY_RETRY: Duration = Duration::from_secs(2);

/// The slots for drift checks of one controller.
#[derive(Debug, Clone)]
pub struct DriftSlots {
    slots: Arc<Semaphore>,
}

/// Held for the length of one drift check.
#[derive(Debug)]
pub struct DriftSlot {
    _permit: OwnedSemaphorePermit,
}

impl DriftSlots {
    /// The slots for a controller with `workers` reconcile workers (0: unbounded, and so are
    /// the slots).
    pub fn for_workers(workers: u16) -> Self {
        let workers = usize::from(workers);
        let slots = match workers {
            0 => Semaphore::MAX_PERMITS,
            n => (n * 3 / 4).clamp(1, n.saturating_sub(1).max(1)),
        };
        DriftSlots {
            slots: Arc::new(Semaphore::new(slots)),
        }
    }

    /// A slot now, or `None` when every one is held. Never waits: a worker that waited here
    /// would be one more taken from the work this exists to keep room for.
    pub fn try_take(&self) -> Option<DriftSlot> {
        self.slots
            .clone()
            .try_acquire_owned()
            .ok()
            .map(|permit| DriftSlot { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_three_quarters_of_the_workers_check_drift() {
        for (workers, slots) in [(1, 1), (2, 1), (3, 2), (4, 3), (16, 12), (100, 75)] {
            let drift = DriftSlots::for_workers(workers);
            let held: Vec<_> = std::iter::from_fn(|| drift.try_take()).take(200).collect();
            assert_eq!(held.len(), slots, "{workers} workers");
            drop(held);
            assert!(
                drift.try_take().is_some(),
                "a slot is free again once released"
            );
        }
    }
}
