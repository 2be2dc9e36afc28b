//! Scale-ups, gangs' above all: a gang's raise is all-or-nothing, runs in the background and is
//! recorded in a ConfigMap so that the next leader finishes (or rolls back) what this one
//! started; a rollback removes only what [`gang_may_remove`] allows.

use super::super::decide::gang_may_remove;
use super::super::{Controller, ControllerError, LoopState};
use crate::controller::config::secs;
use crate::model::ErrorClass;
use crate::providers::gang::{prepare_gang, resume_gang, run_gang, GangOutcome, GangRecord, GroupGrowth};
use crate::providers::{CloudProvider, ProviderError};
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

impl Controller {
    /// Name of the ConfigMap that holds the gang scale-ups in progress.
    fn gang_config_map(&self) -> String {
        format!("{}-gangs", self.options.config.lease.name)
    }

    /// Raises a group's target; a raise for gang members is all-or-nothing, in a background task.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::controller::reconcile) async fn scale_group(
        &self,
        group: &str,
        from: u32,
        to: u32,
        pods: &[String],
        gang: bool,
        state: &mut LoopState,
        now: Timestamp,
    ) {
        let Some(provider) = self.providers.provider_of(group) else {
            self.observer.scale_up_failed(group, "no configured account owns the group");
            return;
        };
        if !gang {
            match provider.set_target_size(group, to).await {
                Ok(()) => {
                    self.observer.scaled_up(group, from, to, pods);
                    state.raises.raised.insert(group.to_string(), to);
                }
                Err(e @ ProviderError::NotPermitted { .. }) => {
                    tracing::info!(%group, error = %e, "leadership lost; the scale-up is left to the next leader")
                }
                Err(e) => {
                    self.observer.scale_up_failed(group, &e.to_string());
                    if let Some(b) = provider.group_backoff(group) {
                        self.observer.backoff(group, &format!("{e} (failure {} in a row)", b.failures));
                    }
                    // Out of capacity (or refused as backing off): the pass plans again without
                    // the group. Other failures (a bad request, auth) would fail for any group.
                    if e.class() == ErrorClass::OutOfCapacity || provider.unavailable_reason(group).is_some()
                    {
                        state.raises.failed.insert(group.to_string(), format!("raise failed this pass: {e}"));
                    }
                }
            }
            return;
        }
        // Gang: record it (so the next leader can finish it), raise and wait for every new
        // instance to run, or roll back; fenced throughout.
        let growth = vec![GroupGrowth { group: group.to_string(), to }];
        let timeout = secs(self.options.config.gang_timeout_seconds);
        let record = match prepare_gang(provider, &growth, timeout, now.as_second()).await {
            Ok(r) => GangRecord { pods: pods.iter().cloned().collect(), ..r },
            Err(e) => {
                self.observer.scale_up_failed(group, &e.to_string());
                return;
            }
        };
        let key = crate::controller::actuate::gang_key(group);
        let (ns, cm) = (self.options.namespace.clone(), self.gang_config_map());
        if let Err(e) = self.actuator.put_gang_record(&ns, &cm, &key, Some(&record)).await {
            self.observer.scale_up_failed(group, &format!("recording the gang scale-up: {e}"));
            return;
        }
        self.observer.scaled_up(group, from, to, pods);
        tracing::info!(%group, "gang scale-up started");
        self.spawn_gang(state, key, record, true, timeout);
    }

    /// Gang scale-ups another leader recorded and did not finish: each is resumed (never raised
    /// again) for what is left of its timeout, then kept or rolled back.
    pub(in crate::controller::reconcile) async fn resume_gangs(
        &self,
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<(), ControllerError> {
        let (ns, cm) = (self.options.namespace.clone(), self.gang_config_map());
        let records = self.actuator.gang_records(&ns, &cm).await?;
        for (key, record) in records {
            let Some(group) = record.groups.first().map(|g| g.group.clone()) else { continue };
            if state.gangs_in_flight.lock().unwrap_or_else(|p| p.into_inner()).contains(&group) {
                continue;
            }
            if record.is_stale(now.as_second()) {
                // Its gang was decided by a leader whose record removal failed: acting on it now
                // would remove whatever was launched since.
                tracing::warn!(%group, started = record.started_unix, "dropping a stale gang record without acting on it");
                self.actuator.put_gang_record(&ns, &cm, &key, None).await?;
                continue;
            }
            let deadline = record.started_unix as f64 + record.timeout_seconds;
            let remaining = secs(deadline - now.as_second() as f64);
            tracing::info!(%group, ?remaining, rolling_back = record.rolling_back, "resuming a gang scale-up a previous leader started");
            self.spawn_gang(state, key, record, false, remaining);
        }
        Ok(())
    }

    /// Runs (or resumes) a recorded gang scale-up in the background, fenced: it stops at once when
    /// leadership is lost, leaving its record for the next leader; its end removes the record.
    fn spawn_gang(
        &self,
        state: &mut LoopState,
        key: String,
        record: GangRecord,
        raise: bool,
        timeout: Duration,
    ) {
        let Some(group) = record.groups.first().map(|g| g.group.clone()) else { return };
        state.gangs_in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(group.clone());
        let providers = self.providers.clone();
        let observer = self.observer.clone();
        let in_flight = state.gangs_in_flight.clone();
        let fence = self.fence.clone();
        let actuator = self.actuator.clone();
        let (ns, cm) = (self.options.namespace.clone(), self.gang_config_map());
        let poll = Duration::from_secs(2)
            .min(secs(self.options.config.gang_timeout_seconds).max(Duration::from_millis(100)));
        let cluster = state.cluster.clone();
        let gang_pods = record.pods.clone();
        tokio::spawn(async move {
            let work = async {
                // Groups are learnt on refresh; a resumed gang may come before any.
                if providers.provider_of(&group).is_none() {
                    providers.refresh().await;
                }
                let Some(provider) = providers.provider_of(&group) else {
                    tracing::warn!(%group, "no configured account owns the gang's group");
                    return;
                };
                let may_write = || fence.holds();
                let mark = |r: &GangRecord| {
                    let r = GangRecord { rolling_back: true, ..r.clone() };
                    let (actuator, ns, cm, key) = (actuator.clone(), ns.clone(), cm.clone(), key.clone());
                    async move { actuator.put_gang_record(&ns, &cm, &key, Some(&r)).await.is_ok() }
                };
                // What a rollback may remove, asked of the cluster as it is then.
                let removable = |instance: &str| match &cluster {
                    Some((nodes, pods)) => {
                        gang_may_remove(instance, &nodes.state(), || pods.state(), &gang_pods)
                    }
                    None => false,
                };
                let sleep = tokio::time::sleep;
                let outcome = if raise {
                    run_gang(provider, &record, true, timeout, poll, sleep, may_write, mark, removable).await
                } else {
                    resume_gang(provider, &record, timeout, poll, sleep, may_write, mark, removable).await
                };
                match outcome {
                    // Leadership lost (a write refused by the cloud write gate, too): the next
                    // leader resumes the record.
                    Ok(GangOutcome::Stopped { .. }) | Err(ProviderError::NotPermitted { .. }) => return,
                    Ok(GangOutcome::Ready { .. }) => tracing::info!(%group, "gang capacity is running"),
                    Ok(GangOutcome::RolledBack { reason, .. }) => {
                        observer.scale_up_failed(&group, &reason);
                        provider.record_scale_up_failure(&group, ErrorClass::OutOfCapacity);
                        observer.backoff(&group, &reason);
                    }
                    Err(e) => observer.scale_up_failed(&group, &e.to_string()),
                }
                if let Err(e) = actuator.put_gang_record(&ns, &cm, &key, None).await {
                    tracing::warn!(%group, error = %e, "removing the gang record failed; the next leader resumes it");
                }
            };
            // Leadership lost mid-wait: stop now, not at the next write.
            tokio::select! {
                _ = work => {}
                _ = fence.lost() => tracing::info!(%group, "leadership lost: the gang scale-up stops; the next leader finishes it"),
            }
            in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&group);
        });
    }
}
