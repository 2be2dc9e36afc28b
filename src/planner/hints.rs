//! Placement hints: where the last plan put each pending pod, tried first by the next plan.
//!
//! A controller plans the same cluster again every loop, and pending pods that fit a node stay
//! pending until kube-scheduler binds them (or, in a dry run, for good): re-scoring thousands of
//! them against thousands of nodes each loop finds the same nodes again. Cluster Autoscaler's
//! `HintingSimulator` keeps, for each pod, the node its last simulation put it on and checks that
//! node first; so does the planner with these hints. A hinted node is judged by every filter a
//! scan applies (the placement stays one kube-scheduler would allow) and only its choice among
//! feasible nodes is the last plan's, not a fresh scoring: the plan stays stable loop to loop.
//! `gpuscale plan` never has hints; a new leader starts without them.

use super::Plan;
use crate::model::{Node, NodeId, Workload};
use std::collections::HashMap;

/// The node each pending pod was placed on by the last plan, by pod id (`namespace/name`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementHints {
    by_pod: HashMap<String, String>,
}

impl PlacementHints {
    /// The placements of `plan` on nodes that exist or are on their way.
    pub fn of(plan: &Plan) -> Self {
        Self { by_pod: plan.placements.iter().map(|p| (p.pod.clone(), p.node.clone())).collect() }
    }

    /// Pods with a hint.
    pub fn len(&self) -> usize {
        self.by_pod.len()
    }

    /// Whether no pod has a hint.
    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }

    /// The hinted node of each pending workload, by snapshot index: `None` for pods without a
    /// hint and for hints naming a node that is gone.
    pub(crate) fn resolve(&self, workloads: &[Workload], nodes: &[Node]) -> Vec<Option<NodeId>> {
        if self.by_pod.is_empty() {
            return Vec::new();
        }
        let ids: HashMap<&str, NodeId> =
            nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        workloads
            .iter()
            .map(|w| {
                let node = self.by_pod.get(&w.id).filter(|_| w.node_name.is_none())?;
                ids.get(node.as_str()).copied()
            })
            .collect()
    }
}
