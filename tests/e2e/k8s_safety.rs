//! The fault-injection suite: the controller acting (`dryRun: false`) on the real control plane
//! and the simulated cloud while faults are injected, and an auditor that reads what happened —
//! the API server's audit log, the cloud's operation log, the pods the pod garbage collector had
//! to remove, and a sampler that watches the cluster every 50 ms — and fails on any violation of
//! what gpuscale promises never to do (docs/operations.md, "What gpuscale never does"):
//!
//! 1. no pod other than DaemonSet and mirror pods is still on a node when its instance goes (the
//!    harness's pod garbage collector would have to remove it);
//! 2. every pod the controller removes leaves through the Eviction API (never a pod DELETE, not
//!    even one the chart's RBAC refuses);
//! 3. no group has fewer nodes than its minimum once the drains under way are counted;
//! 4. no more nodes are drained at once than `maxScaleDownParallelism`;
//! 5. no node that has been Ready is removed (instance or Node) without a drain a controller
//!    started for a reason (seen in its observer's calls or as the drain's marks on the Node);
//! 6. no replica writes (other than its Lease claims and Events) unless it holds the Lease: the
//!    last successful write of the Lease before the write is its own, within the Lease's duration.
//!
//! Each scenario runs with the seeds of `GPUSCALE_SAFETY_SEEDS` (default `1,2`; more with
//! `GPUSCALE_SAFETY_SEEDS=1,2,3,4,5,6,7,8 cargo test --all-features --test e2e k8s_safety::`, and for
//! hours, new seeds each round, with `scripts/safety-soak.sh HOURS`), and each
//! invariant is shown to fire by a controller with one rule broken on purpose
//! (`gate::Mutant`).

use crate::controlplane;
use crate::fixtures;
use crate::kube_cluster;

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
/// The controller's leader Lease (`kube-system/gpuscale-controller`).
const LEASE: &str = "gpuscale-controller";

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
    /// Nodes seen carrying a drain's reason (a drain some replica started, this one or one
    /// before it).
    drained: BTreeSet<String>,
}

/// Watches the cluster every 50 ms until aborted.
fn spawn_sampler(c: &Arc<KubeCluster>) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (c, out) = (c.clone(), seen.clone());
    let task = tokio::spawn(async move {
        loop {
            // Errors (the API server restarting) skip a sample.
            if let Ok(list) = c.cp.raw("GET", "/api/v1/nodes", None).await {
                let nodes = list["items"].as_array().cloned().unwrap_or_default();
                let mut seen = out.lock().unwrap();
                let draining: Vec<&Value> = nodes.iter().filter(|n| has_drain_marks(n)).collect();
                seen.most_draining = seen.most_draining.max(draining.len());
                for n in &draining {
                    if n["metadata"]["annotations"][DRAIN_REASON].as_str().is_some_and(|r| !r.is_empty()) {
                        seen.drained.insert(n["metadata"]["name"].as_str().unwrap_or_default().to_string());
                    }
                }
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
        // Attempts count too: the chart's RBAC refuses pod deletes, which is a second line.
        if e.resource == "pods" && e.verb == "delete" && e.subresource.is_empty() {
            out.push(format!(
                "2: {} deleted pod {}/{} instead of evicting it (HTTP {})",
                e.user, e.namespace, e.name, e.code
            ));
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
    let mut drained: BTreeSet<String> = replicas
        .iter()
        .flat_map(|(_, r)| r.with_prefix("drain_started: "))
        .filter_map(|l| {
            l.strip_prefix("drain_started: ").and_then(|r| r.split(' ').next()).map(str::to_string)
        })
        .collect();
    drained.extend(seen.drained.iter().cloned());
    let mut removed: BTreeSet<String> = audit
        .iter()
        .filter(|e| users.contains(&e.user) && e.resource == "nodes" && e.verb == "delete" && e.code < 300)
        .map(|e| e.name.clone())
        .collect();
    removed.extend(c.deleted_instances().concat().iter().map(|i| node_name(i)));
    for node in removed.iter().filter(|n| seen.ever_ready.contains(*n) && !drained.contains(*n)) {
        out.push(format!("5: node {node} had been Ready and was removed without a drain"));
    }
    out.extend(writes_without_the_lease(&audit, &users));
    out
}

/// Invariant 6, from the audit log alone: who held the Lease when each acting write arrived.
fn writes_without_the_lease(audit: &[controlplane::AuditEvent], users: &BTreeSet<String>) -> Vec<String> {
    let duration_ms = i64::from(fast_config().lease.duration_seconds) * 1000;
    let claims: Vec<(i64, &str)> = audit
        .iter()
        .filter(|e| e.resource == "leases" && e.name == LEASE && e.code < 300)
        .filter(|e| matches!(e.verb.as_str(), "create" | "update" | "patch"))
        .filter_map(|e| Some((e.received?.as_millisecond(), e.user.as_str())))
        .collect();
    let reporting = |e: &controlplane::AuditEvent| {
        matches!(e.verb.as_str(), "get" | "list" | "watch")
            || matches!(e.resource.as_str(), "leases" | "events")
            || (e.resource == "serviceaccounts" && e.subresource == "token")
    };
    let acting = audit.iter().filter(|e| users.contains(&e.user) && e.code < 300 && !reporting(e));
    let mut out = Vec::new();
    for e in acting {
        let Some(at) = e.received.map(|t| t.as_millisecond()) else { continue };
        let holder = claims.iter().filter(|(t, _)| *t <= at).max_by_key(|(t, _)| *t);
        let held = holder.is_some_and(|(t, who)| *who == e.user && at - t <= duration_ms);
        if !held {
            out.push(format!(
                "6: {} wrote {} {} at {at} ms while the Lease was {:?}'s",
                e.user,
                e.verb,
                e.uri,
                holder.map(|(t, who)| format!("{who} since {t} ms"))
            ));
        }
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
/// NotReady, one device-plugin restart, one MIG re-partition, one unhealthy GPU; or, with even
/// seeds, the device plugin restarting on all four), the controller
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
            // Odd seeds: one node each way; even seeds: a device-plugin (or GPU operator) upgrade
            // takes `nvidia.com/gpu` off every node at once.
            let how = if seed % 2 == 1 { seed + i as u64 } else { 1 };
            regress(&c, n, how).await;
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
    for seed in seeds() {
        let mut ckpt = pod_json("ml", "ckpt", 1, Some("ReplicaSet"), None);
        ckpt["spec"]["terminationGracePeriodSeconds"] = json!(1800);
        ckpt["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]);
        let (c, busy, idle) = cluster_with(ckpt, 2, 0).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        // Unneeded for 5 s before a drain: an abandoned drain restarts the window, so the node stays
        // given back for that long.
        let config = ControllerConfig {
            drain_grace_cap_seconds: 1.0 + seed as f64,
            scale_down_unneeded_seconds: 5.0,
            ..fast_config()
        };
        let replica = c.controller("a", config, PlannerSettings::default(), false).await;
        c.wait_until(WAIT, "ckpt evicted", || async {
            c.pod("ckpt").await.is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
        })
        .await;
        let pod = c.pod("ckpt").await.unwrap();
        assert_eq!(
            pod["metadata"]["deletionGracePeriodSeconds"],
            1 + seed,
            "the eviction asked for the capped grace"
        );
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
    for seed in seeds() {
        let c = KubeCluster::start(&l4_group(1, 0, 8), Options::default()).await;
        let nodes = c.register_all_ready().await;
        c.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&nodes[0]))).await;
        let group = c.group("gpu-l4");
        let mut stranger = fixtures::node_json(&group, "aws:///us-east-1a/i-0karpenter");
        stranger["metadata"]["name"] = json!("stranger");
        stranger["status"]["conditions"] =
            json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}]);
        c.create(stranger).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let replica = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
        tokio::time::sleep(Duration::from_secs(3 + 2 * seed)).await;
        sampler.abort();
        driver.abort();
        let node = c.node("stranger").await.expect("the stranger stays");
        assert!(!has_drain_marks(&node) && node["spec"]["unschedulable"] != true, "{node:#}");
        assert!(replica.recorder.with_prefix("drain_started: stranger").is_empty());
        let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "{violations:#?}");
        replica.shutdown().await.unwrap();
    }
}

/// The review's finding 1: a gang that cannot get all its nodes is rolled back, but an early node
/// of it that kube-scheduler gave another pod is kept, and so is that pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_rollback_keeps_a_node_running_another_pod() {
    for seed in seeds() {
        let c = KubeCluster::start(&l4_group(0, 0, 4), Options::default()).await;
        c.cloud.set_zone_capacity("us-east-1a", Some(1));
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let config = ControllerConfig { gang_timeout_seconds: 7.0 + seed as f64, ..fast_config() };
        let replica = c
            .controller("a", config, PlannerSettings { scale_down: false, ..Default::default() }, false)
            .await;
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

/// Four Ready nodes of one group: three run a 1-GPU pod each that a finalizer keeps terminating
/// once evicted (its drain lasts), one runs a 3-GPU pod. One pass plans to empty three nodes;
/// `maxScaleDownParallelism: 1` lets one drain run at a time.
async fn parallelism_scenario(seed: u64, mutant: Mutant) -> Vec<String> {
    let c = KubeCluster::start(&l4_group(4, 0, 8), Options::default()).await;
    let nodes = c.register_all_ready().await;
    c.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&nodes[0]))).await;
    for (i, n) in nodes[1..].iter().enumerate() {
        let mut p = pod_json("ml", &format!("web-{i}"), 1, Some("ReplicaSet"), Some(n));
        p["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]);
        c.create(p).await;
    }
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config =
        ControllerConfig { max_scale_down_parallelism: 1, drain_grace_cap_seconds: 2.0, ..fast_config() };
    let replica = c.mutant_controller("a", config, PlannerSettings::default(), false, mutant).await;
    tokio::time::sleep(Duration::from_millis(3000 + 500 * seed)).await;
    sampler.abort();
    driver.abort();
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 1);
    assert!(
        !replica.recorder.with_prefix("drain_started: ").is_empty(),
        "seed {seed}: the scenario must drain something"
    );
    replica.shutdown().await.unwrap();
    violations
}

/// `maxScaleDownParallelism` holds while the drains last (Cluster Autoscaler's
/// `max-scale-down-parallelism`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_never_exceed_the_parallelism() {
    for seed in seeds() {
        let violations = parallelism_scenario(seed, Mutant::None).await;
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    }
}

/// Mutant: a controller that ignores `maxScaleDownParallelism`. The auditor must see more drains
/// at once than it allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_catches_a_controller_that_ignores_the_parallelism() {
    let violations = parallelism_scenario(1, Mutant::IgnoreParallelism).await;
    assert!(violations.iter().any(|v| v.starts_with("4: ")), "{violations:#?}");
}

/// Mutant: a controller that deletes pods instead of evicting them. The auditor must see the
/// pod DELETE in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_catches_a_controller_that_deletes_pods() {
    let (c, _busy, _idle) = cluster_with(pod_json("ml", "web", 1, Some("ReplicaSet"), None), 2, 0).await;
    // An operator's broader RBAC lets the deletes through, so the mutant's effect is real.
    c.create(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "test-pod-deleter"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]}))
        .await;
    c.create(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "test-pod-deleter"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-pod-deleter"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpuscale-a", "namespace": "kube-system"}]}))
    .await;
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica =
        c.mutant_controller("a", fast_config(), PlannerSettings::default(), false, Mutant::DeletePods).await;
    c.wait_until(WAIT, "web deleted", || async {
        c.cp.audit()
            .iter()
            .any(|e| e.resource == "pods" && e.verb == "delete" && e.name == "web" && e.code < 300)
    })
    .await;
    sampler.abort();
    driver.abort();
    let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
    assert!(violations.iter().any(|v| v.starts_with("2: ") && v.contains("ml/web")), "{violations:#?}");
    replica.shutdown().await.unwrap();
}

/// Mutant: a second replica that acts without the Lease while the first holds it. The auditor
/// must see its writes from the audit log alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_catches_a_replica_that_ignores_the_lease() {
    let (c, _busy, idle) = cluster_with(pod_json("ml", "web", 1, Some("ReplicaSet"), None), 2, 0).await;
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    // a leads with a long unneeded window, so b (acting at once) is the one that drains.
    let slow = ControllerConfig { scale_down_unneeded_seconds: 600.0, ..fast_config() };
    let a = c.controller("a", slow, PlannerSettings::default(), false).await;
    c.wait_until(WAIT, "a holds the Lease", || async {
        let lease =
            c.get(&format!("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{LEASE}")).await;
        lease.is_some_and(|l| l["spec"]["holderIdentity"] == "a")
    })
    .await;
    let b =
        c.mutant_controller("b", fast_config(), PlannerSettings::default(), false, Mutant::IgnoreLease).await;
    c.wait_until(WAIT, "b drained the idle node", || async {
        !b.recorder.with_prefix(&format!("drain_started: {idle}")).is_empty()
    })
    .await;
    sampler.abort();
    driver.abort();
    let violations = audit(&c, &[("a", &a.recorder), ("b", &b.recorder)], &seen.lock().unwrap(), 10);
    let b_user = KubeCluster::user("b");
    assert!(violations.iter().any(|v| v.starts_with(&format!("6: {b_user}"))), "{violations:#?}");
    assert!(
        !violations.iter().any(|v| v.starts_with(&format!("6: {}", KubeCluster::user("a")))),
        "{violations:#?}"
    );
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// Makes the API server refuse `operation` (e.g. `DELETE`) on `resource` (core group, cluster
/// scoped) by replica `identity`: a ValidatingAdmissionPolicy denying its ServiceAccount.
async fn refuse_for(c: &KubeCluster, identity: &str, operation: &str, resource: &str) {
    let name = format!("test-refuse-{}-{resource}-{identity}", operation.to_lowercase());
    let user = KubeCluster::user(identity);
    c.create(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": [operation], "resources": [resource],
            }]},
            "validations": [{
                "expression": format!("request.userInfo.username != '{user}'"),
                "message": format!("test: {operation} of {resource} by {identity} refused"),
            }],
        },
    }))
    .await;
    c.create(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }))
    .await;
    // Policies load asynchronously: give the API server time to see this one.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Where in a scale-down the controller crashes.
#[derive(Debug, Clone, Copy)]
enum CrashAt {
    /// The node is marked for the drain.
    DrainStarted,
    /// Its pod has been evicted and is still terminating.
    PodTerminating,
    /// Its instance is terminated and the Node's deletion was refused.
    InstanceGone,
}

/// A scale-down with the controller crashing (no Lease release, no clean-up) at `at`, and a new
/// replica finishing it: the node's pod is evicted (never deleted), its instance terminated once,
/// the Node deleted, the group shrunk once, and nothing is stranded.
async fn crash_during_scale_down(at: CrashAt, seed: u64) {
    let mut web = pod_json("ml", "web", 1, Some("ReplicaSet"), None);
    web["spec"]["terminationGracePeriodSeconds"] = json!(600);
    web["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]);
    let (c, busy, idle) = cluster_with(web, 2, 0).await;
    if matches!(at, CrashAt::InstanceGone) {
        // No cloud node lifecycle controller to delete the Node for us: the controller must.
        c.collect_nodes.store(false, std::sync::atomic::Ordering::SeqCst);
        refuse_for(&c, "a", "DELETE", "nodes").await;
        // Let the pod go once evicted: this crash comes after it.
        c.cp.raw_patch("/api/v1/namespaces/ml/pods/web", &json!({"metadata": {"finalizers": null}})).await;
    }
    let (seen, sampler) = spawn_sampler(&c);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config = ControllerConfig { drain_grace_cap_seconds: 2.0, ..fast_config() };
    let a = c.controller("a", config.clone(), PlannerSettings::default(), false).await;
    let what = format!("{at:?}");
    c.wait_until(WAIT, &what, || async {
        match at {
            CrashAt::DrainStarted => c.node(&idle).await.is_some_and(|n| has_drain_marks(&n)),
            CrashAt::PodTerminating => {
                c.pod("web").await.is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
            }
            CrashAt::InstanceGone => !c.deleted_instances().is_empty(),
        }
    })
    .await;
    // A little later into the step by seed (the step lasts; the next one is not reached).
    tokio::time::sleep(Duration::from_millis(40 * seed)).await;
    a.task.abort();
    let a_seen = a.recorder.clone();
    if matches!(at, CrashAt::InstanceGone) {
        assert!(c.node(&idle).await.is_some(), "a's Node deletion was refused");
    }
    let b = c.controller("b", config, PlannerSettings::default(), false).await;
    if !matches!(at, CrashAt::InstanceGone) {
        c.wait_until(WAIT, "web evicted", || async {
            c.pod("web").await.is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
        })
        .await;
        c.cp.raw_patch("/api/v1/namespaces/ml/pods/web", &json!({"metadata": {"finalizers": null}})).await;
    }
    c.wait_until(WAIT, "the node removed", || async { c.node(&idle).await.is_none() }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    sampler.abort();
    driver.abort();
    assert_eq!(c.deleted_instances().concat().len(), 1, "{at:?}: one instance terminated, once");
    assert_eq!(c.group("gpu-l4").target_size, 1, "{at:?}: the group shrunk once");
    assert!(c.node(&busy).await.is_some(), "{at:?}");
    let evictions = c
        .cp
        .audit()
        .into_iter()
        .filter(|e| e.resource == "pods" && e.subresource == "eviction" && e.name == "web" && e.code < 300)
        .count();
    assert!(evictions >= 1, "{at:?}: web left through the Eviction API");
    let violations = audit(&c, &[("a", &a_seen), ("b", &b.recorder)], &seen.lock().unwrap(), 10);
    assert!(violations.is_empty(), "{at:?}: {violations:#?}");
    b.shutdown().await.unwrap();
}

/// A controller restarted at every step of a scale-down neither double-removes nor strands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_crash_at_any_step_of_a_scale_down_strands_nothing() {
    for seed in seeds() {
        for at in [CrashAt::DrainStarted, CrashAt::PodTerminating, CrashAt::InstanceGone] {
            crash_during_scale_down(at, seed).await;
        }
    }
}

/// The API server restarts while a drain waits on a terminating pod: the controller reconnects,
/// terminates nothing under the pod, and removes the node once the pod is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_during_a_drain_removes_nothing_under_its_pods() {
    for seed in seeds() {
        let mut web = pod_json("ml", "web", 1, Some("ReplicaSet"), None);
        web["spec"]["terminationGracePeriodSeconds"] = json!(600);
        web["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]);
        let (c, busy, idle) = cluster_with(web, 2, 0).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let config = ControllerConfig { drain_grace_cap_seconds: 3.0, ..fast_config() };
        let replica = c.controller("a", config, PlannerSettings::default(), false).await;
        c.wait_until(WAIT, "web evicted", || async {
            c.pod("web").await.is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
        })
        .await;
        c.cp.restart_apiserver(Duration::from_millis(500 + 1000 * seed)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(c.deleted_instances().is_empty(), "seed {seed}: terminated under a terminating pod");
        c.cp.raw_patch("/api/v1/namespaces/ml/pods/web", &json!({"metadata": {"finalizers": null}})).await;
        c.wait_until(WAIT, "the node removed", || async { c.node(&idle).await.is_none() }).await;
        sampler.abort();
        driver.abort();
        assert_eq!(c.deleted_instances().concat().len(), 1, "seed {seed}");
        assert!(c.node(&busy).await.is_some(), "seed {seed}");
        let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
        replica.shutdown().await.unwrap();
    }
}

/// Telemetry of an L4 node whose four GPUs have been idle since `idle_since`, sampled at
/// `sampled_at` (seconds).
fn idle_l4(sampled_at: u64, idle_since: u64) -> Value {
    let sample = NodeTelemetry {
        sampled_at,
        gpus: (0..4)
            .map(|i| GpuSample {
                index: i,
                uuid: format!("GPU-{i}"),
                model: "L4".into(),
                utilization_pct: Some(0),
                memory_used_bytes: 0,
                memory_total_bytes: 2,
                ecc_errors: 0,
                healthy: true,
                mig: vec![],
                idle_since: Some(idle_since),
            })
            .collect(),
    };
    json!({"metadata": {"annotations": {TELEMETRY_ANNOTATION: sample.encode()}}})
}

/// The node agents stop publishing: the last samples said the opted-in notebooks' GPUs were
/// idle, but stale telemetry reclaims nothing (the notebooks may be busy again). Once fresh
/// samples say the same, the node is reclaimed through a drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_from_agents_that_stopped_reclaims_nothing() {
    for seed in seeds() {
        let c = KubeCluster::start(&l4_group(3, 0, 8), Options::default()).await;
        let nodes = c.register_all_ready().await;
        c.create(pod_json("ml", "train-a", 3, Some("Job"), Some(&nodes[0]))).await;
        c.create(pod_json("ml", "train-b", 3, Some("Job"), Some(&nodes[1]))).await;
        for i in 0..2 {
            let mut p = pod_json("ml", &format!("notebook-{i}"), 1, Some("ReplicaSet"), Some(&nodes[2]));
            p["metadata"]["annotations"] = json!({"gpuscale.io/reclaim-idle": "true"});
            c.create(p).await;
        }
        let now = k8s_openapi::jiff::Timestamp::now().as_second() as u64;
        // Sampled an hour ago (and more, by seed), idle for a day before that.
        let stale = now - 3600 * (1 + seed);
        patch_node(&c, &nodes[2], idle_l4(stale, stale - 86_400)).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let planner = PlannerSettings {
            scale_down_utilization: 0.5,
            telemetry: gpuscale::model::TelemetrySettings { idle_window: 3600, max_age: 600 },
            ..Default::default()
        };
        let replica = c.controller("a", fast_config(), planner, false).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(
            replica.recorder.with_prefix("drain_started: ").is_empty(),
            "seed {seed}: stale telemetry drained a node: {:#?}",
            replica.recorder.lines.lock().unwrap()
        );
        let now = k8s_openapi::jiff::Timestamp::now().as_second() as u64;
        patch_node(&c, &nodes[2], idle_l4(now, now - 86_400)).await;
        c.wait_until(WAIT, "the idle node drained once its telemetry is fresh", || async {
            !replica.recorder.with_prefix(&format!("drain_started: {}", nodes[2])).is_empty()
        })
        .await;
        sampler.abort();
        driver.abort();
        let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
        replica.shutdown().await.unwrap();
    }
}

/// The leader crashes in the middle of a gang scale-up (its instances launching): the next leader
/// resumes the gang from its record, once. The gang runs on the nodes launched for it, the group
/// is never scaled twice for it, and nothing is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_crash_mid_gang_is_resumed_once_by_the_next() {
    for seed in seeds() {
        let c = KubeCluster::start(&l4_group(0, 0, 4), Options::default()).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let config = ControllerConfig { gang_timeout_seconds: 60.0, ..fast_config() };
        let planner = PlannerSettings { scale_down: false, ..Default::default() };
        let a = c.controller("a", config.clone(), planner.clone(), false).await;
        for i in 0..2 {
            let mut p = pod_json("ml", &format!("worker-{i}"), 3, Some("Job"), None);
            p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
            c.create(p).await;
        }
        c.wait_until(WAIT, "a scaled for the gang", || async { !c.set_target_calls().is_empty() }).await;
        tokio::time::sleep(Duration::from_millis(100 * seed)).await;
        a.task.abort();
        let a_seen = a.recorder.clone();
        let b = c.controller("b", config, planner, false).await;
        c.wait_until(WAIT, "the gang running", || async {
            c.running_on("worker-0").await.is_some() && c.running_on("worker-1").await.is_some()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        sampler.abort();
        driver.abort();
        let calls = c.set_target_calls();
        assert_eq!(calls, vec![(0, 2)], "seed {seed}: scaled once for the gang");
        assert!(c.deleted_instances().is_empty(), "seed {seed}");
        let violations = audit(&c, &[("a", &a_seen), ("b", &b.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
        b.shutdown().await.unwrap();
    }
}

/// A PodDisruptionBudget refuses the drain's eviction for longer than `drainTimeoutSeconds`: the
/// drain is given up, the node uncordoned and kept with its pod, and nothing is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_refusing_past_the_drain_timeout_gives_the_node_back() {
    for seed in seeds() {
        let (c, busy, idle) = cluster_with(pod_json("ml", "web", 1, Some("ReplicaSet"), None), 2, 0).await;
        c.create(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
        }))
        .await;
        drain_under_way(&c, &idle).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let config = ControllerConfig {
            drain_timeout_seconds: 2.0 + seed as f64,
            scale_down_unneeded_seconds: 600.0,
            ..fast_config()
        };
        let replica = c.controller("a", config, PlannerSettings::default(), false).await;
        c.wait_until(WAIT, "the drain given up", || async {
            c.node(&idle).await.is_some_and(|n| !has_drain_marks(&n) && n["spec"]["unschedulable"] != true)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        sampler.abort();
        driver.abort();
        assert_eq!(c.running_on("web").await.as_deref(), Some(idle.as_str()), "web still runs on its node");
        assert!(c.deleted_instances().is_empty() && c.node(&busy).await.is_some());
        let refused =
            c.cp.audit().into_iter().filter(|e| e.subresource == "eviction" && e.code == 429).count();
        assert!(refused > 0, "the budget refused the eviction");
        let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "{violations:#?}");
        replica.shutdown().await.unwrap();
    }
}

/// A cheap group a gang scales into and a dear node (its own group, another zone) that the cheap
/// group could replace.
const GANG_AND_REPLACEMENT: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 600, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}
    nodeGroups:
      - {name: gpu-l4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0}
      - {name: gpu-l4-big, instanceType: g6.48xlarge, zones: [us-east-1b], minSize: 0, maxSize: 1, targetSize: 1}
"#;

/// A consolidation replacement comes due while a gang waits on the same group (whose nodes boot
/// slower than the gang waits): the replacement waits for the gang to be decided, so the gang's
/// rollback removes its own two instances only, never the replacement's, and nothing running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consolidation_replacement_waits_for_a_gang_on_its_group() {
    for seed in seeds() {
        let c = KubeCluster::start(GANG_AND_REPLACEMENT, Options::default()).await;
        let dear = c.register_all_ready().await.remove(0);
        c.create(pod_json("ml", "web", 1, Some("ReplicaSet"), Some(&dear))).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        // Its nodes take a minute to boot (600 simulated seconds): the gang gives up before,
        // with nothing registered.
        let config = ControllerConfig { gang_timeout_seconds: 5.0 + seed as f64, ..fast_config() };
        let replica = c.controller("a", config, PlannerSettings::default(), false).await;
        for i in 0..2 {
            let mut p = pod_json("ml", &format!("worker-{i}"), 4, Some("Job"), None);
            p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
            p["spec"]["nodeSelector"] = json!({"node.kubernetes.io/instance-type": "g6.12xlarge"});
            c.create(p).await;
        }
        c.wait_until(WAIT, "the gang raised", || async {
            !replica.recorder.with_prefix("scaled_up: sim/gpu-l4 ").is_empty()
        })
        .await;
        // While the gang waits, the plan wants the dear node replaced by a cheap one.
        let mut wanted = false;
        c.wait_until(WAIT, "the gang rolled back", || {
            let plan = replica.recorder.last_plan.lock().unwrap().clone();
            wanted |= plan.is_some_and(|(p, _)| p.replacements.iter().any(|r| r.node == dear));
            async { !replica.recorder.with_prefix("scale_up_failed: sim/gpu-l4 ").is_empty() }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        sampler.abort();
        driver.abort();
        assert!(wanted, "seed {seed}: the plan never wanted the replacement; the scenario tests nothing");
        let lines = replica.recorder.lines.lock().unwrap().clone();
        let rolled_back = lines.iter().position(|l| l.starts_with("scale_up_failed: sim/gpu-l4 ")).unwrap();
        let replaced = lines.iter().position(|l| l.starts_with("replacement_requested: "));
        assert!(
            replaced.is_none_or(|r| r > rolled_back),
            "seed {seed}: replaced during the gang: {lines:#?}"
        );
        assert_eq!(c.running_on("web").await.as_deref(), Some(dear.as_str()), "seed {seed}");
        let gone = c.deleted_instances().concat();
        assert_eq!(gone.len(), 2, "seed {seed}: the gang's two instances only: {gone:?}");
        let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
        replica.shutdown().await.unwrap();
    }
}

/// A drain and a preemption at once, on a group that cannot grow: a previous leader's drain of
/// node A waits on team-b's terminating pod while team-a, within its quota, reclaims 4 GPUs that
/// team-b borrows on node B. The borrower is evicted once, through the Eviction API, never the
/// draining node's pod a second time; the claimant runs on B; A goes only once its pod has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_and_a_preemption_at_once_evict_each_pod_once() {
    for seed in seeds() {
        let c = KubeCluster::start(&l4_group(2, 0, 2), Options::default()).await;
        for ns in ["team-a", "team-b"] {
            c.cp.ensure_namespace(ns).await;
        }
        let nodes = c.register_all_ready().await;
        let (a, b) = (nodes[0].clone(), nodes[1].clone());
        let mut web = pod_json("team-b", "web", 1, Some("ReplicaSet"), Some(&a));
        web["spec"]["terminationGracePeriodSeconds"] = json!(600);
        web["metadata"]["finalizers"] = json!(["test.gpuscale.io/hold"]);
        c.create(web).await;
        let mut hog = pod_json("team-b", "hog", 4, Some("Job"), Some(&b));
        hog["spec"]["terminationGracePeriodSeconds"] = json!(1 + seed);
        c.create(hog).await;
        drain_under_way(&c, &a).await;
        let (seen, sampler) = spawn_sampler(&c);
        let driver = c.spawn_driver(Duration::from_millis(100), 10);
        let tenancy = serde_yaml::from_str(fixtures::TWO_TEAMS).unwrap();
        let settings = PlannerSettings { tenancy: Some(tenancy), ..Default::default() };
        let config = ControllerConfig { drain_grace_cap_seconds: 3.0, ..fast_config() };
        let replica = c.controller("a", config, settings, false).await;
        c.create(pod_json("team-a", "claim", 4, Some("Job"), None)).await;
        c.wait_until(WAIT, "the claim running on B", || async {
            c.running_in("team-a", "claim").await.as_deref() == Some(b.as_str())
        })
        .await;
        // Passes with the claim bound and web still terminating: nothing more is evicted.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(c.node(&a).await.is_some(), "seed {seed}: A removed under its terminating pod");
        c.cp.raw_patch("/api/v1/namespaces/team-b/pods/web", &json!({"metadata": {"finalizers": null}}))
            .await;
        c.wait_until(WAIT, "A removed once web has gone", || async { c.node(&a).await.is_none() }).await;
        sampler.abort();
        driver.abort();
        let evictions: Vec<String> = c
            .requests_of("a")
            .into_iter()
            .filter(|e| e.subresource == "eviction" && !e.uri.contains("dryRun=All") && e.code < 300)
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect();
        let count = |pod: &str| evictions.iter().filter(|e| *e == pod).count();
        assert_eq!(count("team-b/hog"), 1, "seed {seed}: {evictions:?}");
        assert!(count("team-b/web") <= 1, "seed {seed}: {evictions:?}");
        assert_eq!(evictions.len(), count("team-b/hog") + count("team-b/web"), "seed {seed}: {evictions:?}");
        assert_eq!(c.deleted_instances().concat().len(), 1, "seed {seed}");
        let violations = audit(&c, &[("a", &replica.recorder)], &seen.lock().unwrap(), 10);
        assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
        replica.shutdown().await.unwrap();
    }
}
