//! The planner on real snapshot shapes and on focused scenarios.

use gpuscale::model::{
    ClusterSnapshot, DeviceAssignment, DisruptionBudget, GpuDemand, LabelSelector, Node, NodeGroup,
    NodeState, OwnerKind, Resources, Toleration, TolerationOperator, Workload,
};
use gpuscale::planner::{self, Plan, PlanInput, PlannerSettings};
use gpuscale::providers::config::{self, ProviderConfig};
use std::path::Path;

fn data(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn groups(yaml: &str) -> Vec<NodeGroup> {
    config::load_strs(&[("test.yaml", yaml)]).expect("valid provider config").node_groups()
}

fn plan(snapshot: ClusterSnapshot, groups: Vec<NodeGroup>) -> Plan {
    planner::plan(&PlanInput { snapshot, groups, ..Default::default() }, &PlannerSettings::default())
}

fn placed_on<'a>(plan: &'a Plan, pod: &str) -> Option<&'a str> {
    plan.placements.iter().find(|p| p.pod == pod).map(|p| p.node.as_str())
}

#[test]
fn eks_snapshot_with_mig_time_slicing_and_hami_gives_the_exact_plan() {
    let loaded = gpuscale::k8s::load_snapshot(&data("tests/data/snapshots/cluster.json")).unwrap();
    let providers = config::load_files(&[data("tests/data/plan/cluster-providers.yaml")]).unwrap();
    let plan = plan(loaded.snapshot, providers.node_groups());
    // The 3-member MIG gang fits the free 3g.20gb instances of the ready A100 node, together.
    for w in 0..3 {
        assert_eq!(
            placed_on(&plan, &format!("ml-train/resnet-ddp-worker-{w}")),
            Some("ip-10-0-12-34.ec2.internal")
        );
    }
    // The KAI half-GPU pod shares a GPU of the HAMi A10G node.
    assert_eq!(placed_on(&plan, "research/kai-embed-batch-x7k2p"), Some("ip-10-0-77-21.ec2.internal"));
    let kai = plan.placements.iter().find(|p| p.pod == "research/kai-embed-batch-x7k2p").unwrap();
    assert!(matches!(&kai.devices, DeviceAssignment::Fraction { gpus, milli: 500, .. } if gpus.len() == 1));
    assert_eq!(plan.placements.len(), 4);
    assert!(plan.scale_ups.is_empty(), "{:?}", plan.scale_ups);
    // The time-sliced T4 node's two whisper replicas fit the A10G node's spare shares: consolidated
    // (every node whose pods fit elsewhere is a candidate by default, not only those below 50%).
    assert!(plan.replacements.is_empty(), "{}", plan.to_table());
    assert_eq!(plan.scale_downs.len(), 1, "{}", plan.to_table());
    let down = &plan.scale_downs[0];
    assert_eq!((down.node.as_str(), down.group.as_str()), ("ip-10-0-40-7.ec2.internal", "test/gpu-t4-ts"));
    let mut moves = down.moves.clone();
    moves.sort();
    assert_eq!(
        moves,
        [
            ("ml-inference/whisper-small-5d4b8c9f7-h7v4d", "ip-10-0-77-21.ec2.internal"),
            ("ml-inference/whisper-small-5d4b8c9f7-pq2mz", "ip-10-0-77-21.ec2.internal"),
        ]
        .map(|(p, n)| (p.to_string(), n.to_string()))
    );
    assert!(plan.unschedulable.is_empty());
    let kept: Vec<(&str, &str)> = plan.kept.iter().map(|k| (k.node.as_str(), k.reason.as_str())).collect();
    assert_eq!(
        kept,
        vec![
            ("ip-10-0-5-11.ec2.internal", "scale-down disabled by annotation"),
            ("ip-10-0-77-21.ec2.internal", "its pods do not all fit on other nodes"),
            (
                "ip-10-0-12-34.ec2.internal",
                "pod ml-inference/bert-serving-6c8f9d7b54-x2lqp must not be evicted (karpenter.sh/do-not-disrupt=true)"
            ),
        ]
    );
    assert_eq!(plan.cost_before - plan.cost_after, down.saving_per_hour);
}

#[test]
fn embedded_example_scales_the_h100_group_for_the_whole_gang() {
    let loaded = gpuscale::k8s::load_snapshot(&data("examples/snapshots/mixed-gpu-cluster.json")).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let plan = plan(loaded.snapshot, ProviderConfig::embedded_default().unwrap().node_groups());
    assert_eq!(plan.scale_ups.len(), 1, "{}", plan.to_table());
    let up = &plan.scale_ups[0];
    assert_eq!((up.group.as_str(), up.from, up.to), ("sim/gpu-h100", 2, 6));
    assert_eq!(up.pods.len(), 4);
    assert!(up.pods.iter().all(|p| p.starts_with("ml-train/gpt-pretrain-worker-")));
    assert!(plan.unschedulable.is_empty());
    // Every pending pod is accounted for exactly once.
    assert_eq!(plan.placements.len() + up.pods.len(), 10);
    assert!(plan.cost_after > plan.cost_before);
    // The H100 node at 31% would be drained were its group not growing: never both (issue #28).
    assert!(plan.scale_downs.iter().all(|d| d.group != up.group), "{}", plan.to_table());
    assert!(
        plan.kept
            .iter()
            .any(|k| k.node == "ip-10-0-52-88.ec2.internal" && k.reason.contains("grows in this plan")),
        "{}",
        plan.to_table()
    );
}

// ---- focused scenarios on model objects ----

const GROUPS: &str = r#"
accounts:
  - name: c
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: l4-1, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 0}
      - {name: l4-4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 0}
      - {name: h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 2, targetSize: 0}
      - {name: a100-mig, instanceType: p4d.24xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3, targetSize: 0, gpuSharing: {mig: all-1g.5gb}}
      - {name: cpu, instanceType: m6i.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 10, targetSize: 0}
"#;

fn pod(id: &str, cpu: u64, gpu: GpuDemand) -> Workload {
    Workload {
        id: id.into(),
        requests: Resources::new(cpu, 1024),
        gpu,
        owner: OwnerKind::ReplicaSet,
        tolerations: vec![Toleration { operator: TolerationOperator::Exists, ..Default::default() }],
        ..Default::default()
    }
}

/// A registered node of a group, as the group's template describes it.
fn node_of(groups: &[NodeGroup], group: &str, name: &str) -> Node {
    let g = groups.iter().find(|g| g.id.ends_with(group)).unwrap();
    let mut n = g.template.clone();
    n.name = name.into();
    n.node_group = Some(group.into());
    n.instance_type = Some(g.instance_type.clone());
    n.state = NodeState::Ready;
    n
}

fn with_target(mut groups: Vec<NodeGroup>, group: &str, target: u32) -> Vec<NodeGroup> {
    groups.iter_mut().find(|g| g.id.ends_with(group)).unwrap().target_size = target;
    groups
}

#[test]
fn picks_the_cheapest_group_that_fits() {
    let g = groups(GROUPS);
    let snapshot = ClusterSnapshot {
        workloads: vec![pod("a/one-l4", 2000, GpuDemand::Whole { count: 1 })],
        ..Default::default()
    };
    let plan = plan(snapshot, g);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!((plan.scale_ups[0].group.as_str(), plan.scale_ups[0].to), ("c/l4-1", 1));
}

#[test]
fn four_one_gpu_pods_share_one_four_gpu_node_when_that_is_cheaper() {
    let g = groups(GROUPS);
    let workloads = (0..4).map(|i| pod(&format!("a/p{i}"), 2000, GpuDemand::Whole { count: 1 })).collect();
    let plan = plan(ClusterSnapshot { workloads, ..Default::default() }, g.clone());
    let cost: u64 = plan.scale_ups.iter().map(|s| s.cost_per_hour).sum();
    let one = g.iter().find(|x| x.id == "c/l4-1").unwrap().price;
    let four = g.iter().find(|x| x.id == "c/l4-4").unwrap().price;
    assert_eq!(cost, (4 * one).min(four), "{}", plan.to_table());
    assert_eq!(plan.scale_ups.iter().flat_map(|s| &s.pods).count(), 4);
}

#[test]
fn mig_demand_grows_the_mig_group() {
    let g = groups(GROUPS);
    let workloads = (0..3)
        .map(|i| pod(&format!("a/m{i}"), 1000, GpuDemand::Mig { profile: "1g.5gb".into(), count: 1 }))
        .collect();
    let plan = plan(ClusterSnapshot { workloads, ..Default::default() }, g);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!((plan.scale_ups[0].group.as_str(), plan.scale_ups[0].to), ("c/a100-mig", 1));
}

#[test]
fn a_node_waiting_for_its_gpus_absorbs_pending_gpu_pods() {
    // Cluster Autoscaler's MIG/GPU readiness bug: a node whose device plugin has not advertised
    // GPUs yet looks empty and triggers another scale-up. Here it counts as capacity on its way.
    let g = with_target(groups(GROUPS), "l4-4", 1);
    let mut booting = node_of(&g, "l4-4", "booting");
    booting.gpus.clear();
    booting.state = NodeState::Initializing;
    let workloads = (0..3).map(|i| pod(&format!("a/p{i}"), 2000, GpuDemand::Whole { count: 1 })).collect();
    let plan = plan(ClusterSnapshot { nodes: vec![booting], workloads, ..Default::default() }, g);
    assert!(plan.scale_ups.is_empty(), "{}", plan.to_table());
    assert!(plan.placements.iter().all(|p| p.node == "booting" && p.node_in_flight));
    assert_eq!(plan.placements.len(), 3);
}

#[test]
fn planning_again_after_a_scale_up_adds_nothing() {
    // Restart safety: once the target size is raised, the same pending pods are served by the
    // upcoming capacity instead of another scale-up.
    let g = groups(GROUPS);
    let workloads: Vec<Workload> =
        (0..6).map(|i| pod(&format!("a/p{i}"), 2000, GpuDemand::Whole { count: 1 })).collect();
    let first = plan(ClusterSnapshot { workloads: workloads.clone(), ..Default::default() }, g.clone());
    let mut next = g;
    for up in &first.scale_ups {
        next.iter_mut().find(|x| x.id == up.group).unwrap().target_size = up.to;
    }
    let second = plan(ClusterSnapshot { workloads, ..Default::default() }, next);
    assert!(second.scale_ups.is_empty(), "{}", second.to_table());
    assert_eq!(second.placements.len(), 6);
}

#[test]
fn a_gang_too_big_for_the_group_is_not_scaled_at_all() {
    let g = groups(GROUPS); // h100 max 2 nodes of 8 GPUs
    let workloads = (0..3)
        .map(|i| Workload {
            gang: Some("t/job".into()),
            ..pod(&format!("t/w{i}"), 8000, GpuDemand::Whole { count: 8 })
        })
        .collect();
    let plan = plan(ClusterSnapshot { workloads, ..Default::default() }, g);
    assert!(plan.scale_ups.is_empty(), "{}", plan.to_table());
    assert_eq!(plan.unschedulable.len(), 3);
    assert!(
        plan.unschedulable[0].reason.contains("c/h100: gang of 3 does not fit in 2 new node(s)"),
        "{:?}",
        plan.unschedulable
    );
}

#[test]
fn a_gang_that_fits_is_scaled_as_one_unit() {
    let g = groups(GROUPS);
    let workloads = (0..2)
        .map(|i| Workload {
            gang: Some("t/job".into()),
            ..pod(&format!("t/w{i}"), 8000, GpuDemand::Whole { count: 8 })
        })
        .collect();
    let plan = plan(ClusterSnapshot { workloads, ..Default::default() }, g);
    assert_eq!(plan.scale_ups.len(), 1);
    assert_eq!(
        (plan.scale_ups[0].group.as_str(), plan.scale_ups[0].to, plan.scale_ups[0].pods.len()),
        ("c/h100", 2, 2)
    );
}

fn idle_pair() -> (Vec<NodeGroup>, ClusterSnapshot) {
    let g = with_target(groups(GROUPS), "l4-4", 2);
    let a = node_of(&g, "l4-4", "busy");
    let b = node_of(&g, "l4-4", "idle");
    let mut workloads: Vec<Workload> = (0..2)
        .map(|i| Workload {
            node_name: Some("busy".into()),
            ..pod(&format!("a/b{i}"), 2000, GpuDemand::Whole { count: 1 })
        })
        .collect();
    workloads.push(Workload {
        node_name: Some("idle".into()),
        labels: [("app".to_string(), "x".to_string())].into(),
        ..pod("a/x", 2000, GpuDemand::Whole { count: 1 })
    });
    (g, ClusterSnapshot { nodes: vec![a, b], workloads, ..Default::default() })
}

#[test]
fn an_underused_gpu_node_is_drained_onto_the_other() {
    let (g, snapshot) = idle_pair();
    let plan = plan(snapshot, g);
    assert_eq!(plan.scale_downs.len(), 1, "{}\n{:?}", plan.to_table(), plan.kept);
    assert_eq!(plan.scale_downs[0].node, "idle");
    assert_eq!(plan.scale_downs[0].moves, vec![("a/x".to_string(), "busy".to_string())]);
    assert!(plan.cost_after < plan.cost_before);
}

#[test]
fn a_pdb_with_no_disruptions_left_blocks_the_drain() {
    let (g, mut snapshot) = idle_pair();
    snapshot.disruption_budgets.push(DisruptionBudget {
        id: "a/x-pdb".into(),
        namespace: "a".into(),
        selector: LabelSelector {
            match_labels: [("app".to_string(), "x".to_string())].into(),
            ..Default::default()
        },
        disruptions_allowed: 0,
    });
    let plan = plan(snapshot, g);
    assert!(plan.kept.iter().any(|k| k.node == "idle" && k.reason.contains("PodDisruptionBudget a/x-pdb")));
    // The protected pod stays; the planner consolidates the other way round instead.
    assert_eq!(plan.scale_downs.len(), 1, "{}", plan.to_table());
    assert_eq!(plan.scale_downs[0].node, "busy");
    assert!(plan.scale_downs[0].moves.iter().all(|(pod, to)| pod != "a/x" && to == "idle"));
}

#[test]
fn do_not_disrupt_and_bare_pods_keep_their_node() {
    for (blocked, owner, expect) in [
        (Some("karpenter.sh/do-not-disrupt=true".to_string()), OwnerKind::ReplicaSet, "must not be evicted"),
        (None, OwnerKind::None, "has no controller"),
    ] {
        let (g, mut snapshot) = idle_pair();
        let x = snapshot.workloads.iter_mut().find(|w| w.id == "a/x").unwrap();
        x.eviction_blocked = blocked;
        x.owner = owner;
        let plan = plan(snapshot, g);
        assert!(plan.kept.iter().any(|k| k.node == "idle" && k.reason.contains(expect)), "{:?}", plan.kept);
        assert!(plan.scale_downs.iter().all(|s| s.node != "idle"), "{}", plan.to_table());
        assert!(plan.scale_downs.iter().flat_map(|s| &s.moves).all(|(pod, _)| pod != "a/x"));
    }
}

#[test]
fn cpu_pods_on_an_idle_gpu_node_move_to_a_cpu_node_and_the_gpu_node_goes() {
    let g = with_target(with_target(groups(GROUPS), "l4-4", 1), "cpu", 1);
    let gpu = node_of(&g, "l4-4", "gpu-node");
    let cpu = node_of(&g, "cpu", "cpu-node");
    let workloads =
        vec![Workload { node_name: Some("gpu-node".into()), ..pod("a/web", 500, GpuDemand::None) }];
    let plan = plan(ClusterSnapshot { nodes: vec![gpu, cpu], workloads, ..Default::default() }, g);
    let down: Vec<&str> = plan.scale_downs.iter().map(|s| s.node.as_str()).collect();
    assert!(down.contains(&"gpu-node"), "{}", plan.to_table());
    let moved = &plan.scale_downs.iter().find(|s| s.node == "gpu-node").unwrap().moves;
    assert_eq!(moved, &vec![("a/web".to_string(), "cpu-node".to_string())]);
}

#[test]
fn an_expensive_node_is_replaced_by_a_cheaper_one() {
    // An 8xH100 node running pods that need 3 GPUs: a 4xL4 node holds them for far less.
    let g = with_target(groups(GROUPS), "h100", 1);
    let h = node_of(&g, "h100", "h100-node");
    let workloads = vec![
        Workload {
            node_name: Some("h100-node".into()),
            ..pod("a/small", 2000, GpuDemand::Whole { count: 1 })
        },
        Workload {
            node_name: Some("h100-node".into()),
            ..pod("a/small2", 2000, GpuDemand::Whole { count: 2 })
        },
    ];
    let plan = plan(ClusterSnapshot { nodes: vec![h], workloads, ..Default::default() }, g);
    assert_eq!(plan.replacements.len(), 1, "{}", plan.to_table());
    assert_eq!(plan.replacements[0].replacement_group, "c/l4-4");
    assert!(plan.cost_after < plan.cost_before);
}

#[test]
fn a_gang_with_a_minimum_scales_for_the_minimum_and_reports_the_rest() {
    let g = groups(GROUPS); // h100 max 2 nodes of 8 GPUs
    let workloads = (0..3)
        .map(|i| Workload {
            gang: Some("t/job".into()),
            gang_min_members: Some(2),
            ..pod(&format!("t/w{i}"), 8000, GpuDemand::Whole { count: 8 })
        })
        .collect();
    let plan = plan(ClusterSnapshot { workloads, ..Default::default() }, g);
    assert_eq!(plan.scale_ups.len(), 1, "{}", plan.to_table());
    assert_eq!((plan.scale_ups[0].to, plan.scale_ups[0].pods.len()), (2, 2));
    assert_eq!(plan.unschedulable.len(), 1);
    assert!(plan.unschedulable[0].reason.contains("gang minimum placed"), "{:?}", plan.unschedulable);
}

/// Scale-down moves are of pods running on the node: a pending pod the plan first put on a node it
/// then removes just lands elsewhere (listed as a placement, not as a move).
#[test]
fn scale_down_moves_only_running_pods() {
    let loaded = gpuscale::k8s::load_snapshot(&data("examples/snapshots/mixed-gpu-cluster.json")).unwrap();
    let providers = ProviderConfig::embedded_default().unwrap();
    let snapshot = loaded.snapshot;
    let running_on: std::collections::BTreeMap<&str, &str> = snapshot
        .workloads
        .iter()
        .filter_map(|w| w.node_name.as_deref().map(|n| (w.id.as_str(), n)))
        .collect();
    let plan = plan(snapshot.clone(), providers.node_groups());
    assert!(!plan.scale_downs.is_empty(), "{}", plan.to_table());
    for down in &plan.scale_downs {
        for (pod, _) in &down.moves {
            assert_eq!(running_on.get(pod.as_str()), Some(&down.node.as_str()), "{}", plan.to_table());
        }
    }
    let placed: Vec<&str> = plan.placements.iter().map(|p| p.pod.as_str()).collect();
    assert!(placed.contains(&"research/kai-embed-batch-x7k2p"), "{}", plan.to_table());
}
