//! The GCP provider against an in-process fake of the Compute Engine v1 REST API
//! (`tests/support/fake_compute.rs`), through the official client library over loopback HTTP.
#![cfg(feature = "gcp")]

#[path = "support/fake_compute.rs"]
mod fake_compute;

use fake_compute::{FakeCompute, Fault, MachineTypeSpec, TemplateSpec};
use gpuscale::model::{CapacityType, ErrorClass, InstanceState, NodeGroup};
use gpuscale::providers::gcp::{GcpProvider, GcpSettings};
use gpuscale::providers::{CloudProvider, ProviderError};
use std::collections::BTreeMap;
use std::time::Duration;

const PROJECT: &str = "gpuscale-test";
const ZONE_A: &str = "us-central1-a";
const ZONE_B: &str = "us-central1-b";
const A100: &str = "gcp/ml/us-central1-a/gpu-a100";
const L4: &str = "gcp/ml/us-central1-a/gpu-l4";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Two zones: an A100 GKE pool (2 nodes) and a spot L4 MIG (1 node) in zone a, an L4 MIG in
/// zone b, plus MIGs the filters must hide (another prefix, another team's label).
async fn cluster() -> FakeCompute {
    let fake = FakeCompute::start(PROJECT).await;
    for zone in [ZONE_A, ZONE_B] {
        fake.add_machine_type(
            zone,
            MachineTypeSpec {
                name: "a2-highgpu-8g".into(),
                guest_cpus: 96,
                memory_mb: 696_320,
                accelerators: vec![("nvidia-tesla-a100".into(), 8)],
            },
        );
        fake.add_machine_type(
            zone,
            MachineTypeSpec {
                name: "g2-standard-24".into(),
                guest_cpus: 24,
                memory_mb: 98_304,
                accelerators: vec![("nvidia-l4".into(), 2)],
            },
        );
        fake.add_machine_type(
            zone,
            MachineTypeSpec {
                name: "n2-standard-8".into(),
                guest_cpus: 8,
                memory_mb: 32_768,
                accelerators: vec![],
            },
        );
    }
    fake.add_template(TemplateSpec {
        name: "gke-ml-a100-pool-7c2f".into(),
        machine_type: "a2-highgpu-8g".into(),
        labels: labels(&[
            ("team", "ml"),
            ("goog-k8s-node-pool-name", "a100-pool"),
            ("goog-k8s-cluster-name", "ml"),
        ]),
        kube_labels: Some(
            "cloud.google.com/gke-nodepool=a100-pool,cloud.google.com/gke-os-distribution=cos,cloud.google.com/machine-family=a2".into(),
        ),
        ..Default::default()
    });
    fake.add_template(TemplateSpec {
        name: "gpu-l4-spot".into(),
        machine_type: "g2-standard-24".into(),
        labels: labels(&[("team", "ml"), ("gpuscale-min", "1"), ("gpuscale-max", "4")]),
        spot: true,
        ..Default::default()
    });
    fake.add_template(TemplateSpec {
        name: "other-team".into(),
        machine_type: "g2-standard-24".into(),
        labels: labels(&[("team", "search")]),
        ..Default::default()
    });
    fake.add_template(TemplateSpec {
        name: "web".into(),
        machine_type: "n2-standard-8".into(),
        labels: labels(&[("team", "ml")]),
        ..Default::default()
    });
    fake.add_mig(
        ZONE_A,
        "gpu-a100",
        "gke-ml-a100-pool-7c2f",
        2,
        Some("GKE a100 pool; gpuscale-min=0 gpuscale-max=10"),
    );
    fake.add_mig(ZONE_A, "gpu-l4", "gpu-l4-spot", 1, None);
    fake.add_mig(ZONE_A, "gpu-search", "other-team", 3, None);
    fake.add_mig(ZONE_A, "web-frontend", "web", 4, None);
    fake.add_mig(ZONE_B, "gpu-l4-b", "gpu-l4-spot", 2, None);
    fake
}

fn settings(fake: &FakeCompute) -> GcpSettings {
    let mut s = GcpSettings::new("ml", PROJECT, vec![ZONE_A.into(), ZONE_B.into()]);
    s.endpoint = Some(fake.endpoint());
    s.anonymous = true;
    s.name_prefix = Some("gpu-".into());
    s.label_filter = labels(&[("team", "ml")]);
    s.operation_timeout_secs = 10;
    s.poll_interval_ms = 5;
    s
}

async fn provider(fake: &FakeCompute) -> GcpProvider {
    GcpProvider::connect(settings(fake)).await.expect("connect to the fake Compute server")
}

fn group<'a>(groups: &'a [NodeGroup], id: &str) -> &'a NodeGroup {
    groups.iter().find(|g| g.id == id).unwrap_or_else(|| panic!("group {id} missing from {:?}", ids(groups)))
}

fn ids(groups: &[NodeGroup]) -> Vec<&str> {
    groups.iter().map(|g| g.id.as_str()).collect()
}

fn count(fake: &FakeCompute, method: &str, suffix: &str) -> usize {
    fake.requests().iter().filter(|r| r.method == method && r.path.ends_with(suffix)).count()
}

fn assert_clean(fake: &FakeCompute) {
    assert!(fake.violations().is_empty(), "requests the Compute API would reject: {:?}", fake.violations());
}

#[tokio::test]
async fn discovers_gpu_migs_with_machine_type_facts() {
    let fake = cluster().await;
    fake.set_page_size(1); // every list call needs several pages
    let p = provider(&fake).await;
    let groups = p.refresh().await.expect("refresh");
    assert_clean(&fake);

    assert_eq!(
        ids(&groups),
        vec![A100, L4, "gcp/ml/us-central1-b/gpu-l4-b"],
        "prefix and label filters hide web-frontend and gpu-search"
    );

    let a100 = group(&groups, A100);
    assert_eq!(a100.instance_type, "a2-highgpu-8g");
    assert_eq!(a100.zones, vec![ZONE_A.to_string()]);
    assert_eq!((a100.min_size, a100.max_size, a100.target_size), (0, 10, 2));
    assert_eq!(a100.capacity_type, CapacityType::OnDemand);
    assert_eq!(a100.price, 0);
    let t = &a100.template;
    assert_eq!(t.gpu_model.as_deref(), Some("A100-40GB"));
    assert_eq!(t.gpus.len(), 8);
    assert!(t.gpus.iter().all(|g| g.memory_mib == 40 * 1024));
    assert_eq!(t.topology.nvlink_of(0), Some(0));
    assert_eq!(t.labels["cloud.google.com/gke-nodepool"], "a100-pool");
    assert_eq!(t.labels["cloud.google.com/gke-accelerator"], "nvidia-tesla-a100");
    assert_eq!(t.labels["topology.kubernetes.io/zone"], ZONE_A);
    assert_eq!(t.labels["node.kubernetes.io/instance-type"], "a2-highgpu-8g");
    assert_eq!(t.labels["kubernetes.io/arch"], "amd64");
    // GKE node pool: allocatable is capacity minus GKE's reservation (96 vCPU → 310m).
    assert_eq!(t.allocatable.cpu_milli, 96_000 - 310);
    assert!(t.allocatable.memory_mib() < 696_320);
    assert_eq!(t.node_group.as_deref(), Some(A100));
    assert_eq!(a100.instances.len(), 2);
    for i in &a100.instances {
        assert!(i.id.starts_with("gce://gpuscale-test/us-central1-a/gpu-a100-"), "{}", i.id);
        assert_eq!(i.state, InstanceState::Running);
    }

    let l4 = group(&groups, L4);
    assert_eq!(l4.instance_type, "g2-standard-24");
    assert_eq!((l4.min_size, l4.max_size, l4.target_size), (1, 4, 1));
    assert_eq!(l4.capacity_type, CapacityType::Spot);
    assert_eq!(l4.template.gpu_model.as_deref(), Some("L4"));
    assert_eq!(l4.template.gpus.len(), 2);
    assert_eq!(l4.template.allocatable.cpu_milli, 24_000, "not GKE: raw capacity");
    assert!(!l4.template.labels.contains_key("cloud.google.com/gke-nodepool"));

    let b = group(&groups, "gcp/ml/us-central1-b/gpu-l4-b");
    assert_eq!(b.instances.len(), 2);
    assert!(b.instances[0].id.starts_with("gce://gpuscale-test/us-central1-b/"));

    // The list calls carried the prefix filter and were paged.
    let lists: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/instanceGroupManagers"))
        .collect();
    assert!(lists.iter().all(|r| r.query.get("filter").map(String::as_str) == Some("name eq \"gpu-.*\"")));
    assert!(lists.iter().any(|r| r.query.contains_key("pageToken")));
    // Machine types are fetched once per (zone, type) and then cached.
    let before = count(&fake, "GET", "/machineTypes/g2-standard-24");
    p.refresh().await.expect("second refresh");
    assert_eq!(count(&fake, "GET", "/machineTypes/g2-standard-24"), before);
}

#[tokio::test]
async fn scale_up_waits_for_the_zone_operation() {
    let fake = cluster().await;
    fake.set_polls_to_done(3);
    let p = provider(&fake).await;
    p.set_target_size(A100, 4).await.expect("resize");
    assert_clean(&fake);
    assert_eq!(fake.target_size(ZONE_A, "gpu-a100"), 4);

    let resizes: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/instanceGroupManagers/gpu-a100/resize"))
        .collect();
    assert_eq!(resizes.len(), 1);
    assert_eq!(resizes[0].method, "POST");
    assert_eq!(resizes[0].query.get("size").map(String::as_str), Some("4"));
    assert_eq!(count(&fake, "POST", "/wait"), 3, "polled until the operation was DONE");

    let groups = p.refresh().await.expect("refresh");
    let a100 = group(&groups, A100);
    assert_eq!(a100.target_size, 4);
    assert_eq!(a100.instances.len(), 4);
    assert!(a100.instances.iter().all(|i| i.state == InstanceState::Running));
}

#[tokio::test]
async fn resize_to_the_current_size_makes_no_call() {
    let fake = cluster().await;
    let p = provider(&fake).await;
    p.set_target_size(A100, 2).await.expect("no-op resize");
    assert_eq!(count(&fake, "POST", "/resize"), 0);
    p.set_target_size(A100, 3).await.expect("resize");
    p.set_target_size(A100, 3).await.expect("repeat");
    assert_eq!(count(&fake, "POST", "/resize"), 1);
    assert_eq!(fake.target_size(ZONE_A, "gpu-a100"), 3);
    assert_clean(&fake);
}

#[tokio::test]
async fn deletes_a_specific_instance_and_lowers_the_target() {
    let fake = cluster().await;
    let p = provider(&fake).await;
    let groups = p.refresh().await.expect("refresh");
    let victim = group(&groups, A100).instances[1].id.clone();
    let keep = group(&groups, A100).instances[0].id.clone();
    let victim_name = victim.rsplit('/').next().unwrap().to_string();

    p.delete_instances(A100, std::slice::from_ref(&victim)).await.expect("delete");
    assert_clean(&fake);
    assert_eq!(fake.target_size(ZONE_A, "gpu-a100"), 1);
    let names: Vec<String> = fake.instances(ZONE_A, "gpu-a100").into_iter().map(|(n, _, _)| n).collect();
    assert!(!names.contains(&victim_name), "{names:?}");

    let body = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/deleteInstances"))
        .expect("deleteInstances call")
        .body;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        json["instances"][0],
        format!(
            "https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE_A}/instances/{victim_name}"
        )
    );

    let groups = p.refresh().await.expect("refresh");
    let a100 = group(&groups, A100);
    assert_eq!(a100.target_size, 1);
    assert_eq!(a100.instances.iter().map(|i| &i.id).collect::<Vec<_>>(), vec![&keep]);

    // A non-member is refused before any deleteInstances call.
    let calls = count(&fake, "POST", "/deleteInstances");
    let err =
        p.delete_instances(A100, &["gce://gpuscale-test/us-central1-a/not-mine".into()]).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::InstanceNotFound { group, instance } if group == A100 && instance.ends_with("not-mine")),
        "{err:?}"
    );
    assert_eq!(count(&fake, "POST", "/deleteInstances"), calls);
}

#[tokio::test]
async fn stockout_in_the_operation_is_insufficient_capacity() {
    let fake = cluster().await;
    let p = provider(&fake).await;
    fake.fail_next_operation(
        ZONE_A,
        "gpu-a100",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        503,
        "The zone 'projects/gpuscale-test/zones/us-central1-a' does not have enough resources available to fulfill the request.",
    );
    let err = p.set_target_size(A100, 5).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::InsufficientCapacity { group, message } if group == A100 && message.contains("ZONE_RESOURCE_POOL_EXHAUSTED")),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::OutOfCapacity);
    assert!(!err.is_retryable());
    assert_eq!(fake.target_size(ZONE_A, "gpu-a100"), 2);

    fake.fail_next_operation(
        ZONE_A,
        "gpu-a100",
        "QUOTA_EXCEEDED",
        403,
        "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 16.0 in region us-central1.",
    );
    let err = p.set_target_size(A100, 5).await.unwrap_err();
    assert!(matches!(&err, ProviderError::QuotaExceeded(m) if m.contains("NVIDIA_A100_GPUS")), "{err:?}");
    assert_clean(&fake);
}

#[tokio::test]
async fn creation_errors_of_managed_instances_are_failed_instances() {
    let fake = cluster().await;
    fake.set_stockout(ZONE_A, "gpu-a100", true);
    let p = provider(&fake).await;
    p.set_target_size(A100, 3).await.expect("the resize itself succeeds");
    let groups = p.refresh().await.expect("refresh");
    let a100 = group(&groups, A100);
    let failed: Vec<_> = a100
        .instances
        .iter()
        .filter(|i| matches!(&i.state, InstanceState::Failed { class: ErrorClass::OutOfCapacity, message } if message.contains("ZONE_RESOURCE_POOL_EXHAUSTED")))
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", a100.instances);
    assert_eq!(a100.target_size, 3);
    assert_clean(&fake);
}

#[tokio::test]
async fn rate_limits_are_throttling() {
    let fake = cluster().await;
    let p = provider(&fake).await;
    fake.inject(Fault {
        method: "POST",
        path_suffix: "/instanceGroupManagers/gpu-a100/resize".into(),
        status: 429,
        reason: "rateLimitExceeded",
        message: "Rate Limit Exceeded".into(),
        retry_after: Some(7),
        times: 1,
    });
    let err = p.set_target_size(A100, 4).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Throttled { retry_after: Some(d) } if d == Duration::from_secs(7)),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(err.class(), ErrorClass::Throttled);
    // The next attempt goes through.
    p.set_target_size(A100, 4).await.expect("retry");
    assert_eq!(fake.target_size(ZONE_A, "gpu-a100"), 4);

    // Compute also reports rate limits as 403 rateLimitExceeded: still throttling, not auth.
    fake.inject(Fault {
        method: "GET",
        path_suffix: "/zones/us-central1-a/instanceGroupManagers".into(),
        status: 403,
        reason: "rateLimitExceeded",
        message: "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'"
            .into(),
        retry_after: None,
        times: 1,
    });
    let err = p.refresh().await.unwrap_err();
    assert!(matches!(err, ProviderError::Throttled { retry_after: None }), "{err:?}");
    assert_clean(&fake);
}

#[tokio::test]
async fn server_and_auth_errors_are_classified() {
    let fake = cluster().await;
    let p = provider(&fake).await;
    fake.inject(Fault {
        method: "POST",
        path_suffix: "/resize".into(),
        status: 500,
        reason: "backendError",
        message: "Internal error. Please try again or contact Google Support.".into(),
        retry_after: None,
        times: 1,
    });
    let err = p.set_target_size(A100, 4).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Api { retryable: true, op, .. } if *op == "instanceGroupManagers.resize"),
        "{err:?}"
    );

    fake.inject(Fault {
        method: "GET",
        path_suffix: "/instanceGroupManagers".into(),
        status: 403,
        reason: "forbidden",
        message: "Required 'compute.instanceGroupManagers.list' permission for 'projects/gpuscale-test'"
            .into(),
        retry_after: None,
        times: 1,
    });
    let err = p.refresh().await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Auth { account, message } if account == "ml" && message.contains("compute.instanceGroupManagers.list")),
        "{err:?}"
    );
    assert!(!err.is_retryable());

    // 503 on an idempotent GET is retried by the client library itself.
    fake.inject(Fault {
        method: "GET",
        path_suffix: "/global/instanceTemplates/gpu-l4-spot".into(),
        status: 503,
        reason: "backendError",
        message: "Service unavailable".into(),
        retry_after: None,
        times: 1,
    });
    let groups = p.refresh().await.expect("refresh after a transient 503");
    assert_eq!(groups.len(), 3);
    assert_clean(&fake);
}

#[tokio::test]
async fn unknown_groups_and_out_of_range_sizes() {
    let fake = cluster().await;
    let p = provider(&fake).await;
    for id in [
        "gcp/ml/us-central1-a/gpu-h100",     // no such MIG (404 from the API)
        "gcp/ml/europe-west4-a/gpu-a100",    // zone not managed
        "gcp/other/us-central1-a/gpu-a100",  // another account
        "gcp/ml/us-central1-a/web-frontend", // outside the name prefix
        "gcp/ml/us-central1-a/gpu-search",   // outside the label filter
        "gpu-a100",
    ] {
        let err = p.set_target_size(id, 1).await.unwrap_err();
        assert!(matches!(&err, ProviderError::GroupNotFound(g) if g == id), "{id}: {err:?}");
        let err = p.delete_instances(id, &["gce://gpuscale-test/us-central1-a/x".into()]).await.unwrap_err();
        assert!(matches!(&err, ProviderError::GroupNotFound(g) if g == id), "{id}: {err:?}");
    }
    let err = p.set_target_size(A100, 11).await.unwrap_err();
    assert!(matches!(err, ProviderError::SizeOutOfRange { target: 11, min: 0, max: 10, .. }), "{err:?}");
    let err = p.set_target_size(L4, 0).await.unwrap_err();
    assert!(matches!(err, ProviderError::SizeOutOfRange { target: 0, min: 1, max: 4, .. }), "{err:?}");
    assert_eq!(count(&fake, "POST", "/resize"), 0);
    assert_eq!(count(&fake, "POST", "/deleteInstances"), 0);
    assert_clean(&fake);
}

#[tokio::test]
async fn slow_operations_time_out_and_leave_pending_instances() {
    let fake = cluster().await;
    fake.set_polls_to_done(u32::MAX);
    let mut s = settings(&fake);
    s.operation_timeout_secs = 1;
    s.poll_interval_ms = 50;
    let p = GcpProvider::connect(s).await.expect("connect");
    let err = p.set_target_size(L4, 3).await.unwrap_err();
    assert!(matches!(&err, ProviderError::Api { retryable: true, .. }), "{err:?}");
    assert!(err.to_string().contains("still RUNNING"), "{err}");
    let groups = p.refresh().await.expect("refresh");
    let l4 = group(&groups, L4);
    assert_eq!(l4.target_size, 3);
    let pending = l4.instances.iter().filter(|i| i.state == InstanceState::Pending).count();
    assert_eq!(pending, 2, "{:?}", l4.instances);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_mig_with_malformed_bounds_is_skipped_not_fatal() {
    let fake = cluster().await;
    fake.add_mig(ZONE_A, "gpu-bad", "gpu-l4-spot", 1, Some("gpuscale-max=lots"));
    let p = provider(&fake).await;
    let groups = p.refresh().await.expect("refresh");
    assert_eq!(ids(&groups), vec![A100, L4, "gcp/ml/us-central1-b/gpu-l4-b"]);
    let err = p.set_target_size("gcp/ml/us-central1-a/gpu-bad", 2).await.unwrap_err();
    assert!(matches!(&err, ProviderError::Api { retryable: false, .. }), "{err:?}");
    let msg = err.to_string(); // the cause is in the message, once
    assert!(msg.contains("gpu-bad") && msg.contains("gpuscale-max") && msg.contains("lots"), "{msg}");
    assert_eq!(count(&fake, "POST", "/resize"), 0);
    assert_clean(&fake);
}
