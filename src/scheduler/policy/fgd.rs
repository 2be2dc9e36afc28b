//! Fragmentation gradient descent (Weng et al., "Beware of Fragmentation", USENIX ATC'23).
//!
//! A node's fragmentation, for the expected workload, is the GPU capacity a random task could not
//! use there: all free GPU capacity when the task cannot run on the node at all (too little CPU,
//! too few GPUs with enough room, wrong model, or a CPU-only task), otherwise the free capacity of
//! the GPUs too small for the task's share. FGD places each task where fragmentation grows least.

use super::target::TargetWorkload;
use super::Policy;
use crate::model::{DeviceAssignment, Node, Workload, GPU_MILLI};
use crate::scheduler::fit::{self, Unfit};
use crate::scheduler::view::{FreeView, MAX_GPUS};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::rc::Rc;

/// How many future GPU-sharing tasks a GPU's free room waits for ([`Fragmentation::eventual`]):
/// it ends up holding the task best for it among them, or stays free if none fits. Room that one
/// sharing task in a few fits is then as good as taken, by the task that fits it best; room that
/// only a rare shape fits (0.19 GPU next to a 0.81 task, with 2% of sharing tasks small enough) is
/// filled about half the time. The count is in sharing tasks because only they take partly used
/// room, and each of them also opens or narrows room: the sharing tasks per gap stay about the
/// same whatever share of the workload shares GPUs. Counted in all GPU tasks, a gap would wait
/// for twice as many sharing tasks where half the GPU tasks share as where a quarter do, and
/// mid-size gaps would look fillable though they compete for the same few tasks (competition
/// this count does not model). One chance calls half-GPU room mostly lost and packs too tightly;
/// unbounded chances call every remainder fillable and stop steering the rare small tasks to it.
/// On the openb trace 24 to 30 are best.
const SHARING_FILL_CHANCES: f64 = 27.0;

/// Fragmentation of nodes for one expected workload, memoised by node state.
#[derive(Debug)]
pub struct Fragmentation {
    target: TargetWorkload,
    /// Distinct CPU requests of the shapes, ascending: a node's free CPU matters only through how
    /// many of them it covers.
    cpu_steps: Vec<u64>,
    models: RefCell<Vec<Option<String>>>,
    memo: RefCell<FxHashMap<FragKey, f64>>,
    /// Whether usable GPUs count their expected eventual residue (see [`Fragmentation::eventual`]).
    eventual: bool,
    /// Per model index: expected eventual residue of one GPU by free milli.
    residues: RefCell<Vec<Option<Rc<[f64]>>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FragKey {
    model: u16,
    cpu_step: u16,
    gpu_count: u8,
    gpus: [u16; MAX_GPUS],
}

impl Fragmentation {
    /// Fragmentation measure for an expected workload.
    pub fn new(target: TargetWorkload) -> Self {
        let mut cpu_steps: Vec<u64> = target.shapes.iter().map(|s| s.cpu_milli).collect();
        cpu_steps.sort_unstable();
        cpu_steps.dedup();
        Self {
            target,
            cpu_steps,
            models: RefCell::new(Vec::new()),
            memo: RefCell::new(FxHashMap::default()),
            eventual: false,
            residues: RefCell::new(Vec::new()),
        }
    }

    /// Multi-step variant: the free room of a usable GPU is not all useful, since the tasks
    /// that will fill it leave a residue. Each GPU counts the expected free milli left at the
    /// end: its room is taken by the task that leaves the least among the next tasks drawn from
    /// the workload (as many as hold [`SHARING_FILL_CHANCES`] (27) GPU-sharing tasks on average),
    /// and stays free if none fits; what that task leaves is judged the same way. A one-GPU
    /// fractional shape that no GPU of the node fits is judged by these residues too, not charged
    /// all free GPU as in the paper's measure.
    pub fn eventual(target: TargetWorkload) -> Self {
        Self { eventual: true, ..Self::new(target) }
    }

    /// Expected residue table of one GPU of `model` (index `mi`): `r[f]` for free milli `f`.
    fn residue_table(&self, mi: u16, model: Option<&str>) -> Rc<[f64]> {
        let mut tables = self.residues.borrow_mut();
        if tables.len() <= mi as usize {
            tables.resize(mi as usize + 1, None);
        }
        if let Some(t) = &tables[mi as usize] {
            return t.clone();
        }
        let shapes: Vec<(u32, f64)> = self
            .target
            .shapes
            .iter()
            .filter(|s| s.gpu_milli > 0 && s.accepts_model(model))
            .map(|s| (s.gpu_milli.min(GPU_MILLI), s.weight))
            .collect();
        let total: f64 = shapes.iter().map(|s| s.1).sum();
        let sharing: f64 = shapes.iter().filter(|s| s.0 < GPU_MILLI).map(|s| s.1).sum();
        // Tasks drawn: enough to hold the sharing tasks the room waits for.
        let chances =
            if sharing > 0.0 { SHARING_FILL_CHANCES * total / sharing } else { SHARING_FILL_CHANCES };
        let n = GPU_MILLI as usize + 1;
        let mut r = vec![0.0; n];
        for f in 1..n {
            // The shapes that fit, by what they leave, best first, with their probabilities.
            let mut fitting: Vec<(f64, f64)> = shapes
                .iter()
                .filter(|s| s.0 as usize <= f)
                .map(|&(m, w)| (r[f - m as usize], w / total))
                .collect();
            fitting.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The best of the next tasks is shape i when none is better and not all are worse.
            // `p_none_better`: probability that none of the next tasks beats the current shape.
            let (mut none_better, mut p_none_better) = (1.0f64, 1.0f64);
            let mut expected = 0.0;
            for (left, p) in fitting {
                none_better = (none_better - p).max(0.0);
                let p_none_this_or_better = none_better.powf(chances);
                expected += left * (p_none_better - p_none_this_or_better);
                p_none_better = p_none_this_or_better;
            }
            // With the last shape counted, `p_none_better` is the chance that none fits.
            r[f] = expected + p_none_better * f as f64;
        }
        let t: Rc<[f64]> = Rc::from(r);
        tables[mi as usize] = Some(t.clone());
        t
    }

    /// The expected workload.
    pub fn target(&self) -> &TargetWorkload {
        &self.target
    }

    fn model_index(&self, model: Option<&str>) -> u16 {
        let mut models = self.models.borrow_mut();
        if let Some(i) = models.iter().position(|m| m.as_deref() == model) {
            return i as u16;
        }
        models.push(model.map(str::to_string));
        (models.len() - 1) as u16
    }

    /// Expected unusable free GPU capacity of a node state, in milli-GPU.
    pub fn of(&self, model: Option<&str>, view: &FreeView) -> f64 {
        let mut gpus = view.gpus;
        gpus[..view.gpu_count as usize].sort_unstable();
        // Free CPU matters only through which shape requests it covers.
        let cpu_step = self.cpu_steps.partition_point(|&c| c <= view.cpu_milli) as u16;
        let key = FragKey { model: self.model_index(model), cpu_step, gpu_count: view.gpu_count, gpus };
        if let Some(&f) = self.memo.borrow().get(&key) {
            return f;
        }
        let residue = self.eventual.then(|| self.residue_table(key.model, model));
        let f = self.compute(model, view.cpu_milli, &gpus[..view.gpu_count as usize], residue.as_deref());
        self.memo.borrow_mut().insert(key, f);
        f
    }

    /// `residue`: per-GPU expected eventual residue by free milli ([`Fragmentation::eventual`]);
    /// without it, a usable shape loses only the GPUs too small for it (the paper's measure).
    fn compute(&self, model: Option<&str>, cpu_free: u64, gpus: &[u16], residue: Option<&[f64]>) -> f64 {
        let idle: u32 = gpus.iter().map(|&g| u32::from(g)).sum();
        if idle == 0 {
            return 0.0;
        }
        let eventual: Option<f64> =
            residue.map(|r| gpus.iter().map(|&g| r[usize::from(g).min(r.len() - 1)]).sum());
        let mut frag = 0.0;
        for shape in &self.target.shapes {
            // With residues, a one-GPU fractional shape that no GPU here fits is judged by them
            // anyway: they already count the room no task will fill, and charging all free GPU
            // for it keeps whole GPUs for fractional tasks (0.81 ones mostly, which then leave
            // 0.19 each). Only an idle GPU serves a whole-GPU task, so that charge stays.
            let served_by_residues =
                eventual.is_some() && shape.gpu_count == 1 && shape.gpu_milli < GPU_MILLI;
            let usable = shape.gpu_milli > 0
                && shape.accepts_model(model)
                && cpu_free >= shape.cpu_milli
                && (served_by_residues
                    || gpus.iter().filter(|&&g| u32::from(g) >= shape.gpu_milli).count()
                        >= shape.gpu_count as usize);
            let lost = match (usable, eventual) {
                (false, _) => f64::from(idle),
                (true, Some(e)) => e,
                (true, None) => f64::from(
                    gpus.iter().map(|&g| u32::from(g)).filter(|&g| g < shape.gpu_milli).sum::<u32>(),
                ),
            };
            frag += shape.weight * lost;
        }
        frag
    }
}

/// The FGD policy with the reference simulator's integer score: `⌊100·σ(−Δfrag/1000)⌋`.
#[derive(Debug)]
pub struct Fgd {
    frag: Fragmentation,
}

impl Fgd {
    /// FGD for an expected workload.
    pub fn new(target: TargetWorkload) -> Self {
        Self { frag: Fragmentation::new(target) }
    }
}

/// Scores every candidate with `score(Δfrag, view before, view after)` and keeps the first best;
/// shared by FGD and the gpuscale policy.
pub(crate) fn best_by_frag_delta(
    frag: &Fragmentation,
    node: &Node,
    workload: &Workload,
    mut score: impl FnMut(f64, &FreeView, &FreeView) -> f64,
) -> Result<(f64, DeviceAssignment), Unfit> {
    let candidates = fit::candidates(node, workload)?;
    let model = node.gpu_model.as_deref();
    let before_view = FreeView::of(node);
    let before = frag.of(model, &before_view);
    let mut best: Option<(f64, DeviceAssignment)> = None;
    for c in candidates {
        let after_view = before_view.with(node, workload, &c);
        let after = frag.of(model, &after_view);
        let s = score(after - before, &before_view, &after_view);
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, c));
        }
    }
    best.ok_or(Unfit::InsufficientGpu)
}

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn evaluate(&self, node: &Node, workload: &Workload) -> Result<(f64, DeviceAssignment), Unfit> {
        best_by_frag_delta(&self.frag, node, workload, |delta, _, _| {
            let sigmoid = 1.0 / (1.0 + (delta / 1000.0).exp());
            (sigmoid * 100.0).trunc()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDemand, GpuDevice, Resources};
    use crate::scheduler::policy::TargetShape;

    fn shape(cpu: u64, milli: u32, count: u32, weight: f64) -> TargetShape {
        TargetShape {
            cpu_milli: cpu,
            memory_bytes: 0,
            gpu_milli: milli,
            gpu_count: count,
            models: vec![],
            weight,
        }
    }

    fn node(gpus_used: &[u32], cpu: u64) -> Node {
        let mut n = Node {
            name: "n".into(),
            allocatable: Resources::new(cpu, 1 << 20),
            gpu_model: Some("T4".into()),
            gpus: (0..gpus_used.len()).map(|i| GpuDevice::standard(i as u8, 16384)).collect(),
            ..Default::default()
        };
        for (d, &u) in n.gpus.iter_mut().zip(gpus_used) {
            d.used_milli = u;
        }
        n
    }

    #[test]
    fn fragmentation_counts_gpu_room_too_small_for_the_shape() {
        let f = Fragmentation::new(TargetWorkload { shapes: vec![shape(1000, 500, 1, 1.0)] });
        // GPU 0 has 300 free (too small for 500), GPU 1 is full, GPU 2 has 1000 free.
        let n = node(&[700, 1000, 0], 8000);
        assert_eq!(f.of(Some("T4"), &FreeView::of(&n)), 300.0);
        // Without enough CPU for the shape, all free GPU is lost.
        let starved = FreeView { cpu_milli: 500, ..FreeView::of(&n) };
        assert_eq!(f.of(Some("T4"), &starved), 1300.0);
    }

    #[test]
    fn eventual_residue_follows_the_tasks_that_fill_the_gpu() {
        // Tasks of 0.8 GPU, and rare 0.2 ones (2%).
        let target = TargetWorkload { shapes: vec![shape(1000, 800, 1, 0.98), shape(1000, 200, 1, 0.02)] };
        let f = Fragmentation::eventual(target.clone());
        let r = f.residue_table(0, Some("T4"));
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} != {b}");
        // 0.1 free: nothing fits, all lost.
        assert_eq!(r[100], 100.0);
        // 0.2 free: only the rare task fits; it comes within the next tasks about 42% of the time.
        let p_small = 1.0 - 0.98f64.powf(SHARING_FILL_CHANCES);
        assert!(p_small > 0.4 && p_small < 0.45);
        close(r[200], (1.0 - p_small) * 200.0);
        // 0.3 free: a 0.2 task (if one comes) leaves 0.1 for good.
        close(r[300], p_small * 100.0 + (1.0 - p_small) * 300.0);
        // 0.8 free waits for a 0.8 task, which comes for sure.
        assert!(r[800] < 1e-6, "{}", r[800]);
        // A whole GPU is best off with a 0.2 task and then a 0.8 one; without a 0.2 task among
        // the next ones, a 0.8 task leaves 0.2, which ends as above.
        close(r[1000], p_small * r[800] + (1.0 - p_small) * r[200]);
        // On a node where both shapes are usable, each GPU counts its residue, where the paper's
        // measure sees only the 0.5 GPU that the 0.8 shape cannot use.
        let n = node(&[500, 0], 8000);
        close(f.of(Some("T4"), &FreeView::of(&n)), r[500] + r[1000]);
        close(Fragmentation::new(target).of(Some("T4"), &FreeView::of(&n)), 0.98 * 500.0);
    }

    #[test]
    fn partly_used_room_waits_for_the_same_sharing_tasks_whatever_the_whole_gpu_share() {
        let sharing = [shape(1000, 800, 1, 0.98), shape(1000, 200, 1, 0.02)];
        let with_whole = |whole: f64| {
            let mut shapes: Vec<TargetShape> = sharing
                .iter()
                .map(|s| TargetShape { weight: s.weight * (1.0 - whole), ..s.clone() })
                .collect();
            shapes.push(shape(1000, 1000, 1, whole));
            Fragmentation::eventual(TargetWorkload { shapes }).residue_table(0, Some("T4"))
        };
        let alone =
            Fragmentation::eventual(TargetWorkload { shapes: sharing.to_vec() }).residue_table(0, Some("T4"));
        for whole in [0.5, 0.9] {
            let r = with_whole(whole);
            // Room a 0.8 task fits is as good as filled either way.
            assert!(r[800] < 1e-6 && alone[800] < 1e-6);
            // The 0.2 room's chance of a 0.2 task stays within a percent (a fixed count of sharing
            // tasks versus their binomial count among all tasks), where a fixed count of all
            // tasks would halve it at a 50% whole-GPU share.
            for f in [200, 300] {
                assert!(
                    (r[f] - alone[f]).abs() < 0.01 * alone[f],
                    "{whole}: r[{f}] {} vs {}",
                    r[f],
                    alone[f]
                );
            }
        }
    }

    #[test]
    fn with_residues_only_whole_gpu_tasks_count_a_node_without_a_gpu_for_them_lost() {
        // 0.8-GPU and whole-GPU tasks, and 0.3-GPU ones that fill remainders.
        let target = TargetWorkload {
            shapes: vec![shape(1000, 800, 1, 0.4), shape(1000, 1000, 1, 0.4), shape(1000, 300, 1, 0.2)],
        };
        let f = Fragmentation::eventual(target.clone());
        let r = f.residue_table(0, Some("T4"));
        // 0.7 and 0.3 free: no GPU fits a 0.8 or a whole task.
        let view = FreeView::of(&node(&[300, 700], 8000));
        let residues = r[700] + r[300];
        assert!(residues < 200.0, "{residues}");
        // The whole-GPU task loses the node's 1.0 free GPU; the 0.8 one is judged by the
        // residues, as the 0.3 one is, instead of losing all the free GPU too.
        let frag = f.of(Some("T4"), &view);
        assert!((frag - (0.4 * 1000.0 + 0.6 * residues)).abs() < 1e-9, "{frag}");
        // The paper's measure counts the free GPU lost to both large shapes.
        assert_eq!(Fragmentation::new(target).of(Some("T4"), &view), 800.0);
    }

    #[test]
    fn free_room_waits_for_the_task_that_fills_it_best() {
        // Half-GPU and 0.3-GPU tasks, equally likely: half a GPU is taken by a 0.5 task (nothing
        // left), not by a 0.3 task that would leave 0.2 nobody can use.
        let two = TargetWorkload { shapes: vec![shape(1000, 500, 1, 0.5), shape(1000, 300, 1, 0.5)] };
        let r = Fragmentation::eventual(two).residue_table(0, Some("T4"));
        assert_eq!(r[200], 200.0);
        // Room is left only when none of the 27 next tasks is a 0.5 one (2^-27): then a 0.3 task
        // leaves 0.2, so 200 * 2^-27 = 1.5e-6 milli-GPU.
        assert!(r[500] < 1e-5, "{}", r[500]);
        // 0.3 free waits for a 0.3 task (missing with the same 2^-27: 300 * 2^-27 = 2.2e-6).
        assert!(r[300] < 1e-5, "{}", r[300]);
    }

    #[test]
    fn fgd_prefers_the_gpu_that_leaves_usable_room() {
        // Half-GPU tasks expected. Placing a 0.5 share on the half-used GPU leaves nothing lost;
        // placing it on the free GPU would leave 0.5 free there, still usable, but the other
        // GPU's 0.5 stays too. Both are frag-neutral; a 0.6 share shows the difference.
        let f = Fgd::new(TargetWorkload { shapes: vec![shape(1000, 500, 1, 1.0)] });
        let n = node(&[400, 0], 8000);
        let w = Workload {
            requests: Resources::new(1000, 1),
            gpu: GpuDemand::Fraction { count: 1, milli: 600, memory_mib: 0 },
            ..Default::default()
        };
        let (_, devices) = f.evaluate(&n, &w).unwrap();
        // On GPU 0 (600 free) it fills the GPU exactly; on GPU 1 it would leave 400 (< 500, lost).
        assert_eq!(devices, DeviceAssignment::Fraction { gpus: vec![0], milli: 600, memory_mib: 0 });
    }
}
