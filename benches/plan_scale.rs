//! Planning at production scale: 5,000 GPU nodes (~36,000 GPUs), 50,000 running pods and
//! 10,000 pending pods of mixed shapes (whole, multi-GPU, fractional, MIG, time-sliced, CPU).
//! The in-run baseline is the same plan with the `random` policy (no scoring work): the ratio
//! of the two is the cost of gpuscale's placement quality.

use criterion::{criterion_group, criterion_main, Criterion};
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use gpuscale::scheduler::PolicyKind;
use std::time::Instant;

fn bench(c: &mut Criterion) {
    let (snapshot, groups) = gpuscale::sim::synthetic::cluster(5000, 50_000, 10_000, 1);
    let gpus: usize = snapshot.nodes.iter().map(|n| n.gpus.len()).sum();
    eprintln!(
        "synthetic cluster: {} nodes, {gpus} GPUs, {} pods",
        snapshot.nodes.len(),
        snapshot.workloads.len()
    );
    let input = PlanInput { snapshot, groups, ..Default::default() };
    let mut group = c.benchmark_group("plan-5000-nodes-50k-running-10k-pending");
    group.sample_size(10);
    for policy in [PolicyKind::Random, PolicyKind::Gpuscale] {
        let settings = PlannerSettings { policy, ..Default::default() };
        let start = Instant::now();
        let plan = planner::plan(&input, &settings);
        let secs = start.elapsed().as_secs_f64();
        let placed = plan.placements.len() + plan.scale_ups.iter().map(|s| s.pods.len()).sum::<usize>();
        eprintln!(
            "{policy}: one plan in {secs:.3} s; {placed} pending pods placed ({:.0} pods/s); {} scale-ups, {} scale-downs",
            placed as f64 / secs,
            plan.scale_ups.len(),
            plan.scale_downs.len()
        );
        group.bench_function(policy.as_str(), |b| b.iter(|| planner::plan(&input, &settings)));
    }
    group.finish();
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024);
    eprintln!("peak RSS of the benchmark process: {peak} MiB");
}

criterion_group!(benches, bench);
criterion_main!(benches);
