//! The node annotation publisher against a local fake Kubernetes API server: a JSON merge patch
//! of exactly the telemetry annotation on the agent's node.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::routing::any;
use axum::Router;
use gpuscale::agent::NodeAnnotator;
use gpuscale::model::{GpuSample, NodeTelemetry, TELEMETRY_ANNOTATION};
use std::sync::{Arc, Mutex};

type Seen = Arc<Mutex<Vec<(Method, String, String, serde_json::Value)>>>;

async fn node_endpoint(
    State(seen): State<Seen>,
    method: Method,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let patch: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    seen.lock().unwrap().push((method, name.clone(), content_type, patch.clone()));
    let annotations = patch["metadata"]["annotations"].clone();
    let node = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": annotations}
    });
    (StatusCode::OK, [("content-type", "application/json")], node.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_the_annotation_with_a_merge_patch() {
    let seen: Seen = Arc::default();
    let app = Router::new().route("/api/v1/nodes/{name}", any(node_endpoint)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port");
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = kube::Client::try_from(config).expect("a client for the fake API server");
    let telemetry = NodeTelemetry {
        sampled_at: 1_764_700_000,
        gpus: vec![GpuSample {
            index: 0,
            uuid: "GPU-abc".into(),
            model: "L4".into(),
            utilization_pct: Some(0),
            memory_used_bytes: 0,
            memory_total_bytes: 24 << 30,
            ecc_errors: 0,
            healthy: true,
            mig: vec![],
            idle_since: Some(1_764_690_000),
        }],
    };
    NodeAnnotator::new(client, "gpu-node-1".into()).publish(&telemetry).await.expect("patch accepted");

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (method, node, content_type, patch) = &seen[0];
    assert_eq!((method, node.as_str()), (&Method::PATCH, "gpu-node-1"));
    assert_eq!(content_type, "application/merge-patch+json");
    let annotations = patch["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(annotations.len(), 1, "only the telemetry annotation is touched: {patch}");
    let value = annotations[TELEMETRY_ANNOTATION].as_str().unwrap();
    assert_eq!(NodeTelemetry::decode("gpu-node-1", value).unwrap(), telemetry);
    assert!(patch.as_object().unwrap().len() == 1, "nothing but metadata: {patch}");
    server.abort();
}

fn gpu(util: u8) -> NodeTelemetry {
    NodeTelemetry {
        sampled_at: 0,
        gpus: vec![GpuSample {
            index: 0,
            uuid: "GPU-loop".into(),
            model: "L4".into(),
            utilization_pct: Some(util),
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 24 << 30,
            ecc_errors: 0,
            healthy: true,
            mig: vec![],
            idle_since: None,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_loop_writes_only_material_changes() {
    use gpuscale::agent::{self, AgentOptions, MemorySource, PublishPolicy};
    use std::time::{Duration, Instant};

    let seen: Seen = Arc::default();
    let app = Router::new().route("/api/v1/nodes/{name}", any(node_endpoint)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port");
    let api = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = kube::Client::try_from(kube::Config::new(format!("http://{api}").parse().unwrap())).unwrap();

    // Busy, the same busy reading four more times (jitter only), then a big drop, repeated.
    let samples = [gpu(80), gpu(82), gpu(79), gpu(81), gpu(80), gpu(10)];
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
        Some(client),
        async move {
            let _ = stop_rx.await;
        },
        None,
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "fewer than 2 writes in 30s: {:?}", seen.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Several more samples of the unchanged last reading: no more writes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("agent stopped").unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    let utils: Vec<Option<u8>> = seen
        .iter()
        .map(|(_, node, _, patch)| {
            assert_eq!(node, "gpu-node-2");
            let value = patch["metadata"]["annotations"][TELEMETRY_ANNOTATION].as_str().unwrap();
            NodeTelemetry::decode(node, value).unwrap().gpus[0].utilization_pct
        })
        .collect();
    assert_eq!(utils, vec![Some(80), Some(10)], "one write per material change");
    server.abort();
}
