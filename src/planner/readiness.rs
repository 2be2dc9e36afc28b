//! Whether a registered node is capacity yet: Ready, and advertising the GPU resources its
//! group's template promises (whole GPUs, MIG profiles, time-sliced replicas). A GPU node whose
//! device plugin has not started yet would otherwise look like an empty node to remove, or a full
//! one to scale past. `gpuscale run` and `gpuscale plan` both mark such nodes in flight
//! ([`mark_in_flight`]), so a dry run shows what the controller would do.

use super::cluster::GroupIndex;
use crate::model::{telemetry, GpuMode, Node, NodeGroup, NodeState};

/// Whether a registered node counts as capacity yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Ready with the GPUs its group promises.
    Ready,
    /// Still on its way, and why.
    InFlight(String),
}

/// Classifies a node against its group's template (`None`: unmanaged node, judged on its own).
pub fn classify(node: &Node, template: Option<&Node>) -> Readiness {
    if node.state == NodeState::Initializing {
        return Readiness::InFlight(if node.gpus.is_empty() || template.is_none_or(|t| t.gpus.is_empty()) {
            "not Ready yet".into()
        } else {
            "not Ready, or its GPUs are not advertised yet".into()
        });
    }
    let Some(template) = template else { return Readiness::Ready };
    // GPUs offered through DRA come with the node's ResourceSlices, published by the driver's
    // kubelet plugin after the node turns Ready: until then the node is on its way, not a node
    // without GPUs (planned as such, every DRA pod waiting for it would ask for another).
    if node.dra.devices.len() < template.dra.devices.len() {
        return Readiness::InFlight(format!(
            "publishes {} of the {} DRA devices of its group",
            node.dra.devices.len(),
            template.dra.devices.len()
        ));
    }
    if template.gpus.is_empty() {
        return Readiness::Ready;
    }
    if node.gpus.len() < template.gpus.len() {
        return Readiness::InFlight(format!(
            "advertises {} of the {} GPUs of its instance type",
            node.gpus.len(),
            template.gpus.len()
        ));
    }
    for (want, have) in template.gpus.iter().zip(&node.gpus) {
        match (&want.mode, &have.mode) {
            (GpuMode::TimeSliced { replicas: w }, GpuMode::TimeSliced { replicas: h }) if h >= w => {}
            (GpuMode::TimeSliced { replicas }, _) => {
                return Readiness::InFlight(format!(
                    "GPU {} does not advertise its {replicas} time-sliced replicas yet",
                    have.index
                ))
            }
            (GpuMode::Mig { instances: w, dynamic: false }, GpuMode::Mig { instances: h, .. })
                if h.len() < w.len() =>
            {
                return Readiness::InFlight(format!(
                    "GPU {} advertises {} of its {} MIG instances",
                    have.index,
                    h.len(),
                    w.len()
                ))
            }
            (GpuMode::Mig { .. }, GpuMode::Mig { .. }) => {}
            (GpuMode::Mig { .. }, _) => {
                return Readiness::InFlight(format!("GPU {} does not advertise MIG profiles yet", have.index))
            }
            _ => {}
        }
    }
    Readiness::Ready
}

/// Marks Ready nodes that are still in flight as Initializing: those advertising fewer GPUs (or
/// MIG instances, or time-sliced replicas) than their group's template, and, where the node agent
/// runs, those whose NVML readings do not show the promised GPUs. Returns each marked node with
/// the reason.
pub fn mark_in_flight(nodes: &mut [Node], groups: &[NodeGroup]) -> Vec<(String, String)> {
    let mut marked = Vec::new();
    let index = GroupIndex::of(groups);
    for node in nodes.iter_mut().filter(|n| n.state == NodeState::Ready) {
        let template = index.group_of(node).map(|g| &groups[g].template);
        let why = match classify(node, template) {
            Readiness::InFlight(why) => why,
            Readiness::Ready => match (&node.telemetry, template) {
                (Some(_), Some(template)) => match telemetry::telemetry_confirms(node, template) {
                    Err(why) => format!("telemetry disagrees: {why}"),
                    Ok(_) => continue,
                },
                _ => continue,
            },
        };
        node.state = NodeState::Initializing;
        marked.push((node.name.clone(), why));
    }
    marked
}
