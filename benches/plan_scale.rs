//! Planning at production scale: 5,000 GPU nodes (~36,000 GPUs), 50,000 running pods and
//! 10,000 pending pods of mixed shapes (whole, multi-GPU, fractional, MIG, time-sliced, CPU).
//! The in-run baseline is the same plan with the `random` policy (no scoring work): the ratio
//! of the two is the cost of gpuscale's placement quality. A third case labels every pod and
//! gives 10% of them required anti-affinity or zone spread: its ratio to the plain `gpuscale`
//! case is the cost of kube-scheduler's cluster-wide filters. A fourth plans the plain cluster
//! again with the first plan's placements as hints, as a controller's next loop does: its ratio
//! to `gpuscale` is what the hints save.

use criterion::{criterion_group, criterion_main, Criterion};
use gpuscale::planner::{self, PlacementHints, PlanInput, PlannerSettings};
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
    // The same cluster with every pod labelled and 10% of them using required anti-affinity or
    // zone spread: the cost of the cluster-wide filters, against `gpuscale` on the plain one.
    let mut interpod = snapshot.clone();
    gpuscale::sim::synthetic::with_interpod(&mut interpod, 0.1, 1);
    let plain = PlanInput { snapshot, groups: groups.clone(), ..Default::default() };
    let interpod = PlanInput { snapshot: interpod, groups, ..Default::default() };
    let last = planner::plan(&plain, &PlannerSettings::default());
    let hinted = PlanInput { hints: PlacementHints::of(&last), ..plain.clone() };
    let mut group = c.benchmark_group("plan-5000-nodes-50k-running-10k-pending");
    group.sample_size(10);
    for (name, policy, input) in [
        ("random", PolicyKind::Random, &plain),
        ("gpuscale", PolicyKind::Gpuscale, &plain),
        ("gpuscale-interpod-10pct", PolicyKind::Gpuscale, &interpod),
        ("gpuscale-hinted", PolicyKind::Gpuscale, &hinted),
    ] {
        let settings = PlannerSettings { policy, ..Default::default() };
        let start = Instant::now();
        let plan = planner::plan(input, &settings);
        let secs = start.elapsed().as_secs_f64();
        let placed = plan.placements.len() + plan.scale_ups.iter().map(|s| s.pods.len()).sum::<usize>();
        eprintln!(
            "{name}: one plan in {secs:.3} s; {placed} pending pods placed ({:.0} pods/s); {} scale-ups, {} scale-downs",
            placed as f64 / secs,
            plan.scale_ups.len(),
            plan.scale_downs.len()
        );
        group.bench_function(name, |b| b.iter(|| planner::plan(input, &settings)));
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
