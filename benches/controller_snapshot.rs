//! The controller's snapshot assembly, without the API server: the objects of a generated
//! real-shaped cluster (`gpuscale generate`: 5,000 GPU nodes, 45,000 running and 5,000 pending
//! pods) as the controller's stores hold them (Nodes, and each Pod converted once on arrival),
//! assembled into the planner's snapshot as every loop does. The in-run baseline is the first
//! assembly (every Node converted); criterion times the steady one (every conversion reused), the
//! part of a loop that still grows with the cluster rather than with what changed.
//!
//!   cargo bench --bench controller_snapshot
//!   GPUSCALE_LOOP_NODES=500 cargo bench --bench controller_snapshot

#[path = "support/generated.rs"]
mod generated;

use criterion::{criterion_group, criterion_main, Criterion};
use generated::generated;
use gpuscale::controller::config::ControllerConfig;
use gpuscale::controller::pod_store::PodRecord;
use gpuscale::controller::snapshot;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// The allocator the `gpuscale` binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bench(c: &mut Criterion) {
    let nodes = std::env::var("GPUSCALE_LOOP_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    // The controller bench's cluster: either bench generates it once.
    let file = generated("controller-loop", nodes, nodes * 9, nodes).join("cluster.json");
    let mut list: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read the cluster")).expect("JSON");
    let config = ControllerConfig::default();
    let (mut node_objects, mut pods, mut pdbs) = (Vec::new(), Vec::new(), Vec::new());
    for item in list["items"].as_array_mut().expect("items") {
        let kind = item["kind"].as_str().unwrap_or_default().to_string();
        let item = item.take();
        match kind.as_str() {
            "Node" => node_objects.push(Arc::new(serde_json::from_value::<Node>(item).unwrap())),
            "Pod" => {
                let pod: Pod = serde_json::from_value(item).unwrap();
                pods.push(Arc::new(PodRecord::new(pod, &config.training.checkpoint_annotation)));
            }
            "PodDisruptionBudget" => {
                pdbs.push(Arc::new(serde_json::from_value::<PodDisruptionBudget>(item).unwrap()))
            }
            _ => {}
        }
    }
    drop(list);
    eprintln!(
        "{}: {} nodes, {} pods, {} budgets",
        file.display(),
        node_objects.len(),
        pods.len(),
        pdbs.len()
    );
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut cache = snapshot::AssemblyCache::default();
    let assemble = |cache: &mut snapshot::AssemblyCache| {
        snapshot::build(&node_objects, &pods, &pdbs, &[], Vec::new(), &config, now, cache).expect("assemble")
    };
    let start = Instant::now();
    let first = assemble(&mut cache);
    let cold = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let steady = assemble(&mut cache);
    let warm = start.elapsed().as_secs_f64();
    assert_eq!(first.snapshot.workloads.len(), steady.snapshot.workloads.len());
    eprintln!(
        "first assembly (every node converted) {cold:.3} s; steady (conversions reused) {warm:.3} s: {:.2}x",
        warm / cold
    );
    let mut group = c.benchmark_group(format!("controller-snapshot-{nodes}-nodes"));
    group.sample_size(10);
    group.bench_function("steady", |b| b.iter(|| assemble(&mut cache)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
