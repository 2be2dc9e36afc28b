//! Status publishing against the in-process fake Kubernetes API server: the events gpuscale
//! records (reason, regarding object, reporter, wording, deduplication), the status ConfigMaps
//! it server-side applies, dry-run wording, failures counted and never fatal, and that every
//! request it made is allowed by the RBAC rules of `controller::rbac`.

use crate::apiserver;

use apiserver::{FakeApiServer, Fault, RecordedRequest};
use gpuscale::controller::health::Health;
use gpuscale::controller::metrics::Metrics;
use gpuscale::controller::rbac;
use gpuscale::controller::status::{StatusPublisher, DRY_RUN_STATUS_CONFIGMAP, STATUS_CONFIGMAP};
use gpuscale::model::{dollars, ClusterSnapshot, Node, NodeGroup, NodeState};
use gpuscale::planner::{Plan, ScaleDown, ScaleUp, Unschedulable};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};
use std::sync::Arc;

const NS: &str = "gpuscale-system";
const H100: &str = "aws/prod/gpu-h100";
const L4: &str = "gcp/ml/l4_Spot";

fn group(id: &str, target: u32) -> NodeGroup {
    NodeGroup {
        id: id.into(),
        account: id.split('/').next().unwrap().into(),
        instance_type: "p5.48xlarge".into(),
        zones: vec!["us-east-1a".into()],
        capacity_type: Default::default(),
        price: dollars(98.32),
        min_size: 0,
        max_size: 8,
        target_size: target,
        instances: vec![],
        template: Node::default(),
    }
}

fn node(name: &str, group: &str, state: NodeState) -> Node {
    Node {
        name: name.into(),
        node_group: Some(group.into()),
        instance_type: Some("p5.48xlarge".into()),
        state,
        ..Default::default()
    }
}

async fn cluster() -> FakeApiServer {
    let server = FakeApiServer::start().await;
    for ns in [NS, "ml"] {
        server.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    server.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}));
    for pod in ["train-0", "train-1", "huge", "web"] {
        server.create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }));
    }
    server
}

fn plan() -> Plan {
    Plan {
        scale_ups: vec![ScaleUp {
            group: H100.into(),
            instance_type: "p5.48xlarge".into(),
            from: 1,
            to: 2,
            pods: vec!["ml/train-0".into(), "ml/train-1".into()],
            requests: vec![],
            reason: "cheapest group that fits the gang".into(),
            cost_per_hour: dollars(98.32),
        }],
        scale_downs: vec![ScaleDown {
            node: "gpu-1".into(),
            group: L4.into(),
            instance: None,
            moves: vec![],
            reason: "empty for 10m".into(),
            saving_per_hour: dollars(1.6),
        }],
        unschedulable: vec![Unschedulable {
            pod: "ml/huge".into(),
            reason: "no node group has 16 GPUs per node".into(),
        }],
        cost_before: dollars(98.32),
        cost_after: dollars(196.64),
        ..Default::default()
    }
}

/// events.k8s.io/v1 events with `reason` regarding `name`, in namespace `ns`.
fn events(server: &FakeApiServer, ns: &str, name: &str, reason: &str) -> Vec<Value> {
    server
        .list("events.k8s.io", Some(ns))
        .into_iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == name)
        .collect()
}

fn one_event(server: &FakeApiServer, ns: &str, name: &str, reason: &str) -> Value {
    let found = events(server, ns, name, reason);
    assert_eq!(found.len(), 1, "one {reason} event on {ns}/{name}, got {found:#?}");
    found.into_iter().next().unwrap()
}

fn data(server: &FakeApiServer, name: &str) -> serde_json::Map<String, Value> {
    let cm = server.get("configmap", NS, name).unwrap_or_else(|| panic!("ConfigMap {NS}/{name} exists"));
    cm["data"].as_object().cloned().unwrap_or_default()
}

fn text<'a>(d: &'a serde_json::Map<String, Value>, key: &str) -> &'a str {
    d.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("key {key} in {d:#?}"))
}

/// Every request was allowed by the controller's roles (`controller::rbac`).
fn assert_all_allowed(server: &FakeApiServer) {
    let requests = server.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        let attrs = rbac::request_attributes(&r.method, &r.path, r.is_watch())
            .unwrap_or_else(|| panic!("{} {} is not a resource request", r.method, r.path));
        assert!(
            rbac::controller_allows(&attrs, NS),
            "{} {} ({attrs:?}) is not allowed by rbac.rs",
            r.method,
            r.path
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acted_plan_records_events_and_applies_status_configmaps() {
    let server = cluster().await;
    let metrics = Arc::new(Metrics::new());
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-7d9f-abc").with_metrics(metrics.clone());
    let groups = vec![group(H100, 1), group(L4, 3)];
    let snapshot = ClusterSnapshot {
        nodes: vec![
            node("h-1", "gpu-h100", NodeState::Ready),
            node("h-2", "gpu-h100", NodeState::Initializing),
            node("h-3", "gpu-h100", NodeState::Upcoming),
            node("gpu-1", "l4_Spot", NodeState::Deleting),
        ],
        ..Default::default()
    };
    let plan = plan();

    status.begin_loop();
    let pods = plan.scale_ups[0].pods.clone();
    status.scale_up(H100, 1, 2, &pods).await;
    // A retry in the same loop publishes nothing new.
    status.scale_up(H100, 1, 2, &pods).await;
    status.drain_started("gpu-1", "empty for 10m").await;
    status.publish_plan_with_nodes(&plan, &groups, &snapshot, false).await;

    let pod_uid = server.get("pod", "ml", "train-0").unwrap()["metadata"]["uid"].clone();
    let ev = one_event(&server, "ml", "train-0", "TriggeredScaleUp");
    assert_eq!(ev["type"], "Normal");
    assert_eq!(ev["regarding"]["kind"], "Pod");
    assert_eq!(ev["regarding"]["namespace"], "ml");
    assert_eq!(ev["regarding"]["uid"], pod_uid, "the event is attached to the pod (kubectl describe)");
    assert_eq!(ev["reportingController"], "gpuscale");
    assert_eq!(ev["reportingInstance"], "gpuscale-7d9f-abc");
    assert_eq!(ev["note"], format!("pod triggered scale-up: group {H100} 1->2 (+1)"));
    one_event(&server, "ml", "train-1", "TriggeredScaleUp");
    let ev = one_event(&server, "ml", "huge", "NotTriggerScaleUp");
    assert_eq!(ev["note"], "pod didn't trigger scale-up: no node group has 16 GPUs per node");
    let ev = one_event(&server, "default", "gpu-1", "ScaleDown");
    assert_eq!(ev["regarding"]["kind"], "Node");
    assert!(
        ev["note"].as_str().unwrap().starts_with("marked the node unschedulable and started draining"),
        "{ev}"
    );
    assert!(events(&server, "ml", "web", "TriggeredScaleUp").is_empty());
    // Acting mode: the plan's scale-down is done by the controller, not announced by the plan.
    assert_eq!(server.list("events.k8s.io", None).len(), 4, "{:#?}", server.list("events.k8s.io", None));

    let h100 = data(&server, "gpuscale-status-gpu-h100");
    assert_eq!(text(&h100, "group"), H100);
    assert_eq!([text(&h100, "targetSize"), text(&h100, "minSize"), text(&h100, "maxSize")], ["1", "0", "8"]);
    assert_eq!(
        [
            text(&h100, "readyNodes"),
            text(&h100, "initializingNodes"),
            text(&h100, "upcomingNodes"),
            text(&h100, "deletingNodes")
        ],
        ["1", "1", "1", "0"]
    );
    assert_eq!(text(&h100, "lastScaleUpReason"), "1->2 for 2 pending pod(s)");
    text(&h100, "lastScaleUpTime").parse::<Timestamp>().expect("an RFC 3339 time");
    assert!(!h100.contains_key("lastScaleDownTime"));
    assert_eq!(text(&h100, "backoff"), "false");
    assert_eq!(text(&h100, "dryRun"), "false");
    assert!(text(&h100, "lastPlan").starts_with("scale-up 1 -> 2 (+1) for 2 pod(s), +$98.32/h"), "{h100:#?}");
    assert!(
        server.get("configmap", NS, "gpuscale-status-gcp-ml-l4-spot").is_none(),
        "the short name is used when it is unique"
    );
    let l4 = data(&server, "gpuscale-status-l4-spot");
    assert_eq!(text(&l4, "deletingNodes"), "1");
    assert!(text(&l4, "lastPlan").starts_with("scale-down node gpu-1, -$1.60/h: empty for 10m"));

    let all = data(&server, STATUS_CONFIGMAP);
    assert_eq!(text(&all, "dryRun"), "false");
    assert!(text(&all, "summary").contains("SCALE-UP"));
    let doc: serde_yaml::Value =
        serde_yaml::from_str(text(&all, "status.yaml")).expect("status.yaml is YAML");
    assert_eq!(doc["plan"]["scaleUps"][0]["group"].as_str(), Some(H100));
    assert_eq!(doc["plan"]["unschedulable"][0]["pod"].as_str(), Some("ml/huge"));
    assert_eq!(doc["nodeGroups"][1]["configMap"].as_str(), Some("gpuscale-status-l4-spot"));
    assert_eq!(doc["dryRun"].as_bool(), Some(false));

    // Server-side apply by field manager gpuscale.
    let applies: Vec<RecordedRequest> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/configmaps/"))
        .collect();
    assert_eq!(applies.len(), 3);
    for r in &applies {
        assert_eq!(r.content_type.as_deref(), Some("application/apply-patch+yaml"));
        assert_eq!(r.param("fieldManager").as_deref(), Some("gpuscale"));
        assert_eq!(r.param("force").as_deref(), Some("true"));
    }
    assert_all_allowed(&server);
    assert!(!metrics.encode().contains("gpuscale_errors_total"), "no errors:\n{}", metrics.encode());

    // The next loop: the same event again becomes a series on the same Event object.
    status.begin_loop();
    status.scale_up(H100, 1, 2, &pods[..1]).await;
    let ev = one_event(&server, "ml", "train-0", "TriggeredScaleUp");
    assert_eq!(ev["series"]["count"], 2, "{ev:#}");
    assert_all_allowed(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_says_would_and_marks_the_configmaps() {
    let server = cluster().await;
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-0");
    let groups = vec![group(H100, 1), group(L4, 3)];
    status.begin_loop();
    status.publish_plan(&plan(), &groups, true).await;

    let ev = one_event(&server, "ml", "train-0", "TriggeredScaleUp");
    assert_eq!(ev["note"], format!("pod would trigger scale-up (dry run): group {H100} 1->2 (+1)"));
    let ev = one_event(&server, "default", "gpu-1", "ScaleDown");
    assert_eq!(ev["note"], format!("would remove node from group {L4} (dry run): empty for 10m"));
    one_event(&server, "ml", "huge", "NotTriggerScaleUp");
    for e in server.list("events.k8s.io", None) {
        let note = e["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("would") || e["reason"] == "NotTriggerScaleUp",
            "dry-run events say what would happen: {note}"
        );
    }
    // Its own maps, so a dry-run replica never overwrites the acting controller's.
    for name in
        ["gpuscale-dry-run-status-gpu-h100", "gpuscale-dry-run-status-l4-spot", DRY_RUN_STATUS_CONFIGMAP]
    {
        assert_eq!(text(&data(&server, name), "dryRun"), "true", "{name}");
    }
    assert!(server.get("configmap", NS, STATUS_CONFIGMAP).is_none());
    let h100 = data(&server, "gpuscale-dry-run-status-gpu-h100");
    assert!(!h100.contains_key("lastScaleUpTime"), "nothing was acted on");
    assert!(!h100.contains_key("readyNodes"), "publish_plan has no snapshot");

    // Acted-mode calls after a dry-run plan still say "would".
    status.drain_started("gpu-1", "empty").await;
    let drains: Vec<Value> = events(&server, "default", "gpu-1", "ScaleDown");
    assert_eq!(drains.len(), 1, "deduplicated per (object, reason) within the loop");
    assert_all_allowed(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_is_announced_on_the_node_not_on_its_pods() {
    let server = cluster().await;
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-0");
    status.begin_loop();
    status.replacement_requested("gpu-1", H100, 1, 2).await;
    status.publish_plan(&Plan::default(), &[group(H100, 2)], false).await;

    let ev = one_event(&server, "default", "gpu-1", "ScaleDown");
    assert_eq!(ev["regarding"]["kind"], "Node");
    assert_eq!(ev["action"], "Replace");
    assert_eq!(
        ev["note"],
        format!(
            "requested a node of group {H100} (1->2) to replace this node; it is drained once the new \
             node holds its pods"
        )
    );
    assert!(server.list("events.k8s.io", Some("ml")).is_empty(), "its running pods get no scale-up event");
    let h100 = data(&server, "gpuscale-status-gpu-h100");
    assert_eq!(text(&h100, "lastScaleUpReason"), "1->2 to replace node gpu-1");
    assert_all_allowed(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_failures_backoff_and_api_errors() {
    let server = cluster().await;
    let metrics = Arc::new(Metrics::new());
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-0").with_metrics(metrics.clone());
    let groups = vec![group(H100, 2)];
    status.begin_loop();
    status.publish_plan(&Plan::default(), &groups, false).await;

    status.pod_evicted("ml/web", "gpu-1").await;
    status.eviction_blocked("ml/train-0", "gpu-1", "PodDisruptionBudget ml/train allows 0 disruptions").await;
    status.node_deleted("gpu-1", H100).await;
    status.scale_down_failed("gpu-2", H100, "instance i-0abc not found").await;
    status.scale_up_failed(H100, "InsufficientInstanceCapacity in us-east-1a").await;
    let until = Timestamp::now() + SignedDuration::from_mins(5);
    status.set_backoff(H100, Some((until, "InsufficientInstanceCapacity".into())));

    let ev = one_event(&server, "ml", "web", "ScaleDown");
    assert_eq!(ev["note"], "evicting pod from node gpu-1 for scale down");
    let ev = one_event(&server, "default", "gpu-1", "ScaleDownFailed");
    assert_eq!(ev["type"], "Warning");
    assert!(ev["note"].as_str().unwrap().contains("PodDisruptionBudget ml/train allows 0"), "{ev}");
    assert_eq!(one_event(&server, "ml", "train-0", "ScaleDownFailed")["type"], "Warning");
    assert_eq!(
        one_event(&server, "default", "gpu-1", "ScaleDown")["note"],
        format!("node removed from group {H100} by gpuscale")
    );
    // gpu-2 does not exist: the event is still recorded, without a uid.
    let ev = one_event(&server, "default", "gpu-2", "ScaleDownFailed");
    assert!(ev["regarding"].get("uid").is_none_or(Value::is_null), "{ev}");
    let ev = one_event(&server, NS, "gpuscale-status-gpu-h100", "ScaleUpFailed");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["kind"], "ConfigMap");
    let cm_uid = server.get("configmap", NS, "gpuscale-status-gpu-h100").unwrap()["metadata"]["uid"].clone();
    assert_eq!(ev["regarding"]["uid"], cm_uid);

    status.begin_loop();
    status.publish_plan(&Plan::default(), &groups, false).await;
    let d = data(&server, "gpuscale-status-gpu-h100");
    assert_eq!(text(&d, "lastScaleDownReason"), "removed node gpu-1");
    assert_eq!(text(&d, "lastScaleUpFailureReason"), "InsufficientInstanceCapacity in us-east-1a");
    assert_eq!(text(&d, "backoff"), "true");
    assert_eq!(text(&d, "backoffUntil"), until.to_string());
    assert_eq!(text(&d, "lastPlan"), "no action\n");

    // API errors are counted, never fatal.
    server.inject_fault(Fault::new("POST", "/apis/events.k8s.io", 500, 1));
    server.inject_fault(Fault::new("PATCH", &format!("/api/v1/namespaces/{NS}/configmaps"), 500, 10));
    status.begin_loop();
    status.publish_plan(&plan(), &groups, false).await;
    let text = metrics.encode();
    assert!(text.contains("gpuscale_errors_total{kind=\"status\"} 3"), "{text}");
    assert_all_allowed(&server);
}

/// A status write refused loop after loop (the RBAC fault of issue #27: only a counter moved)
/// turns the replica unready with the cause, logs and records one Warning Event on the
/// controller's own pod; one successful write makes it ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_status_write_failures_turn_the_replica_unready_with_an_event() {
    let server = cluster().await;
    let health = Arc::new(Health::new(std::time::Duration::from_secs(60)));
    health.set_synced(true);
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-7d9f-abc").with_health(health.clone());
    let groups = vec![group(H100, 2)];
    let cm_path = format!("/api/v1/namespaces/{NS}/configmaps");
    // Two ConfigMaps per loop (the group's and the cluster's): the first loop's two failures
    // are still a blip, the third failure in a row is not.
    server.inject_fault(Fault::new("PATCH", &cm_path, 403, 2));
    status.begin_loop();
    status.publish_plan(&plan(), &groups, false).await;
    assert_eq!(health.ready(), Ok(()), "two failures in a row are a blip");
    assert!(events(&server, NS, "gpuscale-7d9f-abc", "StatusWriteFailed").is_empty());

    server.inject_fault(Fault::new("PATCH", &cm_path, 403, 4));
    for _ in 0..2 {
        status.begin_loop();
        status.publish_plan(&plan(), &groups, false).await;
    }
    let why = health.ready().expect_err("six failures in a row make the replica unready");
    assert!(why.contains("6 failures in a row") && why.contains("403"), "{why}");
    let ev = one_event(&server, NS, "gpuscale-7d9f-abc", "StatusWriteFailed");
    assert_eq!((ev["type"].as_str(), ev["regarding"]["kind"].as_str()), (Some("Warning"), Some("Pod")));
    assert!(ev["note"].as_str().is_some_and(|n| n.contains("403")), "{ev}");

    status.begin_loop();
    status.publish_plan(&plan(), &groups, false).await;
    assert_eq!(health.ready(), Ok(()), "a written ConfigMap makes the replica ready again");
    assert_all_allowed(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_publishes_in_order_without_blocking_the_caller() {
    let server = cluster().await;
    let (status, task) = StatusPublisher::new(server.client(), NS, "gpuscale-1").spawn();
    let groups = vec![group(H100, 1)];
    status.begin_loop();
    status.scale_up(H100, 1, 2, &["ml/train-0".to_string()]);
    status.node_deleted("gpu-1", H100);
    status.publish_plan(&Plan::default(), &groups, None, false);
    status.flush().await;
    one_event(&server, "ml", "train-0", "TriggeredScaleUp");
    one_event(&server, "default", "gpu-1", "ScaleDown");
    let d = data(&server, "gpuscale-status-gpu-h100");
    assert_eq!(text(&d, "lastScaleUpReason"), "1->2 for 1 pending pod(s)", "published after the scale-up");
    assert_eq!(text(&d, "lastScaleDownReason"), "removed node gpu-1");
    drop(status);
    tokio::time::timeout(std::time::Duration::from_secs(30), task)
        .await
        .expect("the status task ends when its handles are dropped")
        .expect("status task");
}

/// Every plan repeats `NotTriggerScaleUp` for every pod it cannot help (thousands on a large
/// cluster): an unchanged one is not published again in the next loop, a changed one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_not_triggered_event_is_not_published_again_next_loop() {
    let server = cluster().await;
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-0");
    let groups = vec![group(H100, 1)];
    let stuck = |reason: &str| Plan {
        unschedulable: vec![Unschedulable { pod: "ml/huge".into(), reason: reason.into() }],
        ..Default::default()
    };
    let event_writes = || {
        server
            .requests()
            .into_iter()
            .filter(|r| {
                matches!(r.method.as_str(), "POST" | "PATCH") && r.path.contains("/namespaces/ml/events")
            })
            .count()
    };
    for _ in 0..3 {
        status.begin_loop();
        status.publish_plan(&stuck("no node group has 16 GPUs per node"), &groups, false).await;
    }
    let ev = one_event(&server, "ml", "huge", "NotTriggerScaleUp");
    assert!(ev["note"].as_str().is_some_and(|n| n.contains("16 GPUs")), "{ev}");
    assert_eq!(event_writes(), 1, "published once over three loops");

    status.begin_loop();
    status.publish_plan(&stuck("the tenant's GPU quota is used up"), &groups, false).await;
    assert_eq!(event_writes(), 2, "a new reason is published");

    // Once schedulable (not in the plan) and stuck again, it is news again.
    status.begin_loop();
    status.publish_plan(&Plan::default(), &groups, false).await;
    status.begin_loop();
    status.publish_plan(&stuck("the tenant's GPU quota is used up"), &groups, false).await;
    assert_eq!(event_writes(), 3);
    assert_all_allowed(&server);
}

/// A dry run takes no action, so every plan proposes the same scale-ups and scale-downs again:
/// their events (and the lookups of the objects they regard) are published once, again only when
/// the group or reason changes, not once per loop for thousands of pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_announces_each_proposed_action_once_not_every_loop() {
    let server = cluster().await;
    let status = StatusPublisher::new(server.client(), NS, "gpuscale-0");
    let groups = vec![group(H100, 1), group(L4, 3)];
    let writes = |reason: &str| match reason {
        "TriggeredScaleUp" => events_written(&server, &["train-0", "train-1"]),
        _ => events_written(&server, &["gpu-1"]),
    };
    let lookups = || server.requests().into_iter().filter(|r| r.method == "GET").count();
    for loops in 1..=3 {
        // The plan grows loop by loop (more pods, a bigger target): the same actions still.
        let mut p = plan();
        p.scale_ups[0].to = 1 + loops;
        status.begin_loop();
        status.publish_plan(&p, &groups, true).await;
    }
    assert_eq!(writes("TriggeredScaleUp"), 2, "once per pod over three loops");
    assert_eq!(writes("ScaleDown"), 1, "once per node over three loops");
    let looked_up = lookups();

    // train-1 would now trigger another group: news; train-0 is unchanged.
    let mut p = plan();
    p.scale_ups.push(ScaleUp { group: L4.into(), pods: vec!["ml/train-1".into()], ..p.scale_ups[0].clone() });
    p.scale_ups[0].pods.truncate(1);
    status.begin_loop();
    status.publish_plan(&p, &groups, true).await;
    assert_eq!(writes("TriggeredScaleUp"), 3, "train-1 told again (the recorder's series count)");
    assert_eq!(lookups(), looked_up + 1, "only the pod told again is looked up");

    // Gone from the plan and proposed again: news again.
    status.begin_loop();
    status.publish_plan(&Plan::default(), &groups, true).await;
    status.begin_loop();
    status.publish_plan(&plan(), &groups, true).await;
    assert_eq!(writes("TriggeredScaleUp"), 5);
    assert_eq!(writes("ScaleDown"), 2);
    assert_all_allowed(&server);
}

/// Event writes (creates and series updates) regarding objects named `names`.
fn events_written(server: &FakeApiServer, names: &[&str]) -> usize {
    server
        .requests()
        .into_iter()
        .filter(|r| matches!(r.method.as_str(), "POST" | "PATCH") && r.path.contains("/events"))
        .filter(|r| {
            names.iter().any(|n| r.path.contains(&format!("/{n}.")) || r.body.contains(&format!("\"{n}\"")))
        })
        .count()
}

/// The publisher writes only while its replica leads: what a deposed leader still has queued
/// (events, ConfigMaps) is dropped, not written over its successor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_writes_no_events_or_configmaps() {
    use gpuscale::controller::leader::Fence;
    let server = cluster().await;
    let (status, task) = StatusPublisher::new(server.client(), NS, "gpuscale-1").spawn();
    let (claim, fence) = Fence::channel();
    claim.send_replace(Some(tokio::time::Instant::now() + std::time::Duration::from_secs(60)));
    status.set_fence(fence);
    let groups = vec![group(H100, 1)];
    let writes = || {
        server
            .requests()
            .into_iter()
            .filter(|r| matches!(r.method.as_str(), "POST" | "PATCH" | "PUT"))
            .count()
    };
    status.begin_loop();
    status.scale_up(H100, 1, 2, &["ml/train-0".to_string()]);
    status.publish_plan(&plan(), &groups, None, false);
    status.flush().await;
    one_event(&server, "ml", "train-0", "TriggeredScaleUp");
    assert!(server.get("configmap", NS, STATUS_CONFIGMAP).is_some(), "the leader writes its status");
    let while_leading = writes();

    // Leadership lost; the loop had queued more before it noticed.
    claim.send_replace(None);
    status.begin_loop();
    status.scale_up(H100, 2, 3, &["ml/train-1".to_string()]);
    status.preempted("ml/web", "gpu-1", "ml/huge", "reclaim");
    status.node_deleted("gpu-1", H100);
    status.publish_plan(&Plan::default(), &groups, None, false);
    status.flush().await;
    assert_eq!(writes(), while_leading, "no write once the lease is lost: {:#?}", server.requests());
    let d = data(&server, "gpuscale-status-gpu-h100");
    assert_ne!(text(&d, "lastScaleUpReason"), "2->3 for 1 pending pod(s)");

    // Leading again (a new term), it writes again.
    claim.send_replace(Some(tokio::time::Instant::now() + std::time::Duration::from_secs(60)));
    status.begin_loop();
    status.preempted("ml/web", "gpu-1", "ml/huge", "reclaim");
    status.flush().await;
    one_event(&server, "ml", "web", "Preempted");
    drop(status);
    task.await.expect("status task");
}
