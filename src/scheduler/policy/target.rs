//! The expected workload: the popular task shapes and their frequencies, which
//! fragmentation-aware policies use to judge what free capacity is still useful.

use crate::model::{GpuDemand, Workload, GPU_MILLI};
use std::collections::HashMap;

/// One popular task shape.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetShape {
    /// CPU request, milli.
    pub cpu_milli: u64,
    /// Mean memory request of the shape's tasks, bytes.
    pub memory_bytes: u64,
    /// GPU share per GPU, milli (1000 for whole GPUs, 0 for CPU-only tasks).
    pub gpu_milli: u32,
    /// Number of GPUs.
    pub gpu_count: u32,
    /// GPU models the task accepts; empty = any.
    pub models: Vec<String>,
    /// Probability of the shape among the kept shapes (they sum to 1).
    pub weight: f64,
}

impl TargetShape {
    /// Whether a node with GPU model `model` can serve this shape.
    pub fn accepts_model(&self, model: Option<&str>) -> bool {
        if self.gpu_milli == 0 || self.models.is_empty() {
            return true;
        }
        model.is_some_and(|m| self.models.iter().any(|x| x == m))
    }
}

/// The distribution of future tasks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetWorkload {
    /// Kept shapes, most frequent first.
    pub shapes: Vec<TargetShape>,
}

/// Key of a shape while counting: (cpu, gpu milli, gpu count, models joined by `|`).
type ShapeKey = (u64, u32, u32, String);

impl TargetWorkload {
    /// The smallest set of the most frequent shapes that covers `coverage` (0..=1) of the
    /// workloads, re-weighted to sum to 1. Memory is not part of the shape (as in FGD); the
    /// memory kept is the mean of the shape's tasks. MIG and time-sliced demands do not compete
    /// for shareable GPUs and are left out.
    pub fn from_workloads(workloads: &[Workload], coverage: f64) -> Self {
        // Per shape: number of tasks and their summed memory.
        let mut counts: HashMap<ShapeKey, (u64, u128)> = HashMap::new();
        let mut total = 0u64;
        for w in workloads {
            let (gpu_milli, gpu_count) = match &w.gpu {
                GpuDemand::None => (0, 0),
                GpuDemand::Whole { count } => (GPU_MILLI, *count),
                GpuDemand::Fraction { count, milli, .. } => ((*milli).max(1), *count),
                GpuDemand::Mig { .. } | GpuDemand::Shared { .. } => continue,
            };
            let key = (w.requests.cpu_milli, gpu_milli, gpu_count, w.gpu_models.join("|"));
            let entry = counts.entry(key).or_default();
            entry.0 += 1;
            entry.1 += u128::from(w.requests.memory_bytes);
            total += 1;
        }
        let mut list: Vec<(ShapeKey, u64, u64)> =
            counts.into_iter().map(|(k, (n, memory))| (k, n, (memory / u128::from(n)) as u64)).collect();
        // Most frequent first; ties: larger CPU, GPU share, GPU count, model list first.
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let expected = coverage * total as f64;
        let mut kept = Vec::new();
        let mut cumulative = 0u64;
        for entry in list {
            if kept.is_empty() || (cumulative as f64) < expected {
                cumulative += entry.1;
                kept.push(entry);
            } else {
                break;
            }
        }
        let shapes = kept
            .into_iter()
            .map(|((cpu, milli, count, models), n, mem)| TargetShape {
                cpu_milli: cpu,
                memory_bytes: mem,
                gpu_milli: if count == 0 { 0 } else { milli },
                gpu_count: count,
                models: if models.is_empty() {
                    vec![]
                } else {
                    models.split('|').map(str::to_string).collect()
                },
                weight: n as f64 / cumulative.max(1) as f64,
            })
            .collect();
        Self { shapes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Resources;

    fn w(cpu: u64, gpu: GpuDemand) -> Workload {
        Workload { requests: Resources::new(cpu, 1024), gpu, ..Default::default() }
    }

    #[test]
    fn keeps_the_most_frequent_shapes_up_to_the_coverage() {
        let mut ws = vec![];
        ws.extend((0..60).map(|_| w(4000, GpuDemand::Whole { count: 1 })));
        ws.extend((0..30).map(|_| w(2000, GpuDemand::Fraction { count: 1, milli: 500, memory_mib: 0 })));
        ws.extend((0..10).map(|_| w(1000, GpuDemand::None)));
        let t = TargetWorkload::from_workloads(&ws, 0.9);
        assert_eq!(t.shapes.len(), 2);
        assert_eq!(t.shapes[0].gpu_milli, 1000);
        assert!((t.shapes[0].weight - 60.0 / 90.0).abs() < 1e-12);
        assert!((t.shapes.iter().map(|s| s.weight).sum::<f64>() - 1.0).abs() < 1e-12);
        let all = TargetWorkload::from_workloads(&ws, 1.0);
        assert_eq!(all.shapes.len(), 3);
        assert_eq!(all.shapes[2].gpu_count, 0);
    }

    #[test]
    fn a_shape_keeps_the_mean_memory_of_its_tasks() {
        let with_memory = |mib: u64| Workload {
            requests: Resources::new(4000, mib),
            gpu: GpuDemand::Whole { count: 1 },
            ..Default::default()
        };
        let ws = [with_memory(1024), with_memory(1024), with_memory(4096)];
        let t = TargetWorkload::from_workloads(&ws, 1.0);
        assert_eq!(t.shapes.len(), 1);
        assert_eq!(t.shapes[0].memory_bytes, 2048 << 20);
    }
}
