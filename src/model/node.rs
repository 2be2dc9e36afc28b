//! A node: its capacity, its GPUs and their topology, and how it may be scheduled onto.

use super::catalog::GpuCatalog;
use super::device::{DeviceAssignment, GpuDevice, GpuMode, MigInstance};
use super::mig::MigGeometry;
use super::resources::{Resources, GPU_MILLI};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Index of a node in a [`super::ClusterSnapshot`].
pub type NodeId = usize;

/// Effect of a taint, as in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    /// Pods without a toleration are not scheduled.
    NoSchedule,
    /// Pods without a toleration are avoided (never blocks placement).
    PreferNoSchedule,
    /// Pods without a toleration are evicted.
    NoExecute,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    #[serde(default)]
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// Lifecycle state that matters for scaling decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum NodeState {
    /// Ready and advertising its GPUs.
    #[default]
    Ready,
    /// Registered but not yet Ready, or Ready while the device plugin has not advertised the GPUs
    /// its instance type carries. Counts as capacity that is on its way, never as an empty node.
    Initializing,
    /// Requested from the cloud but not registered yet (planner's in-flight capacity).
    Upcoming,
    /// Marked for deletion or being drained.
    Deleting,
    /// Registered long ago but not capacity now: NotReady, or Ready while its GPUs regressed
    /// (device plugin restarting, MIG manager re-partitioning, an unhealthy GPU). Not capacity,
    /// takes no pending pods, and goes only through the drain path, after the unready time
    /// (Cluster Autoscaler's `scale-down-unready-time`).
    Unready,
}

/// Why a Ready node's GPUs are not (all) advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GpusHeld {
    /// A GPU node whose device plugin advertises no GPUs.
    DevicePlugin,
    /// The MIG manager is applying a layout (`nvidia.com/mig.config.state` pending or rebooting).
    MigReconfiguring,
}

/// What a Node object says of where the node is in its life: the evidence
/// [`crate::planner::readiness::judge_nodes`] reads to tell a starting node from an unready one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeLifecycle {
    /// `metadata.creationTimestamp`, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
    /// The Ready condition is not True.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_ready: bool,
    /// When the Ready condition last changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_changed_at: Option<i64>,
    /// Ready, but its GPUs are held back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_held: Option<GpusHeld>,
    /// The GPU device plugin is disabled on it (`nvidia.com/gpu.deploy.device-plugin=false`, as
    /// on nodes whose GPUs NVIDIA's DRA driver publishes): it never advertises `nvidia.com/gpu`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub device_plugin_disabled: bool,
    /// The MIG manager reports its layout applied (`nvidia.com/mig.config.state=success`): the MIG
    /// instances the node advertises are its GPUs, whatever layout its group's config names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mig_layout_applied: bool,
    /// Since when it has been unready, where no condition says it (a GPU regression): the
    /// controller keeps this between passes; a plan of a snapshot does not know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready_since: Option<i64>,
}

impl NodeLifecycle {
    /// Whether nothing is known (a hand-made node).
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// How a node's GPUs are connected.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct GpuTopology {
    /// NUMA node of each GPU (by GPU index); empty = all on one.
    #[serde(default)]
    pub numa: Vec<u8>,
    /// NVLink domain of each GPU; GPUs in the same domain talk over NVLink/NVSwitch. Empty = no
    /// NVLink.
    #[serde(default)]
    pub nvlink_domain: Vec<u8>,
    /// Multi-node NVLink clique (`nvidia.com/gpu.clique`), for GB200-class racks.
    #[serde(default)]
    pub clique: Option<String>,
}

impl GpuTopology {
    /// NUMA node of a GPU.
    pub fn numa_of(&self, gpu: u8) -> u8 {
        self.numa.get(gpu as usize).copied().unwrap_or(0)
    }

    /// NVLink domain of a GPU, `None` without NVLink.
    pub fn nvlink_of(&self, gpu: u8) -> Option<u8> {
        self.nvlink_domain.get(gpu as usize).copied()
    }

    /// The usual layout of an `n`-GPU server: NVSwitch (one domain) when `nvlink`, GPUs split
    /// evenly over two NUMA nodes when there are more than two.
    pub fn uniform(n: usize, nvlink: bool) -> Self {
        let numa = if n > 2 { (0..n).map(|i| (i * 2 / n) as u8).collect() } else { vec![] };
        let nvlink_domain = if nvlink && n > 1 { vec![0; n] } else { vec![] };
        Self { numa, nvlink_domain, clique: None }
    }
}

/// The taint gpuscale puts on a node it drains, once the drain has evicted a pod.
pub const DISRUPTING_TAINT: &str = "gpuscale.io/disrupting";

/// The label every node carries with its own name (the `kubernetes.io/hostname` topology).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// GKE's labels on the nodes of a GPU node pool created with GPU sharing: the strategy
/// (`time-sharing`, `mps`), clients per GPU, the MIG partition size (partitions are then
/// advertised as `nvidia.com/gpu`), and the GPUs per node.
pub const GKE_SHARING_STRATEGY_LABEL: &str = "cloud.google.com/gke-gpu-sharing-strategy";
/// See [`GKE_SHARING_STRATEGY_LABEL`].
pub const GKE_MAX_SHARED_CLIENTS_LABEL: &str = "cloud.google.com/gke-max-shared-clients-per-gpu";
/// See [`GKE_SHARING_STRATEGY_LABEL`].
pub const GKE_PARTITION_SIZE_LABEL: &str = "cloud.google.com/gke-gpu-partition-size";
/// See [`GKE_SHARING_STRATEGY_LABEL`].
pub const GKE_ACCELERATOR_COUNT_LABEL: &str = "cloud.google.com/gke-accelerator-count";

/// A schedulable node (or a node that a scale-up would create).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Node {
    /// Kubernetes node name.
    pub name: String,
    /// CPU and memory that pods may request.
    pub allocatable: Resources,
    /// CPU and memory requested by the pods on it.
    #[serde(default)]
    pub allocated: Resources,
    /// Canonical GPU model name (see [`GpuCatalog`]); `None` for CPU-only nodes.
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// GPU devices.
    #[serde(default)]
    pub gpus: Vec<GpuDevice>,
    /// GPU interconnect.
    #[serde(default)]
    pub topology: GpuTopology,
    /// Node labels.
    #[serde(default)]
    pub labels: super::Labels,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// `topology.kubernetes.io/zone`.
    #[serde(default)]
    pub zone: Option<String>,
    /// Node group / instance group the node belongs to; a node outside any group is static
    /// capacity that no autoscaler gives back, so placement does not try to keep it empty.
    #[serde(default)]
    pub node_group: Option<String>,
    /// Cloud instance type.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// Cloud provider id (`aws:///us-east-1a/i-...`, `gce://project/zone/name`).
    #[serde(default)]
    pub provider_id: Option<String>,
    /// Cordoned.
    #[serde(default)]
    pub unschedulable: bool,
    /// Lifecycle state.
    #[serde(default)]
    pub state: NodeState,
    /// The evidence of its state.
    #[serde(default, skip_serializing_if = "NodeLifecycle::is_empty")]
    pub lifecycle: NodeLifecycle,
    /// `cluster-autoscaler.kubernetes.io/scale-down-disabled` or `karpenter.sh/do-not-disrupt`.
    #[serde(default)]
    pub scale_down_disabled: bool,
    /// GPU telemetry the `gpuscale agent` published on the node (`gpuscale.io/gpu-telemetry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<super::telemetry::NodeTelemetry>,
    /// Most pods the node takes (allocatable `pods`); 0 = no limit known.
    #[serde(default)]
    pub max_pods: u32,
    /// Pods on it.
    #[serde(default)]
    pub pod_count: u32,
    /// Allocatable amounts of every resource other than CPU, memory, pods and GPUs (see
    /// [`super::Workload::extended`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended_allocatable: BTreeMap<String, u64>,
    /// What its pods request of those.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended_allocated: BTreeMap<String, u64>,
    /// Host ports its pods bind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<super::workload::HostPort>,
    /// Devices it reaches through DRA ResourceSlices, and the claims holding them.
    #[serde(default, skip_serializing_if = "super::dra::DraInventory::is_empty")]
    pub dra: super::dra::DraInventory,
    /// The pods on it that pod affinity and spread can see (derived, not serialised).
    #[serde(skip)]
    pub residents: Vec<std::sync::Arc<super::workload::PodIdentity>>,
}

impl Node {
    /// MIG geometry of the node's GPU model, when its GPUs are in MIG mode.
    pub fn mig_geometry(&self) -> Option<&'static MigGeometry> {
        if !self.gpus.iter().any(|d| matches!(d.mode, GpuMode::Mig { .. })) {
            return None;
        }
        self.gpu_model.as_deref().and_then(|m| GpuCatalog.resolve(m)).and_then(|m| m.mig)
    }

    /// CPU and memory still free.
    pub fn free(&self) -> Resources {
        self.allocatable.checked_sub(&self.allocated).unwrap_or_default()
    }

    /// Total GPU capacity in milli-GPU.
    pub fn gpu_milli_capacity(&self) -> u64 {
        self.gpus.len() as u64 * u64::from(GPU_MILLI)
    }

    /// Free GPU capacity in milli-GPU.
    pub fn gpu_milli_free(&self) -> u64 {
        let g = self.mig_geometry();
        self.gpus.iter().map(|d| u64::from(d.free_milli(g))).sum()
    }

    /// Share of the node's GPUs that pods hold, 0..=1 ([`GpuDevice::allocated_milli`]).
    pub fn gpu_allocation(&self) -> f64 {
        let g = self.mig_geometry();
        let used: u64 = self.gpus.iter().map(|d| u64::from(d.allocated_milli(g))).sum();
        used as f64 / self.gpu_milli_capacity().max(1) as f64
    }

    /// Number of GPUs with nothing allocated.
    pub fn idle_gpus(&self) -> usize {
        self.gpus.iter().filter(|d| d.is_idle()).count()
    }

    /// Records a workload's CPU, memory and devices on the node. The caller has checked that
    /// they fit (the scheduler's device selection only returns fitting assignments).
    pub fn allocate(&mut self, requests: &Resources, devices: &DeviceAssignment) {
        self.allocated = self.allocated.saturating_add(requests);
        self.apply_devices(devices, true);
    }

    /// Records a pod on the node: [`Self::allocate`] plus its pod slot, extended resources and
    /// host ports.
    pub fn allocate_pod(&mut self, w: &super::Workload, devices: &DeviceAssignment) {
        self.allocate(&w.requests, devices);
        self.pod_count += 1;
        for (k, v) in &w.extended {
            *self.extended_allocated.entry(k.clone()).or_default() += v;
        }
        self.host_ports.extend(w.host_ports.iter().cloned());
        if let Some(id) = &w.identity {
            self.residents.push(id.clone());
        }
        if !w.dra_claims.is_empty() {
            // The same choice the fit check made (a pure function of node and claims); claims
            // that do not fit are not recorded (the caller checked they do).
            let chosen = self.dra.allocate(&w.dra_claims).unwrap_or_default();
            self.dra.hold(&w.dra_claims, chosen);
        }
    }

    /// Takes a pod off the node: the reverse of [`Self::allocate_pod`].
    pub fn release_pod(&mut self, w: &super::Workload, devices: &DeviceAssignment) {
        self.release(&w.requests, devices);
        self.dra.release(&w.dra_claims);
        self.pod_count = self.pod_count.saturating_sub(1);
        for (k, v) in &w.extended {
            if let Some(a) = self.extended_allocated.get_mut(k) {
                *a = a.saturating_sub(*v);
            }
        }
        for p in &w.host_ports {
            if let Some(i) = self.host_ports.iter().position(|x| x == p) {
                self.host_ports.swap_remove(i);
            }
        }
        if let Some(id) = &w.identity {
            if let Some(i) = self.residents.iter().position(|x| std::sync::Arc::ptr_eq(x, id)) {
                self.residents.swap_remove(i);
            }
        }
    }

    /// Returns a workload's CPU, memory and devices to the node.
    pub fn release(&mut self, requests: &Resources, devices: &DeviceAssignment) {
        self.allocated = self.allocated.checked_sub(requests).unwrap_or_default();
        self.apply_devices(devices, false);
    }

    fn apply_devices(&mut self, devices: &DeviceAssignment, add: bool) {
        let adjust_u32 = |v: &mut u32, d: u32| *v = if add { *v + d } else { v.saturating_sub(d) };
        match devices {
            DeviceAssignment::None => {}
            DeviceAssignment::Whole { gpus } => {
                for &g in gpus {
                    if let Some(d) = self.gpus.get_mut(g as usize) {
                        adjust_u32(&mut d.used_milli, GPU_MILLI);
                    }
                }
            }
            DeviceAssignment::Fraction { gpus, milli, memory_mib } => {
                for &g in gpus {
                    if let Some(d) = self.gpus.get_mut(g as usize) {
                        adjust_u32(&mut d.used_milli, *milli);
                        d.used_memory_mib = if add {
                            d.used_memory_mib + memory_mib
                        } else {
                            d.used_memory_mib.saturating_sub(*memory_mib)
                        };
                    }
                }
            }
            DeviceAssignment::Mig { instances } => {
                for (g, placement) in instances {
                    let Some(d) = self.gpus.get_mut(*g as usize) else {
                        continue;
                    };
                    let GpuMode::Mig { instances: configured, dynamic } = &mut d.mode else {
                        continue;
                    };
                    match configured.iter_mut().find(|i| &i.placement == placement) {
                        Some(inst) => inst.used = add,
                        None if add => {
                            configured.push(MigInstance { placement: placement.clone(), used: true })
                        }
                        None => {}
                    }
                    if !add && *dynamic {
                        // Dynamically created instances are destroyed when released.
                        configured.retain(|i| i.used || &i.placement != placement);
                    }
                }
            }
            DeviceAssignment::Replicas { gpus } => {
                for &g in gpus {
                    if let Some(d) = self.gpus.get_mut(g as usize) {
                        adjust_u32(&mut d.used_replicas, 1);
                    }
                }
            }
        }
    }
}
