//! The workload-inflation experiment of the FGD paper (ATC'23, §6): tasks arrive, never leave,
//! until their GPU demand reaches a multiple of the cluster's GPU capacity; the allocation curve
//! shows how much of the cluster a policy manages to use as it fills.

use crate::model::{Node, Workload, GPU_MILLI};
use crate::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};
use crate::scheduler::Placer;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Parameters of one run.
#[derive(Debug, Clone, Copy)]
pub struct InflationConfig {
    /// Policy under test.
    pub policy: PolicyKind,
    /// Arrived GPU demand at which arrivals stop, as a multiple of capacity (1.3 in the paper).
    pub inflate: f64,
    /// Seed of the arrival order, the resampling and the tie-breaks.
    pub seed: u64,
    /// Share of tasks covered by the expected-workload shapes (0.95 in the paper).
    pub coverage: f64,
}

impl Default for InflationConfig {
    fn default() -> Self {
        Self { policy: PolicyKind::Gpuscale, inflate: 1.3, seed: 42, coverage: 0.95 }
    }
}

/// One point of the allocation curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CurvePoint {
    /// Arrived GPU demand, % of capacity.
    pub arrived_pct: u32,
    /// Allocated GPU, % of capacity (mean over the arrivals in this 1% bin).
    pub allocated_pct: f64,
}

/// Outcome of one run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InflationResult {
    /// Policy name.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Tasks that arrived.
    pub arrivals: usize,
    /// Tasks that fit nowhere.
    pub failed: usize,
    /// GPU demand of the failed tasks, milli-GPU.
    pub failed_gpu_milli: u64,
    /// GPUs in the cluster.
    pub total_gpus: u64,
    /// Allocated GPU % when arrived demand reached 100% of capacity.
    pub allocated_pct_at_100: f64,
    /// Allocated GPU % at the end (arrived demand at the inflation target).
    pub allocated_pct_at_end: f64,
    /// Expected unusable free GPU (FGD's fragmentation), % of capacity, at the end.
    pub fragmentation_pct_at_end: f64,
    /// The allocation curve, one point per 1% of arrived demand.
    pub curve: Vec<CurvePoint>,
}

/// The arrival sequence: the trace's tasks in a seeded random order, then tasks drawn from the
/// trace with replacement until the GPU demand would exceed `inflate` times `capacity_milli`
/// (or, for a trace above the target, random tasks removed until it is below).
pub fn arrivals(
    trace: &[Workload],
    capacity_milli: u64,
    inflate: f64,
    rng: &mut ChaCha8Rng,
) -> Vec<Workload> {
    let demand = |w: &Workload| w.gpu.gpu_milli(0, None, 1);
    let target = inflate * capacity_milli as f64;
    let mut seq: Vec<Workload> = trace.to_vec();
    seq.sort_by(|a, b| a.id.cmp(&b.id));
    seq.shuffle(rng);
    let mut total: u64 = seq.iter().map(demand).sum();
    if trace.is_empty() {
        return seq;
    }
    if (total as f64) > target {
        while (total as f64) > target && !seq.is_empty() {
            let i = rng.random_range(0..seq.len());
            total -= demand(&seq.remove(i));
        }
        return seq;
    }
    let mut n = 0usize;
    loop {
        let mut w = trace[rng.random_range(0..trace.len())].clone();
        if (total + demand(&w)) as f64 > target {
            break;
        }
        total += demand(&w);
        n += 1;
        w.id = format!("{}-tuned-{n}", w.id);
        seq.push(w);
    }
    seq
}

/// Runs the experiment. `progress(done, total)` is called as arrivals are processed.
pub fn run(
    nodes: &[Node],
    trace: &[Workload],
    config: &InflationConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> InflationResult {
    let capacity: u64 = nodes.iter().map(Node::gpu_milli_capacity).sum();
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let sequence = arrivals(trace, capacity, config.inflate, &mut rng);
    let target = TargetWorkload::from_workloads(trace, config.coverage);
    let policy = config.policy.build(&ClusterScale::of(nodes), &target);
    let mut placer =
        Placer::new(nodes.to_vec(), policy.as_ref(), config.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));

    let mut arrived = 0u64;
    let mut allocated = 0u64;
    let mut failed = 0;
    let mut failed_gpu_milli = 0;
    // (sum of allocated %, events) per arrived-% bin.
    let max_bin = (config.inflate * 100.0).ceil() as usize + 1;
    let mut bins = vec![(0.0f64, 0u32); max_bin + 1];
    let total = sequence.len();
    for (i, w) in sequence.iter().enumerate() {
        let demand = w.gpu.gpu_milli(0, None, 1);
        arrived += demand;
        match placer.place(w) {
            Ok(_) => allocated += demand,
            Err(_) => {
                failed += 1;
                failed_gpu_milli += demand;
            }
        }
        let bin =
            round_half_even(arrived as f64 * 100.0 / capacity.max(1) as f64).min(max_bin as f64) as usize;
        bins[bin].0 += allocated as f64 * 100.0 / capacity.max(1) as f64;
        bins[bin].1 += 1;
        if i % 256 == 0 || i + 1 == total {
            progress(i + 1, total);
        }
    }
    let last_bin = round_half_even(arrived as f64 * 100.0 / capacity.max(1) as f64) as usize;
    let curve: Vec<CurvePoint> = (0..=last_bin.min(max_bin))
        .filter_map(|x| {
            let (sum, n) = bins[x];
            if n > 0 {
                return Some(CurvePoint { arrived_pct: x as u32, allocated_pct: sum / f64::from(n) });
            }
            // An empty bin (a large task jumped over it): neighbours' mean, as the paper does.
            let (s, c) = bins[x.saturating_sub(1)..=(x + 1).min(max_bin)]
                .iter()
                .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            (c > 0).then(|| CurvePoint { arrived_pct: x as u32, allocated_pct: s / f64::from(c) })
        })
        .collect();
    let at = |pct: u32| curve.iter().find(|p| p.arrived_pct == pct).map_or(f64::NAN, |p| p.allocated_pct);
    let frag = crate::scheduler::policy::Fragmentation::new(target);
    let fragmentation: f64 = placer
        .nodes()
        .iter()
        .map(|n| frag.of(n.gpu_model.as_deref(), &crate::scheduler::FreeView::of(n)))
        .sum();
    InflationResult {
        policy: config.policy.as_str().to_string(),
        seed: config.seed,
        arrivals: total,
        failed,
        failed_gpu_milli,
        total_gpus: capacity / u64::from(GPU_MILLI),
        allocated_pct_at_100: at(100),
        allocated_pct_at_end: at((config.inflate * 100.0).round() as u32),
        fragmentation_pct_at_end: fragmentation * 100.0 / capacity.max(1) as f64,
        curve,
    }
}

/// Python's `round`: halves go to the even neighbour.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_python() {
        assert_eq!(round_half_even(0.5), 0.0);
        assert_eq!(round_half_even(1.5), 2.0);
        assert_eq!(round_half_even(129.5), 130.0);
        assert_eq!(round_half_even(128.5), 128.0);
        assert_eq!(round_half_even(128.51), 129.0);
    }
}
