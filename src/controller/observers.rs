//! The controller's [`Observer`]s beyond logging: Prometheus metrics, the health endpoints and the
//! status publisher (Events and ConfigMaps), each fed from the reconcile loop without blocking it.

use super::health::Health;
use super::metrics::Metrics;
use super::status::StatusHandle;
use super::Observer;
use crate::model::{ClusterSnapshot, NodeGroup};
use crate::planner::Plan;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counts and gauges for `/metrics`.
pub struct MetricsObserver(pub Arc<Metrics>);

impl Observer for MetricsObserver {
    fn plan_computed(&self, plan: &Plan, snapshot: &ClusterSnapshot, _dry_run: bool, elapsed: Duration) {
        self.0.observe_plan(plan, snapshot, elapsed);
    }
    fn scaled_up(&self, group: &str, from: u32, to: u32, _pods: &[String]) {
        self.0.scaled_up(group, to.saturating_sub(from));
    }
    fn replacement_requested(&self, _node: &str, group: &str, from: u32, to: u32) {
        self.0.scaled_up(group, to.saturating_sub(from));
    }
    fn scale_up_failed(&self, _group: &str, _error: &str) {
        self.0.error("scale_up");
    }
    fn drain_started(&self, _node: &str, _reason: &str) {}
    fn node_deleted(&self, _node: &str, group: &str) {
        self.0.scaled_down(group);
    }
    fn eviction_blocked(&self, _pod: &str, _node: &str, _reason: &str) {}
    fn drain_abandoned(&self, _node: &str, _group: &str, _reason: &str) {
        self.0.error("drain_abandoned");
    }
    fn backoff(&self, group: &str, _reason: &str) {
        self.0.backoff(group);
    }
    fn leadership(&self, leader: bool) {
        self.0.set_leader(leader);
    }
    fn groups_refreshed(&self, groups: &[NodeGroup]) {
        self.0.observe_groups(groups);
    }
    fn objects_refused(&self, refused: &[crate::k8s::RefusedObject]) {
        self.0.observe_refused(refused);
    }
}

/// `/readyz` once the caches are synced; `/healthz` fails when a leader's loop goes stale.
pub struct HealthObserver(pub Arc<Health>);

impl Observer for HealthObserver {
    fn plan_computed(&self, _: &Plan, _: &ClusterSnapshot, _: bool, _: Duration) {
        self.0.loop_completed(Instant::now());
    }
    fn scaled_up(&self, _: &str, _: u32, _: u32, _: &[String]) {}
    fn replacement_requested(&self, _: &str, _: &str, _: u32, _: u32) {}
    fn scale_up_failed(&self, _: &str, _: &str) {}
    fn drain_started(&self, _: &str, _: &str) {}
    fn node_deleted(&self, _: &str, _: &str) {}
    fn eviction_blocked(&self, _: &str, _: &str, _: &str) {}
    fn backoff(&self, _: &str, _: &str) {}
    fn caches_synced(&self) {
        self.0.set_synced(true);
    }
    fn leadership(&self, leader: bool) {
        self.0.set_leader(leader, Instant::now());
    }
}

/// Kubernetes Events and status ConfigMaps through the publisher's background task.
pub struct StatusObserver {
    handle: StatusHandle,
    /// The groups of the current pass, for the plan's per-group ConfigMaps.
    groups: Mutex<Vec<NodeGroup>>,
}

impl StatusObserver {
    /// Publishes through `handle` (from [`super::status::StatusPublisher::spawn`]).
    pub fn new(handle: StatusHandle) -> Self {
        Self { handle, groups: Mutex::new(Vec::new()) }
    }
}

impl Observer for StatusObserver {
    fn plan_computed(&self, plan: &Plan, snapshot: &ClusterSnapshot, dry_run: bool, _elapsed: Duration) {
        self.handle.begin_loop();
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.handle.publish_plan(plan, &groups, Some(snapshot), dry_run);
    }
    fn scaled_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
        self.handle.scale_up(group, from, to, pods);
    }
    fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32) {
        self.handle.replacement_requested(node, group, from, to);
    }
    fn scale_up_failed(&self, group: &str, error: &str) {
        self.handle.scale_up_failed(group, error);
    }
    fn drain_started(&self, node: &str, reason: &str) {
        self.handle.drain_started(node, reason);
    }
    fn node_deleted(&self, node: &str, group: &str) {
        self.handle.node_deleted(node, group);
    }
    fn eviction_blocked(&self, pod: &str, node: &str, reason: &str) {
        self.handle.eviction_blocked(pod, node, reason);
    }
    fn drain_abandoned(&self, node: &str, group: &str, reason: &str) {
        self.handle.scale_down_failed(node, group, &format!("drain abandoned, node kept: {reason}"));
    }
    fn backoff(&self, _group: &str, _reason: &str) {
        // The backoff's end is the provider's; the `ScaleUpFailed` event already says why.
    }
    fn preempted(&self, victim: &str, node: &str, preemptor: &str, reason: &str) {
        self.handle.preempted(victim, node, preemptor, reason);
    }
    fn groups_refreshed(&self, groups: &[NodeGroup]) {
        *self.groups.lock().unwrap_or_else(|e| e.into_inner()) = groups.to_vec();
    }
    fn objects_refused(&self, refused: &[crate::k8s::RefusedObject]) {
        self.handle.objects_refused(refused);
    }
    fn request_condition(
        &self,
        request: &str,
        uid: Option<&str>,
        condition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
    ) {
        self.handle.request_condition(request, uid, condition);
    }
}
