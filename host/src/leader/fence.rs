//! The generation fence on a Lease: which layout generation may hold it.
//!
//! Every write a fenced candidate makes to a Lease stamps it with the generation of the layout
//! it campaigns under ([`GENERATION_ANNOTATION`]); a candidate may create, take or renew a Lease
//! only if that stamp is not newer than its own generation. A layout switch
//! (`layout.rs`) stamps every Lease of the outgoing layout with the next generation, each by a
//! write conditional on the `resourceVersion` it read, *before* it publishes that generation.
//! The two writes meet on the same object, so the API server orders them: either the old
//! holder's acquisition came first (the switch's write conflicts, and it waits for the Lease
//! again) or the stamp did (the old candidate reads a newer generation and stands down). No
//! clock is involved beyond the Lease's own expiry.

use k8s_openapi::api::coordination::v1::Lease;

/// Annotation of a Lease: the newest layout generation that wrote it (decimal).
pub const GENERATION_ANNOTATION: &str = "vmop.dev/layout-generation";

/// What a candidate may hold, as told by the layout it campaigns under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// No layout: any Lease as the elector's own rules allow (a single election).
    Unfenced,
    /// The layout in force is not this candidate's (or not read yet): hold nothing.
    Closed,
    /// This candidate's layout is in force at this generation.
    Open(u64),
}

impl Fence {
    /// Whether this candidate may create, take or renew `lease` (`None`: it does not exist).
    pub fn admits(self, lease: Option<&Lease>) -> bool {
        match self {
            Fence::Unfenced => true,
            Fence::Closed => false,
            Fence::Open(generation) => lease.map_or(0, stamped) <= generation,
        }
    }

    /// Stamps `lease`, about to be written by this candidate, with its generation.
    pub fn stamp(self, lease: &mut Lease) {
        if let Fence::Open(generation) = self {
            stamp(lease, generation);
        }
    }
}

/// The generation `lease` was stamped with; 0 when none (written unfenced, or by an older
/// version), or unreadable.
pub fn stamped(lease: &Lease) -> u64 {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GENERATION_ANNOTATION))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

/// Sets `lease`'s stamp to `generation`.
pub fn stamp(lease: &mut Lease, generation: u64) {
    lease
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(GENERATION_ANNOTATION.to_owned(), generation.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_at(generation: Option<u64>) -> Lease {
        let mut lease = Lease::default();
        if let Some(g) = generation {
            stamp(&mut lease, g);
        }
        lease
    }

    #[test]
    fn an_open_fence_admits_leases_up_to_its_generation_only() {
        let open = Fence::Open(3);
        assert!(open.admits(None));
        assert!(open.admits(Some(&lease_at(None))));
        assert!(open.admits(Some(&lease_at(Some(2)))));
        assert!(open.admits(Some(&lease_at(Some(3)))));
        assert!(
            !open.admits(Some(&lease_at(Some(4)))),
            "stamped by a newer layout"
        );
        assert!(!Fence::Closed.admits(None));
        assert!(!Fence::Closed.admits(Some(&lease_at(Some(0)))));
        assert!(Fence::Unfenced.admits(Some(&lease_at(Some(9)))));
    }

    #[test]
    fn stamps_are_written_by_open_fences_and_read_back() {
        let mut lease = lease_at(None);
        Fence::Closed.stamp(&mut lease);
        Fence::Unfenced.stamp(&mut lease);
        assert_eq!(stamped(&lease), 0);
        Fence::Open(7).stamp(&mut lease);
        assert_eq!(stamped(&lease), 7);
        let mut garbled = lease_at(None);
        garbled
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(GENERATION_ANNOTATION.to_owned(), "x".to_owned());
        assert_eq!(stamped(&garbled), 0);
    }
}
