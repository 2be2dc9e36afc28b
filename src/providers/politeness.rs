//! Polite use of cloud APIs: rate limiting, retries with backoff, and memory of capacity failures.
//!
//! [`Polite`] wraps any [`CloudProvider`]. Every call waits for a token of the account's rate
//! limiter (`governor`), and retryable failures ([`ProviderError::is_retryable`]) are retried with
//! full-jitter exponential backoff, honouring a server's `retry_after`. Capacity failures are
//! remembered: an (instance type, zone, capacity type) that ran out of capacity is skipped for a
//! while, and a group whose scale-ups keep failing backs off exponentially, so a stock-out does
//! not turn into a tight loop of doomed launches.
//!
//! Time comes from an injectable [`Clock`]: [`TokioClock`] in production, which also follows
//! `tokio::time::pause()` in tests. Decisions ([`full_jitter`], [`group_backoff_delay`]) are pure
//! functions of their inputs.

use super::config::{AccountConfig, BackoffConfig, RateLimitConfig, RetryConfig};
use super::{CloudProvider, ProviderError};
use crate::model::{CapacityType, ErrorClass, InstanceState, NodeGroup};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use thiserror::Error;

/// A monotonic time source with sleeping; time is measured from an arbitrary epoch.
pub trait Clock: Send + Sync + 'static {
    /// Time since the clock's epoch.
    fn now(&self) -> Duration;
    /// Waits for `d` of this clock's time.
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// Tokio's clock: real time in production, virtual under `tokio::time::pause()`.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self { epoch: tokio::time::Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// Adapts a [`Clock`] to governor's clock trait (instants are durations since the epoch).
#[derive(Debug)]
struct GovernorClock<C>(Arc<C>);

impl<C> Clone for GovernorClock<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C: Clock> governor::clock::Clock for GovernorClock<C> {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.0.now()
    }
}

type Limiter<C> = RateLimiter<NotKeyed, InMemoryState, GovernorClock<C>, NoOpMiddleware<Duration>>;

/// Settings of the wrapper, usually from an account's `rateLimit`, `retry` and `backoff` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PolitenessConfig {
    /// Client-side rate limit; unlimited when `None`.
    pub rate_limit: Option<RateLimitConfig>,
    /// Retries.
    pub retry: RetryConfig,
    /// Capacity-failure memory.
    pub backoff: BackoffConfig,
}

impl PolitenessConfig {
    /// The settings an account's config asks for (defaults for absent blocks).
    pub fn from_account(a: &AccountConfig) -> Self {
        Self {
            rate_limit: a.rate_limit,
            retry: a.retry.unwrap_or_default(),
            backoff: a.backoff.unwrap_or_default(),
        }
    }
}

/// An instance type in a zone with a capacity type: the unit clouds run out of.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offering {
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// On-demand or spot.
    pub capacity_type: CapacityType,
}

/// A group's scale-up backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupBackoff {
    /// Consecutive failed scale-ups.
    pub failures: u32,
    /// Clock time until which scale-ups are refused.
    pub until: Duration,
    /// Class of the last failure.
    pub class: ErrorClass,
}

/// Returned (as the source of a non-retryable [`ProviderError::Api`]) when a scale-up is refused
/// because the group is backing off.
#[derive(Debug, Clone, Error)]
#[error(
    "node group {group}: scale-up refused while backing off until {until:?} after {failures} \
     failed scale-up(s) ({class:?})"
)]
pub struct BackingOff {
    /// Group id.
    pub group: String,
    /// Clock time the backoff ends.
    pub until: Duration,
    /// Consecutive failures.
    pub failures: u32,
    /// Class of the last failure.
    pub class: ErrorClass,
}

/// Full-jitter exponential backoff: a uniform share `unit` in `[0, 1)` of
/// `min(cap, base * 2^attempt)`, where `attempt` counts from 0 for the first retry.
pub fn full_jitter(attempt: u32, base: Duration, cap: Duration, unit: f64) -> Duration {
    let ceiling =
        base.checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX)).unwrap_or(cap).min(cap);
    ceiling.mul_f64(unit.clamp(0.0, 1.0))
}

/// Backoff of a group after `failures` consecutive failed scale-ups: `base * 2^(failures-1)`,
/// at most `max`.
pub fn group_backoff_delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(31);
    base.checked_mul(1u32 << exp).unwrap_or(max).min(max)
}

/// Zone in a provider id: `aws:///us-east-1a/i-…`, `sim:///zone/name`, `gce://project/zone/name`.
pub fn zone_of_provider_id(id: &str) -> Option<&str> {
    // The zone is the second path segment in every form: `aws:///` has an empty host before it,
    // `gce://` the project.
    let (_, rest) = id.split_once("://")?;
    let zone = rest.split('/').nth(1)?;
    (!zone.is_empty()).then_some(zone)
}

#[derive(Debug, Clone)]
struct GroupInfo {
    instance_type: String,
    zones: Vec<String>,
    capacity_type: CapacityType,
    target_size: u32,
}

#[derive(Debug)]
struct State {
    rng: ChaCha8Rng,
    unavailable: BTreeMap<Offering, Duration>,
    backoff: BTreeMap<String, GroupBackoff>,
    groups: BTreeMap<String, GroupInfo>,
    seen_failed: BTreeSet<String>,
}

impl State {
    /// Whether every offering of `info` (its instance type and capacity type in each of its
    /// zones) is marked unavailable at `now`.
    fn offerings_out(&self, info: &GroupInfo, now: Duration) -> bool {
        !info.zones.is_empty()
            && info.zones.iter().all(|z| {
                self.unavailable
                    .get(&Offering {
                        instance_type: info.instance_type.clone(),
                        zone: z.clone(),
                        capacity_type: info.capacity_type,
                    })
                    .is_some_and(|&until| until > now)
            })
    }
}

/// Asked immediately before every attempt of a write (`set_target_size`, `delete_instances`):
/// false and the attempt is not issued ([`ProviderError::NotPermitted`]). The controller's leader
/// fence: a write that waited for a rate-limit token or a retry backoff is checked again, so a
/// replica that lost leadership meanwhile does not issue it late.
pub type WriteGate = Arc<dyn Fn() -> bool + Send + Sync>;

/// A [`CloudProvider`] wrapper that rate-limits, retries and remembers capacity failures (see
/// the module docs).
pub struct Polite<P, C: Clock = TokioClock> {
    inner: P,
    clock: Arc<C>,
    limiter: Option<Limiter<C>>,
    config: PolitenessConfig,
    state: Mutex<State>,
    write_gate: Mutex<Option<WriteGate>>,
}

impl<P: CloudProvider> Polite<P, TokioClock> {
    /// Wraps `inner` with tokio's clock.
    pub fn new(inner: P, config: PolitenessConfig) -> Self {
        Self::with_clock(inner, config, TokioClock::new())
    }
}

impl<P: CloudProvider, C: Clock> Polite<P, C> {
    /// Wraps `inner` with an explicit clock.
    pub fn with_clock(inner: P, config: PolitenessConfig, clock: C) -> Self {
        let clock = Arc::new(clock);
        let limiter = config.rate_limit.and_then(|r| {
            let period = Duration::from_secs_f64(1.0 / r.requests_per_second);
            let quota =
                Quota::with_period(period)?.allow_burst(NonZeroU32::new(r.burst).unwrap_or(NonZeroU32::MIN));
            Some(RateLimiter::direct_with_clock(quota, GovernorClock(clock.clone())))
        });
        Self {
            inner,
            clock,
            limiter,
            state: Mutex::new(State {
                rng: ChaCha8Rng::seed_from_u64(config.retry.seed),
                unavailable: BTreeMap::new(),
                backoff: BTreeMap::new(),
                groups: BTreeMap::new(),
                seen_failed: BTreeSet::new(),
            }),
            config,
            write_gate: Mutex::new(None),
        }
    }

    /// Checks `gate` before every attempt of every write from now on (replacing an earlier one).
    pub fn set_write_gate(&self, gate: WriteGate) {
        *self.write_gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(gate);
    }

    /// Whether a write may be issued now.
    fn may_write(&self) -> bool {
        let gate = self.write_gate.lock().unwrap_or_else(|p| p.into_inner()).clone();
        gate.is_none_or(|g| g())
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The wrapper's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an offering may be tried now (not marked unavailable, or its mark has expired).
    pub fn is_offering_available(
        &self,
        instance_type: &str,
        zone: &str,
        capacity_type: CapacityType,
    ) -> bool {
        let key =
            Offering { instance_type: instance_type.to_string(), zone: zone.to_string(), capacity_type };
        let now = self.clock.now();
        self.lock().unavailable.get(&key).is_none_or(|&until| until <= now)
    }

    /// Offerings currently marked unavailable, with the time the mark expires.
    pub fn unavailable_offerings(&self) -> Vec<(Offering, Duration)> {
        let now = self.clock.now();
        self.lock()
            .unavailable
            .iter()
            .filter(|(_, &until)| until > now)
            .map(|(o, &u)| (o.clone(), u))
            .collect()
    }

    /// Marks an offering unavailable for the configured time.
    pub fn mark_unavailable(&self, offering: Offering) {
        let until = self.clock.now() + Duration::from_secs(self.config.backoff.unavailable_offering_seconds);
        tracing::info!(?offering, ?until, "offering marked unavailable");
        self.lock().unavailable.insert(offering, until);
    }

    /// The group's active scale-up backoff, if any.
    pub fn group_backoff(&self, group: &str) -> Option<GroupBackoff> {
        let now = self.clock.now();
        self.lock().backoff.get(group).copied().filter(|b| b.until > now)
    }

    /// Records a failed scale-up of a group (also used by callers that detect failures the cloud
    /// does not report, e.g. nodes that never register) and returns the new backoff.
    pub fn record_scale_up_failure(&self, group: &str, class: ErrorClass) -> GroupBackoff {
        let now = self.clock.now();
        let b = &self.config.backoff;
        let mut s = self.lock();
        let failures = s.backoff.get(group).map_or(0, |b| b.failures) + 1;
        let delay = group_backoff_delay(
            failures,
            Duration::from_secs(b.scale_up_failure_base_seconds),
            Duration::from_secs(b.scale_up_failure_max_seconds),
        );
        let entry = GroupBackoff { failures, until: now + delay, class };
        tracing::warn!(group, failures, ?delay, ?class, "scale-up failed; backing off");
        s.backoff.insert(group.to_string(), entry);
        entry
    }

    /// Clears a group's backoff after a successful scale-up.
    pub fn record_scale_up_success(&self, group: &str) {
        self.lock().backoff.remove(group);
    }

    async fn acquire(&self) {
        let Some(limiter) = &self.limiter else {
            return;
        };
        loop {
            match limiter.check() {
                Ok(()) => return,
                Err(not_until) => {
                    let wait = not_until.wait_time_from(self.clock.now());
                    self.clock.sleep(wait.max(Duration::from_micros(100))).await;
                }
            }
        }
    }

    /// Runs one API operation under the rate limit, retrying retryable failures. A write
    /// (`write`) asks the write gate right before each attempt, after any wait.
    async fn call<T, F, Fut>(&self, op: &'static str, write: bool, mut f: F) -> Result<T, ProviderError>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<T, ProviderError>> + Send,
        T: Send,
    {
        let r = &self.config.retry;
        let attempts = r.max_attempts.max(1);
        let mut attempt = 0;
        loop {
            self.acquire().await;
            if write && !self.may_write() {
                tracing::info!(op, attempt, "write not issued: the write gate is closed (leadership lost)");
                return Err(ProviderError::NotPermitted { op });
            }
            attempt += 1;
            let err = match f().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !err.is_retryable() || attempt >= attempts {
                if err.is_retryable() {
                    tracing::warn!(op, attempt, error = %err, "giving up after retries");
                }
                return Err(err);
            }
            let delay = match &err {
                ProviderError::Throttled { retry_after: Some(d) } => *d,
                _ => {
                    let unit = self.lock().rng.random::<f64>();
                    full_jitter(
                        attempt - 1,
                        Duration::from_millis(r.base_delay_ms),
                        Duration::from_millis(r.max_delay_ms),
                        unit,
                    )
                }
            };
            tracing::debug!(op, attempt, ?delay, error = %err, "retrying");
            self.clock.sleep(delay).await;
        }
    }

    /// Learns from a refresh: failed launches mark their offering unavailable and count as a
    /// failed scale-up of their group (once per group and refresh); a group whose backoff has
    /// expired and whose target is all running is healthy again.
    fn observe(&self, groups: &[NodeGroup]) {
        let now = self.clock.now();
        let ttl = Duration::from_secs(self.config.backoff.unavailable_offering_seconds);
        let mut failed_groups = Vec::new();
        {
            let mut s = self.lock();
            let mut present = BTreeSet::new();
            for g in groups {
                s.groups.insert(
                    g.id.clone(),
                    GroupInfo {
                        instance_type: g.instance_type.clone(),
                        zones: g.zones.clone(),
                        capacity_type: g.capacity_type,
                        target_size: g.target_size,
                    },
                );
                let mut class_seen = None;
                for inst in &g.instances {
                    let InstanceState::Failed { class, .. } = &inst.state else {
                        continue;
                    };
                    present.insert(inst.id.clone());
                    if !s.seen_failed.insert(inst.id.clone()) {
                        continue;
                    }
                    class_seen = Some(*class);
                    if *class == ErrorClass::OutOfCapacity {
                        let zone = zone_of_provider_id(&inst.id)
                            .map(str::to_string)
                            .or_else(|| (g.zones.len() == 1).then(|| g.zones[0].clone()));
                        let zones = match zone {
                            Some(z) => vec![z],
                            None => g.zones.clone(),
                        };
                        for zone in zones {
                            s.unavailable.insert(
                                Offering {
                                    instance_type: g.instance_type.clone(),
                                    zone,
                                    capacity_type: g.capacity_type,
                                },
                                now + ttl,
                            );
                        }
                    }
                }
                if let Some(class) = class_seen {
                    failed_groups.push((g.id.clone(), class));
                } else {
                    let running =
                        g.instances.iter().filter(|i| i.state == InstanceState::Running).count() as u32;
                    let expired = s.backoff.get(&g.id).is_some_and(|b| b.until <= now);
                    if expired && running >= g.target_size {
                        s.backoff.remove(&g.id);
                    }
                }
            }
            s.seen_failed.retain(|id| present.contains(id));
            s.unavailable.retain(|_, until| *until > now);
        }
        for (group, class) in failed_groups {
            self.record_scale_up_failure(&group, class);
        }
    }

    /// Why `group` must not be grown now, for the planner's `unavailable`: its own backoff, or
    /// every offering it launches into (type, zone, capacity type) marked unavailable by a
    /// failure of *any* group. Two groups can share an offering (two spot groups of one instance
    /// type in one zone); without the second reason the plan would pick the sibling of the group
    /// that just failed, its raise would be refused, and the pods would wait a pass before the
    /// next group is tried.
    pub fn unavailable_reason(&self, group: &str) -> Option<String> {
        if let Some(b) = self.group_backoff(group) {
            return Some(format!("backing off after {} failed scale-up(s) ({:?})", b.failures, b.class));
        }
        let now = self.clock.now();
        let s = self.lock();
        let info = s.groups.get(group)?;
        let all_out = s.offerings_out(info, now);
        all_out.then(|| {
            format!(
                "{} ({}) has no capacity in {} (an insufficient-capacity error)",
                info.instance_type,
                info.capacity_type.label_value(),
                info.zones.join(", ")
            )
        })
    }

    /// Why a scale-up of `group` to `target` must not be attempted now, if it must not.
    fn refuse_scale_up(&self, group: &str, target: u32) -> Option<ProviderError> {
        let now = self.clock.now();
        let s = self.lock();
        let info = s.groups.get(group)?;
        if target <= info.target_size {
            return None;
        }
        if let Some(b) = s.backoff.get(group).filter(|b| b.until > now) {
            return Some(ProviderError::Api {
                op: "SetTargetSize",
                cause: Box::new(BackingOff {
                    group: group.to_string(),
                    until: b.until,
                    failures: b.failures,
                    class: b.class,
                }),
                retryable: false,
            });
        }
        let all_out = s.offerings_out(info, now);
        all_out.then(|| ProviderError::InsufficientCapacity {
            group: group.to_string(),
            message: format!(
                "{} ({:?}) is marked unavailable in all zones {:?}",
                info.instance_type, info.capacity_type, info.zones
            ),
        })
    }
}

impl<P: CloudProvider, C: Clock> CloudProvider for Polite<P, C> {
    fn account(&self) -> &str {
        self.inner.account()
    }

    async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
        let groups = self.call("refresh", false, || self.inner.refresh()).await?;
        self.observe(&groups);
        Ok(groups)
    }

    async fn set_target_size(&self, group: &str, target: u32) -> Result<(), ProviderError> {
        if let Some(e) = self.refuse_scale_up(group, target) {
            tracing::info!(group, target, error = %e, "scale-up refused");
            return Err(e);
        }
        let result = self.call("set_target_size", true, || self.inner.set_target_size(group, target)).await;
        match &result {
            Ok(()) => {
                if let Some(info) = self.lock().groups.get_mut(group) {
                    info.target_size = target;
                }
            }
            Err(e) if matches!(e.class(), ErrorClass::OutOfCapacity | ErrorClass::Quota) => {
                let info = self.lock().groups.get(group).cloned();
                if let (ErrorClass::OutOfCapacity, Some(info)) = (e.class(), info) {
                    for zone in info.zones {
                        self.mark_unavailable(Offering {
                            instance_type: info.instance_type.clone(),
                            zone,
                            capacity_type: info.capacity_type,
                        });
                    }
                }
                self.record_scale_up_failure(group, e.class());
            }
            Err(_) => {}
        }
        result
    }

    // Reading the queue hides its messages from other readers for a while, and deleting them
    // ends them: both are a leader's acts, behind the write gate.
    async fn receive_notices(&self) -> Result<Vec<crate::providers::Delivery>, ProviderError> {
        self.call("receive_notices", true, || self.inner.receive_notices()).await
    }

    async fn acknowledge_notices(&self, receipts: &[String]) -> Result<(), ProviderError> {
        self.call("acknowledge_notices", true, || self.inner.acknowledge_notices(receipts)).await
    }

    async fn delete_instances(&self, group: &str, instances: &[String]) -> Result<(), ProviderError> {
        self.call("delete_instances", true, || self.inner.delete_instances(group, instances)).await?;
        if let Some(info) = self.lock().groups.get_mut(group) {
            info.target_size = info.target_size.saturating_sub(instances.len() as u32);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A provider that answers from a script and records when each call arrived.
    struct Scripted {
        responses: Mutex<VecDeque<Result<(), ProviderError>>>,
        groups: Mutex<Vec<NodeGroup>>,
        calls: AtomicU32,
        times: Mutex<Vec<Duration>>,
        clock: TokioClock,
    }

    impl Scripted {
        fn new(responses: Vec<Result<(), ProviderError>>, clock: TokioClock) -> Self {
            Self {
                responses: Mutex::new(responses.into()),
                groups: Mutex::new(vec![]),
                calls: AtomicU32::new(0),
                times: Mutex::new(vec![]),
                clock,
            }
        }

        fn next(&self) -> Result<(), ProviderError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.times.lock().unwrap().push(self.clock.now());
            self.responses.lock().unwrap().pop_front().unwrap_or(Ok(()))
        }
    }

    impl CloudProvider for Scripted {
        fn account(&self) -> &str {
            "scripted"
        }
        async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
            self.next()?;
            Ok(self.groups.lock().unwrap().clone())
        }
        async fn set_target_size(&self, _: &str, _: u32) -> Result<(), ProviderError> {
            self.next()
        }
        async fn delete_instances(&self, _: &str, _: &[String]) -> Result<(), ProviderError> {
            self.next()
        }
    }

    fn server_error() -> ProviderError {
        ProviderError::Api { op: "SetDesiredCapacity", cause: "HTTP 503".into(), retryable: true }
    }

    fn config(max_attempts: u32) -> PolitenessConfig {
        PolitenessConfig {
            rate_limit: None,
            retry: RetryConfig { max_attempts, base_delay_ms: 100, max_delay_ms: 2_000, seed: 3 },
            backoff: BackoffConfig::default(),
        }
    }

    fn group(zones: &[&str], target: u32, instances: Vec<crate::model::Instance>) -> NodeGroup {
        NodeGroup {
            id: "acct/gpu".into(),
            account: "acct".into(),
            instance_type: "p5.48xlarge".into(),
            zones: zones.iter().map(|z| z.to_string()).collect(),
            capacity_type: CapacityType::OnDemand,
            price: 1,
            min_size: 0,
            max_size: 10,
            target_size: target,
            instances,
            template: Default::default(),
        }
    }

    #[test]
    fn jitter_and_backoff_bounds() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        assert_eq!(full_jitter(0, base, cap, 0.999_999), base.mul_f64(0.999_999));
        assert_eq!(full_jitter(3, base, cap, 0.5), Duration::from_millis(400));
        assert_eq!(full_jitter(10, base, cap, 0.5), Duration::from_secs(1));
        assert_eq!(full_jitter(60, base, cap, 1.0), cap);
        let b = Duration::from_secs(60);
        let m = Duration::from_secs(1800);
        assert_eq!(group_backoff_delay(1, b, m), b);
        assert_eq!(group_backoff_delay(3, b, m), Duration::from_secs(240));
        assert_eq!(group_backoff_delay(40, b, m), m);
        assert_eq!(zone_of_provider_id("aws:///us-east-1a/i-0abc"), Some("us-east-1a"));
        assert_eq!(zone_of_provider_id("gce://proj/us-central1-a/vm-1"), Some("us-central1-a"));
        assert_eq!(zone_of_provider_id("i-0abc"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_then_succeeds() {
        let clock = TokioClock::new();
        let inner = Scripted::new(vec![Err(server_error()), Err(server_error()), Ok(())], clock);
        let p = Polite::with_clock(inner, config(5), clock);
        p.set_target_size("acct/gpu", 3).await.unwrap();
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 3);
        let times = p.inner().times.lock().unwrap().clone();
        // Full jitter: each wait is below its ceiling (100 ms, then 200 ms).
        assert!(times[1] - times[0] <= Duration::from_millis(100), "{times:?}");
        assert!(times[2] - times[1] <= Duration::from_millis(200), "{times:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts_and_does_not_retry_permanent_errors() {
        let clock = TokioClock::new();
        let inner = Scripted::new((0..10).map(|_| Err(server_error())).collect(), clock);
        let p = Polite::with_clock(inner, config(4), clock);
        let err = p.set_target_size("acct/gpu", 3).await.unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 4);

        let inner = Scripted::new(vec![Err(ProviderError::GroupNotFound("acct/gpu".into()))], clock);
        let p = Polite::with_clock(inner, config(4), clock);
        assert!(matches!(p.set_target_size("acct/gpu", 3).await, Err(ProviderError::GroupNotFound(_))));
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn honours_retry_after() {
        let clock = TokioClock::new();
        let inner = Scripted::new(
            vec![Err(ProviderError::Throttled { retry_after: Some(Duration::from_secs(7)) })],
            clock,
        );
        let p = Polite::with_clock(inner, config(3), clock);
        p.delete_instances("acct/gpu", &["i-1".into()]).await.unwrap();
        let times = p.inner().times.lock().unwrap().clone();
        assert_eq!(times.len(), 2);
        assert!(times[1] - times[0] >= Duration::from_secs(7), "{times:?}");
    }

    /// Leadership fencing across waits: a write checked once and then retried after a backoff
    /// (or after waiting for a rate-limit token) is checked again before each attempt, so a
    /// replica that lost leadership meanwhile issues nothing more; reads are not gated.
    #[tokio::test(start_paused = true)]
    async fn a_closed_write_gate_stops_retries_and_rate_limited_writes_but_not_reads() {
        use std::sync::atomic::AtomicBool;
        let clock = TokioClock::new();
        let open = Arc::new(AtomicBool::new(true));
        let gate: WriteGate = Arc::new({
            let open = open.clone();
            move || open.load(Ordering::SeqCst)
        });
        // Throttled with a 7 s Retry-After; the gate closes during the wait.
        let inner = Scripted::new(
            vec![Err(ProviderError::Throttled { retry_after: Some(Duration::from_secs(7)) })],
            clock,
        );
        let p = Arc::new(Polite::with_clock(inner, config(3), clock));
        p.set_write_gate(gate.clone());
        let write = tokio::spawn({
            let p = p.clone();
            async move { p.set_target_size("acct/gpu", 3).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 1, "the first attempt went out");
        open.store(false, Ordering::SeqCst);
        let err = write.await.unwrap().unwrap_err();
        assert!(matches!(err, ProviderError::NotPermitted { op: "set_target_size" }), "{err}");
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 1, "the retry was not issued");
        assert!(p.delete_instances("acct/gpu", &["i-1".into()]).await.is_err());
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 1, "nor any other write");
        p.refresh().await.unwrap();
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 2, "reads go on");

        // Waiting for a rate-limit token: checked after the wait.
        open.store(true, Ordering::SeqCst);
        let mut cfg = config(1);
        cfg.rate_limit = Some(RateLimitConfig { requests_per_second: 1.0, burst: 1 });
        let p = Arc::new(Polite::with_clock(Scripted::new(vec![], clock), cfg, clock));
        p.set_write_gate(gate);
        p.set_target_size("acct/gpu", 1).await.unwrap();
        let write = tokio::spawn({
            let p = p.clone();
            async move { p.set_target_size("acct/gpu", 2).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        open.store(false, Ordering::SeqCst);
        assert!(matches!(write.await.unwrap(), Err(ProviderError::NotPermitted { .. })));
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), 1, "only the write before the gate closed");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_spaces_calls() {
        let clock = TokioClock::new();
        let inner = Scripted::new(vec![], clock);
        let mut cfg = config(1);
        cfg.rate_limit = Some(RateLimitConfig { requests_per_second: 2.0, burst: 2 });
        let p = Polite::with_clock(inner, cfg, clock);
        for _ in 0..6 {
            p.refresh().await.unwrap();
        }
        let times = p.inner().times.lock().unwrap().clone();
        // The burst of two goes at once, then one call per 500 ms.
        assert!(times[1] - times[0] < Duration::from_millis(10), "{times:?}");
        for w in times[2..].windows(2) {
            assert!(w[1] - w[0] >= Duration::from_millis(499), "{times:?}");
        }
        assert!(times[5] - times[0] >= Duration::from_millis(1999), "{times:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_failures_mark_offerings_and_back_off_the_group() {
        let clock = TokioClock::new();
        let inner = Scripted::new(vec![], clock);
        let failed = crate::model::Instance {
            id: "aws:///us-east-1a/i-0f".into(),
            state: InstanceState::Failed {
                class: ErrorClass::OutOfCapacity,
                message: "InsufficientInstanceCapacity".into(),
            },
        };
        *inner.groups.lock().unwrap() = vec![group(&["us-east-1a", "us-east-1b"], 1, vec![failed])];
        let p = Polite::with_clock(inner, config(1), clock);
        p.refresh().await.unwrap();
        assert!(!p.is_offering_available("p5.48xlarge", "us-east-1a", CapacityType::OnDemand));
        assert!(p.is_offering_available("p5.48xlarge", "us-east-1b", CapacityType::OnDemand));
        assert!(p.is_offering_available("p5.48xlarge", "us-east-1a", CapacityType::Spot));
        // The same failed instance seen again is not a second failure.
        p.refresh().await.unwrap();
        assert_eq!(p.group_backoff("acct/gpu").unwrap().failures, 1);
        // Scale-up refused while backing off; scale-down still allowed.
        let err = p.set_target_size("acct/gpu", 2).await.unwrap_err();
        let ProviderError::Api { cause, .. } = &err else { panic!("{err}") };
        assert!(cause.downcast_ref::<BackingOff>().is_some());
        p.set_target_size("acct/gpu", 0).await.unwrap();

        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(p.group_backoff("acct/gpu").is_none());
        // The offering mark lasts 180 s.
        assert!(!p.is_offering_available("p5.48xlarge", "us-east-1a", CapacityType::OnDemand));
        tokio::time::advance(Duration::from_secs(120)).await;
        assert!(p.is_offering_available("p5.48xlarge", "us-east-1a", CapacityType::OnDemand));
        p.set_target_size("acct/gpu", 2).await.unwrap();

        // A second failure doubles the backoff.
        let b = p.record_scale_up_failure("acct/gpu", ErrorClass::OutOfCapacity);
        assert_eq!(b.failures, 2);
        assert_eq!(b.until - p.clock().now(), Duration::from_secs(120));
    }

    /// A capacity failure of one group makes its siblings on the same offering unavailable to
    /// the planner at once, but not a group of another zone or capacity type: the plan falls back
    /// to the next group in the pass that learns of the failure.
    #[tokio::test(start_paused = true)]
    async fn a_failed_offering_makes_every_group_on_it_unavailable() {
        let clock = TokioClock::new();
        let inner = Scripted::new(vec![], clock);
        let failed = crate::model::Instance {
            id: "aws:///us-east-1a/i-0f".into(),
            state: InstanceState::Failed { class: ErrorClass::OutOfCapacity, message: "ICE".into() },
        };
        let first = group(&["us-east-1a"], 1, vec![failed]);
        let sibling = NodeGroup { id: "acct/gpu-2".into(), ..group(&["us-east-1a"], 0, vec![]) };
        let other_zone = NodeGroup { id: "acct/gpu-b".into(), ..group(&["us-east-1b"], 0, vec![]) };
        let spot = NodeGroup {
            id: "acct/gpu-spot".into(),
            capacity_type: CapacityType::Spot,
            ..group(&["us-east-1a"], 0, vec![])
        };
        *inner.groups.lock().unwrap() = vec![first, sibling, other_zone, spot];
        let p = Polite::with_clock(inner, config(1), clock);
        p.refresh().await.unwrap();
        assert!(p.unavailable_reason("acct/gpu").unwrap().contains("backing off"));
        let why = p.unavailable_reason("acct/gpu-2").expect("the sibling shares the failed offering");
        assert!(why.contains("p5.48xlarge (on-demand) has no capacity in us-east-1a"), "{why}");
        assert_eq!(p.unavailable_reason("acct/gpu-b"), None);
        assert_eq!(p.unavailable_reason("acct/gpu-spot"), None);
        // The mark expires with the offering's TTL (180 s).
        tokio::time::advance(Duration::from_secs(181)).await;
        assert_eq!(p.unavailable_reason("acct/gpu-2"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn insufficient_capacity_from_the_api_marks_every_zone() {
        let clock = TokioClock::new();
        let inner = Scripted::new(
            vec![
                Ok(()),
                Err(ProviderError::InsufficientCapacity {
                    group: "acct/gpu".into(),
                    message: "stockout".into(),
                }),
            ],
            clock,
        );
        *inner.groups.lock().unwrap() = vec![group(&["us-east-1a", "us-east-1b"], 0, vec![])];
        let p = Polite::with_clock(inner, config(3), clock);
        p.refresh().await.unwrap();
        assert!(p.set_target_size("acct/gpu", 1).await.is_err());
        assert_eq!(p.unavailable_offerings().len(), 2);
        // After the group backoff (60 s) the offerings (180 s) still block the scale-up, without
        // calling the cloud.
        tokio::time::advance(Duration::from_secs(61)).await;
        let calls = p.inner().calls.load(Ordering::SeqCst);
        assert!(matches!(
            p.set_target_size("acct/gpu", 1).await,
            Err(ProviderError::InsufficientCapacity { .. })
        ));
        assert_eq!(p.inner().calls.load(Ordering::SeqCst), calls);
    }
}
