//! The fault-injection suite: the controller acting (`dryRun: false`) on the real control plane
//! and the simulated cloud while faults are injected, and an auditor that reads what happened —
//! the API server's audit log, the cloud's operation log, the pods the pod garbage collector had
//! to remove, and a sampler that watches the cluster every 50 ms — and fails on any violation of
//! what gpuscale promises never to do (docs/operations.md, "What gpuscale never does"):
//!
//! 1. no pod other than DaemonSet and mirror pods is still on a node when its instance goes (the
//!    harness's pod garbage collector would have to remove it);
//! 2. every pod the controller removes leaves through the Eviction API (never a pod DELETE);
//! 3. no group has fewer nodes than its minimum once the drains under way are counted;
//! 4. no more nodes are drained at once than `maxScaleDownParallelism`;
//! 5. no node that has been Ready is removed (instance or Node) without a drain the controller
//!    started for a reason.
//!
//! Writes after a lost Lease are covered by `tests/k8s_controller.rs` (the fencing tests). Each
//! scenario runs with the seeds of `GPUSCALE_SAFETY_SEEDS` (default `1,2`; the long form is
//! `GPUSCALE_SAFETY_SEEDS=1,2,3,4,5,6,7,8 cargo test --all-features --test k8s_safety`), and each
//! invariant is shown to fire by a controller with one rule broken on purpose
//! (`gate::Mutant`).

#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/controller_fixtures.rs"]
mod fixtures;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;

use controlplane::Options;
use gpuscale::controller::drain::{DISRUPTING_TAINT, DRAIN_EVICTED, DRAIN_REASON, DRAIN_STARTED_AT};
use gpuscale::controller::gate::Mutant;
use gpuscale::model::{GpuSample, InstanceState, NodeTelemetry, TELEMETRY_ANNOTATION};
use gpuscale::planner::PlannerSettings;
use kube_cluster::{fast_config, l4_group, node_name, pod_json, ControllerConfig, KubeCluster, Recorder};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// The seeds every scenario runs with.
fn seeds() -> Vec<u64> {
    let text = std::env::var("GPUSCALE_SAFETY_SEEDS").unwrap_or_else(|_| "1,2".into());
    text.split(',')
        .map(|s| s.trim().parse().expect("GPUSCALE_SAFETY_SEEDS: comma-separated integers"))
        .collect()
}

/// What the sampler saw while a scenario ran.
#[derive(Default)]
struct Seen {
    /// Nodes that were Ready at some sample.
    ever_ready: BTreeSet<String>,
    /// Most nodes carrying drain marks at once.
    most_draining: usize,
    /// Samples where a group's target, less its nodes being drained, was below its minimum.
    below_min: Vec<String>,
}

/// Watches the cluster every 50 ms until aborted.
fn spawn_sampler(c: &Arc<KubeCluster>) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (c, out) = (c.clone(), seen.clone());
    let task = tokio::spawn(async move {
        loop {
            if let Some(list) = c.get("/api/v1/nodes").await {
                let nodes = list["items"].as_array().cloned().unwrap_or_default();
                let mut seen = out.lock().unwrap();
                let draining: Vec<&Value> = nodes.iter().filter(|n| has_drain_marks(n)).collect();
                seen.most_draining = seen.most_draining.max(draining.len());
                for n in &nodes {
                    if is_ready(n) {
                        seen.ever_ready
                            .insert(n["metadata"]["name"].as_str().unwrap_or_default().to_string());
                    }
                }
                for g in c.groups() {
                    let ours = |n: &&&Value| {
                        let pid = n["spec"]["providerID"].as_str().unwrap_or_default();
                        g.instances.iter().any(|i| i.id == pid && i.state == InstanceState::Running)
                    };
                    let leaving = draining.iter().filter(ours).count() as u32;
                    if g.target_size.saturating_sub(leaving) < g.min_size {
                        seen.below_min.push(format!(
                            "group {}: target {} with {leaving} node(s) draining, min {}",
                            g.id, g.target_size, g.min_size
                        ));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    (seen, task)
}

fn is_ready(n: &Value) -> bool {
    n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn has_drain_marks(n: &Value) -> bool {
    let tainted = n["spec"]["taints"].as_array().into_iter().flatten().any(|t| t["key"] == DISRUPTING_TAINT);
    tainted || !n["metadata"]["annotations"][DRAIN_STARTED_AT].is_null()
}

/// Every violation of the invariants in this scenario, in words.
fn audit(c: &KubeCluster, replicas: &[(&str, &Recorder)], seen: &Seen, parallelism: u32) -> Vec<String> {
    let mut out = Vec::new();
    for pod in c.killed.lock().unwrap().iter() {
        out.push(format!("1: pod {pod} was still there when its node's instance went"));
    }
    let users: BTreeSet<String> = replicas.iter().map(|(id, _)| KubeCluster::user(id)).collect();
    let audit = c.cp.audit();
    for e in audit.iter().filter(|e| users.contains(&e.user)) {
        if e.resource == "pods" && e.verb == "delete" && e.subresource.is_empty() && e.code < 300 {
            out.push(format!("2: {} deleted pod {}/{} instead of evicting it", e.user, e.namespace, e.name));
        }
    }
    for below in &seen.below_min {
        out.push(format!("3: {below}"));
    }
    if seen.most_draining > parallelism as usize {
        out.push(format!(
            "4: {} nodes drained at once, maxScaleDownParallelism {parallelism}",
            seen.most_draining
        ));
    }
    let drained: BTreeSet<String> = replicas
        .iter()
        .flat_map(|(_, r)| r.with_prefix("drain_started: "))
        .filter_map(|l| {
            l.strip_prefix("drain_started: ").and_then(|r| r.split(' ').next()).map(str::to_string)
        })
        .collect();
    let mut removed: BTreeSet<String> = audit
        .iter()
        .filter(|e| users.contains(&e.user) && e.resource == "nodes" && e.verb == "delete" && e.code < 300)
        .map(|e| e.name.clone())
        .collect();
    removed.extend(c.deleted_instances().concat().iter().map(|i| node_name(i)));
    for node in removed.iter().filter(|n| seen.ever_ready.contains(*n) && !drained.contains(*n)) {
        out.push(format!("5: node {node} had been Ready and was removed without a drain"));
    }
    out
}

async fn patch_node(c: &KubeCluster, name: &str, patch: Value) {
    c.cp.raw_patch(&format!("/api/v1/nodes/{name}"), &patch).await;
}

async fn patch_node_status(c: &KubeCluster, name: &str, patch: Value) {
    c.cp.raw_patch(&format!("/api/v1/nodes/{name}/status"), &patch).await;
}

/// A node regresses in one of four ways while running a pod: its kubelet stops reporting Ready,
/// its device plugin restarts (no `nvidia.com/gpu`), the MIG manager re-partitions it, or the
/// agent reports one GPU unhealthy.
async fn regress(c: &KubeCluster, node: &str, how: u64) {
    let now = k8s_openapi::jiff::Timestamp::now();
    match how % 4 {
        0 => {
            let cond = json!([{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                "lastHeartbeatTime": now.to_string(), "lastTransitionTime": now.to_string()}]);
            patch_node_status(c, node, json!({"status": {"conditions": cond}})).await;
        }
        1 => {
            let zero = json!({"nvidia.com/gpu": "0"});
            patch_node_status(c, node, json!({"status": {"allocatable": zero, "capacity": zero}})).await;
        }
        2 => {
            patch_node(c, node, json!({"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"}}}))
                .await
        }
        _ => {
            let sample = NodeTelemetry {
                sampled_at: now.as_second() as u64,
                gpus: (0..4)
                    .map(|i| GpuSample {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        model: "L4".into(),
                        utilization_pct: Some(90),
                        memory_used_bytes: 1,
                        memory_total_bytes: 2,
                        ecc_errors: u64::from(i == 2),
                        healthy: i != 2,
                        mig: vec![],
                        idle_since: None,
                    })
                    .collect(),
            };
            let annotations = json!({TELEMETRY_ANNOTATION: sample.encode()});
            patch_node(c, node, json!({"metadata": {"annotations": annotations}})).await;
        }
    }
}

/// The review's finding 0 as one scenario: four Ready nodes running pods regress at once (one
/// NotReady, one device-plugin restart, one MIG re-partition, one unhealthy GPU), the controller
/// restarts (so its memory of instances starts again) and runs past its registration time several
/// times over. Nothing is removed, and a new pod still gets a new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regressed_nodes_running_pods_are_never_removed() {
    for seed in seeds() {
        let c = KubeCluster::start(&l4_group(4, 0, 8), Options::default()).await;
        let nodes = c.register_all_ready().await;
        for (i, n) in nodes.iter().enumerate() {
            c.create(pod_json("ml", &format!("train-{i}"), 3, Some("Job"), Some(n))).await;
        }
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let config = ControllerConfig { registration_timeout_seconds: 1.0, ..fast_config() };
        let first = c.controller("a", config.clone(), PlannerSettings::default(), false).await;
        tokio::time::sleep(Duration::from_millis(500 + 300 * seed)).await;
        for (i, n) in nodes.iter().enumerate() {
            regress(&c, n, seed + i as u64).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let first_seen = first.recorder.clone();
        first.shutdown().await.unwrap();
        let second = c.controller("b", config, PlannerSettings::default(), false).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        // A new pod no node has room for: the controller still scales up beside the regressions
        // (kube-scheduler binds to a regressed node that has room, which the plan does not count
        // on, so the pod asks for more than any has).
        c.create(pod_json("ml", "late", 2, Some("Job"), None)).await;
        c.wait_until(WAIT, "a scale-up for the late pod", || async {
            c.set_target_calls().iter().any(|&(from, to)| from == 4 && to == 5)
        })
        .await;
        sampler.abort();
        driver.abort();
        let gone = c.deleted_instances().concat();
        assert!(gone.is_empty(), "seed {seed}: instances removed: {gone:?}");
        for (i, n) in nodes.iter().enumerate() {
            assert!(c.node(n).await.is_some(), "seed {seed}: node {n} deleted");
            assert_eq!(c.running_on(&format!("train-{i}")).await.as_deref(), Some(n.as_str()), "seed {seed}");
        }
        let violations = audit(&c, &[("a", &first_seen), ("b", &second.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
        second.shutdown().await.unwrap();
    }
}

/// Two Ready nodes: the busy one runs a 3-GPU pod, the other `pod` (1 GPU), which fits beside it.
async fn cluster_with(pod: Value, target: u32, min: u32) -> (Arc<KubeCluster>, String, String) {
    let c = KubeCluster::start(&l4_group(target, min, 8), Options::default()).await;
    let nodes = c.register_all_ready().await;
    let (busy, idle) = (nodes[0].clone(), nodes[1].clone());
    c.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&busy))).await;
    let mut pod = pod;
    pod["spec"]["nodeName"] = json!(idle);
    c.create(pod).await;
    (c, busy, idle)
}

/// The review's finding 3: evictions carry the pod's grace capped at `drainGraceCapSeconds`, and
/// a pod still there past the cap and the headroom (a finalizer holds it here) gives the node
/// back: never terminated under it, uncordoned, an Event and a metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_outlives_its_capped_grace_keeps_its_node() {
    let mut ckpt = pod_json("ml", "ckpt", 1, Some("ReplicaSet"), None);
    ckpt["spec"]["terminationGracePeriodSeconds"] = json!(1800);
    ckpt["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]);
    let (c, busy, idle) = cluster_with(ckpt, 2, 0).await;
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    // Unneeded for 5 s before a drain: an abandoned drain restarts the window, so the node stays
    // given back for that long.
    let config =
        ControllerConfig { drain_grace_cap_seconds: 2.0, scale_down_unneeded_seconds: 5.0, ..fast_config() };
    let replica = c.controller("a", config, PlannerSettings::default(), false).await;
    c.wait_until(WAIT, "ckpt evicted", || async {
        c.pod("ckpt").await.is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    let pod = c.pod("ckpt").await.unwrap();
    assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 2, "the eviction asked for the capped grace");
    c.wait_until(Duration::from_secs(60), "the drain given up", || async {
        !replica.recorder.with_prefix(&format!("drain_abandoned: {idle}")).is_empty()
    })
    .await;
    assert!(c.deleted_instances().concat().is_empty(), "terminated under a terminating pod");
    let node = c.node(&idle).await.expect("the node is kept");
    assert!(!has_drain_marks(&node), "given back without drain marks: {node:#}");
    assert_ne!(node["spec"]["unschedulable"], true, "uncordoned");
    c.wait_until(WAIT, "a ScaleDownFailed Event saying why", || async {
        let events = c.get("/apis/events.k8s.io/v1/namespaces/default/events").await.unwrap_or_default();
        events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "ScaleDownFailed"
                && e["note"].as_str().is_some_and(|n| n.contains("drain abandoned"))
        })
    })
    .await;
    // The pod finally goes: the node may then be removed, through a drain.
    c.cp.raw_patch("/api/v1/namespaces/ml/pods/ckpt", &json!({"metadata": {"finalizers": null}})).await;
    sampler.abort();
    driver.abort();
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(c.node(&busy).await.is_some());
    replica.shutdown().await.unwrap();
}

/// Marks `node` as a previous leader's drain that has begun evicting.
async fn drain_under_way(c: &KubeCluster, node: &str) {
    let patch = json!({
        "metadata": {"annotations": {
            DRAIN_STARTED_AT: k8s_openapi::jiff::Timestamp::now().to_string(),
            DRAIN_REASON: "GPU allocation 25%",
            DRAIN_EVICTED: "true",
        }},
        "spec": {"unschedulable": true, "taints": [{"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"}]}
    });
    patch_node(c, node, patch).await;
}

/// Three nearly empty nodes in a group of minimum 2; a drain of one is under way and its pod's
/// budget refuses every eviction. No second node is drained while it lasts.
async fn min_size_scenario(seed: u64, mutant: Mutant) -> Vec<String> {
    let c = KubeCluster::start(&l4_group(3, 2, 8), Options::default()).await;
    let nodes = c.register_all_ready().await;
    let apps = ["svc-a", "svc-b", "svc-c"];
    for (n, app) in nodes.iter().zip(apps) {
        c.create(pod_json("ml", app, 1, Some("ReplicaSet"), Some(n))).await;
    }
    let held = (seed as usize) % nodes.len();
    c.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "held", "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": apps[held]}}}
    }))
    .await;
    drain_under_way(&c, &nodes[held]).await;
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.mutant_controller("a", fast_config(), PlannerSettings::default(), false, mutant).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    sampler.abort();
    driver.abort();
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
    replica.shutdown().await.unwrap();
    violations
}

/// The review's finding 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_drain_counts_against_the_minimum() {
    for seed in seeds() {
        let violations = min_size_scenario(seed, Mutant::None).await;
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    }
}

/// The review's finding 5: a Node with the group's label and instance type but an instance the
/// cloud does not list in the group (a Karpenter NodePool or another account's group of the same
/// name) is never drained, even empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_matched_by_label_alone_is_never_drained() {
    let c = KubeCluster::start(&l4_group(1, 0, 8), Options::default()).await;
    let nodes = c.register_all_ready().await;
    c.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&nodes[0]))).await;
    let group = c.group("gpu-l4");
    let mut stranger = fixtures::node_json(&group, "aws:///us-east-1a/i-0karpenter");
    stranger["metadata"]["name"] = json!("stranger");
    stranger["status"]["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}]);
    c.create(stranger).await;
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    sampler.abort();
    driver.abort();
    let node = c.node("stranger").await.expect("the stranger stays");
    assert!(!has_drain_marks(&node) && node["spec"]["unschedulable"] != true, "{node:#}");
    assert!(replica.recorder.with_prefix("drain_started: stranger").is_empty());
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
    assert!(violations.is_empty(), "{violations:#?}");
    replica.shutdown().await.unwrap();
}

/// The review's finding 1: a gang that cannot get all its nodes is rolled back, but an early node
/// of it that kube-scheduler gave another pod is kept, and so is that pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_rollback_keeps_a_node_running_another_pod() {
    let c = KubeCluster::start(&l4_group(0, 0, 4), Options::default()).await;
    c.cloud.set_zone_capacity("us-east-1a", Some(1));
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config = ControllerConfig { gang_timeout_seconds: 8.0, ..fast_config() };
    let replica =
        c.controller("a", config, PlannerSettings { scale_down: false, ..Default::default() }, false).await;
    // Two 3-GPU members need two 4-GPU nodes; the zone has room for one.
    for i in 0..2 {
        let mut p = pod_json("ml", &format!("worker-{i}"), 3, Some("Job"), None);
        p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
        c.create(p).await;
    }
    c.wait_until(WAIT, "a member running on the one node", || async {
        c.running_on("worker-0").await.is_some() || c.running_on("worker-1").await.is_some()
    })
    .await;
    c.create(pod_json("ml", "squatter", 1, Some("ReplicaSet"), None)).await;
    c.wait_until(WAIT, "the squatter bound", || async { c.running_on("squatter").await.is_some() }).await;
    let node = c.running_on("squatter").await.unwrap();
    c.wait_until(WAIT, "the gang rolled back", || async {
        !replica.recorder.with_prefix("scale_up_failed: sim/gpu-l4").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    sampler.abort();
    driver.abort();
    assert_eq!(c.running_on("squatter").await.as_deref(), Some(node.as_str()), "the squatter still runs");
    assert_eq!(c.live_instances("gpu-l4").len(), 1, "its node is kept");
    assert_eq!(c.group("gpu-l4").target_size, 1);
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
    assert!(violations.is_empty(), "{violations:#?}");
    replica.shutdown().await.unwrap();
}

/// Mutant: a controller that terminates a node chosen for removal without draining it. The
/// auditor must see the pod it killed and the Ready node removed without a drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_catches_a_controller_that_skips_the_drain() {
    let (c, _busy, idle) = cluster_with(pod_json("ml", "web", 1, Some("ReplicaSet"), None), 2, 0).await;
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica =
        c.mutant_controller("a", fast_config(), PlannerSettings::default(), false, Mutant::SkipDrain).await;
    c.wait_until(WAIT, "the node removed", || async { c.node(&idle).await.is_none() }).await;
    c.wait_until(WAIT, "the orphan collected", || async { c.pod("web").await.is_none() }).await;
    sampler.abort();
    driver.abort();
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
    assert!(violations.iter().any(|v| v.starts_with("1: pod ml/web")), "{violations:#?}");
    assert!(violations.iter().any(|v| v.starts_with(&format!("5: node {idle}"))), "{violations:#?}");
    replica.shutdown().await.unwrap();
}

/// Mutant: a controller that takes every minimum to be 0. The auditor must see the group fall
/// below its minimum once the drains under way are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_catches_a_controller_that_ignores_the_minimum() {
    let violations = min_size_scenario(1, Mutant::IgnoreMinimum).await;
    assert!(violations.iter().any(|v| v.starts_with("3: group sim/gpu-l4")), "{violations:#?}");
}
