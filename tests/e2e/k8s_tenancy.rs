//! Tenancy preemption carried out by `gpuscale run` on the real control plane: a tenant within its
//! nominal quota reclaims it from a borrower. The controller evicts the borrower through the
//! Eviction API (once, though the victim takes a while to go), kube-scheduler binds the reclaiming
//! pod in its place, and nothing is scaled.

use crate::controlplane;
use crate::fixtures;
use crate::kube_cluster;

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

/// The eviction requests of controller `a`: dry runs or real ones.
fn evictions(c: &KubeCluster, dry_run: bool) -> Vec<String> {
    c.requests_of("a")
        .into_iter()
        .filter(|e| e.subresource == "eviction" && e.uri.contains("dryRun=All") == dry_run)
        .map(|e| format!("{} {} -> {}", e.verb, e.uri, e.code))
        .collect()
}

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

    let tenancy: TenancyConfig = serde_yaml::from_str(fixtures::TWO_TEAMS).unwrap();
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
    let evictions = evictions(&c, false);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_victim_its_budget_protects_is_passed_over_for_one_the_api_lets_go() {
    let c = KubeCluster::start(PROVIDERS, Options::default()).await;
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    for ns in ["team-a", "team-b"] {
        c.cp.ensure_namespace(ns).await;
    }
    let node = c.register_all_ready().await.remove(0);
    // team-b borrows 4 GPUs in two pods; the cheaper victim (newer, first by name) is guarded
    // by a budget that allows nothing (no disruption controller runs: its status stays unset,
    // which the Eviction API and the planner both read as no disruptions allowed).
    c.create(pod_json("team-b", "z-free", 4, Some("Job"), None)).await;
    c.wait_until(WAIT, "z-free running", || async { c.running_in("team-b", "z-free").await.is_some() }).await;
    c.create(pod_json("team-b", "a-guarded", 4, Some("Job"), None)).await;
    c.wait_until(WAIT, "a-guarded running", || async { c.running_in("team-b", "a-guarded").await.is_some() })
        .await;
    c.create(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": "team-b"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a-guarded"}}}
    }))
    .await;

    let tenancy: TenancyConfig = serde_yaml::from_str(fixtures::TWO_TEAMS).unwrap();
    let settings = PlannerSettings { scale_down: false, tenancy: Some(tenancy), ..Default::default() };
    let a = c.controller("a", fast_config(), settings, false).await;
    c.create(pod_json("team-a", "claim", 4, Some("Job"), None)).await;
    c.wait_until(WAIT, "team-a's pod running in z-free's place", || async {
        c.running_in("team-a", "claim").await.as_deref() == Some(node.as_str())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let evicted = evictions(&c, false);
    assert_eq!(evicted.len(), 1, "{evicted:#?}");
    assert!(evicted[0].contains("/namespaces/team-b/pods/z-free/eviction") && evicted[0].ends_with("201"));
    let dry = evictions(&c, true);
    assert!(
        dry.iter().all(|e| e.contains("/pods/z-free/eviction")),
        "only the chosen victim asked: {dry:#?}"
    );
    assert!(!dry.is_empty(), "its eviction was asked as a dry run first");
    let guarded = c.get("/api/v1/namespaces/team-b/pods/a-guarded").await.expect("a-guarded stays");
    assert!(guarded["metadata"]["deletionTimestamp"].is_null());
    // The claimant was nominated to the node before its victim was evicted.
    let requests = c.requests_of("a");
    let nominated = requests
        .iter()
        .position(|e| e.subresource == "status" && e.name == "claim" && e.verb == "patch" && e.code == 200);
    let evicted_at = requests.iter().position(|e| e.subresource == "eviction" && !e.uri.contains("dryRun"));
    assert!(
        nominated.is_some() && nominated < evicted_at,
        "nomination at {nominated:?}, eviction at {evicted_at:?}"
    );
    a.shutdown().await.unwrap();
    driver.abort();
    c.assert_rbac_allowed("a");
}
