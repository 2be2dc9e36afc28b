//! Everything that writes: the decision step's commands carried out through the clouds and the
//! API server, instances whose nodes never came removed, gang scale-ups run and resumed,
//! ProvisioningRequests' conditions. Every destructive call is asked of [`gate`] first, and every
//! write is fenced by leadership.

use super::decide::eviction_grace;
use super::{Controller, ControllerError, LoopState};
use crate::controller::actuate::Eviction;
use crate::controller::drain::{self, DrainOutcome};
use crate::controller::snapshot::ClusterView;
use crate::controller::status::split_pod;
use crate::controller::{gate, provisioning, readiness};
use crate::model::{ErrorClass, NodeGroup};
use crate::planner::cluster::group_of;
use crate::planner::decide::Command;
use crate::planner::interruption;
use crate::planner::Plan;
use crate::providers::{CloudProvider, ProviderError};
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use std::collections::BTreeMap;
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod gang;

/// How long a pod this process evicted is not evicted again while the watch catches up.
const EVICTION_ECHO_WINDOW: Duration = Duration::from_secs(30);

/// What removing the instances whose nodes never came amounted to.
pub(super) struct StuckRemoval {
    /// Whether any was removed.
    pub(super) removed: bool,
    /// False when leadership was lost before the last one was looked at.
    pub(super) leading: bool,
}

impl Controller {
    /// Removes instances whose nodes never came (and backs their groups off), each as far as
    /// [`gate::may_remove_stuck`] allows, counting those removed in this pass.
    pub(super) async fn remove_stuck_all(
        &self,
        stuck: &[readiness::Stuck],
        view: &ClusterView,
        groups: &[NodeGroup],
    ) -> StuckRemoval {
        let cfg = &self.options.config;
        let mut removed = false;
        let mut in_progress = gate::InProgress::of(view.drains.keys(), &view.snapshot.nodes, groups);
        for s in stuck {
            if !self.leading() {
                return StuckRemoval { removed, leading: false };
            }
            let Some(group) = groups.iter().find(|g| g.id == s.group) else { continue };
            if let Err(why) = gate::may_remove_stuck(group, &in_progress, cfg) {
                tracing::info!(group = %s.group, instance = %s.instance, reason = %s.reason, refused = %why, "not removing an instance whose node did not come");
                continue;
            }
            in_progress.add(Some(&s.group));
            self.remove_stuck(s).await;
            removed = true;
        }
        StuckRemoval { removed, leading: true }
    }

    /// Gives each ProvisioningRequest the conditions this plan decided (after its scale-ups were
    /// asked for), fenced; a request changed since it was read is left to the next pass.
    pub(super) async fn write_request_conditions(
        &self,
        plan: &Plan,
        requests: &Store<DynamicObject>,
        now: Timestamp,
    ) -> Result<(), ControllerError> {
        if plan.provisioning_requests.is_empty() {
            return Ok(());
        }
        let stored: BTreeMap<String, Arc<DynamicObject>> =
            requests.state().into_iter().map(|r| (provisioning::id_of(&r), r)).collect();
        for outcome in &plan.provisioning_requests {
            let Some(r) = stored.get(&outcome.request) else { continue };
            let current = provisioning::conditions_of(r);
            let Some(next) = provisioning::next_conditions(outcome, &current, r.metadata.generation, now)
            else {
                continue;
            };
            let (ns, name) = outcome.request.split_once('/').unwrap_or(("default", &outcome.request));
            let version = r.metadata.resource_version.as_deref().unwrap_or_default();
            if self.actuator.set_request_conditions(ns, name, version, &next).await? {
                for c in next.iter().filter(|c| !current.contains(c)) {
                    tracing::info!(request = %outcome.request, condition = %c.type_, status = %c.status, reason = %c.reason, message = %c.message, "ProvisioningRequest condition");
                    self.observer.request_condition(&outcome.request, r.metadata.uid.as_deref(), c);
                }
            }
        }
        Ok(())
    }

    /// Terminates an instance whose node did not come and deletes its Node if any, then backs
    /// the group off: a group whose instances do not come is not asked again at once.
    async fn remove_stuck(&self, s: &readiness::Stuck) {
        let Some(provider) = self.providers.provider_of(&s.group) else { return };
        tracing::warn!(group = %s.group, instance = %s.instance, reason = %s.reason, "removing an instance whose node did not come");
        if !self.leading() {
            return;
        }
        match provider.delete_instances(&s.group, std::slice::from_ref(&s.instance)).await {
            Ok(()) | Err(ProviderError::InstanceNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(group = %s.group, instance = %s.instance, error = %e, "deleting the instance failed");
                return;
            }
        }
        if let Some(node) = &s.node {
            if let Err(e) = self.actuator.delete_node(node).await {
                tracing::warn!(error = %e, "deleting the node failed");
            }
            self.observer.node_deleted(node, &s.group);
        }
        provider.record_scale_up_failure(&s.group, ErrorClass::Other);
        self.observer.backoff(&s.group, &s.reason);
    }

    /// Carries out the decision step's commands through the clouds and the API, fenced before
    /// every write. Returns whether work is in progress (drains, replacements). The replacement
    /// and drain records live on the Node objects (written before the cloud is asked), so a new
    /// leader neither repeats nor forgets them.
    pub(super) async fn execute(
        &self,
        commands: Vec<Command>,
        view: &mut ClusterView,
        groups: &[NodeGroup],
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<bool, ControllerError> {
        for command in commands {
            if !self.leading() {
                return Ok(true);
            }
            if self.carry_out(command, view, groups, state, now).await?.is_break() {
                return Ok(true);
            }
        }
        Ok(!view.drains.is_empty() || !view.replacing.is_empty() || !state.decide.unneeded_since.is_empty())
    }

    /// One command of [`Self::execute`]; `Break` when leadership was lost on the way.
    async fn carry_out(
        &self,
        command: Command,
        view: &mut ClusterView,
        groups: &[NodeGroup],
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<ControlFlow<()>, ControllerError> {
        match command {
            Command::ScaleGroup { group, from, to, pods, gang } => {
                self.scale_group(&group, from, to, &pods, gang, state, now).await
            }
            Command::RequestReplacement { node, group, from, target } => {
                return self.request_replacement(node, group, from, target, view, now).await
            }
            Command::ReraiseReplacement { group, target, .. } => {
                if let Some(provider) = self.providers.provider_of(&group) {
                    match provider.set_target_size(&group, target).await {
                        Ok(()) | Err(ProviderError::NotPermitted { .. }) => {}
                        Err(e) => self.observer.scale_up_failed(&group, &e.to_string()),
                    }
                }
            }
            Command::GiveUpReplacement { node, reason } => {
                tracing::info!(%node, %reason, "giving the replacement up; keeping the node");
                self.actuator.clear_replacing(&node).await?;
                view.replacing.remove(&node);
            }
            Command::DrainNode { node, reason } => {
                self.drain_node(node, reason, None, view, groups, now).await?
            }
            Command::InterruptNode { node, kind, grace_cap_seconds, deadline, reason } => {
                let evict_at = self.evict_at(&node, deadline, grace_cap_seconds, view, now);
                tracing::warn!(%node, notice = kind.name(), ?grace_cap_seconds, ?evict_at, %reason, "interruption notice: cordoning and draining");
                state.interrupted.insert(node.clone(), (kind, grace_cap_seconds));
                let deadline = deadline.and_then(|d| Timestamp::from_second(d).ok());
                let marks = drain::NoticeMarks { kind, deadline, evict_at };
                self.drain_node(node, reason, Some(marks), view, groups, now).await?
            }
            Command::BackOffGroup { group, reason, .. } => {
                if let Some(provider) = self.providers.provider_of(&group) {
                    let b = provider.record_scale_up_failure(&group, ErrorClass::OutOfCapacity);
                    self.observer.backoff(&group, &format!("{reason} (failure {} in a row)", b.failures));
                }
            }
            Command::Preempt { pod, node, victims, reason } => {
                if !self.preempt(&pod, &node, &victims, &reason, view, state).await {
                    return Ok(Break(()));
                }
            }
            Command::AdvanceDrain { node, wanted } => {
                return self.advance_drain(&node, wanted, view, groups, state, now).await
            }
        }
        Ok(Continue(()))
    }

    /// Records on `node` that a node of `group` replaces it, then raises the group to `target`;
    /// the record is taken back when the raise fails.
    async fn request_replacement(
        &self,
        node: String,
        group: String,
        from: u32,
        target: u32,
        view: &mut ClusterView,
        now: Timestamp,
    ) -> Result<ControlFlow<()>, ControllerError> {
        let Some(provider) = self.providers.provider_of(&group) else { return Ok(Continue(())) };
        if !self.actuator.mark_replacing(&node, &group, target, now).await? {
            return Ok(Continue(()));
        }
        let marks = drain::ReplaceMarks { group: group.clone(), target, requested_at: now };
        view.replacing.insert(node.clone(), marks);
        if !self.leading() {
            return Ok(Break(()));
        }
        match provider.set_target_size(&group, target).await {
            Ok(()) => self.observer.replacement_requested(&node, &group, from, target),
            Err(e) => {
                self.observer.scale_up_failed(&group, &e.to_string());
                self.actuator.clear_replacing(&node).await?;
                view.replacing.remove(&node);
            }
        }
        Ok(Continue(()))
    }

    /// When the pods of `node`, under a notice of the cloud taking it at `deadline`, are evicted
    /// ([`interruption::evict_at`] for the longest grace period among them, a pass of the loop
    /// earlier); `None` for at once.
    fn evict_at(
        &self,
        node: &str,
        deadline: Option<i64>,
        grace_cap: Option<u32>,
        view: &ClusterView,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let cfg = &self.options.config;
        let pods = view.pods_by_node.get(node).map(Vec::as_slice).unwrap_or_default();
        let moving = pods.iter().filter(|p| !p.terminal && !p.is_node_bound());
        let grace = moving.map(|p| p.eviction_grace(cfg)).max()?.min(grace_cap.unwrap_or(u32::MAX));
        let pass = cfg.resync_seconds.max(cfg.batch_max_seconds).ceil() as i64;
        let at = interruption::evict_at(now.as_second(), deadline, grace, &cfg.interruptions) - pass;
        (at > now.as_second()).then(|| Timestamp::from_second(at).ok()).flatten()
    }

    /// Starts draining `node` (cordon and mark it) if [`gate::may_drain`] allows, or for a node
    /// under a `notice`, [`gate::may_drain_noticed`]; the notice's marks go on the Node with the
    /// drain's.
    async fn drain_node(
        &self,
        node: String,
        reason: String,
        notice: Option<drain::NoticeMarks>,
        view: &mut ClusterView,
        groups: &[NodeGroup],
        now: Timestamp,
    ) -> Result<(), ControllerError> {
        let Some(n) = view.snapshot.nodes.iter().find(|n| n.name == node) else { return Ok(()) };
        if self.options.mutant == gate::Mutant::SkipDrain {
            let (pid, group) = (n.provider_id.clone(), gate::member_of(n, groups));
            if let (Some(pid), Some(g)) = (pid, group) {
                if let Some(provider) = self.providers.provider_of(&groups[g].id) {
                    let _ = provider.delete_instances(&groups[g].id, &[pid]).await;
                    self.actuator.delete_node(&node).await?;
                    self.observer.node_deleted(&node, &groups[g].id);
                }
            }
            return Ok(());
        }
        let in_progress = gate::InProgress::of(view.drains.keys(), &view.snapshot.nodes, groups);
        let allowed = match notice.as_ref().map(|n| n.kind) {
            Some(kind) => gate::may_drain_noticed(n, kind, groups, &in_progress, &self.options.config),
            None => gate::may_drain(n, groups, &in_progress, &self.options.config),
        };
        if let Err(why) = allowed {
            tracing::info!(%node, %reason, refused = %why, "not draining the node");
            return Ok(());
        }
        if self.actuator.start_drain(&node, &reason, now, notice.as_ref()).await? {
            self.observer.drain_started(&node, &reason);
            let marks =
                drain::DrainMarks { started_at: now, reason, evicted: false, was_cordoned: false, notice };
            view.drains.insert(node, marks);
        }
        Ok(())
    }

    /// One step of `node`'s drain ([`drain::step`]): evict what may go, then give the node back
    /// or finish it. `Break` when leadership was lost between evictions.
    async fn advance_drain(
        &self,
        node: &str,
        wanted: bool,
        view: &ClusterView,
        groups: &[NodeGroup],
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<ControlFlow<()>, ControllerError> {
        let cfg = &self.options.config;
        let Some(marks) = view.drains.get(node).cloned() else { return Ok(Continue(())) };
        let pods = view.pods_by_node.get(node).cloned().unwrap_or_default();
        // A node under an interruption notice is drained whatever the plan says: it is going.
        let notice = state.interrupted.get(node).copied();
        let cap = notice.and_then(|(_, cap)| cap);
        let wanted = wanted || notice.is_some();
        let step = drain::step(&marks, wanted, &pods, cfg, now);
        // A noticed node's pods keep running until their eviction time, while the replacement
        // boots; once an eviction was attempted, the drain goes on.
        let evict_at = marks.notice.as_ref().and_then(|n| n.evict_at);
        let hold = notice.is_some() && !marks.evicted && evict_at.is_some_and(|t| now < t);
        if hold && !step.evict.is_empty() {
            tracing::debug!(%node, ?evict_at, "interruption notice: the pods run until their eviction time");
            return Ok(Continue(()));
        }
        for (pod, reason) in &step.blocked {
            self.observer.eviction_blocked(pod, node, reason);
        }
        if !step.evict.is_empty() && !marks.evicted {
            self.actuator.mark_evicting(node).await?;
        }
        for id in &step.evict {
            if !self.leading() {
                return Ok(Break(()));
            }
            let grace = eviction_grace(view, node, id, cfg).min(cap.unwrap_or(u32::MAX));
            self.evict_once(id, node, grace, state, |e| match e {
                Eviction::Evicted => tracing::info!(pod = %id, %node, "evicted"),
                Eviction::Refused(message) => self.observer.eviction_blocked(
                    id,
                    node,
                    &format!("eviction refused (429), retrying later: {message}"),
                ),
                Eviction::Gone => {}
            })
            .await;
        }
        match step.outcome {
            DrainOutcome::Continue => {}
            DrainOutcome::Abort { reason } => {
                tracing::info!(%node, %reason, "giving the node back");
                self.actuator.abort_drain(node).await?;
                // Unneeded for the whole window again before another drain.
                state.decide.unneeded_since.remove(node);
                if marks.evicted {
                    let group = view.snapshot.nodes.iter().find(|n| n.name == node);
                    let group = group.and_then(|n| group_of(n, groups)).map_or("", |g| &groups[g].id);
                    self.observer.drain_abandoned(node, group, &reason);
                }
            }
            DrainOutcome::Finish => {
                let leaving = notice.is_some_and(|(kind, _)| kind.is_involuntary());
                self.finish(node, leaving, view, groups).await?
            }
        }
        Ok(Continue(()))
    }

    /// Carries out a preemption all or nothing: each victim's eviction is first asked as a dry
    /// run, and if the API would refuse one (a PodDisruptionBudget, an error) none is evicted:
    /// with only some gone the claimant would not fit, and the next plan would evict others for
    /// it. Then the claimant is nominated to the node, as kube-scheduler does, before its victims
    /// are evicted: while they terminate, the decision step evicts nothing more for it, in this
    /// process or the next leader. False when leadership was lost.
    async fn preempt(
        &self,
        pod: &str,
        node: &str,
        victims: &[String],
        reason: &str,
        view: &ClusterView,
        state: &mut LoopState,
    ) -> bool {
        for id in victims {
            if !self.leading() {
                return false;
            }
            let (ns, name) = split_pod(id);
            let refused = match self.actuator.evict_dry_run(ns, name).await {
                Ok(Eviction::Evicted | Eviction::Gone) => continue,
                Ok(Eviction::Refused(message)) => format!("would be refused (429): {message}"),
                Err(e) if e.is_not_leading() => return false,
                Err(e) => format!("failed its dry run: {e}"),
            };
            let n = victims.len();
            let why = format!("preemption for {pod} {refused}; none of its {n} victim(s) evicted");
            self.observer.eviction_blocked(id, node, &why);
            return true;
        }
        let (ns, name) = split_pod(pod);
        match self.actuator.nominate(ns, name, node).await {
            Ok(true) => {}
            Ok(false) => return true, // the claimant is gone: nothing to make room for
            Err(e) if e.is_not_leading() => return false,
            Err(e) => {
                tracing::warn!(pod, node, error = %e, "nominating the preemptor failed; retrying at the next pass");
                return true;
            }
        }
        for id in victims {
            if !self.leading() {
                return false;
            }
            let grace = eviction_grace(view, node, id, &self.options.config);
            self.evict_once(id, node, grace, state, |e| match e {
                Eviction::Evicted => self.observer.preempted(id, node, pod, reason),
                Eviction::Refused(message) => self.observer.eviction_blocked(
                    id,
                    node,
                    &format!("preemption for {pod} refused (429) after its dry run passed: {message}"),
                ),
                Eviction::Gone => {}
            })
            .await;
        }
        true
    }

    /// Evicts pod `id` (`namespace/name`) from `node` through the Eviction API (fenced by the
    /// actuator) unless this process evicted it moments ago and its deletion has not reached the
    /// store yet; `outcome` hears how it went. One failed eviction does not hold up the others:
    /// the next pass retries it.
    async fn evict_once(
        &self,
        id: &str,
        node: &str,
        grace_seconds: u32,
        state: &mut LoopState,
        outcome: impl FnOnce(Eviction),
    ) {
        state.evicted_at.retain(|_, at| at.elapsed() < EVICTION_ECHO_WINDOW);
        if state.evicted_at.contains_key(id) {
            return;
        }
        let (ns, name) = id.split_once('/').unwrap_or(("default", id));
        match self.actuator.evict(ns, name, grace_seconds).await {
            Ok(e) => {
                if e == Eviction::Evicted {
                    state.evicted_at.insert(id.to_string(), Instant::now());
                }
                outcome(e);
            }
            Err(e) => {
                tracing::warn!(pod = id, node, error = %e, "eviction failed; retrying at the next pass")
            }
        }
    }

    /// Deletes a drained node's instance from its group, then the Node. A `reclaimed` node (under
    /// an involuntary notice) that the gate may not terminate is left to the cloud, cordoned.
    async fn finish(
        &self,
        node: &str,
        reclaimed: bool,
        view: &ClusterView,
        groups: &[NodeGroup],
    ) -> Result<(), ControllerError> {
        let Some(n) = view.snapshot.nodes.iter().find(|n| n.name == node) else { return Ok(()) };
        let pods = view.pods_by_node.get(node).map(Vec::as_slice).unwrap_or_default();
        // Deleted already (by this process a pass ago, whose Node deletion the store has not shown
        // yet, or by a leader that crashed before deleting the Node): deleting it again would
        // shrink the group a second time on clouds that decrement on delete. Its drain started
        // only on a confirmed member ([`gate::may_drain`]), so an instance no group lists as
        // running any more is gone: only its Node is left to delete, once its pods are.
        let gone = gate::member_of(n, groups).is_none();
        if gone && pods.iter().all(|p| p.terminal || p.is_node_bound()) {
            self.actuator.delete_node(node).await?;
            return Ok(());
        }
        let others = view.drains.keys().filter(|d| d.as_str() != node);
        let in_progress = gate::InProgress::of(others, &view.snapshot.nodes, groups);
        let group = match gate::may_terminate(n, pods, groups, &in_progress) {
            Ok(g) => &groups[g],
            // A node the cloud is taking anyway stays cordoned and empty until it does: given
            // back, pods would be scheduled onto it just before it goes.
            Err(why) if reclaimed => {
                tracing::info!(node, refused = %why, "not terminating the drained noticed node; the cloud takes it");
                return Ok(());
            }
            Err(why) => {
                tracing::warn!(node, refused = %why, "not removing the drained node; giving it back");
                self.actuator.abort_drain(node).await?;
                let group = group_of(n, groups).map_or("", |g| &groups[g].id);
                self.observer.drain_abandoned(node, group, &why);
                return Ok(());
            }
        };
        let Some(instance) = n.provider_id.clone() else { return Ok(()) };
        let Some(provider) = self.providers.provider_of(&group.id) else { return Ok(()) };
        if !self.leading() {
            return Ok(());
        }
        match provider.delete_instances(&group.id, std::slice::from_ref(&instance)).await {
            Ok(()) | Err(ProviderError::InstanceNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(node, group = %group.id, error = %e, "deleting the drained instance failed; retrying next pass");
                return Ok(());
            }
        }
        self.actuator.delete_node(node).await?;
        self.observer.node_deleted(node, &group.id);
        Ok(())
    }
}
