//! Interruption notices: the cloud's warning that an instance will be taken away.
//!
//! A spot instance is reclaimed two minutes after its warning on AWS and thirty seconds after on
//! GCP; a rebalance recommendation says only that its pool is at higher risk; a scheduled
//! maintenance event stops or reboots it at a set time. Each source (the AWS interruption queue,
//! the node agent reading the metadata service, a Node's taint, the simulated cloud) is turned
//! into this one shape so that the decision step (`planner::interruption`) reacts to all of them
//! by the same rules, in the controller and in the replays.

use serde::{Deserialize, Serialize};

/// What the cloud announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeKind {
    /// The instance will be reclaimed at the deadline (AWS "EC2 Spot Instance Interruption
    /// Warning", GCP preemption).
    SpotInterruption,
    /// The instance's spot pool is at elevated risk of interruption; nothing is reclaimed yet
    /// (AWS "EC2 Instance Rebalance Recommendation").
    Rebalance,
    /// Maintenance will stop, reboot or retire the instance at the deadline (AWS Health
    /// scheduled change, GCP `maintenance-event`).
    ScheduledMaintenance,
    /// The instance is stopping or terminating now (AWS "EC2 Instance State-change
    /// Notification"): there is no window left to work in.
    Terminating,
}

impl NoticeKind {
    /// Whether the instance is going away: everything but a rebalance recommendation.
    pub fn is_disruptive(self) -> bool {
        self != NoticeKind::Rebalance
    }

    /// Whether the instance goes whatever gpuscale does (reclaimed, stopped for maintenance,
    /// terminating): its drain is not a voluntary disruption, so minimum sizes and the scale-down
    /// parallelism do not hold it back, as Karpenter's interruption controller acts outside its
    /// disruption budgets. A rebalance recommendation is voluntary.
    pub fn is_involuntary(self) -> bool {
        self != NoticeKind::Rebalance
    }

    /// Short name for reasons and logs.
    pub fn name(self) -> &'static str {
        match self {
            NoticeKind::SpotInterruption => "spot interruption",
            NoticeKind::Rebalance => "rebalance recommendation",
            NoticeKind::ScheduledMaintenance => "scheduled maintenance",
            NoticeKind::Terminating => "instance terminating",
        }
    }
}

/// One notice about one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// What was announced.
    pub kind: NoticeKind,
    /// The instance: a provider id (`aws:///us-east-1a/i-0abc`, `gce://p/zone/name`) or a bare
    /// cloud instance id (`i-0abc`), matched against the nodes' `spec.providerID`.
    pub instance: String,
    /// When the notice was issued, seconds (Unix time in the controller, virtual in replays).
    pub issued_at: i64,
    /// When the instance goes, if announced (spot: issue time + 120 s on AWS, + 30 s on GCP).
    pub deadline: Option<i64>,
}

impl Notice {
    /// Whether `provider_id` names this notice's instance (a full id, or its last segment).
    pub fn is_for(&self, provider_id: &str) -> bool {
        provider_id == self.instance || provider_id.rsplit('/').next() == Some(self.instance.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_match_full_and_bare_instance_ids() {
        let n = Notice {
            kind: NoticeKind::SpotInterruption,
            instance: "i-0abc".into(),
            issued_at: 0,
            deadline: None,
        };
        assert!(n.is_for("aws:///us-east-1a/i-0abc"));
        assert!(n.is_for("i-0abc"));
        assert!(!n.is_for("aws:///us-east-1a/i-0abcd"));
        let full = Notice { instance: "gce://p/us-central1-a/n-1".into(), ..n };
        assert!(full.is_for("gce://p/us-central1-a/n-1"));
        assert!(!full.is_for("gce://p/us-central1-b/n-1"));
    }
}
