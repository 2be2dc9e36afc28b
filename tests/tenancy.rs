//! Multi-tenancy in the planner: borrowing and reclaim, quotas never exceeded beyond allowed
//! borrowing, all-or-nothing gangs, topology domains, budget caps, preemption vs scale-up.

use gpuscale::model::{
    ClusterSnapshot, DisruptionBudget, GpuDemand, LabelSelector, Node, NodeGroup, NodeState, OwnerKind,
    Resources, Toleration, TolerationOperator, Workload,
};
use gpuscale::planner::{self, Plan, PlanInput, PlannerSettings};
use gpuscale::providers::config;
use gpuscale::tenancy::{Admission, Ledger, TenancyConfig, Tenants};
use proptest::prelude::*;
use std::path::Path;

const GROUPS: &str = r#"
accounts:
  - name: c
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: h100-a, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 2, targetSize: 0}
      - {name: h100-b, instanceType: p5.48xlarge, zones: [us-east-1b], minSize: 0, maxSize: 4, targetSize: 0}
      - {name: l4, instanceType: g6.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 0}
"#;

const NOW: i64 = 1_800_000_000;

fn groups() -> Vec<NodeGroup> {
    config::load_strs(&[("groups.yaml", GROUPS)]).expect("valid provider config").node_groups()
}

fn only(mut g: Vec<NodeGroup>, names: &[&str]) -> Vec<NodeGroup> {
    g.retain(|g| names.contains(&g.name()));
    g
}

fn set_max(mut g: Vec<NodeGroup>, name: &str, max: u32) -> Vec<NodeGroup> {
    g.iter_mut().find(|g| g.name() == name).unwrap().max_size = max;
    g
}

fn tenancy(yaml: &str) -> TenancyConfig {
    TenancyConfig::parse(Path::new("gpuscale.yaml"), yaml).expect("valid tenancy section")
}

fn pod(id: &str, gpus: u32) -> Workload {
    Workload {
        id: id.into(),
        requests: Resources::new(4000, 4096),
        gpu: GpuDemand::Whole { count: gpus },
        owner: OwnerKind::Job,
        tolerations: vec![Toleration { operator: TolerationOperator::Exists, ..Default::default() }],
        created_at: Some(NOW - 60),
        ..Default::default()
    }
}

fn running(id: &str, gpus: u32, node: &str, ran_seconds: i64) -> Workload {
    Workload { node_name: Some(node.into()), created_at: Some(NOW - ran_seconds), ..pod(id, gpus) }
}

/// A registered, ready node of a group (the group's target size must count it).
fn node_of(groups: &mut [NodeGroup], group: &str, name: &str) -> Node {
    let g = groups.iter_mut().find(|g| g.name() == group).unwrap();
    g.target_size += 1;
    let mut n = g.template.clone();
    n.name = name.into();
    n.node_group = Some(group.into());
    n.instance_type = Some(g.instance_type.clone());
    n.state = NodeState::Ready;
    n
}

fn plan(snapshot: ClusterSnapshot, groups: Vec<NodeGroup>, tenancy: Option<TenancyConfig>) -> Plan {
    let settings = PlannerSettings { tenancy, now: Some(NOW), scale_down: false, ..Default::default() };
    planner::plan(&PlanInput { snapshot, groups, ..Default::default() }, &settings)
}

fn reason<'a>(plan: &'a Plan, pod: &str) -> &'a str {
    plan.unschedulable.iter().find(|u| u.pod == pod).map_or("", |u| u.reason.as_str())
}

fn fits(plan: &Plan, pod: &str) -> bool {
    plan.placements.iter().any(|p| p.pod == pod)
}

const COHORT: &str = r#"
cohorts: [{name: ml}]
tenants:
  - {name: a, cohort: ml, match: {namespaces: [a]}, quotas: {nvidia.com/gpu: {nominal: 8}}}
  - {name: b, cohort: ml, match: {namespaces: [b]}, quotas: {nvidia.com/gpu: {nominal: 8, borrowingLimit: 6}}}
"#;

#[test]
fn borrowing_from_an_idle_tenant_and_the_limits_of_it() {
    let mut g = only(groups(), &["h100-a"]);
    let nodes = vec![node_of(&mut g, "h100-a", "n1"), node_of(&mut g, "h100-a", "n2")];
    let mut workloads: Vec<Workload> = (0..4).map(|i| running(&format!("b/r{i}"), 2, "n1", 600)).collect();
    workloads.push(pod("b/borrow-4", 4)); // 8 + 4: borrows 4 of a's unused 8
    workloads.push(pod("b/borrow-4-more", 4)); // 12 + 4 = 16: beyond nominal 8 + borrowing limit 6
    let p = plan(ClusterSnapshot { nodes, workloads, ..Default::default() }, g, Some(tenancy(COHORT)));
    assert!(fits(&p, "b/borrow-4"), "{}", p.to_table());
    let why = reason(&p, "b/borrow-4-more");
    assert!(why.contains("tenant b: nvidia.com/gpu quota") && why.contains("borrowing limit 6"), "{why}");
    assert!(p.scale_ups.is_empty(), "a pod over quota never triggers a scale-up: {}", p.to_table());
}

#[test]
fn a_tenant_within_its_nominal_quota_reclaims_what_others_borrowed() {
    let mut g = only(groups(), &["h100-a"]);
    let nodes = vec![node_of(&mut g, "h100-a", "n1"), node_of(&mut g, "h100-a", "n2")];
    // b runs 12 GPUs (borrowing 4 of a's 8); 4 GPUs are free.
    let mut workloads: Vec<Workload> = (0..4).map(|i| running(&format!("b/r{i}"), 2, "n1", 600)).collect();
    workloads.extend((4..6).map(|i| running(&format!("b/r{i}"), 2, "n2", 60 * (i as i64))));
    // a wants its 8: 4 fit the free GPUs, 4 must be reclaimed from b.
    workloads.extend((0..4).map(|i| pod(&format!("a/p{i}"), 2)));
    workloads.push(pod("b/more", 2)); // b would borrow even more: refused
    let p = plan(ClusterSnapshot { nodes, workloads, ..Default::default() }, g, Some(tenancy(COHORT)));
    let table = p.to_table();
    assert_eq!(p.placements.iter().filter(|x| x.pod.starts_with("a/")).count(), 4, "{table}");
    assert_eq!(p.preemptions.len(), 2, "{table}");
    for pre in &p.preemptions {
        assert!(
            pre.pod.starts_with("a/") && pre.victims.len() == 1 && pre.victims[0].starts_with("b/"),
            "{table}"
        );
        assert!(pre.reason.starts_with("reclaim: tenant a is within its nominal quota"), "{}", pre.reason);
        assert_eq!(pre.alternative_cost, None);
    }
    // The cheapest victims: the b pods on n2 that ran shortest.
    let mut victims: Vec<&str> = p.preemptions.iter().map(|x| x.victims[0].as_str()).collect();
    victims.sort();
    assert_eq!(victims, vec!["b/r4", "b/r5"], "{table}");
    assert!(reason(&p, "b/more").contains("cohort ml"), "{table}");
    assert!(table.contains("PREEMPT"), "{table}");
}

#[test]
fn a_gang_of_four_8_gpu_pods_scales_as_one_unit_or_not_at_all() {
    let gang = |i: u32| Workload { gang: Some("ml/llama".into()), ..pod(&format!("ml/llama-{i}"), 8) };
    let snapshot = ClusterSnapshot { workloads: (0..4).map(gang).collect(), ..Default::default() };
    // Room for 4 nodes in zone b: one scale-up of exactly 4 nodes carrying all 4 pods.
    let p = plan(snapshot.clone(), only(groups(), &["h100-a", "h100-b"]), None);
    assert_eq!(p.scale_ups.len(), 1, "{}", p.to_table());
    let up = &p.scale_ups[0];
    assert_eq!((up.group.as_str(), up.from, up.to, up.pods.len()), ("c/h100-b", 0, 4, 4));
    assert!(p.unschedulable.is_empty());
    // Only 3 + 2 nodes in any one group: no partial gang is scaled.
    let p = plan(snapshot, set_max(only(groups(), &["h100-a", "h100-b"]), "h100-b", 3), None);
    assert!(p.scale_ups.is_empty(), "{}", p.to_table());
    assert_eq!(p.unschedulable.len(), 4);
    assert!(
        p.unschedulable.iter().all(|u| u.reason.contains("gang of 4 does not fit")),
        "{:?}",
        p.unschedulable
    );
}

#[test]
fn a_topology_constrained_gang_lands_in_one_domain() {
    // Zone a has one ready node and room for one more; zone b room for four. A zone-bound gang of
    // four whole nodes cannot use zone a, so the planner grows zone b for all of it.
    let mut g = only(groups(), &["h100-a", "h100-b"]);
    let nodes = vec![node_of(&mut g, "h100-a", "a-1")];
    let gang = |i: u32| Workload {
        gang: Some("ml/llama".into()),
        gang_topology_key: Some("topology.kubernetes.io/zone".into()),
        ..pod(&format!("ml/llama-{i}"), 8)
    };
    let p =
        plan(ClusterSnapshot { nodes, workloads: (0..4).map(gang).collect(), ..Default::default() }, g, None);
    assert!(p.placements.is_empty(), "{}", p.to_table());
    assert_eq!(p.scale_ups.len(), 1, "{}", p.to_table());
    assert_eq!((p.scale_ups[0].group.as_str(), p.scale_ups[0].to), ("c/h100-b", 4));

    // On existing nodes: an NVLink clique of two and one of three; a gang of three that asks
    // for one clique lands on the three-node clique.
    let mut g = only(groups(), &["h100-b"]);
    let nodes: Vec<Node> = (0..5)
        .map(|i| {
            let mut n = node_of(&mut g, "h100-b", &format!("n{i}"));
            n.labels.insert("nvidia.com/gpu.clique".into(), if i < 2 { "c1" } else { "c2" }.into());
            n
        })
        .collect();
    let gang = |i: u32| Workload {
        gang: Some("ml/mpi".into()),
        gang_topology_key: Some("nvidia.com/gpu.clique".into()),
        ..pod(&format!("ml/mpi-{i}"), 8)
    };
    let p =
        plan(ClusterSnapshot { nodes, workloads: (0..3).map(gang).collect(), ..Default::default() }, g, None);
    let on: Vec<&str> = p.placements.iter().map(|x| x.node.as_str()).collect();
    assert_eq!(on.len(), 3, "{}", p.to_table());
    assert!(on.iter().all(|n| ["n2", "n3", "n4"].contains(n)), "{on:?}");
    assert!(p.scale_ups.is_empty());
}

#[test]
fn a_budget_cap_stops_a_scale_up_with_a_clear_reason() {
    let cfg = tenancy("tenants: [{name: research, match: {namespaces: [research]}, budgetPerHour: 100}]");
    let gang =
        |i: u32| Workload { gang: Some("research/big".into()), ..pod(&format!("research/big-{i}"), 8) };
    let g = only(groups(), &["h100-a"]);
    let price = g[0].price as f64 / 1e6;
    assert!(price > 50.0 && price < 100.0, "test assumes one p5 fits the cap and two do not ({price})");
    let p = plan(
        ClusterSnapshot { workloads: (0..2).map(gang).collect(), ..Default::default() },
        g.clone(),
        Some(cfg.clone()),
    );
    assert!(p.scale_ups.is_empty(), "{}", p.to_table());
    let why = reason(&p, "research/big-0");
    assert!(
        why.contains(&format!(
            "tenant research: +${:.2}/h would exceed its budget cap $100.00/h (spending $0.00/h now)",
            2.0 * price
        )),
        "{why}"
    );
    // One node is within the cap; without tenancy both scale.
    let p = plan(
        ClusterSnapshot { workloads: vec![pod("research/one", 8)], ..Default::default() },
        g.clone(),
        Some(cfg),
    );
    assert_eq!(p.scale_ups.len(), 1, "{}", p.to_table());
    let p = plan(ClusterSnapshot { workloads: (0..2).map(gang).collect(), ..Default::default() }, g, None);
    assert_eq!(p.scale_ups.len(), 1);
}

#[test]
fn preemption_evicts_the_cheapest_low_priority_pods_unless_a_scale_up_is_cheaper() {
    let cfg =
        tenancy("tenants: [{name: t, match: {namespaces: [t]}, quotas: {gpu-equivalent: {nominal: 64}}}]");
    let build = |hours: i64, g: &mut Vec<NodeGroup>| {
        let nodes = vec![node_of(g, "h100-a", "n1")];
        // Four 2-GPU low-priority pods fill the node; r1 has run least.
        let mut workloads: Vec<Workload> = [3, 1, 2, 4]
            .iter()
            .enumerate()
            .map(|(i, h)| running(&format!("t/r{i}"), 2, "n1", h * hours * 3600))
            .collect();
        workloads.push(Workload {
            priority: 1000,
            requests: Resources::new(1000, 2048),
            ..pod("t/urgent", 1)
        });
        ClusterSnapshot { nodes, workloads, ..Default::default() }
    };
    // Only more H100s would serve it ($55/h): evicting the hour-old pod is cheaper.
    let mut g = only(groups(), &["h100-a"]);
    let p = plan(build(1, &mut g), g, Some(cfg.clone()));
    assert_eq!(p.preemptions.len(), 1, "{}", p.to_table());
    let pre = &p.preemptions[0];
    assert_eq!(
        (pre.pod.as_str(), pre.node.as_str(), pre.victims.clone()),
        ("t/urgent", "n1", vec!["t/r1".to_string()])
    );
    assert!(
        pre.alternative_cost.is_some() && pre.reason.contains("<= scale-up 1 x p5.48xlarge"),
        "{}",
        pre.reason
    );
    assert!(p.scale_ups.is_empty());
    // An L4 at $0.80/h serves it too; the pods have run for days: scale up instead.
    let mut g = only(groups(), &["h100-a", "l4"]);
    let p = plan(build(100, &mut g), g, Some(cfg));
    assert!(p.preemptions.is_empty(), "{}", p.to_table());
    assert_eq!(p.scale_ups.len(), 1);
    assert_eq!(p.scale_ups[0].group, "c/l4");
}

/// Victims are chosen within their PodDisruptionBudgets, counting the victims of every
/// preemption of the plan: the Eviction API would refuse the others, and the claimant would
/// never fit.
#[test]
fn preemption_chooses_only_victims_their_budgets_let_go() {
    let cfg =
        tenancy("tenants: [{name: t, match: {namespaces: [t]}, quotas: {gpu-equivalent: {nominal: 64}}}]");
    // One full node and no room to grow: only evictions make room.
    let mut g = set_max(only(groups(), &["h100-a"]), "h100-a", 1);
    let nodes = vec![node_of(&mut g, "h100-a", "n1")];
    // Cheapest first: r0 (its budget allows nothing), r1 and r2 (one budget allowing one), r3.
    let mut workloads: Vec<Workload> = (0..4)
        .map(|i| {
            let mut w = running(&format!("t/r{i}"), 2, "n1", 600 * (i + 1));
            w.labels.insert("app".into(), ["zero", "one", "one", "free"][i as usize].into());
            w
        })
        .collect();
    workloads.extend((0..2).map(|i| Workload { priority: 1000, ..pod(&format!("t/urgent-{i}"), 2) }));
    let budget = |app: &str, allowed| DisruptionBudget {
        id: format!("t/{app}"),
        namespace: "t".into(),
        selector: LabelSelector {
            match_labels: [("app".to_string(), app.to_string())].into(),
            ..Default::default()
        },
        disruptions_allowed: allowed,
    };
    let snapshot = ClusterSnapshot {
        nodes,
        workloads,
        disruption_budgets: vec![budget("zero", 0), budget("one", 1)],
        ..Default::default()
    };
    let p = plan(snapshot, g, Some(cfg));
    let mut victims: Vec<&str> =
        p.preemptions.iter().flat_map(|x| x.victims.iter().map(String::as_str)).collect();
    victims.sort();
    assert_eq!(victims, vec!["t/r1", "t/r3"], "{}", p.to_table());
}

/// One full node of four 2-GPU pods of namespace `ns` (the cheapest, r0, a bare pod) and a
/// pending 2-GPU pod of higher priority; the group cannot grow.
fn full_node_and_an_urgent_pod(ns: &str) -> (ClusterSnapshot, Vec<NodeGroup>) {
    let mut g = set_max(only(groups(), &["h100-a"]), "h100-a", 1);
    let nodes = vec![node_of(&mut g, "h100-a", "n1")];
    let mut workloads: Vec<Workload> =
        (0..4).map(|i| running(&format!("{ns}/r{i}"), 2, "n1", 600 * (i + 1))).collect();
    workloads[0].owner = OwnerKind::None;
    workloads.push(Workload { priority: 1000, ..pod(&format!("{ns}/urgent"), 2) });
    (ClusterSnapshot { nodes, workloads, ..Default::default() }, g)
}

const ONE_TENANT: &str =
    "tenants: [{name: t, match: {namespaces: [t]}, quotas: {gpu-equivalent: {nominal: 64}}}]";

/// A bare pod would be lost for good: it is nobody's victim, however cheap.
#[test]
fn preemption_never_evicts_a_bare_pod() {
    let (snapshot, g) = full_node_and_an_urgent_pod("t");
    let p = plan(snapshot, g, Some(tenancy(ONE_TENANT)));
    assert_eq!(p.preemptions.len(), 1, "{}", p.to_table());
    assert_eq!(p.preemptions[0].victims, vec!["t/r1".to_string()], "{}", p.to_table());
}

/// A pod of no configured tenant is unmanaged: not even an untenanted pod of higher priority
/// evicts it.
#[test]
fn preemption_never_evicts_an_unmanaged_pod() {
    // Namespace x has no tenant.
    let (snapshot, g) = full_node_and_an_urgent_pod("x");
    let p = plan(snapshot, g, Some(tenancy(ONE_TENANT)));
    assert!(p.preemptions.is_empty(), "{}", p.to_table());
}

#[test]
fn workload_classes_keep_training_on_whole_gpus() {
    let cfg = tenancy("workloadClasses: {training: [whole], inference: [mig, fraction, shared]}\ntenants: [{name: t, match: {namespaces: [t]}}]");
    let mut w = pod("t/train", 1);
    w.gpu = GpuDemand::Fraction { count: 1, milli: 500, memory_mib: 0 };
    w.labels.insert("gpuscale.io/workload-class".into(), "training".into());
    let p = plan(ClusterSnapshot { workloads: vec![w], ..Default::default() }, groups(), Some(cfg));
    assert!(p.scale_ups.is_empty());
    assert!(
        reason(&p, "t/train").contains("workload class training may use only whole GPUs"),
        "{}",
        p.to_table()
    );
}

/// A cluster of one big existing node per tenant so that capacity never limits: only quota does.
fn quota_world(
    quotas: &[(u32, Option<u32>, Option<u32>)],
    pods: &[(usize, u32)],
) -> (TenancyConfig, ClusterSnapshot) {
    let mut yaml = String::from("cohorts: [{name: c}]\ntenants:\n");
    for (i, (nominal, borrow, lend)) in quotas.iter().enumerate() {
        yaml.push_str(&format!("  - {{name: t{i}, cohort: c, match: {{namespaces: [t{i}]}}, quotas: {{nvidia.com/gpu: {{nominal: {nominal}"));
        if let Some(b) = borrow {
            yaml.push_str(&format!(", borrowingLimit: {b}"));
        }
        if let Some(l) = lend {
            yaml.push_str(&format!(", lendingLimit: {}", (*l).min(*nominal)));
        }
        yaml.push_str("}}}\n");
    }
    let mut g = only(groups(), &["h100-b"]);
    g[0].max_size = 100;
    let nodes = (0..12).map(|i| node_of(&mut g, "h100-b", &format!("n{i}"))).collect();
    let workloads =
        pods.iter().enumerate().map(|(k, (t, n))| pod(&format!("t{}/p{k}", t % quotas.len()), *n)).collect();
    (tenancy(&yaml), ClusterSnapshot { nodes, workloads, ..Default::default() })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Admitting, reclaiming and departing in any order never takes a tenant beyond nominal +
    /// borrowing limit, nor a cohort's borrowing beyond what its members lend.
    #[test]
    fn ledger_quota_is_never_exceeded_except_by_allowed_borrowing(
        quotas in prop::collection::vec((0u32..12, prop::option::of(0u32..8), prop::option::of(0u32..12)), 1..5),
        ops in prop::collection::vec((0usize..5, 1u32..6, any::<bool>()), 1..60),
    ) {
        let (cfg, _) = quota_world(&quotas, &[]);
        let tenants = Tenants::new(&cfg);
        let mut ledger = Ledger::new(&tenants);
        let mut admitted: Vec<(usize, gpuscale::tenancy::Usage)> = Vec::new();
        for (t, n, depart) in ops {
            let t = t % quotas.len();
            if depart && !admitted.is_empty() {
                let (who, u) = admitted.remove(n as usize % admitted.len());
                ledger.release(who, &u);
            } else {
                let demand = gpuscale::tenancy::usage_of(&pod("x/y", n), None);
                if let Admission::NeedsReclaim { .. } = ledger.check(&tenants, t, &demand) {
                    // Evict the newest workloads of borrowing tenants until it fits.
                    while let Some(k) = admitted.iter().rposition(|(w, _)| *w != t && ledger.is_borrowing(&tenants, *w)) {
                        let (who, u) = admitted.remove(k);
                        ledger.release(who, &u);
                        if !matches!(ledger.check(&tenants, t, &demand), Admission::NeedsReclaim { .. }) { break; }
                    }
                }
                if matches!(ledger.check(&tenants, t, &demand), Admission::Fits | Admission::Borrows { .. }) {
                    ledger.charge(t, &demand);
                    admitted.push((t, demand));
                }
            }
            prop_assert_eq!(ledger.violation(&tenants), None);
        }
    }

    /// The planner admits pending pods only within quota + allowed borrowing.
    #[test]
    fn planner_never_places_beyond_quota(
        quotas in prop::collection::vec((0u32..10, prop::option::of(0u32..6), prop::option::of(0u32..10)), 1..4),
        pods in prop::collection::vec((0usize..4, 1u32..5), 1..20),
    ) {
        let (cfg, mut snapshot) = quota_world(&quotas, &pods);
        let g = { let mut g = only(groups(), &["h100-b"]); g[0].target_size = 12; g[0].max_size = 100; g };
        let p = plan(snapshot.clone(), g, Some(cfg.clone()));
        prop_assert!(p.scale_ups.is_empty() && p.preemptions.is_empty());
        for w in snapshot.workloads.iter_mut() {
            w.node_name = p.placements.iter().find(|x| x.pod == w.id).map(|x| x.node.clone());
        }
        let tenants = Tenants::new(&cfg);
        let ledger = Ledger::from_snapshot(&tenants, &snapshot);
        prop_assert_eq!(ledger.violation(&tenants), None);
        // Everything not placed was held back by quota, with the tenant named.
        for w in snapshot.workloads.iter().filter(|w| w.node_name.is_none()) {
            let why = reason(&p, &w.id);
            prop_assert!(why.contains("quota"), "{}: {}", w.id, why);
        }
    }
}

#[test]
fn the_example_config_plans_the_example_cluster_and_its_budget_binds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cfg = gpuscale::config::GpuscaleConfig::load(&root.join("examples/gpuscale.yaml")).unwrap();
    let loaded =
        gpuscale::k8s::load_snapshot(&root.join("examples/snapshots/mixed-gpu-cluster.json")).unwrap();
    let groups = config::ProviderConfig::embedded_default().unwrap().node_groups();
    let run = |cfg: &gpuscale::config::GpuscaleConfig| {
        let settings = PlannerSettings { tenancy: cfg.tenancy.clone(), ..cfg.planner.clone() };
        planner::plan(
            &PlanInput { snapshot: loaded.snapshot.clone(), groups: groups.clone(), ..Default::default() },
            &settings,
        )
    };
    let p = run(&cfg);
    assert_eq!(p.scale_ups.len(), 1, "{}", p.to_table());
    assert_eq!(p.scale_ups[0].pods.len(), 4);
    // research's share of its running nodes plus four p5 exceed a $150/h cap: no scale-up.
    cfg.tenancy.as_mut().unwrap().tenants[0].budget_per_hour = Some(150.0);
    let p = run(&cfg);
    assert!(p.scale_ups.is_empty(), "{}", p.to_table());
    let why = reason(&p, "ml-train/gpt-pretrain-worker-0");
    assert!(why.contains("tenant research: +$220.16/h would exceed its budget cap $150.00/h"), "{why}");
}

#[test]
fn a_volcano_gang_with_its_podgroup_and_a_kueue_topology_request_lands_in_one_clique() {
    let mut docs = String::from(
        "apiVersion: scheduling.volcano.sh/v1beta1\nkind: PodGroup\nmetadata: {name: train, namespace: ml}\nspec: {minMember: 3}\n",
    );
    for i in 0..4 {
        docs.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: train-{i}\n  namespace: ml\n  annotations:\n    scheduling.k8s.io/group-name: train\n    kueue.x-k8s.io/podset-required-topology: nvidia.com/gpu.clique\nspec:\n  tolerations: [{{operator: Exists}}]\n  containers:\n    - name: c\n      resources:\n        requests: {{cpu: '4', memory: 4Gi, nvidia.com/gpu: '8'}}\n        limits: {{nvidia.com/gpu: '8'}}\nstatus: {{phase: Pending}}\n"
        ));
    }
    let objects = gpuscale::k8s::parse_text(Path::new("gang.yaml"), &docs).unwrap();
    let loaded = gpuscale::k8s::convert(&objects).unwrap();
    let w = &loaded.snapshot.workloads;
    assert_eq!(w.len(), 4);
    assert!(
        w.iter().all(|w| w.gang.as_deref() == Some("ml/train") && w.gang_min_members == Some(3)),
        "{w:?}"
    );
    assert!(w.iter().all(|w| w.gang_topology_key.as_deref() == Some("nvidia.com/gpu.clique")));

    // Cliques of 2 and 3 nodes: the gang's minimum of 3 lands in the 3-node clique, the fourth
    // member waits; nothing is scaled for a partial domain.
    let mut g = only(groups(), &["h100-b"]);
    let nodes: Vec<Node> = (0..5)
        .map(|i| {
            let mut n = node_of(&mut g, "h100-b", &format!("n{i}"));
            n.labels.insert("nvidia.com/gpu.clique".into(), if i < 2 { "c1" } else { "c2" }.into());
            n
        })
        .collect();
    g[0].max_size = g[0].target_size; // no room to grow
    let p = plan(ClusterSnapshot { nodes, workloads: w.clone(), ..Default::default() }, g, None);
    let on: Vec<&str> = p.placements.iter().map(|x| x.node.as_str()).collect();
    assert_eq!(on.len(), 3, "{}", p.to_table());
    assert!(on.iter().all(|n| ["n2", "n3", "n4"].contains(n)), "{on:?}");
}
