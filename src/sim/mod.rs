//! Trace replays through the scheduler.

use crate::model::{DeviceAssignment, Node, OwnerKind, Workload};
use crate::scheduler::fit;

pub mod autoscale;
pub mod inflation;
pub mod kubectl_list;
pub mod synthetic;
pub mod tenants;

/// A trace's tasks come from job controllers: an evicted pod is recreated (re-queued), so a
/// replayed pod without a recorded owner is a Job's (drains and preemption spare bare pods).
fn owned_by_a_job(mut w: Workload) -> Workload {
    if w.owner == OwnerKind::None {
        w.owner = OwnerKind::Job;
    }
    w
}

/// The devices a pod the plan placed on `node` takes there when it is bound: the plan's choice
/// while the node's live state still offers it, else the first that fits; `None` when nothing
/// fits any more (kube-scheduler's part in the replays, which bind what the plan places).
fn devices_to_bind(node: &Node, w: &Workload, planned: &DeviceAssignment) -> Option<DeviceAssignment> {
    let choices = fit::candidates(node, w).ok()?;
    if choices.contains(planned) {
        Some(planned.clone())
    } else {
        choices.into_iter().next()
    }
}
