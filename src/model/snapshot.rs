//! A point-in-time view of a cluster: the input of every decision.

use super::node::Node;
use super::workload::{DisruptionBudget, Workload};
use serde::{Deserialize, Serialize};

/// Nodes and the workloads on them or waiting for them. Decisions are pure functions of a
/// snapshot, so the same snapshot always yields the same plan.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterSnapshot {
    /// Nodes, including in-flight ones.
    pub nodes: Vec<Node>,
    /// Running workloads (with `node_name`) and pending ones (without).
    pub workloads: Vec<Workload>,
    /// PodDisruptionBudgets.
    #[serde(default)]
    pub disruption_budgets: Vec<DisruptionBudget>,
    /// ProvisioningRequests: capacity asked for pods that do not exist yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provisioning_requests: Vec<super::provisioning::ProvisioningRequest>,
}

impl ClusterSnapshot {
    /// Workloads not bound to a node.
    pub fn pending(&self) -> impl Iterator<Item = &Workload> {
        self.workloads.iter().filter(|w| w.node_name.is_none())
    }
}
