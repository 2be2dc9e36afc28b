//! The filters that look beyond one node: kube-scheduler's InterPodAffinity (required affinity,
//! required anti-affinity, and the anti-affinity of pods already running) and PodTopologySpread
//! (`DoNotSchedule`), with the semantics of `pkg/scheduler/framework/plugins/interpodaffinity`
//! and `podtopologyspread` (Kubernetes 1.35): counts per topology pair over every node, then a
//! verdict per node.

use super::fit::Unfit;
use crate::model::{LabelSelector, Node, NodeId, PodIdentity, SpreadConstraint, Workload};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;

type Pair<'a> = (&'a str, &'a str);

/// Which nodes run pods carrying each label (`key=value`), with how many: a selector with
/// `matchLabels` then counts the pods on those nodes instead of every pod in the cluster (a
/// service's replicas, not all 50,000 pods).
#[derive(Debug, Clone, Default)]
struct LabelIndex {
    /// Label key, then value, then the nodes running such pods with their count. Nested, so a
    /// lookup by `&str` allocates nothing and an update allocates only for a new key or value.
    by_label: FxHashMap<String, FxHashMap<String, BTreeMap<NodeId, u32>>>,
}

impl LabelIndex {
    /// Records a pod with `labels` on `node`.
    pub fn add(&mut self, node: NodeId, labels: &BTreeMap<String, String>) {
        for (k, v) in labels {
            self.add_pair(node, k, v);
        }
    }

    /// Forgets a pod with `labels` on `node`.
    pub fn remove(&mut self, node: NodeId, labels: &BTreeMap<String, String>) {
        for (k, v) in labels {
            self.remove_pair(node, k, v);
        }
    }

    fn add_pair(&mut self, node: NodeId, k: &str, v: &str) {
        if !self.by_label.contains_key(k) {
            self.by_label.insert(k.to_string(), FxHashMap::default());
        }
        let values = self.by_label.get_mut(k).expect("inserted above");
        if !values.contains_key(v) {
            values.insert(v.to_string(), BTreeMap::new());
        }
        *values.get_mut(v).expect("inserted above").entry(node).or_default() += 1;
    }

    fn remove_pair(&mut self, node: NodeId, k: &str, v: &str) {
        let Some(values) = self.by_label.get_mut(k) else { return };
        if let Some(nodes) = values.get_mut(v) {
            if let Some(c) = nodes.get_mut(&node) {
                *c -= 1;
                if *c == 0 {
                    nodes.remove(&node);
                }
            }
            if nodes.is_empty() {
                values.remove(v);
            }
        }
        if values.is_empty() {
            self.by_label.remove(k);
        }
    }

    /// The nodes running pods labelled `k=v`, with their count.
    fn nodes_with(&self, k: &str, v: &str) -> Option<&BTreeMap<NodeId, u32>> {
        self.by_label.get(k)?.get(v)
    }

    /// The nodes that can run pods `selector` selects, or `None` when it has no `matchLabels` to
    /// narrow them by (then every node can).
    fn nodes_for(&self, selector: &LabelSelector) -> Option<Vec<NodeId>> {
        let empty = BTreeMap::new();
        let narrowest = selector
            .match_labels
            .iter()
            .map(|(k, v)| self.nodes_with(k, v).unwrap_or(&empty))
            .min_by_key(|nodes| nodes.len())?;
        Some(narrowest.keys().copied().collect())
    }
}

/// Where the running pods with required anti-affinity are, keyed by what their terms select
/// (the narrowest `matchLabels` pair; terms without one are kept apart), so the symmetric check
/// of a pod visits only the nodes whose pods could repel it.
#[derive(Debug, Clone, Default)]
struct AntiIndex {
    keyed: LabelIndex,
    unkeyed: BTreeMap<NodeId, u32>,
}

impl AntiIndex {
    /// Records a pod's anti-affinity terms on `node`.
    pub fn add(&mut self, node: NodeId, pod: &PodIdentity) {
        for t in &pod.anti_affinity {
            match t.selector.match_labels.iter().next() {
                Some((k, v)) => self.keyed.add_pair(node, k, v),
                None => *self.unkeyed.entry(node).or_default() += 1,
            }
        }
    }

    /// Forgets a pod's anti-affinity terms on `node`.
    pub fn remove(&mut self, node: NodeId, pod: &PodIdentity) {
        for t in &pod.anti_affinity {
            match t.selector.match_labels.iter().next() {
                Some((k, v)) => self.keyed.remove_pair(node, k, v),
                None => {
                    if let Some(c) = self.unkeyed.get_mut(&node) {
                        *c -= 1;
                        if *c == 0 {
                            self.unkeyed.remove(&node);
                        }
                    }
                }
            }
        }
    }

    /// The nodes running pods whose anti-affinity might select a pod with `labels`.
    fn nodes_selecting(&self, labels: &BTreeMap<String, String>) -> BTreeSet<NodeId> {
        let mut nodes: BTreeSet<NodeId> = self.unkeyed.keys().copied().collect();
        if self.keyed.by_label.is_empty() {
            return nodes;
        }
        for (k, v) in labels {
            if let Some(on) = self.keyed.nodes_with(k, v) {
                nodes.extend(on.keys().copied());
            }
        }
        nodes
    }
}

/// The nodes per value of each node label (topology domains).
#[derive(Debug, Clone, Default)]
pub struct TopologyIndex {
    values: HashMap<String, BTreeMap<String, Vec<NodeId>>>,
}

impl TopologyIndex {
    fn add(&mut self, id: NodeId, node: &Node) {
        for (k, v) in &node.labels {
            self.values.entry(k.clone()).or_default().entry(v.clone()).or_default().push(id);
        }
    }

    fn remove(&mut self, id: NodeId, node: &Node) {
        for (k, v) in &node.labels {
            if let Some(values) = self.values.get_mut(k) {
                if let Some(ids) = values.get_mut(v) {
                    ids.retain(|&n| n != id);
                    if ids.is_empty() {
                        values.remove(v);
                    }
                }
            }
        }
    }

    /// The nodes whose label `key` is `value`.
    fn nodes_in(&self, key: &str, value: &str) -> &[NodeId] {
        self.values.get(key).and_then(|v| v.get(value)).map_or(&[], Vec::as_slice)
    }
}

/// What the cluster-wide filters look up instead of scanning every pod and node, kept by the
/// placer as pods and nodes come and go.
#[derive(Debug, Clone, Default)]
pub struct ClusterIndex {
    anti: AntiIndex,
    /// Built from the nodes' residents when a selector first asks, then kept up to date: most
    /// plans have no pod whose affinity or spread selects by labels, and indexing every label of
    /// 45,000 running pods was an eighth of a controller pass.
    labels: OnceLock<LabelIndex>,
    topology: TopologyIndex,
}

impl ClusterIndex {
    /// Whether pods placed so far constrain where `w` may go: its own required anti-affinity,
    /// or running pods' anti-affinity that may select it.
    pub fn constrains(&self, w: &Workload) -> bool {
        !w.pod_anti_affinity().is_empty()
            || w.identity.as_ref().is_some_and(|me| !self.anti.nodes_selecting(&me.labels).is_empty())
    }

    /// The index of `nodes` and the pods on them.
    pub fn of(nodes: &[Node]) -> Self {
        let mut index = Self::default();
        for (n, node) in nodes.iter().enumerate() {
            index.add_node(n, node);
        }
        index
    }

    /// Records a node and the pods on it.
    pub fn add_node(&mut self, id: NodeId, node: &Node) {
        self.topology.add(id, node);
        for r in &node.residents {
            self.add_pod(id, r);
        }
    }

    /// Forgets a node's labels (its pods are released one by one).
    pub fn remove_node_labels(&mut self, id: NodeId, node: &Node) {
        self.topology.remove(id, node);
    }

    /// Records a pod on `node` (whose residents it has joined).
    pub fn add_pod(&mut self, node: NodeId, pod: &PodIdentity) {
        if let Some(labels) = self.labels.get_mut() {
            labels.add(node, &pod.labels);
        }
        self.anti.add(node, pod);
    }

    /// Forgets a pod on `node`.
    pub fn remove_pod(&mut self, node: NodeId, pod: &PodIdentity) {
        if let Some(labels) = self.labels.get_mut() {
            labels.remove(node, &pod.labels);
        }
        self.anti.remove(node, pod);
    }

    /// The pods' labels on `nodes` (those this index was built of and told about since).
    fn labels(&self, nodes: &[Node]) -> &LabelIndex {
        self.labels.get_or_init(|| {
            let mut index = LabelIndex::default();
            for (id, node) in nodes.iter().enumerate() {
                for r in &node.residents {
                    index.add(id, &r.labels);
                }
            }
            index
        })
    }
}

/// The verdict on `extra`, a node not yet in `nodes` (an empty one a scale-up would add), as if
/// it were.
pub fn verdict_on_added(
    nodes: &[Node],
    extra: &Node,
    w: &Workload,
    index: &ClusterIndex,
) -> Result<(), Unfit> {
    judge(nodes, Some(extra), w, index).map_or(Ok(()), |j| j.on(nodes.len(), extra))
}

/// The pods a `ScheduleAnyway` constraint counts in the domain `value` of its key (what
/// PodTopologySpread's score minimises).
pub fn pods_in_domain(
    nodes: &[Node],
    index: &ClusterIndex,
    w: &Workload,
    c: &SpreadConstraint,
    value: &str,
) -> u32 {
    let ns = w.identity.as_deref().map_or("", |me| me.namespace.as_str());
    index
        .topology
        .nodes_in(&c.topology_key, value)
        .iter()
        .filter_map(|&n| nodes.get(n))
        .map(|n| counted_by(n, ns, c))
        .sum()
}

/// The pods on `node` that spread constraint `c` of a pod in namespace `ns` counts.
fn counted_by(node: &Node, ns: &str, c: &SpreadConstraint) -> u32 {
    node.residents.iter().filter(|r| r.namespace == ns && c.selector.matches(&r.labels)).count() as u32
}

/// Whether a node carries every topology key of the pod's spread constraints (else it is no
/// spread domain and cannot take the pod).
fn has_spread_keys(w: &Workload, n: &Node) -> bool {
    w.spread.iter().all(|c| n.labels.contains_key(&c.topology_key))
}

/// Adds, per topology pair, the pods on `nodes` each term selects (on the nodes `on` lists).
fn count_selected<'a>(
    nodes: &'a [Node],
    terms: &'a [crate::model::PodAffinityTerm],
    on: &dyn Fn(&LabelSelector) -> Vec<NodeId>,
    into: &mut BTreeMap<Pair<'a>, u32>,
) {
    for t in terms {
        for node in on(&t.selector).into_iter().filter_map(|n| nodes.get(n)) {
            let Some(v) = node.labels.get(&t.topology_key) else { continue };
            let selected = node.residents.iter().filter(|r| t.selects(&r.namespace, &r.labels)).count();
            if selected > 0 {
                *into.entry((t.topology_key.as_str(), v.as_str())).or_default() += selected as u32;
            }
        }
    }
}

/// Counts over `nodes` and `extra` (an empty node, not yet in `nodes`), or `None` when nothing
/// constrains `w`.
pub fn judge<'a>(
    nodes: &'a [Node],
    extra: Option<&'a Node>,
    w: &'a Workload,
    index: &'a ClusterIndex,
) -> Option<Judgement<'a>> {
    let own_terms = !w.pod_affinity.is_empty() || !w.pod_anti_affinity().is_empty();
    static NOBODY: PodIdentity =
        PodIdentity { namespace: String::new(), labels: BTreeMap::new(), anti_affinity: Vec::new() };
    let me: &'a PodIdentity = w.identity.as_deref().unwrap_or(&NOBODY);
    let ns = me.namespace.as_str();
    let repellers = index.anti.nodes_selecting(&me.labels);
    if !own_terms && w.spread.is_empty() && repellers.is_empty() {
        return None;
    }
    let all = || nodes.iter().chain(extra);

    // Counts per topology pair, as the plugins' PreFilter computes them.
    let mut affinity: BTreeMap<Pair, u32> = BTreeMap::new();
    let mut anti: BTreeMap<Pair, u32> = BTreeMap::new();
    let mut existing_anti: BTreeMap<Pair, u32> = BTreeMap::new();
    // A fresh `extra` node runs no pods: the pods counted are those on `nodes`, narrowed by the
    // index to the nodes that run pods with the selector's labels.
    let on_nodes = |selector: &LabelSelector| -> Vec<NodeId> {
        index.labels(nodes).nodes_for(selector).unwrap_or_else(|| (0..nodes.len()).collect())
    };
    count_selected(nodes, &w.pod_affinity, &on_nodes, &mut affinity);
    count_selected(nodes, w.pod_anti_affinity(), &on_nodes, &mut anti);
    // The symmetric check: running pods whose anti-affinity selects this one.
    for node in repellers.iter().filter_map(|&n| nodes.get(n)) {
        for r in node.residents.iter().filter(|r| !r.anti_affinity.is_empty()) {
            for t in &r.anti_affinity {
                if let Some(v) = node.labels.get(&t.topology_key) {
                    if t.selects(ns, &me.labels) {
                        *existing_anti.entry((t.topology_key.as_str(), v.as_str())).or_default() += 1;
                    }
                }
            }
        }
    }
    if !own_terms && w.spread.is_empty() && existing_anti.is_empty() {
        return None;
    }
    // The nodes in the domains of those running pods, looked up once rather than per node.
    let repelled: BTreeSet<NodeId> =
        existing_anti.keys().flat_map(|(k, v)| index.topology.nodes_in(k, v)).copied().collect();
    let anti_keys: BTreeSet<&str> = existing_anti.keys().map(|(k, _)| *k).collect();
    // The first pod of a group with affinity to itself may go anywhere its topology exists.
    let self_affine = affinity.is_empty() && w.pod_affinity.iter().all(|t| t.selects(ns, &me.labels));

    // Spread: domains are the nodes the pod's node affinity (and, when honoured, taints) admit
    // that carry every constraint's key.
    let mut spread_counts: Vec<BTreeMap<&str, u32>> = vec![BTreeMap::new(); w.spread.len()];
    let is_domain = |c: &crate::model::SpreadConstraint, n: &Node| {
        has_spread_keys(w, n)
            && (!c.honor_node_affinity || w.allowed_by_node_affinity(n))
            && (!c.honor_node_taints || w.tolerates_taints_of(n))
    };
    // Without node affinity or taints to honour, the domains are every value of the key.
    let every_node_counts = |c: &crate::model::SpreadConstraint| {
        w.spread.len() == 1
            && !c.honor_node_taints
            && (!c.honor_node_affinity || (w.node_selector.is_empty() && w.affinity_terms.is_empty()))
    };
    for (ci, c) in w.spread.iter().enumerate() {
        // Every domain counts, with or without matching pods (the minimum may be 0) ...
        if every_node_counts(c) {
            let values = index.topology.values.get(&c.topology_key).into_iter().flat_map(|v| v.keys());
            for v in values.chain(extra.and_then(|n| n.labels.get(&c.topology_key))) {
                spread_counts[ci].entry(v.as_str()).or_default();
            }
        } else {
            for node in all().filter(|n| is_domain(c, n)) {
                spread_counts[ci].entry(node.labels[&c.topology_key].as_str()).or_default();
            }
        }
        // ... and the matching pods on the nodes that may run them.
        for node in on_nodes(&c.selector).into_iter().filter_map(|n| nodes.get(n)) {
            if !is_domain(c, node) {
                continue;
            }
            let matching = counted_by(node, ns, c);
            if matching > 0 {
                *spread_counts[ci].entry(node.labels[&c.topology_key].as_str()).or_default() += matching;
            }
        }
    }
    let min_match: Vec<u32> = w
        .spread
        .iter()
        .zip(&spread_counts)
        .map(|(c, counts)| {
            if (counts.len() as u32) < c.min_domains {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            }
        })
        .collect();
    // One constraint (the usual case): the nodes where the pod keeps the skew, found from the
    // domains rather than by reading each node's labels.
    let spread_fits = match w.spread.as_slice() {
        [c] => {
            let me_too = u32::from(c.selector.matches(&me.labels));
            let mut fits = vec![false; nodes.len()];
            for (v, &here) in &spread_counts[0] {
                if (here + me_too).saturating_sub(min_match[0]) <= c.max_skew {
                    for &n in index.topology.nodes_in(&c.topology_key, v) {
                        fits[n] = true;
                    }
                }
            }
            Some(fits)
        }
        _ => None,
    };

    Some(Judgement {
        w,
        spread_fits,
        known: nodes.len(),
        repelled,
        labels: &me.labels,
        affinity,
        anti,
        existing_anti,
        anti_keys,
        self_affine,
        spread_counts,
        min_match,
    })
}

/// The counts of one pod's cluster-wide filters (PreFilter), judging any node on demand, so a
/// scan that stops early (adaptive sampling) judges only the nodes it visits.
pub struct Judgement<'a> {
    w: &'a Workload,
    /// Nodes with ids below this are in the index; others (a node a scale-up would add) are
    /// judged by their labels.
    known: usize,
    repelled: BTreeSet<NodeId>,
    /// With one spread constraint, whether each known node keeps its skew.
    spread_fits: Option<Vec<bool>>,
    labels: &'a BTreeMap<String, String>,
    affinity: BTreeMap<Pair<'a>, u32>,
    anti: BTreeMap<Pair<'a>, u32>,
    existing_anti: BTreeMap<Pair<'a>, u32>,
    anti_keys: BTreeSet<&'a str>,
    self_affine: bool,
    spread_counts: Vec<BTreeMap<&'a str, u32>>,
    min_match: Vec<u32>,
}

impl Judgement<'_> {
    /// The verdict on node `id` (the counts already hold its pods).
    pub fn on(&self, id: NodeId, node: &Node) -> Result<(), Unfit> {
        // Required affinity: every term's topology on the node, and a selected pod in each of its
        // domains (or the self-affinity exception).
        if !self.w.pod_affinity.is_empty() {
            let mut pods_exist = true;
            for t in &self.w.pod_affinity {
                let Some(v) = node.labels.get(&t.topology_key) else { return Err(Unfit::PodAffinity) };
                if self.affinity.get(&(t.topology_key.as_str(), v.as_str())).copied().unwrap_or(0) == 0 {
                    pods_exist = false;
                }
            }
            if !pods_exist && !self.self_affine {
                return Err(Unfit::PodAffinity);
            }
        }
        for t in self.w.pod_anti_affinity() {
            if let Some(v) = node.labels.get(&t.topology_key) {
                if self.anti.get(&(t.topology_key.as_str(), v.as_str())).copied().unwrap_or(0) > 0 {
                    return Err(Unfit::PodAntiAffinity);
                }
            }
        }
        let repelled = if id < self.known {
            self.repelled.contains(&id)
        } else {
            self.anti_keys.iter().any(|&k| {
                node.labels
                    .get(k)
                    .is_some_and(|v| self.existing_anti.get(&(k, v.as_str())).is_some_and(|&c| c > 0))
            })
        };
        if repelled {
            return Err(Unfit::ExistingAntiAffinity);
        }
        if let Some(fits) = self.spread_fits.as_ref().filter(|_| id < self.known) {
            return if fits[id] { Ok(()) } else { Err(Unfit::TopologySpread) };
        }
        if !self.w.spread.is_empty() {
            if !has_spread_keys(self.w, node) {
                return Err(Unfit::TopologySpread);
            }
            for (ci, c) in self.w.spread.iter().enumerate() {
                let v = node.labels[&c.topology_key].as_str();
                let here = self.spread_counts[ci].get(v).copied().unwrap_or(0);
                let me_too = u32::from(c.selector.matches(self.labels));
                if (here + me_too).saturating_sub(self.min_match[ci]) > c.max_skew {
                    return Err(Unfit::TopologySpread);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceAssignment, LabelSelector, PodAffinityTerm, SpreadConstraint};
    use std::sync::Arc;

    /// The verdict on every node, as a placer's scan would judge each; `None` when nothing
    /// constrains `w`.
    fn verdicts(nodes: &[Node], w: &Workload, index: &ClusterIndex) -> Option<Vec<Result<(), Unfit>>> {
        judge(nodes, None, w, index).map(|j| nodes.iter().enumerate().map(|(id, n)| j.on(id, n)).collect())
    }

    /// The verdicts with the index a placer would keep.
    fn judged(nodes: &[Node], w: &Workload) -> Option<Vec<Result<(), Unfit>>> {
        verdicts(nodes, w, &ClusterIndex::of(nodes))
    }

    fn node(name: &str, zone: &str) -> Node {
        Node {
            name: name.into(),
            labels: [("kubernetes.io/hostname", name), ("zone", zone)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn pod(ns: &str, app: &str) -> Workload {
        let labels: BTreeMap<String, String> = [("app".to_string(), app.to_string())].into();
        Workload {
            labels: labels.clone(),
            identity: Some(Arc::new(PodIdentity { namespace: ns.into(), labels, anti_affinity: vec![] })),
            ..Default::default()
        }
    }

    fn term(app: &str, key: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            selector: LabelSelector {
                match_labels: [("app".to_string(), app.to_string())].into(),
                ..Default::default()
            },
            namespaces: vec!["ns".into()],
            topology_key: key.into(),
        }
    }

    fn with_anti(mut w: Workload, t: PodAffinityTerm) -> Workload {
        let mut id = (**w.identity.as_ref().unwrap()).clone();
        id.anti_affinity.push(t);
        w.identity = Some(Arc::new(id));
        w
    }

    /// `TestRequiredAffinitySingleNode`-style cases of interpodaffinity's filtering_test.go.
    #[test]
    fn anti_affinity_affinity_and_the_symmetric_check() {
        let mut nodes = vec![node("a", "z1"), node("b", "z1"), node("c", "z2")];
        nodes[0].allocate_pod(&pod("ns", "db"), &DeviceAssignment::None);
        // Anti-affinity to db by hostname: not on a; by zone: not on a or b.
        let by_host = with_anti(pod("ns", "web"), term("db", "kubernetes.io/hostname"));
        let v = judged(&nodes, &by_host).unwrap();
        assert_eq!(v, vec![Err(Unfit::PodAntiAffinity), Ok(()), Ok(())]);
        let by_zone = with_anti(pod("ns", "web"), term("db", "zone"));
        assert_eq!(
            judged(&nodes, &by_zone).unwrap(),
            vec![Err(Unfit::PodAntiAffinity), Err(Unfit::PodAntiAffinity), Ok(())]
        );
        // Another namespace's db does not count.
        let other_ns = with_anti(
            pod("other", "web"),
            PodAffinityTerm { namespaces: vec!["other".into()], ..term("db", "zone") },
        );
        assert_eq!(judged(&nodes, &other_ns).unwrap(), vec![Ok(()), Ok(()), Ok(())]);
        // Affinity to db by zone: z1 only.
        let mut near = pod("ns", "web");
        near.pod_affinity.push(term("db", "zone"));
        assert_eq!(judged(&nodes, &near).unwrap(), vec![Ok(()), Ok(()), Err(Unfit::PodAffinity)]);
        // The symmetric check: a running pod that repels web by zone keeps web out of z1.
        let repeller = with_anti(pod("ns", "cache"), term("web", "zone"));
        nodes[1].allocate_pod(&repeller, &DeviceAssignment::None);
        assert_eq!(
            ClusterIndex::of(&nodes).anti.nodes_selecting(&pod("ns", "web").labels),
            BTreeSet::from([1])
        );
        assert!(
            judged(&nodes, &pod("ns", "other")).is_none(),
            "holders that do not select the pod leave nothing to check"
        );
        assert_eq!(
            judged(&nodes, &pod("ns", "web")).unwrap(),
            vec![Err(Unfit::ExistingAntiAffinity), Err(Unfit::ExistingAntiAffinity), Ok(())]
        );
        assert!(
            verdicts(&nodes, &pod("ns", "web"), &ClusterIndex::default(),).is_none(),
            "nothing to check without holders or terms"
        );
    }

    /// The self-affinity exception (filtering.go `satisfyPodAffinity`): the first pod of a group
    /// that is affine to itself may go wherever the topology exists.
    #[test]
    fn the_first_pod_of_a_self_affine_group_is_placed() {
        let mut nodes = vec![node("a", "z1"), node("b", "z2")];
        nodes[1].labels.remove("zone");
        let mut first = pod("ns", "web");
        first.pod_affinity.push(term("web", "zone"));
        assert_eq!(judged(&nodes, &first).unwrap(), vec![Ok(()), Err(Unfit::PodAffinity)]);
        let mut stranger = pod("ns", "api");
        stranger.pod_affinity.push(term("web", "zone"));
        assert_eq!(
            judged(&nodes, &stranger).unwrap(),
            vec![Err(Unfit::PodAffinity), Err(Unfit::PodAffinity)]
        );
    }

    fn spread(max_skew: u32, min_domains: u32) -> SpreadConstraint {
        SpreadConstraint {
            max_skew,
            topology_key: "zone".into(),
            selector: LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            },
            min_domains,
            honor_node_affinity: true,
            honor_node_taints: false,
        }
    }

    /// podtopologyspread's filtering_test.go: skew against the emptiest domain, minDomains
    /// treating missing domains as empty, nodes without the key refused.
    #[test]
    fn spread_skew_min_domains_and_missing_keys() {
        let mut nodes = vec![node("a", "z1"), node("b", "z1"), node("c", "z2"), node("d", "")];
        nodes[3].labels.remove("zone");
        for n in [0, 1] {
            nodes[n].allocate_pod(&pod("ns", "web"), &DeviceAssignment::None);
        }
        nodes[2].allocate_pod(&pod("ns", "web"), &DeviceAssignment::None);
        // z1 has 2, z2 has 1: z1 would be 3 - 1 = 2 > 1; z2 2 - 1 = 1.
        let mut w = pod("ns", "web");
        w.spread.push(spread(1, 1));
        assert_eq!(
            judged(&nodes, &w).unwrap(),
            vec![Err(Unfit::TopologySpread), Err(Unfit::TopologySpread), Ok(()), Err(Unfit::TopologySpread)]
        );
        // minDomains 3 with two domains: the minimum counts as 0, so z2 (1 + 1 - 0 = 2) fails too.
        w.spread[0] = spread(1, 3);
        assert!(judged(&nodes, &w).unwrap().iter().all(|v| v.is_err()));
        // Pods of other namespaces are not counted.
        let mut elsewhere = pod("other", "web");
        elsewhere.spread.push(spread(1, 1));
        assert_eq!(judged(&nodes, &elsewhere).unwrap()[0], Ok(()));
    }

    /// The label index is built when a selector first asks: pods committed and released before
    /// then are read from the nodes' residents, those after it are recorded as they come, and
    /// either way the index names the nodes an eager index would.
    #[test]
    fn the_label_index_built_late_follows_commits_and_releases_before_and_after() {
        let web = LabelSelector {
            match_labels: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        };
        let mut nodes = vec![node("a", "z1"), node("b", "z1"), node("c", "z2")];
        let (on_a, on_b, on_c) = (pod("ns", "web"), pod("ns", "web"), pod("ns", "web"));
        nodes[0].allocate_pod(&on_a, &DeviceAssignment::None);
        let mut index = ClusterIndex::of(&nodes);
        assert!(index.labels.get().is_none(), "not built before a selector asks");
        // Before the build: b gains a pod, a loses its own.
        nodes[1].allocate_pod(&on_b, &DeviceAssignment::None);
        index.add_pod(1, on_b.identity.as_ref().unwrap());
        nodes[0].release_pod(&on_a, &DeviceAssignment::None);
        index.remove_pod(0, on_a.identity.as_ref().unwrap());
        assert_eq!(index.labels(&nodes).nodes_for(&web), Some(vec![1]));
        // After it: c gains one, b loses its own.
        nodes[2].allocate_pod(&on_c, &DeviceAssignment::None);
        index.add_pod(2, on_c.identity.as_ref().unwrap());
        nodes[1].release_pod(&on_b, &DeviceAssignment::None);
        index.remove_pod(1, on_b.identity.as_ref().unwrap());
        assert_eq!(index.labels(&nodes).nodes_for(&web), Some(vec![2]));
        assert_eq!(ClusterIndex::of(&nodes).labels(&nodes).nodes_for(&web), Some(vec![2]));
    }
}
