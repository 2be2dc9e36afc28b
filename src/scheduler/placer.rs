//! The placement loop over a cluster, with per-node score caching.
//!
//! A policy's score depends only on the node and the workload's shape, and placing a workload
//! changes one node. The placer therefore keeps a score per (shape, node) and invalidates a node's
//! column when it changes: a stream of workloads costs one pass over the cached scores plus one
//! evaluation per changed node, instead of scoring every node for every workload.

use super::fit::Unfit;
use super::policy::{Policy, TieBreak};
use crate::model::dra::ClaimHold;
use crate::model::{
    DeviceAssignment, GpuDemand, Node, NodeId, NodeSelectorRequirement, Resources, Toleration, Workload,
    HOSTNAME_LABEL,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

/// Where a workload was placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node.
    pub node: NodeId,
    /// The devices it holds there.
    pub devices: DeviceAssignment,
}

/// What makes two workloads interchangeable for placement (pod affinity and spread aside: they
/// depend on the pods already placed, and callers that key on shapes leave such pods out).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ShapeKey {
    requests: Resources,
    gpu: GpuDemand,
    gpu_models: Vec<String>,
    node_selector: BTreeMap<String, String>,
    affinity_terms: Vec<Vec<NodeSelectorRequirement>>,
    tolerations: Vec<Toleration>,
    extended: BTreeMap<String, u64>,
    host_ports: Vec<crate::model::HostPort>,
    volumes: Vec<crate::model::VolumeNeed>,
    dra_claims: Vec<crate::model::dra::DraClaim>,
}

impl ShapeKey {
    pub(crate) fn of(w: &Workload) -> Self {
        Self {
            requests: w.requests,
            gpu: w.gpu.clone(),
            gpu_models: w.gpu_models.clone(),
            node_selector: w.node_selector.clone(),
            affinity_terms: w.affinity_terms.clone(),
            tolerations: w.tolerations.clone(),
            extended: w.extended.clone(),
            host_ports: w.host_ports.clone(),
            volumes: w.volumes.clone(),
            dra_claims: w.dra_claims.clone(),
        }
    }
}

/// The nodes a scan walks.
#[derive(Debug, Clone, Copy)]
enum Span {
    /// Every node, from where the last sampled scan stopped.
    Cluster,
    /// The nodes from this one on (those a plan added), or every node when it is the first.
    From(NodeId),
    /// This node alone.
    Only(NodeId),
}

/// Cached verdict for one (shape, node).
#[derive(Debug, Clone, Copy)]
enum Cached {
    Unknown,
    Unfit(Unfit),
    Score(f64),
}

/// Beyond this many cached entries the placer stops caching new shapes (memory bound).
const MAX_CACHE_ENTRIES: usize = 4 << 20;

/// Places workloads on a set of nodes with one policy.
pub struct Placer<'p> {
    nodes: Vec<Node>,
    policy: &'p dyn Policy,
    shapes: rustc_hash::FxHashMap<ShapeKey, usize>,
    /// `scores[shape][node]`.
    scores: Vec<Vec<Cached>>,
    /// `open[shape]`: the nodes not known to refuse the shape (no cached `Unfit`, no failed
    /// class check), which a scan walks instead of every node: in a full cluster most nodes
    /// refuse most shapes, and a pod's scan would otherwise step over all of them to find its
    /// sample of feasible nodes.
    open: Vec<NodeSet>,
    /// Nodes whose state changed, in order of change: a shape's column and open set are
    /// brought up to date with what happened since it was last walked ([`Placer::sync`]), not on
    /// every change (thousands of commits and added nodes, hundreds of shapes, most never walked
    /// again).
    changes: Vec<NodeId>,
    /// `synced[shape]`: how much of `changes` (and of the nodes) the shape's column reflects.
    synced: Vec<(usize, usize)>,
    /// Whether scans walk the open nodes only (off in tests, to compare with the full walk).
    skip_refusing: bool,
    /// Position of each node in a seeded random order, for [`TieBreak::NodeOrder`].
    rank: Vec<u32>,
    rng: ChaCha8Rng,
    /// Stop scanning after this many feasible nodes (kube-scheduler's percentageOfNodesToScore);
    /// `None` scores every node.
    feasible_limit: Option<usize>,
    /// Where the next scan starts, so that sampling rotates over all nodes.
    next_start: usize,
    /// Static class of each node (labels, taints, capacity, GPU kind): nodes of one class accept
    /// the same workload shapes when empty.
    class_of: Vec<u32>,
    /// A representative node per class.
    class_reps: Vec<NodeId>,
    class_keys: HashMap<u64, u32>,
    /// `static_fit[shape][class]`: whether the shape fits an empty node of the class at all.
    static_fit: Vec<Vec<Option<bool>>>,
    /// Pods by label and by what their anti-affinity selects, nodes by topology domain: what the
    /// cluster-wide filters look up.
    index: super::interpod::ClusterIndex,
    /// The node each DRA claim is allocated on (the snapshot's and the plan's): every pod
    /// sharing a claim goes where the claim's devices are.
    claim_nodes: HashMap<String, NodeId>,
    /// Shapes that found no node since room was last freed or added: placing pods only takes
    /// room, so later pods of the shape find none either (kube-scheduler retries such pods only
    /// on cluster events for the same reason). Keyed with the pod's identity when anti-affinity
    /// (its own or running pods') had a say, else with `None`: then no pod of the shape fits.
    no_room: rustc_hash::FxHashMap<(usize, Option<std::sync::Arc<crate::model::PodIdentity>>), Unfit>,
}

/// Whether a workload's node selector or required node affinity names a host (the label or the
/// node's name): then nodes of one class differ for it.
fn names_a_host(w: &Workload) -> bool {
    w.node_selector.contains_key(HOSTNAME_LABEL)
        || w.affinity_terms.iter().flatten().any(|r| r.key == HOSTNAME_LABEL)
        || w.volumes.iter().any(crate::model::VolumeNeed::names_a_host)
        || w.dra_claims.iter().any(|c| c.allocated_on.is_some())
}

/// Whether a shape can run on an empty node of the class (computed once per pair). A free
/// function over the fields it needs, so a scan can hold the nodes borrowed meanwhile.
fn statically_fits(
    static_fit: &mut [Vec<Option<bool>>],
    nodes: &[Node],
    class_reps: &[NodeId],
    (shape, class): (usize, u32),
    workload: &Workload,
) -> bool {
    if let Some(v) = static_fit[shape][class as usize] {
        return v;
    }
    let rep = emptied(&nodes[class_reps[class as usize]]);
    let v = super::fit::candidates(&rep, workload).is_ok();
    static_fit[shape][class as usize] = Some(v);
    v
}

/// Hash of what decides whether a shape can ever run on a node.
fn static_key(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // Every node has its own hostname label; with it, no two nodes would share a class. Pods
    // that select by hostname skip the class check ([`names_a_host`]).
    node.labels.iter().filter(|(k, _)| k.as_str() != HOSTNAME_LABEL).for_each(|kv| kv.hash(&mut h));
    node.taints.hash(&mut h);
    node.allocatable.hash(&mut h);
    node.gpu_model.hash(&mut h);
    node.unschedulable.hash(&mut h);
    node.state.hash(&mut h);
    node.max_pods.hash(&mut h);
    node.extended_allocatable.hash(&mut h);
    // DRA devices are part of what a node can ever offer (attributes, capacity, counters).
    node.dra.devices.hash(&mut h);
    node.dra.counters.hash(&mut h);
    for d in &node.gpus {
        d.memory_mib.hash(&mut h);
        match &d.mode {
            crate::model::GpuMode::Standard => 0u8.hash(&mut h),
            crate::model::GpuMode::TimeSliced { replicas } => (1u8, *replicas).hash(&mut h),
            crate::model::GpuMode::Mig { instances, dynamic } => {
                2u8.hash(&mut h);
                dynamic.hash(&mut h);
                for i in instances {
                    i.placement.hash(&mut h);
                }
            }
        }
    }
    h.finish()
}

/// The node as it is when nothing runs on it.
fn emptied(node: &Node) -> Node {
    let mut n = node.clone();
    n.allocated = Resources::default();
    n.pod_count = 0;
    n.extended_allocated.clear();
    n.host_ports.clear();
    n.residents.clear();
    n.dra.claims.clear();
    for d in &mut n.gpus {
        d.used_milli = 0;
        d.used_memory_mib = 0;
        d.used_replicas = 0;
        if let crate::model::GpuMode::Mig { instances, dynamic } = &mut d.mode {
            if *dynamic {
                instances.clear();
            }
            instances.iter_mut().for_each(|i| i.used = false);
        }
    }
    n
}

impl<'p> Placer<'p> {
    /// A placer over `nodes` (with whatever is already allocated on them). `seed` drives the
    /// choice among equally scored nodes: a random node order, or uniform draws.
    pub fn new(nodes: Vec<Node>, policy: &'p dyn Policy, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.shuffle(&mut rng);
        let mut rank = vec![0u32; nodes.len()];
        for (position, &node) in order.iter().enumerate() {
            rank[node] = position as u32;
        }
        let mut placer = Self {
            nodes: Vec::new(),
            policy,
            shapes: Default::default(),
            scores: Vec::new(),
            open: Vec::new(),
            changes: Vec::new(),
            synced: Vec::new(),
            skip_refusing: true,
            rank,
            rng,
            feasible_limit: None,
            next_start: 0,
            class_of: Vec::new(),
            class_reps: Vec::new(),
            class_keys: HashMap::new(),
            static_fit: Vec::new(),
            index: Default::default(),
            claim_nodes: HashMap::new(),
            no_room: Default::default(),
        };
        for node in nodes {
            placer.push_node(node);
        }
        placer
    }

    fn push_node(&mut self, node: Node) -> NodeId {
        let key = static_key(&node);
        let id = self.nodes.len();
        self.index.add_node(id, &node);
        let next = self.class_reps.len() as u32;
        let class = *self.class_keys.entry(key).or_insert(next);
        if class == next {
            self.class_reps.push(id);
            for row in &mut self.static_fit {
                row.push(None);
            }
        }
        self.class_of.push(class);
        for key in node.dra.claims.keys() {
            self.claim_nodes.insert(key.clone(), id);
        }
        self.nodes.push(node);
        id
    }

    /// Scores only part of a large cluster per workload, as kube-scheduler does: the scan stops
    /// after `max(100, n × (50 − n/125)%, 5% of n)` feasible nodes and the next scan starts where
    /// this one stopped. Small clusters are still scored in full.
    pub fn with_adaptive_sampling(mut self) -> Self {
        let n = self.nodes.len();
        let pct = (50.0 - n as f64 / 125.0).max(5.0);
        let limit = ((n as f64 * pct / 100.0) as usize).max(100);
        self.feasible_limit = (limit < n).then_some(limit);
        self
    }

    /// The nodes, with the placements made so far.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Gives the nodes back.
    pub fn into_nodes(self) -> Vec<Node> {
        self.nodes
    }

    fn shape_index(&mut self, w: &Workload) -> Option<usize> {
        let key = ShapeKey::of(w);
        if let Some(&i) = self.shapes.get(&key) {
            self.sync(i);
            return Some(i);
        }
        if (self.scores.len() + 1) * self.nodes.len() > MAX_CACHE_ENTRIES {
            return None;
        }
        self.scores.push(vec![Cached::Unknown; self.nodes.len()]);
        self.open.push(NodeSet::full(self.nodes.len()));
        self.synced.push((self.changes.len(), self.nodes.len()));
        self.static_fit.push(vec![None; self.class_reps.len()]);
        self.shapes.insert(key, self.scores.len() - 1);
        Some(self.scores.len() - 1)
    }

    /// Brings shape `s`'s column and open set up to date: nodes added since are unknown and
    /// open, nodes changed since are unknown and open again.
    fn sync(&mut self, s: usize) {
        let (seen, known) = self.synced[s];
        let n = self.nodes.len();
        if seen == self.changes.len() && known == n {
            return;
        }
        let (column, open) = (&mut self.scores[s], &mut self.open[s]);
        column.resize(n, Cached::Unknown);
        for _ in known..n {
            open.push(true);
        }
        for &node in &self.changes[seen..] {
            column[node] = Cached::Unknown;
            open.insert(node);
        }
        self.synced[s] = (self.changes.len(), n);
    }

    /// Adds a node (e.g. one a scale-up would create) and returns its id.
    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.no_room.clear();
        self.rank.push(self.rank.len() as u32);
        self.push_node(node)
    }

    /// Takes a node out of consideration for good (one a scale-up opened and did not use): no
    /// pod is placed on it and, its labels gone, it is no topology domain of spread or affinity.
    pub fn retire(&mut self, id: NodeId) {
        self.index.remove_node_labels(id, &self.nodes[id]);
        let node = &mut self.nodes[id];
        node.state = crate::model::NodeState::Deleting;
        node.labels.clear();
        self.invalidate(id);
    }

    /// Whether `workload` could run on `node` were it added empty (a node a scale-up would
    /// create): the per-node filters, and the cluster-wide ones against the pods placed so far.
    pub fn fits_added(&self, node: &Node, workload: &Workload) -> Result<(), Unfit> {
        super::fit::candidates(node, workload)?;
        super::interpod::verdict_on_added(&self.nodes, node, workload, &self.index)
    }

    /// Finds the best node for `workload` without placing it. On failure, returns the most
    /// common reason among nodes (for reporting).
    pub fn find(&mut self, workload: &Workload) -> Result<Placement, Unfit> {
        let Some(shape) = self.no_room_shape(workload) else {
            return self.scan(workload, Span::Cluster, &|_| true);
        };
        let me = workload.identity.clone();
        let known = self
            .no_room
            .get(&(shape, None))
            .or_else(|| me.is_some().then(|| self.no_room.get(&(shape, me.clone()))).flatten());
        if let Some(unfit) = known {
            return Err(*unfit);
        }
        let found = self.scan(workload, Span::Cluster, &|_| true);
        if let Err(unfit) = &found {
            // Found no room without other pods in the way: no pod of the shape will, whoever it is.
            let who = if self.index.constrains(workload) { me } else { None };
            self.no_room.insert((shape, who), *unfit);
        }
        found
    }

    /// The shape of a pod whose chances only shrink as pods are placed, for [`Placer::no_room`]:
    /// not one with required pod affinity or `DoNotSchedule` spread (a placed pod can satisfy
    /// them) nor DRA claims (a placed pod can allocate a claim it shares).
    fn no_room_shape(&mut self, w: &Workload) -> Option<usize> {
        if !w.pod_affinity.is_empty() || !w.spread.is_empty() || !w.dra_claims.is_empty() {
            return None;
        }
        self.shape_index(w)
    }

    /// Like [`Placer::find`], among the nodes `allowed` accepts.
    pub fn find_where(
        &mut self,
        workload: &Workload,
        allowed: &dyn Fn(NodeId) -> bool,
    ) -> Result<Placement, Unfit> {
        self.scan(workload, Span::Cluster, allowed)
    }

    /// Like [`Placer::find`], among the nodes from `first` on (those a plan added), without
    /// walking the others.
    pub fn find_from(&mut self, workload: &Workload, first: NodeId) -> Result<Placement, Unfit> {
        self.scan(workload, Span::From(first), &|_| true)
    }

    /// Whether `workload` fits `node` now, judged as a scan judges each node, and with which
    /// devices: for a pod the last plan put there (a hint), checked before any scan.
    pub fn find_on(&mut self, workload: &Workload, node: NodeId) -> Result<Placement, Unfit> {
        if node >= self.nodes.len() {
            return Err(Unfit::NodeMismatch);
        }
        self.scan(workload, Span::Only(node), &|_| true)
    }

    /// Finds the best node of `span` that `allowed` accepts; over the whole cluster, the scan
    /// begins where the last sampled one stopped.
    fn scan(
        &mut self,
        workload: &Workload,
        span: Span,
        allowed: &dyn Fn(NodeId) -> bool,
    ) -> Result<Placement, Unfit> {
        self.walk(workload, span, allowed, self.skip_refusing)
    }

    /// [`Placer::scan`]'s walk; with `skip`, over the nodes not known to refuse the shape only,
    /// which chooses the same node (skipped nodes are never feasible, and the sampling start
    /// moves as a walk over all nodes would move it). A walk that skipped and found nothing is
    /// walked again over every node, for a reason counted over all of them.
    fn walk(
        &mut self,
        workload: &Workload,
        span: Span,
        allowed: &dyn Fn(NodeId) -> bool,
        skip: bool,
    ) -> Result<Placement, Unfit> {
        // A claim allocated on a node (by the snapshot or an earlier placement) pins the pod
        // there; claims pinned to two nodes pin it nowhere.
        let mut pinned = workload.dra_claims.iter().filter_map(|c| self.claim_nodes.get(&c.key).copied());
        let pin = pinned.next();
        if pin.is_some() && pinned.any(|p| Some(p) != pin) {
            return Err(Unfit::ClaimElsewhere);
        }
        let shape = self.shape_index(workload);
        let by_class = !names_a_host(workload) && pin.is_none();
        // A pinned pod walks every node: its pin's node may take it where its class cannot.
        let skipping = shape.filter(|_| skip && pin.is_none());
        // Pod affinity and spread depend on the whole cluster, not on the node and shape: judged
        // afresh for each workload, never cached.
        let interpod = super::interpod::judge(&self.nodes, None, workload, &self.index);
        let mut best = f64::NEG_INFINITY;
        let mut chosen: Option<NodeId> = None;
        let mut ties = 0u32;
        let mut reasons = [0usize; Unfit::ALL.len()];
        let n = self.nodes.len();
        let start = if self.feasible_limit.is_some() && n > 0 { self.next_start % n } else { 0 };
        let segments = match span {
            Span::From(first) if first > 0 => [first..n, 0..0],
            Span::Only(id) => [id..id + 1, 0..0],
            Span::Cluster | Span::From(_) => [start..n, 0..start],
        };
        let mut feasible = 0usize;
        // Pods per `ScheduleAnyway` domain, counted when a tie needs them.
        let mut domains: HashMap<(usize, String), u32> = HashMap::new();
        'walk: for (segment, range) in segments.iter().enumerate() {
            let mut from = range.start;
            loop {
                let next = match skipping {
                    Some(s) => self.open[s].next(from, range.end),
                    None => (from < range.end).then_some(from),
                };
                let Some(id) = next else { break };
                from = id + 1;
                if !allowed(id) {
                    continue;
                }
                if pin.is_some_and(|p| p != id) {
                    reasons[Unfit::ClaimElsewhere as usize] += 1;
                    continue;
                }
                if let Some(s) = shape.filter(|_| by_class) {
                    let key = (s, self.class_of[id]);
                    if !statically_fits(&mut self.static_fit, &self.nodes, &self.class_reps, key, workload) {
                        self.open[s].remove(id);
                        reasons[Unfit::NodeMismatch as usize] += 1;
                        continue;
                    }
                }
                let verdict = match shape.map(|s| self.scores[s][id]) {
                    Some(Cached::Unknown) | None => {
                        let v = match self.policy.evaluate(&self.nodes[id], workload) {
                            Ok((score, _)) => Cached::Score(score),
                            Err(u) => Cached::Unfit(u),
                        };
                        if let Some(s) = shape {
                            self.scores[s][id] = v;
                        }
                        v
                    }
                    Some(v) => v,
                };
                if let (Cached::Unfit(_), Some(s)) = (verdict, shape) {
                    self.open[s].remove(id);
                }
                // The cluster-wide filters, judged only for nodes the per-node ones admit.
                let verdict = match (verdict, &interpod) {
                    (Cached::Score(_), Some(j)) => match j.on(id, &self.nodes[id]) {
                        Ok(()) => verdict,
                        Err(u) => Cached::Unfit(u),
                    },
                    _ => verdict,
                };
                if matches!(verdict, Cached::Score(_)) {
                    feasible += 1;
                }
                match verdict {
                    Cached::Score(score) if score > best => {
                        best = score;
                        chosen = Some(id);
                        ties = 1;
                    }
                    Cached::Score(score) if score == best => {
                        let prefer = chosen.map_or(Ordering::Equal, |c| {
                            self.preference(workload, id, &mut domains).cmp(&self.preference(
                                workload,
                                c,
                                &mut domains,
                            ))
                        });
                        match prefer {
                            Ordering::Greater => {
                                chosen = Some(id);
                                ties = 1;
                            }
                            Ordering::Less => {}
                            Ordering::Equal => match self.policy.tie_break() {
                                TieBreak::Uniform => {
                                    ties += 1;
                                    if self.rng.random_range(0..ties) == 0 {
                                        chosen = Some(id);
                                    }
                                }
                                TieBreak::NodeOrder => {
                                    if chosen.is_some_and(|c| self.rank[id] < self.rank[c]) {
                                        chosen = Some(id);
                                    }
                                }
                            },
                        }
                    }
                    Cached::Unfit(u) => reasons[u as usize] += 1,
                    _ => {}
                }
                // Sampling stops after the limit's feasible nodes; the next walk starts at the
                // node after this one.
                if self.feasible_limit.is_some_and(|limit| feasible >= limit) {
                    let after = if id + 1 < range.end {
                        Some(id + 1)
                    } else {
                        segments[segment + 1..].iter().find(|r| !r.is_empty()).map(|r| r.start)
                    };
                    if let Some(after) = after {
                        self.next_start = after;
                    }
                    break 'walk;
                }
            }
        }
        let Some(node) = chosen else {
            if skipping.is_some() {
                // The verdicts are all cached by now, and a failed walk draws no random numbers
                // and moves no sampling start: the second walk only counts.
                return self.walk(workload, span, allowed, false);
            }
            // The most common reason, the earlier-listed one on ties.
            let reason = Unfit::ALL
                .into_iter()
                .filter(|&u| reasons[u as usize] > 0)
                .max_by_key(|&u| (reasons[u as usize], std::cmp::Reverse(u)))
                .unwrap_or(Unfit::NoSuchGpu);
            return Err(reason);
        };
        let (_, devices) = self.policy.evaluate(&self.nodes[node], workload)?;
        Ok(Placement { node, devices })
    }

    /// How much `workload` prefers node `id` among equally scored ones, as kube-scheduler's
    /// scores would rank them: the summed weight of its preferred node-affinity terms the node
    /// matches, then the fewest pods its `ScheduleAnyway` constraints count in the node's
    /// domains (a node without a constraint's key ranks last, as kube-scheduler scores it 0).
    fn preference(
        &self,
        workload: &Workload,
        id: NodeId,
        domains: &mut HashMap<(usize, String), u32>,
    ) -> (u32, std::cmp::Reverse<u32>) {
        let prefs = &workload.preferences;
        if prefs.is_empty() {
            return (0, std::cmp::Reverse(0));
        }
        let node = &self.nodes[id];
        let mut crowd = 0u32;
        for (ci, c) in prefs.spread.iter().enumerate() {
            let Some(value) = node.labels.get(&c.topology_key) else {
                crowd = u32::MAX;
                break;
            };
            let count = *domains.entry((ci, value.clone())).or_insert_with(|| {
                super::interpod::pods_in_domain(&self.nodes, &self.index, workload, c, value)
            });
            crowd = crowd.saturating_add(count);
        }
        (prefs.node_affinity_weight(node), std::cmp::Reverse(crowd))
    }

    /// Places `workload` on its best node and records the allocation.
    pub fn place(&mut self, workload: &Workload) -> Result<Placement, Unfit> {
        let placement = self.find(workload)?;
        self.commit(workload, &placement);
        Ok(placement)
    }

    /// Like [`Placer::place`], among the nodes `allowed` accepts.
    pub fn place_where(
        &mut self,
        workload: &Workload,
        allowed: &dyn Fn(NodeId) -> bool,
    ) -> Result<Placement, Unfit> {
        let placement = self.find_where(workload, allowed)?;
        self.commit(workload, &placement);
        Ok(placement)
    }

    /// Records an allocation decided elsewhere (e.g. a running pod) on its node.
    pub fn commit(&mut self, workload: &Workload, placement: &Placement) {
        if let Some(id) = &workload.identity {
            self.index.add_pod(placement.node, id);
        }
        self.nodes[placement.node].allocate_pod(workload, &placement.devices);
        for c in &workload.dra_claims {
            if self.nodes[placement.node].dra.claims.contains_key(&c.key) {
                self.claim_nodes.insert(c.key.clone(), placement.node);
            }
        }
        self.forget_scores(placement.node);
    }

    /// Removes an allocation (a departed or evicted workload).
    pub fn release(&mut self, workload: &Workload, placement: &Placement) {
        if let Some(id) = &workload.identity {
            if self.nodes[placement.node].residents.iter().any(|r| std::sync::Arc::ptr_eq(r, id)) {
                self.index.remove_pod(placement.node, id);
            }
        }
        self.nodes[placement.node].release_pod(workload, &placement.devices);
        for c in &workload.dra_claims {
            if !self.nodes[placement.node].dra.claims.contains_key(&c.key) {
                self.claim_nodes.remove(&c.key);
            }
        }
        self.invalidate(placement.node);
    }

    /// Removes from `node` the snapshot's claim allocations no pod placed there uses any more,
    /// and returns them for [`Placer::restore_claims`].
    pub fn free_unused_claims(&mut self, node: NodeId) -> Vec<(String, ClaimHold)> {
        // A snapshot allocation keeps one user of its own besides the pods placed with it; one
        // that other nodes reach too (devices not bound to a node) stays.
        let elsewhere = |k: &String| {
            self.nodes.iter().enumerate().any(|(m, n)| m != node && n.dra.claims.contains_key(k))
        };
        let unused: Vec<String> = self.nodes[node]
            .dra
            .claims
            .iter()
            .filter(|(k, h)| h.fixed && h.users <= 1 && !elsewhere(k))
            .map(|(k, _)| k.clone())
            .collect();
        let claims = &mut self.nodes[node].dra.claims;
        let freed: Vec<(String, ClaimHold)> =
            unused.into_iter().filter_map(|k| claims.remove(&k).map(|h| (k, h))).collect();
        for (key, _) in &freed {
            self.claim_nodes.remove(key);
        }
        self.invalidate(node);
        freed
    }

    /// Takes DRA devices of `node` out of use for the rest of the plan (a MIG re-partition
    /// removes them), held as claim `key`.
    pub fn reserve_dra_devices(&mut self, node: NodeId, key: &str, devices: Vec<u32>) {
        if devices.is_empty() {
            return;
        }
        self.nodes[node].dra.claims.insert(key.to_string(), ClaimHold { devices, users: 1, fixed: true });
        self.forget_scores(node);
    }

    /// Puts back what [`Placer::free_unused_claims`] removed.
    pub fn restore_claims(&mut self, node: NodeId, claims: Vec<(String, ClaimHold)>) {
        for (key, hold) in claims {
            self.claim_nodes.insert(key.clone(), node);
            self.nodes[node].dra.claims.insert(key, hold);
        }
        self.invalidate(node);
    }

    /// Forgets cached scores of a node whose state changed, and which shapes found no room.
    pub fn invalidate(&mut self, node: NodeId) {
        self.no_room.clear();
        self.forget_scores(node);
    }

    /// Forgets cached scores of a node that only took more on (each shape when next walked).
    fn forget_scores(&mut self, node: NodeId) {
        // A shape starts with every node unknown: before the first, nothing needs the change.
        if !self.scores.is_empty() {
            self.changes.push(node);
        }
    }
}

/// A set of node ids, walked in order from any point.
#[derive(Debug, Clone)]
struct NodeSet {
    words: Vec<u64>,
    len: usize,
}

impl NodeSet {
    fn full(len: usize) -> Self {
        let mut words = vec![u64::MAX; len.div_ceil(64)];
        if !len.is_multiple_of(64) {
            if let Some(last) = words.last_mut() {
                *last = (1u64 << (len % 64)) - 1;
            }
        }
        Self { words, len }
    }

    fn push(&mut self, member: bool) {
        if self.len.is_multiple_of(64) {
            self.words.push(0);
        }
        self.len += 1;
        if member {
            self.insert(self.len - 1);
        }
    }

    fn insert(&mut self, id: usize) {
        self.words[id / 64] |= 1 << (id % 64);
    }

    fn remove(&mut self, id: usize) {
        self.words[id / 64] &= !(1 << (id % 64));
    }

    /// The first member in `from..end`.
    fn next(&self, from: usize, end: usize) -> Option<usize> {
        let end = end.min(self.len);
        if from >= end {
            return None;
        }
        let mut word = from / 64;
        let mut bits = self.words[word] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                let id = word * 64 + bits.trailing_zeros() as usize;
                return (id < end).then_some(id);
            }
            word += 1;
            if word * 64 >= end {
                return None;
            }
            bits = self.words[word];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LabelSelector, PodAffinityTerm, PodIdentity};
    use crate::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};
    use std::sync::Arc;

    fn node(name: &str, cpu_milli: u64) -> Node {
        Node {
            name: name.into(),
            allocatable: Resources::new(cpu_milli, 1024),
            labels: [(HOSTNAME_LABEL.to_string(), name.to_string())].into(),
            ..Default::default()
        }
    }

    /// A pod of one shape (1 CPU) labelled `app`, with `anti` as its required anti-affinity.
    fn pod(name: &str, app: &str, anti: Option<&str>) -> Workload {
        let labels: BTreeMap<String, String> = [("app".to_string(), app.to_string())].into();
        let anti_affinity = anti.map(|a| vec![term(a)]).unwrap_or_default();
        Workload {
            id: format!("ns/{name}"),
            requests: Resources::new(1000, 1),
            labels: labels.clone(),
            identity: Some(Arc::new(PodIdentity { namespace: "ns".into(), labels, anti_affinity })),
            ..Default::default()
        }
    }

    /// Pods labelled `app`, one per host.
    fn term(app: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            selector: LabelSelector {
                match_labels: [("app".to_string(), app.to_string())].into(),
                ..Default::default()
            },
            namespaces: vec!["ns".into()],
            topology_key: HOSTNAME_LABEL.into(),
        }
    }

    fn policy(nodes: &[Node]) -> Box<dyn Policy> {
        PolicyKind::BestFit.build(&ClusterScale::of(nodes), &TargetWorkload::from_workloads(&[], 0.95))
    }

    impl Placer<'_> {
        fn walking_every_node(mut self) -> Self {
            self.skip_refusing = false;
            self
        }
    }

    #[test]
    fn a_node_set_walks_its_members_in_order_from_any_point() {
        let mut set = NodeSet::full(130);
        assert_eq!(set.next(0, 130), Some(0));
        assert_eq!(set.next(129, 130), Some(129));
        assert_eq!(set.next(130, 130), None);
        for id in (0..130).filter(|id| id % 7 != 3) {
            set.remove(id);
        }
        let members: Vec<usize> =
            std::iter::successors(set.next(0, 130), |&id| set.next(id + 1, 130)).collect();
        assert_eq!(members, (0..130).filter(|id| id % 7 == 3).collect::<Vec<_>>());
        assert_eq!(set.next(4, 10), None, "10 is past the end of the range");
        assert_eq!(set.next(60, 70), Some(66));
        set.push(false);
        set.push(true);
        assert_eq!(set.next(130, 200), Some(131), "a range past the set ends at the set");
        set.insert(64);
        assert_eq!(set.next(60, 70), Some(64));
    }

    /// Skipping the nodes the cache says refuse a shape chooses what walking every node chooses,
    /// pod after pod, sampling start and ties included (and gives the same reason on failure).
    #[test]
    fn walking_only_the_open_nodes_places_as_walking_all_of_them() {
        for seed in 1..4 {
            let (mut snapshot, _) = crate::sim::synthetic::cluster(300, 2400, 1200, seed);
            crate::sim::synthetic::with_interpod(&mut snapshot, 0.1, seed);
            let policy = PolicyKind::Gpuscale.build(
                &ClusterScale::of(&snapshot.nodes),
                &TargetWorkload::from_workloads(&snapshot.workloads, 0.95),
            );
            let nodes = snapshot.nodes.clone();
            let mut skipping = Placer::new(nodes.clone(), policy.as_ref(), seed).with_adaptive_sampling();
            let mut walking =
                Placer::new(nodes, policy.as_ref(), seed).with_adaptive_sampling().walking_every_node();
            assert!(skipping.feasible_limit.is_some(), "the cluster is sampled");
            let (mut placed, mut refused) = (Vec::new(), Vec::new());
            for w in &snapshot.workloads {
                let got = skipping.place(w);
                assert_eq!(got, walking.place(w), "seed {seed}, {}", w.id);
                match got {
                    Ok(p) => placed.push((w, p)),
                    Err(_) => refused.push(w),
                }
            }
            assert!(placed.len() > 1000 && refused.len() > 100, "seed {seed}: {} placed", placed.len());
            // Room freed on some nodes opens them again to the shapes they refused.
            for (w, p) in placed.iter().step_by(3) {
                skipping.release(w, p);
                walking.release(w, p);
            }
            let mut again = 0;
            for w in refused {
                let got = skipping.place(w);
                assert_eq!(got, walking.place(w), "seed {seed}, {} after releases", w.id);
                again += usize::from(got.is_ok());
            }
            assert!(again > 50, "seed {seed}: {again} refused pods placed after the releases");
        }
    }

    #[test]
    fn a_shape_that_found_no_room_fits_again_once_room_is_freed() {
        let nodes = vec![node("a", 1000)];
        let policy = policy(&nodes);
        let mut placer = Placer::new(nodes, policy.as_ref(), 1);
        let first = placer.place(&pod("p1", "x", None)).expect("room for one");
        assert_eq!(placer.place(&pod("p2", "x", None)), Err(Unfit::InsufficientCpu));
        assert_eq!(placer.place(&pod("p3", "x", None)), Err(Unfit::InsufficientCpu));
        placer.release(&pod("p1", "x", None), &first);
        assert!(placer.place(&pod("p2", "x", None)).is_ok(), "room freed: the shape fits again");
    }

    #[test]
    fn a_shape_that_found_no_room_fits_a_node_added_later() {
        let nodes = vec![node("a", 500)];
        let policy = policy(&nodes);
        let mut placer = Placer::new(nodes, policy.as_ref(), 1);
        assert!(placer.place(&pod("p1", "x", None)).is_err());
        let b = placer.add_node(node("b", 1000));
        assert_eq!(placer.place(&pod("p1", "x", None)).map(|p| p.node), Ok(b));
    }

    #[test]
    fn running_pods_anti_affinity_refuses_only_the_pods_it_selects() {
        // a runs a pod that keeps `web` off its host; b is full.
        let nodes = vec![node("a", 2000), node("b", 1000)];
        let policy = policy(&nodes);
        let mut placer = Placer::new(nodes, policy.as_ref(), 1);
        let guard = pod("guard", "guard", Some("web"));
        placer.commit(&guard, &Placement { node: 0, devices: DeviceAssignment::None });
        placer.commit(&pod("filler", "x", None), &Placement { node: 1, devices: DeviceAssignment::None });
        assert!(placer.place(&pod("web-1", "web", None)).is_err());
        // The same shape with other labels is not repelled.
        assert_eq!(placer.place(&pod("api-1", "api", None)).map(|p| p.node), Ok(0));
    }

    #[test]
    fn a_pod_with_required_pod_affinity_is_judged_again_after_its_peer_is_placed() {
        let nodes = vec![node("a", 4000)];
        let policy = policy(&nodes);
        let mut placer = Placer::new(nodes, policy.as_ref(), 1);
        let mut follower = pod("follower", "follower", None);
        follower.pod_affinity = vec![term("leader")];
        assert_eq!(placer.place(&follower), Err(Unfit::PodAffinity));
        placer.place(&pod("leader", "leader", None)).expect("room");
        assert_eq!(placer.place(&follower).map(|p| p.node), Ok(0));
    }
}
