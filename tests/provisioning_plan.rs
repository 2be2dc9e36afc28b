//! ProvisioningRequests (#24): exact plans on snapshots shaped as `kubectl get
//! nodes,pods,podtemplates,provisioningrequests -A -o json` shows them, with requests and
//! PodTemplates as Kueue's ProvisioningRequest admission check creates them.

use gpuscale::k8s::SourcedObject;
use gpuscale::planner::{self, Plan, PlanInput, PlannerSettings, RequestState};
use serde_json::{json, Value};

const NOW: i64 = 1_790_000_000;

const GROUPS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 16, targetSize: 0}
      - {name: l4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 16, targetSize: 0}
"#;

fn time(offset: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(NOW + offset).unwrap().to_string()
}

/// A Ready H100 node of group `h100` with 8 device-plugin GPUs.
fn h100(name: &str) -> Value {
    let alloc = json!({"cpu": "191450m", "memory": "1900Gi", "pods": "737", "nvidia.com/gpu": "8"});
    json!({"apiVersion": "v1", "kind": "Node",
      "metadata": {"name": name, "creationTimestamp": time(-86400), "labels": {
          "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "p5.48xlarge",
          "topology.kubernetes.io/zone": "us-east-1a", "eks.amazonaws.com/nodegroup": "h100",
          "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}},
      "spec": {"providerID": format!("aws:///us-east-1a/i-{name}")},
      "status": {"allocatable": alloc, "capacity": alloc,
                 "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
}

/// The pod spec of a training worker asking for `gpus` H100s.
fn worker_spec(gpus: u32) -> Value {
    json!({"containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
        "resources": {"requests": {"cpu": "16", "memory": "200Gi", "nvidia.com/gpu": gpus.to_string()},
                      "limits": {"nvidia.com/gpu": gpus.to_string()}}}],
      "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
      "restartPolicy": "Never"})
}

/// A PodTemplate as Kueue creates it for a request's pod set (`ppt-<request>-<podset>`).
fn pod_template(name: &str, gpus: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "PodTemplate",
      "metadata": {"name": name, "namespace": "ml", "labels": {"kueue.x-k8s.io/managed": "true"},
                   "creationTimestamp": time(-60)},
      "template": {"metadata": {"labels": {"kueue.x-k8s.io/podset": "workers"}}, "spec": worker_spec(gpus)}})
}

/// A ProvisioningRequest as Kueue creates it (`<workload>-<check>-<attempt>`).
fn request(name: &str, class: &str, sets: &[(&str, u32)], conditions: Value) -> Value {
    let sets: Vec<Value> =
        sets.iter().map(|(t, n)| json!({"podTemplateRef": {"name": t}, "count": n})).collect();
    json!({"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
      "metadata": {"name": name, "namespace": "ml", "creationTimestamp": time(-60), "generation": 1,
                   "labels": {"kueue.x-k8s.io/managed": "true"}},
      "spec": {"provisioningClassName": class, "podSets": sets, "parameters": null},
      "status": {"conditions": conditions}})
}

const ATOMIC: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
const CHECK: &str = "check-capacity.autoscaling.x-k8s.io";

fn provisioned(ago: i64) -> Value {
    json!([
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": time(-ago - 30)},
        {"type": "Provisioned", "status": "True", "reason": "CapacityIsFound", "message": "", "lastTransitionTime": time(-ago)}
    ])
}

/// A pending pod, consuming `request` when given.
fn pending(name: &str, gpus: u32, request: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": name, "namespace": "ml", "creationTimestamp": time(-10),
                   "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j", "controller": true}]},
      "spec": worker_spec(gpus), "status": {"phase": "Pending"}});
    if let Some(r) = request {
        p["metadata"]["annotations"] = json!({
            "autoscaling.x-k8s.io/consume-provisioning-request": r,
            "autoscaling.x-k8s.io/provisioning-class-name": ATOMIC});
    }
    p
}

fn running(mut p: Value, node: &str) -> Value {
    p["spec"]["nodeName"] = json!(node);
    p["status"]["phase"] = json!("Running");
    p
}

fn snapshot(objects: &[Value]) -> gpuscale::model::ClusterSnapshot {
    // Both ingest paths: the general one and the fast one of a kubectl List file.
    let objs: Vec<SourcedObject> = objects.iter().cloned().map(|o| SourcedObject::new("test", o)).collect();
    let snapshot = gpuscale::k8s::convert(&objs).expect("a valid snapshot").snapshot;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&file, serde_json::to_string(&list).unwrap()).unwrap();
    let fast = gpuscale::k8s::load_snapshot(&file).expect("a valid snapshot").snapshot;
    assert_eq!(serde_json::to_value(&snapshot).unwrap(), serde_json::to_value(&fast).unwrap());
    snapshot
}

fn plan_with(objects: &[Value], groups: &str, scale_down: bool) -> Plan {
    let groups = gpuscale::providers::config::load_strs(&[("groups.yaml", groups)])
        .expect("valid provider config")
        .node_groups();
    let input = PlanInput {
        snapshot: snapshot(objects),
        groups,
        unavailable: Default::default(),
        ..Default::default()
    };
    planner::plan(&input, &PlannerSettings { scale_down, now: Some(NOW), ..Default::default() })
}

fn plan(objects: &[Value]) -> Plan {
    plan_with(objects, GROUPS, false)
}

fn outcome(p: &Plan, id: &str) -> (RequestState, String, String) {
    let r =
        p.provisioning_requests.iter().find(|r| r.request == id).unwrap_or_else(|| panic!("{id} in {p:#?}"));
    (r.state, r.reason.clone(), r.message.clone())
}

fn scale_ups(p: &Plan) -> Vec<(String, u32, Vec<String>, Vec<String>)> {
    p.scale_ups
        .iter()
        .map(|s| {
            (
                s.group.rsplit('/').next().unwrap().to_string(),
                s.to - s.from,
                s.pods.clone(),
                s.requests.clone(),
            )
        })
        .collect()
}

#[test]
fn an_atomic_request_for_four_eight_gpu_workers_is_one_plus_four_scale_up_naming_it() {
    let p = plan(&[
        h100("h100-a"),
        running(pending("busy", 8, None), "h100-a"),
        pod_template("ppt-train-prov-1-workers", 8),
        request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 4)], json!([])),
    ]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 4, vec![], vec!["ml/train-prov-1".into()])]);
    let (state, reason, _) = outcome(&p, "ml/train-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::ScalingUp, "CapacityIsBeingProvisioned"));
    // Its stand-ins are neither placements nor unschedulable pods.
    assert!(p.placements.is_empty() && p.unschedulable.is_empty(), "{p:#?}");
    let table = p.to_table();
    assert!(table.contains("ProvisioningRequest ml/train-prov-1"), "{table}");
    assert!(table.contains("PROVISIONING  ml/train-prov-1"), "{table}");
}

#[test]
fn an_atomic_request_whose_nodes_are_on_their_way_is_not_scaled_for_again() {
    // The loop after the scale-up: the group's target is 4 and its instances not yet nodes.
    let groups = GROUPS.replace(
        "maxSize: 16, targetSize: 0}\n      - {name: l4",
        "maxSize: 16, targetSize: 4}\n      - {name: l4",
    );
    let objects = [
        pod_template("ppt-train-prov-1-workers", 8),
        request(
            "train-prov-1",
            ATOMIC,
            &[("ppt-train-prov-1-workers", 4)],
            json!([{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": time(-50)},
                   {"type": "Provisioned", "status": "False", "reason": "CapacityIsBeingProvisioned", "message": "", "lastTransitionTime": time(-50)}]),
        ),
    ];
    let p = plan_with(&objects, &groups, false);
    assert!(p.scale_ups.is_empty(), "{:?}", scale_ups(&p));
    assert_eq!(outcome(&p, "ml/train-prov-1").0, RequestState::Provisioning);

    // The nodes came: provisioned, in the words Kueue passes on.
    let mut objects = objects.to_vec();
    objects.extend((0..4).map(|i| h100(&format!("h100-{i}"))));
    let p = plan_with(&objects, &groups, false);
    let (state, reason, _) = outcome(&p, "ml/train-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::Provisioned, "CapacityIsProvisioned"));
    assert!(p.scale_ups.is_empty());
}

#[test]
fn a_check_capacity_request_that_fits_is_provisioned_without_a_scale_up() {
    let p = plan(&[
        h100("h100-a"),
        h100("h100-b"),
        pod_template("ppt-eval-prov-1-workers", 4),
        request("eval-prov-1", CHECK, &[("ppt-eval-prov-1-workers", 4)], json!([])),
    ]);
    let (state, reason, _) = outcome(&p, "ml/eval-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::Provisioned, "CapacityIsFound"));
    assert!(p.scale_ups.is_empty() && p.placements.is_empty(), "{p:#?}");
    let nodes = &p.provisioning_requests[0].nodes;
    assert_eq!(nodes, &vec!["h100-a (x2)".to_string(), "h100-b (x2)".to_string()]);
}

#[test]
fn a_check_capacity_request_that_does_not_fit_waits_or_fails_with_the_reason_and_never_scales() {
    // Pending pods take what fits first: the request is checked against what they leave.
    let p = plan(&[
        h100("h100-a"),
        pending("other", 6, None),
        pod_template("ppt-eval-prov-1-workers", 4),
        request("eval-prov-1", CHECK, &[("ppt-eval-prov-1-workers", 2)], json!([])),
    ]);
    // Not found now: asked again every pass (Provisioned=False), as Cluster Autoscaler does.
    let (state, reason, message) = outcome(&p, "ml/eval-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::NotFound, "CapacityIsNotFound"));
    assert_eq!(message, "0 of its 2 pod(s) fit the free capacity of Ready nodes");
    assert_eq!(p.placements.iter().map(|x| x.pod.as_str()).collect::<Vec<_>>(), vec!["ml/other"]);
    assert!(p.scale_ups.is_empty(), "{:?}", scale_ups(&p));

    // With `noRetry`, Kueue asks for a failure instead: it retries with a new request.
    let mut r = request("eval-prov-1", CHECK, &[("ppt-eval-prov-1-workers", 2)], json!([]));
    r["spec"]["parameters"] = json!({"noRetry": "true"});
    let p = plan(&[h100("h100-a"), pending("other", 6, None), pod_template("ppt-eval-prov-1-workers", 4), r]);
    let (state, reason, _) = outcome(&p, "ml/eval-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::Failed, "CapacityIsNotFound"));
}

#[test]
fn an_atomic_request_no_group_can_hold_whole_is_not_found_and_adds_nothing() {
    // 4 x 8 GPUs, but the H100 group may grow by 3 only: nothing is bought for a part of it.
    let groups = GROUPS.replace(
        "maxSize: 16, targetSize: 0}\n      - {name: l4",
        "maxSize: 3, targetSize: 0}\n      - {name: l4",
    );
    let p = plan_with(
        &[
            pod_template("ppt-train-prov-1-workers", 8),
            request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 4)], json!([])),
        ],
        &groups,
        false,
    );
    assert!(p.scale_ups.is_empty(), "{:?}", scale_ups(&p));
    assert_eq!(p.cost_after, p.cost_before);
    let (state, reason, message) = outcome(&p, "ml/train-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::NotFound, "CapacityIsNotFound"));
    assert!(message.contains("h100: gang of 4 does not fit in 3 new node(s)"), "{message}");
}

#[test]
fn booked_capacity_is_held_from_pending_pods_and_scale_down_until_the_booking_expires() {
    let objects = |provisioned_ago: i64| {
        vec![
            h100("h100-a"),
            h100("h100-b"),
            running(pending("busy", 8, None), "h100-a"),
            pending("late", 8, None),
            pod_template("ppt-train-prov-1-workers", 8),
            request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 1)], provisioned(provisioned_ago)),
        ]
    };
    // Booked 2 minutes ago: h100-b is the request's, so the other pod needs a new node, and
    // h100-b is not removed although no pod runs there.
    let p = plan_with(&objects(120), GROUPS, true);
    let (state, _, message) = outcome(&p, "ml/train-prov-1");
    assert_eq!(state, RequestState::Booked);
    assert!(message.starts_with("booked for 8m") && message.ends_with("0 of its 1 pod(s) came"), "{message}");
    assert_eq!(scale_ups(&p), vec![("h100".into(), 1, vec!["ml/late".to_string()], vec![])]);
    assert!(p.scale_downs.is_empty() && p.placements.is_empty(), "{p:#?}");

    // Ten minutes on, the booking has expired: the pod takes h100-b.
    let p = plan_with(&objects(600), GROUPS, true);
    let (state, reason, _) = outcome(&p, "ml/train-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::BookingExpired, "CapacityReservationTimeExpired"));
    assert!(p.scale_ups.is_empty());
    assert_eq!(
        p.placements.iter().map(|x| (x.pod.as_str(), x.node.as_str())).collect::<Vec<_>>(),
        vec![("ml/late", "h100-b")]
    );
}

#[test]
fn pods_that_consume_a_request_use_its_booking_and_wait_while_it_is_not_provisioned() {
    // Not provisioned yet: its pods wait for it, and no scale-up is made for them on their own.
    let p = plan(&[
        pod_template("ppt-train-prov-1-workers", 8),
        request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 2)], json!([])),
        pending("train-0", 8, Some("train-prov-1")),
    ]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 2, vec![], vec!["ml/train-prov-1".into()])]);
    assert_eq!(p.unschedulable.len(), 1);
    assert_eq!(p.unschedulable[0].reason, "waits for ProvisioningRequest ml/train-prov-1 to be provisioned");

    // Provisioned: the pod that came is placed on the booked room; the one still to come keeps its own.
    let p = plan(&[
        h100("h100-a"),
        h100("h100-b"),
        pod_template("ppt-train-prov-1-workers", 8),
        request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 2)], provisioned(30)),
        pending("train-0", 8, Some("train-prov-1")),
        pending("other", 8, None),
    ]);
    assert_eq!(outcome(&p, "ml/train-prov-1").0, RequestState::Booked);
    assert_eq!(p.placements.iter().map(|x| x.pod.as_str()).collect::<Vec<_>>(), vec!["ml/train-0"]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 1, vec!["ml/other".to_string()], vec![])]);

    // All its pods scheduled: the booking is used up.
    let p = plan(&[
        h100("h100-a"),
        h100("h100-b"),
        pod_template("ppt-train-prov-1-workers", 8),
        request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 2)], provisioned(30)),
        running(pending("train-0", 8, Some("train-prov-1")), "h100-a"),
        running(pending("train-1", 8, Some("train-prov-1")), "h100-b"),
    ]);
    let (state, reason, _) = outcome(&p, "ml/train-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::BookingExpired, "CapacityBookingConsumed"));
}

#[test]
fn requests_that_cannot_be_served_fail_or_are_left_alone_with_the_reason() {
    let p = plan(&[
        request("gone-prov-1", ATOMIC, &[("ppt-gone-prov-1-workers", 1)], json!([])),
        pod_template("ppt-other-prov-1-workers", 1),
        request("other-prov-1", "queued-provisioning.gke.io", &[("ppt-other-prov-1-workers", 1)], json!([])),
        pod_template("ppt-old-prov-1-workers", 1),
        {
            let mut r = request("old-prov-1", ATOMIC, &[("ppt-old-prov-1-workers", 1)], json!([]));
            r["metadata"]["creationTimestamp"] = json!(time(-8 * 24 * 3600));
            r
        },
    ]);
    let (state, reason, message) = outcome(&p, "ml/gone-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::Failed, "FailedToCreatePods"));
    assert_eq!(
        message,
        "PodTemplate ml/ppt-gone-prov-1-workers (spec.podSets[0].podTemplateRef.name) not found"
    );
    let (state, _, message) = outcome(&p, "ml/other-prov-1");
    assert_eq!(state, RequestState::Ignored);
    assert!(message.contains("queued-provisioning.gke.io"), "{message}");
    let (state, reason, _) = outcome(&p, "ml/old-prov-1");
    assert_eq!((state, reason.as_str()), (RequestState::Failed, "Expired"));
    assert!(p.scale_ups.is_empty(), "{:?}", scale_ups(&p));
}

#[test]
fn a_malformed_request_is_an_error_naming_object_and_field() {
    let objs =
        [SourcedObject::new("cluster.json", request("bad", ATOMIC, &[("ppt-bad-workers", 0)], json!([])))];
    let err = gpuscale::k8s::convert(&objs).unwrap_err().to_string();
    assert_eq!(
        err,
        "cluster.json: ProvisioningRequest ml/bad: spec.podSets[0].count: \"0\": must be at least 1"
    );
    let mut r = request("bad", ATOMIC, &[("t", 1)], json!([]));
    r["spec"]["parameters"] = json!({"bookingTimeSeconds": "soon"});
    let err = gpuscale::k8s::convert(&[SourcedObject::new("cluster.json", r)]).unwrap_err().to_string();
    assert!(err.contains("spec.parameters[bookingTimeSeconds]: \"soon\""), "{err}");
}

#[test]
fn a_pod_kueue_has_not_admitted_yet_is_gated_and_not_scaled_for() {
    // Kueue's pod integration gates the pods of a workload until it is admitted: kube-scheduler
    // does not try them, so neither a placement nor a scale-up is theirs yet.
    let mut gated = pending("train-0", 8, None);
    gated["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
    let p = plan(&[gated.clone(), pending("other", 8, None)]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 1, vec!["ml/other".to_string()], vec![])]);
    assert_eq!(
        p.unschedulable.iter().map(|u| (u.pod.as_str(), u.reason.as_str())).collect::<Vec<_>>(),
        vec![(
            "ml/train-0",
            "scheduling gated (kueue.x-k8s.io/admission): kube-scheduler leaves it until its gates are removed"
        )]
    );
    // Kueue's PodTemplates copy the pod, gate included: the request plans the pods as they will
    // be once admitted.
    let mut template = pod_template("ppt-train-prov-1-workers", 8);
    template["template"]["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
    let p = plan(&[
        template,
        request("train-prov-1", ATOMIC, &[("ppt-train-prov-1-workers", 1)], json!([])),
        gated.clone(),
    ]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 1, vec![], vec!["ml/train-prov-1".into()])]);
    // Ungated (admitted): demand like any pod.
    gated["spec"]["schedulingGates"] = json!([]);
    let p = plan(&[gated]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 1, vec!["ml/train-0".to_string()], vec![])]);
}

/// A pending pod being deleted (`metadata.deletionTimestamp`) is no demand: kube-scheduler skips
/// it, and scaling for it would buy a node nobody uses.
#[test]
fn a_pending_pod_being_deleted_is_not_scaled_for() {
    let mut going = pending("train-0", 8, None);
    going["metadata"]["deletionTimestamp"] = json!("2026-12-05T10:00:00Z");
    let p = plan(&[going.clone(), pending("other", 8, None)]);
    assert_eq!(scale_ups(&p), vec![("h100".into(), 1, vec!["ml/other".to_string()], vec![])]);
    assert_eq!(
        p.unschedulable.iter().map(|u| (u.pod.as_str(), u.reason.as_str())).collect::<Vec<_>>(),
        vec![(
            "ml/train-0",
            "being deleted (metadata.deletionTimestamp is set): kube-scheduler does not schedule it"
        )]
    );
}
