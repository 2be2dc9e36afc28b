//! Placement hints: a plan tries each pending pod first on the node the last plan put it on,
//! and only where every filter still admits it there.

use gpuscale::model::{
    ClusterSnapshot, GpuDemand, Node, NodeGroup, NodeState, OwnerKind, Resources, Workload,
};
use gpuscale::planner::{self, PlacementHints, Plan, PlanInput, PlannerSettings};
use gpuscale::providers::config;

const GROUPS: &str = r#"
accounts:
  - name: c
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: l4-4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 3}
"#;

fn groups() -> Vec<NodeGroup> {
    config::load_strs(&[("test.yaml", GROUPS)]).expect("valid provider config").node_groups()
}

fn node(groups: &[NodeGroup], name: &str) -> Node {
    let mut n = groups[0].template.clone();
    n.name = name.into();
    n.node_group = Some("l4-4".into());
    n.instance_type = Some(groups[0].instance_type.clone());
    n.state = NodeState::Ready;
    n.labels.insert("kubernetes.io/hostname".into(), name.into());
    n
}

fn pod(id: &str, gpus: u32, node: Option<&str>) -> Workload {
    Workload {
        id: id.into(),
        requests: Resources::new(1000, 1024),
        gpu: GpuDemand::Whole { count: gpus },
        owner: OwnerKind::ReplicaSet,
        node_name: node.map(Into::into),
        ..Default::default()
    }
}

/// Three 4-GPU nodes; `a` runs a 2-GPU pod; one 1-GPU pod waits.
fn cluster() -> (ClusterSnapshot, Vec<NodeGroup>) {
    let g = groups();
    let nodes = ["a", "b", "c"].map(|n| node(&g, n)).to_vec();
    let workloads = vec![pod("ml/running", 2, Some("a")), pod("ml/pending", 1, None)];
    (ClusterSnapshot { nodes, workloads, ..Default::default() }, g)
}

fn plan(snapshot: ClusterSnapshot, groups: Vec<NodeGroup>, hints: PlacementHints) -> Plan {
    let settings = PlannerSettings { scale_down: false, ..Default::default() };
    planner::plan(&PlanInput { snapshot, groups, hints, ..Default::default() }, &settings)
}

fn placed_on(plan: &Plan, pod: &str) -> Option<String> {
    plan.placements.iter().find(|p| p.pod == pod).map(|p| p.node.clone())
}

/// Hints as a plan that put `pod` on `node` would leave them.
fn hint(pod: &str, node: &str) -> PlacementHints {
    let mut last = Plan::default();
    last.placements.push(planner::PendingPlacement {
        pod: pod.into(),
        node: node.into(),
        devices: Default::default(),
        node_in_flight: false,
    });
    PlacementHints::of(&last)
}

/// A node other than the one a fresh plan of the cluster chooses for the pending pod: the
/// node a hint names in these tests.
fn other_than_fresh() -> String {
    let (snapshot, g) = cluster();
    let fresh = placed_on(&plan(snapshot, g, PlacementHints::default()), "ml/pending").expect("room");
    ["a", "b", "c"].into_iter().find(|n| *n != fresh).unwrap().to_string()
}

/// Where a plan without hints puts the pending pod.
fn scanned(snapshot: &ClusterSnapshot, g: &[NodeGroup]) -> Option<String> {
    placed_on(&plan(snapshot.clone(), g.to_vec(), PlacementHints::default()), "ml/pending")
}

#[test]
fn a_pod_goes_where_its_hint_says_while_the_node_still_takes_it() {
    let (snapshot, g) = cluster();
    let hinted_node = other_than_fresh();
    let hinted = plan(snapshot.clone(), g.clone(), hint("ml/pending", &hinted_node));
    assert_eq!(placed_on(&hinted, "ml/pending"), Some(hinted_node.clone()));
    // The devices a scan of that node alone gives.
    let mut only = snapshot.clone();
    only.nodes.retain(|n| n.name == hinted_node);
    only.workloads.retain(|w| w.node_name.as_ref().is_none_or(|n| *n == hinted_node));
    let mut one = g.clone();
    one[0].target_size = 1;
    let alone = plan(only, one, PlacementHints::default());
    assert_eq!(hinted.placements, alone.placements);
    // A plan's own placements as hints give the same placements again.
    let again = plan(snapshot, g, PlacementHints::of(&hinted));
    assert_eq!(again.placements, hinted.placements);
}

#[test]
fn a_hint_the_node_no_longer_admits_is_dropped_for_a_scan() {
    let hinted_node = other_than_fresh();
    let at = |s: &ClusterSnapshot| s.nodes.iter().position(|n| n.name == hinted_node).unwrap();
    // The node filled up since the last plan: the pod goes where a scan puts it.
    let (mut snapshot, g) = cluster();
    let gpus = |w: &Workload| match w.gpu {
        GpuDemand::Whole { count } => count,
        _ => 0,
    };
    let used: u32 =
        snapshot.workloads.iter().filter(|w| w.node_name.as_ref() == Some(&hinted_node)).map(gpus).sum();
    snapshot.workloads.push(pod("ml/filler", 4 - used, Some(&hinted_node)));
    let hinted = plan(snapshot.clone(), g.clone(), hint("ml/pending", &hinted_node));
    assert_eq!(placed_on(&hinted, "ml/pending"), scanned(&snapshot, &g));
    assert_ne!(placed_on(&hinted, "ml/pending"), Some(hinted_node.clone()));
    // It was cordoned.
    let (mut snapshot, g) = cluster();
    let i = at(&snapshot);
    snapshot.nodes[i].unschedulable = true;
    let hinted = plan(snapshot.clone(), g.clone(), hint("ml/pending", &hinted_node));
    assert_eq!(placed_on(&hinted, "ml/pending"), scanned(&snapshot, &g));
    assert_ne!(placed_on(&hinted, "ml/pending"), Some(hinted_node.clone()));
    // It is gone.
    let (mut snapshot, g) = cluster();
    let i = at(&snapshot);
    snapshot.nodes.remove(i);
    let hinted = plan(snapshot.clone(), g.clone(), hint("ml/pending", &hinted_node));
    assert_eq!(placed_on(&hinted, "ml/pending"), scanned(&snapshot, &g));
}

#[test]
fn a_hint_never_places_a_pod_the_cluster_wide_filters_refuse() {
    use gpuscale::model::{LabelSelector, PodAffinityTerm, PodIdentity};
    use std::sync::Arc;
    let hinted_node = other_than_fresh();
    let (mut snapshot, g) = cluster();
    // A pod running on the hinted node repels pods labelled app=web; the pending pod is one.
    let web: std::collections::BTreeMap<String, String> =
        [("app".to_string(), "web".to_string())].into_iter().collect();
    let mut repeller = pod("ml/repeller", 1, Some(&hinted_node));
    let term = PodAffinityTerm {
        selector: LabelSelector { match_labels: web.clone(), ..Default::default() },
        topology_key: "kubernetes.io/hostname".into(),
        namespaces: Vec::new(),
    };
    repeller.identity = Some(Arc::new(PodIdentity {
        namespace: "ml".into(),
        labels: Default::default(),
        anti_affinity: vec![term],
    }));
    snapshot.workloads.push(repeller);
    let pending = snapshot.workloads.iter_mut().find(|w| w.id == "ml/pending").unwrap();
    pending.labels = web.clone();
    pending.identity =
        Some(Arc::new(PodIdentity { namespace: "ml".into(), labels: web, anti_affinity: Vec::new() }));
    let hinted = plan(snapshot.clone(), g.clone(), hint("ml/pending", &hinted_node));
    let on = placed_on(&hinted, "ml/pending");
    assert!(on.is_some() && on != Some(hinted_node), "{}", hinted.to_table());
    assert_eq!(on, scanned(&snapshot, &g));
}
