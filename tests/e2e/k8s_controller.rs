//! The controller end to end on the real control plane: etcd, kube-apiserver (RBAC, audit log)
//! and kube-scheduler built from the official Go modules (`scripts/k8s-controlplane.sh`), a
//! simulated cloud whose instances register as Nodes, and controller replicas running as
//! ServiceAccounts with exactly the chart's RBAC. kube-scheduler, not gpuscale, binds the pods.

use crate::controlplane;
use crate::dra;
use crate::fixtures;
use crate::kube_cluster;

use controlplane::Options;
use gpuscale::controller::drain::{DISRUPTING_TAINT, DRAIN_EVICTED, DRAIN_REASON, DRAIN_STARTED_AT};
use gpuscale::model::InstanceState;
use gpuscale::planner::PlannerSettings;
use gpuscale::providers::simulated::Operation;
use kube_cluster::{fast_config, l4_providers, node_name, pod_json, KubeCluster};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(90);

fn no_scale_down() -> PlannerSettings {
    PlannerSettings { scale_down: false, ..Default::default() }
}

/// Evictions of `ml/<pod>` answered `code`, from the audit log.
fn evictions(c: &KubeCluster, pod: &str, code: u16) -> usize {
    c.cp.audit()
        .iter()
        .filter(|e| e.subresource == "eviction" && e.name == pod && e.namespace == "ml" && e.code == code)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_gpu_pods_scale_up_and_kube_scheduler_binds_them_on_the_new_node() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..3 {
        c.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None)).await;
    }
    c.wait_until(WAIT, "all three pods running", || all_running(&c, "train", 3)).await;
    let live = c.live_instances("gpu-l4");
    assert_eq!(live.len(), 1, "one 4-GPU node holds three 1-GPU pods: {live:?}");
    for i in 0..3 {
        assert_eq!(c.running_on(&format!("train-{i}")).await.unwrap(), node_name(&live[0]));
    }
    // Bound by kube-scheduler, not by anyone else.
    let binders: Vec<String> =
        c.cp.audit()
            .into_iter()
            .filter(|e| e.subresource == "binding" && e.code == 201)
            .map(|e| e.user)
            .collect();
    assert_eq!(binders.len(), 3, "{binders:?}");
    assert!(binders.iter().all(|u| u == "admin"), "kube-scheduler runs as admin: {binders:?}");
    // More passes run: in-flight and registered capacity is never scaled twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 1)]);
    assert_eq!(
        replica.recorder.with_prefix("scaled_up").len(),
        1,
        "{:?}",
        replica.recorder.lines.lock().unwrap()
    );
    let lease = c.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale-controller").await;
    assert_eq!(lease.expect("the Lease")["spec"]["holderIdentity"], "a");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_affine_replicas_get_a_node_each_in_one_scale_up() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..3 {
        let mut p = pod_json("ml", &format!("web-{i}"), 1, Some("ReplicaSet"), None);
        p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}});
        c.create(p).await;
    }
    c.wait_until(WAIT, "all three replicas running", || all_running(&c, "web", 3)).await;
    // One 4-GPU node would hold them by resources; kube-scheduler puts one per host, and the
    // plan asked for the three nodes at once.
    let mut hosts = Vec::new();
    for i in 0..3 {
        hosts.push(c.running_on(&format!("web-{i}")).await.unwrap());
    }
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 3)]);
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

/// Two Ready nodes: one runs a 3-GPU pod, the other a 1-GPU pod that fits beside it.
async fn two_node_cluster() -> (Arc<KubeCluster>, String, String) {
    let c = KubeCluster::start(&l4_providers(2, 4), Options::default()).await;
    let nodes = c.register_all_ready().await;
    let (busy, idle) = (nodes[0].clone(), nodes[1].clone());
    c.create(pod_json("ml", "big", 3, Some("ReplicaSet"), Some(&busy))).await;
    c.create(pod_json("ml", "web", 1, Some("ReplicaSet"), Some(&idle))).await;
    (c, busy, idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underused_node_is_drained_through_the_eviction_api_and_deleted() {
    let (c, busy, idle) = two_node_cluster().await;
    let idle_instance = c.live_instances("gpu-l4").into_iter().find(|i| node_name(i) == idle).unwrap();
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
    c.wait_until(WAIT, "the drained node deleted", || async { c.node(&idle).await.is_none() }).await;
    assert_eq!(evictions(&c, "web", 201), 1, "web left through the Eviction API");
    assert!(c.pod("big").await.is_some(), "the busy node's pod stays");
    assert!(c.node(&busy).await.is_some());
    assert_eq!(c.deleted_instances(), vec![vec![idle_instance.clone()]], "that exact instance was deleted");
    assert_eq!(c.group("gpu-l4").target_size, 1);
    assert!(replica.recorder.with_prefix("drain_started").iter().any(|l| l.contains(&idle)));
    // Events on the (cluster-scoped) node go to `default`, and the server took every event.
    let events: Vec<_> =
        c.requests_of("a").into_iter().filter(|e| e.resource == "events" && e.verb == "create").collect();
    assert!(
        events.iter().any(|e| e.namespace == "default" && e.code == 201),
        "no node event in default: {events:?}"
    );
    assert!(events.iter().all(|e| e.code < 300), "rejected events: {events:?}");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_pod_disruption_budget_blocks_the_drain() {
    let (c, _busy, idle) = two_node_cluster().await;
    // web must stay available: its budget allows no disruption.
    c.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
    // The budget's status (kept by the disruption controller) allows nothing: the plan keeps the
    // node instead of starting a drain that could not finish.
    c.wait_until(WAIT, "the node kept for the budget", || async {
        replica.recorder.last_plan.lock().unwrap().as_ref().is_some_and(|(p, _)| {
            p.kept.iter().any(|k| k.node == idle && k.reason.contains("PodDisruptionBudget ml/web"))
        })
    })
    .await;
    assert_eq!(evictions(&c, "web", 201) + evictions(&c, "web", 429), 0, "no drain started");
    // A previous leader had already started draining it and begun evicting: the real Eviction API
    // refuses with 429 for as long as the budget holds.
    let patch = json!({
        "metadata": {"annotations": {
            DRAIN_STARTED_AT: k8s_openapi::jiff::Timestamp::now().to_string(),
            DRAIN_REASON: "GPU allocation 25% < 50%",
            DRAIN_EVICTED: "true",
        }},
        "spec": {"unschedulable": true, "taints": [{"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"}]}
    });
    c.cp.raw_patch(&format!("/api/v1/nodes/{idle}"), &patch).await;
    c.wait_until(WAIT, "a refused eviction", || async { evictions(&c, "web", 429) >= 1 }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(evictions(&c, "web", 201), 0);
    let web = c.pod("web").await.expect("web stays");
    assert_eq!(web["spec"]["nodeName"], idle.as_str());
    assert!(web["metadata"]["deletionTimestamp"].is_null());
    let node = c.node(&idle).await.expect("the node stays");
    assert_eq!(node["spec"]["unschedulable"], true, "cordoned while the drain waits");
    assert!(c.deleted_instances().is_empty());
    assert!(!replica.recorder.with_prefix("eviction_blocked: ml/web").is_empty());
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restart_mid_drain_resumes_without_losing_pods() {
    let (c, busy, idle) = two_node_cluster().await;
    for i in 0..3 {
        c.create(pod_json("ml", &format!("side-{i}"), 0, Some("ReplicaSet"), Some(&idle))).await;
    }
    // A previous leader started draining the node and evicted web, then crashed.
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.wait_until(WAIT, "pods running", || async { c.running_on("side-2").await.is_some() }).await;
    let patch = json!({
        "metadata": {"annotations": {
            DRAIN_STARTED_AT: k8s_openapi::jiff::Timestamp::now().to_string(),
            DRAIN_REASON: "GPU allocation 25% < 50%",
            DRAIN_EVICTED: "true",
        }},
        "spec": {"unschedulable": true, "taints": [{"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"}]}
    });
    c.cp.raw_patch(&format!("/api/v1/nodes/{idle}"), &patch).await;
    c.cp.raw(
        "POST",
        "/api/v1/namespaces/ml/pods/web/eviction",
        Some(json!({
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web", "namespace": "ml"}
        })),
    )
    .await
    .expect("the old leader's eviction");
    let replica = c.controller("b", fast_config(), PlannerSettings::default(), false).await;
    c.wait_until(WAIT, "the drain finished by the new leader", || async { c.node(&idle).await.is_none() })
        .await;
    for pod in ["side-0", "side-1", "side-2"] {
        assert_eq!(evictions(&c, pod, 201), 1, "{pod} left once through the Eviction API");
    }
    assert_eq!(evictions(&c, "web", 201), 1, "web was not evicted twice");
    assert!(c.pod("big").await.is_some());
    assert!(c.node(&busy).await.is_some());
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_real_lease_and_only_the_leader_acts() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let a = c.controller("a", fast_config(), no_scale_down(), false).await;
    let b = c.controller("b", fast_config(), no_scale_down(), false).await;
    let lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale-controller";
    c.wait_until(WAIT, "a lease holder", || async {
        c.get(lease_path).await.is_some_and(|l| l["spec"]["holderIdentity"].is_string())
    })
    .await;
    for i in 0..6 {
        c.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None)).await;
    }
    c.wait_until(WAIT, "all pods running", || all_running(&c, "train", 6)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = c.get(lease_path).await.unwrap()["spec"]["holderIdentity"].as_str().unwrap().to_string();
    let follower = if leader == "a" { "b" } else { "a" };
    assert_eq!(c.set_target_calls(), vec![(0, 2)], "scaled once, by the leader");
    // The follower wrote nothing but failed Lease claims (the audit log is the server's word).
    let writes: Vec<String> = c
        .requests_of(follower)
        .into_iter()
        .filter(|e| !matches!(e.verb.as_str(), "get" | "list" | "watch"))
        .filter(|e| !(e.resource == "leases" && e.code >= 400))
        .filter(|e| !(e.resource == "serviceaccounts" && e.subresource == "token"))
        .map(|e| format!("{} {} -> {}", e.verb, e.uri, e.code))
        .collect();
    assert!(writes.is_empty(), "follower {follower} wrote: {writes:#?}");
    let (lead, follow) = if leader == "a" { (a, b) } else { (b, a) };
    lead.shutdown().await.unwrap();
    c.wait_until(WAIT, "the follower takes the lease", || async {
        c.get(lease_path).await.is_some_and(|l| l["spec"]["holderIdentity"] == follower)
    })
    .await;
    follow.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
    c.assert_rbac_allowed("b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_plans_on_the_real_server_and_writes_nothing_but_its_status() {
    let (c, _busy, _idle) = two_node_cluster().await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.create(pod_json("ml", "huge", 4, Some("Job"), None)).await;
    let replica = c.controller("a", fast_config(), PlannerSettings::default(), true).await;
    c.wait_until(WAIT, "a dry-run plan with a scale-up", || async {
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
    assert!(c.set_target_calls().is_empty(), "dry run raised a group");
    let writes: Vec<String> = c
        .requests_of("a")
        .into_iter()
        .filter(|e| !matches!(e.verb.as_str(), "get" | "list" | "watch"))
        .filter(|e| !matches!(e.resource.as_str(), "events" | "configmaps"))
        .map(|e| format!("{} {} -> {}", e.verb, e.uri, e.code))
        .collect();
    assert!(writes.is_empty(), "dry run wrote: {writes:#?}");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_charts_rbac_the_controller_fails_loudly() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options { scheduler: false, ..Default::default() }).await;
    let client = c.controller_client("norbac", false).await;
    let replica =
        fixtures::spawn_replica(client, c.cloud.clone(), "norbac", fast_config(), no_scale_down(), false);
    let result = tokio::time::timeout(Duration::from_secs(30), replica.task)
        .await
        .expect("the controller must stop, not wait forever on forbidden watches")
        .expect("no panic");
    let err = result.expect_err("the controller must fail without RBAC").to_string();
    assert!(err.contains("forbidden") || err.contains("403"), "{err}");
    let denied = c.requests_of("norbac").iter().filter(|e| e.code == 403).count();
    assert!(denied > 0, "the real authorizer refused it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_scale_up_is_all_or_nothing_on_the_real_server() {
    // Three 4-GPU workers of one gang need three nodes; the group can grow by two at most.
    let c = KubeCluster::start(&l4_providers(0, 2), Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..3 {
        let mut p = pod_json("ml", &format!("gang-{i}"), 4, Some("Job"), None);
        p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
        c.create(p).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        c.set_target_calls().is_empty(),
        "a gang that cannot fit whole scales nothing: {:?}",
        c.set_target_calls()
    );
    let (plan, _) = replica.recorder.last_plan.lock().unwrap().clone().expect("a plan");
    assert!(plan.scale_ups.is_empty(), "{plan:?}");
    for i in 0..3 {
        assert!(c.running_on(&format!("gang-{i}")).await.is_none());
    }
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

/// A hundred pending whole-GPU pods: the time from their creation until kube-scheduler has bound
/// every one on nodes gpuscale added (simulated boot 10 s at 10x speed, Ready 0.3 s after
/// registration). Printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_pending_gpu_pods_are_bound_on_added_nodes() {
    let c = KubeCluster::start(&l4_providers(0, 30), Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    let began = Instant::now();
    for i in 0..100 {
        c.create(pod_json("ml", &format!("batch-{i}"), 1, Some("Job"), None)).await;
    }
    let created = began.elapsed();
    c.wait_until(Duration::from_secs(240), "all 100 pods bound", || async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(c.cp.admin.clone(), "ml");
        let list = pods.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        list.iter().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some())).count() == 100
    })
    .await;
    let all_bound = began.elapsed();
    let nodes = c.live_instances("gpu-l4").len();
    println!(
        "100 pending 1-GPU pods: created in {:.2} s, all bound by kube-scheduler on {nodes} added 4-GPU nodes after {:.2} s \
         (scale-ups: {:?})",
        created.as_secs_f64(),
        all_bound.as_secs_f64(),
        c.set_target_calls()
    );
    assert_eq!(nodes, 25, "100 one-GPU pods need 25 four-GPU nodes");
    assert!(c.group("gpu-l4").instances.iter().all(|i| i.state == InstanceState::Running), "none given up");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

/// The pods `<prefix>-0..n` all Running.
async fn all_running(c: &KubeCluster, prefix: &str, n: usize) -> bool {
    for i in 0..n {
        if c.running_on(&format!("{prefix}-{i}")).await.is_none() {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_crash_mid_scale_up_with_compacted_history_neither_loses_nor_doubles() {
    // Watches go to etcd, so a watch resumed below the compacted revision gets `410 Gone`.
    let c =
        KubeCluster::start(&l4_providers(0, 4), Options { watch_cache: false, ..Default::default() }).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 2);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..3 {
        c.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None)).await;
    }
    c.wait_until(WAIT, "the scale-up", || async { !c.set_target_calls().is_empty() }).await;
    // The instance boots (20 s of cloud time at 2x) while the API server is down and etcd's history
    // moves past what the controller's watches saw.
    let restarted_at = c.cp.audit().len();
    c.cp.restart_apiserver_compacting(Duration::from_secs(2)).await;
    for i in 3..7 {
        c.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None)).await;
    }
    c.wait_until(WAIT, "all seven pods running", || all_running(&c, "train", 7)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.set_target_calls(),
        vec![(0, 1), (1, 2)],
        "seven 1-GPU pods: two 4-GPU nodes, each asked for once"
    );
    // The controller's watches came back by listing again (the 410 path), not by resuming.
    let relists: Vec<String> = c.cp.audit()[restarted_at..]
        .iter()
        .filter(|e| e.user == KubeCluster::user("a") && e.verb == "list" && e.resource == "pods")
        .map(|e| e.uri.clone())
        .collect();
    assert!(!relists.is_empty(), "no relist of pods after the compaction");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_api_server_slows_the_controller_but_it_converges() {
    // Two requests in flight at most (the built-in limiter, priority and fairness off): the
    // controller, kube-scheduler and the kubelets all get 429s with Retry-After.
    let c =
        KubeCluster::start(&l4_providers(0, 4), Options { max_requests_inflight: 2, ..Default::default() })
            .await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..6 {
        c.create(pod_json("ml", &format!("train-{i}"), 1, Some("Job"), None)).await;
    }
    c.wait_until(Duration::from_secs(180), "all six pods running", || all_running(&c, "train", 6)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 2)]);
    let throttled = c.cp.audit().iter().filter(|e| e.code == 429).count();
    println!("throttled requests (429) across all clients: {throttled}");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

fn gang_pod(i: usize) -> serde_json::Value {
    let mut p = pod_json("ml", &format!("worker-{i}"), 2, Some("Job"), None);
    p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_scales_up_at_once_and_kube_scheduler_binds_every_member() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..4 {
        c.create(gang_pod(i)).await;
    }
    c.wait_until(WAIT, "the whole gang running", || all_running(&c, "worker", 4)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 2)], "four 2-GPU workers: two 4-GPU nodes in one step");
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_that_cannot_get_all_its_nodes_is_rolled_back() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    // The zone has room for one node; the gang needs two.
    c.cloud.set_zone_capacity("us-east-1a", Some(1));
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config = kube_cluster::ControllerConfig { gang_timeout_seconds: 2.0, ..fast_config() };
    let replica = c.controller("a", config, no_scale_down(), false).await;
    for i in 0..4 {
        c.create(gang_pod(i)).await;
    }
    c.wait_until(WAIT, "the gang scale-up rolled back", || async {
        c.set_target_calls().last().is_some_and(|&(_, to)| to == 0) && c.live_instances("gpu-l4").is_empty()
    })
    .await;
    assert_eq!(c.set_target_calls()[0], (0, 2));
    c.wait_until(WAIT, "the backoff reported", || async {
        !replica.recorder.with_prefix("backoff: sim/gpu-l4").is_empty()
    })
    .await;
    let failed = replica.recorder.with_prefix("scale_up_failed: sim/gpu-l4");
    assert!(failed.iter().any(|l| l.contains("not all gang instances ran")), "{failed:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.set_target_calls().iter().filter(|(_, to)| *to > 0).count(),
        1,
        "backed off: {:?}",
        c.set_target_calls()
    );
    for i in 0..4 {
        assert!(c.running_on(&format!("worker-{i}")).await.is_none(), "no member runs alone");
    }
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_whose_nodes_never_register_are_removed_and_the_group_backed_off() {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    c.register.store(false, std::sync::atomic::Ordering::Relaxed);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config = kube_cluster::ControllerConfig { registration_timeout_seconds: 2.0, ..fast_config() };
    let replica = c.controller("a", config, no_scale_down(), false).await;
    c.create(pod_json("ml", "train-0", 1, Some("Job"), None)).await;
    c.wait_until(WAIT, "a scale-up", || async { !c.set_target_calls().is_empty() }).await;
    c.wait_until(WAIT, "the unregistered instance deleted", || async { !c.deleted_instances().is_empty() })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 1)], "backed off, not grown again");
    assert_eq!(c.group("gpu-l4").target_size, 0);
    let backoffs = replica.recorder.with_prefix("backoff: sim/gpu-l4");
    assert!(backoffs.iter().any(|l| l.contains("no node registered")), "{backoffs:?}");
    let (plan, _) = replica.recorder.last_plan.lock().unwrap().clone().expect("a plan");
    assert!(
        plan.scale_ups.is_empty() && plan.unschedulable.iter().any(|u| u.pod == "ml/train-0"),
        "{plan:?}"
    );
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_replaced_by_a_cheaper_one_across_a_controller_restart() {
    let yaml = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}
    nodeGroups:
      - {name: gpu-l4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 1}
      - {name: gpu-l4-small, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0}
"#;
    let raises = |c: &KubeCluster, group: &str| -> Vec<(u32, u32)> {
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
    };
    let c = KubeCluster::start(yaml, Options::default()).await;
    let old = c.register_all_ready().await.remove(0);
    c.create(pod_json("ml", "web", 1, Some("ReplicaSet"), Some(&old))).await;
    c.register.store(false, std::sync::atomic::Ordering::Relaxed);
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let first = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
    c.wait_until(WAIT, "the cheap group raised", || async { !raises(&c, "gpu-l4-small").is_empty() }).await;
    // A crash while the replacement boots; the next leader must not raise the group again.
    first.task.abort();
    let second = c.controller("b", fast_config(), PlannerSettings::default(), false).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.register.store(true, std::sync::atomic::Ordering::Relaxed);
    // The old node drains once the new one is Ready; the ReplicaSet's new pod (created here, as
    // no controller manager runs, the moment the eviction marks web for deletion, as the
    // ReplicaSet controller does) is bound by kube-scheduler on the new node. Created any later,
    // the new node would be empty for longer than the unneeded time and rightly scaled down.
    c.wait_until(WAIT, "web evicted", || async {
        c.pod("web").await.is_none_or(|p| p["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    c.create(pod_json("ml", "web-2", 1, Some("ReplicaSet"), None)).await;
    c.wait_until(WAIT, "the old node deleted", || async { c.node(&old).await.is_none() }).await;
    c.wait_until(WAIT, "web-2 running on the new node", || async {
        c.running_on("web-2").await.is_some_and(|n| n != old)
    })
    .await;
    let small_ops: Vec<String> = c
        .cloud
        .operations()
        .into_iter()
        .filter(|r| format!("{:?}", r.op).contains("gpu-l4-small"))
        .map(|r| format!("{:?}", r.op))
        .collect();
    assert_eq!(raises(&c, "gpu-l4-small"), vec![(0, 1)], "raised once, across the restart: {small_ops:#?}");
    let reported = first.recorder.with_prefix("replacement_requested");
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(first.recorder.with_prefix("scaled_up").is_empty());
    c.wait_until(WAIT, "the old group at 0", || async { c.group("gpu-l4").target_size == 0 }).await;
    assert_eq!(c.group("gpu-l4-small").target_size, 1, "the replacement stays");
    second.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
    c.assert_rbac_allowed("b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_crash_mid_drain_neither_loses_pods_nor_deletes_twice() {
    let (c, busy, idle) = two_node_cluster().await;
    for i in 0..3 {
        let mut p = pod_json("ml", &format!("side-{i}"), 0, Some("ReplicaSet"), Some(&idle));
        // Pods that take their grace period to go, so the drain is caught in the middle.
        p["spec"]["terminationGracePeriodSeconds"] = json!(3);
        c.create(p).await;
    }
    let idle_instance = c.live_instances("gpu-l4").into_iter().find(|i| node_name(i) == idle).unwrap();
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
    c.wait_until(WAIT, "the first eviction", || async {
        c.cp.audit().iter().any(|e| e.subresource == "eviction" && e.code == 201)
    })
    .await;
    c.cp.restart_apiserver(Duration::from_secs(2)).await;
    c.wait_until(WAIT, "the drained node deleted", || async { c.node(&idle).await.is_none() }).await;
    // An eviction the crash cut off may have taken effect with no answered record of it: then
    // the pod left through it (it is gone or terminating) and was not evicted again.
    let cut_off: Vec<_> =
        c.cp.unanswered()
            .into_iter()
            .filter(|e| e.subresource == "eviction" && e.namespace == "ml")
            .collect();
    for pod in ["web", "side-0", "side-1", "side-2"] {
        let cut = cut_off.iter().filter(|e| e.name == pod).count();
        let left = c.pod(pod).await.is_none_or(|p| p["metadata"]["deletionTimestamp"].is_string());
        match evictions(&c, pod, 201) {
            1 => {}
            0 => {
                assert!(cut == 1 && left, "{pod} left through the Eviction API ({cut} cut off, left: {left})")
            }
            n => panic!("{pod} evicted {n} times"),
        }
    }
    assert!(c.pod("big").await.is_some() && c.node(&busy).await.is_some(), "the busy node and its pod stay");
    assert_eq!(c.deleted_instances(), vec![vec![idle_instance]], "the instance deleted once");
    assert_eq!(c.group("gpu-l4").target_size, 1);
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

/// A pod asking for `resource` (a MIG profile or a time-sliced replica), tolerating GPU taints.
fn shared_gpu_pod(name: &str, resource: &str) -> serde_json::Value {
    let mut p = pod_json("ml", name, 0, Some("Job"), None);
    p["spec"]["containers"][0]["resources"]["requests"][resource] = json!("1");
    p["spec"]["containers"][0]["resources"]["limits"][resource] = json!("1");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_and_time_sliced_groups_scale_for_their_pods_and_kube_scheduler_binds_them() {
    let yaml = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}
    nodeGroups:
      - {name: a100-mig, instanceType: p4d.24xlarge, zones: [us-east-1a], minSize: 0, maxSize: 2, targetSize: 0,
         gpuSharing: {mig: all-1g.5gb}}
      - {name: l4-ts, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 2, targetSize: 0,
         gpuSharing: {timeSlicing: {replicas: 4}}}
"#;
    let c = KubeCluster::start(yaml, Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..3 {
        c.create(shared_gpu_pod(&format!("mig-{i}"), "nvidia.com/mig-1g.5gb")).await;
        c.create(shared_gpu_pod(&format!("ts-{i}"), "nvidia.com/gpu")).await;
    }
    c.wait_until(WAIT, "the MIG and time-sliced pods running", || async {
        all_running(&c, "mig", 3).await && all_running(&c, "ts", 3).await
    })
    .await;
    // One node of each: 56 1g.5gb slices hold three, four replicas of one L4 hold three.
    assert_eq!(c.live_instances("a100-mig").len(), 1);
    assert_eq!(c.live_instances("l4-ts").len(), 1);
    let on = |prefix: &'static str| {
        let c = &c;
        async move {
            let mut nodes = std::collections::BTreeSet::new();
            for i in 0..3 {
                nodes.insert(c.running_on(&format!("{prefix}-{i}")).await.unwrap());
            }
            nodes
        }
    };
    assert_eq!(on("mig").await, [node_name(&c.live_instances("a100-mig")[0])].into());
    assert_eq!(on("ts").await, [node_name(&c.live_instances("l4-ts")[0])].into());
    replica.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

/// A TCP proxy to `upstream` that can be cut: once cut, it forwards nothing more on open
/// connections and holds new ones without answering (a network partition, not a refusal, so
/// requests hang rather than fail fast).
async fn cuttable_proxy(upstream: String) -> (String, tokio::sync::watch::Sender<bool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    async fn pipe(
        mut from: OwnedReadHalf,
        mut to: OwnedWriteHalf,
        mut cut: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 16384];
        loop {
            let n = tokio::select! {
                r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
                _ = cut.wait_for(|c| *c) => 0,
            };
            if *cut.borrow() {
                // Partitioned: keep both sockets open, move nothing.
                let _held = (from, to);
                std::future::pending::<()>().await;
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let (cut_tx, cut) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let cut = cut.clone();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if *cut.borrow() {
                    let _held = client;
                    return std::future::pending::<()>().await;
                }
                let Ok(server) = tokio::net::TcpStream::connect(upstream.as_str()).await else { return };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, cut.clone()));
                tokio::spawn(pipe(sr, cw, cut));
            });
        }
    });
    (url, cut_tx)
}

fn cloud_writes(c: &KubeCluster) -> usize {
    c.cloud
        .operations()
        .into_iter()
        .filter(|r| matches!(r.op, Operation::SetTargetSize { .. } | Operation::DeleteInstances { .. }))
        .count()
}

const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale-controller";
const GANGS_PATH: &str = "/api/v1/namespaces/kube-system/configmaps/gpuscale-controller-gangs";
/// The gang deadline of the fencing tests: long enough for the takeover to come first.
const FENCE_GANG_TIMEOUT_SECONDS: f64 = 8.0;

/// The cluster of the fencing tests: one group of 4-GPU nodes whose zone has room for one.
async fn fencing_cluster() -> Arc<KubeCluster> {
    let c = KubeCluster::start(&l4_providers(0, 4), Options::default()).await;
    c.cloud.set_zone_capacity("us-east-1a", Some(1));
    c
}

/// The fencing scenario on a [`fencing_cluster`] up to the moment of the fault: replica `a` (its
/// API connection through `a_via` if given) holds the Lease, `b` follows, and `a` has raised the
/// group for a 4-member gang that can never get its second node and recorded the gang scale-up.
/// Returns the cluster's driver and the replicas `a` and `b`.
async fn a_leads_a_gang_scale_up_that_can_only_roll_back(
    c: &Arc<KubeCluster>,
    a_via: Option<&str>,
) -> (tokio::task::JoinHandle<()>, kube_cluster::Replica, kube_cluster::Replica) {
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let config =
        kube_cluster::ControllerConfig { gang_timeout_seconds: FENCE_GANG_TIMEOUT_SECONDS, ..fast_config() };
    let a = match a_via {
        Some(via) => c.controller_via(via, "a", config.clone(), no_scale_down()).await,
        None => c.controller("a", config.clone(), no_scale_down(), false).await,
    };
    c.wait_until(WAIT, "a holds the lease", || async {
        c.get(LEASE_PATH).await.is_some_and(|l| l["spec"]["holderIdentity"] == "a")
    })
    .await;
    let b = c.controller("b", config, no_scale_down(), false).await;
    for i in 0..4 {
        c.create(gang_pod(i)).await;
    }
    c.wait_until(WAIT, "a raised the group for the gang and recorded it", || async {
        !c.set_target_calls().is_empty()
            && c.get(GANGS_PATH).await.is_some_and(|cm| cm["data"]["sim_gpu-l4"].is_string())
    })
    .await;
    assert_eq!(c.set_target_calls(), vec![(0, 2)]);
    let record: serde_json::Value =
        serde_json::from_str(c.get(GANGS_PATH).await.unwrap()["data"]["sim_gpu-l4"].as_str().unwrap())
            .unwrap();
    assert_eq!(record["groups"][0]["oldTarget"], 0);
    assert_eq!(record["groups"][0]["to"], 2);
    (driver, a, b)
}

/// After the fault: nobody writes to the cloud until `b` holds the Lease; then `b` (and only `b`)
/// rolls the gang back, once: one raise, one restore, one delete, the record removed, and `a`
/// reported no rollback even past its own gang deadline.
async fn b_takes_over_and_alone_rolls_the_gang_back_once(
    c: &KubeCluster,
    a: &kube_cluster::Replica,
    b: &kube_cluster::Replica,
    writes_at_fault: usize,
) {
    c.wait_until(WAIT, "b takes the lease over", || async {
        c.get(LEASE_PATH).await.is_some_and(|l| l["spec"]["holderIdentity"] == "b")
    })
    .await;
    assert_eq!(
        cloud_writes(c),
        writes_at_fault,
        "nobody wrote to the cloud between the fault and the takeover: {:?}",
        c.cloud.operations()
    );
    c.wait_until(WAIT, "the gang rolled back", || async {
        c.set_target_calls().last().is_some_and(|&(_, to)| to == 0) && c.live_instances("gpu-l4").is_empty()
    })
    .await;
    c.wait_until(WAIT, "the gang record removed", || async {
        c.get(GANGS_PATH).await.is_some_and(|cm| cm["data"].get("sim_gpu-l4").is_none())
    })
    .await;
    // Past a's own gang deadline: a leader that kept acting would have rolled back by now as well.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let targets = c.set_target_calls();
    assert_eq!(targets.len(), 2, "one raise by a, one restore by b: {targets:?}");
    assert_eq!(targets[1].1, 0);
    assert_eq!(
        c.deleted_instances().len(),
        1,
        "the launched instance deleted once: {:?}",
        c.deleted_instances()
    );
    let rolled_back = |r: &fixtures::Recorder| {
        r.with_prefix("scale_up_failed: sim/gpu-l4")
            .iter()
            .filter(|l| l.contains("not all gang instances ran"))
            .count()
    };
    assert_eq!(rolled_back(&b.recorder), 1, "b rolled the gang back: {:?}", b.recorder.lines.lock().unwrap());
    assert_eq!(rolled_back(&a.recorder), 0, "a stopped: {:?}", a.recorder.lines.lock().unwrap());
}

/// Leadership after a full partition: leader `a` is cut off from the API server mid gang scale-up
/// (a TCP proxy that stops forwarding, so all its requests hang). The new leader finds the
/// gang's record and rolls it back, once, and nobody writes to the shared cloud in between.
///
/// This shows the takeover and the resumed rollback, not the fence: the partition itself keeps
/// `a` from every API write, including the record update its rollback must make first, so `a`
/// could not act here even unfenced. The fence is shown by
/// `a_leader_whose_lease_renewals_are_refused_mid_gang_scale_up_stops_and_the_new_leader_rolls_back_once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_partitioned_mid_gang_scale_up_stops_and_the_new_leader_rolls_back_once() {
    let c = fencing_cluster().await;
    let (via, cut) = cuttable_proxy(c.cp.url.trim_start_matches("https://").to_string()).await;
    let (driver, a, b) = a_leads_a_gang_scale_up_that_can_only_roll_back(&c, Some(&via)).await;
    // Partition a. It may act for at most its renew deadline (1.4 s) after its last renewal
    // began; b may take over only after seeing the Lease unrenewed for 2 s.
    cut.send_replace(true);
    let writes_at_cut = cloud_writes(&c);
    b_takes_over_and_alone_rolls_the_gang_back_once(&c, &a, &b, writes_at_cut).await;
    // a cannot release the Lease through the partition: a crash, as far as the cluster knows.
    a.task.abort();
    b.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("b");
}

const DRA_PROVIDERS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 3}
    nodeGroups:
      - {name: gpu-h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0, dra: {}}
      - {name: gpu-l4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0, dra: {}}
"#;

/// A cluster of [`DRA_PROVIDERS`] with NVIDIA's DeviceClasses, and NVIDIA's DRA driver as a test
/// task: each Ready node of the H100 group publishes its eight GPUs in a ResourceSlice once (as
/// the kubelet plugin does once the node is up). Returns the cluster, the task and the nodes it
/// published for, in order.
async fn dra_cluster() -> (Arc<KubeCluster>, tokio::task::JoinHandle<()>, Arc<std::sync::Mutex<Vec<String>>>)
{
    dra_cluster_of(DRA_PROVIDERS, Options::default()).await
}

/// [`dra_cluster`] of other groups and control plane options.
async fn dra_cluster_of(
    providers: &str,
    options: Options,
) -> (Arc<KubeCluster>, tokio::task::JoinHandle<()>, Arc<std::sync::Mutex<Vec<String>>>) {
    let c = KubeCluster::start(providers, options).await;
    for class in dra::device_classes() {
        c.create(class).await;
    }
    let published = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let task = {
        let (c, published) = (c.clone(), published.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Ok(nodes) = c.cp.raw("GET", "/api/v1/nodes", None).await else { continue };
                for n in nodes["items"].as_array().cloned().unwrap_or_default() {
                    let name = n["metadata"]["name"].as_str().unwrap_or_default().to_string();
                    let ready = n["status"]["conditions"]
                        .as_array()
                        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
                    let h100 = n["metadata"]["labels"]["gpuscale.io/node-group"] == "gpu-h100";
                    if !ready || !h100 || published.lock().unwrap().contains(&name) {
                        continue;
                    }
                    let mut slice = dra::slice(&name, dra::gpus(8, dra::H100));
                    // Owned by its Node, as the kubelet plugin writes it (the garbage collector
                    // removes slices whose owner is gone).
                    slice["metadata"]["ownerReferences"][0]["uid"] = n["metadata"]["uid"].clone();
                    let path = "/apis/resource.k8s.io/v1/resourceslices";
                    if c.cp.raw("POST", path, Some(slice)).await.is_ok() {
                        published.lock().unwrap().push(name);
                    }
                }
            }
        })
    };
    (c, task, published)
}

/// The devices kube-scheduler allocated to claim `ml/<name>`, as (pool, device).
async fn allocated_devices(c: &KubeCluster, name: &str) -> Vec<(String, String)> {
    let claim =
        c.get(&format!("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{name}")).await.unwrap();
    let results = claim["status"]["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default();
    results
        .iter()
        .map(|r| {
            (r["pool"].as_str().unwrap_or_default().into(), r["device"].as_str().unwrap_or_default().into())
        })
        .collect()
}

/// A pod asking for eight GPUs through a claim (NVIDIA's `gpu.nvidia.com` class, no model named)
/// scales the one group whose nodes have eight (the L4 group's have four), once: the new node is
/// in flight until its DRA driver publishes its ResourceSlice, then kube-scheduler allocates the
/// claim on it and binds the pod there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_claim_scales_its_group_once_and_kube_scheduler_binds_it_on_the_new_node() {
    let (c, dra_driver, published) = dra_cluster().await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    c.create(dra::claim("eight", "gpu.nvidia.com", 8)).await;
    c.create(dra::pod("want8", "eight", false)).await;

    c.wait_until(WAIT, "the pod running", || async { c.running_on("want8").await.is_some() }).await;
    let live = c.live_instances("gpu-h100");
    assert_eq!(live.len(), 1, "{live:?}");
    assert!(c.live_instances("gpu-l4").is_empty());
    let node = node_name(&live[0]);
    assert_eq!(c.running_on("want8").await.unwrap(), node);
    assert_eq!(*published.lock().unwrap(), vec![node.clone()]);
    // kube-scheduler allocated the claim's eight devices on that node.
    let devices = allocated_devices(&c, "eight").await;
    assert_eq!(devices.len(), 8, "{devices:?}");
    assert!(devices.iter().all(|(pool, _)| pool == &node), "{devices:?}");
    // More passes run: the node that waited for its slice was never scaled for twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 1)]);
    replica.shutdown().await.unwrap();
    driver.abort();
    dra_driver.abort();
    c.assert_rbac_allowed("a");
}

/// A gang of four pods, each asking for eight GPUs through its own claim: one all-or-nothing
/// scale-up of the H100 group by four, and kube-scheduler allocates every claim on its own new
/// node once the slices are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_of_dra_pods_scales_its_group_at_once_and_every_member_is_bound() {
    let (c, dra_driver, published) = dra_cluster().await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let replica = c.controller("a", fast_config(), no_scale_down(), false).await;
    for i in 0..4 {
        c.create(dra::claim(&format!("eight-{i}"), "gpu.nvidia.com", 8)).await;
        let mut p = dra::pod(&format!("trainer-{i}"), &format!("eight-{i}"), false);
        p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("llm");
        c.create(p).await;
    }
    c.wait_until(WAIT, "the whole gang running", || all_running(&c, "trainer", 4)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 4)], "one all-or-nothing step of four nodes");
    assert!(replica.recorder.with_prefix("scaled_up").iter().all(|l| l.contains("gpu-h100")));
    let mut nodes = Vec::new();
    for i in 0..4 {
        let on = c.running_on(&format!("trainer-{i}")).await.unwrap();
        let devices = allocated_devices(&c, &format!("eight-{i}")).await;
        assert_eq!(devices.len(), 8, "{devices:?}");
        assert!(devices.iter().all(|(pool, _)| pool == &on), "claim eight-{i} on {on}: {devices:?}");
        nodes.push(on);
    }
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 4, "one member per new node: {nodes:?}");
    assert_eq!(published.lock().unwrap().len(), 4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 4)], "never scaled again");
    replica.shutdown().await.unwrap();
    driver.abort();
    dra_driver.abort();
    c.assert_rbac_allowed("a");
}

/// A ReplicaSet of one pod that gets `gpus` GPUs through a claim generated from its own
/// ResourceClaimTemplate (both named `name`).
fn dra_replica_set(name: &str, gpus: u32) -> [serde_json::Value; 2] {
    let pod = dra::pod(name, name, true);
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}}});
    [dra::template(name, "gpu.nvidia.com", gpus, &[]), rs]
}

/// The pods of ReplicaSet `name` that run, with their nodes and the claims generated for them.
async fn replica_pods(c: &KubeCluster, name: &str) -> Vec<(String, String, String)> {
    let list = c.get("/api/v1/namespaces/ml/pods").await.unwrap();
    let mut out = Vec::new();
    for p in list["items"].as_array().unwrap() {
        let owned = p["metadata"]["ownerReferences"][0]["name"] == name;
        let running = p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null();
        if owned && running {
            out.push((
                p["metadata"]["name"].as_str().unwrap().to_string(),
                p["spec"]["nodeName"].as_str().unwrap_or_default().to_string(),
                p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
    }
    out
}

/// Scale-down moves a DRA pod where its claim fits again, end to end with kube-controller-
/// manager's resourceclaim, replicaset and garbage collector controllers: two H100 nodes, one with a 6-GPU pod, the
/// other with a 2-GPU one (25% used). gpuscale drains the second; the ReplicaSet's new pod gets a
/// new claim from the template, kube-scheduler allocates it on the first node's free GPUs, the
/// old claim is deallocated and deleted with its pod, and that exact instance is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underused_dra_node_is_drained_and_its_pods_claim_is_allocated_again_elsewhere() {
    let h100 = "{name: gpu-h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: ";
    assert!(DRA_PROVIDERS.contains(&format!("{h100}0")));
    let providers = DRA_PROVIDERS.replace(&format!("{h100}0"), &format!("{h100}2"));
    let controllers =
        vec!["resourceclaim-controller", "replicaset-controller", "garbage-collector-controller"];
    let (c, dra_driver, published) =
        dra_cluster_of(&providers, Options { controllers, ..Default::default() }).await;
    let nodes = c.register_all_ready().await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    c.wait_until(WAIT, "both slices published", || async { published.lock().unwrap().len() == 2 }).await;
    let cordon = |node: &str, on: bool| {
        let (c, path) = (c.clone(), format!("/api/v1/nodes/{node}"));
        async move { c.cp.raw_patch(&path, &json!({"spec": {"unschedulable": on}})).await }
    };
    // small goes to the second node, big to the first (the other one cordoned meanwhile).
    let (first, second) = (nodes[0].clone(), nodes[1].clone());
    for (name, gpus, on, off) in [("small", 2, &second, &first), ("big", 6, &first, &second)] {
        cordon(off, true).await;
        for o in dra_replica_set(name, gpus) {
            c.create(o).await;
        }
        c.wait_until(WAIT, name, || async { replica_pods(&c, name).await.len() == 1 }).await;
        assert_eq!(&replica_pods(&c, name).await[0].1, on);
        cordon(off, false).await;
    }
    let (old_pod, _, old_claim) = replica_pods(&c, "small").await.remove(0);
    let second_instance = c.live_instances("gpu-h100").into_iter().find(|i| node_name(i) == second).unwrap();

    let settings = PlannerSettings { scale_down_utilization: 0.5, ..Default::default() };
    let replica = c.controller("a", fast_config(), settings, false).await;
    c.wait_until(WAIT, "the underused node deleted", || async { c.node(&second).await.is_none() }).await;
    c.wait_until(WAIT, "small running again", || async {
        replica_pods(&c, "small").await.first().is_some_and(|(p, n, _)| p != &old_pod && n == &first)
    })
    .await;
    assert_eq!(evictions(&c, &old_pod, 201), 1, "the pod left through the Eviction API");
    let (_, _, new_claim) = replica_pods(&c, "small").await.remove(0);
    assert_ne!(new_claim, old_claim);
    let devices = allocated_devices(&c, &new_claim).await;
    assert_eq!(devices.len(), 2, "{devices:?}");
    assert!(devices.iter().all(|(pool, _)| pool == &first), "{devices:?}");
    c.wait_until(WAIT, "the old claim deleted", || async {
        c.get(&format!("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{old_claim}")).await.is_none()
    })
    .await;
    assert_eq!(c.deleted_instances(), vec![vec![second_instance]], "that exact instance was deleted");
    assert_eq!(c.group("gpu-h100").target_size, 1);
    assert!(c.set_target_calls().is_empty(), "no scale-up: {:?}", c.set_target_calls());
    assert_eq!(replica_pods(&c, "big").await[0].1, first, "big stays");
    replica.shutdown().await.unwrap();
    driver.abort();
    dra_driver.abort();
    c.assert_rbac_allowed("a");
}

/// Makes the API server refuse every update of the controller's Lease by replica `identity`, and
/// nothing else: a ValidatingAdmissionPolicy (CEL, `admissionregistration.k8s.io/v1`) on UPDATE
/// of `kube-system/gpuscale-controller` that denies requests of the replica's ServiceAccount,
/// at once, with HTTP 422. The replica's other requests, its reads of that Lease included, go
/// through as before. Returns once a renewal of the replica has been refused (the API server
/// loads new policies asynchronously).
async fn refuse_lease_renewals_of(c: &KubeCluster, identity: &str) {
    let name = format!("test-refuse-lease-renewals-of-{identity}");
    let user = KubeCluster::user(identity);
    let policy_created = k8s_openapi::jiff::Timestamp::now();
    c.create(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["coordination.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["leases"],
                "resourceNames": ["gpuscale-controller"],
            }]},
            "validations": [{
                "expression": format!("request.userInfo.username != '{user}'"),
                "message": format!("test: Lease renewals of {identity} are refused (a partition of its renewals only)"),
            }],
        },
    }))
    .await;
    c.create(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube_cluster::LEASE_NAMESPACE}}},
        },
    }))
    .await;
    c.wait_until(WAIT, &format!("a Lease renewal of {identity} refused by the policy"), || async {
        c.requests_of(identity).iter().any(|e| {
            e.resource == "leases"
                && e.verb == "update"
                && e.code == 422
                && e.received.is_some_and(|t| t >= policy_created)
        })
    })
    .await;
}

/// The writes replica `identity` made that act (everything but its Lease calls, Events and its
/// status ConfigMaps, which report), received after `after`, from the audit log.
fn acting_writes_of(c: &KubeCluster, identity: &str, after: k8s_openapi::jiff::Timestamp) -> Vec<String> {
    c.requests_of(identity)
        .into_iter()
        .filter(|e| !matches!(e.verb.as_str(), "get" | "list" | "watch"))
        .filter(|e| e.received.is_some_and(|t| t > after))
        .filter(|e| e.resource != "leases" && e.resource != "events")
        .filter(|e| !(e.resource == "configmaps" && e.name.starts_with("gpuscale-status")))
        .filter(|e| !(e.resource == "serviceaccounts" && e.subresource == "token"))
        .map(|e| format!("{} {} -> {} at {:?}", e.verb, e.uri, e.code, e.received))
        .collect()
}

/// Leadership fencing, shown: leader `a` loses its Lease mid gang scale-up while everything else
/// keeps working for it. The API server refuses its Lease renewals and nothing else
/// ([`refuse_lease_renewals_of`]); its other API reads and writes go through and the cloud is
/// shared, so nothing but the fence can stop it. It must stop at its renew deadline (1.4 s after
/// its last renewal began), before `b` may take the Lease over (2 s unrenewed); `b` resumes the
/// recorded gang and rolls it back, once.
///
/// Unfenced, `a`'s gang task would carry on to its own gang deadline and roll the gang back as
/// well (a second restore, a second rollback reported, writes of `a` to the gang record after its
/// deadline): with the leadership checks of the gang task disabled this test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_renewals_are_refused_mid_gang_scale_up_stops_and_the_new_leader_rolls_back_once(
) {
    let c = fencing_cluster().await;
    let (driver, a, b) = a_leads_a_gang_scale_up_that_can_only_roll_back(&c, None).await;
    let writes_at_fault = cloud_writes(&c);
    let fault = k8s_openapi::jiff::Timestamp::now();
    refuse_lease_renewals_of(&c, "a").await;
    b_takes_over_and_alone_rolls_the_gang_back_once(&c, &a, &b, writes_at_fault).await;

    let requests = c.requests_of("a");
    let renewed = |e: &&controlplane::AuditEvent| e.resource == "leases" && e.verb == "update";
    let last_renewal = requests
        .iter()
        .filter(renewed)
        .filter(|e| e.code == 200)
        .filter_map(|e| e.received)
        .max()
        .expect("a renewed the Lease");
    let refused = requests.iter().filter(renewed).filter(|e| e.code == 422).count();
    assert!(refused > 0, "a's renewals were refused");
    // Only the renewals: a kept reading the Lease (and saw b take it) after the fault.
    let reads_after = requests
        .iter()
        .filter(|e| e.resource == "leases" && e.verb == "get" && e.code == 200)
        .filter(|e| e.received.is_some_and(|t| t > fault))
        .count();
    assert!(reads_after > 0, "a's Lease reads went through after the fault");
    // Its claim ended at its renew deadline after the last renewal began (which is before the
    // server received it); 0.3 s for a write checked just before then to arrive. b may take over
    // only 2 s after that renewal.
    let renew_deadline = Duration::from_secs_f64(fast_config().lease.renew_deadline_seconds);
    let deadline = last_renewal + renew_deadline + Duration::from_millis(300);
    let late = acting_writes_of(&c, "a", deadline);
    assert!(late.is_empty(), "a wrote after its renew deadline ({deadline}): {late:#?}");

    // A crash: its release would be a Lease update, refused too.
    a.task.abort();
    b.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
    c.assert_rbac_allowed("b");
}
