//! What the controller does with agent telemetry: idle-GPU reports and reclaim, MIG
//! re-partitioning advice instead of scale-ups, and reading the annotation from a cluster.

use gpuscale::model::mig::{MigPlacement, A100_40GB};
use gpuscale::model::{
    ClusterSnapshot, DeviceAssignment, GpuDemand, GpuDevice, GpuMode, MigInstance, Node, NodeGroup,
    NodeState, NodeTelemetry, OwnerKind, Resources, TelemetrySettings, Toleration, TolerationOperator,
    Workload, TELEMETRY_ANNOTATION,
};
use gpuscale::planner::{self, Plan, PlanInput, PlannerSettings};
use gpuscale::providers::config;
use std::path::Path;
#[path = "support/telemetry.rs"]
mod telemetry;
use telemetry::l4_sample;

const GROUPS: &str = r#"
accounts:
  - name: c
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: l4-1, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 1}
      - {name: l4-4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 1}
      - {name: a100-7g, instanceType: p4d.24xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3, targetSize: 1, gpuSharing: {mig: all-7g.40gb}}
      - {name: a100-1g, instanceType: p4d.24xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3, targetSize: 0, gpuSharing: {mig: all-1g.5gb}}
"#;

fn groups() -> Vec<NodeGroup> {
    config::load_strs(&[("test.yaml", GROUPS)]).expect("valid provider config").node_groups()
}

fn group<'a>(groups: &'a [NodeGroup], name: &str) -> &'a NodeGroup {
    groups.iter().find(|g| g.name() == name).unwrap()
}

fn node_of(groups: &[NodeGroup], group_name: &str, name: &str) -> Node {
    let g = group(groups, group_name);
    let mut n = g.template.clone();
    n.name = name.into();
    n.node_group = Some(group_name.into());
    n.instance_type = Some(g.instance_type.clone());
    n.state = NodeState::Ready;
    n
}

fn pod(id: &str, gpu: GpuDemand) -> Workload {
    Workload {
        id: id.into(),
        requests: Resources::new(1000, 1024),
        gpu,
        owner: OwnerKind::ReplicaSet,
        tolerations: vec![Toleration { operator: TolerationOperator::Exists, ..Default::default() }],
        ..Default::default()
    }
}

fn running(mut w: Workload, node: &str, devices: DeviceAssignment) -> Workload {
    w.node_name = Some(node.into());
    w.devices = Some(devices);
    w
}

fn mig(profile: &str, count: u32) -> GpuDemand {
    GpuDemand::Mig { profile: profile.into(), count }
}

fn p(profile: &str, start: u8) -> MigPlacement {
    MigPlacement { profile: profile.into(), start }
}

/// Sets GPU `g` of a node to a MIG layout with the given instances marked used.
fn set_layout(node: &mut Node, g: usize, layout: &[MigPlacement], used: &[MigPlacement]) {
    node.gpus[g].mode = GpuMode::Mig {
        instances: layout
            .iter()
            .map(|p| MigInstance { placement: p.clone(), used: used.contains(p) })
            .collect(),
        dynamic: false,
    };
}

fn run(snapshot: ClusterSnapshot, groups: Vec<NodeGroup>, settings: &PlannerSettings) -> Plan {
    planner::plan(&PlanInput { snapshot, groups, ..Default::default() }, settings)
}

#[test]
fn mig_repartition_replaces_the_scale_up_and_reports_the_saving() {
    let groups = groups();
    let mut node = node_of(&groups, "a100-7g", "a100-a");
    // The 7g layout on every GPU; GPU 0 runs a pod.
    let seven = [p("7g.40gb", 0)];
    set_layout(&mut node, 0, &seven, &seven);
    let snapshot = ClusterSnapshot {
        nodes: vec![node],
        workloads: vec![
            running(
                pod("ml/big", mig("7g.40gb", 1)),
                "a100-a",
                DeviceAssignment::Mig { instances: vec![(0, p("7g.40gb", 0))] },
            ),
            pod("ml/small-1", mig("1g.5gb", 1)),
            pod("ml/small-2", mig("1g.5gb", 2)),
        ],
        ..Default::default()
    };
    // Without the advice the 1g.5gb pods would need a new node of the a100-1g group.
    let plan = run(snapshot, groups.clone(), &PlannerSettings::default());
    assert!(plan.scale_ups.is_empty(), "{}", plan.to_table());
    assert!(plan.unschedulable.is_empty(), "{}", plan.to_table());
    assert_eq!(plan.mig_repartitions.len(), 1, "{}", plan.to_table());
    let r = &plan.mig_repartitions[0];
    assert_eq!(r.node, "a100-a");
    assert_eq!(r.gpus, vec![1], "one idle GPU holds the three instances; the busy GPU 0 is untouched");
    assert_eq!(r.from_layout, vec![seven.to_vec()]);
    assert_eq!(r.disrupted_instances, 0);
    for layout in &r.to_layout {
        assert_eq!(A100_40GB.validate(layout), Ok(()), "{layout:?}");
    }
    assert!(r.to_layout[0].iter().filter(|i| i.profile == "1g.5gb").count() >= 3, "{:?}", r.to_layout);
    assert_eq!(r.pods, vec!["ml/small-1".to_string(), "ml/small-2".to_string()]);
    assert_eq!(r.saving_per_hour, group(&groups, "a100-1g").price);
    assert!(r.mig_config_label.starts_with("gpuscale-"), "{}", r.mig_config_label);
    assert!(r.mig_parted_config.contains("\"1g.5gb\": ") && r.mig_parted_config.contains("\"7g.40gb\": 1"));
    assert!(plan.placements.iter().all(|pl| !pl.pod.starts_with("ml/small")), "listed under the advice");
    let table = plan.to_table();
    assert!(
        table.contains("MIG-REPARTITION a100-a") && table.contains("nvidia.com/mig.config=gpuscale-"),
        "{table}"
    );
    assert!(table.contains("GPU 1: 7g.40gb@0 → "), "{table}");
    assert_eq!(plan.cost_after, plan.cost_before);
}

#[test]
fn mig_search_prefers_the_fewest_disrupted_instances() {
    let groups = groups();
    let mut node = node_of(&groups, "a100-7g", "a100-a");
    let ones: Vec<MigPlacement> = (0..7).map(|s| p("1g.5gb", s)).collect();
    for g in 0..8 {
        // Every GPU is busy: GPU 5 with one running instance, the others with three.
        let used: Vec<MigPlacement> =
            if g == 5 { vec![p("1g.5gb", 6)] } else { (4..7).map(|s| p("1g.5gb", s)).collect() };
        set_layout(&mut node, g, &ones, &used);
    }
    // GPU 1 also runs only one instance, but at slot 0, where a 4g.20gb must start.
    set_layout(&mut node, 1, &ones, &[p("1g.5gb", 0)]);
    let mut workloads = Vec::new();
    for g in 0..8u8 {
        let used = match &node.gpus[g as usize].mode {
            GpuMode::Mig { instances, .. } => {
                instances.iter().filter(|i| i.used).map(|i| i.placement.clone()).collect::<Vec<_>>()
            }
            _ => unreachable!(),
        };
        for (k, u) in used.into_iter().enumerate() {
            workloads.push(running(
                pod(&format!("ml/run-{g}-{k}"), mig("1g.5gb", 1)),
                "a100-a",
                DeviceAssignment::Mig { instances: vec![(g, u)] },
            ));
        }
    }
    workloads.push(pod("ml/wide", mig("4g.20gb", 1)));
    let snapshot = ClusterSnapshot { nodes: vec![node], workloads, ..Default::default() };
    let plan = run(snapshot, vec![], &PlannerSettings::default());
    assert_eq!(plan.mig_repartitions.len(), 1, "{}", plan.to_table());
    let r = &plan.mig_repartitions[0];
    assert_eq!(r.gpus, vec![5]);
    assert_eq!(r.disrupted_instances, 1);
    let layout = &r.to_layout[0];
    assert_eq!(A100_40GB.validate(layout), Ok(()));
    assert!(layout.contains(&p("1g.5gb", 6)), "the running instance keeps its place: {layout:?}");
    assert!(layout.contains(&p("4g.20gb", 0)), "{layout:?}");
    assert_eq!(r.saving_per_hour, 0, "no group could have served it");
    assert!(plan.to_table().contains("restarts 1 running instance(s)"));
}

#[test]
fn busy_gpus_are_left_alone_when_an_idle_gpu_suffices() {
    let groups = groups();
    let mut node = node_of(&groups, "a100-7g", "a100-a");
    node.gpus.truncate(2);
    let ones: Vec<MigPlacement> = (0..7).map(|s| p("1g.5gb", s)).collect();
    set_layout(&mut node, 0, &ones, &ones[..1]);
    set_layout(&mut node, 1, &ones, &[]);
    let snapshot = ClusterSnapshot {
        nodes: vec![node.clone()],
        workloads: vec![
            running(
                pod("ml/a", mig("1g.5gb", 1)),
                "a100-a",
                DeviceAssignment::Mig { instances: vec![(0, p("1g.5gb", 0))] },
            ),
            pod("ml/mid", mig("3g.20gb", 1)),
        ],
        ..Default::default()
    };
    let plan = run(snapshot.clone(), vec![], &PlannerSettings::default());
    assert_eq!(plan.mig_repartitions.len(), 1, "{}", plan.to_table());
    assert_eq!(
        (plan.mig_repartitions[0].gpus.clone(), plan.mig_repartitions[0].disrupted_instances),
        (vec![1], 0)
    );
    assert!(plan.mig_repartitions[0].to_layout[0].iter().any(|i| i.profile == "3g.20gb"));

    // When a configured instance already fits, there is nothing to re-partition.
    let mut fitting = snapshot;
    set_layout(&mut fitting.nodes[0], 1, &[p("4g.20gb", 0), p("3g.20gb", 4)], &[]);
    let plan = run(fitting, vec![], &PlannerSettings::default());
    assert!(plan.mig_repartitions.is_empty(), "{}", plan.to_table());
    assert_eq!(plan.placements.len(), 1);
}

#[test]
fn uniform_layouts_use_the_stock_mig_parted_name() {
    let groups = groups();
    let mut node = node_of(&groups, "a100-7g", "a100-a");
    node.gpus.truncate(1);
    let snapshot = ClusterSnapshot {
        nodes: vec![node],
        workloads: (0..7).map(|i| pod(&format!("ml/s{i}"), mig("1g.5gb", 1))).collect(),
        ..Default::default()
    };
    let plan = run(snapshot, vec![], &PlannerSettings::default());
    let r = &plan.mig_repartitions[0];
    assert_eq!(r.mig_config_label, "all-1g.5gb", "{}", plan.to_table());
    assert_eq!(r.pods.len(), 7);
    assert!(r.mig_parted_config.contains("devices: all"));
}

fn l4_cluster(reclaim: bool) -> (ClusterSnapshot, Vec<NodeGroup>) {
    let groups = groups();
    let mut small = node_of(&groups, "l4-1", "l4-small");
    small.telemetry = Some(NodeTelemetry { sampled_at: 10_000, gpus: vec![l4_sample(0, 0, Some(2_000))] });
    let mut big = node_of(&groups, "l4-4", "l4-big");
    big.telemetry = Some(NodeTelemetry {
        sampled_at: 10_010,
        gpus: (0..4).map(|i| l4_sample(i, if i == 0 { 90 } else { 0 }, (i > 0).then_some(9_000))).collect(),
    });
    let mut idle_pod = running(
        pod("team/notebook", GpuDemand::Whole { count: 1 }),
        "l4-small",
        DeviceAssignment::Whole { gpus: vec![0] },
    );
    idle_pod.reclaim_idle = reclaim;
    let busy = running(
        pod("team/train", GpuDemand::Whole { count: 1 }),
        "l4-big",
        DeviceAssignment::Whole { gpus: vec![0] },
    );
    (
        ClusterSnapshot { nodes: vec![small, big], workloads: vec![idle_pod, busy], ..Default::default() },
        groups,
    )
}

#[test]
fn idle_allocated_gpus_are_reported_and_opted_in_ones_reclaimed() {
    // Reclaim matters under a utilisation threshold (Cluster Autoscaler's 0.5): idle GPUs of
    // opted-in pods count as free. (At the default 1.0 every node whose pods fit elsewhere is a
    // candidate anyway.)
    let settings = PlannerSettings {
        telemetry: TelemetrySettings { idle_window: 3600, max_age: 600 },
        scale_down_utilization: 0.5,
        ..Default::default()
    };
    let (snapshot, groups) = l4_cluster(false);
    let price = group(&groups, "l4-1").price;
    let plan = run(snapshot, groups, &settings);
    assert_eq!(plan.idle_gpus.len(), 1, "only allocated GPUs idle beyond the window: {}", plan.to_table());
    let idle = &plan.idle_gpus[0];
    assert_eq!((idle.node.as_str(), idle.gpu, idle.idle_for), ("l4-small", 0, 8_000));
    assert_eq!(idle.pods, vec!["team/notebook".to_string()]);
    assert_eq!(idle.cost_per_hour, price);
    assert!(!idle.reclaimable);
    assert!(plan.to_table().contains("IDLE-GPU      l4-small"), "{}", plan.to_table());
    assert!(
        plan.scale_downs.iter().all(|s| s.node != "l4-small"),
        "no opt-in, no reclaim: {}",
        plan.to_table()
    );

    let (snapshot, groups) = l4_cluster(true);
    let plan = run(snapshot, groups, &settings);
    assert!(plan.idle_gpus[0].reclaimable);
    let down = plan
        .scale_downs
        .iter()
        .find(|s| s.node == "l4-small")
        .unwrap_or_else(|| panic!("{}", plan.to_table()));
    assert_eq!(down.moves, vec![("team/notebook".to_string(), "l4-big".to_string())]);
    assert_eq!(down.saving_per_hour, price);

    // A longer window reports nothing; stale telemetry (agent gone) is ignored.
    let (snapshot, groups) = l4_cluster(true);
    let long = PlannerSettings {
        telemetry: TelemetrySettings { idle_window: 9_000, max_age: 600 },
        ..Default::default()
    };
    assert!(run(snapshot, groups, &long).idle_gpus.is_empty());
    let (mut snapshot, groups) = l4_cluster(true);
    snapshot.nodes[1].telemetry.as_mut().unwrap().sampled_at = 20_000;
    assert!(run(snapshot, groups, &settings).idle_gpus.is_empty());
}

#[test]
fn telemetry_older_than_its_maximum_age_at_the_plans_clock_reclaims_nothing() {
    // Every agent stopped publishing an hour ago (newest sample 10,010). Judged against that
    // newest sample, the opted-in idle GPU still looked idle and its busy-again node was drained.
    let settings = PlannerSettings {
        telemetry: TelemetrySettings { idle_window: 3600, max_age: 600 },
        scale_down_utilization: 0.5,
        ..Default::default()
    };
    let at = |now: i64, saved_snapshot: bool| {
        let (snapshot, groups) = l4_cluster(true);
        run(snapshot, groups, &PlannerSettings { now: Some(now), saved_snapshot, ..settings.clone() })
    };
    let stale = at(10_010 + 3_600, false);
    assert!(stale.idle_gpus.is_empty(), "{}", stale.to_table());
    assert!(stale.scale_downs.iter().all(|s| s.node != "l4-small"), "{}", stale.to_table());
    // Within the maximum age it counts; so it does in a saved snapshot, which says nothing of when
    // it was taken (judged against its newest sample, as without a clock).
    for plan in
        [at(10_010 + 60, false), at(10_010 + 3_600, true), run(l4_cluster(true).0, groups(), &settings)]
    {
        assert!(plan.idle_gpus.first().is_some_and(|g| g.reclaimable), "{}", plan.to_table());
        assert!(plan.scale_downs.iter().any(|s| s.node == "l4-small"), "{}", plan.to_table());
    }
}

#[test]
fn the_annotation_is_read_from_nodes_and_a_bad_one_is_only_a_warning() {
    let t = NodeTelemetry { sampled_at: 1_764_700_000, gpus: vec![l4_sample(0, 3, Some(1_764_690_000))] };
    let node = |name: &str, annotation: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                         "annotations": {TELEMETRY_ANNOTATION: annotation}},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        })
    };
    let list = serde_json::json!({
        "apiVersion": "v1", "kind": "List",
        "items": [node("good", &t.encode()), node("broken", r#"{"v":1,"t":5,"g":[{"i":0,"h":1,"mu":0,"mt":1,"m":"L4"}]}"#)]
    });
    let objects = gpuscale::k8s::parse_text(Path::new("nodes.json"), &list.to_string()).unwrap();
    let loaded = gpuscale::k8s::convert(&objects).unwrap();
    let good = loaded.snapshot.nodes.iter().find(|n| n.name == "good").unwrap();
    assert_eq!(good.telemetry.as_ref(), Some(&t));
    let broken = loaded.snapshot.nodes.iter().find(|n| n.name == "broken").unwrap();
    assert_eq!(broken.telemetry, None);
    assert_eq!(broken.gpus.len(), 1, "the node itself is still read");
    let warning =
        loaded.warnings.iter().find(|w| w.contains("broken")).expect("a warning about the bad annotation");
    assert!(warning.contains(TELEMETRY_ANNOTATION) && warning.contains("g[0].u"), "{warning}");
    let _ = GpuDevice::standard(0, 0);
}

#[test]
fn example_snapshot_with_agent_telemetry() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let loaded = gpuscale::k8s::load_snapshot(&dir.join("examples/snapshots/gpu-telemetry.json")).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.snapshot.nodes.iter().all(|n| n.telemetry.is_some()));
    let providers = config::load_files(&[dir.join("examples/providers/gpu-telemetry.yaml")]).unwrap();
    let groups = providers.node_groups();
    let a100_price = group(&groups, "gpu-a100").price;
    let plan = run(loaded.snapshot, groups, &PlannerSettings::default());
    let table = plan.to_table();
    assert!(plan.scale_ups.is_empty() && plan.unschedulable.is_empty(), "{table}");
    assert_eq!(plan.mig_repartitions.len(), 1, "{table}");
    let r = &plan.mig_repartitions[0];
    assert_eq!((r.gpus.len(), r.pods.len(), r.saving_per_hour), (1, 4, a100_price), "{table}");
    assert!(table.contains("mig-parted entry:") && table.contains("\"1g.5gb\": 4"), "{table}");
    assert_eq!(plan.idle_gpus.len(), 1, "{table}");
    assert!(plan.idle_gpus[0].reclaimable);
    assert!(plan.scale_downs.iter().any(|d| d.node == "ip-10-0-41-7.ec2.internal"), "{table}");
}

#[test]
fn idle_whole_gpus_of_a_mig_capable_model_can_be_switched_to_mig() {
    let groups = groups();
    let mut node = node_of(&groups, "a100-7g", "a100-whole");
    node.gpus.truncate(2);
    for d in &mut node.gpus {
        d.mode = GpuMode::Standard;
    }
    let snapshot = ClusterSnapshot {
        nodes: vec![node],
        workloads: vec![
            running(
                pod("ml/whole", GpuDemand::Whole { count: 1 }),
                "a100-whole",
                DeviceAssignment::Whole { gpus: vec![0] },
            ),
            pod("ml/slice", mig("2g.10gb", 1)),
        ],
        ..Default::default()
    };
    let plan = run(snapshot, vec![], &PlannerSettings::default());
    let table = plan.to_table();
    assert_eq!(plan.mig_repartitions.len(), 1, "{table}");
    let r = &plan.mig_repartitions[0];
    assert_eq!((r.gpus.clone(), r.from_layout.clone()), (vec![1], vec![vec![]]), "{table}");
    assert_eq!(A100_40GB.validate(&r.to_layout[0]), Ok(()));
    assert!(table.contains("GPU 1: MIG off → "), "{table}");
    assert!(r.mig_parted_config.contains("mig-enabled: false"), "GPU 0 stays whole: {}", r.mig_parted_config);
    assert!(plan.placements.is_empty() && plan.unschedulable.is_empty(), "{table}");
}

#[test]
fn the_config_file_has_a_telemetry_section() {
    use gpuscale::config::GpuscaleConfig;
    let path = Path::new("gpuscale.yaml");
    let c = GpuscaleConfig::parse(path, "telemetry:\n  idleWindow: 30m\n").unwrap();
    assert_eq!(c.telemetry, TelemetrySettings { idle_window: 1800, ..Default::default() });
    assert_eq!(GpuscaleConfig::parse(path, "planner: {}\n").unwrap().telemetry.idle_window, 3600);
    let e = GpuscaleConfig::parse(path, "telemetry:\n  idleWindow: 30 minutes\n").unwrap_err().to_string();
    assert!(e.contains("gpuscale.yaml") && e.contains("idleWindow") && e.contains("30 minutes"), "{e}");
}
