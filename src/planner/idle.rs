//! Idle GPUs: GPUs that pods hold but that the node's agent has measured idle for longer than
//! the configured window. They are reported with what they cost; when every pod holding one opted
//! in to reclaim (`gpuscale.io/reclaim-idle: "true"`), the GPU counts as free for the scale-down
//! utilisation test, so the normal scale-down moves those pods and frees the node. GPUs that
//! claims hold through DRA (whole or as MIG devices) are found by UUID and count the same way.

use super::cluster::{NodeInfo, Origin};
use super::plan::IdleGpu;
use crate::model::dra::DraInventory;
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

/// The DRA devices of `inv` that are the GPU `uuid` or MIG devices on it.
fn dra_devices_on(inv: &DraInventory, uuid: &str) -> Vec<u32> {
    (0..inv.devices.len() as u32).filter(|&d| inv.devices[d as usize].gpu_uuid() == Some(uuid)).collect()
}

/// Finds idle allocated GPUs on ready nodes with telemetry. Only running pods count as holders.
/// Telemetry older than `max_age` at `now` is ignored: when every agent stops publishing, their
/// last "idle" readings must not keep reclaiming GPUs that may be busy again. Without a clock
/// (`now` is `None`), the newest sample in the snapshot stands for it, which still catches an
/// agent that fell behind the others.
pub(crate) fn find(
    placer: &Placer<'_>,
    info: &[NodeInfo],
    workloads: &[Workload],
    groups: &[NodeGroup],
    settings: &TelemetrySettings,
    now: Option<i64>,
) -> IdleReport {
    let mut out = IdleReport { idle: Vec::new(), reclaimable: vec![0; info.len()] };
    let newest = placer.nodes().iter().filter_map(|n| n.telemetry.as_ref()).map(|t| t.sampled_at).max();
    let now = now.map(|t| u64::try_from(t).unwrap_or(0)).or(newest);
    for (n, node_info) in info.iter().enumerate() {
        let node = &placer.nodes()[n];
        let Some(t) = &node.telemetry else { continue };
        if !now.is_some_and(|now| t.is_fresh(now, settings.max_age)) {
            continue;
        }
        let dra_gpus = node.dra.gpu_use().0;
        if node_info.origin != Origin::Ready || (node.gpus.is_empty() && dra_gpus == 0) {
            continue;
        }
        let price = node_info.group.map_or(0, |g| groups[g].price);
        let geometry = node.mig_geometry();
        for g in &t.gpus {
            let Some(idle_for) = g.idle_for(t.sampled_at).filter(|&s| s >= settings.idle_window) else {
                continue;
            };
            // A device-plugin GPU by index, else the DRA devices on this GPU by its UUID.
            let plugin = node.gpus.iter().find(|d| d.index == g.index);
            let dra = if plugin.is_none() { dra_devices_on(&node.dra, &g.uuid) } else { Vec::new() };
            if plugin.is_none() && dra.is_empty() {
                continue;
            }
            let holds = |w: &Workload, devices: &DeviceAssignment| match plugin {
                Some(_) => gpus_of(devices).contains(&g.index),
                None => w.dra_claims.iter().any(|c| {
                    node.dra.claims.get(&c.key).is_some_and(|h| h.devices.iter().any(|d| dra.contains(d)))
                }),
            };
            let holders: Vec<&Workload> = node_info
                .pods
                .iter()
                .filter(|(wi, devices)| workloads[*wi].node_name.is_some() && holds(&workloads[*wi], devices))
                .map(|(wi, _)| &workloads[*wi])
                .collect();
            if holders.is_empty() {
                continue;
            }
            // Reclaim frees what the holders take of this GPU for the scale-down test.
            if holders.iter().all(|w| w.reclaim_idle) {
                out.reclaimable[n] += match plugin {
                    Some(device) => u64::from(GPU_MILLI - device.free_milli(geometry)),
                    None => node.dra.held_milli(&dra),
                };
            }
            out.idle.push(IdleGpu {
                node: node.name.clone(),
                gpu: g.index,
                uuid: g.uuid.clone(),
                pods: holders.iter().map(|w| w.id.clone()).collect(),
                idle_for,
                reclaimable: holders.iter().all(|w| w.reclaim_idle),
                cost_per_hour: price / node.gpus.len().max(dra_gpus).max(1) as u64,
            });
        }
    }
    out.idle.sort_by(|a, b| a.node.cmp(&b.node).then(a.gpu.cmp(&b.gpu)));
    out
}
