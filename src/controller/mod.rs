//! The in-cluster controller (`gpuscale run`): watches Nodes, Pods, PodDisruptionBudgets and
//! PodGroups, plans with [`crate::planner`] and acts through the cloud providers.
//!
//! Decisions are pure and tested without a cluster: batching of pending pods ([`batch`]), the
//! drain step ([`drain`]), new-node readiness and group backoff ([`readiness`]), the leader
//! decision ([`leader`]). The adapters are thin: [`snapshot`] turns the reflector stores into a
//! [`ClusterSnapshot`] through [`crate::k8s::convert`], [`actuate`] talks to the API server and
//! the clouds, [`reconcile`] is the loop. What the loop decides and does is reported to an
//! [`Observer`] (events, status, metrics plug in there).

pub mod config;

#[cfg(feature = "controller")]
pub mod health;
#[cfg(feature = "controller")]
pub mod metrics;
#[cfg(feature = "controller")]
pub mod observers;
#[cfg(feature = "controller")]
pub mod rbac;
#[cfg(feature = "controller")]
pub mod status;

#[cfg(feature = "controller")]
pub mod actuate;
#[cfg(feature = "controller")]
pub mod batch;
#[cfg(feature = "controller")]
pub mod drain;
#[cfg(feature = "controller")]
pub mod gate;
#[cfg(feature = "controller")]
pub mod leader;
#[cfg(feature = "controller")]
pub mod live;
#[cfg(feature = "controller")]
pub mod pod_store;
#[cfg(feature = "controller")]
pub mod providers;
#[cfg(feature = "controller")]
pub mod provisioning;
#[cfg(feature = "controller")]
pub mod readiness;
#[cfg(feature = "controller")]
pub mod reconcile;
#[cfg(feature = "controller")]
pub mod snapshot;

#[cfg(feature = "controller")]
pub use observer::{LogObserver, NoopObserver, Observer};

/// The Kubernetes client the controller runs on, from a found config: kube's built-in retry is
/// off, because the loop retries on its own schedule and kube would sit out an eviction's 429
/// Retry-After (10 s, up to 15 times) inside one pass and stall every other node.
#[cfg(feature = "controller")]
pub fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    crate::tls::install_crypto_provider();
    kube::Client::try_from(config)
}

#[cfg(feature = "controller")]
use crate::model::ClusterSnapshot;

#[cfg(feature = "controller")]
mod observer {
    use crate::model::ClusterSnapshot;
    use crate::planner::Plan;
    use std::time::Duration;

    /// Receives what the controller decides and does: the status publisher, Kubernetes Events
    /// and Prometheus metrics implement it. Calls come from the reconcile loop and must not block.
    pub trait Observer: Send + Sync {
        /// A plan was computed for `snapshot` in `elapsed`; with `dry_run` nothing is acted on.
        fn plan_computed(&self, plan: &Plan, snapshot: &ClusterSnapshot, dry_run: bool, elapsed: Duration);
        /// A group's target was raised for `pods`.
        fn scaled_up(&self, group: &str, from: u32, to: u32, pods: &[String]);
        /// A group's target was raised for a node that replaces `node` (consolidation); `node`
        /// is drained once the new node holds its pods.
        fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32);
        /// Raising a group failed.
        fn scale_up_failed(&self, group: &str, error: &str);
        /// A node's drain started.
        fn drain_started(&self, node: &str, reason: &str);
        /// A drained (or stuck) node's instance and Node object were deleted.
        fn node_deleted(&self, node: &str, group: &str);
        /// A pod could not be evicted now (PDB, protection annotation, training job).
        fn eviction_blocked(&self, pod: &str, node: &str, reason: &str);
        /// A group is kept out of scale-ups for a while.
        fn backoff(&self, group: &str, reason: &str);
        /// A drain that had evicted pods was given up and `node` kept, uncordoned (a pod still
        /// there past its capped grace, the drain timeout): an Event and a metric.
        fn drain_abandoned(&self, _node: &str, _group: &str, _reason: &str) {}
        /// `victim` was evicted from `node` so that the pending `preemptor` fits there.
        fn preempted(&self, _victim: &str, _node: &str, _preemptor: &str, _reason: &str) {}
        /// The reflector caches hold the whole cluster (readiness).
        fn caches_synced(&self) {}
        /// This replica became (or stopped being) the leader.
        fn leadership(&self, _leader: bool) {}
        /// The node groups as the clouds report them, before each plan.
        fn groups_refreshed(&self, _groups: &[crate::model::NodeGroup]) {}
        /// The objects left out of this pass for a value past a bound (every pass, none too).
        fn objects_refused(&self, _refused: &[crate::k8s::RefusedObject]) {}
        /// A ProvisioningRequest (`namespace/name`, its uid) was given `condition`.
        fn request_condition(
            &self,
            _request: &str,
            _uid: Option<&str>,
            _condition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
        ) {
        }
    }

    /// Ignores everything.
    #[derive(Debug, Default, Clone, Copy)]
    pub struct NoopObserver;

    impl Observer for NoopObserver {
        fn plan_computed(&self, _: &Plan, _: &ClusterSnapshot, _: bool, _: Duration) {}
        fn scaled_up(&self, _: &str, _: u32, _: u32, _: &[String]) {}
        fn replacement_requested(&self, _: &str, _: &str, _: u32, _: u32) {}
        fn scale_up_failed(&self, _: &str, _: &str) {}
        fn drain_started(&self, _: &str, _: &str) {}
        fn node_deleted(&self, _: &str, _: &str) {}
        fn eviction_blocked(&self, _: &str, _: &str, _: &str) {}
        fn backoff(&self, _: &str, _: &str) {}
    }

    /// Logs every call through `tracing` (the plan as its table in dry runs).
    #[derive(Debug, Default, Clone, Copy)]
    pub struct LogObserver;

    impl Observer for LogObserver {
        fn plan_computed(&self, plan: &Plan, snapshot: &ClusterSnapshot, dry_run: bool, elapsed: Duration) {
            let pending = snapshot.pending().count();
            if dry_run || !plan.is_noop() {
                tracing::info!(
                    dry_run,
                    nodes = snapshot.nodes.len(),
                    pending,
                    scale_ups = plan.scale_ups.len(),
                    scale_downs = plan.scale_downs.len(),
                    ?elapsed,
                    "plan:\n{}",
                    plan.to_table()
                );
            } else {
                tracing::debug!(nodes = snapshot.nodes.len(), pending, ?elapsed, "plan: nothing to do");
            }
        }
        fn scaled_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
            tracing::info!(group, from, to, pods = pods.len(), "scaled up");
        }
        fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32) {
            tracing::info!(node, group, from, to, "replacement requested");
        }
        fn scale_up_failed(&self, group: &str, error: &str) {
            tracing::warn!(group, error, "scale-up failed");
        }
        fn drain_started(&self, node: &str, reason: &str) {
            tracing::info!(node, reason, "drain started");
        }
        fn node_deleted(&self, node: &str, group: &str) {
            tracing::info!(node, group, "node deleted");
        }
        fn eviction_blocked(&self, pod: &str, node: &str, reason: &str) {
            tracing::info!(pod, node, reason, "eviction blocked");
        }
        fn backoff(&self, group: &str, reason: &str) {
            tracing::warn!(group, reason, "group backed off");
        }
        fn preempted(&self, victim: &str, node: &str, preemptor: &str, reason: &str) {
            tracing::info!(victim, node, preemptor, reason, "preempted");
        }
        fn drain_abandoned(&self, node: &str, group: &str, reason: &str) {
            tracing::warn!(node, group, reason, "drain abandoned; node kept");
        }
    }
}

/// Fans every call out to several observers (e.g. logs plus metrics plus status).
#[cfg(feature = "controller")]
pub struct Observers(pub Vec<std::sync::Arc<dyn Observer>>);

#[cfg(feature = "controller")]
impl Observer for Observers {
    fn plan_computed(
        &self,
        plan: &crate::planner::Plan,
        snapshot: &ClusterSnapshot,
        dry_run: bool,
        elapsed: std::time::Duration,
    ) {
        self.0.iter().for_each(|o| o.plan_computed(plan, snapshot, dry_run, elapsed));
    }
    fn scaled_up(&self, group: &str, from: u32, to: u32, pods: &[String]) {
        self.0.iter().for_each(|o| o.scaled_up(group, from, to, pods));
    }
    fn replacement_requested(&self, node: &str, group: &str, from: u32, to: u32) {
        self.0.iter().for_each(|o| o.replacement_requested(node, group, from, to));
    }
    fn scale_up_failed(&self, group: &str, error: &str) {
        self.0.iter().for_each(|o| o.scale_up_failed(group, error));
    }
    fn drain_started(&self, node: &str, reason: &str) {
        self.0.iter().for_each(|o| o.drain_started(node, reason));
    }
    fn node_deleted(&self, node: &str, group: &str) {
        self.0.iter().for_each(|o| o.node_deleted(node, group));
    }
    fn eviction_blocked(&self, pod: &str, node: &str, reason: &str) {
        self.0.iter().for_each(|o| o.eviction_blocked(pod, node, reason));
    }
    fn backoff(&self, group: &str, reason: &str) {
        self.0.iter().for_each(|o| o.backoff(group, reason));
    }
    fn preempted(&self, victim: &str, node: &str, preemptor: &str, reason: &str) {
        self.0.iter().for_each(|o| o.preempted(victim, node, preemptor, reason));
    }
    fn drain_abandoned(&self, node: &str, group: &str, reason: &str) {
        self.0.iter().for_each(|o| o.drain_abandoned(node, group, reason));
    }
    fn caches_synced(&self) {
        self.0.iter().for_each(|o| o.caches_synced());
    }
    fn leadership(&self, leader: bool) {
        self.0.iter().for_each(|o| o.leadership(leader));
    }
    fn groups_refreshed(&self, groups: &[crate::model::NodeGroup]) {
        self.0.iter().for_each(|o| o.groups_refreshed(groups));
    }
    fn request_condition(
        &self,
        request: &str,
        uid: Option<&str>,
        condition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
    ) {
        self.0.iter().for_each(|o| o.request_condition(request, uid, condition));
    }
    fn objects_refused(&self, refused: &[crate::k8s::RefusedObject]) {
        self.0.iter().for_each(|o| o.objects_refused(refused));
    }
}
