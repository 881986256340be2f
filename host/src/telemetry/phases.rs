//! `vmop_virtual_machines{phase}`: VirtualMachines per phase, counted at scrape time.

use std::sync::RwLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::api::VmPhase;

const PHASES: [VmPhase; 7] = [
    VmPhase::Pending,
    VmPhase::Provisioning,
    VmPhase::Running,
    VmPhase::Stopped,
    VmPhase::Failed,
    VmPhase::Deleting,
    VmPhase::Unknown,
];

/// Numbers of VirtualMachines per phase, for `vmop_virtual_machines`. A VM without a phase
/// yet (never reconciled) counts as `Pending`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseCounts([i64; PHASES.len()]);

impl PhaseCounts {
    pub fn get(&self, phase: VmPhase) -> i64 {
        self.0.get(position(phase)).copied().unwrap_or_default()
    }
}

impl FromIterator<Option<VmPhase>> for PhaseCounts {
    fn from_iter<I: IntoIterator<Item = Option<VmPhase>>>(phases: I) -> Self {
        let mut counts = PhaseCounts::default();
        for phase in phases {
            if let Some(slot) = counts
                .0
                .get_mut(position(phase.unwrap_or(VmPhase::Pending)))
            {
                *slot += 1;
            }
        }
        counts
    }
}

fn position(phase: VmPhase) -> usize {
    PHASES.iter().position(|p| *p == phase).unwrap_or_default()
}

pub(super) type PhaseSource = Box<dyn Fn() -> PhaseCounts + Send + Sync>;

/// Counts VMs per phase at scrape time from a source the controller installs (its reflector
/// store), so the gauge can never drift from the cache. Exports nothing until a source is set.
#[derive(Default)]
pub(super) struct PhaseCollector {
    source: RwLock<Option<PhaseSource>>,
}

impl std::fmt::Debug for PhaseCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseCollector").finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

impl PhaseCollector {
    pub(super) fn set_source(&self, source: PhaseSource) {
        // A poisoned lock only means an earlier source panicked while being replaced.
        let mut slot = self.source.write().unwrap_or_else(|e| e.into_inner());
        *slot = Some(source);
    }
}

impl Collector for PhaseCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = match self
            .source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(count) => count(),
            None => return Ok(()),
        };
        let gauge = ConstGauge::new(0_i64);
        let mut family = encoder.encode_descriptor(
            "vmop_virtual_machines",
            "Number of VirtualMachines per phase, as last observed by the operator",
            None,
            gauge.metric_type(),
        )?;
        for phase in PHASES {
            let labels = PhaseLabels {
                phase: phase.as_str(),
            };
            ConstGauge::new(counts.get(phase)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
