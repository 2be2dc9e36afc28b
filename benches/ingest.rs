//! `gpuscale plan --snapshot` on a real-shaped 5,000-node `kubectl get nodes,pods -A -o json`
//! List (from `gpuscale generate`: ~42,000 running and ~18,000 pending pods, ~415 MiB), end to
//! end as a user runs it, against the in-run baseline of Python's `json.load` of the same file
//! (merely reading it). Rounds alternate the two commands so machine noise hits both; the report
//! gives medians, their ratio, pods per second, and the plan's peak memory against the file size.
//! Criterion then times the library's `load_snapshot` alone, for regressions.
//!
//!   cargo bench --bench ingest                       # 5,000 nodes
//!   GPUSCALE_INGEST_NODES=1000 cargo bench --bench ingest

#[path = "support/generated.rs"]
mod generated;

use criterion::{criterion_group, criterion_main, Criterion};
use generated::generated;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_gpuscale");

/// Seconds of one run of `cmd`, which must succeed.
fn timed(cmd: &mut Command) -> f64 {
    let start = Instant::now();
    let out = cmd.output().expect("run");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn plan_command(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["plan", "-o", "json", "--snapshot"])
        .arg(dir.join("cluster.json"))
        .arg("--providers")
        .arg(dir.join("providers.yaml"))
        .env("RUST_LOG", "warn");
    c
}

fn bench(c: &mut Criterion) {
    let nodes = std::env::var("GPUSCALE_INGEST_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let dir = generated("ingest", nodes, nodes * 10, nodes * 2);
    let file = dir.join("cluster.json");
    let bytes = std::fs::metadata(&file).expect("generated file").len();
    let loaded = gpuscale::k8s::load_snapshot(&file).expect("load the generated List");
    let pods = loaded.snapshot.workloads.len();
    drop(loaded);

    let (mut python, mut gpuscale) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        python.push(timed(
            Command::new("python3").args(["-c", "import json, sys; json.load(open(sys.argv[1]))"]).arg(&file),
        ));
        gpuscale.push(timed(&mut plan_command(&dir)));
    }
    let (python, gpuscale) = (median(python), median(gpuscale));
    // Peak memory of the plan, by GNU time (the kernel's high-water mark of the process).
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M"])
        .args(plan_command(&dir).get_program().to_str())
        .args(plan_command(&dir).get_args())
        .env("RUST_LOG", "warn")
        .output()
        .expect("GNU time (apt-get install time)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let peak_kib: f64 = stderr.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(f64::NAN);
    let mib = |b: f64| b / f64::from(1 << 20);
    eprintln!(
        "ingest: {nodes} nodes, {pods} pods, {:.0} MiB List\n  python3 json.load: {python:.2} s (median of 3)\n  \
         gpuscale plan --snapshot, end to end: {gpuscale:.2} s (median of 3) = {:.2}x json.load; {:.0} pods/s\n  \
         peak memory of the plan: {:.0} MiB = {:.2}x the file",
        mib(bytes as f64),
        gpuscale / python,
        pods as f64 / gpuscale,
        peak_kib / 1024.0,
        peak_kib * 1024.0 / bytes as f64,
    );

    let mut group = c.benchmark_group(format!("ingest-{nodes}-nodes"));
    group.sample_size(10);
    group.bench_function("load_snapshot", |b| b.iter(|| gpuscale::k8s::load_snapshot(&file).expect("load")));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
