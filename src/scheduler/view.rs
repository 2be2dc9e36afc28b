//! A node's free capacity in the common currency of scoring policies.

use crate::model::{DeviceAssignment, Node, Resources, Workload, GPU_MILLI};

/// Most GPUs a node can have in a [`FreeView`].
pub const MAX_GPUS: usize = 16;

/// Free CPU, memory and per-GPU milli-GPU of a node, before or after a tentative placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FreeView {
    /// Free CPU, milli.
    pub cpu_milli: u64,
    /// Free memory, bytes.
    pub memory_bytes: u64,
    /// Allocatable CPU, milli.
    pub cpu_capacity: u64,
    /// Allocatable memory, bytes.
    pub memory_capacity: u64,
    /// Free milli-GPU of each GPU (first `gpu_count` entries).
    pub gpus: [u16; MAX_GPUS],
    /// Number of GPUs.
    pub gpu_count: u8,
}

impl FreeView {
    /// The node as it is.
    pub fn of(node: &Node) -> Self {
        let geometry = node.mig_geometry();
        let mut gpus = [0u16; MAX_GPUS];
        for (slot, d) in gpus.iter_mut().zip(&node.gpus) {
            *slot = d.free_milli(geometry) as u16;
        }
        let free = node.free();
        Self {
            cpu_milli: free.cpu_milli,
            memory_bytes: free.memory_bytes,
            cpu_capacity: node.allocatable.cpu_milli,
            memory_capacity: node.allocatable.memory_bytes,
            gpus,
            gpu_count: node.gpus.len().min(MAX_GPUS) as u8,
        }
    }

    /// The node as it would be after placing `workload` with `devices`.
    pub fn after(node: &Node, workload: &Workload, devices: &DeviceAssignment) -> Self {
        Self::of(node).with(node, workload, devices)
    }

    /// This view of `node` after placing `workload` with `devices` (cheaper than
    /// [`FreeView::after`] when several choices are compared against one view).
    pub fn with(mut self, node: &Node, workload: &Workload, devices: &DeviceAssignment) -> Self {
        self.take(&workload.requests, devices, node);
        self
    }

    fn take(&mut self, requests: &Resources, devices: &DeviceAssignment, node: &Node) {
        self.cpu_milli = self.cpu_milli.saturating_sub(requests.cpu_milli);
        self.memory_bytes = self.memory_bytes.saturating_sub(requests.memory_bytes);
        let mut sub = |g: u8, milli: u32| {
            if let Some(slot) = self.gpus.get_mut(g as usize) {
                *slot = slot.saturating_sub(milli.min(u32::from(u16::MAX)) as u16);
            }
        };
        match devices {
            DeviceAssignment::None => {}
            DeviceAssignment::Whole { gpus } => gpus.iter().for_each(|&g| sub(g, GPU_MILLI)),
            DeviceAssignment::Fraction { gpus, milli, memory_mib } => {
                for &g in gpus {
                    let gpu_mem = node.gpus.get(g as usize).map_or(0, |d| d.memory_mib);
                    let by_mem = (memory_mib * u64::from(GPU_MILLI)).checked_div(gpu_mem).unwrap_or(0) as u32;
                    sub(g, (*milli).max(by_mem));
                }
            }
            DeviceAssignment::Mig { instances } => {
                let Some(geometry) = node.mig_geometry() else {
                    return;
                };
                for (g, placement) in instances {
                    let slices =
                        geometry.profile(&placement.profile).map_or(0, |p| u32::from(p.memory_slices));
                    sub(*g, slices * GPU_MILLI / u32::from(geometry.memory_slices));
                }
            }
            DeviceAssignment::Replicas { gpus } => {
                for &g in gpus {
                    let replicas = match node.gpus.get(g as usize).map(|d| &d.mode) {
                        Some(crate::model::GpuMode::TimeSliced { replicas }) => *replicas,
                        _ => 1,
                    };
                    sub(g, GPU_MILLI / replicas.max(1));
                }
            }
        }
    }

    /// The free milli-GPU of the node's GPUs.
    pub fn gpu_slice(&self) -> &[u16] {
        &self.gpus[..self.gpu_count as usize]
    }

    /// Total free milli-GPU.
    pub fn gpu_free_total(&self) -> u32 {
        self.gpu_slice().iter().map(|&g| u32::from(g)).sum()
    }
}
