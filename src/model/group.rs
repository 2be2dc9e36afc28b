//! Node groups: the cloud instance groups the autoscaler can grow and shrink.

use super::node::Node;
use serde::{Deserialize, Serialize};

/// Price in micro-dollars per hour; integers keep cost comparisons exact.
pub type MicroDollarsPerHour = u64;

/// Converts dollars per hour to [`MicroDollarsPerHour`].
pub fn dollars(per_hour: f64) -> MicroDollarsPerHour {
    (per_hour * 1_000_000.0).round().max(0.0) as u64
}

/// On-demand or spot capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// Regular, non-interruptible instances.
    #[default]
    OnDemand,
    /// Interruptible discounted instances.
    Spot,
}

/// Karpenter's capacity-type node label (`spot`, `on-demand`), which pods select to say whether
/// they accept spot capacity.
pub const KARPENTER_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";

/// gpuscale's capacity-type node label, with Karpenter's values, for clusters without Karpenter:
/// a pod with `nodeSelector: {gpuscale.io/capacity-type: on-demand}` is never planned onto spot
/// capacity, nor replaced onto it after an interruption.
pub const CAPACITY_TYPE_LABEL: &str = "gpuscale.io/capacity-type";

impl CapacityType {
    /// The value of both capacity-type labels.
    pub fn label_value(self) -> &'static str {
        match self {
            CapacityType::OnDemand => "on-demand",
            CapacityType::Spot => "spot",
        }
    }

    /// The labels every group's template carries, on every cloud, so that a pod's node selector
    /// or required affinity on either key decides whether it fits spot groups through the same
    /// matching as any other label (docs/spot.md).
    pub fn labels(self) -> [(&'static str, &'static str); 2] {
        [(KARPENTER_CAPACITY_TYPE, self.label_value()), (CAPACITY_TYPE_LABEL, self.label_value())]
    }
}

/// Lifecycle of one cloud instance as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum InstanceState {
    /// Being created (boot, join).
    Pending,
    /// Running.
    Running,
    /// Being terminated.
    Terminating,
    /// Creation failed; `class` says why (out-of-capacity, quota, other).
    Failed {
        /// Error class.
        class: ErrorClass,
        /// Provider's message.
        message: String,
    },
}

/// Classes of cloud errors that the planner reacts to differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorClass {
    /// The zone has no capacity for this instance type now.
    OutOfCapacity,
    /// An account quota or limit is exhausted.
    Quota,
    /// The API throttled the request.
    Throttled,
    /// Anything else.
    Other,
}

/// One instance of a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Instance {
    /// Provider id (`aws:///us-east-1a/i-0abc`, `gce://project/zone/name`), matching the node's
    /// `spec.providerID`.
    pub id: String,
    /// State.
    #[serde(flatten)]
    pub state: InstanceState,
}

/// A group of identical instances that the provider scales (an AWS Auto Scaling group, a GCP
/// managed instance group), with what a new node of it looks like and what it costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeGroup {
    /// Unique id, e.g. `aws/prod/gpu-a100-spot`.
    pub id: String,
    /// Account/project the group belongs to (from the provider config).
    pub account: String,
    /// Cloud instance type / machine type.
    pub instance_type: String,
    /// Zone new instances land in (a multi-zone group lists several in `zones`).
    pub zones: Vec<String>,
    /// On-demand or spot.
    pub capacity_type: CapacityType,
    /// Price of one instance.
    pub price: MicroDollarsPerHour,
    /// Smallest size the autoscaler may shrink the group to.
    pub min_size: u32,
    /// Largest size the autoscaler may grow the group to.
    pub max_size: u32,
    /// Desired size the provider is converging to.
    pub target_size: u32,
    /// Instances the provider reports.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// What a new node of this group looks like (allocatable, GPUs, labels, taints, zone).
    pub template: Node,
}

impl NodeGroup {
    /// The group's name within its account: the last segment of the id (`gpu-h100` of
    /// `aws/prod/gpu-h100`), which is what node-group labels on its nodes carry.
    pub fn name(&self) -> &str {
        self.id.rsplit('/').next().unwrap_or(&self.id)
    }
}
