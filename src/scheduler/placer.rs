//! The placement loop over a cluster, with per-node score caching.
//!
//! A policy's score depends only on the node and the workload's shape, and placing a workload
//! changes one node. The placer therefore keeps a score per (shape, node) and invalidates a node's
//! column when it changes: a stream of workloads costs one pass over the cached scores plus one
//! evaluation per changed node, instead of scoring every node for every workload.

use super::fit::Unfit;
use super::policy::{Policy, TieBreak};
use crate::model::{
    DeviceAssignment, GpuDemand, Node, NodeId, NodeSelectorRequirement, Resources, Toleration, Workload,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};

/// Where a workload was placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node.
    pub node: NodeId,
    /// The devices it holds there.
    pub devices: DeviceAssignment,
}

/// What makes two workloads interchangeable for placement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ShapeKey {
    requests: Resources,
    gpu: GpuDemand,
    gpu_models: Vec<String>,
    node_selector: BTreeMap<String, String>,
    affinity_terms: Vec<Vec<NodeSelectorRequirement>>,
    tolerations: Vec<Toleration>,
}

impl ShapeKey {
    fn of(w: &Workload) -> Self {
        Self {
            requests: w.requests,
            gpu: w.gpu.clone(),
            gpu_models: w.gpu_models.clone(),
            node_selector: w.node_selector.clone(),
            affinity_terms: w.affinity_terms.clone(),
            tolerations: w.tolerations.clone(),
        }
    }
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
    shapes: HashMap<ShapeKey, usize>,
    /// `scores[shape][node]`.
    scores: Vec<Vec<Cached>>,
    /// Position of each node in a seeded random order, for [`TieBreak::NodeOrder`].
    rank: Vec<u32>,
    rng: ChaCha8Rng,
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
        Self { nodes, policy, shapes: HashMap::new(), scores: Vec::new(), rank, rng }
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
            return Some(i);
        }
        if (self.scores.len() + 1) * self.nodes.len() > MAX_CACHE_ENTRIES {
            return None;
        }
        self.scores.push(vec![Cached::Unknown; self.nodes.len()]);
        self.shapes.insert(key, self.scores.len() - 1);
        Some(self.scores.len() - 1)
    }

    /// Adds a node (e.g. one a scale-up would create) and returns its id.
    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        for column in &mut self.scores {
            column.push(Cached::Unknown);
        }
        self.rank.push(self.rank.len() as u32);
        self.nodes.len() - 1
    }

    /// Finds the best node for `workload` without placing it. On failure, returns the most
    /// common reason among nodes (for reporting).
    pub fn find(&mut self, workload: &Workload) -> Result<Placement, Unfit> {
        self.find_where(workload, &|_| true)
    }

    /// Like [`Placer::find`], among the nodes `allowed` accepts.
    pub fn find_where(
        &mut self,
        workload: &Workload,
        allowed: &dyn Fn(NodeId) -> bool,
    ) -> Result<Placement, Unfit> {
        let shape = self.shape_index(workload);
        let mut best = f64::NEG_INFINITY;
        let mut chosen: Option<NodeId> = None;
        let mut ties = 0u32;
        let mut reasons: BTreeMap<Unfit, usize> = BTreeMap::new();
        for id in 0..self.nodes.len() {
            if !allowed(id) {
                continue;
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
            match verdict {
                Cached::Score(score) if score > best => {
                    best = score;
                    chosen = Some(id);
                    ties = 1;
                }
                Cached::Score(score) if score == best => match self.policy.tie_break() {
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
                Cached::Unfit(u) => *reasons.entry(u).or_default() += 1,
                _ => {}
            }
        }
        let Some(node) = chosen else {
            let reason = reasons
                .into_iter()
                .max_by_key(|&(u, n)| (n, std::cmp::Reverse(u)))
                .map_or(Unfit::NoSuchGpu, |(u, _)| u);
            return Err(reason);
        };
        let (_, devices) = self.policy.evaluate(&self.nodes[node], workload)?;
        Ok(Placement { node, devices })
    }

    /// Places `workload` on its best node and records the allocation.
    pub fn place(&mut self, workload: &Workload) -> Result<Placement, Unfit> {
        self.place_where(workload, &|_| true)
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
        self.nodes[placement.node].allocate(&workload.requests, &placement.devices);
        self.invalidate(placement.node);
    }

    /// Removes an allocation (a departed or evicted workload).
    pub fn release(&mut self, workload: &Workload, placement: &Placement) {
        self.nodes[placement.node].release(&workload.requests, &placement.devices);
        self.invalidate(placement.node);
    }

    /// Forgets cached scores of a node whose state changed.
    pub fn invalidate(&mut self, node: NodeId) {
        for column in &mut self.scores {
            column[node] = Cached::Unknown;
        }
    }
}
