//! Idle GPUs: GPUs that pods hold but that the node's agent has measured idle for longer than
//! the configured window. They are reported with what they cost; when every pod holding one opted
//! in to reclaim (`gpuscale.io/reclaim-idle: "true"`), the GPU counts as free for the scale-down
//! utilisation test, so the normal scale-down moves those pods and frees the node.

use super::cluster::{NodeInfo, Origin};
use super::plan::IdleGpu;
use crate::model::{DeviceAssignment, NodeGroup, TelemetrySettings, Workload, GPU_MILLI};
use crate::scheduler::Placer;

/// What the idle check found.
pub(crate) struct IdleReport {
    /// Idle allocated GPUs, by node then GPU.
    pub idle: Vec<IdleGpu>,
    /// Per simulated node, milli-GPU held by opted-in pods on idle GPUs.
    pub reclaimable: Vec<u64>,
}

/// GPU indexes a device assignment holds.
fn gpus_of(devices: &DeviceAssignment) -> Vec<u8> {
    match devices {
        DeviceAssignment::None => vec![],
        DeviceAssignment::Whole { gpus }
        | DeviceAssignment::Fraction { gpus, .. }
        | DeviceAssignment::Replicas { gpus } => gpus.clone(),
        DeviceAssignment::Mig { instances } => instances.iter().map(|(g, _)| *g).collect(),
    }
}

/// Finds idle allocated GPUs on ready nodes with telemetry. Only running pods count as holders.
/// Telemetry older than `max_age` compared with the newest sample in the snapshot is ignored (the
/// planner has no clock; an agent that stopped publishing falls behind the others).
pub(crate) fn find(
    placer: &Placer<'_>,
    info: &[NodeInfo],
    workloads: &[Workload],
    groups: &[NodeGroup],
    settings: &TelemetrySettings,
) -> IdleReport {
    let mut out = IdleReport { idle: Vec::new(), reclaimable: vec![0; info.len()] };
    let newest = placer.nodes().iter().filter_map(|n| n.telemetry.as_ref()).map(|t| t.sampled_at).max();
    for (n, node_info) in info.iter().enumerate() {
        let node = &placer.nodes()[n];
        let Some(t) = &node.telemetry else { continue };
        if !newest.is_some_and(|now| t.is_fresh(now, settings.max_age)) {
            continue;
        }
        if node_info.origin != Origin::Ready || node.gpus.is_empty() {
            continue;
        }
        let price = node_info.group.map_or(0, |g| groups[g].price);
        let geometry = node.mig_geometry();
        for g in &t.gpus {
            let Some(idle_for) = g.idle_for(t.sampled_at).filter(|&s| s >= settings.idle_window) else {
                continue;
            };
            let Some(device) = node.gpus.iter().find(|d| d.index == g.index) else { continue };
            let holders: Vec<&Workload> = node_info
                .pods
                .iter()
                .filter(|(wi, devices)| {
                    workloads[*wi].node_name.is_some() && gpus_of(devices).contains(&g.index)
                })
                .map(|(wi, _)| &workloads[*wi])
                .collect();
            if holders.is_empty() {
                continue;
            }
            if holders.iter().all(|w| w.reclaim_idle) {
                out.reclaimable[n] += u64::from(GPU_MILLI - device.free_milli(geometry));
            }
            out.idle.push(IdleGpu {
                node: node.name.clone(),
                gpu: g.index,
                uuid: g.uuid.clone(),
                pods: holders.iter().map(|w| w.id.clone()).collect(),
                idle_for,
                reclaimable: holders.iter().all(|w| w.reclaim_idle),
                cost_per_hour: price / node.gpus.len() as u64,
            });
        }
    }
    out.idle.sort_by(|a, b| a.node.cmp(&b.node).then(a.gpu.cmp(&b.gpu)));
    out
}
