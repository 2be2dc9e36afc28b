//! Atomic gang scale-up: grow every group a gang needs, and if not all new instances are running
//! within a deadline, roll them back, so a partial gang never keeps billing. A rollback removes
//! only instances the caller says hold no other work (never registered, or whose node holds no
//! pod but the gang's and DaemonSets'): kube-scheduler binds any fitting pod to a gang's early
//! nodes, and a consolidation or cloud health replacement may land in the group meanwhile; those
//! instances are kept, and leave, if ever, through the drain path.
//!
//! A model-parallel job is useless until all its workers run; Cluster Autoscaler and Karpenter
//! grow groups independently and leave the launched part of a gang idle when the rest does not
//! come (a zone out of H100s). Targets are absolute and the instances to roll back are found by
//! difference with the instances that existed before, so a retried call does not double anything.
//!
//! A scale-up is fenced: `may_write` is asked immediately before every cloud write, and once it
//! answers false the scale-up stops where it is ([`GangOutcome::Stopped`]) and writes nothing
//! more. What it needs to be finished by someone else is a [`GangRecord`] (the instances that
//! existed before, the old and new targets, the start time), which the controller keeps in the
//! API server so that the next leader [resumes](resume_gang) it: waits out the rest of the
//! timeout and either keeps the gang or rolls it back, once.

use super::{CloudProvider, ProviderError};
use crate::model::InstanceState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

/// One group's growth in a gang scale-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupGrowth {
    /// Node group id.
    pub group: String,
    /// New target size.
    pub to: u32,
}

/// How a gang scale-up ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GangOutcome {
    /// Every group reached its target with running instances.
    Ready {
        /// The new instances, per group.
        instances: BTreeMap<String, Vec<String>>,
    },
    /// Not all instances came up in time; every new instance was deleted and the targets restored.
    RolledBack {
        /// What was missing.
        reason: String,
        /// Instances deleted, per group.
        deleted: BTreeMap<String, Vec<String>>,
    },
    /// `may_write` turned false (leadership lost): nothing more was written; whoever holds the
    /// [`GangRecord`] finishes it.
    Stopped {
        /// The write that was not issued.
        before: String,
    },
}

/// One group of a gang scale-up as it was before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GangGroupRecord {
    /// Node group id.
    pub group: String,
    /// Target before the scale-up (restored by a rollback).
    pub old_target: u32,
    /// New target.
    pub to: u32,
    /// Instances that existed before (never rolled back).
    pub existing: BTreeSet<String>,
}

/// What a gang scale-up needs to be finished or rolled back by another process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GangRecord {
    /// The groups.
    pub groups: Vec<GangGroupRecord>,
    /// Unix time (seconds) the scale-up started; it rolls back `timeout` after.
    pub started_unix: i64,
    /// Seconds the gang has to run.
    pub timeout_seconds: f64,
    /// Set once the rollback began: whoever resumes goes straight to it.
    #[serde(default)]
    pub rolling_back: bool,
    /// The gang's pods (`namespace/name`): a rollback may remove a node running these.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub pods: BTreeSet<String>,
}

impl GangRecord {
    /// Whether the record outlived its gang: past its deadline by more than the timeout again,
    /// its gang was decided by a leader whose record removal failed. Such a record is dropped,
    /// never acted on (the instances launched since may be anything by now).
    pub fn is_stale(&self, now_unix: i64) -> bool {
        now_unix as f64 > self.started_unix as f64 + 2.0 * self.timeout_seconds.max(0.0)
    }
}

/// Reads the groups of `growths` once and records how they are before the scale-up.
pub async fn prepare_gang<P: CloudProvider>(
    provider: &P,
    growths: &[GroupGrowth],
    timeout: Duration,
    started_unix: i64,
) -> Result<GangRecord, ProviderError> {
    let before = provider.refresh().await?;
    let mut groups = Vec::new();
    for g in growths {
        let group = before
            .iter()
            .find(|x| x.id == g.group)
            .ok_or_else(|| ProviderError::GroupNotFound(g.group.clone()))?;
        groups.push(GangGroupRecord {
            group: g.group.clone(),
            old_target: group.target_size,
            to: g.to,
            existing: group.instances.iter().map(|i| i.id.clone()).collect(),
        });
    }
    Ok(GangRecord {
        groups,
        started_unix,
        timeout_seconds: timeout.as_secs_f64(),
        rolling_back: false,
        pods: BTreeSet::new(),
    })
}

/// Grows all `growths` together and waits up to `timeout` (polling every `poll` through `sleep`)
/// for their new instances to run; on timeout, deletes them all and restores the old targets.
pub async fn scale_up_gang<P, S, F>(
    provider: &P,
    growths: &[GroupGrowth],
    timeout: Duration,
    poll: Duration,
    sleep: S,
) -> Result<GangOutcome, ProviderError>
where
    P: CloudProvider,
    S: FnMut(Duration) -> F,
    F: Future<Output = ()>,
{
    let record = prepare_gang(provider, growths, timeout, 0).await?;
    run_gang(provider, &record, true, timeout, poll, sleep, || true, |_| async { true }, |_: &str| true).await
}

/// Finishes a gang scale-up another process started from its `record`, with `remaining` of its
/// timeout left: never raises a target; waits for the new instances, then keeps the gang or
/// rolls it back. Fenced like [`run_gang`].
#[allow(clippy::too_many_arguments)]
pub async fn resume_gang<P, S, F, W, M, MF, R>(
    provider: &P,
    record: &GangRecord,
    remaining: Duration,
    poll: Duration,
    sleep: S,
    may_write: W,
    mark_rolling_back: M,
    removable: R,
) -> Result<GangOutcome, ProviderError>
where
    P: CloudProvider,
    S: FnMut(Duration) -> F,
    F: Future<Output = ()>,
    W: Fn() -> bool,
    M: FnOnce(&GangRecord) -> MF,
    MF: Future<Output = bool>,
    R: Fn(&str) -> bool,
{
    run_gang(provider, record, false, remaining, poll, sleep, may_write, mark_rolling_back, removable).await
}

/// Raises every group of `record` to its target (when `raise`), waits up to `timeout` for the new
/// instances to run, and otherwise rolls back: calls `mark_rolling_back` (which persists the
/// record with `rolling_back` set; false stops), deletes the new instances `removable` allows
/// (an instance id: true when it holds no work but the gang's), and lowers each target by what
/// was not kept, never below the old one. `may_write` is asked immediately before every cloud
/// write; once false, nothing more is written and the outcome is [`GangOutcome::Stopped`].
#[allow(clippy::too_many_arguments)]
pub async fn run_gang<P, S, F, W, M, MF, R>(
    provider: &P,
    record: &GangRecord,
    raise: bool,
    timeout: Duration,
    poll: Duration,
    mut sleep: S,
    may_write: W,
    mark_rolling_back: M,
    removable: R,
) -> Result<GangOutcome, ProviderError>
where
    P: CloudProvider,
    S: FnMut(Duration) -> F,
    F: Future<Output = ()>,
    W: Fn() -> bool,
    M: FnOnce(&GangRecord) -> MF,
    MF: Future<Output = bool>,
    R: Fn(&str) -> bool,
{
    let stopped = |before: String| {
        tracing::warn!(%before, "leadership lost: the gang scale-up stops here; the next leader finishes it");
        Ok(GangOutcome::Stopped { before })
    };
    let mut failure: Option<String> = None;
    if record.rolling_back {
        failure = Some("resuming a rollback another leader began".into());
    } else if raise {
        for g in &record.groups {
            if !may_write() {
                return stopped(format!("raising {} to {}", g.group, g.to));
            }
            if let Err(e) = provider.set_target_size(&g.group, g.to).await {
                failure = Some(format!("raising {} to {}: {e}", g.group, g.to));
                break;
            }
        }
    }
    let mut waited = Duration::ZERO;
    while failure.is_none() {
        let now = provider.refresh().await?;
        let mut missing = Vec::new();
        let mut instances = BTreeMap::new();
        for g in &record.groups {
            let group = now
                .iter()
                .find(|x| x.id == g.group)
                .ok_or_else(|| ProviderError::GroupNotFound(g.group.clone()))?;
            let new: Vec<&crate::model::Instance> =
                group.instances.iter().filter(|i| !g.existing.contains(&i.id)).collect();
            let running = new.iter().filter(|i| i.state == InstanceState::Running).count() as u32;
            let wanted = g.to.saturating_sub(g.old_target);
            if running < wanted {
                missing.push(format!("{}: {running}/{wanted} running", g.group));
            }
            instances.insert(g.group.clone(), new.iter().map(|i| i.id.clone()).collect::<Vec<_>>());
        }
        if missing.is_empty() {
            return Ok(GangOutcome::Ready { instances });
        }
        if waited >= timeout {
            failure = Some(format!("not all gang instances ran within {timeout:?} ({})", missing.join(", ")));
            break;
        }
        sleep(poll).await;
        waited += poll;
        if !may_write() {
            return stopped("waiting for the gang's instances".into());
        }
    }
    // Roll back every group: delete what was launched and holds no other work, then set the
    // target to the old one plus what was kept (absolute, so a group that was never raised is
    // left as it was, and the cloud never picks other instances to cut the group down with).
    let reason = failure.unwrap_or_default();
    if !may_write() {
        return stopped("the rollback".into());
    }
    tracing::warn!(%reason, "rolling back gang scale-up");
    if !record.rolling_back && !mark_rolling_back(record).await {
        return stopped("the rollback (its record could not be marked)".into());
    }
    let now = provider.refresh().await?;
    let mut deleted = BTreeMap::new();
    for g in &record.groups {
        let Some(group) = now.iter().find(|x| x.id == g.group) else { continue };
        let (launched, kept): (Vec<String>, Vec<String>) = group
            .instances
            .iter()
            .filter(|i| !g.existing.contains(&i.id))
            .filter(|i| !matches!(i.state, InstanceState::Terminating | InstanceState::Failed { .. }))
            .map(|i| i.id.clone())
            .partition(|id| removable(id));
        if !kept.is_empty() {
            tracing::warn!(group = %g.group, ?kept, "gang rollback keeps instances whose nodes run other pods");
        }
        if !launched.is_empty() {
            if !may_write() {
                return stopped(format!("deleting {launched:?} of {}", g.group));
            }
            provider.delete_instances(&g.group, &launched).await?;
        }
        let target = g.old_target + kept.len() as u32;
        if !may_write() {
            return stopped(format!("restoring {} to {target}", g.group));
        }
        provider.set_target_size(&g.group, target).await?;
        deleted.insert(g.group.clone(), launched);
    }
    Ok(GangOutcome::RolledBack { reason, deleted })
}
