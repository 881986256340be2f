//! How long this process may still act on a Lease it holds, by its own monotonic clock.
//!
//! The elector steps down at the latest `renew_deadline` after the start of its last
//! successful renewal, and the others take over no earlier than `lease_duration` after it.
//! But the step-down is a task that must run to say so: a process frozen (SIGSTOP, a paused
//! VM) past its Lease wakes with every timer due at once, and a reconcile may run before the
//! elector does. [`Validity`] lets the reconcile check for itself: the hold is valid only
//! until `renewed_at + renew_deadline`, an [`Instant`] that a frozen process sees as passed
//! the moment it runs again.

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

/// A receiver of a Lease's validity: whether the elector leads, and until when.
#[derive(Debug, Clone)]
pub struct Validity {
    pub(super) leading: watch::Receiver<bool>,
    pub(super) until: watch::Receiver<Option<Instant>>,
}

impl Validity {
    /// Leading, and the last renewal's deadline not passed.
    pub fn is_valid(&self) -> bool {
        *self.leading.borrow() && self.until.borrow().is_some_and(|t| Instant::now() < t)
    }

    /// Resolves once the hold is no longer valid: the elector said so, or the deadline of the
    /// last renewal passed (whichever this task sees first).
    pub async fn lost(&mut self) {
        loop {
            let Some(until) = *self.until.borrow_and_update() else {
                return;
            };
            if !*self.leading.borrow() || Instant::now() >= until {
                return;
            }
            tokio::select! {
                biased;
                () = sleep_until(until) => {
                    if *self.until.borrow() == Some(until) {
                        return;
                    }
                }
                changed = self.until.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = self.leading.wait_for(|l| !*l) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hold_ends_at_its_deadline_unless_renewed() {
        let (leading_tx, leading) = watch::channel(true);
        let start = Instant::now();
        let (until_tx, until) = watch::channel(Some(start + Duration::from_secs(10)));
        let mut validity = Validity { leading, until };
        assert!(validity.is_valid());
        // Renewed at 5 s: valid until 15 s.
        tokio::time::advance(Duration::from_secs(5)).await;
        until_tx.send_replace(Some(start + Duration::from_secs(15)));
        let lost = tokio::spawn({
            let mut validity = validity.clone();
            async move {
                validity.lost().await;
                Instant::now()
            }
        });
        let at = lost.await.expect("the task");
        assert_eq!(at, start + Duration::from_secs(15));
        assert!(!validity.is_valid(), "past the deadline");
        // The elector stepping down ends it at once too.
        until_tx.send_replace(Some(Instant::now() + Duration::from_secs(10)));
        assert!(validity.is_valid());
        leading_tx.send_replace(false);
        assert!(!validity.is_valid());
        validity.lost().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_process_sees_its_hold_lost_before_anything_runs() {
        let (_leading_tx, leading) = watch::channel(true);
        let (_until_tx, until) = watch::channel(Some(Instant::now() + Duration::from_secs(10)));
        let mut validity = Validity { leading, until };
        // As if frozen for a minute: no task ran, the elector has said nothing.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!validity.is_valid());
        let lost = tokio::time::timeout(Duration::ZERO, validity.lost()).await;
        assert!(lost.is_ok(), "lost without waiting");
    }
}
