//! Batching of new pending pods: plan once for a burst of pods instead of once per pod.
//!
//! A Job with 64 workers creates its pods within a second or two; planning after the first one
//! would scale for one pod, then again for the next. The batch opens when a pod that was not
//! pending before appears, and closes after `idle` without another new pod or `max` after it
//! opened, whichever is first (Karpenter's batch idle/max durations).

use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::time::Duration;

/// Where the batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// No new pending pods since the last close.
    Idle,
    /// Collecting; closes at this time unless more pods arrive (never after the max).
    Open {
        /// When it closes.
        closes_at: Timestamp,
    },
    /// Closed: plan now.
    Ready,
}

/// The batching state machine. Time is passed in; nothing here reads a clock.
#[derive(Debug, Clone)]
pub struct Batcher {
    idle: Duration,
    max: Duration,
    /// Pending pods already seen (in this or an earlier batch), with the last observation that
    /// saw them: the loop observes on every watch event, tens of thousands of pods each time,
    /// so only new pods are copied.
    seen: HashMap<String, u64>,
    /// Observations so far.
    observations: u64,
    /// First and latest arrival of the open batch.
    open: Option<(Timestamp, Timestamp)>,
}

impl Batcher {
    /// A batcher with the idle and max windows.
    pub fn new(idle: Duration, max: Duration) -> Self {
        Self { idle, max: max.max(idle), seen: HashMap::new(), observations: 0, open: None }
    }

    /// Records the pods pending now; returns how many were new. Pods no longer pending are
    /// forgotten, so a pod that becomes pending again (evicted, rescheduled) counts as new.
    pub fn observe<'a>(&mut self, pending: impl IntoIterator<Item = &'a str>, now: Timestamp) -> usize {
        self.observations += 1;
        let now_seen = self.observations;
        let mut new = 0;
        for pod in pending {
            match self.seen.get_mut(pod) {
                Some(at) => *at = now_seen,
                None => {
                    self.seen.insert(pod.to_string(), now_seen);
                    new += 1;
                }
            }
        }
        self.seen.retain(|_, at| *at == now_seen);
        if new > 0 {
            self.open = Some(match self.open {
                Some((first, _)) => (first, now),
                None => (now, now),
            });
        }
        new
    }

    /// The state at `now`.
    pub fn state(&self, now: Timestamp) -> BatchState {
        let Some((first, last)) = self.open else { return BatchState::Idle };
        let closes_at = (last + self.idle).min(first + self.max);
        if now >= closes_at {
            BatchState::Ready
        } else {
            BatchState::Open { closes_at }
        }
    }

    /// Marks the batch as planned.
    pub fn close(&mut self) {
        self.open = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_700_000_000_000 + ms).unwrap()
    }

    #[test]
    fn closes_after_idle_gap() {
        let mut b = Batcher::new(Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(b.state(t(0)), BatchState::Idle);
        assert_eq!(b.observe(["ns/a"], t(0)), 1);
        assert_eq!(b.state(t(500)), BatchState::Open { closes_at: t(1000) });
        assert_eq!(b.observe(["ns/a", "ns/b"], t(800)), 1);
        assert_eq!(b.state(t(1000)), BatchState::Open { closes_at: t(1800) });
        // Seeing the same pods again does not extend the batch.
        assert_eq!(b.observe(["ns/a", "ns/b"], t(1500)), 0);
        assert_eq!(b.state(t(1800)), BatchState::Ready);
        b.close();
        assert_eq!(b.state(t(1900)), BatchState::Idle);
        assert_eq!(b.observe(["ns/a", "ns/b"], t(2000)), 0);
        assert_eq!(b.state(t(2000)), BatchState::Idle);
    }

    #[test]
    fn a_steady_stream_closes_at_the_max() {
        let mut b = Batcher::new(Duration::from_secs(1), Duration::from_secs(10));
        let mut names = Vec::new();
        for i in 0..30 {
            names.push(format!("ns/p{i}"));
            b.observe(names.iter().map(String::as_str), t(i * 500));
            if i * 500 < 10_000 {
                assert!(matches!(b.state(t(i * 500)), BatchState::Open { .. }), "at {i}");
            } else {
                assert_eq!(b.state(t(i * 500)), BatchState::Ready, "at {i}");
            }
        }
    }

    #[test]
    fn a_pod_pending_again_is_new() {
        let mut b = Batcher::new(Duration::from_secs(1), Duration::from_secs(10));
        b.observe(["ns/a"], t(0));
        b.close();
        assert_eq!(b.observe([], t(100)), 0);
        assert_eq!(b.observe(["ns/a"], t(200)), 1);
        assert_eq!(b.state(t(300)), BatchState::Open { closes_at: t(1200) });
    }
}
