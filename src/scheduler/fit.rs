//! Feasibility: may a workload run on a node, and with which devices.

use crate::model::{
    DeviceAssignment, GpuDemand, GpuMode, Node, NodeState, VolumeNeed, Workload, GPU_MILLI, MIG_SLOTS,
};
use serde::Serialize;

/// Why a workload does not fit a node. Reasons are data, reported per pod in plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unfit {
    /// Cordoned, being deleted, or not accepting pods.
    NodeUnschedulable,
    /// Node selector, affinity, taints or GPU model exclude the node.
    NodeMismatch,
    /// Not enough free CPU.
    InsufficientCpu,
    /// Not enough free memory.
    InsufficientMemory,
    /// The node has no GPU of the kind asked for (no GPUs, no MIG, not time-sliced).
    NoSuchGpu,
    /// The node's GPUs of that kind are taken.
    InsufficientGpu,
    /// The node holds as many pods as its allocatable `pods` allows.
    TooManyPods,
    /// Not enough of an extended resource (EFA, RDMA, ephemeral storage, hugepages, ...).
    InsufficientExtended,
    /// A host port the pod binds is taken on the node.
    HostPortTaken,
    /// No pod its required pod affinity asks for in the node's domain.
    PodAffinity,
    /// A pod its required anti-affinity repels is in the node's domain.
    PodAntiAffinity,
    /// A running pod's required anti-affinity repels it from the node's domain.
    ExistingAntiAffinity,
    /// Placing it there would exceed a topology spread constraint's maximum skew.
    TopologySpread,
    /// A bound PersistentVolume's node affinity excludes the node (VolumeBinding).
    VolumeNodeConflict,
    /// No PersistentVolume an unbound claim could bind, nor provisioning, reaches the node
    /// (VolumeBinding: a WaitForFirstConsumer class's allowed topologies, local volumes).
    VolumeBindConflict,
    /// A bound PersistentVolume's zone or region is not the node's (VolumeZone).
    VolumeZoneConflict,
    /// A ResourceClaim of the pod is allocated to devices of another node (DynamicResources).
    ClaimElsewhere,
    /// The node's free DRA devices cannot serve all the pod's claims (DynamicResources).
    ClaimsUnallocatable,
}

impl Unfit {
    /// Every reason, in declaration order (their `as usize` values index this array).
    pub const ALL: [Unfit; 18] = [
        Unfit::NodeUnschedulable,
        Unfit::NodeMismatch,
        Unfit::InsufficientCpu,
        Unfit::InsufficientMemory,
        Unfit::NoSuchGpu,
        Unfit::InsufficientGpu,
        Unfit::TooManyPods,
        Unfit::InsufficientExtended,
        Unfit::HostPortTaken,
        Unfit::PodAffinity,
        Unfit::PodAntiAffinity,
        Unfit::ExistingAntiAffinity,
        Unfit::TopologySpread,
        Unfit::VolumeNodeConflict,
        Unfit::VolumeBindConflict,
        Unfit::VolumeZoneConflict,
        Unfit::ClaimElsewhere,
        Unfit::ClaimsUnallocatable,
    ];

    /// A short reason for events and plans.
    pub fn as_str(self) -> &'static str {
        match self {
            Unfit::NodeUnschedulable => "node unschedulable",
            Unfit::NodeMismatch => "node selector, taints or GPU model do not match",
            Unfit::InsufficientCpu => "insufficient cpu",
            Unfit::InsufficientMemory => "insufficient memory",
            Unfit::NoSuchGpu => "no GPU of the requested kind",
            Unfit::InsufficientGpu => "insufficient free GPU",
            Unfit::TooManyPods => "too many pods",
            Unfit::InsufficientExtended => "insufficient extended resource",
            Unfit::HostPortTaken => "no free ports for the requested pod ports",
            Unfit::PodAffinity => "didn't match pod affinity rules",
            Unfit::PodAntiAffinity => "didn't match pod anti-affinity rules",
            Unfit::ExistingAntiAffinity => "didn't satisfy existing pods anti-affinity rules",
            Unfit::TopologySpread => "didn't match pod topology spread constraints",
            Unfit::VolumeNodeConflict => "had volume node affinity conflict",
            Unfit::VolumeBindConflict => "didn't find available persistent volumes to bind",
            Unfit::VolumeZoneConflict => "had no available volume zone",
            Unfit::ClaimElsewhere => "resourceclaim not available on the node",
            Unfit::ClaimsUnallocatable => "cannot allocate all claims",
        }
    }
}

/// The taint kube-scheduler's NodeUnschedulable filter lets a pod tolerate to run on a cordoned
/// node (DaemonSets carry it).
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Checks everything but devices, as kube-scheduler's per-node filters do: NodeUnschedulable,
/// NodeAffinity/TaintToleration (and the GPU model), NodeResourcesFit for CPU, memory, pods and
/// every extended resource, NodePorts, VolumeBinding and VolumeZone, and DynamicResources for a
/// claim already allocated on another node.
pub fn check_node(node: &Node, workload: &Workload) -> Result<(), Unfit> {
    let tolerates_cordon = || {
        let taint = crate::model::Taint {
            key: UNSCHEDULABLE_TAINT.into(),
            value: String::new(),
            effect: crate::model::TaintEffect::NoSchedule,
        };
        workload.tolerations.iter().any(|t| t.tolerates(&taint))
    };
    if matches!(node.state, NodeState::Deleting | NodeState::Unready)
        || (node.unschedulable && !tolerates_cordon())
    {
        return Err(Unfit::NodeUnschedulable);
    }
    if !workload.allowed_on(node) {
        return Err(Unfit::NodeMismatch);
    }
    let free = node.free();
    if workload.requests.cpu_milli > free.cpu_milli {
        return Err(Unfit::InsufficientCpu);
    }
    if workload.requests.memory_bytes > free.memory_bytes {
        return Err(Unfit::InsufficientMemory);
    }
    if node.max_pods > 0 && node.pod_count >= node.max_pods {
        return Err(Unfit::TooManyPods);
    }
    for (name, &want) in &workload.extended {
        let have = node.extended_allocatable.get(name).copied().unwrap_or(0);
        let used = node.extended_allocated.get(name).copied().unwrap_or(0);
        if want > have.saturating_sub(used) {
            return Err(Unfit::InsufficientExtended);
        }
    }
    if workload.host_ports.iter().any(|p| node.host_ports.iter().any(|q| p.conflicts(q))) {
        return Err(Unfit::HostPortTaken);
    }
    if workload.dra_claims.iter().any(|c| c.allocated_on.as_ref().is_some_and(|n| n != &node.name)) {
        return Err(Unfit::ClaimElsewhere);
    }
    for need in &workload.volumes {
        if !need.admits(node) {
            return Err(match need {
                VolumeNeed::NodeAffinity { bound: true, .. } => Unfit::VolumeNodeConflict,
                VolumeNeed::NodeAffinity { bound: false, .. } => Unfit::VolumeBindConflict,
                VolumeNeed::Zone { .. } => Unfit::VolumeZoneConflict,
            });
        }
    }
    Ok(())
}

/// Whether `pods` all fit on `node` together, each taking its first device choice (a quick check
/// that a node can take over another's pods, not a scored placement).
pub fn holds_all<'a>(node: &Node, pods: impl IntoIterator<Item = &'a Workload>) -> bool {
    let mut sim = node.clone();
    pods.into_iter().all(|w| match candidates(&sim, w).ok().and_then(|c| c.into_iter().next()) {
        Some(d) => {
            sim.allocate_pod(w, &d);
            true
        }
        None => false,
    })
}

/// The device choices worth scoring for a workload on a node: one per distinguishable option
/// (GPUs in the same state are interchangeable, so only one of them is offered). Empty `Ok`
/// never happens: a node without a choice is an `Err`.
pub fn candidates(node: &Node, workload: &Workload) -> Result<Vec<DeviceAssignment>, Unfit> {
    check_node(node, workload)?;
    // DynamicResources: the claims are allocated from the node's free devices. The allocation
    // is a pure function of the node and the claims, so committing the placement recomputes it
    // ([`Node::allocate_pod`]) instead of carrying it in every device choice.
    if !workload.dra_claims.is_empty() && node.dra.allocate(&workload.dra_claims).is_none() {
        return Err(Unfit::ClaimsUnallocatable);
    }
    match &workload.gpu {
        GpuDemand::None => Ok(vec![DeviceAssignment::None]),
        GpuDemand::Whole { count } => whole(node, *count),
        GpuDemand::Fraction { count, milli, memory_mib } => fraction(node, *count, *milli, *memory_mib),
        GpuDemand::Mig { profile, count } => mig(node, profile, *count),
        GpuDemand::Shared { count } => replicas(node, *count),
    }
}

fn standard_gpus(node: &Node) -> impl Iterator<Item = &crate::model::GpuDevice> {
    node.gpus.iter().filter(|d| matches!(d.mode, GpuMode::Standard))
}

fn whole(node: &Node, count: u32) -> Result<Vec<DeviceAssignment>, Unfit> {
    if node.gpus.iter().any(|d| matches!(d.mode, GpuMode::TimeSliced { .. })) {
        // On a time-sliced node `nvidia.com/gpu` counts replicas.
        return replicas(node, count);
    }
    if let Some(profile) = single_strategy_profile(node) {
        // MIG single strategy: `nvidia.com/gpu` counts MIG instances of the node's one profile.
        return mig(node, &profile, count);
    }
    if standard_gpus(node).count() < count as usize {
        return Err(if node.gpus.is_empty() { Unfit::NoSuchGpu } else { Unfit::InsufficientGpu });
    }
    let idle: Vec<u8> = standard_gpus(node).filter(|d| d.is_idle()).map(|d| d.index).collect();
    if idle.len() < count as usize {
        return Err(Unfit::InsufficientGpu);
    }
    Ok(vec![DeviceAssignment::Whole { gpus: select_connected(node, &idle, count as usize) }])
}

/// The devices a pod that is already running on `node` most likely holds: the API does not say
/// which GPU a pod got, so the device choice is replayed (fullest fitting GPU for shares, as
/// HAMi's binpack and KAI do). Taints, selectors, CPU and node state are ignored: the pod is
/// admitted already.
pub fn replay(node: &Node, gpu: &GpuDemand) -> Result<DeviceAssignment, Unfit> {
    let admitted = Workload {
        gpu: gpu.clone(),
        tolerations: vec![crate::model::Toleration {
            operator: crate::model::TolerationOperator::Exists,
            ..Default::default()
        }],
        ..Default::default()
    };
    if node.unschedulable || matches!(node.state, NodeState::Deleting | NodeState::Unready) {
        let mut n = node.clone();
        n.unschedulable = false;
        n.state = NodeState::Ready;
        return super::policy::best_fit_devices(&n, &admitted);
    }
    super::policy::best_fit_devices(node, &admitted)
}

/// The MIG profile that `nvidia.com/gpu` stands for on a node using the device plugin's MIG
/// `single` strategy.
fn single_strategy_profile(node: &Node) -> Option<String> {
    if !node.gpus.iter().any(|d| matches!(d.mode, GpuMode::Mig { .. })) {
        return None;
    }
    // GKE's MIG node pools (`gke-gpu-partition-size`) advertise partitions as `nvidia.com/gpu`.
    if node.labels.get("nvidia.com/mig.strategy").map(String::as_str) != Some("single")
        && !node.labels.contains_key(crate::model::GKE_PARTITION_SIZE_LABEL)
    {
        return None;
    }
    node.gpus.iter().find_map(|d| match &d.mode {
        GpuMode::Mig { instances, .. } => instances.first().map(|i| i.placement.profile.clone()),
        _ => None,
    })
}

/// Picks `k` of the `idle` GPUs, preferring one NVLink domain and one NUMA node, and among those
/// the tightest group so that larger connected groups stay free for larger jobs.
pub fn select_connected(node: &Node, idle: &[u8], k: usize) -> Vec<u8> {
    if k == 0 {
        return Vec::new();
    }
    let topo = &node.topology;
    let keys: [&dyn Fn(u8) -> (Option<u8>, u8); 3] =
        [&|g| (topo.nvlink_of(g), topo.numa_of(g)), &|g| (topo.nvlink_of(g), 0), &|g| {
            (None, topo.numa_of(g))
        }];
    // GPUs sorted by key (stably: each group keeps the order of `idle`), so that groups are runs,
    // visited in key order; the first smallest run that holds `k` wins.
    let mut keyed: Vec<((Option<u8>, u8), u8)> = Vec::with_capacity(idle.len());
    for key in keys {
        keyed.clear();
        keyed.extend(idle.iter().map(|&g| (key(g), g)));
        keyed.sort_by_key(|&(key, _)| key);
        let groups = keyed.chunk_by(|a, b| a.0 == b.0);
        if let Some(group) = groups.filter(|g| g.len() >= k).min_by_key(|g| g.len()) {
            return group[..k].iter().map(|&(_, g)| g).collect();
        }
    }
    idle[..k].to_vec()
}

fn fraction(node: &Node, count: u32, milli: u32, memory_mib: u64) -> Result<Vec<DeviceAssignment>, Unfit> {
    if standard_gpus(node).next().is_none() {
        return Err(Unfit::NoSuchGpu);
    }
    let fitting: Vec<&crate::model::GpuDevice> =
        standard_gpus(node).filter(|d| d.fits_fraction(milli, memory_mib)).collect();
    if fitting.len() < count as usize {
        return Err(Unfit::InsufficientGpu);
    }
    let assignment = |gpus: Vec<u8>| DeviceAssignment::Fraction { gpus, milli, memory_mib };
    if count == 1 {
        // One candidate per distinct GPU state; the policy chooses among them.
        let mut seen: Vec<(u32, u64)> = Vec::new();
        let mut out = Vec::new();
        for d in fitting {
            let state = (d.used_milli, d.used_memory_mib);
            if !seen.contains(&state) {
                seen.push(state);
                out.push(assignment(vec![d.index]));
            }
        }
        return Ok(out);
    }
    // Several shares: the fullest GPUs that still fit, keeping idle GPUs whole.
    let mut sorted = fitting;
    sorted.sort_by_key(|d| (GPU_MILLI - d.used_milli, d.index));
    Ok(vec![assignment(sorted[..count as usize].iter().map(|d| d.index).collect())])
}

fn mig(node: &Node, profile_name: &str, count: u32) -> Result<Vec<DeviceAssignment>, Unfit> {
    let Some(geometry) = node.mig_geometry() else {
        return Err(Unfit::NoSuchGpu);
    };
    let Some(profile) = geometry.profile(profile_name) else {
        return Err(Unfit::NoSuchGpu);
    };
    let mut any_mig = false;
    // Per GPU, the starts of the instances it can give now: free configured ones, then new
    // dynamic ones (placements are built only for the instances taken).
    let mut per_gpu: Vec<(u8, [u8; MIG_SLOTS as usize], usize)> = Vec::new();
    for d in &node.gpus {
        let GpuMode::Mig { instances, dynamic } = &d.mode else {
            continue;
        };
        let (mut starts, mut offered) = ([0u8; MIG_SLOTS as usize], 0usize);
        for i in instances.iter().filter(|i| !i.used && i.placement.profile == profile_name) {
            if offered < starts.len() {
                starts[offered] = i.placement.start;
                offered += 1;
            }
        }
        any_mig |= *dynamic || instances.iter().any(|i| i.placement.profile == profile_name);
        if *dynamic {
            if let Some(mut layout) = geometry.layout_state(instances.iter().map(|i| &i.placement)) {
                while offered < (count as usize).min(starts.len()) {
                    let Some(start) = geometry.best_start_in(layout, profile) else {
                        break;
                    };
                    layout = layout.with(profile, start);
                    starts[offered] = start;
                    offered += 1;
                }
            }
        }
        if offered > 0 {
            per_gpu.push((d.index, starts, offered));
        }
    }
    if !any_mig {
        return Err(Unfit::NoSuchGpu);
    }
    let total: usize = per_gpu.iter().map(|&(_, _, n)| n).sum();
    if total < count as usize {
        return Err(Unfit::InsufficientGpu);
    }
    // Take instances from the GPUs with the fewest offers first, so emptier GPUs stay whole.
    per_gpu.sort_by_key(|&(g, _, n)| (n, g));
    let instances = per_gpu
        .iter()
        .flat_map(|(g, starts, n)| starts[..*n].iter().map(move |&start| (*g, start)))
        .take(count as usize)
        .map(|(g, start)| (g, crate::model::mig::MigPlacement { profile: profile_name.to_string(), start }))
        .collect();
    Ok(vec![DeviceAssignment::Mig { instances }])
}

fn replicas(node: &Node, count: u32) -> Result<Vec<DeviceAssignment>, Unfit> {
    let mut free: Vec<(u32, u8)> = node
        .gpus
        .iter()
        .filter_map(|d| match d.mode {
            GpuMode::TimeSliced { replicas } => Some((replicas.saturating_sub(d.used_replicas), d.index)),
            _ => None,
        })
        .collect();
    if free.is_empty() {
        return Err(Unfit::NoSuchGpu);
    }
    if free.iter().map(|(f, _)| f).sum::<u32>() < count {
        return Err(Unfit::InsufficientGpu);
    }
    // Spread replicas over the least-shared GPUs, like the device plugin does.
    free.sort_by_key(|&(f, g)| (std::cmp::Reverse(f), g));
    let mut gpus = Vec::with_capacity(count as usize);
    while gpus.len() < count as usize {
        for (f, g) in free.iter_mut() {
            if *f > 0 && gpus.len() < count as usize {
                *f -= 1;
                gpus.push(*g);
            }
        }
    }
    gpus.sort_unstable();
    Ok(vec![DeviceAssignment::Replicas { gpus }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDevice, GpuTopology, Resources};

    fn node(gpus: usize, topology: GpuTopology) -> Node {
        Node {
            name: "n".into(),
            allocatable: Resources::new(64_000, 1 << 20),
            gpu_model: Some("A100-80GB".into()),
            gpus: (0..gpus).map(|i| GpuDevice::standard(i as u8, 81920)).collect(),
            topology,
            ..Default::default()
        }
    }

    fn ask(gpu: GpuDemand) -> Workload {
        Workload { requests: Resources::new(1000, 1), gpu, ..Default::default() }
    }

    #[test]
    fn multi_gpu_pods_get_gpus_of_one_nvlink_domain_and_numa_node() {
        // Two NVLink islands of four GPUs (0-3, 4-7), each on its own NUMA node; GPU 1 is taken.
        let topo = GpuTopology {
            numa: vec![0, 0, 0, 0, 1, 1, 1, 1],
            nvlink_domain: vec![0, 0, 0, 0, 1, 1, 1, 1],
            clique: None,
        };
        let mut n = node(8, topo);
        n.allocate(&Resources::default(), &DeviceAssignment::Whole { gpus: vec![1] });
        // Three GPUs: the island with exactly three free GPUs (0, 2, 3) is the tightest fit,
        // keeping the four-GPU island whole.
        let c = candidates(&n, &ask(GpuDemand::Whole { count: 3 })).unwrap();
        assert_eq!(c, vec![DeviceAssignment::Whole { gpus: vec![0, 2, 3] }]);
        // Four GPUs: only the second island has four.
        let c = candidates(&n, &ask(GpuDemand::Whole { count: 4 })).unwrap();
        assert_eq!(c, vec![DeviceAssignment::Whole { gpus: vec![4, 5, 6, 7] }]);
        // Six GPUs span islands when nothing else fits.
        let c = candidates(&n, &ask(GpuDemand::Whole { count: 6 })).unwrap();
        assert!(matches!(&c[0], DeviceAssignment::Whole { gpus } if gpus.len() == 6 && !gpus.contains(&1)));
        assert_eq!(candidates(&n, &ask(GpuDemand::Whole { count: 8 })), Err(Unfit::InsufficientGpu));
    }

    #[test]
    fn fractional_shares_offer_one_candidate_per_gpu_state_and_respect_memory() {
        let mut n = node(4, GpuTopology::default());
        n.allocate(
            &Resources::default(),
            &DeviceAssignment::Fraction { gpus: vec![0], milli: 600, memory_mib: 40_000 },
        );
        n.allocate(
            &Resources::default(),
            &DeviceAssignment::Fraction { gpus: vec![1], milli: 600, memory_mib: 40_000 },
        );
        let c = candidates(&n, &ask(GpuDemand::Fraction { count: 1, milli: 300, memory_mib: 0 })).unwrap();
        // GPUs 0 and 1 are in the same state, 2 and 3 too: two candidates.
        assert_eq!(c.len(), 2);
        // 50 GiB of memory no longer fits next to 40 GiB on an 80 GiB GPU.
        let c =
            candidates(&n, &ask(GpuDemand::Fraction { count: 1, milli: 100, memory_mib: 50_000 })).unwrap();
        assert_eq!(c, vec![DeviceAssignment::Fraction { gpus: vec![2], milli: 100, memory_mib: 50_000 }]);
        // 0.5 GPU no longer fits on a GPU with 0.4 free.
        n.allocate(&Resources::default(), &DeviceAssignment::Whole { gpus: vec![2, 3] });
        assert_eq!(
            candidates(&n, &ask(GpuDemand::Fraction { count: 1, milli: 500, memory_mib: 0 })),
            Err(Unfit::InsufficientGpu)
        );
        // Whole GPUs never go to a shared GPU.
        assert_eq!(candidates(&n, &ask(GpuDemand::Whole { count: 1 })), Err(Unfit::InsufficientGpu));
    }

    #[test]
    fn time_sliced_replicas_spread_over_the_least_shared_gpus() {
        let mut n = node(2, GpuTopology::default());
        for d in &mut n.gpus {
            d.mode = GpuMode::TimeSliced { replicas: 4 };
        }
        n.allocate(&Resources::default(), &DeviceAssignment::Replicas { gpus: vec![0] });
        // `nvidia.com/gpu: 3` on a time-sliced node is three replicas.
        let c = candidates(&n, &ask(GpuDemand::Whole { count: 3 })).unwrap();
        assert_eq!(c, vec![DeviceAssignment::Replicas { gpus: vec![0, 1, 1] }]);
        assert_eq!(candidates(&n, &ask(GpuDemand::Shared { count: 8 })), Err(Unfit::InsufficientGpu));
        assert_eq!(
            candidates(&n, &ask(GpuDemand::Fraction { count: 1, milli: 500, memory_mib: 0 })),
            Err(Unfit::NoSuchGpu)
        );
    }

    #[test]
    fn mig_single_strategy_serves_gpu_requests_with_instances() {
        let mut n = node(1, GpuTopology::default());
        n.labels.insert("nvidia.com/mig.strategy".into(), "single".into());
        n.gpus[0].mode = GpuMode::Mig {
            instances: (0..7)
                .map(|s| crate::model::MigInstance {
                    placement: crate::model::mig::MigPlacement { profile: "1g.10gb".into(), start: s },
                    used: false,
                })
                .collect(),
            dynamic: false,
        };
        let c = candidates(&n, &ask(GpuDemand::Whole { count: 2 })).unwrap();
        assert!(matches!(&c[0], DeviceAssignment::Mig { instances } if instances.len() == 2));
        assert_eq!(candidates(&n, &ask(GpuDemand::Whole { count: 8 })), Err(Unfit::InsufficientGpu));
    }

    #[test]
    fn dynamic_mig_creates_valid_instances_on_demand() {
        let mut n = node(1, GpuTopology::default());
        n.gpus[0].mode = GpuMode::Mig { instances: vec![], dynamic: true };
        let w = ask(GpuDemand::Mig { profile: "3g.40gb".into(), count: 1 });
        let c = candidates(&n, &w).unwrap();
        n.allocate(&Resources::default(), &c[0]);
        let c2 = candidates(&n, &w).unwrap();
        n.allocate(&Resources::default(), &c2[0]);
        // Two 3g.40gb fill the GPU's valid starts (0 and 4); a third does not fit.
        assert_eq!(candidates(&n, &w), Err(Unfit::InsufficientGpu));
        assert_eq!(
            candidates(&n, &ask(GpuDemand::Mig { profile: "9g.99gb".into(), count: 1 })),
            Err(Unfit::NoSuchGpu)
        );
    }

    fn port(protocol: &str, ip: &str, port: u16) -> crate::model::HostPort {
        crate::model::HostPort { protocol: protocol.into(), ip: ip.into(), port }
    }

    /// kube-scheduler's NodePorts tests (`node_ports_test.go`, TestNodePorts): same port and
    /// protocol on the same or any address conflicts; another protocol or another specific
    /// address does not.
    #[test]
    fn host_ports_conflict_as_node_ports_decides() {
        let mut n = node(0, GpuTopology::default());
        let running = Workload { host_ports: vec![port("TCP", "127.0.0.1", 8080)], ..ask(GpuDemand::None) };
        n.allocate_pod(&running, &DeviceAssignment::None);
        let with = |p| Workload { host_ports: vec![p], ..ask(GpuDemand::None) };
        assert_eq!(check_node(&n, &with(port("TCP", "127.0.0.1", 8080))), Err(Unfit::HostPortTaken));
        assert_eq!(check_node(&n, &with(port("TCP", "0.0.0.0", 8080))), Err(Unfit::HostPortTaken));
        assert_eq!(check_node(&n, &with(port("TCP", "", 8080))), Err(Unfit::HostPortTaken));
        assert_eq!(check_node(&n, &with(port("UDP", "127.0.0.1", 8080))), Ok(()));
        assert_eq!(check_node(&n, &with(port("TCP", "127.0.0.2", 8080))), Ok(()));
        assert_eq!(check_node(&n, &with(port("TCP", "127.0.0.1", 8081))), Ok(()));
        n.release_pod(&running, &DeviceAssignment::None);
        assert_eq!(check_node(&n, &with(port("TCP", "0.0.0.0", 8080))), Ok(()), "freed with its pod");
    }

    /// NodeResourcesFit (`fit_test.go`, "too many resources fails due to pods" and the extended
    /// resource cases): the pod limit, and each extended resource against what is left of it.
    #[test]
    fn the_pod_limit_and_extended_resources_are_checked_like_cpu() {
        let mut n = node(0, GpuTopology::default());
        n.max_pods = 2;
        n.extended_allocatable.insert("vpc.amazonaws.com/efa".into(), 2);
        let efa = |k: u64| Workload {
            extended: [("vpc.amazonaws.com/efa".to_string(), k)].into(),
            ..ask(GpuDemand::None)
        };
        assert_eq!(check_node(&n, &efa(3)), Err(Unfit::InsufficientExtended));
        assert_eq!(check_node(&n, &efa(2)), Ok(()));
        n.allocate_pod(&efa(1), &DeviceAssignment::None);
        assert_eq!(check_node(&n, &efa(2)), Err(Unfit::InsufficientExtended), "one of two is taken");
        let rdma = Workload { extended: [("rdma/ib".to_string(), 1)].into(), ..ask(GpuDemand::None) };
        assert_eq!(check_node(&n, &rdma), Err(Unfit::InsufficientExtended), "a resource the node lacks");
        n.allocate_pod(&ask(GpuDemand::None), &DeviceAssignment::None);
        assert_eq!(check_node(&n, &ask(GpuDemand::None)), Err(Unfit::TooManyPods));
        n.max_pods = 0;
        assert_eq!(check_node(&n, &ask(GpuDemand::None)), Ok(()), "no limit known");
    }

    /// NodeUnschedulable (`node_unschedulable_test.go`): a cordoned node takes only pods that
    /// tolerate `node.kubernetes.io/unschedulable:NoSchedule`.
    #[test]
    fn a_cordoned_node_takes_only_pods_tolerating_the_cordon() {
        let mut n = node(0, GpuTopology::default());
        n.unschedulable = true;
        assert_eq!(check_node(&n, &ask(GpuDemand::None)), Err(Unfit::NodeUnschedulable));
        let tolerant = Workload {
            tolerations: vec![crate::model::Toleration {
                key: UNSCHEDULABLE_TAINT.into(),
                operator: crate::model::TolerationOperator::Exists,
                effect: Some(crate::model::TaintEffect::NoSchedule),
                ..Default::default()
            }],
            ..ask(GpuDemand::None)
        };
        assert_eq!(check_node(&n, &tolerant), Ok(()));
    }
}
