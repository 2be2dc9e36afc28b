//! The controller loop end to end over real HTTP: kube's client, watchers and reflectors against
//! the in-process fake API server, a simulated cloud, and a harness playing kubelet and
//! scheduler.

#[path = "support/apiserver/mod.rs"]
mod apiserver;
#[path = "support/cluster_harness.rs"]
mod harness;

use apiserver::{Fault, Settings};
use gpuscale::controller::drain::{
    DISRUPTING_TAINT, DRAIN_EVICTED, DRAIN_REASON, DRAIN_STARTED_AT, REPLACE_WITH,
};
use gpuscale::model::InstanceState;
use gpuscale::planner::PlannerSettings;
use gpuscale::providers::simulated::Operation;
use harness::{fast_config, node_name, pod_json, Cluster};
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// One simulated account, one group of 4-GPU L4 nodes.
fn providers(target: u32) -> String {
    format!(
        r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {{bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}}
    nodeGroups:
      - name: gpu-l4
        instanceType: g6.12xlarge
        zones: [us-east-1a]
        minSize: 0
        maxSize: 4
        targetSize: {target}
"#
    )
}

fn live_instances(c: &Cluster) -> Vec<String> {
    c.group("gpu-l4")
        .instances
        .iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .map(|i| i.id.clone())
        .collect()
}

fn set_target_calls(c: &Cluster) -> Vec<(u32, u32)> {
    c.cloud
        .operations()
        .into_iter()
        .filter_map(|r| match r.op {
            Operation::SetTargetSize { from, to, error: None, .. } => Some((from, to)),
            _ => None,
        })
        .collect()
}

fn eviction_log(c: &Cluster) -> Vec<String> {
    c.server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| format!("{:?} {} {}", r.replica, r.path, r.status))
        .collect()
}

fn no_scale_down() -> PlannerSettings {
    PlannerSettings { scale_down: false, ..Default::default() }
}

fn evictions(c: &Cluster, pod: &str, status: u16) -> usize {
    c.server
        .requests()
        .iter()
        .filter(|r| {
            r.method == "POST" && r.path.ends_with(&format!("/pods/{pod}/eviction")) && r.status == status
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_gpu_pods_scale_up_and_land_on_the_new_node() {
    let c = Cluster::start(&providers(0), Settings::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down());
    for i in 0..3 {
        c.server.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None));
    }
    c.server
        .wait_until(WAIT, "all three pods running", |s| {
            (0..3).all(|i| {
                s.get("pods", "ml", &format!("train-{i}")).is_some_and(|p| p["status"]["phase"] == "Running")
            })
        })
        .await;
    let nodes: Vec<String> = (0..3)
        .map(|i| {
            c.server.get("pods", "ml", &format!("train-{i}")).unwrap()["spec"]["nodeName"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let live = live_instances(&c);
    assert_eq!(live.len(), 1, "one 4-GPU node holds three 1-GPU pods: {live:?}");
    assert!(nodes.iter().all(|n| *n == node_name(&live[0])), "{nodes:?} vs {live:?}");
    // Let a few more passes run: the in-flight and registered capacity is never scaled twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(set_target_calls(&c), vec![(0, 1)]);
    assert_eq!(
        replica.recorder.with_prefix("scaled_up").len(),
        1,
        "{:?}",
        replica.recorder.lines.lock().unwrap()
    );
    // Only the controller's identity holds the lease.
    let lease = c.server.get("leases", harness::LEASE_NAMESPACE, "gpuscale-controller").expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
    harness::assert_requests_allowed_by_rbac(&c.server);
}

/// Two nodes: one runs a 3-GPU pod, the other a 1-GPU pod that fits beside it.
async fn two_node_cluster(settings: Settings) -> (std::sync::Arc<Cluster>, String, String) {
    let c = Cluster::start(&providers(2), settings).await;
    let mut nodes = c.register_all_ready();
    nodes.sort();
    let (busy, idle) = (nodes[0].clone(), nodes[1].clone());
    c.server.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&busy)));
    c.server.create(pod_json("ml", "web", 1, Some("ReplicaSet"), Some(&idle)));
    (c, busy, idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underused_node_is_drained_and_deleted() {
    let (c, busy, idle) = two_node_cluster(Settings::default()).await;
    c.schedule.store(false, std::sync::atomic::Ordering::Relaxed);
    let idle_instance = live_instances(&c).into_iter().find(|i| node_name(i) == idle).unwrap();
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), PlannerSettings::default());
    c.server.wait_until(WAIT, "the drained node deleted", |s| s.get("nodes", "", &idle).is_none()).await;
    assert_eq!(evictions(&c, "web", 201), 1, "web left through the Eviction API");
    assert!(c.server.get("pods", "ml", "web").is_none());
    assert!(c.server.get("pods", "ml", "big").is_some(), "the busy node's pod stays");
    assert!(c.server.get("nodes", "", &busy).is_some());
    let deleted: Vec<_> = c
        .cloud
        .operations()
        .into_iter()
        .filter_map(|r| match r.op {
            Operation::DeleteInstances { instances, error: None, .. } => Some(instances),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, vec![vec![idle_instance.clone()]], "that exact instance was deleted");
    c.server.wait_until(WAIT, "instance gone", |_| !live_instances(&c).contains(&idle_instance)).await;
    assert_eq!(c.group("gpu-l4").target_size, 1);
    assert!(replica.recorder.with_prefix("drain_started").iter().any(|l| l.contains(&idle)));
    c.server
        .wait_until(WAIT, "node_deleted reported", |_| {
            replica.recorder.with_prefix("node_deleted").iter().any(|l| l.contains(&idle))
        })
        .await;
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
    harness::assert_requests_allowed_by_rbac(&c.server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_disruption_budget_blocks_the_drain() {
    let (c, _busy, idle) =
        two_node_cluster(Settings { eviction_retry_after_seconds: 0, ..Default::default() }).await;
    c.schedule.store(false, std::sync::atomic::Ordering::Relaxed);
    // A previous leader already started draining the node and began evicting.
    c.server.update("nodes", "", &idle, |n| {
        n["metadata"]["annotations"] = json!({
            DRAIN_STARTED_AT: k8s_openapi::jiff::Timestamp::now().to_string(),
            DRAIN_REASON: "GPU allocation 25% < 50%",
            DRAIN_EVICTED: "true",
        });
        n["spec"]["unschedulable"] = json!(true);
        n["spec"]["taints"] = json!([{"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"}]);
    });
    // web must stay available: its budget allows no disruption.
    c.server.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }));
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), PlannerSettings::default());
    c.server.wait_until(WAIT, "three refused evictions", |_| evictions(&c, "web", 429) >= 3).await;
    assert_eq!(evictions(&c, "web", 201), 0);
    let web = c.server.get("pods", "ml", "web").expect("web stays");
    assert_eq!(web["spec"]["nodeName"], idle.as_str());
    let node = c.server.get("nodes", "", &idle).expect("the node stays");
    assert_eq!(node["spec"]["unschedulable"], true, "still cordoned while the drain waits");
    assert!(live_instances(&c).iter().any(|i| node_name(i) == idle));
    assert!(c.cloud.operations().iter().all(|r| !matches!(r.op, Operation::DeleteInstances { .. })));
    assert!(replica.recorder.with_prefix("eviction_blocked: ml/web").iter().any(|l| l.contains("429")));
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_drain_resumes_without_losing_pods() {
    // Pods take their (capped) grace period to go, so the drain is caught in the middle.
    let settings = Settings {
        graceful_pod_deletion: true,
        max_grace_period: Duration::from_millis(1500),
        ..Default::default()
    };
    let (c, busy, idle) = two_node_cluster(settings).await;
    c.schedule.store(false, std::sync::atomic::Ordering::Relaxed);
    for i in 0..3 {
        c.server.create(pod_json("ml", &format!("side-{i}"), 0, Some("ReplicaSet"), Some(&idle)));
    }
    let on_idle = ["web", "side-0", "side-1", "side-2"];
    // The first replica's evictions of the side pods fail (a flaky API server), so it crashes
    // with work left: web evicted, the side pods still running.
    c.server.inject_fault(Fault::new("POST", "/api/v1/namespaces/ml/pods/side-", 500, 3));
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    // The first replica passes every 2 s while busy, so the test stops it between passes.
    let slow = harness::ControllerConfig { resync_seconds: 30.0, ..fast_config() };
    let first = c.controller("a", slow, PlannerSettings::default());
    c.server
        .wait_until(WAIT, "the first eviction", |s| {
            s.requests().iter().any(|r| r.path.ends_with("/eviction") && r.status == 201)
        })
        .await;
    first.task.abort(); // a crash: no lease release, no cleanup
    let _ = first.task.await;
    let node = c.server.get("nodes", "", &idle).expect("node still there after the crash");
    assert_eq!(node["metadata"]["annotations"][DRAIN_EVICTED], "true", "drain state is on the node");
    let second = c.controller("b", fast_config(), PlannerSettings::default());
    c.server
        .wait_until(WAIT, "the drain finished by the new leader", |s| s.get("nodes", "", &idle).is_none())
        .await;
    // Every pod of the node left through the Eviction API; one may still be terminating
    // within its grace period (the kubelet's business), none vanished otherwise.
    for pod in on_idle {
        let evicted = evictions(&c, pod, 201) == 1;
        let left = c.server.get("pods", "ml", pod);
        let terminating = left.as_ref().is_none_or(|p| p["metadata"]["deletionTimestamp"].is_string());
        assert!(
            evicted && terminating,
            "pod {pod}: evicted once through the API = {evicted}, object now: {left:?}\n{:#?}",
            eviction_log(&c)
        );
    }
    assert!(c.server.get("pods", "ml", "big").is_some());
    assert!(c.server.get("nodes", "", &busy).is_some());
    let writers: std::collections::BTreeSet<_> = c
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .filter_map(|r| r.replica.clone())
        .collect();
    let log: Vec<String> = c
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| format!("{:?} {} {}", r.replica, r.path, r.status))
        .collect();
    assert!(writers.contains("b"), "the new leader evicted the rest: {log:#?}");
    c.server
        .wait_until(WAIT, "node_deleted reported", |_| {
            second.recorder.with_prefix("node_deleted").iter().any(|l| l.contains(&idle))
        })
        .await;
    second.stop.send_replace(true);
    second.task.await.unwrap().unwrap();
    driver.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_contend_for_the_lease_and_only_the_leader_acts() {
    let c = Cluster::start(&providers(0), Settings::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let a = c.controller("a", fast_config(), no_scale_down());
    let b = c.controller("b", fast_config(), no_scale_down());
    c.server
        .wait_until(WAIT, "a lease holder", |s| {
            s.get("leases", harness::LEASE_NAMESPACE, "gpuscale-controller")
                .is_some_and(|l| l["spec"]["holderIdentity"].is_string())
        })
        .await;
    for i in 0..6 {
        c.server.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None));
    }
    c.server
        .wait_until(WAIT, "all pods running", |s| {
            (0..6).all(|i| {
                s.get("pods", "ml", &format!("train-{i}")).is_some_and(|p| p["status"]["phase"] == "Running")
            })
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lease = c.server.get("leases", harness::LEASE_NAMESPACE, "gpuscale-controller").unwrap();
    let leader = lease["spec"]["holderIdentity"].as_str().unwrap().to_string();
    let follower = if leader == "a" { "b" } else { "a" };
    // Scaled once, by the leader only: six 1-GPU pods need two 4-GPU nodes.
    assert_eq!(set_target_calls(&c), vec![(0, 2)]);
    let (lead_rec, follow_rec) =
        if leader == "a" { (&a.recorder, &b.recorder) } else { (&b.recorder, &a.recorder) };
    assert_eq!(lead_rec.with_prefix("scaled_up").len(), 1);
    assert!(
        follow_rec.lines.lock().unwrap().is_empty(),
        "the follower acted: {:?}",
        follow_rec.lines.lock().unwrap()
    );
    // The request log: the follower wrote nothing but (failed) Lease claims.
    let follower_writes: Vec<String> = c
        .server
        .requests()
        .iter()
        .filter(|r| r.replica.as_deref() == Some(follower) && r.method != "GET")
        .filter(|r| !(r.path.contains("/leases") && r.status >= 400))
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    assert!(follower_writes.is_empty(), "follower {follower} wrote: {follower_writes:?}");
    // The leader stops cleanly and releases the lease; the follower takes over.
    let (lead_replica, follow_replica) = if leader == "a" { (a, b) } else { (b, a) };
    lead_replica.stop.send_replace(true);
    lead_replica.task.await.unwrap().unwrap();
    c.server
        .wait_until(WAIT, "the follower takes the lease", |s| {
            s.get("leases", harness::LEASE_NAMESPACE, "gpuscale-controller")
                .is_some_and(|l| l["spec"]["holderIdentity"] == follower)
        })
        .await;
    follow_replica.stop.send_replace(true);
    follow_replica.task.await.unwrap().unwrap();
    driver.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_whose_nodes_never_register_are_removed_and_the_group_backed_off() {
    let c = Cluster::start(&providers(0), Settings::default()).await;
    c.register.store(false, std::sync::atomic::Ordering::Relaxed);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config = harness::ControllerConfig { registration_timeout_seconds: 2.0, ..fast_config() };
    let replica = c.controller("a", config, no_scale_down());
    c.server.create(pod_json("ml", "train-0", 1, Some("Job"), None));
    c.server.wait_until(WAIT, "a scale-up", |_| !set_target_calls(&c).is_empty()).await;
    c.server
        .wait_until(WAIT, "the unregistered instance deleted", |_| {
            c.cloud
                .operations()
                .iter()
                .any(|r| matches!(&r.op, Operation::DeleteInstances { error: None, .. }))
        })
        .await;
    // Backed off: the pod still waits, and the group is not grown again meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(set_target_calls(&c), vec![(0, 1)]);
    assert_eq!(c.group("gpu-l4").target_size, 0);
    let backoffs = replica.recorder.with_prefix("backoff: sim/gpu-l4");
    assert!(backoffs.iter().any(|l| l.contains("no node registered")), "{backoffs:?}");
    let (plan, _) = replica.recorder.last_plan.lock().unwrap().clone().expect("a plan");
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    assert!(plan.unschedulable.iter().any(|u| u.pod == "ml/train-0"), "{plan:?}");
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_publishes_the_plan_and_changes_nothing() {
    let (c, _busy, idle) = two_node_cluster(Settings::default()).await;
    c.schedule.store(false, std::sync::atomic::Ordering::Relaxed);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.server.create(pod_json("ml", "huge", 4, Some("Job"), None));
    let replica = c.controller_with("a", fast_config(), PlannerSettings::default(), true);
    c.server
        .wait_until(WAIT, "a dry-run plan with a scale-up", |_| {
            replica
                .recorder
                .last_plan
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|(p, dry)| *dry && !p.scale_ups.is_empty())
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(set_target_calls(&c).is_empty(), "dry run raised a group");
    // The plan is published (events, its own status ConfigMaps); nothing else is written, not even
    // the Lease: a dry-run replica must not keep the acting controller from leading.
    let published =
        |path: &str| path.contains("/events") || path.contains("/configmaps/gpuscale-dry-run-status");
    let writes: Vec<String> = c
        .server
        .requests()
        .iter()
        .filter(|r| r.method != "GET" && !published(&r.path))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(writes.is_empty(), "dry run wrote: {writes:?}");
    let status = c.server.get("configmaps", "kube-system", "gpuscale-dry-run-status");
    assert!(status.is_some_and(|cm| cm["data"]["dryRun"] == "true"), "the dry-run plan is published");
    assert!(
        c.server.get("configmaps", "kube-system", "gpuscale-status").is_none(),
        "the acting one's map is left alone"
    );
    assert!(
        c.server.get("leases", harness::LEASE_NAMESPACE, "gpuscale-controller").is_none(),
        "no Lease taken"
    );
    let node = c.server.get("nodes", "", &idle).unwrap();
    assert!(
        node["spec"]["unschedulable"].is_null()
            && node["metadata"]["annotations"].get(DRAIN_STARTED_AT).is_none()
    );
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

fn gang_pod(i: usize) -> serde_json::Value {
    let mut p = pod_json("ml", &format!("worker-{i}"), 1, Some("Job"), None);
    p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
    p
}

fn pod_group(min: u32) -> serde_json::Value {
    json!({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {"minMember": min}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_scales_up_all_or_nothing() {
    let c = Cluster::start(&providers(0), Settings::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.server.create(pod_group(6));
    let replica = c.controller("a", fast_config(), no_scale_down());
    for i in 0..6 {
        c.server.create(gang_pod(i));
    }
    c.server
        .wait_until(WAIT, "the whole gang running", |s| {
            (0..6).all(|i| {
                s.get("pods", "ml", &format!("worker-{i}")).is_some_and(|p| p["status"]["phase"] == "Running")
            })
        })
        .await;
    assert_eq!(set_target_calls(&c), vec![(0, 2)]);
    assert_eq!(live_instances(&c).len(), 2);
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_that_cannot_get_all_its_nodes_is_rolled_back() {
    let c = Cluster::start(&providers(0), Settings::default()).await;
    // The zone has room for one node; the gang needs two.
    c.cloud.set_zone_capacity("us-east-1a", Some(1));
    c.schedule.store(false, std::sync::atomic::Ordering::Relaxed);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.server.create(pod_group(6));
    let config = harness::ControllerConfig { gang_timeout_seconds: 2.0, ..fast_config() };
    let replica = c.controller("a", config, no_scale_down());
    for i in 0..6 {
        c.server.create(gang_pod(i));
    }
    c.server
        .wait_until(WAIT, "the gang scale-up rolled back", |_| {
            // The launched instance deleted (target 2 -> 1), then the old target restored.
            set_target_calls(&c).last().is_some_and(|&(_, to)| to == 0) && live_instances(&c).is_empty()
        })
        .await;
    assert_eq!(set_target_calls(&c)[0], (0, 2));
    c.server
        .wait_until(WAIT, "the backoff reported", |_| {
            !replica.recorder.with_prefix("backoff: sim/gpu-l4").is_empty()
        })
        .await;
    let failed = replica.recorder.with_prefix("scale_up_failed: sim/gpu-l4");
    assert!(failed.iter().any(|l| l.contains("not all gang instances ran")), "{failed:?}");
    assert!(!replica.recorder.with_prefix("backoff: sim/gpu-l4").is_empty());
    // Backed off: not raised again right away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        set_target_calls(&c).iter().filter(|(_, to)| *to > 0).count(),
        1,
        "{:?}",
        set_target_calls(&c)
    );
    replica.stop.send_replace(true);
    replica.task.await.unwrap().unwrap();
    driver.abort();
}

/// A 4-GPU group and a cheaper 1-GPU group.
fn providers_two_sizes() -> String {
    r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}
    nodeGroups:
      - {name: gpu-l4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 1}
      - {name: gpu-l4-small, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0}
"#
    .to_string()
}

fn raises_of(c: &Cluster, group: &str) -> Vec<(u32, u32)> {
    c.cloud
        .operations()
        .into_iter()
        .filter_map(|r| match r.op {
            Operation::SetTargetSize { group: g, from, to, error: None }
                if g.ends_with(group) && to > from =>
            {
                Some((from, to))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_replaced_by_a_cheaper_one_across_a_restart() {
    let c = Cluster::start(&providers_two_sizes(), Settings::default()).await;
    let old = c.register_all_ready().remove(0);
    c.server.create(pod_json("ml", "web", 1, Some("ReplicaSet"), Some(&old)));
    c.register.store(false, std::sync::atomic::Ordering::Relaxed);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let first = c.controller("a", fast_config(), PlannerSettings::default());
    // The replacement is requested: marks on the node first, then the cheap group raised.
    c.server
        .wait_until(WAIT, "the old node marked for replacement", |s| {
            s.get("nodes", "", &old).is_some_and(|n| n["metadata"]["annotations"].get(REPLACE_WITH).is_some())
        })
        .await;
    c.server.wait_until(WAIT, "the cheap group raised", |_| !raises_of(&c, "gpu-l4-small").is_empty()).await;
    // A crash while the replacement boots; the next leader must not raise the group again.
    first.task.abort();
    let second = c.controller("b", fast_config(), PlannerSettings::default());
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.register.store(true, std::sync::atomic::Ordering::Relaxed);
    // Once the new node is Ready, the old one is drained; its ReplicaSet recreates the pod, which
    // the scheduler puts on the new node; the old instance and Node go.
    c.server.wait_until(WAIT, "web evicted", |s| s.get("pods", "ml", "web").is_none()).await;
    c.server.create(pod_json("ml", "web-2", 1, Some("ReplicaSet"), None));
    c.server.wait_until(WAIT, "the old node deleted", |s| s.get("nodes", "", &old).is_none()).await;
    c.server
        .wait_until(WAIT, "web-2 running on the new node", |s| {
            s.get("pods", "ml", "web-2")
                .is_some_and(|p| p["spec"]["nodeName"].as_str().is_some_and(|n| n != old))
        })
        .await;
    assert_eq!(raises_of(&c, "gpu-l4-small"), vec![(0, 1)], "raised once, across the restart");
    // Reported as a replacement of the node, not as a scale-up triggered by its (running) pod.
    let reported = first.recorder.with_prefix("replacement_requested");
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(reported[0].starts_with(&format!("replacement_requested: {old} ")), "{reported:?}");
    assert!(reported[0].ends_with("gpu-l4-small 0->1"), "{reported:?}");
    assert!(first.recorder.with_prefix("scaled_up").is_empty(), "{:?}", first.recorder.with_prefix(""));
    c.server.wait_until(WAIT, "the old group at 0", |_| c.group("gpu-l4").target_size == 0).await;
    assert_eq!(c.group("gpu-l4-small").target_size, 1, "the replacement stays");
    assert!(second.recorder.with_prefix("drain_started").iter().any(|l| l.contains(&old)));
    second.stop.send_replace(true);
    second.task.await.unwrap().unwrap();
    driver.abort();
    harness::assert_requests_allowed_by_rbac(&c.server);
}
