//! The cluster model: what a node offers, what a workload asks for, and what is allocated where.
//!
//! Everything here is plain data with integer quantities (milli-CPU, bytes, milli-GPU), so that
//! decisions are exact and deterministic.

mod catalog;
pub mod cel;
mod demand;
mod device;
pub mod dra;
mod group;
mod labels;
pub mod mig;
pub mod names;
mod node;
mod notice;
pub mod provisioning;
mod resources;
mod snapshot;
pub mod telemetry;
mod workload;

pub use catalog::{vgpu_profile, GpuCatalog, GpuModelSpec};
pub use demand::GpuDemand;
pub use device::{DeviceAssignment, GpuDevice, GpuMode, MigInstance, MIG_SLOTS};
pub use group::{
    dollars, CapacityType, ErrorClass, Instance, InstanceState, MicroDollarsPerHour, NodeGroup,
    CAPACITY_TYPE_LABEL, KARPENTER_CAPACITY_TYPE,
};
pub use labels::Labels;
pub use node::{
    GpuTopology, GpusHeld, Node, NodeId, NodeLifecycle, NodeState, Taint, TaintEffect, DISRUPTING_TAINT,
    GKE_ACCELERATOR_COUNT_LABEL, GKE_MAX_SHARED_CLIENTS_LABEL, GKE_PARTITION_SIZE_LABEL,
    GKE_SHARING_STRATEGY_LABEL, HOSTNAME_LABEL,
};
pub use notice::{Notice, NoticeKind};
pub use provisioning::{ProvisioningClass, ProvisioningRequest};
pub use resources::{Resources, GPU_MILLI};
pub use snapshot::ClusterSnapshot;
pub use telemetry::{
    GpuSample, IdleTracker, MigSample, NodeTelemetry, TelemetrySettings, TELEMETRY_ANNOTATION,
};
pub use workload::{
    DisruptionBudget, DrainRules, HostPort, LabelSelector, NodeSelectorRequirement, OwnerKind,
    PodAffinityTerm, PodIdentity, Preferences, SelectorOperator, SpreadConstraint, Toleration,
    TolerationOperator, VolumeNeed, Workload, WorkloadId, DEFAULT_GRACE_SECONDS, DEFAULT_SCHEDULER,
    VOLUME_TOPOLOGY_LABELS,
};
