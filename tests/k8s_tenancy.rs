//! Tenancy preemption carried out by `gpuscale run` on the real control plane: a tenant within its
//! nominal quota reclaims it from a borrower. The controller evicts the borrower through the
//! Eviction API (once, though the victim takes a while to go), kube-scheduler binds the reclaiming
//! pod in its place, and nothing is scaled.

#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/controller_fixtures.rs"]
mod fixtures;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;

use controlplane::Options;
use gpuscale::planner::PlannerSettings;
use gpuscale::tenancy::TenancyConfig;
use kube_cluster::{fast_config, pod_json, KubeCluster};
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// One 8-GPU node; the group cannot grow, so room comes only from preemption.
const PROVIDERS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    simulation: {bootSeconds: 10, capacityErrorRate: 0, spotInterruptionsPerHour: 0, seed: 5}
    nodeGroups:
      - {name: gpu-h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 1, maxSize: 1, targetSize: 1}
"#;

/// Two teams of one cohort, 4 GPUs each guaranteed; a team may borrow what the other leaves.
const TENANCY: &str = r#"
cohorts: [{name: ml}]
tenants:
  - {name: team-a, cohort: ml, match: {namespaces: [team-a]}, quotas: {nvidia.com/gpu: {nominal: 4}}}
  - {name: team-b, cohort: ml, match: {namespaces: [team-b]}, quotas: {nvidia.com/gpu: {nominal: 4}}}
preemption: {enabled: true}
"#;

async fn deletion_started(c: &KubeCluster, ns: &str, name: &str) -> bool {
    let p = c.get(&format!("/api/v1/namespaces/{ns}/pods/{name}")).await;
    p.is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_within_its_quota_reclaims_it_from_a_borrower_by_one_eviction() {
    let c = KubeCluster::start(PROVIDERS, Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    for ns in ["team-a", "team-b"] {
        c.cp.ensure_namespace(ns).await;
    }
    let node = c.register_all_ready().await.remove(0);

    // team-b borrows team-a's idle half: all 8 GPUs.
    let mut hog = pod_json("team-b", "hog", 8, Some("Job"), None);
    // Long enough a grace period that the next passes see it terminating.
    hog["spec"]["terminationGracePeriodSeconds"] = json!(4);
    c.create(hog).await;
    c.wait_until(WAIT, "team-b's pod running", || async { c.running_in("team-b", "hog").await.is_some() })
        .await;

    let tenancy: TenancyConfig = serde_yaml::from_str(TENANCY).unwrap();
    let settings = PlannerSettings { scale_down: false, tenancy: Some(tenancy), ..Default::default() };
    let a = c.controller("a", fast_config(), settings, false).await;
    // Nobody waits: nothing to do, however much team-b borrows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.recorder.with_prefix("preempted").is_empty(), "{:?}", a.recorder.lines.lock().unwrap());

    // team-a wants 4 of its 4 guaranteed GPUs back.
    c.create(pod_json("team-a", "claim", 4, Some("Job"), None)).await;
    c.wait_until(WAIT, "the borrower evicted", || async { deletion_started(&c, "team-b", "hog").await })
        .await;
    c.wait_until(WAIT, "team-a's pod running in its place", || async {
        c.running_in("team-a", "claim").await.as_deref() == Some(node.as_str())
    })
    .await;
    // More passes with the claim bound: still one eviction, no scaling.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let evictions: Vec<String> = c
        .requests_of("a")
        .into_iter()
        .filter(|e| e.subresource == "eviction")
        .map(|e| format!("{} {} -> {}", e.verb, e.uri, e.code))
        .collect();
    assert_eq!(evictions.len(), 1, "one eviction, of team-b/hog: {evictions:#?}");
    assert!(evictions[0].contains("/namespaces/team-b/pods/hog/eviction"), "{evictions:?}");
    let preempted = a.recorder.with_prefix("preempted");
    assert_eq!(preempted.len(), 1, "{preempted:?}");
    assert!(
        preempted[0].starts_with(&format!("preempted: team-b/hog {node} team-a/claim reclaim")),
        "{preempted:?}"
    );
    assert!(c.set_target_calls().is_empty(), "nothing scaled: {:?}", c.set_target_calls());
    c.wait_until(WAIT, "the Preempted Event on the victim", || async {
        let events = c.get("/apis/events.k8s.io/v1/namespaces/team-b/events").await.unwrap_or_default();
        events["items"].as_array().is_some_and(|items| {
            items.iter().any(|e| e["reason"] == "Preempted" && e["regarding"]["name"] == "hog")
        })
    })
    .await;
    a.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}
