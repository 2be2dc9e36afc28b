//! The controller's snapshot assembly, without the API server: the objects of a generated
//! real-shaped cluster (`gpuscale generate`: 5,000 GPU nodes, 45,000 running and 5,000 pending
//! pods) as the controller's stores hold them (Nodes, and each Pod converted once on arrival),
//! assembled into the planner's snapshot as every loop does. The in-run baseline is the first
//! assembly (every Node converted); criterion times the steady one (every conversion reused), the
//! part of a loop that still grows with the cluster rather than with what changed.
//!
//!   cargo bench --bench controller_snapshot
//!   GPUSCALE_LOOP_NODES=500 cargo bench --bench controller_snapshot

use criterion::{criterion_group, criterion_main, Criterion};
use gpuscale::controller::config::ControllerConfig;
use gpuscale::controller::pod_store::PodRecord;
use gpuscale::controller::snapshot;
use gpuscale::k8s::ConversionCache;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

/// The allocator the `gpuscale` binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BIN: &str = env!("CARGO_BIN_EXE_gpuscale");

/// The controller bench's cluster (same directory, so either bench generates it once).
fn generated(nodes: usize) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("controller-loop-{nodes}"));
    if !dir.join("cluster.json").exists() {
        let status = Command::new(BIN)
            .args(["generate", "--nodes", &nodes.to_string(), "--running", &(nodes * 9).to_string()])
            .args(["--pending", &nodes.to_string(), "--out"])
            .arg(&dir)
            .status()
            .expect("run gpuscale generate");
        assert!(status.success(), "gpuscale generate failed");
    }
    dir
}

fn bench(c: &mut Criterion) {
    let nodes = std::env::var("GPUSCALE_LOOP_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let file = generated(nodes).join("cluster.json");
    let list: Value = serde_json::from_slice(&std::fs::read(&file).expect("read the cluster")).expect("JSON");
    let config = ControllerConfig::default();
    let (mut node_objects, mut pods, mut pdbs) = (Vec::new(), Vec::new(), Vec::new());
    for item in list["items"].as_array().expect("items") {
        match item["kind"].as_str() {
            Some("Node") => {
                node_objects.push(Arc::new(serde_json::from_value::<Node>(item.clone()).unwrap()))
            }
            Some("Pod") => {
                let pod: Pod = serde_json::from_value(item.clone()).unwrap();
                pods.push(Arc::new(PodRecord::new(pod, &config.training.checkpoint_annotation)));
            }
            Some("PodDisruptionBudget") => {
                pdbs.push(Arc::new(serde_json::from_value::<PodDisruptionBudget>(item.clone()).unwrap()))
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
    let mut cache = ConversionCache::default();
    let assemble = |cache: &mut ConversionCache| {
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
