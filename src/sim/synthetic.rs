//! Deterministic synthetic clusters at production scale, for benchmarks and scale tests.

use crate::model::{
    ClusterSnapshot, GpuDemand, NodeGroup, NodeState, OwnerKind, Resources, Toleration, TolerationOperator,
    Workload,
};
use crate::providers::config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Node groups of the synthetic cluster: H100 and A100 (MIG) training/inference pools, time-sliced
/// L4, A10G and CPU nodes.
pub(crate) const GROUPS: &str = r#"
accounts:
  - name: bench
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: h100, instanceType: p5.48xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3000, targetSize: 0}
      - {name: a100, instanceType: p4d.24xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3000, targetSize: 0}
      - {name: a100-mig, instanceType: p4d.24xlarge, zones: [us-east-1b], minSize: 0, maxSize: 3000, targetSize: 0, gpuSharing: {mig: all-balanced}}
      - {name: l4-ts, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3000, targetSize: 0, gpuSharing: {timeSlicing: {replicas: 4}}}
      - {name: a10g, instanceType: g5.48xlarge, zones: [us-east-1b], minSize: 0, maxSize: 3000, targetSize: 0}
      - {name: cpu, instanceType: m6i.4xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3000, targetSize: 0}
"#;

/// A cluster of `gpu_nodes` 4- and 8-GPU nodes with `running` pods on them and `pending` pods
/// waiting, of mixed shapes (whole, multi-GPU, fractional, MIG, time-sliced, CPU), plus the
/// node groups they belong to.
pub fn cluster(
    gpu_nodes: usize,
    running: usize,
    pending: usize,
    seed: u64,
) -> (ClusterSnapshot, Vec<NodeGroup>) {
    let mut groups =
        config::load_strs(&[("<synthetic>", GROUPS)]).map(|c| c.node_groups()).unwrap_or_default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Share of GPU nodes per group (h100, a100, a100-mig, l4-ts, a10g).
    let mix = [0.3, 0.2, 0.15, 0.2, 0.15];
    let mut snapshot = ClusterSnapshot::default();
    for (gi, share) in mix.iter().enumerate() {
        let count = (gpu_nodes as f64 * share).round() as usize;
        for k in 0..count {
            let g = &groups[gi];
            let name = format!("{}-{k}", g.name());
            snapshot.nodes.push(crate::planner::cluster::template_node(g, name, NodeState::Ready));
        }
        groups[gi].target_size = count as u32;
        groups[gi].max_size = groups[gi].max_size.max(count as u32 + 100);
    }
    let names: Vec<(String, usize)> = snapshot
        .nodes
        .iter()
        .map(|n| {
            let gi = groups
                .iter()
                .position(|g| g.id.ends_with(n.node_group.as_deref().unwrap_or("")))
                .unwrap_or(0);
            (n.name.clone(), gi)
        })
        .collect();
    let tolerate_all = vec![Toleration { operator: TolerationOperator::Exists, ..Default::default() }];
    let shape = |rng: &mut ChaCha8Rng, group: usize| -> (Resources, GpuDemand) {
        // Pods come from a few dozen deployment/job templates, not from continuous sizes.
        let cpu = [500, 1000, 2000, 4000, 8000][rng.random_range(0..5)];
        let mem = 1024 * [2, 4, 8, 16, 32][rng.random_range(0..5)];
        let gpu = match group {
            0 | 1 => match rng.random_range(0..10) {
                0 => GpuDemand::Whole { count: 8 },
                1 | 2 => GpuDemand::Whole { count: 2 },
                3..=6 => GpuDemand::Whole { count: 1 },
                _ => GpuDemand::Fraction {
                    count: 1,
                    milli: [250, 500, 300][rng.random_range(0..3)],
                    memory_mib: 0,
                },
            },
            2 => GpuDemand::Mig {
                profile: ["1g.5gb", "2g.10gb", "3g.20gb"][rng.random_range(0..3)].into(),
                count: 1,
            },
            3 => GpuDemand::Whole { count: 1 },
            4 => GpuDemand::Fraction { count: 1, milli: 100 * rng.random_range(1..=9u32), memory_mib: 0 },
            _ => GpuDemand::None,
        };
        (Resources::new(cpu, mem), gpu)
    };
    // Running pods: drawn per node, so that they fit where they are.
    let mut placed = 0;
    let mut i = 0;
    while placed < running && !names.is_empty() {
        let (node, gi) = &names[i % names.len()];
        i += 1;
        let (requests, gpu) = shape(&mut rng, *gi);
        snapshot.workloads.push(Workload {
            id: format!("team-{}/run-{placed}", placed % 17),
            requests,
            gpu,
            node_name: Some(node.clone()),
            owner: OwnerKind::ReplicaSet,
            tolerations: tolerate_all.clone(),
            ..Default::default()
        });
        placed += 1;
    }
    for p in 0..pending {
        let gi = rng.random_range(0..6usize);
        let (requests, gpu) = shape(&mut rng, gi);
        snapshot.workloads.push(Workload {
            id: format!("team-{}/pending-{p}", p % 17),
            requests,
            gpu,
            owner: OwnerKind::Job,
            tolerations: tolerate_all.clone(),
            ..Default::default()
        });
    }
    (snapshot, groups)
}

/// Gives every pod a namespace and an `app` label, as pods of a real cluster have, and a `share`
/// of them the inter-pod constraints services use: half required anti-affinity to their own
/// replicas per host, half a zone spread (`maxSkew: 1`, `DoNotSchedule`) over their replicas.
/// Running pods keep their nodes (constraints apply when pods are placed).
pub fn with_interpod(snapshot: &mut ClusterSnapshot, share: f64, seed: u64) {
    use crate::model::{LabelSelector, PodAffinityTerm, PodIdentity, SpreadConstraint};
    use std::sync::Arc;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1f7e_4a0d);
    for w in &mut snapshot.workloads {
        let namespace = w.id.split('/').next().unwrap_or_default().to_string();
        // Services of ~25 replicas each.
        let app = format!("svc-{}", rng.random_range(0..(snapshot.nodes.len() / 5).max(1)));
        let labels = std::collections::BTreeMap::from([("app".to_string(), app.clone())]);
        let same_app = LabelSelector { match_labels: labels.clone(), ..Default::default() };
        let mut anti_affinity = Vec::new();
        if rng.random_bool(share) {
            if rng.random_bool(0.5) {
                anti_affinity.push(PodAffinityTerm {
                    selector: same_app,
                    namespaces: vec![namespace.clone()],
                    topology_key: crate::model::HOSTNAME_LABEL.into(),
                });
            } else {
                w.spread.push(SpreadConstraint {
                    max_skew: 1,
                    topology_key: "topology.kubernetes.io/zone".into(),
                    selector: same_app,
                    min_domains: 1,
                    honor_node_affinity: true,
                    honor_node_taints: false,
                });
            }
        }
        w.identity = Some(Arc::new(PodIdentity { namespace, labels, anti_affinity }));
    }
}
