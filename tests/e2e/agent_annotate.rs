//! The agent's node annotation over real HTTP against the in-process fake Kubernetes API server:
//! one merge patch of the one annotation, only on material changes, and only requests the agent's
//! RBAC rules (`controller::rbac::AGENT_CLUSTER_RULES`) allow.

use crate::apiserver;
use crate::telemetry;

use apiserver::FakeApiServer;
use gpuscale::agent::{NodeAnnotator, INTERRUPTION_CONDITION};
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

/// The agent's node writes split into taint writes (the Node) and condition writes (its status).
fn taint_and_condition_writes(writes: &[apiserver::RecordedRequest]) -> (usize, usize) {
    let status = writes.iter().filter(|r| r.path.ends_with("/status")).count();
    (writes.len() - status, status)
}

/// The node's [`INTERRUPTION_CONDITION`]: (status, reason).
fn interruption_condition(server: &FakeApiServer, node: &str) -> Option<(String, String)> {
    let n = server.get("nodes", "", node)?;
    let c =
        n["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == INTERRUPTION_CONDITION)?.clone();
    Some((c["status"].as_str()?.to_string(), c["reason"].as_str()?.to_string()))
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

/// An agent on `node` with no GPU work to publish, watching `cloud`'s metadata server at
/// `endpoint` for interruption notices; stopped by sending on the returned channel.
fn start_agent(
    server: &FakeApiServer,
    node: &str,
    cloud: gpuscale::agent::MetadataCloud,
    endpoint: String,
) -> (tokio::task::JoinHandle<Result<(), gpuscale::agent::AgentError>>, tokio::sync::oneshot::Sender<()>) {
    use gpuscale::agent::{self, AgentOptions, InterruptionWatch, MemorySource, PublishPolicy};
    let options = AgentOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        interval: Duration::from_secs(3600),
        node_name: Some(node.into()),
        idle_threshold_pct: 5,
        publish: PublishPolicy { refresh_secs: 3600, min_gap_secs: 3600 },
        interruptions: Some(InterruptionWatch {
            cloud,
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
    (task, stop_tx)
}

/// The value of `node`'s `gpuscale.io/interruption` taint.
fn interruption_taint(server: &FakeApiServer, node: &str) -> Option<String> {
    server.get("nodes", "", node).unwrap()["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["key"] == "gpuscale.io/interruption")
        .map(|t| t["value"].as_str().unwrap_or_default().to_string())
}

/// Waits up to `limit` for `node`'s interruption taint to say `value`; how long it took.
async fn taint_within(server: &FakeApiServer, node: &str, value: &str, limit: Duration) -> Duration {
    let since = Instant::now();
    while interruption_taint(server, node).as_deref() != Some(value) {
        assert!(
            since.elapsed() < limit,
            "no {value} taint in {limit:?}: {}",
            server.get("nodes", "", node).unwrap()["spec"]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    since.elapsed()
}

/// Stops the agent and returns its writes of taints.
async fn stop_agent(
    server: &FakeApiServer,
    (task, stop): (
        tokio::task::JoinHandle<Result<(), gpuscale::agent::AgentError>>,
        tokio::sync::oneshot::Sender<()>,
    ),
) -> Vec<apiserver::RecordedRequest> {
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("agent stopped").unwrap().unwrap();
    agent_writes(server)
        .into_iter()
        .filter(|r| r.body.contains("taints") || r.path.ends_with("/status"))
        .collect()
}

/// ec2-metadata-mock serving IMDSv2 only on a free port, with `args` (its mode and timings).
fn start_aemm(args: &[&str]) -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = std::process::Command::new(aemm_bin())
        .args(args)
        .args(["-n", "127.0.0.1", "-p", &port.to_string(), "-I"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting ec2-metadata-mock");
    (Killed(child), format!("127.0.0.1:{port}"))
}

/// The agent's watch of the instance metadata service, against AWS's own simulator serving
/// IMDSv2 only, which announces a rebalance recommendation at once and the spot interruption 10 s
/// later: the node is tainted `gpuscale.io/interruption=rebalance`, then `=spot-interruption`
/// (what the controller reacts to) and sets its `InterruptionNotice` condition, one write of each
/// per kind, its other taints and conditions kept, with only requests the agent's RBAC allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_notice_in_the_metadata_service_taints_the_node_once() {
    let (_aemm, endpoint) = start_aemm(&["spot", "-d", "10"]);
    let started = Instant::now();
    let server = FakeApiServer::start().await;
    let mut n = node("gpu-node-3");
    n["spec"] = json!({"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]});
    n["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]});
    server.create(n);
    let agent = start_agent(&server, "gpu-node-3", gpuscale::agent::MetadataCloud::Aws, endpoint);
    taint_within(&server, "gpu-node-3", "rebalance", Duration::from_secs(30)).await;
    assert!(started.elapsed() < Duration::from_secs(10), "the spot notice was not out yet");
    taint_within(&server, "gpu-node-3", "spot-interruption", Duration::from_secs(30)).await;
    // More reads of the same notice: no more writes.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let writes = stop_agent(&server, agent).await;
    assert_eq!(
        server.get("nodes", "", "gpu-node-3").unwrap()["spec"]["taints"],
        json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "gpuscale.io/interruption", "value": "spot-interruption", "effect": "NoSchedule"}
        ])
    );
    assert_eq!(taint_and_condition_writes(&writes), (2, 2), "one of each per kind: {writes:?}");
    // The condition beside the taint, with the other conditions kept.
    assert_eq!(
        interruption_condition(&server, "gpu-node-3"),
        Some(("True".into(), "SpotInterruption".into()))
    );
    let conditions = server.get("nodes", "", "gpu-node-3").unwrap()["status"]["conditions"].clone();
    assert!(conditions.as_array().unwrap().iter().any(|c| c["type"] == "Ready"), "{conditions:#}");
}

/// Scheduled maintenance as the simulator serves it (`events`): an active `instance-stop` taints
/// the node `scheduled-maintenance`; a completed one is no notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_maintenance_in_the_metadata_service_taints_the_node_while_active() {
    let server = FakeApiServer::start().await;
    server.create(node("gpu-node-5"));
    server.create(node("gpu-node-6"));
    let (_active, endpoint) = start_aemm(&["events", "-o", "instance-stop", "-t", "active"]);
    let agent = start_agent(&server, "gpu-node-5", gpuscale::agent::MetadataCloud::Aws, endpoint);
    let (_done, endpoint) = start_aemm(&["events", "-o", "instance-stop", "-t", "completed"]);
    let other = start_agent(&server, "gpu-node-6", gpuscale::agent::MetadataCloud::Aws, endpoint);
    taint_within(&server, "gpu-node-5", "scheduled-maintenance", Duration::from_secs(30)).await;
    // Many reads of the completed event by now (every 200 ms): still nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(interruption_taint(&server, "gpu-node-6"), None);
    stop_agent(&server, other).await;
    let writes = stop_agent(&server, agent).await;
    assert_eq!(taint_and_condition_writes(&writes), (1, 1), "{writes:?}");
    assert_eq!(
        interruption_condition(&server, "gpu-node-5"),
        Some(("True".into(), "ScheduledMaintenance".into()))
    );
    assert_eq!(interruption_condition(&server, "gpu-node-6"), None);
}

/// The GCE metadata server, as much of it as the agent reads: the instance directory
/// (`recursive=true`, camel-cased keys) with an `ETag` per version, `wait_for_change=true` with
/// `last_etag` and `timeout_sec` answering when the directory changes (at once when the ETag is
/// already stale), and `Metadata-Flavor: Google` required (403 without it), as Google documents.
struct GceMetadataStandIn {
    endpoint: String,
    /// (version, preempted, maintenanceEvent).
    state: tokio::sync::watch::Sender<(u64, &'static str, &'static str)>,
    /// Each request's query.
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl GceMetadataStandIn {
    async fn start() -> Self {
        use axum::http::{HeaderMap, StatusCode, Uri};
        use axum::response::IntoResponse;
        let (state, _) = tokio::sync::watch::channel((1u64, "FALSE", "NONE"));
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, log) = (state.clone(), requests.clone());
        let instance = move |headers: HeaderMap, uri: Uri| {
            let (mut rx, log) = (tx.subscribe(), log.clone());
            async move {
                let query = uri.query().unwrap_or_default().to_string();
                log.lock().unwrap().push(query.clone());
                if headers.get("Metadata-Flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
                    return (StatusCode::FORBIDDEN, "Missing Metadata-Flavor:Google header.").into_response();
                }
                let param = |k: &str| {
                    query.split('&').find_map(|kv| {
                        kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')).map(str::to_string)
                    })
                };
                let etag = |v: u64| format!("{v:016x}");
                if param("wait_for_change").as_deref() == Some("true") {
                    let current = etag(rx.borrow_and_update().0);
                    if param("last_etag").as_deref() == Some(current.as_str()) {
                        let secs = param("timeout_sec").and_then(|t| t.parse().ok()).unwrap_or(60);
                        let _ = tokio::time::timeout(Duration::from_secs(secs), rx.changed()).await;
                    }
                }
                let (version, preempted, maintenance) = *rx.borrow();
                let body = json!({"id": 4521308723406113211u64, "name": "gpu-node-4", "preempted": preempted,
                    "maintenanceEvent": maintenance, "scheduling": {"preemptible": "TRUE"}});
                ([("ETag", etag(version)), ("Metadata-Flavor", "Google".into())], body.to_string())
                    .into_response()
            }
        };
        let app = axum::Router::new().route("/computeMetadata/v1/instance/", axum::routing::get(instance));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { endpoint, state, requests, _server: server }
    }

    fn set(&self, preempted: &'static str, maintenance: &'static str) {
        self.state.send_modify(|s| *s = (s.0 + 1, preempted, maintenance));
    }
}

/// `gpuscale agent --interruptions gcp` against a GCE metadata stand-in: it waits on the server's
/// change notification (no polling while nothing changes), taints the node
/// `scheduled-maintenance` as soon as a terminating host maintenance is announced and
/// `spot-interruption` as soon as the preemption is (5 s allowed), one write per kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gce_preemption_in_the_metadata_server_taints_the_node_at_once() {
    let gce = GceMetadataStandIn::start().await;
    let server = FakeApiServer::start().await;
    server.create(node("gpu-node-4"));
    let agent = start_agent(&server, "gpu-node-4", gpuscale::agent::MetadataCloud::Gcp, gce.endpoint.clone());
    // Nothing announced: one read, then a wait on the server, however many intervals pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(interruption_taint(&server, "gpu-node-4"), None);
    let reads = gce.requests.lock().unwrap().clone();
    assert!(reads.len() <= 3, "the agent polled instead of waiting for a change: {reads:?}");
    assert!(
        reads.iter().skip(1).all(|q| q.contains("wait_for_change=true") && q.contains("last_etag=")),
        "{reads:?}"
    );
    gce.set("FALSE", "TERMINATE_ON_HOST_MAINTENANCE");
    let took = taint_within(&server, "gpu-node-4", "scheduled-maintenance", Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(5), "the maintenance taint took {took:?}");
    gce.set("TRUE", "TERMINATE_ON_HOST_MAINTENANCE");
    let took = taint_within(&server, "gpu-node-4", "spot-interruption", Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(5), "the preemption taint took {took:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = stop_agent(&server, agent).await;
    assert_eq!(taint_and_condition_writes(&writes), (2, 2), "one of each per kind: {writes:?}");
    assert_eq!(
        interruption_condition(&server, "gpu-node-4"),
        Some(("True".into(), "SpotInterruption".into()))
    );
    // Without the header the server refuses, as the real one does (the agent always sends it).
    let refused = get_without_header(&gce.endpoint).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
}

/// A GET of the instance directory without `Metadata-Flavor`, its status line and all.
async fn get_without_header(endpoint: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(endpoint).await.unwrap();
    s.write_all(
        format!(
            "GET /computeMetadata/v1/instance/ HTTP/1.1\r\nHost: {endpoint}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}
