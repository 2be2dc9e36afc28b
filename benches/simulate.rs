//! One seed of the FGD paper's workload-inflation experiment on the openb `default` trace
//! (~10k arrivals on 1213 nodes), per policy. BestFit, the cheapest scoring policy, is the
//! in-run baseline: compare the other policies' times to it.

use criterion::{criterion_group, criterion_main, Criterion};
use gpuscale::scheduler::PolicyKind;
use gpuscale::sim::inflation::{self, InflationConfig};
use std::path::PathBuf;

fn bench(c: &mut Criterion) {
    let dir = std::env::var_os("OPENB_TRACE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/openb"));
    let nodes =
        gpuscale::trace::openb::read_nodes(&dir.join("openb_node_list_gpu_node.csv")).expect("openb nodes");
    let trace: Vec<_> = gpuscale::trace::openb::read_pods(&dir.join("openb_pod_list_default.csv"))
        .expect("openb pods")
        .into_iter()
        .map(|p| p.workload)
        .collect();
    let mut group = c.benchmark_group("openb-default-inflation-one-seed");
    group.sample_size(10);
    for policy in [PolicyKind::BestFit, PolicyKind::Fgd, PolicyKind::Gpuscale] {
        group.bench_function(policy.as_str(), |b| {
            b.iter(|| {
                let config = InflationConfig { policy, seed: 42, ..Default::default() };
                inflation::run(&nodes, &trace, &config, &mut |_, _| {})
            })
        });
    }
    group.finish();
    eprintln!("peak RSS of the benchmark process: {} MiB", gpuscale_bench_peak_rss_mib());
}

/// Peak resident memory of this process (`VmHWM`), in MiB.
fn gpuscale_bench_peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

criterion_group!(benches, bench);
criterion_main!(benches);
