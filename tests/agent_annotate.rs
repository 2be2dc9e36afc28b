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
