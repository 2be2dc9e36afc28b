//! `gpuscale simulate --tenants`: the multi-tenant replay of the openb trace, tenancy vs FIFO.

use gpuscale::scheduler::PolicyKind;
use gpuscale::sim::tenants::{self, TenantSimConfig, TenantSimResult};
use gpuscale::trace::openb;
use std::path::{Path, PathBuf};

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(p)
}

fn replay(nodes: &Path, pods: &Path, n: usize, cfg: &TenantSimConfig) -> TenantSimResult {
    let all = openb::read_nodes(nodes).unwrap();
    let nodes = tenants::subset(&all, cfg.cluster_gpus, cfg.seed);
    let trace = openb::read_pods(pods).unwrap();
    let gpus = nodes.iter().map(|n| n.gpus.len() as u64).sum();
    let config = tenants::derive_tenants(n, gpus);
    let assignment = tenants::assign(&trace, n, cfg.seed);
    tenants::run(&nodes, &trace, &config, &assignment, cfg)
}

fn check_invariants(r: &TenantSimResult) {
    for m in [&r.tenancy, &r.fifo] {
        let share: f64 = m.tenants.iter().map(|t| t.gpu_share).sum();
        assert!((share - 1.0).abs() < 1e-6, "{}: shares sum to {share}", m.mode);
        let entitled: f64 = m.tenants.iter().map(|t| t.entitlement).sum();
        assert!((entitled - 1.0).abs() < 1e-3, "{entitled}");
        assert!(m.jain_index > 0.0 && m.jain_index <= 1.0 + 1e-9);
        assert!(m.p50_wait_s <= m.p95_wait_s);
        assert_eq!(m.tenants.iter().map(|t| t.pods).sum::<usize>(), r.pods);
        assert_eq!(m.tenants.iter().map(|t| t.preempted).sum::<usize>(), m.preemptions);
    }
    assert_eq!(r.fifo.preemptions, 0, "FIFO never preempts");
    assert_eq!(r.tenancy.quota_violations, 0, "tenancy never exceeds quota beyond allowed borrowing");
}

#[test]
fn sample_tenancy_is_fairer_than_fifo_and_deterministic() {
    let cfg = TenantSimConfig { arrival_speedup: 20.0, policy: PolicyKind::BestFit, ..Default::default() };
    let nodes = data("tenancy-openb-sample-nodes.csv");
    let pods = data("tenancy-openb-sample-pods.csv");
    let r = replay(&nodes, &pods, 3, &cfg);
    check_invariants(&r);
    assert_eq!(r.pods, 262);
    // There is contention, and weighted fair sharing serves it more fairly than FIFO.
    assert!(r.fifo.p95_wait_s > 0.0, "the sample must contend for GPUs");
    assert!(
        r.tenancy.jain_index > r.fifo.jain_index,
        "tenancy {} vs fifo {}",
        r.tenancy.jain_index,
        r.fifo.jain_index
    );
    // The heaviest tenant (weight 3) waits less than under FIFO; the lightest more.
    assert!(r.tenancy.tenants[2].p95_wait_s < r.fifo.tenants[2].p95_wait_s);
    assert!(r.tenancy.tenants[0].p50_wait_s > r.fifo.tenants[0].p50_wait_s);
    // Same seed, same result; another seed assigns tenants differently.
    let again = replay(&nodes, &pods, 3, &cfg);
    assert_eq!(serde_json::to_string(&r).unwrap(), serde_json::to_string(&again).unwrap());
    let other = replay(&nodes, &pods, 3, &TenantSimConfig { seed: 7, ..cfg });
    assert_ne!(
        r.tenancy.tenants.iter().map(|t| t.pods).collect::<Vec<_>>(),
        other.tenancy.tenants.iter().map(|t| t.pods).collect::<Vec<_>>()
    );
}

// Runs the binary, which needs the `cli` feature.
#[cfg(feature = "cli")]
#[test]
fn cli_writes_csv_and_summary() {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["simulate", "--tenants", "3", "--policy", "best-fit", "--arrival-speedup", "20", "--nodes"])
        .arg(data("tenancy-openb-sample-nodes.csv"))
        .arg("--pods")
        .arg(data("tenancy-openb-sample-pods.csv"))
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&status.stderr));
    assert!(stdout.contains("tenancy") && stdout.contains("fifo") && stdout.contains("JAIN"), "{stdout}");
    let csv = std::fs::read_to_string(out.path().join("tenants.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 3, "{csv}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["pods"], 262);
    assert!(summary["tenancy"]["jainIndex"].as_f64().is_some());

    // A config file's tenants instead of derived ones.
    let cfg = out.path().join("gpuscale.yaml");
    std::fs::write(
        &cfg,
        "tenancy:\n  cohorts: [{name: all}]\n  tenants:\n    - {name: x, cohort: all, weight: 1, quotas: {gpu-equivalent: {nominal: 10}}}\n    - {name: y, cohort: all, weight: 3, quotas: {gpu-equivalent: {nominal: 25}}}\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["simulate", "--policy", "best-fit", "-o", "json", "--nodes"])
        .arg(data("tenancy-openb-sample-nodes.csv"))
        .arg("--pods")
        .arg(data("tenancy-openb-sample-pods.csv"))
        .arg("--tenants")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["fifo"]["tenants"][1]["tenant"], "y");
    // A bad config names the file and field.
    std::fs::write(&cfg, "tenancy:\n  tenants: [{name: x, weight: -1}]\n").unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["simulate", "--nodes"])
        .arg(data("tenancy-openb-sample-nodes.csv"))
        .arg("--pods")
        .arg(data("tenancy-openb-sample-pods.csv"))
        .arg("--tenants")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("tenancy.tenants[0].weight = -1"), "{err}");
}

fn trace_dir() -> PathBuf {
    let candidates = [
        std::env::var_os("OPENB_TRACE_DIR").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/openb")),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/openb")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("openb_node_list_gpu_node.csv").exists())
        .expect("the openb trace is not at ../shared/traces/openb (set OPENB_TRACE_DIR)")
}

#[test]
fn real_openb_trace_multi_tenant_replay() {
    let dir = trace_dir();
    let cfg = TenantSimConfig {
        arrival_speedup: 300.0,
        cluster_gpus: Some(500),
        policy: PolicyKind::BestFit,
        ..Default::default()
    };
    let r =
        replay(&dir.join("openb_node_list_gpu_node.csv"), &dir.join("openb_pod_list_default.csv"), 4, &cfg);
    check_invariants(&r);
    assert_eq!(r.pods, 8152);
    assert!(r.gpus >= 500 && r.gpus < 520, "{}", r.gpus);
    assert!(r.fifo.p95_wait_s > 0.0 && r.tenancy.preemptions > 0, "the replay must contend for GPUs");
    // Tenancy serves the heaviest tenant (weight 3) faster than FIFO does.
    assert!(r.tenancy.tenants[2].p95_wait_s < r.fifo.tenants[2].p95_wait_s);
    assert!(r.tenancy.p50_wait_s < r.fifo.p50_wait_s);
}
