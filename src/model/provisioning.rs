//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`): capacity asked for pods that do not exist
//! yet, the way Kueue's ProvisioningRequest admission check asks an autoscaler before it admits
//! a job.
//!
//! A request names pod templates and counts (its pod sets) and a provisioning class; its status
//! conditions are its lifecycle. The conversion reads both; the planner decides what the request
//! gets (`crate::planner::provisioning`), and the controller writes the conditions back.

use super::workload::Workload;
use serde::{Deserialize, Serialize};

/// `check-capacity`: can the pods fit the nodes that exist now? Book them; never scale.
pub const CHECK_CAPACITY_CLASS: &str = "check-capacity.autoscaling.x-k8s.io";
/// `best-effort-atomic-scale-up`: grow what every pod set needs, all or nothing.
pub const ATOMIC_SCALE_UP_CLASS: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
/// The pod annotation naming the request (in the pod's namespace) whose capacity a pod uses.
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
/// The older spelling Cluster Autoscaler still reads.
pub const CONSUME_ANNOTATION_LEGACY: &str = "cluster-autoscaler.kubernetes.io/consume-provisioning-request";

/// The classes gpuscale serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProvisioningClass {
    /// [`CHECK_CAPACITY_CLASS`].
    CheckCapacity,
    /// [`ATOMIC_SCALE_UP_CLASS`].
    AtomicScaleUp,
}

impl ProvisioningClass {
    /// The class a `provisioningClassName` names, if gpuscale serves it.
    pub fn of(name: &str) -> Option<Self> {
        match name {
            CHECK_CAPACITY_CLASS => Some(Self::CheckCapacity),
            ATOMIC_SCALE_UP_CLASS => Some(Self::AtomicScaleUp),
            _ => None,
        }
    }
}

/// One pod set: `count` pods like `pod`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// The PodTemplate's name (same namespace as the request).
    pub template: String,
    /// How many pods.
    pub count: u32,
    /// One pod of the set, converted from the template as a pending pod (its id is the
    /// template's `namespace/name`).
    pub pod: Workload,
}

/// Where a request is in its lifecycle, from its status conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum RequestPhase {
    /// No decision yet (new, or `Accepted` and waiting for capacity).
    Open,
    /// `Provisioned=True` since `since` (seconds since the epoch): its capacity is booked.
    Provisioned {
        /// When the condition turned true.
        since: i64,
    },
    /// `Failed=True`, `BookingExpired=True` or `CapacityRevoked=True`: nothing more to do.
    Finished,
}

/// A ProvisioningRequest as the planner needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequest {
    /// `namespace/name`.
    pub id: String,
    /// `spec.provisioningClassName`.
    pub class_name: String,
    /// Its pod sets; empty when [`Self::invalid`] says why.
    pub pod_sets: Vec<PodSet>,
    /// Creation time, seconds since the epoch.
    pub created_at: Option<i64>,
    /// Its lifecycle so far.
    pub phase: RequestPhase,
    /// Seconds booked capacity is held after `Provisioned` before the booking expires.
    pub booking_seconds: i64,
    /// Seconds after creation an undecided request fails as expired.
    pub expiry_seconds: i64,
    /// The reason of its `Provisioned` condition while that is not true (what the last plan
    /// said: a scale-up under way, capacity not found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<String>,
    /// Why it cannot be served as written (a missing PodTemplate, an invalid template), in
    /// words for its `Failed` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
    /// `parameters.noRetry: "true"`: capacity not found fails the request (Kueue then retries
    /// with a new one) instead of leaving it waiting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_retry: bool,
}

impl ProvisioningRequest {
    /// The class it asks for, if gpuscale serves it.
    pub fn class(&self) -> Option<ProvisioningClass> {
        ProvisioningClass::of(&self.class_name)
    }

    /// Pods it asks for in all.
    pub fn pod_count(&self) -> u32 {
        self.pod_sets.iter().map(|s| s.count).sum()
    }
}

/// Cluster Autoscaler's defaults, which Kueue is built against: booked capacity is held for
/// 10 minutes after `Provisioned`, and a request not provisioned within a week fails.
pub const DEFAULT_BOOKING_SECONDS: i64 = 10 * 60;
/// See [`DEFAULT_BOOKING_SECONDS`].
pub const DEFAULT_EXPIRY_SECONDS: i64 = 7 * 24 * 3600;
