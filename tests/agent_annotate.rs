//! The agent's node annotation over real HTTP against the in-process fake Kubernetes API server:
//! one merge patch of the one annotation, only on material changes, and only requests the agent's
//! RBAC rules (`controller::rbac::AGENT_CLUSTER_RULES`) allow.

#[path = "support/apiserver/mod.rs"]
mod apiserver;
#[path = "support/telemetry.rs"]
mod telemetry;

use apiserver::FakeApiServer;
use gpuscale::agent::NodeAnnotator;
use gpuscale::controller::rbac::{allows, request_attributes, AGENT_CLUSTER_RULES};
use gpuscale::model::{NodeTelemetry, TELEMETRY_ANNOTATION};
use serde_json::json;
use std::time::{Duration, Instant};

const REPLICA: &str = "agent";

fn node(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"},
                     "annotations": {"other.example/keep": "yes"}},
    })
}

fn gpu(util: u8, idle_since: Option<u64>) -> NodeTelemetry {
    NodeTelemetry { sampled_at: 1_764_700_000, gpus: vec![telemetry::l4_sample(0, util, idle_since)] }
}

/// The agent's writes (PATCHes of nodes), after checking every request it made is allowed.
fn agent_writes(server: &FakeApiServer) -> Vec<apiserver::RecordedRequest> {
    let requests: Vec<_> =
        server.requests().into_iter().filter(|r| r.replica.as_deref() == Some(REPLICA)).collect();
    for r in &requests {
        let a = request_attributes(&r.method, &r.path, false).expect("a Kubernetes API request");
        assert!(
            allows(AGENT_CLUSTER_RULES, a.verb, &a.api_group, &a.resource),
            "{} {} is not allowed by the agent's RBAC",
            r.method,
            r.path
        );
    }
    requests.into_iter().filter(|r| r.method == "PATCH").collect()
}

fn published(server: &FakeApiServer, name: &str) -> Option<NodeTelemetry> {
    let node = server.get("nodes", "", name)?;
    let value = node["metadata"]["annotations"][TELEMETRY_ANNOTATION].as_str()?.to_string();
    Some(NodeTelemetry::decode(name, &value).expect("a valid annotation"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_the_annotation_with_a_merge_patch() {
    let server = FakeApiServer::start().await;
    server.create(node("gpu-node-1"));
    let telemetry = gpu(0, Some(1_764_690_000));
    NodeAnnotator::new(server.replica_client(REPLICA), "gpu-node-1".into())
        .publish(&telemetry)
        .await
        .expect("patch accepted");

    let writes = agent_writes(&server);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].path, "/api/v1/nodes/gpu-node-1");
    assert_eq!(writes[0].content_type.as_deref(), Some("application/merge-patch+json"));
    let patch: serde_json::Value = serde_json::from_str(&writes[0].body).unwrap();
    assert_eq!(patch.as_object().unwrap().len(), 1, "nothing but metadata: {patch}");
    assert_eq!(patch["metadata"]["annotations"].as_object().unwrap().len(), 1, "one annotation: {patch}");
    assert_eq!(published(&server, "gpu-node-1"), Some(telemetry));
    let stored = server.get("nodes", "", "gpu-node-1").unwrap();
    assert_eq!(stored["metadata"]["annotations"]["other.example/keep"], "yes", "other annotations stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_loop_writes_only_material_changes() {
    use gpuscale::agent::{self, AgentOptions, MemorySource, PublishPolicy};

    let server = FakeApiServer::start().await;
    server.create(node("gpu-node-2"));
    // Busy, the same busy reading four more times (jitter only), then a big drop, repeated.
    let samples = [gpu(80, None), gpu(82, None), gpu(79, None), gpu(81, None), gpu(80, None), gpu(10, None)];
    let options = AgentOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        interval: Duration::from_millis(50),
        node_name: Some("gpu-node-2".into()),
        idle_threshold_pct: 5,
        publish: PublishPolicy { refresh_secs: 3600, min_gap_secs: 0 },
        interruptions: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent::run(
        options,
        Box::new(MemorySource::new(samples)),
        Some(server.replica_client(REPLICA)),
        async move {
            let _ = stop_rx.await;
        },
        None,
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent_writes(&server).len() < 2 {
        assert!(Instant::now() < deadline, "fewer than 2 writes in 30s: {:?}", agent_writes(&server));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Several more samples of the unchanged last reading: no more writes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("agent stopped").unwrap().unwrap();
    let utils: Vec<Option<u8>> = agent_writes(&server)
        .iter()
        .map(|r| {
            let patch: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            let value = patch["metadata"]["annotations"][TELEMETRY_ANNOTATION].as_str().unwrap();
            NodeTelemetry::decode("gpu-node-2", value).unwrap().gpus[0].utilization_pct
        })
        .collect();
    assert_eq!(utils, vec![Some(80), Some(10)], "one write per material change");
    assert_eq!(published(&server, "gpu-node-2").unwrap().gpus[0].utilization_pct, Some(10));
}

/// ec2-metadata-mock, AWS's IMDS simulator: `GPUSCALE_AEMM_BIN` (scripts/test.sh builds it), else
/// built now with `scripts/aemm.sh`; the test fails loudly when neither works.
fn aemm_bin() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("GPUSCALE_AEMM_BIN") {
        return p.into();
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/aemm.sh");
    let out = std::process::Command::new("bash").arg(&script).output().expect("running scripts/aemm.sh");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && !path.is_empty(),
        "ec2-metadata-mock is needed and could not be built: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path.into()
}

/// A child process killed when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent's watch of the instance metadata service, against AWS's own simulator serving
/// IMDSv2 only, which announces a rebalance recommendation at once and the spot interruption 10 s
/// later: the node is tainted `gpuscale.io/interruption=rebalance`, then `=spot-interruption`
/// (what the controller reacts to), one write per kind, its other taints kept, with only
/// requests the agent's RBAC allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_notice_in_the_metadata_service_taints_the_node_once() {
    use gpuscale::agent::{self, AgentOptions, InterruptionWatch, MemorySource, PublishPolicy};

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("127.0.0.1:{port}");
    let _aemm = Killed(
        std::process::Command::new(aemm_bin())
            .args(["-n", "127.0.0.1", "-p", &port.to_string(), "-I", "spot", "-d", "10"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting ec2-metadata-mock"),
    );
    let started = Instant::now();
    let server = FakeApiServer::start().await;
    let mut n = node("gpu-node-3");
    n["spec"] = json!({"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]});
    server.create(n);
    let options = AgentOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        interval: Duration::from_secs(3600),
        node_name: Some("gpu-node-3".into()),
        idle_threshold_pct: 5,
        publish: PublishPolicy { refresh_secs: 3600, min_gap_secs: 3600 },
        interruptions: Some(InterruptionWatch {
            imds_endpoint: endpoint,
            interval: Duration::from_millis(200),
        }),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent::run(
        options,
        Box::new(MemorySource::new([gpu(80, None)])),
        Some(server.replica_client(REPLICA)),
        async move {
            let _ = stop_rx.await;
        },
        None,
    ));
    let taints = |s: &FakeApiServer| s.get("nodes", "", "gpu-node-3").unwrap()["spec"]["taints"].clone();
    let marked = |s: &FakeApiServer| {
        taints(s)
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["key"] == "gpuscale.io/interruption")
            .map(|t| t["value"].as_str().unwrap_or_default().to_string())
    };
    let wait_for = |value: &'static str| {
        let server = &server;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while marked(server).as_deref() != Some(value) {
                assert!(Instant::now() < deadline, "no {value} taint in 30 s: {}", taints(server));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_for("rebalance").await;
    assert!(started.elapsed() < Duration::from_secs(10), "the spot notice was not out yet");
    wait_for("spot-interruption").await;
    // More reads of the same notice: no more writes.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("agent stopped").unwrap().unwrap();
    assert_eq!(
        taints(&server),
        json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "gpuscale.io/interruption", "value": "spot-interruption", "effect": "NoSchedule"}
        ])
    );
    let writes: Vec<_> = agent_writes(&server).into_iter().filter(|r| r.body.contains("taints")).collect();
    assert_eq!(writes.len(), 2, "one per kind: {writes:?}");
}
