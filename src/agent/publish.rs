//! Publishing telemetry as the node annotation: when to write (pure) and the write itself.

use crate::model::{NodeTelemetry, NoticeKind, TELEMETRY_ANNOTATION};
use crate::planner::interruption::INTERRUPTION_TAINT;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};

/// When the agent writes the annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishPolicy {
    /// Rewrite at least this often (seconds), so readers can tell a live agent from a dead one.
    pub refresh_secs: u64,
    /// Never write more often than this (seconds), whatever changes: a rate limit on the
    /// API server load of a large fleet.
    pub min_gap_secs: u64,
}

impl Default for PublishPolicy {
    fn default() -> Self {
        Self { refresh_secs: 300, min_gap_secs: 30 }
    }
}

/// What was last written, and when the last attempt was.
#[derive(Debug, Clone, Default)]
pub struct PublishState {
    written: Option<NodeTelemetry>,
    last_attempt: Option<u64>,
}

impl PublishState {
    /// Whether to write `next` now (`now` in Unix seconds): first time; not within the rate
    /// limit of the last attempt; then when it differs materially or the last write is due for a
    /// refresh.
    pub fn due(&self, policy: &PublishPolicy, next: &NodeTelemetry, now: u64) -> bool {
        if self.last_attempt.is_some_and(|t| now.saturating_sub(t) < policy.min_gap_secs) {
            return false;
        }
        match &self.written {
            None => true,
            Some(old) => {
                next.materially_differs(old) || now.saturating_sub(old.sampled_at) >= policy.refresh_secs
            }
        }
    }

    /// Records a write attempt and, when it succeeded, what was written.
    pub fn attempted(&mut self, t: &NodeTelemetry, now: u64, ok: bool) {
        self.last_attempt = Some(now);
        if ok {
            self.written = Some(t.clone());
        }
    }
}

/// Writes the annotation on one node with a JSON merge patch that touches only that key.
#[derive(Clone)]
pub struct NodeAnnotator {
    api: Api<Node>,
    node: String,
}

impl NodeAnnotator {
    /// An annotator for `node` through `client`.
    pub fn new(client: kube::Client, node: String) -> Self {
        Self { api: Api::all(client), node }
    }

    /// The merge patch body for a telemetry value.
    pub fn patch_body(t: &NodeTelemetry) -> serde_json::Value {
        serde_json::json!({ "metadata": { "annotations": { TELEMETRY_ANNOTATION: t.encode() } } })
    }

    /// Patches the node.
    pub async fn publish(&self, t: &NodeTelemetry) -> Result<(), kube::Error> {
        let params = PatchParams::default();
        self.api.patch(&self.node, &params, &Patch::Merge(Self::patch_body(t))).await.map(|_| ())
    }
}

/// The Node condition the agent sets beside its taint while a notice is active (status `True`,
/// reason the notice kind in CamelCase): what `kubectl describe node`, alerts and other tools
/// read, as node-problem-detector's conditions.
pub const INTERRUPTION_CONDITION: &str = "InterruptionNotice";

/// The condition's reason for a notice kind.
fn condition_reason(kind: NoticeKind) -> &'static str {
    match kind {
        NoticeKind::SpotInterruption => "SpotInterruption",
        NoticeKind::Rebalance => "RebalanceRecommendation",
        NoticeKind::ScheduledMaintenance => "ScheduledMaintenance",
        NoticeKind::Terminating => "InstanceTerminating",
    }
}

impl NodeAnnotator {
    /// Sets the [`INTERRUPTION_CONDITION`] for `kind` in the node's status (keeping every other
    /// condition), guarded by the resourceVersion like the taint. Returns whether it wrote.
    async fn set_interruption_condition(&self, kind: NoticeKind) -> Result<bool, kube::Error> {
        let node = self.api.get(&self.node).await?;
        let mut conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        let reason = condition_reason(kind);
        if conditions.iter().any(|c| {
            c.type_ == INTERRUPTION_CONDITION && c.status == "True" && c.reason.as_deref() == Some(reason)
        }) {
            return Ok(false);
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        conditions.retain(|c| c.type_ != INTERRUPTION_CONDITION);
        conditions.push(NodeCondition {
            type_: INTERRUPTION_CONDITION.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(format!(
                "{} notice from the instance metadata service (gpuscale agent)",
                kind.name()
            )),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": node.metadata.resource_version },
            "status": { "conditions": conditions },
        });
        self.api.patch_status(&self.node, &PatchParams::default(), &Patch::Merge(patch)).await?;
        Ok(true)
    }

    /// Puts the `gpuscale.io/interruption=<kind>:NoSchedule` taint on the node (replacing one of
    /// another kind, keeping every other taint), with a merge patch of the taint list guarded
    /// by the resourceVersion it was read at: a concurrent change of the node makes it fail
    /// (409) rather than drop someone else's taint, and the caller tries again. Returns whether
    /// it wrote (nothing when the taint and the condition already say `kind`). The taint comes
    /// first: it is what keeps new pods off and what the controller reads.
    pub async fn mark_interruption(&self, kind: NoticeKind) -> Result<bool, kube::Error> {
        let tainted = self.taint_interruption(kind).await?;
        let conditioned = self.set_interruption_condition(kind).await?;
        Ok(tainted || conditioned)
    }

    async fn taint_interruption(&self, kind: NoticeKind) -> Result<bool, kube::Error> {
        let value =
            serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let node = self.api.get(&self.node).await?;
        let mut taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        if taints.iter().any(|t| t.key == INTERRUPTION_TAINT && t.value.as_deref() == Some(&value)) {
            return Ok(false);
        }
        taints.retain(|t| t.key != INTERRUPTION_TAINT);
        taints.push(Taint {
            key: INTERRUPTION_TAINT.into(),
            value: Some(value),
            effect: "NoSchedule".into(),
            time_added: None,
        });
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": node.metadata.resource_version },
            "spec": { "taints": taints },
        });
        self.api.patch(&self.node, &PatchParams::default(), &Patch::Merge(patch)).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpuSample;

    fn sample(t: u64, util: u8) -> NodeTelemetry {
        NodeTelemetry {
            sampled_at: t,
            gpus: vec![GpuSample {
                index: 0,
                uuid: "GPU-a".into(),
                model: "L4".into(),
                utilization_pct: Some(util),
                memory_used_bytes: 0,
                memory_total_bytes: 24 << 30,
                ecc_errors: 0,
                healthy: true,
                mig: vec![],
                idle_since: None,
            }],
        }
    }

    #[test]
    fn writes_on_change_or_refresh_within_the_rate_limit() {
        let policy = PublishPolicy { refresh_secs: 300, min_gap_secs: 30 };
        let mut state = PublishState::default();
        assert!(state.due(&policy, &sample(0, 50), 0), "first sample is written");
        state.attempted(&sample(0, 50), 0, true);
        assert!(!state.due(&policy, &sample(15, 0), 15), "rate limit holds even for a big change");
        assert!(!state.due(&policy, &sample(45, 55), 45), "jitter is not written");
        assert!(state.due(&policy, &sample(45, 0), 45), "a material change is");
        assert!(state.due(&policy, &sample(300, 55), 300), "refresh after 5 minutes");
        // A failed write is retried after the rate limit, not at once.
        state.attempted(&sample(45, 0), 45, false);
        assert!(!state.due(&policy, &sample(60, 0), 60));
        assert!(state.due(&policy, &sample(75, 0), 75));
        let body = NodeAnnotator::patch_body(&sample(1, 2));
        let value = body["metadata"]["annotations"][TELEMETRY_ANNOTATION].as_str().unwrap();
        assert_eq!(NodeTelemetry::decode("n", value).unwrap(), sample(1, 2));
    }
}
