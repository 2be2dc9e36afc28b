//! The baseline policies of the FGD paper's simulator, with its integer score arithmetic.

use super::{best_fit_devices, ClusterScale, Policy, TieBreak};
use crate::model::{DeviceAssignment, GpuDemand, Node, Workload, GPU_MILLI};
use crate::scheduler::fit::Unfit;
use crate::scheduler::view::FreeView;

/// Total GPU request in milli-GPU of the demands the baselines understand.
fn gpu_request(demand: &GpuDemand) -> f64 {
    match demand {
        GpuDemand::Whole { count } => f64::from(*count * GPU_MILLI),
        GpuDemand::Fraction { count, milli, .. } => f64::from(*count * *milli),
        _ => 0.0,
    }
}

/// Every feasible node scores the same; the placer's uniform tie-break makes the choice random.
#[derive(Debug, Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }
    fn tie_break(&self) -> TieBreak {
        TieBreak::Uniform
    }
    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        Ok((0.0, best_fit_devices(node, workload)?))
    }
}

/// Least CPU and GPU left after placement, each normalised by the largest node.
#[derive(Debug)]
pub struct BestFit {
    /// Normalisation.
    pub scale: ClusterScale,
}

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }
    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        let devices = best_fit_devices(node, workload)?;
        let free = FreeView::of(node);
        let cpu_left = free.cpu_milli as f64 - workload.requests.cpu_milli as f64;
        let gpu_left = f64::from(free.gpu_free_total()) - gpu_request(&workload.gpu);
        let left = 0.5 * cpu_left / self.scale.max_cpu_milli + 0.5 * gpu_left / self.scale.max_gpu_milli;
        Ok((((1.0 - left) * 100.0).trunc(), devices))
    }
}

/// Smallest dot product between the request and the node's free (CPU, GPU) vector.
#[derive(Debug)]
pub struct DotProduct {
    /// Normalisation.
    pub scale: ClusterScale,
}

impl Policy for DotProduct {
    fn name(&self) -> &'static str {
        "dot-product"
    }
    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        let devices = best_fit_devices(node, workload)?;
        let free = FreeView::of(node);
        let (cpu, gpu) = (self.scale.max_cpu_milli, self.scale.max_gpu_milli);
        let dot = (free.cpu_milli as f64 / cpu) * (workload.requests.cpu_milli as f64 / cpu)
            + (f64::from(free.gpu_free_total()) / gpu) * (gpu_request(&workload.gpu) / gpu);
        Ok((((1.0 - dot / 2.0) * 100.0).trunc(), devices))
    }
}

/// Shared GPUs first, then partly used nodes, then empty nodes (GpuPacking).
#[derive(Debug, Default)]
pub struct GpuPacking;

impl Policy for GpuPacking {
    fn name(&self) -> &'static str {
        "gpu-packing"
    }
    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        let devices = best_fit_devices(node, workload)?;
        let (per_gpu, count) = match &workload.gpu {
            GpuDemand::Whole { count } => (GPU_MILLI, *count),
            GpuDemand::Fraction { count, milli, .. } => (*milli, *count),
            _ => return Ok((0.0, devices)),
        };
        let view = FreeView::of(node);
        let gpus = view.gpu_slice();
        let fully_free = gpus.iter().filter(|&&g| u32::from(g) == GPU_MILLI).count() as i64;
        if fully_free == gpus.len() as i64 {
            return Ok(((33 - fully_free).max(fully_free) as f64, devices));
        }
        // Walk GPUs from the fullest, taking those the request fits, as the device choice would.
        let mut sorted: Vec<u16> = gpus.to_vec();
        sorted.sort_unstable();
        let mut taken = 0;
        let mut free_used = 0i64;
        let mut left_of_used = 0i64;
        for g in sorted {
            if taken == count {
                break;
            }
            if u32::from(g) >= per_gpu {
                taken += 1;
                if u32::from(g) == GPU_MILLI {
                    free_used += 1;
                }
                left_of_used += i64::from(g) * 100 / i64::from(GPU_MILLI);
            }
        }
        let score = if free_used > 0 { (50 - free_used).max(33) } else { (100 - left_of_used / 10).max(50) };
        Ok((score as f64, devices))
    }
}
