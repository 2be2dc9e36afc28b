//! Preemption carried out by the controller loop against the in-process stand-in API server, for
//! what a real server cannot be made to do on demand: refuse one victim's eviction although the
//! plan saw its budget allow it (the budget changed after the snapshot).

use crate::apiserver;
use crate::harness;

use apiserver::{Fault, RecordedRequest, Settings};
use gpuscale::planner::PlannerSettings;
use gpuscale::tenancy::TenancyConfig;
use harness::{fast_config, l4_providers, pod_json, Cluster};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

const TENANCY: &str = r#"
tenants: [{name: ml, match: {namespaces: [ml]}, quotas: {nvidia.com/gpu: {nominal: 16}}}]
preemption: {enabled: true}
"#;

fn is_eviction_of(r: &RecordedRequest, pod: &str) -> bool {
    r.method == "POST" && r.path == format!("/api/v1/namespaces/ml/pods/{pod}/eviction")
}

fn dry_run(r: &RecordedRequest) -> bool {
    r.query.contains("dryRun=All")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_evicts_all_of_its_victims_or_none() {
    // One 4-GPU node, its group at its maximum: room comes only from evicting both 2-GPU pods.
    let c = Cluster::start(&l4_providers(1, 1), Settings::default()).await;
    let node = c.register_all_ready().remove(0);
    for victim in ["a", "b"] {
        c.server.create(pod_json("ml", victim, 2, Some("Job"), Some(&node)));
    }
    // b's eviction is refused three times (429, as a budget refuses).
    c.server.inject_fault(Fault::new("POST", "/api/v1/namespaces/ml/pods/b/eviction", 429, 3));
    let driver = c.spawn_driver(Duration::from_millis(100), 10);
    let tenancy = TenancyConfig::parse(Path::new("gpuscale.yaml"), TENANCY).unwrap();
    let settings = PlannerSettings { scale_down: false, tenancy: Some(tenancy), ..Default::default() };
    let replica = c.controller("a", fast_config(), settings);
    let mut claim = pod_json("ml", "urgent", 4, Some("Job"), None);
    claim["spec"]["priority"] = json!(1000);
    c.server.create(claim);

    c.server.wait_until(WAIT, "b's refusals used up", |s| s.pending_faults().is_empty()).await;
    let requests = c.server.requests();
    let last_refusal = requests.iter().rposition(|r| is_eviction_of(r, "b") && r.status == 429).unwrap();
    let before: Vec<String> = requests[..last_refusal]
        .iter()
        .filter(|r| r.path.ends_with("/eviction") || r.path.ends_with("/status"))
        .map(|r| format!("{} {}?{} {}", r.method, r.path, r.query, r.status))
        .collect();
    assert!(
        before.iter().all(|r| r.contains("dryRun=All")),
        "while b's eviction is refused, nothing is evicted nor nominated: {before:#?}"
    );
    assert!(before.iter().any(|r| r.contains("/pods/a/eviction")), "{before:#?}");

    // Once both would go, both go, the claimant nominated to the node first.
    c.server
        .wait_until(WAIT, "the claimant running", |s| {
            s.get("pods", "ml", "urgent").is_some_and(|p| p["spec"]["nodeName"] == node.as_str())
        })
        .await;
    let requests = c.server.requests();
    for victim in ["a", "b"] {
        let real: Vec<_> = requests.iter().filter(|r| is_eviction_of(r, victim) && !dry_run(r)).collect();
        assert_eq!(real.len(), 1, "{victim}: {real:#?}");
        assert_eq!(real[0].status, 201);
    }
    let nominated =
        requests.iter().position(|r| r.method == "PATCH" && r.path.ends_with("/pods/urgent/status"));
    let first_eviction = requests.iter().position(|r| r.path.ends_with("/eviction") && !dry_run(r));
    assert!(nominated.is_some() && nominated < first_eviction, "{nominated:?} {first_eviction:?}");
    let urgent = c.server.get("pods", "ml", "urgent").unwrap();
    assert_eq!(urgent["status"]["nominatedNodeName"], node.as_str());
    let preempted = replica.recorder.with_prefix("preempted");
    assert_eq!(preempted.len(), 2, "{preempted:?}");
    assert!(!replica.recorder.with_prefix("eviction_blocked: ml/b").is_empty());
    replica.shutdown().await.unwrap();
    driver.abort();
    harness::assert_requests_allowed_by_rbac(&c.server);
}
