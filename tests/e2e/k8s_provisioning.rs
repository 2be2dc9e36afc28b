//! ProvisioningRequests (#24) end to end on the real control plane (etcd, kube-apiserver with RBAC
//! and an audit log, kube-scheduler, from the official Go modules) with the ProvisioningRequest
//! CRD as Cluster Autoscaler publishes it (`support/provisioning_crd.rs`). The tests play Kueue: they create the PodTemplates and the request,
//! wait for `Provisioned=True`, then create the pods with the consume annotation. kube-scheduler,
//! not gpuscale, binds the pods.

use crate::controlplane;
use crate::kube_cluster;
use crate::provisioning_crd;

use controlplane::Options;
use gpuscale::planner::PlannerSettings;
use kube_cluster::{fast_config, node_name, pod_json, KubeCluster};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

const ATOMIC: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";

const PROVIDERS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 80, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 5}
    nodeGroups:
      - {name: gpu-h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0}
"#;

/// A cluster with the CRD installed and established (before any controller starts: the
/// controller reads ProvisioningRequests when their CRD is served at its start).
async fn cluster() -> Arc<KubeCluster> {
    let c = KubeCluster::start(PROVIDERS, Options::default()).await;
    provisioning_crd::install(&c.cp).await;
    c
}

/// The PodTemplate and the request Kueue's ProvisioningRequest admission check creates for a
/// workload of `count` 8-GPU workers (`ppt-<request>-<podset>`).
async fn ask(c: &KubeCluster, request: &str, count: u32, parameters: Value) {
    let mut worker = pod_json("ml", "worker", 8, None, None);
    worker["metadata"] = json!({"labels": {"kueue.x-k8s.io/podset": "workers"}});
    c.create(json!({"apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": format!("ppt-{request}-workers"), "namespace": "ml"},
        "template": {"metadata": worker["metadata"], "spec": worker["spec"]}}))
        .await;
    c.create(json!({"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": request, "namespace": "ml"},
        "spec": {"provisioningClassName": ATOMIC, "parameters": parameters,
                 "podSets": [{"podTemplateRef": {"name": format!("ppt-{request}-workers")}, "count": count}]}}))
        .await;
}

/// The request's conditions as (type, status, reason).
async fn conditions(c: &KubeCluster, request: &str) -> Vec<(String, String, String)> {
    let path = format!("/apis/autoscaling.x-k8s.io/v1/namespaces/ml/provisioningrequests/{request}");
    let r = c.get(&path).await.unwrap_or_default();
    r["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("status"), s("reason"))
        })
        .collect()
}

async fn has(c: &KubeCluster, request: &str, kind: &str, status: &str, reason: &str) -> bool {
    conditions(c, request).await.iter().any(|(t, s, r)| t == kind && s == status && r == reason)
}

/// Reasons of the Events on the request.
async fn event_reasons(c: &KubeCluster, request: &str) -> Vec<String> {
    event_reasons_of(c, "ProvisioningRequest", request).await
}

/// The reasons of the Events on the object `kind` `name` in namespace `ml`.
async fn event_reasons_of(c: &KubeCluster, kind: &str, name: &str) -> Vec<String> {
    let events = c.get("/apis/events.k8s.io/v1/namespaces/ml/events").await.unwrap_or_default();
    events["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

/// request -> Accepted and a scale-up under way -> the controller restarts mid-way -> the new
/// one neither scales again nor loses the request -> Provisioned -> the pods Kueue then creates
/// (consume annotation) are bound by kube-scheduler onto the new nodes -> the booking is used up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_request_is_provisioned_once_across_a_restart_and_its_pods_bound_on_the_new_nodes() {
    let c = cluster().await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let settings = PlannerSettings { scale_down: false, ..Default::default() };
    let a = c.controller("a", fast_config(), settings.clone(), false).await;
    ask(&c, "train-prov-1", 2, Value::Null).await;

    // a raises the group by 2 for it, all or nothing, and says so on the request.
    c.wait_until(WAIT, "the request accepted and its scale-up under way", || async {
        has(&c, "train-prov-1", "Accepted", "True", "Accepted").await
            && has(&c, "train-prov-1", "Provisioned", "False", "CapacityIsBeingProvisioned").await
    })
    .await;
    assert_eq!(c.set_target_calls(), vec![(0, 2)]);
    // Restarted while the nodes boot (80 s simulated, 8 s here).
    for i in c.live_instances("gpu-h100") {
        let node = c.node(&node_name(&i)).await;
        assert!(
            node.is_none_or(|n| !n.to_string().contains("KubeletReady")),
            "restart before the nodes are Ready"
        );
    }
    a.shutdown().await.unwrap();
    let b = c.controller("b", fast_config(), settings, false).await;

    c.wait_until(WAIT, "the request provisioned", || async {
        has(&c, "train-prov-1", "Provisioned", "True", "CapacityIsProvisioned").await
    })
    .await;
    assert_eq!(c.set_target_calls(), vec![(0, 2)], "the restart must not scale again");
    let live = c.live_instances("gpu-h100");
    assert_eq!(live.len(), 2);

    // Kueue admits the workload: its pods come with the consume annotation.
    for i in 0..2 {
        let mut p = pod_json("ml", &format!("train-{i}"), 8, Some("Job"), None);
        p["metadata"]["annotations"] = json!({
            "autoscaling.x-k8s.io/consume-provisioning-request": "train-prov-1",
            "autoscaling.x-k8s.io/provisioning-class-name": ATOMIC});
        c.create(p).await;
    }
    c.wait_until(WAIT, "both pods running", || async {
        c.running_on("train-0").await.is_some() && c.running_on("train-1").await.is_some()
    })
    .await;
    let mut on = vec![c.running_on("train-0").await.unwrap(), c.running_on("train-1").await.unwrap()];
    on.sort();
    let mut new_nodes: Vec<String> = live.iter().map(|i| node_name(i)).collect();
    new_nodes.sort();
    assert_eq!(on, new_nodes, "one pod on each new node");
    c.wait_until(WAIT, "the booking used up", || async {
        has(&c, "train-prov-1", "BookingExpired", "True", "CapacityBookingConsumed").await
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.set_target_calls(), vec![(0, 2)]);
    let reasons = event_reasons(&c, "train-prov-1").await;
    for want in ["CapacityIsBeingProvisioned", "CapacityIsProvisioned", "CapacityBookingConsumed"] {
        assert!(reasons.iter().any(|r| r == want), "no {want} Event on the request: {reasons:?}");
    }
    b.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
    c.assert_rbac_allowed("b");
}

/// Booked capacity is held against scale-down while the booking lasts, and released when it
/// expires without its pods: the node is then removed like any empty node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_booking_releases_its_capacity_to_scale_down() {
    let c = cluster().await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let a = c.controller("a", fast_config(), PlannerSettings::default(), false).await;
    // Booked for 6 s once provisioned (Kueue passes its ProvisioningRequestConfig's parameters).
    ask(&c, "eval-prov-1", 1, json!({"bookingTimeSeconds": "6"})).await;
    c.wait_until(WAIT, "the request provisioned", || async {
        has(&c, "eval-prov-1", "Provisioned", "True", "CapacityIsProvisioned").await
    })
    .await;
    let provisioned = std::time::Instant::now();
    let node = node_name(&c.live_instances("gpu-h100")[0]);
    // Empty and unneeded for 0.5 s would be enough to drain it: the booking holds it. Each poll
    // checks that a drain, once seen, came after the expiry was written (which precedes it).
    c.wait_until(WAIT, "the booking expired and the released node removed", || async {
        let drained = !a.recorder.with_prefix("drain_started").is_empty();
        let expired =
            has(&c, "eval-prov-1", "BookingExpired", "True", "CapacityReservationTimeExpired").await;
        assert!(
            !drained || expired,
            "{node} drained while booked: {:?}",
            conditions(&c, "eval-prov-1").await
        );
        // The instance goes first, the Node object and its record after: wait for both.
        expired
            && c.live_instances("gpu-h100").is_empty()
            && !a.recorder.with_prefix("node_deleted").is_empty()
    })
    .await;
    assert!(provisioned.elapsed() >= Duration::from_secs(4), "released after {:?}", provisioned.elapsed());
    assert_eq!(a.recorder.with_prefix("node_deleted").len(), 1, "{node}");
    a.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}

/// #48, hostile input from a tenant: a ProvisioningRequest of 2,147,483,647 pods (the CRD accepts
/// any int32) is left out of the pass with a Warning Event on it, and the controller keeps
/// scaling for everyone else. A claim selector nested 10,000 deep never reaches it: the API
/// server refuses it (its own CEL limits), which this checks too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_hostile_objects_are_left_out_and_everyone_else_is_served() {
    let c = cluster().await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    ask(&c, "huge", 2_147_483_647, json!({})).await;
    let deep = format!("{}true{}", "(".repeat(10_000), ")".repeat(10_000));
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "deep", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": deep}}]}}]}}});
    let refused =
        c.cp.raw("POST", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims", Some(claim)).await;
    assert!(refused.is_err(), "the API server accepted a 10,000-deep selector");
    let a = c
        .controller("a", fast_config(), PlannerSettings { scale_down: false, ..Default::default() }, false)
        .await;
    // A pending pod of 5,000 labels: the API server takes it (it bounds each label, not their
    // count); gpuscale's bound leaves it out, as `plan` refuses it.
    let mut labelled = pod_json("ml", "labelled", 8, Some("Job"), None);
    labelled["metadata"]["labels"] = (0..5000).map(|i| (format!("l{i}"), json!("v"))).collect();
    c.create(labelled).await;
    c.create(pod_json("ml", "trainer", 8, Some("Job"), None)).await;
    c.wait_until(WAIT, "a scale-up for the other tenant's pod", || async {
        !c.set_target_calls().is_empty()
    })
    .await;
    c.wait_until(WAIT, "an ObjectRefused Event on the request", || async {
        event_reasons(&c, "huge").await.iter().any(|r| r == "ObjectRefused")
    })
    .await;
    c.wait_until(WAIT, "an ObjectRefused Event on the pod of 5,000 labels", || async {
        event_reasons_of(&c, "Pod", "labelled").await.iter().any(|r| r == "ObjectRefused")
    })
    .await;
    assert_eq!(
        c.set_target_calls(),
        vec![(0, 1)],
        "one node for the trainer, none for the request or the pod past the label bound"
    );
    assert!(!has(&c, "huge", "Provisioned", "True", "CapacityIsProvisioned").await);
    a.shutdown().await.unwrap();
    driver.abort();
}
