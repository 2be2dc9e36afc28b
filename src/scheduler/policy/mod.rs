//! Scoring policies: which feasible node (and which GPU inside it) is best for a workload.
//!
//! Each policy sees the node as it is and the workload, and returns an integer-or-real score
//! (higher is better) with the devices it would take. The baselines reproduce the policies of the
//! ATC'23 FGD paper's simulator (including their integer score truncation, which decides how
//! often the random tie-break is used); [`gpuscale::GpuscalePolicy`] is ours.

mod baseline;
mod fgd;
mod gpuscale;
mod target;

pub use baseline::{BestFit, DotProduct, GpuPacking, RandomPolicy};
pub use fgd::{Fgd, Fragmentation};
pub use gpuscale::GpuscalePolicy;
pub use target::{TargetShape, TargetWorkload};

use super::fit::{self, Unfit};
use crate::model::{DeviceAssignment, Node, Workload, GPU_MILLI};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// A placement policy.
pub trait Policy {
    /// Name as given on the command line.
    fn name(&self) -> &'static str;

    /// Score of the best device choice for `workload` on `node`, with that choice; `Err` when
    /// it does not fit. Must depend only on the node and the workload, so scores can be cached
    /// until the node changes.
    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit>;

    /// How to choose among nodes with the best score.
    fn tie_break(&self) -> TieBreak {
        TieBreak::NodeOrder
    }
}

/// Choice among equally scored nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieBreak {
    /// The first in a fixed (seeded) node order. Ties then consistently go to the same nodes, so
    /// equal-score choices fill nodes one after another instead of spreading over all of them;
    /// this is also what the FGD paper's simulator does in effect.
    NodeOrder,
    /// Uniformly at random.
    Uniform,
}

/// The policies `--policy` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// A uniformly random feasible node.
    Random,
    /// Least remaining CPU and GPU after placement (the paper's BestFit).
    BestFit,
    /// Prefer GPUs already shared, then partly used nodes, then empty ones (GpuPacking).
    GpuPacking,
    /// Smallest dot product of request and free vectors (DotProd).
    DotProduct,
    /// Fragmentation gradient descent (Weng et al., ATC'23).
    Fgd,
    /// gpuscale's default: fragmentation-aware with exact gradients, packing and lookahead.
    Gpuscale,
}

impl PolicyKind {
    /// All policies, in the order reports list them.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Random,
        PolicyKind::DotProduct,
        PolicyKind::GpuPacking,
        PolicyKind::BestFit,
        PolicyKind::Fgd,
        PolicyKind::Gpuscale,
    ];

    /// Command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::BestFit => "best-fit",
            PolicyKind::GpuPacking => "gpu-packing",
            PolicyKind::DotProduct => "dot-product",
            PolicyKind::Fgd => "fgd",
            PolicyKind::Gpuscale => "gpuscale",
        }
    }

    /// Builds the policy for a cluster and its expected workload (used by fragmentation-aware
    /// policies as the distribution of future tasks).
    pub fn build(self, scale: &ClusterScale, target: &TargetWorkload) -> Box<dyn Policy> {
        match self {
            PolicyKind::Random => Box::new(RandomPolicy),
            PolicyKind::BestFit => Box::new(BestFit { scale: *scale }),
            PolicyKind::GpuPacking => Box::new(GpuPacking),
            PolicyKind::DotProduct => Box::new(DotProduct { scale: *scale }),
            PolicyKind::Fgd => Box::new(Fgd::new(target.clone())),
            PolicyKind::Gpuscale => Box::new(GpuscalePolicy::new(target.clone())),
        }
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        let alias = match wanted.as_str() {
            "default" => "gpuscale",
            "bestfit" => "best-fit",
            "dotprod" | "dotproduct" => "dot-product",
            "gpupacking" | "packing" => "gpu-packing",
            other => other,
        };
        PolicyKind::ALL.into_iter().find(|p| p.as_str() == alias).ok_or_else(|| {
            let names: Vec<_> = PolicyKind::ALL.iter().map(|p| p.as_str()).collect();
            format!("unknown policy {s:?}; expected one of {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Normalisation constants: the largest node's CPU and GPU count (the paper's MaxSpecCpu and
/// MaxSpecGpu), so that scores compare nodes of different sizes on one scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClusterScale {
    /// Largest node CPU, milli.
    pub max_cpu_milli: f64,
    /// Largest node GPU capacity, milli-GPU.
    pub max_gpu_milli: f64,
}

impl ClusterScale {
    /// Scale of a set of nodes.
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        let (max_cpu, max_gpu) = nodes.into_iter().fold((1, u64::from(GPU_MILLI)), |(cpu, gpu), n| {
            (cpu.max(n.allocatable.cpu_milli), gpu.max(n.gpu_milli_capacity()))
        });
        Self { max_cpu_milli: max_cpu as f64, max_gpu_milli: max_gpu as f64 }
    }
}

/// Device choice shared by the baselines: for a single fractional share, the GPU with the least
/// free capacity that fits (lowest index on ties); otherwise the only candidate.
pub fn best_fit_devices(node: &Node, workload: &Workload) -> Result<DeviceAssignment, Unfit> {
    let candidates = fit::candidates(node, workload)?;
    let free_of = |a: &DeviceAssignment| match a {
        DeviceAssignment::Fraction { gpus, .. } => {
            gpus.first().map_or(0, |&g| node.gpus[g as usize].free_milli(None))
        }
        _ => 0,
    };
    let mut best: Option<(u32, DeviceAssignment)> = None;
    for c in candidates {
        let f = free_of(&c);
        if best.as_ref().is_none_or(|(bf, _)| f < *bf) {
            best = Some((f, c));
        }
    }
    best.map(|(_, c)| c).ok_or(Unfit::InsufficientGpu)
}
