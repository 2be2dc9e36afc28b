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
