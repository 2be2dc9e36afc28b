//! The controller's pods, each converted once when its watch event arrives and kept as what the
//! loop reads — its conversion ([`PodConversion`]) and what batching and drains ask — instead of
//! as a Pod. At 50,000 pods, stored Pods (even slimmed) were most of the controller's memory, and
//! converting them again most of each pass.
//!
//! The store follows a watch as kube's reflector does (a relist replaces the contents at once, at
//! its end), but converts in between: the pages of a relist in parallel off the async threads,
//! single events where they arrive.

use super::drain::{Deletion, PodFacts};
use crate::k8s::{slim_pod, PodConversion};
use crate::model::{GpuDemand, Workload};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// Mirror pods carry this annotation.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Pods of a relist converted together (the watcher's list page size).
const RELIST_BATCH: usize = 500;

/// One pod as the loop reads it.
#[derive(Debug)]
pub struct PodRecord {
    /// `namespace/name` (namespace `default` when absent, as the conversion has it): kept, not
    /// formatted, as every wake of the loop asks it of every pending pod.
    id: String,
    /// Where the namespace ends in `id`.
    slash: usize,
    /// `metadata.uid`, the last key of the loop's order.
    uid: Option<String>,
    /// Waiting for a node: no `spec.nodeName`, not finished, not being deleted.
    pub waiting: bool,
    /// Its conversion.
    pub conversion: PodConversion,
    /// A static pod's mirror.
    mirror: bool,
    /// `status.startTime`.
    started_at: Option<Timestamp>,
    /// The configured checkpoint annotation's time.
    checkpoint_at: Option<Timestamp>,
    /// Set once the pod is terminating.
    deletion: Option<Deletion>,
    /// `spec.terminationGracePeriodSeconds`.
    grace_seconds: Option<u32>,
    /// Why a waiting pod is left out of the plan ([`crate::k8s::refuse_waiting_pod`]).
    pub refused: Option<Box<crate::k8s::RefusedObject>>,
}

impl PodRecord {
    /// Converts `pod`; `checkpoint_annotation` is the configured annotation training pods report
    /// their last checkpoint in.
    pub fn new(pod: Pod, checkpoint_annotation: &str) -> Self {
        let grace_seconds = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .map(|g| g.clamp(0, u32::MAX as i64) as u32);
        let refused = crate::k8s::refuse_waiting_pod(&pod).map(Box::new);
        let pod = slim_pod(pod);
        let meta = &pod.metadata;
        let annotations = meta.annotations.as_ref();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let unbound = pod.spec.as_ref().is_none_or(|s| s.node_name.as_deref().unwrap_or_default().is_empty());
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        PodRecord {
            id: id(namespace, meta.name.as_deref().unwrap_or_default()),
            slash: namespace.len(),
            uid: meta.uid.clone(),
            waiting: unbound && meta.deletion_timestamp.is_none() && matches!(phase, None | Some("Pending")),
            mirror: annotations.is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
            started_at: pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            checkpoint_at: annotations
                .and_then(|a| a.get(checkpoint_annotation))
                .and_then(|v| v.parse::<Timestamp>().ok()),
            deletion: meta.deletion_timestamp.as_ref().map(|t| Deletion {
                at: t.0,
                grace: Duration::from_secs(meta.deletion_grace_period_seconds.unwrap_or(0).max(0) as u64),
            }),
            conversion: PodConversion::new(pod),
            grace_seconds,
            refused,
        }
    }

    /// `namespace/name`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `metadata.namespace` (`default` when absent).
    pub fn namespace(&self) -> &str {
        &self.id[..self.slash]
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.id[self.slash + 1..]
    }

    /// The store's key of `pod`: its `namespace/name`, as [`Self::id`] has it.
    fn key_of(pod: &Pod) -> String {
        let meta = &pod.metadata;
        id(meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
    }

    /// The order snapshots list pods in, whatever order the store hands them out.
    pub fn identity(&self) -> (&str, &str, Option<&str>) {
        (self.namespace(), self.name(), self.uid.as_deref())
    }

    /// What drains need of the pod, given its workload in the snapshot.
    pub fn facts(&self, w: &Workload) -> PodFacts {
        PodFacts {
            namespace: self.namespace().to_string(),
            name: self.name().to_string(),
            node: w.node_name.clone(),
            owner: w.owner.clone(),
            mirror: self.mirror,
            terminal: false,
            eviction_blocked: w.eviction_blocked.clone(),
            gpu: !matches!(w.gpu, GpuDemand::None),
            started_at: self.started_at,
            checkpoint_at: self.checkpoint_at,
            deletion: self.deletion.clone(),
            grace_seconds: self.grace_seconds,
        }
    }
}

/// A pod's `namespace/name`, the key of the store and the id of its workload.
fn id(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl AsRef<PodRecord> for PodRecord {
    fn as_ref(&self) -> &PodRecord {
        self
    }
}

type Records = HashMap<String, Arc<PodRecord>>;

/// The pods the watch has seen, converted; cheap to clone (a handle).
#[derive(Clone)]
pub struct PodStore {
    records: Arc<RwLock<Records>>,
    ready: watch::Receiver<bool>,
}

impl PodStore {
    /// Every pod, in no particular order.
    pub fn state(&self) -> Vec<Arc<PodRecord>> {
        self.records.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Waits for the first complete list; an error when the watch ended before it.
    pub async fn wait_until_ready(&self) -> Result<(), ()> {
        let mut ready = self.ready.clone();
        ready.wait_for(|r| *r).await.map(|_| ()).map_err(|_| ())
    }

    /// Follows `api`'s pods into a new store; `notify` is told of every change.
    pub fn spawn(
        api: Api<Pod>,
        checkpoint_annotation: String,
        notify: Arc<Notify>,
    ) -> (Self, JoinHandle<()>) {
        let (store, mut follower) = Self::new(checkpoint_annotation);
        let task = tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => follower.apply(event).await,
                    Err(e) => {
                        tracing::warn!(kind = "Pod", error = %e, "watch error; retrying with backoff");
                        continue;
                    }
                }
                notify.notify_one();
            }
        });
        (store, task)
    }

    /// An empty store, and what fills it from a watch's events.
    fn new(checkpoint_annotation: String) -> (Self, Follower) {
        let records = Arc::new(RwLock::new(Records::new()));
        let (ready_tx, ready) = watch::channel(false);
        let follower = Follower {
            records: records.clone(),
            ready: ready_tx,
            key: Arc::new(checkpoint_annotation),
            relist: None,
            page: Vec::new(),
        };
        (PodStore { records, ready }, follower)
    }
}

/// Applies a watch's events to a store, as kube's reflector does: a relist's pods replace the
/// contents at once when it ends (so pods deleted while the watch was down go), and the store is
/// ready from the end of the first.
struct Follower {
    records: Arc<RwLock<Records>>,
    ready: watch::Sender<bool>,
    /// The configured checkpoint annotation.
    key: Arc<String>,
    /// A relist's records so far.
    relist: Option<Records>,
    /// Pods of the relist not converted yet.
    page: Vec<Pod>,
}

impl Follower {
    async fn apply(&mut self, event: Event<Pod>) {
        let write = || self.records.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Apply(pod) => {
                let record = PodRecord::new(pod, &self.key);
                write().insert(record.id.clone(), Arc::new(record));
            }
            Event::Delete(pod) => {
                write().remove(&PodRecord::key_of(&pod));
            }
            Event::Init => {
                self.relist = Some(Records::new());
                self.page.clear();
            }
            Event::InitApply(pod) => {
                self.page.push(pod);
                if self.page.len() >= RELIST_BATCH {
                    let converted = convert_all(std::mem::take(&mut self.page), self.key.clone()).await;
                    self.relist.get_or_insert_with(Records::new).extend(converted);
                }
            }
            Event::InitDone => {
                let converted = convert_all(std::mem::take(&mut self.page), self.key.clone()).await;
                let mut listed = self.relist.take().unwrap_or_default();
                listed.extend(converted);
                *write() = listed;
                self.ready.send_replace(true);
            }
        }
    }
}

/// `pods` converted in parallel, off the async threads.
async fn convert_all(pods: Vec<Pod>, key: Arc<String>) -> Vec<(String, Arc<PodRecord>)> {
    if pods.is_empty() {
        return Vec::new();
    }
    let convert = move || {
        pods.into_par_iter()
            .map(|p| {
                let record = PodRecord::new(p, &key);
                (record.id.clone(), Arc::new(record))
            })
            .collect()
    };
    tokio::task::spawn_blocking(convert).await.expect("converting pods does not panic")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "annotations": {"gpuscale.io/last-checkpoint": "2026-12-01T00:00:00Z"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "trainer:1",
                     "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        }))
        .unwrap()
    }

    fn ids(store: &PodStore) -> Vec<String> {
        let mut ids: Vec<String> = store.state().iter().map(|r| r.id().to_string()).collect();
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn follows_a_watch_and_a_relist_replaces_what_it_does_not_list() {
        let (store, mut follower) = PodStore::new("gpuscale.io/last-checkpoint".into());
        follower.apply(Event::Init).await;
        // More than a batch, so the relist converts in several batches.
        for i in 0..RELIST_BATCH + 3 {
            follower.apply(Event::InitApply(pod(&format!("p{i:04}"), Some("n1")))).await;
        }
        assert!(store.state().is_empty() && !*store.ready.borrow(), "a relist shows when it ends");
        follower.apply(Event::InitDone).await;
        store.wait_until_ready().await.unwrap();
        assert_eq!(store.state().len(), RELIST_BATCH + 3);

        follower.apply(Event::Apply(pod("new", None))).await;
        follower.apply(Event::Delete(pod("p0000", Some("n1")))).await;
        assert_eq!(store.state().len(), RELIST_BATCH + 3);
        let new = store.state().into_iter().find(|r| r.name() == "new").unwrap();
        assert!(new.waiting);
        assert_eq!(new.conversion.pod().unwrap().workload.id, "ml/new");
        let running = store.state().into_iter().find(|r| r.name() == "p0001").unwrap();
        assert!(!running.waiting);
        let facts = running.facts(&running.conversion.pod().unwrap().workload);
        assert_eq!(facts.node.as_deref(), Some("n1"));
        assert_eq!(facts.checkpoint_at, Some("2026-12-01T00:00:00Z".parse().unwrap()));

        // The watch was down: the relist lists two pods; everything else is gone at its end.
        follower.apply(Event::Init).await;
        follower.apply(Event::InitApply(pod("p0001", Some("n1")))).await;
        follower.apply(Event::InitApply(pod("late", None))).await;
        assert_eq!(store.state().len(), RELIST_BATCH + 3, "the old contents stay until the relist ends");
        follower.apply(Event::InitDone).await;
        assert_eq!(ids(&store), vec!["ml/late", "ml/p0001"]);
    }
}
