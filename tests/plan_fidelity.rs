//! The cases that made `plan` answer FITS where kube-scheduler leaves the pod Pending: required
//! anti-affinity to pods on every node, a non-GPU extended resource (EFA) no node offers, and a
//! node at its pod limit. Each pending pod is placed on an existing node only where kube-scheduler
//! would place it (`tests/e2e/k8s_scheduler_diff.rs` checks the same filters against the real one).

use gpuscale::k8s::SourcedObject;
use gpuscale::planner::{self, PlanInput, PlannerSettings};
use serde_json::{json, Value};

fn node(name: &str, max_pods: u32, efa: u32) -> Value {
    let mut alloc =
        json!({"cpu": "48", "memory": "192Gi", "pods": max_pods.to_string(), "nvidia.com/gpu": "4"});
    if efa > 0 {
        alloc["vpc.amazonaws.com/efa"] = json!(efa.to_string());
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "us-east-1a",
                     "node.kubernetes.io/instance-type": "g6.12xlarge"}},
        "spec": {"providerID": format!("aws:///us-east-1a/{name}")},
        "status": {"capacity": alloc, "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn pod(name: &str, app: &str, node: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
        p["status"]["phase"] = json!("Running");
    }
    p
}

/// The snapshot `objects` make, as `gpuscale plan` reads it.
fn snapshot_of(objects: Vec<Value>) -> gpuscale::k8s::LoadedSnapshot {
    let objects: Vec<SourcedObject> = objects.into_iter().map(|o| SourcedObject::new("test", o)).collect();
    gpuscale::k8s::convert(&objects).expect("a valid snapshot")
}

/// The plan (without scale-down) for `objects` and the node groups of a provider config, if any.
fn plan_of(objects: Vec<Value>, groups_yaml: Option<&str>) -> gpuscale::planner::Plan {
    let groups = groups_yaml.map_or_else(Vec::new, |yaml| {
        gpuscale::providers::config::load_strs(&[("groups.yaml", yaml)])
            .expect("valid provider config")
            .node_groups()
    });
    let input = PlanInput {
        snapshot: snapshot_of(objects).snapshot,
        groups,
        unavailable: Default::default(),
        ..Default::default()
    };
    planner::plan(&input, &PlannerSettings { scale_down: false, ..Default::default() })
}

/// The pods of `objects` the planner places on existing nodes, by name.
fn placed(objects: Vec<Value>) -> Vec<(String, String)> {
    let plan = plan_of(objects, None);
    plan.placements.iter().map(|p| (p.pod.clone(), p.node.clone())).collect()
}

#[test]
fn anti_affinity_to_pods_on_every_node_leaves_the_pod_unplaced() {
    let base = vec![
        node("n1", 110, 0),
        node("n2", 110, 0),
        pod("db-1", "db", Some("n1")),
        pod("db-2", "db", Some("n2")),
    ];
    let mut repelled = pod("web", "web", None);
    repelled["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    let mut objects = base.clone();
    objects.push(repelled);
    assert_eq!(placed(objects), vec![]);
    // With db only on n1, the pod goes to n2.
    let mut objects = base[..3].to_vec();
    objects.push(node("n2", 110, 0));
    let mut repelled = pod("web", "web", None);
    repelled["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    objects.push(repelled);
    assert_eq!(placed(objects), vec![("ml/web".to_string(), "n2".to_string())]);
}

#[test]
fn an_extended_resource_is_placed_only_where_a_node_offers_it() {
    let mut efa_pod = pod("mpi", "mpi", None);
    efa_pod["spec"]["containers"][0]["resources"]["requests"]["vpc.amazonaws.com/efa"] = json!("1");
    efa_pod["spec"]["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = json!("1");
    assert_eq!(placed(vec![node("plain", 110, 0), efa_pod.clone()]), vec![]);
    assert_eq!(
        placed(vec![node("plain", 110, 0), node("efa", 110, 1), efa_pod]),
        vec![("ml/mpi".to_string(), "efa".to_string())]
    );
}

#[test]
fn a_node_at_its_pod_limit_takes_no_more_pods() {
    let objects = vec![
        node("full", 2, 0),
        pod("a", "x", Some("full")),
        pod("b", "x", Some("full")),
        pod("c", "x", None),
    ];
    assert_eq!(placed(objects), vec![]);
    let objects = vec![
        node("roomy", 3, 0),
        pod("a", "x", Some("roomy")),
        pod("b", "x", Some("roomy")),
        pod("c", "x", None),
    ];
    assert_eq!(placed(objects), vec![("ml/c".to_string(), "roomy".to_string())]);
}

/// Node groups in two zones, none running: what a scale-up chooses from.
const ZONAL_GROUPS: &str = r#"
accounts:
  - name: c
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: l4-a, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 10, targetSize: 0}
      - {name: l4-b, instanceType: g6.12xlarge, zones: [us-east-1b], minSize: 0, maxSize: 10, targetSize: 0}
"#;

/// The plan for `objects` with the zonal groups, as (group, from, to) per scale-up and the pods
/// left unschedulable.
fn scale_ups(objects: Vec<Value>, groups_yaml: &str) -> (Vec<(String, u32, u32)>, Vec<String>) {
    let plan = plan_of(objects, Some(groups_yaml));
    let ups = plan
        .scale_ups
        .iter()
        .map(|s| (s.group.rsplit('/').next().unwrap().to_string(), s.from, s.to))
        .collect();
    (ups, plan.unschedulable.iter().map(|u| u.pod.clone()).collect())
}

fn replica(name: &str, app: &str) -> Value {
    let mut p = pod(name, app, None);
    p["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": "u", "controller": true}]);
    p
}

#[test]
fn three_anti_affine_replicas_ask_for_three_new_nodes() {
    // A 4-GPU node holds all three 1-GPU replicas by resources; one per host is what
    // kube-scheduler will allow, so three nodes are needed.
    let mut objects = Vec::new();
    for i in 0..3 {
        let mut p = replica(&format!("web-{i}"), "web");
        p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}});
        objects.push(p);
    }
    let (ups, unschedulable) = scale_ups(objects.clone(), ZONAL_GROUPS);
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups.iter().map(|(_, from, to)| to - from).sum::<u32>(), 3, "{ups:?}");
    // Without the anti-affinity one node holds them.
    for p in &mut objects {
        p["spec"].as_object_mut().unwrap().remove("affinity");
    }
    let (ups, _) = scale_ups(objects, ZONAL_GROUPS);
    assert_eq!(ups.iter().map(|(_, from, to)| to - from).sum::<u32>(), 1, "{ups:?}");
}

#[test]
fn an_anti_affine_gang_gets_a_node_per_member() {
    // Four members of a job, one per host (required anti-affinity to each other): a whole gang,
    // all or nothing, so the scale-up must hold all four at once.
    let mut objects = Vec::new();
    for i in 0..4 {
        let mut p = pod(&format!("job-{i}"), "job", None);
        p["metadata"]["annotations"] = json!({"scheduling.k8s.io/group-name": "job"});
        p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "job"}}, "topologyKey": "kubernetes.io/hostname"}]}});
        objects.push(p);
    }
    let (ups, unschedulable) = scale_ups(objects, ZONAL_GROUPS);
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups.iter().map(|(_, from, to)| to - from).sum::<u32>(), 4, "{ups:?}");
}

/// An EFA pod scales only a group whose nodes offer EFA: declared in the provider config before
/// any node has registered, or learned from the group's registered nodes.
#[test]
fn an_efa_pod_scales_the_group_that_offers_efa() {
    let mut mpi = replica("mpi", "mpi");
    mpi["spec"]["containers"][0]["resources"]["requests"]["vpc.amazonaws.com/efa"] = json!("1");
    mpi["spec"]["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = json!("1");
    let groups = |efa: &str| {
        format!(
            "accounts:\n  - name: prod\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      \
             - {{name: plain, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 10, targetSize: 0}}\n      \
             - {{name: fabric, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 4, targetSize: 0{efa}}}\n"
        )
    };
    let (ups, unschedulable) =
        scale_ups(vec![mpi.clone()], &groups(", extendedResources: {vpc.amazonaws.com/efa: 32}"));
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups, vec![("fabric".to_string(), 0, 1)]);
    // Nothing says the group's nodes have EFA: no group can take the pod.
    let (ups, unschedulable) = scale_ups(vec![mpi.clone()], &groups(""));
    assert_eq!((ups, unschedulable), (vec![], vec!["ml/mpi".to_string()]));
    // A registered node of the group shows it (it is full, so the pod still needs a new one).
    let mut member = node("fabric-1", 110, 32);
    member["metadata"]["labels"]["node.kubernetes.io/instance-type"] = json!("p5.48xlarge");
    member["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = json!("fabric");
    member["status"]["allocatable"]["vpc.amazonaws.com/efa"] = json!("32");
    member["status"]["allocatable"]["pods"] = json!("1");
    let mut filler = pod("filler", "filler", Some("fabric-1"));
    filler["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    let (ups, unschedulable) = scale_ups(vec![member, filler, mpi], &groups(""));
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups.iter().map(|(g, _, _)| g.as_str()).collect::<Vec<_>>(), vec!["fabric"]);
}

/// New nodes hold no more pods than their kubelet allows: the instance type's EKS pod limit
/// (g5.xlarge: 58), or the group's `maxPods`.
#[test]
fn new_nodes_hold_no_more_pods_than_their_pod_limit() {
    let objects: Vec<Value> = (0..70)
        .map(|i| {
            let mut p = replica(&format!("tiny-{i}"), "tiny");
            p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "10m", "memory": "16Mi"}});
            p
        })
        .collect();
    let groups = |max_pods: &str| {
        format!(
            "accounts:\n  - name: prod\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      \
             - {{name: small, instanceType: g5.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 10, targetSize: 0{max_pods}}}\n"
        )
    };
    assert_eq!(
        scale_ups(objects.clone(), &groups("")).0,
        vec![("small".to_string(), 0, 2)],
        "58 pods a node"
    );
    assert_eq!(scale_ups(objects, &groups(", maxPods: 110")).0, vec![("small".to_string(), 0, 1)]);
}

/// A multi-zone group's new instances go where its Auto Scaling group puts them: the zone with
/// the fewest of its nodes. Two replicas spread over at least two zones need a node in each.
#[test]
fn a_multi_zone_group_grows_into_its_emptiest_zone() {
    let groups = "accounts:\n  - name: prod\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      \
        - {name: l4, instanceType: g6.12xlarge, zones: [us-east-1a, us-east-1b], minSize: 0, maxSize: 10, targetSize: 0}\n";
    let spread: Vec<Value> = (0..2)
        .map(|i| {
            let mut p = replica(&format!("web-{i}"), "web");
            p["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 1, "minDomains": 2,
                "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}}}]);
            p
        })
        .collect();
    let plan = plan_of(spread, Some(groups));
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    let ups: Vec<(u32, u32)> = plan.scale_ups.iter().map(|s| (s.from, s.to)).collect();
    assert_eq!(ups.iter().map(|(f, t)| t - f).sum::<u32>(), 2, "{ups:?}");

    // A pod that must run in us-east-1b: the group's next instance lands in us-east-1a while
    // that zone has no more of its nodes, and in us-east-1b once it has one.
    let mut pinned = replica("pinned", "pinned");
    pinned["spec"]["nodeSelector"] = json!({"topology.kubernetes.io/zone": "us-east-1b"});
    let (ups, unschedulable) = scale_ups(vec![pinned.clone()], groups);
    assert_eq!((ups, unschedulable), (vec![], vec!["ml/pinned".to_string()]));
    let mut in_a = node("l4-a-1", 1, 0);
    in_a["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = json!("l4");
    let mut filler = pod("filler", "filler", Some("l4-a-1"));
    filler["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    let (ups, unschedulable) = scale_ups(vec![in_a, filler, pinned], groups);
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups, vec![("l4".to_string(), 0, 1)]);
}

/// Among equally good nodes, the one the pod prefers: preferred node affinity (the highest summed
/// weight), then `ScheduleAnyway` spread (the domain with fewest matching pods), as
/// kube-scheduler's scores rank them. Each case is checked with the zones swapped between the two
/// otherwise identical nodes, so the choice follows the preference, not the node order.
#[test]
fn preferences_break_ties_between_equal_nodes() {
    let twins = |first_zone: &str, second_zone: &str| {
        let mut a = node("twin-1", 110, 0);
        a["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!(first_zone);
        let mut b = node("twin-2", 110, 0);
        b["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!(second_zone);
        vec![a, b]
    };
    let in_zone = |objects: &[Value], zone: &str| -> String {
        let n =
            objects.iter().find(|o| o["metadata"]["labels"]["topology.kubernetes.io/zone"] == zone).unwrap();
        n["metadata"]["name"].as_str().unwrap().to_string()
    };
    let mut prefers_b = pod("prefers-b", "prefers-b", None);
    prefers_b["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}},
        {"weight": 50, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]}]}}]}});
    for (z1, z2) in [("us-east-1a", "us-east-1b"), ("us-east-1b", "us-east-1a")] {
        let mut objects = twins(z1, z2);
        let want = in_zone(&objects, "us-east-1b");
        objects.push(prefers_b.clone());
        assert_eq!(placed(objects), vec![("ml/prefers-b".to_string(), want)]);
    }

    // A replica of `web` already runs in us-east-1b (on a third, full node): the new one would
    // rather go to us-east-1a.
    let mut spreads = pod("web-2", "web", None);
    spreads["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}]);
    for (z1, z2) in [("us-east-1a", "us-east-1b"), ("us-east-1b", "us-east-1a")] {
        let mut objects = twins(z1, z2);
        let want = in_zone(&objects, "us-east-1a");
        let mut full = node("full", 1, 0);
        full["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("us-east-1b");
        objects.extend([full, pod("web-1", "web", Some("full")), spreads.clone()]);
        assert_eq!(placed(objects), vec![("ml/web-2".to_string(), want)]);
    }
}

/// A cluster whose kube-scheduler spreads every controller's pods over zones by default
/// (`defaultingType: List`, `DoNotSchedule`): a ReplicaSet's second replica may not join the
/// first in its zone, although resources would allow it.
#[test]
fn cluster_default_spread_constraints_apply_to_controlled_pods() {
    let mut a = node("a-1", 110, 0);
    a["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("us-east-1a");
    let mut b = node("b-1", 1, 0);
    b["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("us-east-1b");
    let mut filler = pod("filler", "filler", Some("b-1"));
    filler["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    let mut first = replica("web-1", "web");
    first["spec"]["nodeName"] = json!("a-1");
    first["status"]["phase"] = json!("Running");
    let objects = vec![a, b, filler, first, replica("web-2", "web")];
    let input =
        PlanInput { snapshot: snapshot_of(objects).snapshot, groups: Vec::new(), ..Default::default() };
    let settings = PlannerSettings { scale_down: false, ..Default::default() };
    let plan = planner::plan(&input, &settings);
    assert_eq!(plan.placements.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), vec!["a-1"]);
    let config = gpuscale::config::GpuscaleConfig::parse(
        std::path::Path::new("gpuscale.yaml"),
        "planner:\n  scaleDown: false\n  defaultSpreadConstraints:\n    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}\n",
    )
    .expect("valid config");
    let plan = planner::plan(&input, &config.planner);
    assert!(plan.placements.is_empty(), "{:?}", plan.placements);
    assert_eq!(plan.unschedulable.iter().map(|u| u.pod.as_str()).collect::<Vec<_>>(), vec!["ml/web-2"]);
}

/// Between equally cost-effective groups, a scale-up takes the one the pod prefers.
#[test]
fn a_scale_up_takes_the_preferred_of_equal_groups() {
    for zone in ["us-east-1a", "us-east-1b"] {
        let mut p = replica("pref", "pref");
        p["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}}]}});
        let (ups, _) = scale_ups(vec![p], ZONAL_GROUPS);
        let group = if zone.ends_with('a') { "l4-a" } else { "l4-b" };
        assert_eq!(ups, vec![(group.to_string(), 0, 1)]);
    }
}

#[test]
fn a_pod_affine_to_a_zone_scales_the_group_in_that_zone() {
    // A cache runs in us-east-1b on a full node; the pod must share its zone, so the group in
    // us-east-1a, cheaper or not, cannot serve it.
    let mut full = node("b-1", 110, 0);
    full["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("us-east-1b");
    let mut cache = pod("cache", "cache", Some("b-1"));
    cache["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}});
    let mut near = replica("near", "near");
    near["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "topology.kubernetes.io/zone"}]}});
    let (ups, unschedulable) = scale_ups(vec![full, cache, near], ZONAL_GROUPS);
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups, vec![("l4-b".to_string(), 0, 1)]);
}

#[test]
fn pods_of_an_unknown_scheduler_are_reported_and_left_to_it() {
    // kube-scheduler ignores a pod whose schedulerName is another scheduler's; so does the plan:
    // it neither places it on the free node nor scales for it. HAMi's scheduler is planned.
    let mut theirs = replica("theirs", "x");
    theirs["spec"]["schedulerName"] = json!("my-batch-scheduler");
    let mut hami = replica("hami", "y");
    hami["spec"]["schedulerName"] = json!("hami-scheduler");
    assert_eq!(
        placed(vec![node("n1", 110, 0), theirs.clone(), hami.clone()]),
        vec![("ml/hami".to_string(), "n1".to_string())]
    );
    let (ups, unschedulable) = scale_ups(vec![theirs, hami], ZONAL_GROUPS);
    assert_eq!(ups.iter().map(|(_, from, to)| to - from).sum::<u32>(), 1, "for hami only: {ups:?}");
    assert_eq!(unschedulable, vec!["ml/theirs".to_string()]);
}

/// A claim `name` in `ml`, bound to `volume` when given, of `class`.
fn pvc(name: &str, volume: Option<&str>, class: &str, modes: &[&str]) -> Value {
    let mut c = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"accessModes": modes, "storageClassName": class, "resources": {"requests": {"storage": "100Gi"}}},
        "status": {"phase": "Pending"}
    });
    if let Some(v) = volume {
        c["spec"]["volumeName"] = json!(v);
        c["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes"});
        c["status"]["phase"] = json!("Bound");
    }
    c
}

/// A 200 GiB volume of `class`, with `zone` label and node affinity when given.
fn pv(name: &str, class: &str, zone: Option<&str>, on_host: Option<&str>, claim: Option<&str>) -> Value {
    let mut v = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "200Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "persistentVolumeReclaimPolicy": "Delete"},
        "status": {"phase": "Available"}
    });
    if let Some(z) = zone {
        v["metadata"]["labels"] = json!({"topology.kubernetes.io/zone": z});
        v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [z]}]}]}});
    }
    if let Some(h) = on_host {
        v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [h]}]}]}});
    }
    if let Some(c) = claim {
        v["spec"]["claimRef"] = json!({"namespace": "ml", "name": c});
        v["status"]["phase"] = json!("Bound");
    }
    v
}

fn storage_class(name: &str, provisioner: &str, mode: &str, zones: &[&str]) -> Value {
    let mut c = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode
    });
    if !zones.is_empty() {
        c["allowedTopologies"] =
            json!([{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": zones}]}]);
    }
    c
}

fn with_claim(mut p: Value, claim: &str) -> Value {
    p["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    p
}

fn zoned_node(name: &str, zone: &str) -> Value {
    let mut n = node(name, 110, 0);
    n["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!(zone);
    n
}

#[test]
fn a_pod_whose_volume_is_in_another_zone_goes_where_the_volume_is() {
    // VolumeZone and VolumeBinding (volume_zone_test.go "label zone failure domain matched" /
    // "label zone failure domain failed"): the claim is bound to a volume in us-east-1b.
    let gp3 = storage_class("gp3", "ebs.csi.aws.com", "WaitForFirstConsumer", &[]);
    let objects = vec![
        zoned_node("a-1", "us-east-1a"),
        zoned_node("b-1", "us-east-1b"),
        gp3.clone(),
        pvc("data", Some("pv-b"), "gp3", &["ReadWriteOnce"]),
        pv("pv-b", "gp3", Some("us-east-1b"), None, Some("data")),
        with_claim(replica("db", "db"), "data"),
    ];
    assert_eq!(placed(objects), vec![("ml/db".to_string(), "b-1".to_string())]);
    // Only a us-east-1a node: FITS nowhere; the scale-up opens us-east-1b, cheaper or not.
    let objects = vec![
        gp3,
        pvc("data", Some("pv-b"), "gp3", &["ReadWriteOnce"]),
        pv("pv-b", "gp3", Some("us-east-1b"), None, Some("data")),
        with_claim(replica("db", "db"), "data"),
    ];
    let (ups, unschedulable) = scale_ups(objects, ZONAL_GROUPS);
    assert!(unschedulable.is_empty(), "{unschedulable:?}");
    assert_eq!(ups, vec![("l4-b".to_string(), 0, 1)]);
}

#[test]
fn a_volume_in_a_zone_no_group_serves_is_unschedulable_with_the_filter() {
    let objects = vec![
        storage_class("gp3", "ebs.csi.aws.com", "WaitForFirstConsumer", &[]),
        pvc("data", Some("pv-c"), "gp3", &["ReadWriteOnce"]),
        pv("pv-c", "gp3", Some("us-east-1c"), None, Some("data")),
        with_claim(replica("db", "db"), "data"),
    ];
    let plan = plan_of(objects, Some(ZONAL_GROUPS));
    assert!(plan.scale_ups.is_empty(), "{:?}", plan.scale_ups);
    let reason = &plan.unschedulable.iter().find(|u| u.pod == "ml/db").expect("reported").reason;
    assert!(reason.contains("volume node affinity conflict"), "{reason}");
}

#[test]
fn wait_for_first_consumer_claims_follow_allowed_topologies_and_local_volumes() {
    // An unbound claim of a WaitForFirstConsumer class provisions only where allowedTopologies
    // reach (volumebinding binder_test.go "provisioning with allowed topology").
    let objects = vec![
        zoned_node("a-1", "us-east-1a"),
        zoned_node("b-1", "us-east-1b"),
        storage_class("zonal", "ebs.csi.aws.com", "WaitForFirstConsumer", &["us-east-1b"]),
        pvc("scratch", None, "zonal", &["ReadWriteOnce"]),
        with_claim(replica("job", "job"), "scratch"),
    ];
    assert_eq!(placed(objects), vec![("ml/job".to_string(), "b-1".to_string())]);
    // A local volume class (no provisioner): only the node holding an available volume.
    let objects = vec![
        zoned_node("a-1", "us-east-1a"),
        zoned_node("a-2", "us-east-1a"),
        storage_class("local", "kubernetes.io/no-provisioner", "WaitForFirstConsumer", &[]),
        pv("local-a-2", "local", None, Some("a-2"), None),
        pvc("nvme", None, "local", &["ReadWriteOnce"]),
        with_claim(replica("job", "job"), "nvme"),
    ];
    assert_eq!(placed(objects), vec![("ml/job".to_string(), "a-2".to_string())]);
}

#[test]
fn claims_no_node_can_serve_are_reported_as_kube_scheduler_words_them() {
    let cases = [
        // An unbound claim of an Immediate class waits for the volume controller, not a node.
        (
            vec![
                storage_class("fast", "ebs.csi.aws.com", "Immediate", &[]),
                pvc("data", None, "fast", &["ReadWriteOnce"]),
            ],
            "pod has unbound immediate PersistentVolumeClaims",
        ),
        (
            vec![storage_class("fast", "ebs.csi.aws.com", "Immediate", &[])],
            "persistentvolumeclaim \"data\" not found",
        ),
        // A claim that asks for no class (`""`) binds only through the volume controller, even
        // with a default WaitForFirstConsumer class in the cluster.
        (
            vec![
                {
                    let mut c = storage_class("gp3", "ebs.csi.aws.com", "WaitForFirstConsumer", &[]);
                    c["metadata"]["annotations"] =
                        json!({"storageclass.kubernetes.io/is-default-class": "true"});
                    c
                },
                pvc("data", None, "", &["ReadWriteOnce"]),
            ],
            "pod has unbound immediate PersistentVolumeClaims",
        ),
        // A ReadWriteOncePod claim another running pod uses (volumerestrictions).
        (
            vec![
                storage_class("gp3", "ebs.csi.aws.com", "WaitForFirstConsumer", &[]),
                pvc("data", Some("pv-a"), "gp3", &["ReadWriteOncePod"]),
                pv("pv-a", "gp3", None, None, Some("data")),
                with_claim(pod("holder", "h", Some("n1")), "data"),
            ],
            "ReadWriteOncePod access mode",
        ),
    ];
    for (mut objects, expected) in cases {
        objects.push(node("n1", 110, 0));
        objects.push(with_claim(replica("db", "db"), "data"));
        let (ups, unschedulable) = scale_ups(objects.clone(), ZONAL_GROUPS);
        assert!(ups.is_empty(), "{expected}: {ups:?}");
        assert_eq!(unschedulable, vec!["ml/db".to_string()], "{expected}");
        let snapshot = snapshot_of(objects).snapshot;
        let db = snapshot.workloads.iter().find(|w| w.id == "ml/db").unwrap();
        assert!(
            db.volume_blocked.as_deref().is_some_and(|r| r.contains(expected)),
            "{:?}",
            db.volume_blocked
        );
    }
}

#[test]
fn without_storage_objects_claims_are_unchecked_and_the_snapshot_says_so() {
    let objects = vec![node("n1", 110, 0), with_claim(replica("db", "db"), "data")];
    let sourced: Vec<SourcedObject> =
        objects.iter().cloned().map(|o| SourcedObject::new("test", o)).collect();
    let loaded = gpuscale::k8s::convert(&sourced).expect("a valid snapshot");
    assert!(
        loaded.warnings.iter().any(|w| w.contains("volume placement is not checked")),
        "{:?}",
        loaded.warnings
    );
    assert_eq!(placed(objects), vec![("ml/db".to_string(), "n1".to_string())]);
}
