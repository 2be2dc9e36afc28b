//! Atomic gang scale-up: grow every group a gang needs, and if not all new instances are running
//! within a deadline, roll every one of them back, so a partial gang never keeps billing.
//!
//! A model-parallel job is useless until all its workers run; Cluster Autoscaler and Karpenter
//! grow groups independently and leave the launched part of a gang idle when the rest does not
//! come (a zone out of H100s). Targets are absolute and the instances to roll back are found by
//! difference with the instances that existed before, so a retried call does not double anything.

use super::{CloudProvider, ProviderError};
use crate::model::InstanceState;
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
}

/// Grows all `growths` together and waits up to `timeout` (polling every `poll` through `sleep`)
/// for their new instances to run; on timeout, deletes them all and restores the old targets.
pub async fn scale_up_gang<P, S, F>(
    provider: &P,
    growths: &[GroupGrowth],
    timeout: Duration,
    poll: Duration,
    mut sleep: S,
) -> Result<GangOutcome, ProviderError>
where
    P: CloudProvider,
    S: FnMut(Duration) -> F,
    F: Future<Output = ()>,
{
    let before = provider.refresh().await?;
    let mut existing: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut old_target: BTreeMap<&str, u32> = BTreeMap::new();
    for g in growths {
        let group = before
            .iter()
            .find(|x| x.id == g.group)
            .ok_or_else(|| ProviderError::GroupNotFound(g.group.clone()))?;
        existing.insert(&g.group, group.instances.iter().map(|i| i.id.clone()).collect());
        old_target.insert(&g.group, group.target_size);
    }
    let mut raised = Vec::new();
    let mut failure: Option<String> = None;
    for g in growths {
        match provider.set_target_size(&g.group, g.to).await {
            Ok(()) => raised.push(g),
            Err(e) => {
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
        for g in growths {
            let group = now
                .iter()
                .find(|x| x.id == g.group)
                .ok_or_else(|| ProviderError::GroupNotFound(g.group.clone()))?;
            let new: Vec<&crate::model::Instance> =
                group.instances.iter().filter(|i| !existing[g.group.as_str()].contains(&i.id)).collect();
            let running = new.iter().filter(|i| i.state == InstanceState::Running).count() as u32;
            let wanted = g.to.saturating_sub(old_target[g.group.as_str()]);
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
    }
    // Roll back every group we raised: delete what was launched, then restore the target.
    let reason = failure.unwrap_or_default();
    tracing::warn!(%reason, "rolling back gang scale-up");
    let now = provider.refresh().await?;
    let mut deleted = BTreeMap::new();
    for g in raised {
        let Some(group) = now.iter().find(|x| x.id == g.group) else { continue };
        let launched: Vec<String> = group
            .instances
            .iter()
            .filter(|i| !existing[g.group.as_str()].contains(&i.id))
            .filter(|i| !matches!(i.state, InstanceState::Terminating | InstanceState::Failed { .. }))
            .map(|i| i.id.clone())
            .collect();
        if !launched.is_empty() {
            provider.delete_instances(&g.group, &launched).await?;
        }
        provider.set_target_size(&g.group, old_target[g.group.as_str()]).await?;
        deleted.insert(g.group.clone(), launched);
    }
    Ok(GangOutcome::RolledBack { reason, deleted })
}
