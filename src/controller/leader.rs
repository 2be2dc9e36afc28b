//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas never act at once.
//!
//! kube-rs has no leader election; this follows client-go's protocol: the holder renews
//! `renewTime` every few seconds; a candidate takes the Lease only once it has seen the same
//! record unchanged for `leaseDurationSeconds` (measured on its own clock, so clock skew between
//! replicas does not matter), and every write carries the `resourceVersion` it read, so of two
//! candidates only one write succeeds.
//!
//! The holder stops acting before anyone can take the Lease over, as client-go's leader election
//! does: a renewal round that began at `t` and succeeded lets it act until `t + renewDeadline`,
//! which is shorter than `leaseDurationSeconds`, the earliest another replica may take over
//! (counted from after our write). Rounds run every `retryPeriod`; a failed round keeps the claim
//! until its deadline lapses, and a round that finds another holder or loses a write race ends it
//! at once. The claim is published as a [`Fence`]: every background task checks
//! [`Fence::holds`] immediately before each cloud or API write and stops when it turns false,
//! whether or not the election loop has run since (a hung renewal cannot extend it). Cloud writes
//! are checked once more inside the provider wrapper, before each attempt (a write that waited
//! for a rate-limit token or a retry backoff is not issued late; see
//! `providers::politeness::WriteGate`).
//!
//! [`decide`] is the pure decision; [`LeaderElector`] is the adapter that reads and writes the
//! Lease.

use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// The parts of a Lease the decision needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; `None` or empty when released.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
    /// `spec.renewTime`.
    pub renew_time: Option<Timestamp>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

/// When this replica first saw the current record (holder and renew time) unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The record as seen.
    pub record: LeaseRecord,
    /// Local time it was first seen.
    pub at: Timestamp,
}

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderDecision {
    /// No Lease exists: create it with us as holder.
    Create,
    /// We hold it: write a new `renewTime`.
    Renew,
    /// It expired or was released: take it over (one more transition).
    Acquire,
    /// Someone else holds it; look again later.
    Follow {
        /// Current holder.
        holder: String,
        /// When it expires if not renewed, on our clock.
        expires_at: Timestamp,
    },
}

/// Decides what to do given the Lease as read (`None`: absent), when we first saw this exact
/// record (`observed`), our identity, the configured duration, and `now`.
pub fn decide(
    lease: Option<&LeaseRecord>,
    observed: Option<&Observed>,
    me: &str,
    default_duration: Duration,
    now: Timestamp,
) -> LeaderDecision {
    let Some(lease) = lease else { return LeaderDecision::Create };
    let holder = lease.holder.as_deref().filter(|h| !h.is_empty());
    let Some(holder) = holder else { return LeaderDecision::Acquire };
    if holder == me {
        return LeaderDecision::Renew;
    }
    let duration =
        lease.duration_seconds.filter(|&d| d > 0).map_or(default_duration, |d| Duration::from_secs(d as u64));
    // The expiry clock starts when we first saw this record, never from the holder's timestamps.
    let seen_at = observed.filter(|o| &o.record == lease).map_or(now, |o| o.at);
    let expires_at = seen_at + duration;
    if now >= expires_at {
        LeaderDecision::Acquire
    } else {
        LeaderDecision::Follow { holder: holder.to_string(), expires_at }
    }
}

#[cfg(feature = "controller")]
pub use adapter::{Fence, LeaderElector, LeaderError, NotLeading};

#[cfg(feature = "controller")]
mod adapter {
    use super::{decide, LeaderDecision, LeaseRecord, Observed};
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::Timestamp;
    use kube::api::{Api, PostParams};
    use std::time::Duration;
    use thiserror::Error;
    use tokio::sync::watch;
    use tokio::time::Instant;

    /// A write was not issued because this replica does not hold the Lease (any more).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
    #[error("not issued: this replica does not hold the leader Lease")]
    pub struct NotLeading;

    /// The fencing token: until when this replica may act (`None`: it may not). Cheap to clone;
    /// every task that writes holds one and checks it immediately before each write.
    #[derive(Debug, Clone)]
    pub struct Fence {
        rx: watch::Receiver<Option<Instant>>,
        /// The [`super::super::gate::Mutant::IgnoreLease`] test mutant: holds whatever the Lease.
        ignored: bool,
    }

    impl Fence {
        /// A fence and the sender the elector publishes its claim on.
        pub fn channel() -> (watch::Sender<Option<Instant>>, Fence) {
            let (tx, rx) = watch::channel(None);
            (tx, Fence { rx, ignored: false })
        }

        /// This fence, broken on purpose: it always holds (the fault-injection suite's
        /// `IgnoreLease` mutant, never reached from a config).
        #[doc(hidden)]
        pub fn ignoring_lease(self) -> Self {
            Self { ignored: true, ..self }
        }

        /// Whether this replica may act now: it holds a claim whose renew deadline has not passed.
        pub fn holds(&self) -> bool {
            self.ignored || self.rx.borrow().is_some_and(|until| Instant::now() < until)
        }

        /// `Ok` when [`Fence::holds`], else [`NotLeading`]: the check before a write.
        pub fn check(&self) -> Result<(), NotLeading> {
            if self.holds() {
                Ok(())
            } else {
                Err(NotLeading)
            }
        }

        /// Resolves once this replica may no longer act (at once if it may not now).
        pub async fn lost(&self) {
            if self.ignored {
                return std::future::pending().await;
            }
            let mut rx = self.rx.clone();
            loop {
                let until = *rx.borrow_and_update();
                let Some(until) = until else { return };
                if Instant::now() >= until {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => return,
                    r = rx.changed() => if r.is_err() { return },
                }
            }
        }

        /// Waits for the next change of the claim (`Err` when the elector is gone).
        pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
            self.rx.changed().await
        }
    }

    /// A Lease call failed for another reason than losing a race.
    #[derive(Debug, Error)]
    #[error("Lease {namespace}/{name}: {op} failed: {cause}")]
    pub struct LeaderError {
        namespace: String,
        name: String,
        op: &'static str,
        /// In the message, so not also a `source()`.
        cause: kube::Error,
    }

    /// Reads and writes one Lease for one identity.
    pub struct LeaderElector {
        api: Api<Lease>,
        namespace: String,
        name: String,
        identity: String,
        duration: Duration,
        observed: Option<Observed>,
    }

    fn record_of(lease: &Lease) -> LeaseRecord {
        let spec = lease.spec.clone().unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity,
            duration_seconds: spec.lease_duration_seconds,
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    fn is_conflict(e: &kube::Error) -> bool {
        matches!(e, kube::Error::Api(s) if s.code == 409)
    }

    impl LeaderElector {
        /// An elector for Lease `namespace/name`, holder identity `identity` (the pod name).
        pub fn new(
            client: kube::Client,
            namespace: &str,
            name: &str,
            identity: &str,
            duration: Duration,
        ) -> Self {
            Self {
                api: Api::namespaced(client, namespace),
                namespace: namespace.to_string(),
                name: name.to_string(),
                identity: identity.to_string(),
                duration,
                observed: None,
            }
        }

        fn err(&self, op: &'static str, cause: kube::Error) -> LeaderError {
            LeaderError { namespace: self.namespace.clone(), name: self.name.clone(), op, cause }
        }

        fn spec(&self, now: Timestamp, acquire: Option<Timestamp>, transitions: i32) -> LeaseSpec {
            LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.duration.as_secs() as i32),
                acquire_time: acquire.map(MicroTime),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(transitions),
                ..Default::default()
            }
        }

        /// One round: read the Lease, decide, write. `Ok(true)` when we hold the Lease after it;
        /// `Ok(false)` when another replica does or won a race (HTTP 409).
        pub async fn try_acquire_or_renew(&mut self, now: Timestamp) -> Result<bool, LeaderError> {
            let current = self.api.get_opt(&self.name).await.map_err(|e| self.err("get", e))?;
            let record = current.as_ref().map(record_of);
            if let Some(r) = &record {
                if self.observed.as_ref().is_none_or(|o| &o.record != r) {
                    self.observed = Some(Observed { record: r.clone(), at: now });
                }
            }
            let decision =
                decide(record.as_ref(), self.observed.as_ref(), &self.identity, self.duration, now);
            let result = match decision {
                LeaderDecision::Follow { holder, expires_at } => {
                    tracing::debug!(%holder, %expires_at, "lease held by another replica");
                    return Ok(false);
                }
                LeaderDecision::Create => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.namespace.clone()),
                            ..Default::default()
                        },
                        spec: Some(self.spec(now, Some(now), 0)),
                    };
                    self.api.create(&PostParams::default(), &lease).await.map_err(|e| (e, "create"))
                }
                LeaderDecision::Renew | LeaderDecision::Acquire => {
                    let mut lease = current.unwrap_or_default();
                    let old = record.unwrap_or_default();
                    let spec = if decision == LeaderDecision::Renew {
                        let acquire = lease.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).map(|t| t.0);
                        self.spec(now, acquire.or(Some(now)), old.transitions)
                    } else {
                        tracing::info!(previous = ?old.holder, identity = %self.identity, "acquiring the lease");
                        self.spec(now, Some(now), old.transitions + 1)
                    };
                    lease.spec = Some(spec);
                    // `replace` sends the resourceVersion we read: a concurrent write makes it 409.
                    self.api
                        .replace(&self.name, &PostParams::default(), &lease)
                        .await
                        .map_err(|e| (e, "replace"))
                }
            };
            match result {
                Ok(written) => {
                    self.observed = Some(Observed { record: record_of(&written), at: now });
                    Ok(true)
                }
                Err((e, _)) if is_conflict(&e) => {
                    tracing::info!(identity = %self.identity, "lost the lease race (409 Conflict)");
                    Ok(false)
                }
                Err((e, op)) => Err(self.err(op, e)),
            }
        }

        /// Gives the Lease up (holder cleared) if we hold it, so another replica takes over
        /// without waiting for expiry.
        pub async fn release(&mut self) -> Result<(), LeaderError> {
            let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(|e| self.err("get", e))? else {
                return Ok(());
            };
            if record_of(&lease).holder.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            match self.api.replace(&self.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(()),
                Err(e) if is_conflict(&e) => Ok(()),
                Err(e) => Err(self.err("replace", e)),
            }
        }

        /// Runs election rounds every `retry` until `shutdown` turns true, publishing on `claim`
        /// until when we may act (client-go's `RetryPeriod` and `RenewDeadline`): a round that
        /// starts at `t` and succeeds extends the claim to `t + renew_deadline`; a round that
        /// sees another holder or loses a race ends it; a failed or hung round (each is cut off
        /// at `renew_deadline`) leaves it to lapse. Releases the Lease on shutdown.
        pub async fn run(
            mut self,
            retry: Duration,
            renew_deadline: Duration,
            claim: watch::Sender<Option<Instant>>,
            mut shutdown: watch::Receiver<bool>,
        ) {
            let mut until: Option<Instant> = None;
            loop {
                let started = Instant::now();
                let round = tokio::time::timeout(renew_deadline, self.try_acquire_or_renew(Timestamp::now()));
                match round.await {
                    Ok(Ok(true)) => until = Some(started + renew_deadline),
                    Ok(Ok(false)) => until = None,
                    Ok(Err(e)) => tracing::warn!(error = %e, "leader election round failed"),
                    Err(_) => tracing::warn!(?renew_deadline, "leader election round timed out"),
                }
                if until.is_some_and(|u| Instant::now() >= u) {
                    tracing::warn!(identity = %self.identity, ?renew_deadline, "the lease was not renewed within the renew deadline");
                    until = None;
                }
                let was = claim.borrow().is_some_and(|u| started < u);
                if was != until.is_some() {
                    tracing::info!(identity = %self.identity, leading = until.is_some(), "leadership changed");
                }
                claim.send_replace(until);
                // Wake at the deadline too, so a lapse is published even while rounds fail.
                let next = (Instant::now() + retry).min(until.unwrap_or(Instant::now() + retry));
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = shutdown.wait_for(|s| *s) => break,
                }
            }
            claim.send_replace(None);
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, "releasing the lease failed");
            }
        }
    }
}

#[cfg(all(test, feature = "controller"))]
mod fence_tests {
    use super::Fence;
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_claim_holds_until_its_renew_deadline_even_if_nobody_publishes_again() {
        let (claim, fence) = Fence::channel();
        assert!(!fence.holds(), "no claim yet");
        claim.send_replace(Some(Instant::now() + Duration::from_secs(10)));
        assert!(fence.holds());
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(fence.holds());
        // The elector is stuck (a hung renewal): the claim lapses by itself.
        let started = Instant::now();
        fence.lost().await;
        assert_eq!(Instant::now() - started, Duration::from_millis(1));
        assert!(!fence.holds());
        assert!(fence.check().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_withdrawn_ends_at_once() {
        let (claim, fence) = Fence::channel();
        claim.send_replace(Some(Instant::now() + Duration::from_secs(10)));
        let waiter = tokio::spawn({
            let fence = fence.clone();
            async move {
                fence.lost().await;
                Instant::now()
            }
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        let at = Instant::now();
        claim.send_replace(None);
        assert_eq!(waiter.await.unwrap(), at, "lost as soon as the claim is withdrawn");
        assert!(!fence.holds());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn held_by(h: &str, renew: i64) -> LeaseRecord {
        LeaseRecord {
            holder: Some(h.into()),
            duration_seconds: Some(15),
            renew_time: Some(ts(renew)),
            transitions: 2,
        }
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn absent_lease_is_created_and_own_lease_renewed() {
        assert_eq!(decide(None, None, "a", D, ts(0)), LeaderDecision::Create);
        assert_eq!(decide(Some(&held_by("a", -100)), None, "a", D, ts(0)), LeaderDecision::Renew);
    }

    #[test]
    fn another_holder_is_followed_until_the_record_is_stale_on_our_clock() {
        let l = held_by("b", 0);
        // First sight: the expiry clock starts now, whatever renewTime says (skewed clocks).
        let d = decide(Some(&l), None, "a", D, ts(1000));
        assert_eq!(d, LeaderDecision::Follow { holder: "b".into(), expires_at: ts(1015) });
        let seen = Observed { record: l.clone(), at: ts(1000) };
        assert!(matches!(decide(Some(&l), Some(&seen), "a", D, ts(1014)), LeaderDecision::Follow { .. }));
        assert_eq!(decide(Some(&l), Some(&seen), "a", D, ts(1015)), LeaderDecision::Acquire);
        // A renewal changes the record: the clock restarts.
        let renewed = held_by("b", 5);
        assert!(matches!(
            decide(Some(&renewed), Some(&seen), "a", D, ts(1020)),
            LeaderDecision::Follow { .. }
        ));
    }

    #[test]
    fn released_lease_is_acquired_at_once_and_lease_duration_is_the_holders() {
        let mut l = held_by("b", 0);
        l.holder = Some(String::new());
        assert_eq!(decide(Some(&l), None, "a", D, ts(0)), LeaderDecision::Acquire);
        let mut long = held_by("b", 0);
        long.duration_seconds = Some(60);
        let seen = Observed { record: long.clone(), at: ts(0) };
        assert!(matches!(decide(Some(&long), Some(&seen), "a", D, ts(30)), LeaderDecision::Follow { .. }));
        assert_eq!(decide(Some(&long), Some(&seen), "a", D, ts(60)), LeaderDecision::Acquire);
    }
}
