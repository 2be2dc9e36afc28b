//! An in-memory cloud that behaves like an Auto Scaling group / managed instance group.
//!
//! Plans, the CLI and tests need a cloud that boots instances late, runs out of capacity and
//! loses spot instances, without an account or a network. [`SimulatedCloud`] does that on a
//! virtual clock ([`SimulatedCloud::advance`]); randomness comes from a seeded RNG, so a run is
//! reproducible. It never sleeps and is safe to share between tasks (state behind a mutex that is
//! never held across an await).

use super::catalog::{self, Cloud};
use super::config::{ProviderConfig, ProviderKind, SimulationConfig};
use super::{CloudProvider, ProviderError};
use crate::model::{CapacityType, ErrorClass, Instance, InstanceState, NodeGroup};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Behaviour knobs of a simulated cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulationSettings {
    /// Launch to Running.
    pub boot: Duration,
    /// Probability that a launch fails out-of-capacity.
    pub capacity_error_rate: f64,
    /// Interruptions per running spot instance per hour.
    pub spot_interruptions_per_hour: f64,
    /// Most live (pending or running) instances per zone across the account.
    pub zone_capacity: BTreeMap<String, u32>,
    /// How long before an interrupted spot instance is reclaimed its notice is issued (AWS: two
    /// minutes, GCP: thirty seconds); zero: reclaimed without notice.
    pub interruption_notice: Duration,
    /// Probability that a spot launch fails for capacity, when it differs from on-demand's
    /// (`capacity_error_rate`): spot pools run dry more often.
    pub spot_capacity_error_rate: Option<f64>,
    /// How long a failed launch stays visible before the group retries it.
    pub launch_retry: Duration,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SimulationSettings {
    fn default() -> Self {
        Self::from(&SimulationConfig::default())
    }
}

impl From<&SimulationConfig> for SimulationSettings {
    fn from(c: &SimulationConfig) -> Self {
        Self {
            boot: Duration::from_secs(c.boot_seconds),
            capacity_error_rate: c.capacity_error_rate,
            spot_interruptions_per_hour: c.spot_interruptions_per_hour,
            zone_capacity: c.zone_capacity.clone(),
            interruption_notice: Duration::ZERO,
            spot_capacity_error_rate: None,
            launch_retry: Duration::from_secs(60),
            seed: c.seed,
        }
    }
}

/// One entry of the operation log: API calls in the order they were made, and what the cloud did
/// on its own (launches, boots, failures, interruptions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Operation {
    /// `refresh` was called.
    Refresh,
    /// `set_target_size` was called.
    SetTargetSize {
        /// Group id.
        group: String,
        /// Target before the call.
        from: u32,
        /// Requested target.
        to: u32,
        /// Error returned, if any.
        error: Option<String>,
    },
    /// `delete_instances` was called.
    DeleteInstances {
        /// Group id.
        group: String,
        /// Instances named in the call.
        instances: Vec<String>,
        /// Error returned, if any.
        error: Option<String>,
    },
    /// An instance was launched and is booting.
    Launched {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
    },
    /// A launch failed for lack of capacity.
    LaunchFailed {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
        /// Cloud message.
        message: String,
    },
    /// An instance finished booting.
    Running {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
    },
    /// A spot instance was warned that it will be reclaimed at `deadline` (virtual time).
    InterruptionNotice {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
        /// When it is reclaimed, seconds of virtual time.
        deadline: u64,
    },
    /// A spot instance was reclaimed by the cloud.
    SpotInterrupted {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
    },
    /// An instance is gone.
    Terminated {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
    },
}

/// An [`Operation`] with the virtual time it happened at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationRecord {
    /// Virtual time since the cloud was created.
    pub at: Duration,
    /// What happened.
    #[serde(flatten)]
    pub op: Operation,
}

#[derive(Debug, Clone)]
struct SimInstance {
    id: String,
    zone: String,
    state: InstanceState,
    /// Launch time.
    created: Duration,
    /// When a noticed spot interruption reclaims it.
    reclaim_at: Option<Duration>,
}

#[derive(Debug, Clone)]
struct SimGroup {
    group: NodeGroup,
    /// Whether provider ids take the AWS form.
    aws_ids: bool,
    instances: Vec<SimInstance>,
    launched: u64,
}

#[derive(Debug)]
struct State {
    now: Duration,
    rng: ChaCha8Rng,
    settings: SimulationSettings,
    groups: BTreeMap<String, SimGroup>,
    log: Vec<OperationRecord>,
    /// Groups whose raises the API call itself refuses for capacity, with the message.
    refuse_raises: BTreeMap<String, String>,
}

/// A simulated cloud account (see the module docs).
#[derive(Debug)]
pub struct SimulatedCloud {
    account: String,
    state: Mutex<State>,
}

fn is_live(s: &InstanceState) -> bool {
    matches!(s, InstanceState::Pending | InstanceState::Running)
}

/// Instances that occupy a slot of the target: live ones and failed launches not yet retried.
fn occupies_slot(s: &InstanceState) -> bool {
    !matches!(s, InstanceState::Terminating)
}

impl SimulatedCloud {
    /// A simulated account with `groups`; each group starts with `target_size` running instances
    /// (an existing cluster), spread over its zones.
    pub fn new(account: impl Into<String>, groups: Vec<NodeGroup>, settings: SimulationSettings) -> Self {
        let mut state = State {
            now: Duration::ZERO,
            rng: ChaCha8Rng::seed_from_u64(settings.seed),
            settings,
            groups: BTreeMap::new(),
            log: Vec::new(),
            refuse_raises: BTreeMap::new(),
        };
        for g in groups {
            let aws_ids = catalog::lookup(&g.instance_type).is_some_and(|s| s.cloud == Cloud::Aws);
            let target = g.target_size;
            let id = g.id.clone();
            state.groups.insert(
                id.clone(),
                SimGroup {
                    group: NodeGroup { instances: vec![], ..g },
                    aws_ids,
                    instances: vec![],
                    launched: 0,
                },
            );
            for _ in 0..target {
                let zone = state.pick_zone(&id, false);
                let inst = state.new_instance(&id, zone, InstanceState::Running);
                if let Some(g) = state.groups.get_mut(&id) {
                    g.instances.push(inst);
                }
            }
        }
        Self { account: account.into(), state: Mutex::new(state) }
    }

    /// One simulated cloud per `simulated` account of a config, with the account's declared groups
    /// and simulation settings.
    pub fn from_config(config: &ProviderConfig) -> Vec<SimulatedCloud> {
        config
            .accounts
            .iter()
            .filter(|a| a.provider == ProviderKind::Simulated)
            .map(|a| {
                let settings = a.simulation.as_ref().map(SimulationSettings::from).unwrap_or_default();
                SimulatedCloud::new(a.name.clone(), config.node_groups_of(&a.name), settings)
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every mutation is complete
        // before anything can panic), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Virtual time since creation.
    pub fn now(&self) -> Duration {
        self.lock().now
    }

    /// Moves the virtual clock forward: terminating instances disappear, pending instances whose
    /// boot time has come become Running, spot instances are interrupted at the configured rate
    /// (and replaced), and failed launches older than the retry delay are retried.
    pub fn advance(&self, dt: Duration) {
        self.lock().advance(dt);
    }

    /// The operation log so far.
    pub fn operations(&self) -> Vec<OperationRecord> {
        self.lock().log.clone()
    }

    /// Returns and clears the operation log.
    pub fn take_operations(&self) -> Vec<OperationRecord> {
        std::mem::take(&mut self.lock().log)
    }

    /// The groups as the cloud sees them now, without logging a call.
    pub fn snapshot(&self) -> Vec<NodeGroup> {
        self.lock().snapshot()
    }

    /// The interruption notices of instances not reclaimed yet, in the model's shape (times in
    /// seconds of virtual time): what the interruption queue or the node agent would deliver.
    pub fn notices(&self) -> Vec<crate::model::Notice> {
        let s = self.lock();
        let mut out = Vec::new();
        for g in s.groups.values() {
            for i in &g.instances {
                if let (Some(at), InstanceState::Running) = (i.reclaim_at, &i.state) {
                    let deadline = at.as_secs() as i64;
                    out.push(crate::model::Notice {
                        kind: crate::model::NoticeKind::SpotInterruption,
                        instance: i.id.clone(),
                        issued_at: deadline - s.settings.interruption_notice.as_secs() as i64,
                        deadline: Some(deadline),
                    });
                }
            }
        }
        out
    }

    /// Changes the launch failure probability.
    pub fn set_capacity_error_rate(&self, rate: f64) {
        self.lock().settings.capacity_error_rate = rate.clamp(0.0, 1.0);
    }

    /// Makes every raise of `group` fail in the API call itself with an insufficient-capacity
    /// error (`None`: accepted again), as a GCP resize whose operation ends in
    /// `ZONE_RESOURCE_POOL_EXHAUSTED` or an AWS fleet request answered with
    /// `InsufficientInstanceCapacity` do, rather than by a launch failing later.
    pub fn set_refuse_raises(&self, group: &str, message: Option<&str>) {
        let mut s = self.lock();
        match message {
            Some(m) => s.refuse_raises.insert(group.to_string(), m.to_string()),
            None => s.refuse_raises.remove(group),
        };
    }

    /// Caps (or with `None` uncaps) the live instances of a zone.
    pub fn set_zone_capacity(&self, zone: &str, cap: Option<u32>) {
        let mut s = self.lock();
        match cap {
            Some(c) => s.settings.zone_capacity.insert(zone.to_string(), c),
            None => s.settings.zone_capacity.remove(zone),
        };
    }
}

impl State {
    fn record(&mut self, op: Operation) {
        tracing::debug!(at = ?self.now, ?op, "simulated cloud");
        self.log.push(OperationRecord { at: self.now, op });
    }

    fn snapshot(&self) -> Vec<NodeGroup> {
        self.groups
            .values()
            .map(|g| NodeGroup {
                instances: g
                    .instances
                    .iter()
                    .map(|i| Instance { id: i.id.clone(), state: i.state.clone() })
                    .collect(),
                ..g.group.clone()
            })
            .collect()
    }

    fn live_in_zone(&self, zone: &str) -> u32 {
        self.groups
            .values()
            .flat_map(|g| &g.instances)
            .filter(|i| i.zone == zone && is_live(&i.state))
            .count() as u32
    }

    fn zone_has_room(&self, zone: &str) -> bool {
        self.settings.zone_capacity.get(zone).is_none_or(|&cap| self.live_in_zone(zone) < cap)
    }

    /// The zone a new instance goes to: the group's zone with the fewest instances (as an ASG
    /// balances), preferring zones with room when `respect_caps`.
    fn pick_zone(&self, group: &str, respect_caps: bool) -> String {
        let Some(g) = self.groups.get(group) else {
            return String::new();
        };
        // Failed launches count too, so retries move on to other zones as an ASG does.
        let count = |z: &str| g.instances.iter().filter(|i| i.zone == z && occupies_slot(&i.state)).count();
        let by_balance = |zones: &mut Vec<&String>| zones.sort_by_key(|z| count(z));
        let mut zones: Vec<&String> = g.group.zones.iter().collect();
        by_balance(&mut zones);
        if respect_caps {
            if let Some(z) = zones.iter().find(|z| self.zone_has_room(z)) {
                return (*z).clone();
            }
        }
        zones.first().map(|z| (*z).clone()).unwrap_or_default()
    }

    fn new_instance(&mut self, group: &str, zone: String, state: InstanceState) -> SimInstance {
        let hex: u128 = self.rng.random::<u128>() & ((1u128 << 68) - 1);
        let now = self.now;
        let g = self.groups.get_mut(group).expect("group exists");
        g.launched += 1;
        let id = if g.aws_ids {
            format!("aws:///{zone}/i-{hex:017x}")
        } else {
            let name = g.group.name();
            format!("sim:///{zone}/{name}-{:04}", g.launched)
        };
        SimInstance { id, zone, state, created: now, reclaim_at: None }
    }

    /// Launches instances until the group's slots match its target, or terminates the surplus.
    fn reconcile(&mut self, group: &str) {
        let Some(g) = self.groups.get(group) else {
            return;
        };
        let target = g.group.target_size as usize;
        let slots = g.instances.iter().filter(|i| occupies_slot(&i.state)).count();
        if slots < target {
            for _ in slots..target {
                self.launch(group);
            }
        } else if slots > target {
            for _ in target..slots {
                self.terminate_one(group);
            }
        }
    }

    /// The launch failure probability of `group`'s capacity type.
    fn error_rate(&self, group: &str) -> f64 {
        let spot = self.groups.get(group).is_some_and(|g| g.group.capacity_type == CapacityType::Spot);
        match self.settings.spot_capacity_error_rate {
            Some(rate) if spot => rate,
            _ => self.settings.capacity_error_rate,
        }
    }

    fn launch(&mut self, group: &str) {
        let zone = self.pick_zone(group, true);
        let instance_type = self.groups.get(group).map(|g| g.group.instance_type.clone()).unwrap_or_default();
        let failure = if !self.zone_has_room(&zone) {
            Some(format!(
                "InsufficientInstanceCapacity: zone capacity of {zone} is exhausted for {instance_type}"
            ))
        } else if self.error_rate(group) > 0.0 && self.rng.random::<f64>() < self.error_rate(group) {
            Some(format!(
                "InsufficientInstanceCapacity: We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested ({zone})"
            ))
        } else {
            None
        };
        let state = match &failure {
            Some(message) => {
                InstanceState::Failed { class: ErrorClass::OutOfCapacity, message: message.clone() }
            }
            None => InstanceState::Pending,
        };
        let inst = self.new_instance(group, zone, state);
        let id = inst.id.clone();
        if let Some(g) = self.groups.get_mut(group) {
            g.instances.push(inst);
        }
        let group = group.to_string();
        self.record(match failure {
            Some(message) => Operation::LaunchFailed { group, instance: id, message },
            None => Operation::Launched { group, instance: id },
        });
    }

    /// Scale-in victim: a failed launch first, then the newest pending, then the newest running
    /// instance of the zone with the most live instances.
    fn terminate_one(&mut self, group: &str) {
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
        for i in g.instances.iter().filter(|i| is_live(&i.state)) {
            *per_zone.entry(i.zone.as_str()).or_default() += 1;
        }
        let rank = |i: &SimInstance| {
            let state_rank = match i.state {
                InstanceState::Failed { .. } => 0,
                InstanceState::Pending => 1,
                _ => 2,
            };
            (
                state_rank,
                std::cmp::Reverse(per_zone.get(i.zone.as_str()).copied().unwrap_or(0)),
                std::cmp::Reverse(i.created),
            )
        };
        let Some(idx) = g
            .instances
            .iter()
            .enumerate()
            .filter(|(_, i)| occupies_slot(&i.state))
            .min_by_key(|(_, i)| rank(i))
            .map(|(idx, _)| idx)
        else {
            return;
        };
        let failed = matches!(g.instances[idx].state, InstanceState::Failed { .. });
        let id = g.instances[idx].id.clone();
        if failed {
            g.instances.remove(idx);
        } else {
            g.instances[idx].state = InstanceState::Terminating;
        }
        self.record(Operation::Terminated { group: group.to_string(), instance: id });
    }

    fn advance(&mut self, dt: Duration) {
        // Instances terminated before this step are gone now.
        for g in self.groups.values_mut() {
            g.instances.retain(|i| i.state != InstanceState::Terminating);
        }
        self.now += dt;
        let now = self.now;
        let boot = self.settings.boot;
        let mut events = Vec::new();
        for (id, g) in &mut self.groups {
            for i in &mut g.instances {
                if i.state == InstanceState::Pending && i.created + boot <= now {
                    i.state = InstanceState::Running;
                    events.push(Operation::Running { group: id.clone(), instance: i.id.clone() });
                }
            }
        }
        for e in events {
            self.record(e);
        }
        // Noticed interruptions whose deadline has come.
        let mut reclaimed = Vec::new();
        for (gid, g) in &mut self.groups {
            for i in &mut g.instances {
                if i.reclaim_at.is_some_and(|at| at <= now) && i.state != InstanceState::Terminating {
                    i.state = InstanceState::Terminating;
                    reclaimed.push(Operation::SpotInterrupted { group: gid.clone(), instance: i.id.clone() });
                }
            }
        }
        for e in reclaimed {
            self.record(e);
        }
        // Spot interruptions: each running spot instance is interrupted with probability
        // 1 - exp(-rate * dt); with a notice window it is warned now and reclaimed at its end.
        let notice = self.settings.interruption_notice;
        let rate = self.settings.spot_interruptions_per_hour;
        if rate > 0.0 && !dt.is_zero() {
            let p = 1.0 - (-rate * dt.as_secs_f64() / 3600.0).exp();
            let ids: Vec<String> = self.groups.keys().cloned().collect();
            for gid in ids {
                let n = self.groups[&gid].instances.len();
                for k in 0..n {
                    let g = &self.groups[&gid];
                    let i = &g.instances[k];
                    if g.group.capacity_type != CapacityType::Spot
                        || i.state != InstanceState::Running
                        || i.reclaim_at.is_some()
                    {
                        continue;
                    }
                    if self.rng.random::<f64>() < p {
                        let g = self.groups.get_mut(&gid).expect("group exists");
                        let instance = g.instances[k].id.clone();
                        if notice.is_zero() {
                            g.instances[k].state = InstanceState::Terminating;
                            self.record(Operation::SpotInterrupted { group: gid.clone(), instance });
                        } else {
                            g.instances[k].reclaim_at = Some(now + notice);
                            let deadline = (now + notice).as_secs();
                            self.record(Operation::InterruptionNotice {
                                group: gid.clone(),
                                instance,
                                deadline,
                            });
                        }
                    }
                }
            }
        }
        // Failed launches are retried after the retry delay.
        let retry = self.settings.launch_retry;
        for g in self.groups.values_mut() {
            g.instances
                .retain(|i| !(matches!(i.state, InstanceState::Failed { .. }) && i.created + retry <= now));
        }
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        for gid in ids {
            self.reconcile(&gid);
        }
    }

    fn set_target_size(&mut self, group: &str, target: u32) -> Result<(), ProviderError> {
        let Some(g) = self.groups.get_mut(group) else {
            return Err(ProviderError::GroupNotFound(group.to_string()));
        };
        if target < g.group.min_size || target > g.group.max_size {
            return Err(ProviderError::SizeOutOfRange {
                group: group.to_string(),
                target,
                min: g.group.min_size,
                max: g.group.max_size,
            });
        }
        if let Some(message) = self.refuse_raises.get(group).filter(|_| target > g.group.target_size) {
            return Err(ProviderError::InsufficientCapacity {
                group: group.to_string(),
                message: message.clone(),
            });
        }
        g.group.target_size = target;
        self.reconcile(group);
        Ok(())
    }

    fn delete_instances(&mut self, group: &str, ids: &[String]) -> Result<(), ProviderError> {
        let Some(g) = self.groups.get_mut(group) else {
            return Err(ProviderError::GroupNotFound(group.to_string()));
        };
        // Validate everything before changing anything.
        let mut idxs = Vec::new();
        for id in ids {
            match g.instances.iter().position(|i| &i.id == id) {
                Some(idx) => idxs.push(idx),
                None => {
                    return Err(ProviderError::InstanceNotFound {
                        group: group.to_string(),
                        instance: id.clone(),
                    })
                }
            }
        }
        idxs.sort_unstable();
        idxs.dedup();
        // Instances already terminating were deleted by an earlier (retried) call.
        let fresh: Vec<usize> =
            idxs.into_iter().filter(|&i| g.instances[i].state != InstanceState::Terminating).collect();
        let n = fresh.len() as u32;
        let new_target = g.group.target_size.saturating_sub(n);
        if new_target < g.group.min_size {
            return Err(ProviderError::SizeOutOfRange {
                group: group.to_string(),
                target: new_target,
                min: g.group.min_size,
                max: g.group.max_size,
            });
        }
        g.group.target_size = new_target;
        let mut terminated = Vec::new();
        for &i in fresh.iter().rev() {
            let inst = &mut g.instances[i];
            terminated.push(inst.id.clone());
            if matches!(inst.state, InstanceState::Failed { .. }) {
                g.instances.remove(i);
            } else {
                inst.state = InstanceState::Terminating;
            }
        }
        terminated.reverse();
        for instance in terminated {
            self.record(Operation::Terminated { group: group.to_string(), instance });
        }
        Ok(())
    }
}

impl CloudProvider for SimulatedCloud {
    fn account(&self) -> &str {
        &self.account
    }

    async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
        let mut s = self.lock();
        s.record(Operation::Refresh);
        Ok(s.snapshot())
    }

    async fn set_target_size(&self, group: &str, target: u32) -> Result<(), ProviderError> {
        let mut s = self.lock();
        let from = s.groups.get(group).map_or(0, |g| g.group.target_size);
        let index = s.log.len();
        s.record(Operation::SetTargetSize { group: group.to_string(), from, to: target, error: None });
        let result = s.set_target_size(group, target);
        if let (Err(e), Some(OperationRecord { op: Operation::SetTargetSize { error, .. }, .. })) =
            (&result, s.log.get_mut(index))
        {
            *error = Some(e.to_string());
        }
        result
    }

    async fn delete_instances(&self, group: &str, instances: &[String]) -> Result<(), ProviderError> {
        let mut s = self.lock();
        let index = s.log.len();
        s.record(Operation::DeleteInstances {
            group: group.to_string(),
            instances: instances.to_vec(),
            error: None,
        });
        let result = s.delete_instances(group, instances);
        if let (Err(e), Some(OperationRecord { op: Operation::DeleteInstances { error, .. }, .. })) =
            (&result, s.log.get_mut(index))
        {
            *error = Some(e.to_string());
        }
        result
    }
}
