//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas never act at once.
//!
//! kube-rs has no leader election; this follows client-go's protocol: the holder renews
//! `renewTime` every few seconds; a candidate takes the Lease only once it has seen the same
//! record unchanged for `leaseDurationSeconds` (measured on its own clock, so clock skew between
//! replicas does not matter), and every write carries the `resourceVersion` it read, so of two
//! candidates only one write succeeds. A holder that fails to renew steps down at once.
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
pub use adapter::{LeaderElector, LeaderError};

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

        /// Runs election rounds every `renew` until `shutdown` turns true, publishing whether we
        /// lead on `leading`. Any failed renewal steps down immediately. Releases the Lease on
        /// shutdown.
        pub async fn run(
            mut self,
            renew: Duration,
            leading: watch::Sender<bool>,
            mut shutdown: watch::Receiver<bool>,
        ) {
            loop {
                let now = Timestamp::now();
                let lead = match self.try_acquire_or_renew(now).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, "leader election round failed; not leading");
                        false
                    }
                };
                if *leading.borrow() != lead {
                    tracing::info!(identity = %self.identity, leading = lead, "leadership changed");
                }
                leading.send_replace(lead);
                tokio::select! {
                    _ = tokio::time::sleep(renew) => {}
                    _ = shutdown.wait_for(|s| *s) => break,
                }
            }
            leading.send_replace(false);
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, "releasing the lease failed");
            }
        }
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
