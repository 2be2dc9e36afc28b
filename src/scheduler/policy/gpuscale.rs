//! gpuscale's default placement policy.
//!
//! It starts from FGD's measure (expected GPU capacity a future task cannot use) and fixes three
//! blind spots of it:
//! - FGD looks one task ahead: room that fits the next task counts as fully useful, although the
//!   tasks that fill it leave their own remainder (0.19 of a GPU after a 0.81 task, usable by few
//!   shapes). We count each GPU's expected eventual residue instead
//!   ([`Fragmentation::eventual`]), so placements that leave fillable remainders win. A
//!   fractional task that fits none of a node's GPUs is judged by these residues too: FGD counts
//!   all the node's free GPU lost to it, which keeps whole GPUs for 0.81 tasks that leave 0.19.
//! - FGD sees CPU only through the next task, and memory not at all: a node whose free CPU still
//!   fits one more task counts all its free GPUs as usable, even when its CPU or memory supports
//!   only a fraction of them. We add the GPU capacity that the node's free CPU and memory cannot
//!   feed at the expected workload's CPU and memory per GPU, whichever runs out first ("fluid"
//!   stranding), so CPU- and memory-heavy work, GPU or not, flows to the nodes rich in what it
//!   needs before it starves GPU-dense ones.
//! - FGD's integer score makes most choices ties broken by node order; with exact gradients the
//!   ties vanish and nothing keeps empty nodes empty. We charge a small cost for opening an empty
//!   node of a node group (1% of its GPU capacity), which packs work onto nodes already in use; an
//!   autoscaler can then remove the nodes left empty. A node outside any group (a static pool)
//!   cannot be given back, so there the cost only breaks ties: paying more would trade packing
//!   for nothing.

use super::fgd::{best_by_frag_delta, Fragmentation};
use super::target::TargetWorkload;
use super::Policy;
use crate::model::{DeviceAssignment, Node, Workload};
use crate::scheduler::fit::Unfit;
use crate::scheduler::view::FreeView;

/// Share of a node's GPU capacity charged for opening an empty node of a node group.
const OPEN_NODE_COST: f64 = 0.01;
/// Share charged for opening an empty node outside any group: a tie-break, so that empty
/// nodes stay whole for multi-GPU tasks when nothing else tells the candidates apart.
const OPEN_STATIC_NODE_COST: f64 = 1e-5;

/// Fragmentation-aware placement with exact gradients, CPU- and memory-aware stranding and
/// consolidation.
#[derive(Debug)]
pub struct GpuscalePolicy {
    frag: Fragmentation,
    /// Expected CPU (milli) per milli-GPU of the GPU tasks in the expected workload.
    cpu_per_gpu_milli: f64,
    /// Expected memory (bytes) per milli-GPU of the same tasks.
    memory_per_gpu_milli: f64,
}

impl GpuscalePolicy {
    /// The policy for an expected workload.
    pub fn new(target: TargetWorkload) -> Self {
        let gpu_shapes = || target.shapes.iter().filter(|s| s.gpu_milli > 0);
        let cpu: f64 = gpu_shapes().map(|s| s.weight * s.cpu_milli as f64).sum();
        let gpu: f64 = gpu_shapes().map(|s| s.weight * f64::from(s.gpu_milli * s.gpu_count)).sum();
        let memory: f64 = gpu_shapes().map(|s| s.weight * s.memory_bytes as f64).sum();
        let per_gpu = |x: f64| if gpu > 0.0 { x / gpu } else { 0.0 };
        Self {
            frag: Fragmentation::eventual(target),
            cpu_per_gpu_milli: per_gpu(cpu),
            memory_per_gpu_milli: per_gpu(memory),
        }
    }

    /// Free GPU capacity (milli) that the node's free CPU and memory cannot feed at the expected
    /// ratios: the scarcer of the two decides how much of it future GPU work can use.
    fn stranded(&self, view: &FreeView) -> f64 {
        let gpu_fed_by =
            |free: u64, per_gpu: f64| if per_gpu > 0.0 { free as f64 / per_gpu } else { f64::INFINITY };
        let fed = gpu_fed_by(view.cpu_milli, self.cpu_per_gpu_milli)
            .min(gpu_fed_by(view.memory_bytes, self.memory_per_gpu_milli));
        (f64::from(view.gpu_free_total()) - fed).max(0.0)
    }
}

impl Policy for GpuscalePolicy {
    fn name(&self) -> &'static str {
        "gpuscale"
    }

    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        let is_empty = node.allocated.cpu_milli == 0 && node.gpus.iter().all(|g| g.is_idle());
        let share = match (is_empty, node.node_group.is_some()) {
            (false, _) => 0.0,
            (true, true) => OPEN_NODE_COST,
            (true, false) => OPEN_STATIC_NODE_COST,
        };
        let opening_cost = share * node.gpu_milli_capacity() as f64;
        best_by_frag_delta(&self.frag, node, workload, |frag_delta, before, after| {
            -(frag_delta + self.stranded(after) - self.stranded(before) + opening_cost) / 1000.0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDemand, GpuDevice, Resources};
    use crate::scheduler::policy::TargetShape;

    fn gpu_node(name: &str, cpu: u64, gpus: usize) -> Node {
        Node {
            name: name.into(),
            allocatable: Resources::new(cpu, 1 << 20),
            gpu_model: Some("T4".into()),
            gpus: (0..gpus).map(|i| GpuDevice::standard(i as u8, 16384)).collect(),
            ..Default::default()
        }
    }

    /// Expected work: 1-GPU tasks with 12 cores each.
    fn policy_target() -> TargetWorkload {
        TargetWorkload {
            shapes: vec![TargetShape {
                cpu_milli: 12_000,
                memory_bytes: 0,
                gpu_milli: 1000,
                gpu_count: 1,
                models: vec![],
                weight: 1.0,
            }],
        }
    }

    fn policy() -> GpuscalePolicy {
        GpuscalePolicy::new(policy_target())
    }

    #[test]
    fn cpu_only_work_goes_where_cpu_is_plentiful() {
        let p = policy();
        // 8 GPUs with 96 cores is exactly 12 cores per GPU; 2 GPUs with 104 cores has spare CPU.
        let dense = gpu_node("dense", 96_000, 8);
        let rich = gpu_node("rich", 104_000, 2);
        let cpu_task = Workload { requests: Resources::new(16_000, 1), ..Default::default() };
        let (on_dense, _) = p.evaluate(&dense, &cpu_task).unwrap();
        let (on_rich, _) = p.evaluate(&rich, &cpu_task).unwrap();
        assert!(on_rich > on_dense, "rich {on_rich} dense {on_dense}");
    }

    /// Expected work: 1-GPU tasks with 12 cores and 64 GiB each.
    fn memory_policy() -> GpuscalePolicy {
        let mut target = policy_target();
        target.shapes[0].memory_bytes = 64 << 30;
        GpuscalePolicy::new(target)
    }

    fn node_with_memory(name: &str, cpu: u64, memory_gib: u64, gpus: usize) -> Node {
        Node { allocatable: Resources::new(cpu, memory_gib << 10), ..gpu_node(name, cpu, gpus) }
    }

    #[test]
    fn the_scarcer_of_cpu_and_memory_strands_gpus() {
        let p = memory_policy();
        let view = |cpu_gpus: u64, memory_gpus: u64| {
            FreeView::of(&node_with_memory("n", cpu_gpus * 12_000, memory_gpus * 64, 8))
        };
        // CPU for 6 of the 8 GPUs, memory for 4: memory decides.
        assert!((p.stranded(&view(6, 4)) - 4000.0).abs() < 1e-6);
        // Memory for 7, CPU for 6: CPU decides.
        assert!((p.stranded(&view(6, 7)) - 2000.0).abs() < 1e-6);
        assert_eq!(p.stranded(&view(9, 9)), 0.0);
        // Without memory in the expected work, memory strands nothing.
        assert!((policy().stranded(&view(6, 1)) - 2000.0).abs() < 1e-6);
    }

    #[test]
    fn memory_heavy_work_goes_where_memory_is_plentiful() {
        let p = memory_policy();
        // Both nodes have CPU to spare; 512 GiB is exactly what 8 expected tasks need.
        let lean = node_with_memory("lean", 200_000, 512, 8);
        let roomy = node_with_memory("roomy", 200_000, 1024, 8);
        let task = Workload { requests: Resources::new(1000, 100 << 10), ..Default::default() };
        let (on_lean, _) = p.evaluate(&lean, &task).unwrap();
        let (on_roomy, _) = p.evaluate(&roomy, &task).unwrap();
        assert!(on_roomy > on_lean, "roomy {on_roomy} lean {on_lean}");
    }

    fn one_gpu_task() -> Workload {
        Workload {
            requests: Resources::new(12_000, 1),
            gpu: GpuDemand::Whole { count: 1 },
            ..Default::default()
        }
    }

    #[test]
    fn prefers_a_node_in_use_over_an_empty_one() {
        let p = policy();
        let empty = Node { node_group: Some("gpu".into()), ..gpu_node("empty", 96_000, 8) };
        let mut used = Node { node_group: Some("gpu".into()), ..gpu_node("used", 96_000, 8) };
        used.allocate(&Resources::new(12_000, 1), &DeviceAssignment::Whole { gpus: vec![0] });
        let task = one_gpu_task();
        assert!(p.evaluate(&used, &task).unwrap().0 > p.evaluate(&empty, &task).unwrap().0);
    }

    #[test]
    fn opening_a_node_costs_more_where_it_could_be_given_back() {
        let p = policy();
        let task = one_gpu_task();
        let static_node = gpu_node("static", 96_000, 8);
        let grouped = Node { node_group: Some("gpu".into()), ..static_node.clone() };
        let (on_static, _) = p.evaluate(&static_node, &task).unwrap();
        let (on_grouped, _) = p.evaluate(&grouped, &task).unwrap();
        let expected = (OPEN_NODE_COST - OPEN_STATIC_NODE_COST) * 8.0;
        assert!((on_static - on_grouped - expected).abs() < 1e-9, "{on_static} - {on_grouped}");
        // In a static pool the cost only breaks ties: a used node that looks exactly like the empty
        // one (a ninth GPU taken with its CPU) still wins.
        let mut used = gpu_node("used", 108_000, 9);
        used.allocate(&Resources::new(12_000, 1), &DeviceAssignment::Whole { gpus: vec![8] });
        let (on_used, _) = p.evaluate(&used, &task).unwrap();
        assert!(on_used > on_static, "used {on_used} empty {on_static}");
        assert!(on_used - on_static < 1e-3, "used {on_used} empty {on_static}");
    }
}
