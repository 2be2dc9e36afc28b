//! The controller's loop at scale, against the real control plane: a generated real-shaped
//! cluster (`gpuscale generate`: 5,000 GPU nodes, 45,000 running and 5,000 pending pods) is
//! created in a real kube-apiserver (etcd, no scheduler: pending pods stay pending), then
//! `gpuscale run --dry-run` runs as users run it and, loop after loop, 100 new pending pods are
//! created. Reported: the first pass (every object converted; the in-run baseline), the steady
//! passes' p50/p99/max (what changed converted, the rest reused), and the controller's RSS, next
//! to the anchors (KAI 2.2-2.5 s per cycle at 4k nodes; Karpenter's controller under 260 MB in its
//! perf suite).
//!
//!   cargo bench --bench controller_loop                            # 5,000 nodes, 30 loops
//!   GPUSCALE_LOOP_NODES=500 GPUSCALE_LOOPS=10 cargo bench --bench controller_loop
//!
//! Needs the control plane binaries (`GPUSCALE_K8S_BIN`, or built by scripts/k8s-controlplane.sh).

#[path = "../tests/support/controlplane.rs"]
mod controlplane;
#[path = "support/generated.rs"]
mod generated;

use controlplane::{ControlPlane, Options};
use futures::StreamExt;
use generated::generated;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpuscale");
/// Requests in flight while loading the cluster.
const CONCURRENCY: usize = 32;
/// New pending pods per loop.
const NEW_PER_LOOP: usize = 100;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The object as a client creates it: without what the server assigns.
fn creatable(item: &Value) -> Value {
    let mut obj = item.clone();
    let meta = obj["metadata"].as_object_mut().expect("metadata");
    for field in ["resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"] {
        meta.remove(field);
    }
    obj.as_object_mut().unwrap().remove("status");
    obj
}

async fn request(cp: &ControlPlane, method: &str, path: &str, content_type: &str, body: &Value) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", content_type)
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    cp.admin.request::<Value>(request).await.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
}

/// Creates a node as kubelet registers one: the object, its status, and (standing in for the node
/// lifecycle controller) the not-ready taint the API server's admission adds lifted.
async fn create_node(cp: &ControlPlane, item: &Value) {
    let name = item["metadata"]["name"].as_str().unwrap();
    request(cp, "POST", "/api/v1/nodes", "application/json", &creatable(item)).await;
    let path = format!("/api/v1/nodes/{name}");
    let taints = item["spec"].get("taints").cloned().unwrap_or(Value::Null);
    request(cp, "PATCH", &path, "application/merge-patch+json", &json!({"spec": {"taints": taints}})).await;
    let status = json!({"status": item["status"]});
    request(cp, "PATCH", &format!("{path}/status"), "application/merge-patch+json", &status).await;
}

async fn create_pod(cp: &ControlPlane, item: &Value) {
    let ns = item["metadata"]["namespace"].as_str().unwrap();
    request(cp, "POST", &format!("/api/v1/namespaces/{ns}/pods"), "application/json", &creatable(item)).await;
}

/// One pass of the controller as its log reports it.
struct Pass {
    elapsed: Duration,
    pending: u64,
    /// Seconds converting the stores and planning, this pass.
    converting: f64,
    planning: f64,
}

fn parse_duration(debug: &str) -> Option<Duration> {
    let split = debug.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = debug.split_at(split);
    let n: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "µs" | "us" => n / 1e6,
        "ns" => n / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// Starts `gpuscale run --dry-run` against the control plane; its passes arrive on the channel.
fn start_controller(cp: &ControlPlane, dir: &Path) -> (Child, mpsc::Receiver<Pass>) {
    let config = dir.join("gpuscale.yaml");
    std::fs::write(&config, "controller:\n  batchIdleSeconds: 0.2\n  batchMaxSeconds: 1\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(BIN)
        .args(["run", "--dry-run", "--identity", "bench", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--providers")
        .arg(dir.join("providers.yaml"))
        .arg("--config")
        .arg(&config)
        .env("KUBECONFIG", &cp.admin_kubeconfig)
        .env("GPUSCALE_LOG_FORMAT", "json")
        .env("RUST_LOG", "info,gpuscale::controller::reconcile=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuscale run");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut converting, mut planning) = (f64::NAN, f64::NAN);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
            let fields = &v["fields"];
            let seconds = fields["seconds"].as_f64().unwrap_or(f64::NAN);
            match fields["message"].as_str() {
                Some("cluster state converted") => converting = seconds,
                Some("planned") => planning = seconds,
                _ => {}
            }
            if !fields["message"].as_str().is_some_and(|m| m.starts_with("plan:")) {
                if v["level"] == "ERROR" || v["level"] == "WARN" {
                    eprintln!("controller: {line}");
                }
                continue;
            }
            let elapsed = fields["elapsed"].as_str().and_then(parse_duration);
            if let (Some(elapsed), Some(pending)) = (elapsed, fields["pending"].as_u64()) {
                if tx.send(Pass { elapsed, pending, converting, planning }).is_err() {
                    return;
                }
            }
        }
    });
    (child, rx)
}

/// VmRSS and VmHWM of a process, in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    // Nearest rank.
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list`
    }
    let nodes = env_or("GPUSCALE_LOOP_NODES", 5000);
    let loops = env_or("GPUSCALE_LOOPS", 30);
    let dir = generated("controller-loop", nodes, nodes * 9, nodes);
    let list: Value = serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).unwrap()).unwrap();
    let items = list["items"].as_array().unwrap();
    let (node_items, pod_items): (Vec<&Value>, Vec<&Value>) = items.iter().partition(|i| i["kind"] == "Node");
    let template =
        pod_items.iter().find(|p| p["spec"]["nodeName"].is_null()).copied().expect("a pending pod").clone();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let cp = ControlPlane::start(Options { scheduler: false, ..Default::default() }).await;
        let namespaces: BTreeSet<&str> =
            pod_items.iter().filter_map(|p| p["metadata"]["namespace"].as_str()).collect();
        for ns in namespaces.iter().copied().chain(["gpuscale-system"]) {
            cp.ensure_namespace(ns).await;
        }
        let began = Instant::now();
        futures::stream::iter(node_items.iter().map(|n| create_node(&cp, n)))
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        futures::stream::iter(pod_items.iter().map(|p| create_pod(&cp, p)))
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
        let pending_at_start = pod_items.iter().filter(|p| p["spec"]["nodeName"].is_null()).count() as u64;
        eprintln!(
            "controller_loop: created {} nodes and {} pods ({} pending) in {:.0} s",
            node_items.len(),
            pod_items.len(),
            pending_at_start,
            began.elapsed().as_secs_f64()
        );

        let started = Instant::now();
        let (mut child, passes) = start_controller(&cp, &dir);
        let wait = |want: u64| loop {
            let pass = passes.recv_timeout(Duration::from_secs(600)).expect("the controller planned");
            if pass.pending >= want {
                return pass;
            }
        };
        let cold = wait(pending_at_start);
        let first_plan = started.elapsed();
        let mut steady = Vec::new();
        let (mut converting, mut planning) = (Vec::new(), Vec::new());
        for round in 0..loops {
            let new: Vec<Value> = (0..NEW_PER_LOOP)
                .map(|i| {
                    let mut pod = template.clone();
                    pod["metadata"]["name"] = json!(format!("bench-{round}-{i}"));
                    pod
                })
                .collect();
            futures::stream::iter(new.iter().map(|p| create_pod(&cp, p)))
                .buffer_unordered(CONCURRENCY)
                .collect::<Vec<()>>()
                .await;
            let pass = wait(pending_at_start + ((round + 1) * NEW_PER_LOOP) as u64);
            steady.push(pass.elapsed.as_secs_f64());
            converting.push(pass.converting);
            planning.push(pass.planning);
        }
        let (rss, peak) = memory_mib(child.id());
        let _ = child.kill();
        let _ = child.wait();

        // Each pass as it came, to tell a slow outlier from a slow trend.
        let passes: Vec<String> = steady
            .iter()
            .zip(&converting)
            .zip(&planning)
            .map(|((s, c), p)| format!("{s:.2} ({c:.2}+{p:.2})"))
            .collect();
        for v in [&mut steady, &mut converting, &mut planning] {
            v.sort_by(f64::total_cmp);
        }
        let cold_s = cold.elapsed.as_secs_f64();
        let p50 = quantile(&steady, 0.5);
        println!(
            "controller_loop: {} nodes, {} pods, +{NEW_PER_LOOP} pending pods per loop, {loops} loops",
            node_items.len(),
            pod_items.len() + loops * NEW_PER_LOOP
        );
        println!("  first pass (every object converted; baseline)  {cold_s:.3} s  (process start to first plan {:.1} s)", first_plan.as_secs_f64());
        println!(
            "  steady pass  p50 {p50:.3} s  p99 {:.3} s  max {:.3} s  ({:.2}x the first pass at p50)",
            quantile(&steady, 0.99),
            steady[steady.len() - 1],
            p50 / cold_s
        );
        println!(
            "  of which, at p50: converting the stores {:.3} s (first pass {:.3} s), planning {:.3} s (first pass {:.3} s)",
            quantile(&converting, 0.5),
            cold.converting,
            quantile(&planning, 0.5),
            cold.planning
        );
        println!("  passes in order, s (converting+planning): {}", passes.join(" "));
        println!("  controller memory  RSS {rss:.0} MiB, peak {peak:.0} MiB");
        println!("  anchors: KAI 2.2-2.5 s per cycle at 4k nodes; Karpenter's controller under 260 MB (its perf suite)");
    });
}
