//! Graceful drain of one node, as a pure step function over what the API shows now.
//!
//! The drain state lives on the Node itself, so a new leader after a restart finds every drain in
//! progress and finishes it: the taint [`DISRUPTING_TAINT`] (`gpuscale.io/disrupting=true:
//! NoSchedule`) keeps new pods off, and annotations record when the drain started, why, whether
//! any eviction was attempted, and whether the node was cordoned before (so an abandoned drain
//! restores it as it was). Each loop calls [`step`] with the node's pods and `now`, and the
//! adapter carries out what it returns: evict through the Eviction API (which enforces
//! PodDisruptionBudgets; a 429 is retried next loop), wait for evicted pods to terminate (up to
//! their grace period, capped), and at the end delete the instance and the Node.

use super::config::secs;
use super::config::ControllerConfig;
use crate::model::{NoticeKind, OwnerKind};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::k8s::{DISRUPTING_TAINT, DRAIN_EVICTED, DRAIN_STARTED_AT, DRAIN_WAS_CORDONED};
pub use crate::model::DEFAULT_GRACE_SECONDS;

/// How long past an evicted pod's (capped) grace period the drain still waits for the pod to be
/// gone before it gives the node back (Cluster Autoscaler's `PodEvictionHeadroom`).
pub const EVICTION_HEADROOM: Duration = Duration::from_secs(30);

/// Annotation: the planner's reason for removing the node.
pub const DRAIN_REASON: &str = "gpuscale.io/drain-reason";
/// Annotation on a node drained for an interruption notice: the notice's kind
/// (`spot-interruption`, …). With [`DRAIN_DEADLINE`] and [`DRAIN_EVICT_AT`] it is on the Node so
/// that a restarted controller or a new leader goes on with the drain as noticed (whatever the
/// plan says, the pods' grace capped to the deadline, at the same eviction time), though the
/// notice itself may be gone: a queue message is deleted once handled.
pub const DRAIN_NOTICE: &str = "gpuscale.io/drain-notice";
/// Annotation: when the cloud takes the noticed node, if it said.
pub const DRAIN_DEADLINE: &str = "gpuscale.io/drain-deadline";
/// Annotation: the time the noticed node's pods are evicted, not before (they keep running while
/// the replacement boots; [`crate::planner::interruption::evict_at`]).
pub const DRAIN_EVICT_AT: &str = "gpuscale.io/evict-at";

/// Annotation: id of the group a cheaper node is requested from to replace this node.
pub const REPLACE_WITH: &str = "gpuscale.io/replace-with";
/// Annotation: the replacement group's target size that holds the requested node.
pub const REPLACE_TARGET: &str = "gpuscale.io/replace-target";
/// Annotation: RFC 3339 time the replacement was requested.
pub const REPLACE_REQUESTED_AT: &str = "gpuscale.io/replace-requested-at";

/// A consolidation replacement in progress, as recorded on the node to be replaced (written before
/// the replacement group is raised, so a new leader neither raises it twice nor forgets it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaceMarks {
    /// Group the replacement comes from.
    pub group: String,
    /// That group's target size including the replacement.
    pub target: u32,
    /// When it was requested.
    pub requested_at: Timestamp,
}

/// Reads the replacement marks of a node; `None` when none (or garbled) are there.
pub fn replace_marks_of(annotations: &BTreeMap<String, String>) -> Option<ReplaceMarks> {
    Some(ReplaceMarks {
        group: annotations.get(REPLACE_WITH)?.clone(),
        target: annotations.get(REPLACE_TARGET)?.parse().ok()?,
        requested_at: annotations.get(REPLACE_REQUESTED_AT)?.parse().ok()?,
    })
}

/// The drain marks found on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainMarks {
    /// When the drain started.
    pub started_at: Timestamp,
    /// Why.
    pub reason: String,
    /// Whether any eviction was attempted.
    pub evicted: bool,
    /// Whether the node was cordoned before the drain.
    pub was_cordoned: bool,
    /// The interruption notice the drain is for, if it is.
    pub notice: Option<NoticeMarks>,
}

/// What a drain for an interruption notice records on the Node ([`DRAIN_NOTICE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticeMarks {
    /// What was announced.
    pub kind: NoticeKind,
    /// When the cloud takes the node ([`DRAIN_DEADLINE`]).
    pub deadline: Option<Timestamp>,
    /// No pod is evicted before this time ([`DRAIN_EVICT_AT`]).
    pub evict_at: Option<Timestamp>,
}

impl NoticeMarks {
    /// The annotations that record it.
    pub fn annotations(&self) -> Vec<(&'static str, String)> {
        let kind = serde_json::to_value(self.kind).ok().and_then(|v| v.as_str().map(str::to_string));
        let mut out = vec![(DRAIN_NOTICE, kind.unwrap_or_default())];
        out.extend(self.deadline.map(|t| (DRAIN_DEADLINE, t.to_string())));
        out.extend(self.evict_at.map(|t| (DRAIN_EVICT_AT, t.to_string())));
        out
    }

    /// Reads them back; `None` without a (valid) [`DRAIN_NOTICE`].
    fn of(annotations: &BTreeMap<String, String>) -> Option<Self> {
        let kind = annotations.get(DRAIN_NOTICE)?;
        let kind = serde_json::from_value(serde_json::Value::String(kind.clone())).ok()?;
        let time = |k: &str| annotations.get(k).and_then(|s| s.parse().ok());
        Some(Self { kind, deadline: time(DRAIN_DEADLINE), evict_at: time(DRAIN_EVICT_AT) })
    }
}

/// Reads the drain marks of a node from its annotations and taint keys; `None` when it is not
/// being drained. A node with the taint but no (or a garbled) start time counts as started at
/// `now`, so it is finished or released rather than left cordoned forever.
pub fn marks_of<'a>(
    annotations: &BTreeMap<String, String>,
    mut taint_keys: impl Iterator<Item = &'a str>,
    now: Timestamp,
) -> Option<DrainMarks> {
    let tainted = taint_keys.any(|k| k == DISRUPTING_TAINT);
    let started = annotations.get(DRAIN_STARTED_AT);
    if !tainted && started.is_none() {
        return None;
    }
    let is_true = |k: &str| annotations.get(k).is_some_and(|v| v == "true");
    Some(DrainMarks {
        started_at: started.and_then(|s| s.parse().ok()).unwrap_or(now),
        reason: annotations.get(DRAIN_REASON).cloned().unwrap_or_default(),
        evicted: is_true(DRAIN_EVICTED),
        was_cordoned: is_true(DRAIN_WAS_CORDONED),
        notice: NoticeMarks::of(annotations),
    })
}

/// A pod that is terminating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// `metadata.deletionTimestamp`: when the grace period ends.
    pub at: Timestamp,
    /// `metadata.deletionGracePeriodSeconds`.
    pub grace: Duration,
}

/// What a drain needs to know about one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// Controller kind.
    pub owner: OwnerKind,
    /// A static pod's mirror (`kubernetes.io/config.mirror`).
    pub mirror: bool,
    /// Succeeded or Failed: holds nothing.
    pub terminal: bool,
    /// `karpenter.sh/do-not-disrupt` / `safe-to-evict: "false"`.
    pub eviction_blocked: Option<String>,
    /// Requests GPUs.
    pub gpu: bool,
    /// `status.startTime`.
    pub started_at: Option<Timestamp>,
    /// Time of the last checkpoint, from the configured annotation.
    pub checkpoint_at: Option<Timestamp>,
    /// Set once the pod is terminating.
    pub deletion: Option<Deletion>,
    /// `spec.terminationGracePeriodSeconds` (Kubernetes' default, 30 s, when unset).
    pub grace_seconds: Option<u32>,
}

impl PodFacts {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The grace period its eviction asks for: its own, capped at `drainGraceCapSeconds`, so the
    /// kubelet ends the pod within the cap (Cluster Autoscaler's `MaxGracefulTerminationSec`) and
    /// the VM is never what cuts a shutdown short.
    pub fn eviction_grace(&self, config: &ControllerConfig) -> u32 {
        let cap = secs(config.drain_grace_cap_seconds).as_secs().min(u64::from(u32::MAX)) as u32;
        self.grace_seconds.unwrap_or(DEFAULT_GRACE_SECONDS).min(cap)
    }

    /// Whether the pod stays with the node and never blocks its removal (DaemonSet, static).
    pub fn is_node_bound(&self) -> bool {
        self.mirror || matches!(self.owner, OwnerKind::DaemonSet | OwnerKind::Node)
    }

    /// A training job's pod: GPUs under a Job or a training operator, or a pod that reports
    /// checkpoints.
    pub fn is_training(&self) -> bool {
        self.checkpoint_at.is_some()
            || (self.gpu && matches!(self.owner, OwnerKind::Job | OwnerKind::Other(_)))
    }
}

/// Why a running pod must not be evicted now, if it must not.
pub fn protection(pod: &PodFacts, config: &ControllerConfig, now: Timestamp) -> Option<String> {
    if let Some(reason) = &pod.eviction_blocked {
        return Some(reason.clone());
    }
    if pod.owner == OwnerKind::None && !pod.mirror {
        return Some("no controller: the pod would be lost".into());
    }
    let t = &config.training;
    if !pod.is_training() || t.min_runtime_seconds <= 0.0 {
        return None;
    }
    let min = secs(t.min_runtime_seconds);
    let ran = pod.started_at.map_or(Duration::ZERO, |s| (now.duration_since(s)).unsigned_abs());
    let ran = if pod.started_at.is_some_and(|s| s > now) { Duration::ZERO } else { ran };
    if ran >= min {
        return None;
    }
    let fresh_checkpoint = pod.checkpoint_at.is_some_and(|c| {
        c <= now && now.duration_since(c).unsigned_abs() <= secs(t.checkpoint_max_age_seconds)
    });
    if fresh_checkpoint {
        return None;
    }
    Some(format!(
        "training pod has run {}s of its {}s minimum runtime without a checkpoint in the last {}s ({})",
        ran.as_secs(),
        min.as_secs(),
        secs(t.checkpoint_max_age_seconds).as_secs(),
        t.checkpoint_annotation
    ))
}

/// How a drain goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Evict `evict` (if any) and look again next loop.
    Continue,
    /// Nothing left to wait for: delete the instance and the Node.
    Finish,
    /// Stop draining: remove the marks and restore the node's schedulability.
    Abort {
        /// Why.
        reason: String,
    },
}

/// One drain step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainStep {
    /// Pods to evict now (`namespace/name`).
    pub evict: Vec<String>,
    /// Pods that may not be evicted, with the reason.
    pub blocked: Vec<(String, String)>,
    /// Evicted pods still terminating within their (capped) grace period.
    pub terminating: Vec<String>,
    /// What follows.
    pub outcome: DrainOutcome,
}

/// Decides the next step of the drain of a node. `pods` are the pods bound to it;
/// `still_candidate` says whether the current plan would remove the node (asked only while no
/// eviction has been attempted: once one has, the drain finishes).
pub fn step(
    marks: &DrainMarks,
    still_candidate: bool,
    pods: &[PodFacts],
    config: &ControllerConfig,
    now: Timestamp,
) -> DrainStep {
    let mut out =
        DrainStep { evict: vec![], blocked: vec![], terminating: vec![], outcome: DrainOutcome::Continue };
    if !marks.evicted && !still_candidate {
        out.outcome = DrainOutcome::Abort { reason: "no longer a scale-down candidate".into() };
        return out;
    }
    let timeout = secs(config.drain_timeout_seconds);
    if now > marks.started_at && now.duration_since(marks.started_at).unsigned_abs() > timeout {
        out.outcome =
            DrainOutcome::Abort { reason: format!("drain did not finish within {}s", timeout.as_secs()) };
        return out;
    }
    let cap = secs(config.drain_grace_cap_seconds);
    let mut overdue = None;
    for pod in pods.iter().filter(|p| !p.terminal && !p.is_node_bound()) {
        if let Some(d) = &pod.deletion {
            // deletionTimestamp = deletion request + grace. A pod is gone only when its object
            // is: the node is never removed under a pod still shutting down. One still there
            // past its capped grace and the headroom gives the node back.
            let requested = d.at - d.grace;
            if now >= requested + d.grace.min(cap) + EVICTION_HEADROOM {
                overdue.get_or_insert_with(|| pod.id());
            }
            out.terminating.push(pod.id().to_string());
            continue;
        }
        match protection(pod, config, now) {
            Some(reason) => out.blocked.push((pod.id().to_string(), reason)),
            None => out.evict.push(pod.id().to_string()),
        }
    }
    if !out.blocked.is_empty() && !marks.evicted {
        let (pod, reason) = &out.blocked[0];
        out.outcome = DrainOutcome::Abort { reason: format!("pod {pod} may not be evicted: {reason}") };
        out.evict.clear();
        return out;
    }
    if let Some(pod) = overdue {
        out.outcome = DrainOutcome::Abort {
            reason: format!(
                "pod {pod} is still there {}s after its capped grace period; keeping the node",
                EVICTION_HEADROOM.as_secs()
            ),
        };
        out.evict.clear();
        return out;
    }
    if out.evict.is_empty() && out.terminating.is_empty() && out.blocked.is_empty() {
        out.outcome = DrainOutcome::Finish;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn pod(name: &str, owner: OwnerKind) -> PodFacts {
        PodFacts {
            namespace: "ml".into(),
            name: name.into(),
            node: Some("n1".into()),
            owner,
            started_at: Some(t(-100_000)),
            ..Default::default()
        }
    }

    fn marks(evicted: bool) -> DrainMarks {
        DrainMarks { started_at: t(0), reason: "empty".into(), evicted, was_cordoned: false, notice: None }
    }

    fn cfg() -> ControllerConfig {
        ControllerConfig::default()
    }

    #[test]
    fn a_noticed_drain_reads_back_its_notice_from_the_node() {
        let notice =
            NoticeMarks { kind: NoticeKind::SpotInterruption, deadline: Some(t(120)), evict_at: Some(t(60)) };
        let mut a: BTreeMap<String, String> =
            notice.annotations().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(a[DRAIN_NOTICE], "spot-interruption");
        a.insert(DRAIN_STARTED_AT.into(), t(1).to_string());
        let m = marks_of(&a, std::iter::empty(), t(5)).unwrap();
        assert_eq!(m.notice, Some(notice));
        // A kind this version does not know is no notice: the drain is an ordinary one.
        a.insert(DRAIN_NOTICE.into(), "meteor-strike".into());
        assert_eq!(marks_of(&a, std::iter::empty(), t(5)).unwrap().notice, None);
    }

    #[test]
    fn replace_marks_need_all_three_annotations() {
        let mut a = BTreeMap::new();
        a.insert(REPLACE_WITH.to_string(), "sim/gpu-l4-small".to_string());
        a.insert(REPLACE_TARGET.to_string(), "3".to_string());
        assert_eq!(replace_marks_of(&a), None);
        a.insert(REPLACE_REQUESTED_AT.to_string(), t(2).to_string());
        let want = ReplaceMarks { group: "sim/gpu-l4-small".into(), target: 3, requested_at: t(2) };
        assert_eq!(replace_marks_of(&a), Some(want));
        a.insert(REPLACE_TARGET.to_string(), "three".to_string());
        assert_eq!(replace_marks_of(&a), None, "garbled: no replacement");
    }

    #[test]
    fn marks_round_trip_and_taint_alone_counts() {
        let mut a = BTreeMap::new();
        assert_eq!(marks_of(&a, std::iter::empty(), t(5)), None);
        let m = marks_of(&a, [DISRUPTING_TAINT].into_iter(), t(5)).unwrap();
        assert_eq!((m.started_at, m.evicted), (t(5), false));
        a.insert(DRAIN_STARTED_AT.into(), t(1).to_string());
        a.insert(DRAIN_REASON.into(), "GPU allocation 10% < 50%".into());
        a.insert(DRAIN_EVICTED.into(), "true".into());
        let m = marks_of(&a, std::iter::empty(), t(5)).unwrap();
        assert_eq!(
            m,
            DrainMarks {
                started_at: t(1),
                reason: "GPU allocation 10% < 50%".into(),
                evicted: true,
                was_cordoned: false,
                notice: None
            }
        );
    }

    #[test]
    fn evicts_movable_pods_and_skips_daemonsets_and_finished_pods() {
        let mut done = pod("done", OwnerKind::Job);
        done.terminal = true;
        let mut mirror = pod("static", OwnerKind::Node);
        mirror.mirror = true;
        let pods = vec![pod("web", OwnerKind::ReplicaSet), pod("ds", OwnerKind::DaemonSet), done, mirror];
        let s = step(&marks(false), true, &pods, &cfg(), t(10));
        assert_eq!(s.evict, vec!["ml/web"]);
        assert_eq!(s.outcome, DrainOutcome::Continue);
        // Only node-bound pods left: finish.
        let s = step(&marks(true), true, &pods[1..], &cfg(), t(10));
        assert_eq!((s.evict.len(), s.outcome), (0, DrainOutcome::Finish));
    }

    /// The review's finding 3: the drain used to finish (terminate the VM) once the cap passed
    /// while the pod was still writing its checkpoint. Now a pod is waited for until it is gone,
    /// and one still there past its capped grace plus the headroom gives the node back.
    #[test]
    fn never_finishes_under_a_terminating_pod_and_gives_the_node_back_past_the_cap() {
        let mut p = pod("web", OwnerKind::ReplicaSet);
        p.deletion = Some(Deletion { at: t(3600), grace: Duration::from_secs(3600) });
        let mut c = cfg();
        c.drain_grace_cap_seconds = 60.0;
        let s = step(&marks(true), false, std::slice::from_ref(&p), &c, t(30));
        assert_eq!((s.terminating.clone(), s.outcome), (vec!["ml/web".to_string()], DrainOutcome::Continue));
        let s = step(&marks(true), false, std::slice::from_ref(&p), &c, t(61));
        assert_eq!(s.outcome, DrainOutcome::Continue, "within the headroom: still waiting");
        let s = step(&marks(true), false, std::slice::from_ref(&p), &c, t(91));
        assert!(
            matches!(&s.outcome, DrainOutcome::Abort { reason } if reason.contains("still there")),
            "{:?}",
            s.outcome
        );
        // Once the pod object is gone, the drain finishes.
        let s = step(&marks(true), false, &[], &c, t(91));
        assert_eq!(s.outcome, DrainOutcome::Finish);
    }

    #[test]
    fn evictions_ask_for_the_pods_grace_capped() {
        let mut c = cfg();
        c.drain_grace_cap_seconds = 600.0;
        let mut p = pod("trainer", OwnerKind::Job);
        assert_eq!(p.eviction_grace(&c), DEFAULT_GRACE_SECONDS);
        p.grace_seconds = Some(1800);
        assert_eq!(p.eviction_grace(&c), 600);
        p.grace_seconds = Some(5);
        assert_eq!(p.eviction_grace(&c), 5);
    }

    #[test]
    fn aborts_when_no_longer_a_candidate_unless_evictions_started() {
        let pods = vec![pod("web", OwnerKind::ReplicaSet)];
        let s = step(&marks(false), false, &pods, &cfg(), t(10));
        assert!(matches!(s.outcome, DrainOutcome::Abort { .. }) && s.evict.is_empty());
        let s = step(&marks(true), false, &pods, &cfg(), t(10));
        assert_eq!((s.evict, s.outcome), (vec!["ml/web".to_string()], DrainOutcome::Continue));
    }

    #[test]
    fn never_evicts_protected_pods() {
        let mut keep = pod("keep", OwnerKind::ReplicaSet);
        keep.eviction_blocked = Some("karpenter.sh/do-not-disrupt=true".into());
        let bare = pod("bare", OwnerKind::None);
        let pods = vec![keep, bare, pod("web", OwnerKind::ReplicaSet)];
        // Before any eviction: give the node back.
        let s = step(&marks(false), true, &pods, &cfg(), t(10));
        assert!(matches!(&s.outcome, DrainOutcome::Abort { reason } if reason.contains("do-not-disrupt")));
        assert!(s.evict.is_empty());
        // After evictions began: evict the rest, wait for the blocked ones.
        let s = step(&marks(true), true, &pods, &cfg(), t(10));
        assert_eq!(s.evict, vec!["ml/web"]);
        assert_eq!(s.blocked.len(), 2);
        assert_eq!(s.outcome, DrainOutcome::Continue);
    }

    #[test]
    fn training_pods_are_protected_until_min_runtime_or_a_fresh_checkpoint() {
        let mut c = cfg();
        c.training.min_runtime_seconds = 3600.0;
        c.training.checkpoint_max_age_seconds = 300.0;
        let mut train = pod("worker-0", OwnerKind::Job);
        train.gpu = true;
        train.started_at = Some(t(0));
        assert!(protection(&train, &c, t(1800)).unwrap().contains("1800s of its 3600s"));
        assert_eq!(protection(&train, &c, t(3600)), None);
        train.checkpoint_at = Some(t(1700));
        assert_eq!(protection(&train, &c, t(1800)), None);
        assert!(protection(&train, &c, t(2100)).is_some(), "checkpoint older than 300s");
        // A CPU job pod is not a training job.
        let cpu = PodFacts { started_at: Some(t(0)), ..pod("etl", OwnerKind::Job) };
        assert_eq!(protection(&cpu, &c, t(10)), None);
    }

    #[test]
    fn stuck_drains_are_abandoned_after_the_timeout() {
        let mut keep = pod("keep", OwnerKind::ReplicaSet);
        keep.eviction_blocked = Some("cluster-autoscaler.kubernetes.io/safe-to-evict=false".into());
        let mut c = cfg();
        c.drain_timeout_seconds = 100.0;
        let s = step(&marks(true), true, std::slice::from_ref(&keep), &c, t(50));
        assert_eq!(s.outcome, DrainOutcome::Continue);
        let s = step(&marks(true), true, &[keep], &c, t(101));
        assert!(matches!(s.outcome, DrainOutcome::Abort { .. }));
    }
}
