//! The controller loop: reflectors, batching, leader gating, plan, actuate.
//!
//! One pass (`Controller::reconcile_once`) runs along one seam: `observe` refreshes the node
//! groups from the clouds and builds the view from the reflector stores; `decide` (pure) finds
//! instances whose nodes never came, plans, and turns the plan into commands; `act` removes the
//! stuck instances (backing their groups off) and — when leading and not in dry-run — raises group
//! targets (atomically for gangs), starts drains of nodes that have been unneeded long enough and
//! advances every drain in progress, each destructive call through [`super::gate`]. Nothing is
//! kept only in memory that a restart would need: targets are absolute, in-flight capacity is
//! recomputed from group targets and registering nodes, and drain state is on the Node objects.

mod act;
mod decide;
mod observe;

pub(crate) use observe::pod_group_resource;

use super::actuate::{ApiError, KubeActuator};
use super::batch::Batcher;
use super::config::{secs, ControllerConfig};
use super::gate;
use super::leader::{Fence, LeaderElector};
use super::pod_store::PodStore;
use super::providers::ProviderSet;
use super::readiness;
use super::snapshot;
use super::Observer;
use crate::k8s::SnapshotError;
use crate::model::NoticeKind;
use crate::planner::decide::{self as step, Observed};
use crate::planner::interruption::{self, InterruptionSettings, InterruptionState};
use crate::planner::{PlacementHints, PlannerSettings};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use kube::Client;
use observe::{Pass, Stores};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use thiserror::Error;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// A controller failure that stops the loop.
#[derive(Debug, Error)]
pub enum ControllerError {
    /// A watch ended before listing its objects once.
    #[error("watch of {kind} ended before its first complete list")]
    NotSynced {
        /// Kind watched.
        kind: &'static str,
    },
    /// An API write failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The stored objects could not be converted.
    #[error("converting the cluster state: {0}")]
    Snapshot(SnapshotError),
    /// The API server does not serve a resource the loop needs (an older Kubernetes).
    #[error("the API server does not serve {what}; gpuscale needs Kubernetes 1.25 or newer (the chart's kubeVersion)")]
    NotServed {
        /// The resource.
        what: &'static str,
    },
    /// The API server refused a read the controller cannot work without: retrying would only
    /// hide a missing RBAC rule or a bad token behind a loop of warnings.
    #[error("the API server refused to {what} ({code}): {message}; does the controller's ServiceAccount have the chart's RBAC?")]
    Refused {
        /// What was asked, e.g. `list nodes`.
        what: String,
        /// HTTP status (401 or 403).
        code: u16,
        /// The server's message.
        message: String,
    },
}

/// By hand rather than `#[from]`, which would also make the error the `source()` of a message
/// that already holds it (reports would print it twice).
impl From<SnapshotError> for ControllerError {
    fn from(e: SnapshotError) -> Self {
        ControllerError::Snapshot(e)
    }
}

/// How one controller process runs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// The `controller:` config section.
    pub config: ControllerConfig,
    /// The `planner:` config section.
    pub planner: PlannerSettings,
    /// Holder identity in the Lease (the pod name).
    pub identity: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// Plan and report, never act.
    pub dry_run: bool,
    /// Advance simulated clouds by real elapsed time (off when a test harness drives them).
    pub drive_simulated_clock: bool,
    /// A rule broken on purpose, for the fault-injection suite's proof that its invariants fire
    /// (`tests/e2e/k8s_safety.rs`); no config key or flag reaches it.
    #[doc(hidden)]
    pub mutant: gate::Mutant,
}

/// The in-cluster controller.
pub struct Controller {
    client: Client,
    providers: Arc<ProviderSet>,
    options: ControllerOptions,
    observer: Arc<dyn Observer>,
    actuator: KubeActuator,
    /// Whether this replica may act now; checked before every write.
    fence: Fence,
    /// Where the elector publishes the claim behind `fence`.
    claim: Option<watch::Sender<Option<tokio::time::Instant>>>,
}

/// Memory of the loop; all of it can be lost on restart (it only delays decisions).
struct LoopState {
    batcher: Batcher,
    first_seen: BTreeMap<String, Timestamp>,
    /// When each node whose GPUs regressed was first seen unready.
    unready_since: BTreeMap<String, i64>,
    /// The Node and Pod caches, for gang rollbacks deciding in the background which instances
    /// hold other work.
    cluster: Option<(Store<Node>, PodStore)>,
    /// The decision step's memory (timers; what is under way is re-read from the Nodes).
    decide: step::LoopState,
    gangs_in_flight: Arc<Mutex<BTreeSet<String>>>,
    /// Whether this leadership term has resumed the gang scale-ups recorded by earlier leaders.
    gangs_resumed: bool,
    /// Pods this process evicted, and when: the pod watch may not have shown their deletion by
    /// the next pass, and a second eviction of a terminating pod is wasted (the real API answers
    /// 201 again). Lost on restart, which only costs one repeated eviction.
    evicted_at: BTreeMap<String, Instant>,
    /// Each Node's conversion and the pods' order, kept until they change.
    assembly: snapshot::AssemblyCache,
    /// Where the last plan put pending pods, tried first by the next ([`PlacementHints`]).
    hints: PlacementHints,
    /// This pass's raises: targets set, and groups whose raise failed for capacity (the pass
    /// re-plans without them, [`Controller::fall_back`]).
    raises: PassRaises,
    /// Nodes drained for an interruption notice: the notice's kind and the grace cap that fits
    /// its window. Rebuilt each pass from the notices of draining nodes, so a restarted
    /// controller keeps draining them too.
    interrupted: BTreeMap<String, (NoticeKind, Option<u32>)>,
    /// The interruption step's memory (notices acted on).
    interruption: InterruptionState,
}

/// What the scale-ups of one pass did, for the capacity fallback within the pass.
#[derive(Debug, Default)]
struct PassRaises {
    /// Groups raised, with the target set.
    raised: BTreeMap<String, u32>,
    /// Groups whose raise failed for lack of capacity (or was refused as backing off), with why.
    failed: BTreeMap<String, String>,
}

impl LoopState {
    /// An empty memory, with the batch windows of `cfg`.
    fn new(cfg: &ControllerConfig) -> Self {
        LoopState {
            batcher: Batcher::new(secs(cfg.batch_idle_seconds), secs(cfg.batch_max_seconds)),
            first_seen: BTreeMap::new(),
            unready_since: BTreeMap::new(),
            cluster: None,
            decide: step::LoopState::default(),
            gangs_in_flight: Arc::new(Mutex::new(BTreeSet::new())),
            gangs_resumed: false,
            evicted_at: BTreeMap::new(),
            assembly: Default::default(),
            hints: Default::default(),
            raises: Default::default(),
            interrupted: BTreeMap::new(),
            interruption: InterruptionState::default(),
        }
    }
}

/// When the loop wakes next, and what it remembers between wake-ups.
struct Schedule {
    /// Whether this replica led at the last wake-up.
    was_leading: bool,
    /// The last wake-up, for advancing simulated clouds by the time since.
    last_tick: Instant,
    /// When the next pass is due without a batch of pending pods.
    next_pass: Instant,
    /// When the open batch of pending pods closes.
    batch_close: Option<Instant>,
}

/// The Lease election beside the loop. A dry-run replica acts on nothing, so it does not take
/// part (holding the Lease would stop the acting controller): it keeps its claim unused instead.
struct Election {
    task: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    /// A dry-run replica's claim, never sent on but held: the loop stops when the fence's channel
    /// closes.
    _never_leading: Option<watch::Sender<Option<tokio::time::Instant>>>,
}

impl Election {
    /// Stops the elector, which releases the Lease.
    async fn stop(self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

impl Controller {
    /// A controller on `client` acting through `providers`, reporting to `observer`.
    pub fn new(
        client: Client,
        providers: Arc<ProviderSet>,
        options: ControllerOptions,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let (claim, mut fence) = Fence::channel();
        if options.mutant == gate::Mutant::IgnoreLease {
            fence = fence.ignoring_lease();
        }
        let mut options = options;
        if options.mutant == gate::Mutant::IgnoreParallelism {
            options.config.max_scale_down_parallelism = u32::MAX;
        }
        let actuator = KubeActuator::new(client.clone(), fence.clone()).with_mutant(options.mutant);
        // Cloud writes wait for rate-limit tokens and retry after backoffs (`Polite`): each
        // attempt is checked against the fence, not only the first.
        providers.set_write_gate(Arc::new({
            let fence = fence.clone();
            move || fence.holds()
        }));
        Self { client, providers, options, observer, actuator, fence, claim: Some(claim) }
    }

    /// This controller's leadership, for the tasks beside it that write (the status publisher).
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Runs until `shutdown` turns true. Dropping the future stops everything it started (as a
    /// crash would); a clean shutdown also releases the Lease.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), ControllerError> {
        let notify = Arc::new(Notify::new());
        let (stores, tasks) = observe::watch(&self.client, &self.options.config, notify.clone()).await?;
        tokio::select! {
            r = stores.synced() => r?,
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
        }
        tracing::info!(identity = %self.options.identity, dry_run = self.options.dry_run, "caches synced");
        self.observer.caches_synced();

        let election = self.elect();
        self.run_loop(&stores, &notify, &mut shutdown).await;
        drop(tasks);
        election.stop().await;
        Ok(())
    }

    /// Starts the Lease election that opens the fence (see [`Election`]).
    fn elect(&mut self) -> Election {
        let cfg = &self.options.config;
        let claim = self.claim.take().expect("run is called once");
        let (stop, stop_rx) = watch::channel(false);
        if self.options.dry_run {
            return Election { task: None, stop, _never_leading: Some(claim) };
        }
        let elector = LeaderElector::new(
            self.client.clone(),
            &self.options.namespace,
            &cfg.lease.name,
            &self.options.identity,
            std::time::Duration::from_secs(u64::from(cfg.lease.duration_seconds)),
        );
        let run = elector.run(
            secs(cfg.lease.renew_seconds),
            secs(cfg.lease.renew_deadline_seconds),
            claim,
            stop_rx,
        );
        Election { task: Some(tokio::spawn(run)), stop, _never_leading: None }
    }

    /// Sleeps until something changes (a watched object, leadership, a pass or batch falling
    /// due) and wakes, until `shutdown` turns true.
    async fn run_loop(&self, stores: &Stores, notify: &Notify, shutdown: &mut watch::Receiver<bool>) {
        let mut state = LoopState::new(&self.options.config);
        let mut lead_rx = self.fence.clone();
        let mut schedule = Schedule {
            was_leading: false,
            last_tick: Instant::now(),
            next_pass: Instant::now(),
            batch_close: None,
        };
        loop {
            let wake = schedule.batch_close.map_or(schedule.next_pass, |b| b.min(schedule.next_pass));
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
                r = lead_rx.changed() => {
                    if r.is_err() { break; }
                }
                _ = shutdown.wait_for(|s| *s) => break,
            }
            self.wake(stores, &mut state, &mut schedule).await;
        }
    }

    /// One wake-up: follows leadership, advances simulated clouds, and runs a pass when one is
    /// due ([`decide::pass_due`]) and this replica leads or only plans.
    async fn wake(&self, stores: &Stores, state: &mut LoopState, schedule: &mut Schedule) {
        let leader = self.fence.holds();
        if leader != schedule.was_leading {
            schedule.was_leading = leader;
            self.observer.leadership(leader);
            if leader {
                schedule.next_pass = Instant::now();
            } else {
                // The next term resumes whatever gang scale-ups are recorded then.
                state.gangs_resumed = false;
            }
        }
        let tick = Instant::now();
        if self.options.drive_simulated_clock {
            self.providers.advance_simulated(tick - schedule.last_tick);
        }
        schedule.last_tick = tick;
        let now = Timestamp::now();
        state.batcher.observe(snapshot::pending_pod_ids(&stores.pods.state()), now);
        let (due, batch_close) = decide::pass_due(state.batcher.state(now), now, tick, schedule.next_pass);
        schedule.batch_close = batch_close;
        let resync = secs(self.options.config.resync_seconds);
        if !due || !(self.options.dry_run || leader) {
            if tick >= schedule.next_pass {
                schedule.next_pass = tick + resync;
            }
            return;
        }
        state.batcher.close();
        let busy = match self.reconcile_once(stores, state, now).await {
            Ok(busy) => busy,
            Err(ControllerError::Api(e)) if e.is_not_leading() => {
                tracing::info!(error = %e, "leadership lost mid-pass; stopped acting");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "reconcile failed; retrying at the next pass");
                true
            }
        };
        schedule.next_pass = Instant::now() + decide::pass_interval(busy, resync);
    }

    fn leading(&self) -> bool {
        self.fence.holds()
    }

    /// One pass: observe, decide, act. Returns whether work is in progress (drains, instances
    /// waiting), so the next pass comes sooner.
    async fn reconcile_once(
        &self,
        stores: &Stores,
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<bool, ControllerError> {
        let started = Instant::now();
        let (cfg, dry) = (&self.options.config, self.options.dry_run);
        let Pass { mut groups, mut view } = self.observe(stores, state, now).await?;

        // Instances whose nodes never came: remove them, back the group off.
        let stuck = readiness::stuck_instances(
            &groups,
            &view.snapshot.nodes,
            &view.snapshot.workloads,
            &state.first_seen,
            now,
            secs(cfg.registration_timeout_seconds),
        );
        let mut busy = decide::in_motion(&view, &groups);
        if !dry {
            let removal = self.remove_stuck_all(&stuck, &view, &groups).await;
            busy |= removal.removed;
            if !removal.leading {
                return Ok(busy);
            }
        }

        state.raises = PassRaises::default();
        if !dry && self.leading() {
            busy |= self.react_to_notices(&mut view, &mut groups, state, now).await?;
        }
        let settings = decide::planner_settings(&self.options.planner, cfg, now);
        let unavailable = self.providers.unavailable(&groups);
        let plan = decide::plan(&mut view, &groups, unavailable, &mut state.hints, &settings);
        self.observer.plan_computed(&plan, &view.snapshot, dry, started.elapsed());
        if dry || !self.leading() {
            return Ok(busy);
        }
        if !state.gangs_resumed {
            self.resume_gangs(state, now).await?;
            state.gangs_resumed = true;
        }
        let gangs_in_flight = state.gangs_in_flight.lock().unwrap_or_else(|p| p.into_inner()).clone();
        busy |= !gangs_in_flight.is_empty();
        // The decision step: the same one the replays run.
        let observed =
            Observed { snapshot: &view.snapshot, groups: &groups, gangs_in_flight: &gangs_in_flight };
        let (commands, next) = decide::decide_from_marks(
            &plan,
            &state.decide,
            &view.replacing,
            &view.drains,
            observed,
            now,
            &cfg.decide_settings(),
        );
        state.decide = next;
        busy |= self.execute(commands, &mut view, &groups, state, now).await?;
        self.fall_back(&mut view, &groups, &gangs_in_flight, &settings, state, now).await?;
        if let Some(p) = &stores.provisioning {
            self.write_request_conditions(&plan, &p.requests, now).await?;
        }
        Ok(busy)
    }

    /// The interruption step ([`interruption::react`]) on the notices of the accounts'
    /// interruption queues and of the Nodes' taints:
    /// replacements raised, reclaimed pools backed off, noticed nodes cordoned and drained within
    /// their window, before the pass plans (which then counts the replacements as in flight).
    /// A node whose drain is already marked is not acted on again, so a restarted controller or a
    /// new leader does not launch a second replacement. Returns whether anything was done.
    async fn react_to_notices(
        &self,
        view: &mut snapshot::ClusterView,
        groups: &mut [crate::model::NodeGroup],
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<bool, ControllerError> {
        state.interrupted.retain(|n, _| view.drains.contains_key(n));
        let settings = self.options.config.interruptions;
        // A drain started for a notice says so on the Node: a restarted controller or a new
        // leader goes on with it as noticed, though the notice itself may be gone (a queue
        // message is deleted once handled), its pods' grace capped to the deadline written.
        for (name, marks) in &view.drains {
            if let Some(n) = &marks.notice {
                let deadline = n.deadline.map(|d| d.as_second());
                let notice = crate::model::Notice {
                    kind: n.kind,
                    instance: String::new(),
                    issued_at: now.as_second(),
                    deadline,
                };
                let cap = interruption::grace_cap(&notice, now.as_second(), &settings);
                state.interrupted.entry(name.clone()).or_insert((n.kind, cap));
            }
        }
        let queued = self.providers.receive_notices().await;
        let mut notices = interruption::notices_from_taints(&view.snapshot.nodes, now.as_second());
        notices.extend(queued.iter().flat_map(|(_, d)| d.notices.iter().cloned()));
        if notices.is_empty() {
            // Messages with nothing to act on (an instance starting, garbage) are done with.
            let done: Vec<(usize, String)> = queued.into_iter().map(|(a, d)| (a, d.receipt)).collect();
            self.providers.acknowledge_notices(&done).await;
            return Ok(false);
        }
        // A node the cloud takes that is already draining (marked by this process or the one
        // before a restart) is drained as noticed: whatever the plan says, with its grace capped.
        for notice in &notices {
            let node = view
                .snapshot
                .nodes
                .iter()
                .find(|n| n.provider_id.as_deref().is_some_and(|p| notice.is_for(p)));
            if let Some(n) =
                node.filter(|n| notice.kind.is_involuntary() && view.drains.contains_key(&n.name))
            {
                let cap = interruption::grace_cap(notice, now.as_second(), &settings);
                state.interrupted.entry(n.name.clone()).or_insert((notice.kind, cap));
            }
        }
        let (mut commands, next) = self.notice_commands(&notices, view, groups, state, now, &settings);
        state.interruption = next;
        // A taint carries no deadline (the one read from it is assumed from when this process
        // first saw it, maybe long after it was set): only a deadline the cloud stated in a
        // queue message lets the pods run on until their eviction time.
        for c in &mut commands {
            if let step::Command::InterruptNode { node, deadline, .. } = c {
                let pid = view
                    .snapshot
                    .nodes
                    .iter()
                    .find(|n| n.name == *node)
                    .and_then(|n| n.provider_id.as_deref());
                let stated =
                    pid.is_some_and(|p| queued.iter().any(|(_, d)| d.notices.iter().any(|n| n.is_for(p))));
                if !stated {
                    *deadline = None;
                }
            }
        }
        let acted = !commands.is_empty();
        if acted {
            self.execute(commands, view, groups, state, now).await?;
            for g in groups.iter_mut() {
                if let Some(&to) = state.raises.raised.get(&g.id) {
                    g.target_size = g.target_size.max(to);
                }
            }
        }
        // A queue message is deleted once every notice in it is handled (acted on, or found to
        // need nothing), after the acts: a crash before leaves it to come back, and the node's
        // drain mark makes it handled then. A notice for a node that may not be drained yet
        // stays in the queue and comes back after the queue's visibility timeout.
        let done: Vec<(usize, String)> = queued
            .into_iter()
            .filter(|(_, d)| d.notices.iter().all(|n| state.interruption.handled.contains_key(&n.instance)))
            .map(|(a, d)| (a, d.receipt))
            .collect();
        if self.leading() {
            self.providers.acknowledge_notices(&done).await;
        }
        Ok(acted)
    }

    /// [`interruption::react`] with the gate's answer for each noticed node.
    fn notice_commands(
        &self,
        notices: &[crate::model::Notice],
        view: &snapshot::ClusterView,
        groups: &[crate::model::NodeGroup],
        state: &LoopState,
        now: Timestamp,
        settings: &InterruptionSettings,
    ) -> (Vec<step::Command>, InterruptionState) {
        let handled: BTreeSet<String> = view.drains.keys().cloned().collect();
        // The gate's answer for each node in the order the step asks, counting the drains it
        // will start, so that a node the step replaces is one whose drain then starts.
        let in_progress =
            RefCell::new(gate::InProgress::of(view.drains.keys(), &view.snapshot.nodes, groups));
        let drainable = |n: &crate::model::Node, kind: NoticeKind| {
            let mut in_progress = in_progress.borrow_mut();
            match gate::may_drain_noticed(n, kind, groups, &in_progress, &self.options.config) {
                Ok(g) => {
                    in_progress.add(Some(&groups[g].id));
                    true
                }
                Err(why) => {
                    tracing::debug!(node = %n.name, refused = %why, "not draining the noticed node");
                    false
                }
            }
        };
        let unavailable = self.providers.unavailable(groups);
        let gangs = state.gangs_in_flight.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let observed = Observed { snapshot: &view.snapshot, groups, gangs_in_flight: &gangs };
        interruption::react(
            notices,
            &state.interruption,
            observed,
            interruption::NodeReach { handled: &handled, drainable: &drainable },
            &unavailable,
            now.as_second(),
            settings,
        )
    }

    /// Capacity fallback within the pass: when a raise failed for lack of capacity, plans again
    /// with that group (and every group sharing its offering) unavailable and the raises that
    /// went through counted as in flight, and carries out the new plan's scale-ups, so the next
    /// cheapest group that fits the pods (another zone, capacity type or GPU model they accept)
    /// is asked now rather than a pass later. Bounded: each round needs a new failure, and a
    /// group fails at most once per pass.
    async fn fall_back(
        &self,
        view: &mut snapshot::ClusterView,
        groups: &[crate::model::NodeGroup],
        gangs_in_flight: &BTreeSet<String>,
        settings: &PlannerSettings,
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<(), ControllerError> {
        let mut failed: BTreeMap<String, String> = BTreeMap::new();
        for _ in 0..groups.len() {
            let new: BTreeMap<String, String> = std::mem::take(&mut state.raises.failed)
                .into_iter()
                .filter(|(g, _)| !failed.contains_key(g))
                .collect();
            if new.is_empty() || !self.leading() {
                return Ok(());
            }
            failed.extend(new);
            let mut groups = groups.to_vec();
            for g in &mut groups {
                if let Some(&to) = state.raises.raised.get(&g.id) {
                    g.target_size = g.target_size.max(to);
                }
            }
            let mut unavailable = self.providers.unavailable(&groups);
            for (g, why) in &failed {
                unavailable.entry(g.clone()).or_insert_with(|| why.clone());
            }
            tracing::info!(failed = ?failed.keys().collect::<Vec<_>>(), "a raise failed for capacity; planning again without it");
            let plan = decide::plan(view, &groups, unavailable, &mut state.hints, settings);
            let observed = Observed { snapshot: &view.snapshot, groups: &groups, gangs_in_flight };
            let commands = step::scale_ups(&plan, observed, &state.decide.replacing);
            self.execute(commands, view, &groups, state, now).await?;
        }
        Ok(())
    }
}
