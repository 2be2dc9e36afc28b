//! Property tests: whatever the cluster, the workloads and the policy, placement never
//! over-commits a node, a GPU, a MIG layout or a time-sliced GPU.

use gpuscale::model::mig::MigPlacement;
use gpuscale::model::{
    GpuCatalog, GpuDemand, GpuDevice, GpuMode, GpuTopology, MigInstance, Node, Resources, Workload,
};
use gpuscale::scheduler::policy::{ClusterScale, TargetWorkload};
use gpuscale::scheduler::{Placer, PolicyKind};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Kind {
    Standard,
    MigStatic,
    MigDynamic,
    TimeSliced(u32),
}

fn node_strategy() -> impl Strategy<Value = (u64, u64, usize, Kind)> {
    (
        1_000u64..64_000,
        1u64..256,
        0usize..=8,
        prop_oneof![
            Just(Kind::Standard),
            Just(Kind::MigStatic),
            Just(Kind::MigDynamic),
            (2u32..=8).prop_map(Kind::TimeSliced)
        ],
    )
}

fn build_node(i: usize, (cpu, mem_gib, gpus, kind): (u64, u64, usize, Kind)) -> Node {
    let model = if matches!(kind, Kind::MigStatic | Kind::MigDynamic) { "A100-40GB" } else { "L4" };
    let memory = GpuCatalog.resolve(model).unwrap().memory_mib;
    let devices = (0..gpus)
        .map(|g| {
            let mut d = GpuDevice::standard(g as u8, memory);
            d.mode = match &kind {
                Kind::Standard => GpuMode::Standard,
                Kind::MigStatic => GpuMode::Mig {
                    // all-balanced: 2x 1g.5gb, 1x 2g.10gb, 1x 3g.20gb
                    instances: [("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3)]
                        .iter()
                        .map(|(p, s)| MigInstance {
                            placement: MigPlacement { profile: p.to_string(), start: *s },
                            used: false,
                        })
                        .collect(),
                    dynamic: false,
                },
                Kind::MigDynamic => GpuMode::Mig { instances: vec![], dynamic: true },
                Kind::TimeSliced(r) => GpuMode::TimeSliced { replicas: *r },
            };
            d
        })
        .collect();
    Node {
        name: format!("n{i}"),
        allocatable: Resources::new(cpu, mem_gib * 1024),
        gpu_model: (gpus > 0).then(|| model.to_string()),
        gpus: devices,
        topology: GpuTopology::uniform(gpus, true),
        ..Default::default()
    }
}

fn demand_strategy() -> impl Strategy<Value = GpuDemand> {
    prop_oneof![
        Just(GpuDemand::None),
        (1u32..=8).prop_map(|count| GpuDemand::Whole { count }),
        (1u32..=2, 1u32..1000, prop_oneof![Just(0u64), 1u64..20_000])
            .prop_map(|(count, milli, memory_mib)| GpuDemand::Fraction { count, milli, memory_mib }),
        (prop_oneof![Just("1g.5gb"), Just("2g.10gb"), Just("3g.20gb"), Just("4g.20gb")], 1u32..=3)
            .prop_map(|(p, count)| GpuDemand::Mig { profile: p.to_string(), count }),
        (1u32..=4).prop_map(|count| GpuDemand::Shared { count }),
    ]
}

fn workload_strategy() -> impl Strategy<Value = (u64, u64, GpuDemand)> {
    (0u64..16_000, 0u64..64, demand_strategy())
}

fn check(nodes: &[Node]) -> Result<(), TestCaseError> {
    for n in nodes {
        prop_assert!(
            n.allocated.fits_in(&n.allocatable),
            "{} over-committed: {:?} > {:?}",
            n.name,
            n.allocated,
            n.allocatable
        );
        let geometry = n.mig_geometry();
        for d in &n.gpus {
            match &d.mode {
                GpuMode::Standard => {
                    prop_assert!(
                        d.used_milli <= 1000,
                        "{} gpu {} at {} milli",
                        n.name,
                        d.index,
                        d.used_milli
                    );
                    prop_assert!(
                        d.used_memory_mib <= d.memory_mib,
                        "{} gpu {} memory over-committed",
                        n.name,
                        d.index
                    );
                }
                GpuMode::Mig { instances, .. } => {
                    let layout: Vec<MigPlacement> = instances.iter().map(|i| i.placement.clone()).collect();
                    prop_assert!(
                        geometry.unwrap().validate(&layout).is_ok(),
                        "{} gpu {} invalid MIG layout {layout:?}",
                        n.name,
                        d.index
                    );
                    prop_assert_eq!(d.used_milli, 0);
                }
                GpuMode::TimeSliced { replicas } => prop_assert!(d.used_replicas <= *replicas),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn no_placement_over_commits(
        nodes in prop::collection::vec(node_strategy(), 1..12),
        workloads in prop::collection::vec(workload_strategy(), 1..60),
        policy in prop::sample::select(PolicyKind::ALL.to_vec()),
        seed in any::<u64>(),
    ) {
        let nodes: Vec<Node> = nodes.into_iter().enumerate().map(|(i, n)| build_node(i, n)).collect();
        let workloads: Vec<Workload> = workloads
            .into_iter()
            .enumerate()
            .map(|(i, (cpu, mem, gpu))| Workload { id: format!("p/{i}"), requests: Resources::new(cpu, mem * 1024), gpu, ..Default::default() })
            .collect();
        let target = TargetWorkload::from_workloads(&workloads, 0.95);
        let policy = policy.build(&ClusterScale::of(&nodes), &target);
        let mut placer = Placer::new(nodes, policy.as_ref(), seed);
        let mut placed = Vec::new();
        for w in &workloads {
            if let Ok(p) = placer.place(w) {
                placed.push((w, p));
            }
            check(placer.nodes())?;
        }
        // Releasing everything returns every node to empty.
        for (w, p) in &placed {
            placer.release(w, p);
        }
        for n in placer.nodes() {
            prop_assert_eq!(n.allocated, Resources::default());
            prop_assert!(n.gpus.iter().all(|d| d.is_idle()), "{} not idle after release", n.name);
        }
    }
}
