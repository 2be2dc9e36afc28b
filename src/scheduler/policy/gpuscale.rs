//! gpuscale's default placement policy.

use super::fgd::{best_by_frag_delta, Fragmentation};
use super::target::TargetWorkload;
use super::Policy;
use crate::model::{DeviceAssignment, Node, Workload};
use crate::scheduler::fit::Unfit;

/// Fragmentation-aware placement with exact (untruncated) gradients.
#[derive(Debug)]
pub struct GpuscalePolicy {
    frag: Fragmentation,
}

impl GpuscalePolicy {
    /// The policy for an expected workload.
    pub fn new(target: TargetWorkload) -> Self {
        Self {
            frag: Fragmentation::new(target),
        }
    }
}

impl Policy for GpuscalePolicy {
    fn name(&self) -> &'static str {
        "gpuscale"
    }

    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        best_by_frag_delta(&self.frag, node, workload, |delta, _, _| -delta)
    }
}
