//! The simulated cluster a plan is made on: existing nodes, nodes on their way, and the running
//! pods on them.

use crate::model::{
    ClusterSnapshot, DeviceAssignment, InstanceState, Node, NodeGroup, NodeState, Workload, HOSTNAME_LABEL,
};
use crate::scheduler::{fit, Placement, Placer};
use std::collections::HashMap;

/// Where a simulated node comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Registered and ready.
    Ready,
    /// Registered but booting or waiting for its GPUs (counts as capacity on its way).
    Initializing,
    /// Registered, but NotReady or its GPUs regressed: not capacity
    /// ([`crate::planner::readiness`]).
    Unready,
    /// Requested from the cloud (target size above registered nodes), not registered yet.
    Upcoming,
    /// Added by this plan's scale-up.
    New,
}

/// Per simulated node: its group and where it comes from.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// Index into the plan's groups, if the node belongs to a managed group.
    pub group: Option<usize>,
    /// Origin.
    pub origin: Origin,
    /// Workloads (indexes into the snapshot) on the node, with their devices.
    pub pods: Vec<(usize, DeviceAssignment)>,
}

/// Finds the group a node belongs to: by provider id among the group's instances, else by the
/// node-group label against the group name (the last segment of the group id). For many nodes,
/// [`GroupIndex`].
pub fn group_of(node: &Node, groups: &[NodeGroup]) -> Option<usize> {
    if let Some(pid) = &node.provider_id {
        if let Some(i) = groups.iter().position(|g| g.instances.iter().any(|inst| &inst.id == pid)) {
            return Some(i);
        }
    }
    group_by_label(node, groups)
}

fn group_by_label(node: &Node, groups: &[NodeGroup]) -> Option<usize> {
    let label = node.node_group.as_deref()?;
    groups
        .iter()
        .position(|g| g.name() == label && node.instance_type.as_deref().is_none_or(|t| t == g.instance_type))
}

/// [`group_of`] for many nodes: provider ids looked up in one map. Walking every group's
/// instances for each node is quadratic in the cluster (a third of a 5,000-node controller pass).
pub struct GroupIndex<'g> {
    groups: &'g [NodeGroup],
    by_instance: HashMap<&'g str, usize>,
}

impl<'g> GroupIndex<'g> {
    /// The index of `groups`' instances.
    pub fn of(groups: &'g [NodeGroup]) -> Self {
        let mut by_instance = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            for inst in &g.instances {
                // The first group listing an instance owns it, as in [`group_of`].
                by_instance.entry(inst.id.as_str()).or_insert(i);
            }
        }
        Self { groups, by_instance }
    }

    /// The group `node` belongs to, as [`group_of`] finds it.
    pub fn group_of(&self, node: &Node) -> Option<usize> {
        match node.provider_id.as_deref().and_then(|pid| self.by_instance.get(pid)) {
            Some(&i) => Some(i),
            None => group_by_label(node, self.groups),
        }
    }
}

/// A node as the group's template describes it, named for the plan. Like every node, it is its
/// own `kubernetes.io/hostname` domain (Cluster Autoscaler's template sanitising does the same),
/// so anti-affine and spread pods ask for one new node each, as kube-scheduler will place them.
pub fn template_node(group: &NodeGroup, name: String, state: NodeState) -> Node {
    let mut node = group.template.clone();
    node.labels.insert(HOSTNAME_LABEL.to_string(), name.clone());
    node.name = name;
    node.node_group = Some(group.name().to_string());
    node.instance_type = Some(group.instance_type.clone());
    node.state = state;
    node
}

/// The zone label of nodes.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The zone a multi-zone group's next instance lands in: the one of its zones holding fewest of
/// the group's `members` (AWS Auto Scaling groups launch into the Availability Zone with the
/// fewest instances; regional managed instance groups spread evenly), the first listed on ties.
/// `None` for a single-zone group, whose template already sits in its zone.
pub fn next_zone<'a, 'n>(group: &'a NodeGroup, members: impl Iterator<Item = &'n Node>) -> Option<&'a str> {
    let mut counts = vec![0usize; group.zones.len()];
    members.filter_map(|n| zone_slot(group, n)).for_each(|i| counts[i] += 1);
    fewest(group, &counts)
}

/// Which of `group`'s zones `node` is in.
fn zone_slot(group: &NodeGroup, node: &Node) -> Option<usize> {
    node.labels.get(ZONE_LABEL).and_then(|z| group.zones.iter().position(|g| g == z))
}

/// [`next_zone`] given how many members each zone holds.
fn fewest<'a>(group: &'a NodeGroup, counts: &[usize]) -> Option<&'a str> {
    if group.zones.len() < 2 {
        return None;
    }
    let fewest = (0..counts.len()).min_by_key(|&i| (counts[i], i))?;
    Some(group.zones[fewest].as_str())
}

/// How many of each group's nodes each of its zones holds, kept as a plan adds and retires
/// nodes: [`next_zone`] walks the whole cluster, too slow to ask once per pending pod and group.
pub struct ZoneCounts(Vec<Vec<usize>>);

impl ZoneCounts {
    /// The counts of the groups' members among `nodes`.
    pub fn of(groups: &[NodeGroup], nodes: &[Node], info: &[NodeInfo]) -> Self {
        let mut counts = Self(groups.iter().map(|g| vec![0; g.zones.len()]).collect());
        for (node, i) in nodes.iter().zip(info) {
            if let Some(gi) = i.group {
                counts.add(&groups[gi], gi, node);
            }
        }
        counts
    }

    /// Counts `node`, a new member of group `gi`.
    pub fn add(&mut self, group: &NodeGroup, gi: usize, node: &Node) {
        if let Some(i) = zone_slot(group, node) {
            self.0[gi][i] += 1;
        }
    }

    /// Stops counting `node`, a member of group `gi` about to be retired.
    pub fn remove(&mut self, group: &NodeGroup, gi: usize, node: &Node) {
        if let Some(i) = zone_slot(group, node) {
            self.0[gi][i] -= 1;
        }
    }

    /// [`next_zone`] of group `gi`.
    pub fn next<'a>(&self, group: &'a NodeGroup, gi: usize) -> Option<&'a str> {
        fewest(group, &self.0[gi])
    }
}

/// A node of `group` as [`template_node`] makes it, in `zone` ([`next_zone`]'s pick).
pub fn next_node(group: &NodeGroup, name: String, state: NodeState, zone: Option<&str>) -> Node {
    let mut node = template_node(group, name, state);
    if let Some(zone) = zone {
        node.labels.insert(ZONE_LABEL.to_string(), zone.to_string());
        node.zone = Some(zone.to_string());
    }
    node
}

/// The nodes of group `gi` a plan has so far (registered, on their way, new; retired ones have
/// lost their labels and count nowhere).
pub fn members_of<'a>(nodes: &'a [Node], info: &'a [NodeInfo], gi: usize) -> impl Iterator<Item = &'a Node> {
    nodes.iter().zip(info).filter(move |(_, i)| i.group == Some(gi)).map(|(n, _)| n)
}

/// Sets each group's current size to the nodes of it the snapshot holds: offline, with no cloud
/// to ask, the cluster is the truth about sizes (and so about cost). A size the config states
/// that disagrees is reported in `warnings`.
pub fn sizes_from_snapshot(
    groups: &mut [NodeGroup],
    snapshot: &ClusterSnapshot,
    stated: &[Option<u32>],
    warnings: &mut Vec<String>,
) {
    let mut counts = vec![0u32; groups.len()];
    let index = GroupIndex::of(groups);
    for n in &snapshot.nodes {
        if let Some(g) = index.group_of(n) {
            counts[g] += 1;
            continue;
        }
        // The group's label, another instance type: said, not silently left out of the group.
        let named = n.node_group.as_deref().and_then(|l| groups.iter().find(|g| g.name() == l));
        if let (Some(g), Some(t)) = (named, n.instance_type.as_deref()) {
            let known =
                if crate::providers::catalog::lookup(t).is_some() { "" } else { " (not in the catalog)" };
            warnings.push(format!(
                "Node {}: instance type {t:?}{known} (label node.kubernetes.io/instance-type) is not node group {}'s {:?}; the node is not counted in the group",
                n.name, g.id, g.instance_type
            ));
        }
    }
    for ((g, count), stated) in groups.iter_mut().zip(counts).zip(stated) {
        if let Some(t) = stated.filter(|&t| t != count) {
            warnings.push(format!(
                "node group {}: the config says targetSize {t}, the snapshot holds {count} of its nodes; planning with {count}",
                g.id
            ));
        }
        if count > g.max_size {
            warnings.push(format!(
                "node group {}: the snapshot holds {count} of its nodes, above its maxSize {}",
                g.id, g.max_size
            ));
        }
        g.target_size = count;
    }
}

/// Builds the placer and node bookkeeping for a snapshot and its groups.
pub fn build<'p>(
    snapshot: &ClusterSnapshot,
    groups: &[NodeGroup],
    policy: &'p dyn crate::scheduler::Policy,
    seed: u64,
    taints: TaintRules,
    warnings: &mut Vec<String>,
) -> (Placer<'p>, Vec<NodeInfo>) {
    let mut nodes = Vec::with_capacity(snapshot.nodes.len());
    let mut info = Vec::with_capacity(snapshot.nodes.len());
    let mut registered = vec![0u32; groups.len()];
    let index = GroupIndex::of(groups);
    for node in &snapshot.nodes {
        let group = index.group_of(node);
        let mut node = node.clone();
        let mut origin = Origin::Ready;
        if matches!(node.state, NodeState::Initializing | NodeState::Ready) {
            // A registering node carries taints that go when it turns Ready (and a Ready one
            // until the node lifecycle controller or its startup agent catches up); planned as it
            // will be, or every pod waiting for it would ask for yet another node. Until its
            // startup taints are gone it is still starting: capacity on its way, never drained.
            let before = node.taints.len();
            node.taints.retain(|t| !taints.is_startup(&t.key));
            if node.taints.len() < before {
                origin = Origin::Initializing;
            }
        }
        if node.state == NodeState::Unready {
            origin = Origin::Unready;
        }
        if node.state == NodeState::Initializing {
            origin = Origin::Initializing;
            // GPUs (or, on a node registered before its kubelet reported capacity, CPU and
            // memory) not yet advertised: plan with what its group's instances carry.
            if let Some(g) = group.map(|g| &groups[g]) {
                if node.allocatable.cpu_milli == 0 && node.allocatable.memory_bytes == 0 {
                    node.allocatable = g.template.allocatable;
                }
                // A node whose device plugin is off gets its GPUs through DRA, never as
                // `nvidia.com/gpu` (the config's template would count them twice).
                if node.gpus.is_empty()
                    && !g.template.gpus.is_empty()
                    && !node.lifecycle.device_plugin_disabled
                {
                    node.gpus = g.template.gpus.clone();
                    node.gpu_model = g.template.gpu_model.clone();
                    node.topology = g.template.topology.clone();
                }
                // Its DRA devices come with its ResourceSlices; until then, its group's.
                if node.dra.is_empty() && !g.template.dra.is_empty() {
                    node.dra = g.template.dra.clone();
                }
            }
        }
        if let Some(g) = group {
            // Matched by provider id alone: name its group, which placement reads as "elastic".
            node.node_group.get_or_insert_with(|| groups[g].name().to_string());
            // Every registered node of the group fills a place of its target size, whatever its
            // state: a node being deleted still holds its instance until the cloud removes it,
            // and counting it as not there would plan a phantom upcoming node in its place.
            registered[g] += 1;
        }
        nodes.push(node);
        info.push(NodeInfo { group, origin, pods: Vec::new() });
    }
    let mut zones = ZoneCounts::of(groups, &nodes, &info);
    for (gi, g) in groups.iter().enumerate() {
        let failed =
            g.instances.iter().filter(|i| matches!(i.state, InstanceState::Failed { .. })).count() as u32;
        let upcoming = g.target_size.saturating_sub(registered[gi] + failed);
        for k in 0..upcoming {
            let name = format!("{}-upcoming-{}", g.name(), k + 1);
            let node = next_node(g, name, NodeState::Upcoming, zones.next(g, gi));
            zones.add(g, gi, &node);
            nodes.push(node);
            info.push(NodeInfo { group: Some(gi), origin: Origin::Upcoming, pods: Vec::new() });
        }
    }
    let by_name: rustc_hash::FxHashMap<&str, usize> =
        snapshot.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut placer = Placer::new(nodes, policy, seed).with_adaptive_sampling();
    for (wi, w) in snapshot.workloads.iter().enumerate() {
        let Some(node_name) = &w.node_name else { continue };
        let Some(&ni) = by_name.get(node_name.as_str()) else {
            warnings.push(format!("pod {} is bound to node {node_name}, which is not in the snapshot", w.id));
            continue;
        };
        let devices = match &w.devices {
            Some(d) => d.clone(),
            None => running_devices(&placer.nodes()[ni], w, warnings),
        };
        placer.commit(w, &Placement { node: ni, devices: devices.clone() });
        info[ni].pods.push((wi, devices));
    }
    (placer, info)
}

/// Devices a running pod holds; a pod that no longer fits (over-committed node) keeps its CPU and
/// memory only.
fn running_devices(node: &Node, w: &Workload, warnings: &mut Vec<String>) -> DeviceAssignment {
    fit::replay(node, &w.gpu).unwrap_or_else(|reason| {
        if !w.gpu.is_none() {
            warnings.push(format!(
                "pod {} on {} asks for {} but the node has no room for it ({})",
                w.id,
                node.name,
                w.gpu.describe(),
                reason.as_str()
            ));
        }
        DeviceAssignment::None
    })
}

/// Node-specific labels that never belong in a group template.
const NODE_SPECIFIC_LABELS: &[&str] = &[HOSTNAME_LABEL, ZONE_LABEL, "topology.k8s.aws/zone-id"];

/// Taints that Kubernetes, cloud controllers and autoscalers put on nodes while they run (node
/// conditions, cordons, deletion marks; Cluster Autoscaler keeps the same list): a node that
/// starts anew never has them, so they are never learned into a group's template.
pub const TRANSIENT_TAINTS: &[&str] = &[
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/out-of-service",
    "node.cloudprovider.kubernetes.io/shutdown",
    "ToBeDeletedByClusterAutoscaler",
    "DeletionCandidateOfClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    crate::model::DISRUPTING_TAINT,
];

/// The taints a node has while it comes up and loses when it turns Ready (set by the node
/// lifecycle controller and cloud controller manager).
pub const STARTUP_CONDITION_TAINTS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/network-unavailable",
    "node.cloudprovider.kubernetes.io/uninitialized",
];

/// Key prefixes Cluster Autoscaler gives meaning without configuration, so node pools set up for
/// it work unchanged: a startup taint (or the older ignore-taint) is removed by an agent once the
/// node has started; a status taint may come and go on a running node.
const STARTUP_TAINT_PREFIXES: &[&str] =
    &["startup-taint.cluster-autoscaler.kubernetes.io/", "ignore-taint.cluster-autoscaler.kubernetes.io/"];
const STATUS_TAINT_PREFIX: &str = "status-taint.cluster-autoscaler.kubernetes.io/";

/// Which taints a node sheds once started and which a new node never has, from the built-in
/// lists and the config's `startupTaints` and `ignoredTaints`.
#[derive(Debug, Clone, Copy)]
pub struct TaintRules<'a> {
    startup: &'a [String],
    ignored: &'a [String],
}

impl<'a> TaintRules<'a> {
    /// The rules of these settings.
    pub fn of(settings: &'a super::PlannerSettings) -> Self {
        Self { startup: &settings.startup_taints, ignored: &settings.ignored_taints }
    }

    /// A taint the node loses when it has started (Kubernetes' condition taints, Cluster
    /// Autoscaler's startup prefixes, Karpenter-style configured `startupTaints`): pods need not
    /// tolerate it, and a Ready node that still has one is still starting.
    pub fn is_startup(&self, key: &str) -> bool {
        STARTUP_CONDITION_TAINTS.contains(&key)
            || STARTUP_TAINT_PREFIXES.iter().any(|p| key.starts_with(p))
            || self.startup.iter().any(|k| k == key)
    }

    /// A taint a node that starts anew does not have: startup taints, run-time ones
    /// ([`TRANSIENT_TAINTS`], status taints, configured `ignoredTaints`). Never learned into a
    /// group's template; running nodes keep it, as kube-scheduler sees it there.
    pub fn is_not_on_new_nodes(&self, key: &str) -> bool {
        self.is_startup(key)
            || TRANSIENT_TAINTS.contains(&key)
            || key.starts_with(STATUS_TAINT_PREFIX)
            || self.ignored.iter().any(|k| k == key)
    }
}

/// Completes each group's template with what its registered nodes show (Cluster Autoscaler builds
/// templates from real nodes the same way): labels all of them share and their common taints,
/// less those new nodes will not have ([`TaintRules::is_not_on_new_nodes`]).
/// Pods select groups by such labels (node-group names, GFD labels) and tolerate the real taints.
pub fn learn_templates(
    groups: &[NodeGroup],
    snapshot: &ClusterSnapshot,
    taints: TaintRules,
) -> Vec<NodeGroup> {
    let mut learned = groups.to_vec();
    let index = GroupIndex::of(groups);
    let mut ready: Vec<Vec<&Node>> = vec![Vec::new(); groups.len()];
    for n in snapshot.nodes.iter().filter(|n| n.state == NodeState::Ready) {
        if let Some(gi) = index.group_of(n) {
            ready[gi].push(n);
        }
    }
    for (g, members) in learned.iter_mut().zip(ready) {
        let Some(first) = members.first() else { continue };
        for (k, v) in &first.labels {
            if NODE_SPECIFIC_LABELS.contains(&k.as_str()) || g.template.labels.contains_key(k) {
                continue;
            }
            if members.iter().all(|m| m.labels.get(k) == Some(v)) {
                g.template.labels.insert(k.clone(), v.clone());
            }
        }
        // The pod limit and other resources new nodes of the group will offer, where every
        // registered node agrees: real kubelets of the group say better than the catalog or the
        // config (Cluster Autoscaler too builds templates from a real node when it has one).
        if first.max_pods > 0 && members.iter().all(|m| m.max_pods == first.max_pods) {
            g.template.max_pods = first.max_pods;
        }
        for (k, v) in &first.extended_allocatable {
            if members.iter().all(|m| m.extended_allocatable.get(k) == Some(v)) {
                g.template.extended_allocatable.insert(k.clone(), *v);
            }
        }
        // What registered nodes publish through DRA ResourceSlices, where they agree on it.
        if !first.dra.devices.is_empty()
            && members.iter().all(|m| m.dra.devices.len() == first.dra.devices.len())
        {
            g.template.dra.devices = first.dra.devices.clone();
            g.template.dra.counters = first.dra.counters.clone();
            g.template.dra.claims.clear();
            if first.gpus.is_empty() {
                g.template.gpus.clear();
            }
        }
        g.template.taints = first
            .taints
            .iter()
            .filter(|t| !taints.is_not_on_new_nodes(&t.key))
            .filter(|t| members.iter().all(|m| m.taints.contains(t)))
            .cloned()
            .collect();
    }
    learned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Instance;
    use crate::model::{Taint, TaintEffect};
    use crate::planner::PlannerSettings;
    use crate::providers::config;
    use crate::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};

    /// One simulated g5.xlarge group in us-east-1a, `target` nodes big.
    fn gpu_group(target: u32) -> Vec<NodeGroup> {
        let yaml = format!(
            "accounts:\n  - name: t\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      \
             - {{name: gpu, instanceType: g5.xlarge, zones: [us-east-1a], minSize: 0, maxSize: 3, targetSize: {target}}}\n"
        );
        config::load_strs(&[("t.yaml", yaml.as_str())]).expect("valid config").node_groups()
    }

    /// The counts kept as nodes come and go pick the zone counting the members would: the
    /// emptiest, the first listed on ties, never a zone outside the group.
    #[test]
    fn zone_counts_follow_added_and_retired_nodes_as_a_count_of_members_does() {
        let yaml = "accounts:\n  - name: t\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      \
             - {name: gpu, instanceType: g5.xlarge, zones: [us-east-1a, us-east-1b, us-east-1c], minSize: 0, maxSize: 9, targetSize: 0}\n";
        let groups = config::load_strs(&[("t.yaml", yaml)]).expect("valid config").node_groups();
        let g = &groups[0];
        let in_zone = |name: &str, zone: &str| {
            let mut n = template_node(g, name.into(), NodeState::Ready);
            n.labels.insert(ZONE_LABEL.into(), zone.into());
            n
        };
        // One member in 1b, and a node of no group in 1a (it counts nowhere).
        let mut nodes = vec![in_zone("b-1", "us-east-1b"), in_zone("other", "us-east-1a")];
        let mut info = vec![
            NodeInfo { group: Some(0), origin: Origin::Ready, pods: Vec::new() },
            NodeInfo { group: None, origin: Origin::Ready, pods: Vec::new() },
        ];
        let mut counts = ZoneCounts::of(&groups, &nodes, &info);
        let counted = |nodes: &[Node], info: &[NodeInfo]| next_zone(g, members_of(nodes, info, 0));
        let mut picks = Vec::new();
        for k in 0..5 {
            let zone = counts.next(g, 0);
            assert_eq!(zone, counted(&nodes, &info), "pick {k}");
            picks.push(zone.unwrap().to_string());
            let node = next_node(g, format!("new-{k}"), NodeState::Upcoming, zone);
            counts.add(g, 0, &node);
            nodes.push(node);
            info.push(NodeInfo { group: Some(0), origin: Origin::New, pods: Vec::new() });
        }
        assert_eq!(picks, ["us-east-1a", "us-east-1c", "us-east-1a", "us-east-1b", "us-east-1c"]);
        // A retired node loses its labels and counts nowhere: its zone is the emptiest again.
        let last = nodes.len() - 1;
        counts.remove(g, 0, &nodes[last]);
        nodes[last].labels.clear();
        assert_eq!(counts.next(g, 0), Some("us-east-1c"));
        assert_eq!(counts.next(g, 0), counted(&nodes, &info));
    }

    /// The nodes and bookkeeping [`build`] makes with the taint rules of `settings`.
    fn built(
        snapshot: &ClusterSnapshot,
        groups: &[NodeGroup],
        settings: &PlannerSettings,
    ) -> (Vec<Node>, Vec<NodeInfo>) {
        let policy =
            PolicyKind::Gpuscale.build(&ClusterScale::of(&snapshot.nodes), &TargetWorkload::default());
        let (placer, info) =
            build(snapshot, groups, policy.as_ref(), 1, TaintRules::of(settings), &mut Vec::new());
        (placer.nodes().to_vec(), info)
    }

    #[test]
    fn the_group_index_finds_the_groups_group_of_finds() {
        let mut groups = gpu_group(1);
        let mut other = groups[0].clone();
        other.id = "t/other".into();
        let instance = |id: &str| Instance { id: id.into(), state: crate::model::InstanceState::Running };
        groups[0].instances = vec![instance("aws:///us-east-1a/i-1"), instance("aws:///us-east-1a/i-2")];
        // i-2 listed by both: the first group owns it.
        other.instances = vec![instance("aws:///us-east-1a/i-2"), instance("aws:///us-east-1a/i-3")];
        groups.push(other);
        let node = |pid: Option<&str>, label: Option<&str>, instance_type: Option<&str>| Node {
            provider_id: pid.map(String::from),
            node_group: label.map(String::from),
            instance_type: instance_type.map(String::from),
            ..Default::default()
        };
        let cases = [
            (node(Some("aws:///us-east-1a/i-1"), None, None), Some(0)),
            (node(Some("aws:///us-east-1a/i-2"), None, None), Some(0)),
            (node(Some("aws:///us-east-1a/i-3"), Some("gpu"), None), Some(1)),
            // Not an instance of any group: by label, then instance type.
            (node(Some("aws:///us-east-1a/i-9"), Some("other"), Some("g5.xlarge")), Some(1)),
            (node(None, Some("gpu"), Some("g5.xlarge")), Some(0)),
            (node(None, Some("gpu"), Some("p4d.24xlarge")), None),
            (node(None, None, None), None),
        ];
        let index = GroupIndex::of(&groups);
        for (n, want) in &cases {
            assert_eq!(group_of(n, &groups), *want, "{n:?}");
            assert_eq!(index.group_of(n), *want, "{n:?}");
        }
    }

    fn taint(key: &str) -> Taint {
        Taint { key: key.into(), value: String::new(), effect: TaintEffect::NoSchedule }
    }

    #[test]
    fn run_time_taints_are_never_learned_into_a_template_but_shared_ones_are() {
        let groups = gpu_group(2);
        let mut a = template_node(&groups[0], "a".into(), NodeState::Ready);
        let mut b = template_node(&groups[0], "b".into(), NodeState::Ready);
        for n in [&mut a, &mut b] {
            n.taints = vec![
                taint("node.kubernetes.io/not-ready"),
                taint("nvidia.com/gpu"),
                taint("gpuscale.io/disrupting"),
            ];
        }
        a.taints.push(taint("only-on-a"));
        let snapshot = ClusterSnapshot { nodes: vec![a, b], ..Default::default() };
        let learned = learn_templates(&groups, &snapshot, TaintRules::of(&PlannerSettings::default()));
        let keys: Vec<&str> = learned[0].template.taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, vec!["nvidia.com/gpu"]);
    }

    /// Cluster Autoscaler's `taints_test.go` (`TestSanitizeTaints`) cases: startup, ignore and
    /// status prefixes and configured keys are stripped from templates, other taints stay.
    #[test]
    fn configured_and_prefixed_startup_and_status_taints_are_never_learned() {
        let groups = gpu_group(1);
        let mut node = template_node(&groups[0], "a".into(), NodeState::Ready);
        node.taints = [
            "node.cilium.io/agent-not-ready",
            "example.com/maintenance",
            "startup-taint.cluster-autoscaler.kubernetes.io/disk-setup",
            "ignore-taint.cluster-autoscaler.kubernetes.io/legacy",
            "status-taint.cluster-autoscaler.kubernetes.io/gpu-health",
            "nvidia.com/gpu",
        ]
        .map(taint)
        .to_vec();
        let snapshot = ClusterSnapshot { nodes: vec![node], ..Default::default() };
        let learned_keys = |settings: &PlannerSettings| {
            let learned = learn_templates(&groups, &snapshot, TaintRules::of(settings));
            learned[0].template.taints.iter().map(|t| t.key.clone()).collect::<Vec<_>>()
        };
        assert_eq!(
            learned_keys(&PlannerSettings::default()),
            vec!["node.cilium.io/agent-not-ready", "example.com/maintenance", "nvidia.com/gpu"],
            "the prefixes count without configuration"
        );
        let configured = PlannerSettings {
            startup_taints: vec!["node.cilium.io/agent-not-ready".into()],
            ignored_taints: vec!["example.com/maintenance".into()],
            ..Default::default()
        };
        assert_eq!(learned_keys(&configured), vec!["nvidia.com/gpu"]);
    }

    /// A Ready node still carrying a startup taint (Karpenter's `startupTaints`: a daemon removes
    /// it once the node is set up) is planned without it, as capacity still on its way; a status
    /// taint stays, because kube-scheduler honours it on that node.
    #[test]
    fn a_ready_node_with_a_startup_taint_is_still_starting_and_planned_without_it() {
        let groups = gpu_group(2);
        let mut starting = template_node(&groups[0], "starting".into(), NodeState::Ready);
        starting.taints = vec![
            taint("node.cilium.io/agent-not-ready"),
            taint("status-taint.cluster-autoscaler.kubernetes.io/x"),
        ];
        let mut ready = template_node(&groups[0], "ready".into(), NodeState::Ready);
        ready.taints = vec![taint("node.cilium.io/agent-not-ready")];
        let snapshot = ClusterSnapshot { nodes: vec![starting, ready], ..Default::default() };
        let settings = PlannerSettings {
            startup_taints: vec!["node.cilium.io/agent-not-ready".into()],
            ..Default::default()
        };
        let (nodes, info) = built(&snapshot, &groups, &settings);
        let keys: Vec<&str> = nodes[0].taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, vec!["status-taint.cluster-autoscaler.kubernetes.io/x"]);
        assert_eq!((info[0].origin, info[1].origin), (Origin::Initializing, Origin::Initializing));
        let (nodes, info) = built(&snapshot, &groups, &PlannerSettings::default());
        assert_eq!(nodes[1].taints.len(), 1, "an unconfigured taint is the node's own");
        assert_eq!(info[1].origin, Origin::Ready);
    }

    #[test]
    fn a_registering_node_is_planned_without_its_not_ready_taint() {
        let groups = gpu_group(1);
        let mut booting = template_node(&groups[0], "booting".into(), NodeState::Initializing);
        let not_ready = Taint {
            key: "node.kubernetes.io/not-ready".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        };
        let own = Taint { key: "team".into(), value: "ml".into(), effect: TaintEffect::NoSchedule };
        booting.taints = vec![not_ready, own.clone()];
        let snapshot = ClusterSnapshot { nodes: vec![booting], ..Default::default() };
        let (nodes, _) = built(&snapshot, &groups, &PlannerSettings::default());
        assert_eq!(nodes[0].taints, vec![own], "the not-ready taint goes, the node's own stays");
    }

    #[test]
    fn a_node_known_only_by_its_provider_id_is_named_for_its_group() {
        let mut groups = gpu_group(1);
        let id = "aws:///us-east-1a/i-1";
        groups[0].instances.push(Instance { id: id.into(), state: InstanceState::Running });
        let mut managed = template_node(&groups[0], "managed".into(), NodeState::Ready);
        managed.node_group = None;
        managed.provider_id = Some(id.into());
        let unmanaged = Node { name: "static".into(), provider_id: None, ..managed.clone() };
        let snapshot = ClusterSnapshot { nodes: vec![managed, unmanaged], ..Default::default() };
        let (nodes, info) = built(&snapshot, &groups, &PlannerSettings::default());
        assert_eq!((info[0].group, info[1].group), (Some(0), None));
        assert_eq!(nodes[0].node_group.as_deref(), Some("gpu"));
        assert_eq!(nodes[1].node_group, None);
    }
}
