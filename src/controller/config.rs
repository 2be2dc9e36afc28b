//! The `controller:` section of the gpuscale config file: how the in-cluster loop batches, drains,
//! waits for new nodes and elects its leader.

use crate::planner::decide::DecideSettings;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Controller knobs. Times are in seconds (fractions allowed) so one file reads the same for
/// people and for tests that shrink them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ControllerConfig {
    /// Namespace of the leader-election Lease; default: `$POD_NAMESPACE`, else `gpuscale-system`.
    pub namespace: Option<String>,
    /// A batch of new pending pods closes after this long without a new one.
    pub batch_idle_seconds: f64,
    /// A batch closes at the latest this long after its first pod.
    pub batch_max_seconds: f64,
    /// Reconcile at least this often, even without cluster events (drains, readiness, cloud).
    pub resync_seconds: f64,
    /// A node must be planned for removal this long, without interruption, before its drain
    /// starts (Cluster Autoscaler's `scale-down-unneeded-time`).
    pub scale_down_unneeded_seconds: f64,
    /// An unready node (NotReady, or its GPUs regressed) becomes a scale-down candidate after this
    /// long, through the drain path and only when its pods fit elsewhere (Cluster Autoscaler's
    /// `scale-down-unready-time`).
    pub scale_down_unready_seconds: f64,
    /// Most nodes being drained or removed at once, counting those already under way (Cluster
    /// Autoscaler's `max-scale-down-parallelism`, 10).
    pub max_scale_down_parallelism: u32,
    /// Longest wait for an evicted pod to terminate, whatever its own grace period.
    pub drain_grace_cap_seconds: f64,
    /// A drain that has not finished after this long is abandoned and the node un-cordoned.
    pub drain_timeout_seconds: f64,
    /// Protection of running training jobs.
    pub training: TrainingProtection,
    /// A new instance whose node has not registered and become Ready with its GPUs after this
    /// long is removed and its group backed off (Cluster Autoscaler's `max-node-provision-time`).
    pub registration_timeout_seconds: f64,
    /// How long a gang scale-up waits for all its instances to run before rolling back.
    pub gang_timeout_seconds: f64,
    /// Leader election.
    pub lease: LeaseConfig,
    /// How notices of interruption (spot, rebalance, maintenance) are acted on.
    pub interruptions: crate::planner::interruption::InterruptionSettings,
}

/// Running training jobs are not evicted before they have run `minRuntimeSeconds`, unless their
/// checkpoint annotation says they saved their state recently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrainingProtection {
    /// Minimum runtime before a training pod may be evicted (0 disables the protection).
    pub min_runtime_seconds: f64,
    /// Pod annotation holding the RFC 3339 time of the job's last checkpoint.
    pub checkpoint_annotation: String,
    /// A checkpoint at most this old makes the pod evictable before its minimum runtime.
    pub checkpoint_max_age_seconds: f64,
}

/// Lease-based leader election (`coordination.k8s.io/v1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// `leaseDurationSeconds`: how long a holder's claim lasts without renewal; another replica
    /// takes the Lease over only after seeing it unrenewed this long.
    pub duration_seconds: u32,
    /// How often the holder renews and a candidate retries (client-go's `RetryPeriod`).
    pub renew_seconds: f64,
    /// The holder stops acting when it has not renewed for this long (client-go's
    /// `RenewDeadline`); below `durationSeconds`, so it stops before anyone can take over.
    pub renew_deadline_seconds: f64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            batch_idle_seconds: 1.0,
            batch_max_seconds: 10.0,
            resync_seconds: 10.0,
            scale_down_unneeded_seconds: DecideSettings::default().unneeded_seconds,
            scale_down_unready_seconds: crate::planner::DEFAULT_UNREADY_SECONDS,
            max_scale_down_parallelism: 10,
            drain_grace_cap_seconds: 600.0,
            drain_timeout_seconds: 3600.0,
            training: TrainingProtection::default(),
            registration_timeout_seconds: DecideSettings::default().registration_timeout_seconds,
            gang_timeout_seconds: 600.0,
            lease: LeaseConfig::default(),
            interruptions: Default::default(),
        }
    }
}

impl Default for TrainingProtection {
    fn default() -> Self {
        Self {
            min_runtime_seconds: 3600.0,
            checkpoint_annotation: "gpuscale.io/last-checkpoint".into(),
            checkpoint_max_age_seconds: 600.0,
        }
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        // client-go's defaults (LeaseDuration 15 s, RenewDeadline 10 s, RetryPeriod 2 s).
        Self {
            name: "gpuscale-controller".into(),
            duration_seconds: 15,
            renew_seconds: 2.0,
            renew_deadline_seconds: 10.0,
        }
    }
}

/// Seconds as a [`Duration`]; negative or non-finite values are zero.
pub fn secs(s: f64) -> Duration {
    if s.is_finite() && s > 0.0 {
        Duration::from_secs_f64(s)
    } else {
        Duration::ZERO
    }
}

impl ControllerConfig {
    /// The decision step's settings (`planner::decide`), which this section sets.
    pub fn decide_settings(&self) -> DecideSettings {
        DecideSettings {
            unneeded_seconds: self.scale_down_unneeded_seconds,
            registration_timeout_seconds: self.registration_timeout_seconds,
        }
    }

    /// The node-lifecycle judgement's settings at `now` (seconds since the epoch).
    pub fn lifecycle_settings(
        &self,
        now: i64,
        telemetry: &crate::model::TelemetrySettings,
    ) -> crate::planner::readiness::LifecycleSettings {
        crate::planner::readiness::LifecycleSettings {
            now: Some(now),
            registration_timeout_seconds: self.registration_timeout_seconds,
            telemetry_max_age: telemetry.max_age,
        }
    }

    /// Problems with the values, as `(field, value, reason)`.
    pub fn problems(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        let fields = [
            ("batchIdleSeconds", self.batch_idle_seconds),
            ("batchMaxSeconds", self.batch_max_seconds),
            ("resyncSeconds", self.resync_seconds),
            ("scaleDownUnneededSeconds", self.scale_down_unneeded_seconds),
            ("scaleDownUnreadySeconds", self.scale_down_unready_seconds),
            ("drainGraceCapSeconds", self.drain_grace_cap_seconds),
            ("drainTimeoutSeconds", self.drain_timeout_seconds),
            ("training.minRuntimeSeconds", self.training.min_runtime_seconds),
            ("training.checkpointMaxAgeSeconds", self.training.checkpoint_max_age_seconds),
            ("registrationTimeoutSeconds", self.registration_timeout_seconds),
            ("gangTimeoutSeconds", self.gang_timeout_seconds),
            ("lease.renewSeconds", self.lease.renew_seconds),
            ("lease.renewDeadlineSeconds", self.lease.renew_deadline_seconds),
            ("interruptions.rebalanceMaxPremium", self.interruptions.rebalance_max_premium),
            ("interruptions.reclaimedBackoffSeconds", self.interruptions.reclaimed_backoff_seconds as f64),
            ("interruptions.deadlineMarginSeconds", self.interruptions.deadline_margin_seconds as f64),
            ("interruptions.holdSeconds", self.interruptions.hold_seconds as f64),
            ("interruptions.evictionLeadSeconds", self.interruptions.eviction_lead_seconds as f64),
        ];
        for (field, v) in fields {
            if !v.is_finite() || v < 0.0 {
                out.push((
                    format!("controller.{field}"),
                    v.to_string(),
                    "must be a non-negative number".into(),
                ));
            }
        }
        if self.max_scale_down_parallelism == 0 {
            out.push((
                "controller.maxScaleDownParallelism".into(),
                "0".into(),
                "must be at least 1 (scale-down is turned off with planner.scaleDown: false)".into(),
            ));
        }
        if self.batch_max_seconds < self.batch_idle_seconds {
            out.push((
                "controller.batchMaxSeconds".into(),
                self.batch_max_seconds.to_string(),
                format!("must not be below batchIdleSeconds ({})", self.batch_idle_seconds),
            ));
        }
        // client-go's checks: LeaseDuration > RenewDeadline > 1.2 * RetryPeriod.
        let l = &self.lease;
        if l.renew_seconds <= 0.0 || l.renew_seconds * 1.2 >= l.renew_deadline_seconds {
            out.push((
                "controller.lease.renewSeconds".into(),
                l.renew_seconds.to_string(),
                format!(
                    "must be above 0 and 1.2 times it below lease.renewDeadlineSeconds ({})",
                    l.renew_deadline_seconds
                ),
            ));
        }
        if l.renew_deadline_seconds >= f64::from(l.duration_seconds) {
            out.push((
                "controller.lease.renewDeadlineSeconds".into(),
                l.renew_deadline_seconds.to_string(),
                format!(
                    "must be below lease.durationSeconds ({}): the holder must stop acting before the Lease can be taken over",
                    l.duration_seconds
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::config::GpuscaleConfig;
    use std::path::Path;

    #[test]
    fn the_controller_section_parses_and_is_validated() {
        let p = Path::new("gpuscale.yaml");
        let c = GpuscaleConfig::parse(
            p,
            "controller:\n  batchIdleSeconds: 0.5\n  lease: {durationSeconds: 30, renewSeconds: 10, renewDeadlineSeconds: 20}\n  training: {minRuntimeSeconds: 0}\n",
        )
        .unwrap();
        assert_eq!(c.controller.batch_idle_seconds, 0.5);
        assert_eq!(c.controller.batch_max_seconds, 10.0);
        assert_eq!(c.controller.lease.duration_seconds, 30);
        assert_eq!(c.controller.lease.name, "gpuscale-controller");
        assert_eq!(c.controller.training.min_runtime_seconds, 0.0);
        let e = GpuscaleConfig::parse(p, "controller:\n  lease: {durationSeconds: 15, renewSeconds: 9}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpuscale.yaml") && e.contains("controller.lease.renewSeconds = 9"), "{e}");
        // The holder must stop before a takeover: renew deadline below the lease duration.
        let e = GpuscaleConfig::parse(
            p,
            "controller:\n  lease: {durationSeconds: 10, renewDeadlineSeconds: 10}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("controller.lease.renewDeadlineSeconds = 10"), "{e}");
        let d = super::LeaseConfig::default();
        assert_eq!((d.duration_seconds, d.renew_deadline_seconds, d.renew_seconds), (15, 10.0, 2.0));
        let e = GpuscaleConfig::parse(p, "controller:\n  drainGraceCap: 5\n").unwrap_err().to_string();
        assert!(e.contains("drainGraceCap"), "{e}");
        // The interruption reaction's settings (the same the autoscaling replay uses).
        let c = GpuscaleConfig::parse(
            p,
            "controller:\n  interruptions: {replaceOnRebalance: true, rebalanceMaxPremium: 0.2}\n",
        )
        .unwrap();
        let i = c.controller.interruptions;
        assert!(i.replace_on_rebalance);
        assert_eq!(
            (i.rebalance_max_premium, i.reclaimed_backoff_seconds, i.deadline_margin_seconds),
            (0.2, 180, 5)
        );
        let e = GpuscaleConfig::parse(p, "controller:\n  interruptions: {reclaimedBackoffSeconds: -1}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("controller.interruptions.reclaimedBackoffSeconds = -1"), "{e}");
        let e = GpuscaleConfig::parse(p, "controller:\n  interruptions: {replaceOnRebalanse: true}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("replaceOnRebalanse"), "{e}");
    }
}
