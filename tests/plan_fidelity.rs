//! The cases that made `plan` answer FITS where kube-scheduler leaves the pod Pending: required
//! anti-affinity to pods on every node, a non-GPU extended resource (EFA) no node offers, and a
//! node at its pod limit. Each pending pod is placed on an existing node only where kube-scheduler
//! would place it (`tests/k8s_scheduler_diff.rs` checks the same filters against the real one).

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

/// The pods of `objects` the planner places on existing nodes, by name.
fn placed(objects: Vec<Value>) -> Vec<(String, String)> {
    let objects: Vec<SourcedObject> = objects.into_iter().map(|o| SourcedObject::new("test", o)).collect();
    let snapshot = gpuscale::k8s::convert(&objects).expect("a valid snapshot").snapshot;
    let input = PlanInput { snapshot, groups: Vec::new(), unavailable: Default::default() };
    let plan = planner::plan(&input, &PlannerSettings { scale_down: false, ..Default::default() });
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
