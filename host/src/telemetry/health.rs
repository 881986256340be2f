//! Liveness and readiness as the HTTP server reports them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the operator is ready to serve: `/readyz` answers 200 only while this is set.
///
/// Set it once the controllers' reflector caches are filled (`Store::wait_until_ready`); a
/// replica that waits for the leader Lease is ready too, since it can take over at any time
/// (otherwise a Deployment with several replicas never finishes a rollout). Clones share the
/// flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_ready(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let readiness = Readiness::new();
        let seen_by_server = readiness.clone();
        assert!(!seen_by_server.is_ready());
        readiness.set_ready(true);
        assert!(seen_by_server.is_ready());
        readiness.set_ready(false);
        assert!(!seen_by_server.is_ready());
    }
}
