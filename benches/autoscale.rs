//! A day-long autoscaling replay of the openb `default` trace (its busiest day, day 148: ~720
//! pods), gpuscale's planner vs the Cluster-Autoscaler-like baseline in the same run.

use criterion::{criterion_group, criterion_main, Criterion};
use gpuscale::sim::autoscale::{self, AutoscaleConfig, Autoscaler};
use std::path::PathBuf;

fn trace_dir() -> PathBuf {
    [
        std::env::var_os("OPENB_TRACE_DIR").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/openb")),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/openb")),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.join("openb_pod_list_default.csv").exists())
    .expect("the openb trace is not at ../shared/traces/openb (set OPENB_TRACE_DIR)")
}

fn bench(c: &mut Criterion) {
    let pods = gpuscale::trace::openb::read_pods(&trace_dir().join("openb_pod_list_default.csv"))
        .expect("openb pods");
    let jobs = autoscale::jobs_from_openb(&pods, Some(148 * 86400), 24.0);
    let (groups, _) = autoscale::openb_groups().expect("embedded groups");
    let cfg = AutoscaleConfig::default();
    let mut group = c.benchmark_group("openb-default-autoscale-day");
    group.sample_size(10);
    for policy in [Autoscaler::ClusterAutoscaler, Autoscaler::Gpuscale] {
        group.bench_function(policy.name(), |b| b.iter(|| autoscale::run(&jobs, &groups, policy, &cfg)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
