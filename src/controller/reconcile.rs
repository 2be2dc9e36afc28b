//! The controller loop: reflectors, batching, leader gating, plan, actuate.
//!
//! One pass (`Controller::reconcile_once`): refresh the node groups from the clouds, build the
//! snapshot from the reflector stores, remove instances whose nodes never came (and back their
//! groups off), plan, report the plan, and — when leading and not in dry-run — raise group
//! targets (atomically for gangs), start drains of nodes that have been unneeded long enough and
//! advance every drain in progress. Nothing is kept only in memory that a restart would need:
//! targets are absolute, in-flight capacity is recomputed from group targets and registering
//! nodes, and drain state is on the Node objects.

use super::actuate::{ApiError, Eviction, KubeActuator};
use super::batch::{BatchState, Batcher};
use super::config::{secs, ControllerConfig};
use super::drain::{self, DrainOutcome};
use super::gate;
use super::leader::{Fence, LeaderElector};
use super::pod_store::PodStore;
use super::providers::ProviderSet;
use super::readiness;
use super::snapshot::{self, ClusterView};
use super::status::split_pod;
use super::Observer;
use crate::k8s::SnapshotError;
use crate::model::{ErrorClass, NodeGroup};
use crate::planner::decide::{self, decide, Command, DecideSettings, Observed, Replacing};
use crate::planner::{self, cluster::group_of, PlacementHints, Plan, PlanInput, PlannerSettings};
use crate::providers::gang::{prepare_gang, resume_gang, run_gang, GangOutcome, GangRecord, GroupGrowth};
use crate::providers::{CloudProvider, ProviderError};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplate};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// How often a refusal is asked again (2 s apart) before it stops the controller.
const REFUSALS_BEFORE_GIVING_UP: u32 = 3;

/// Lists one object of `api` to learn, before any watch starts, whether the server lets us read
/// it: 401/403 (still, after [`REFUSALS_BEFORE_GIVING_UP`] retries) is
/// [`ControllerError::Refused`]; 404 (the resource is not served) is `Ok(false)`.
/// Other failures (the server not reachable yet) are retried with backoff until one of those
/// answers or success, so an absent CRD is never mistaken for a passing fault or the reverse.
async fn may_read<K>(api: &Api<K>, what: &str) -> Result<bool, ControllerError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut delay = Duration::from_millis(200);
    let mut refusals = 0;
    loop {
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(true),
            // A restarting API server refuses allowed requests until its RBAC caches fill: a
            // refusal counts once it has held for a few seconds.
            Err(kube::Error::Api(e))
                if (e.code == 401 || e.code == 403) && refusals < REFUSALS_BEFORE_GIVING_UP =>
            {
                refusals += 1;
                tracing::warn!(what, error = %e.message, "refused; asking again in case the API server is warming up");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(kube::Error::Api(e)) if e.code == 401 || e.code == 403 => {
                return Err(ControllerError::Refused {
                    what: what.to_string(),
                    code: e.code,
                    message: e.message,
                })
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(e) => {
                tracing::warn!(what, error = %e, retry_in = ?delay, "reading from the API server failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
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
    /// (`tests/k8s_safety.rs`); no config key or flag reaches it.
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

/// Aborts spawned tasks when dropped, so a cancelled controller leaves nothing running.
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The stores the loop reads.
struct Stores {
    nodes: Store<Node>,
    /// Pods, converted as they arrive.
    pods: PodStore,
    pdbs: Store<PodDisruptionBudget>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    pod_groups: Option<Store<DynamicObject>>,
    /// Dynamic Resource Allocation objects, where `resource.k8s.io/v1` is served.
    dra: Option<DraStores>,
    /// ProvisioningRequests and the PodTemplates they name, where their CRD is installed.
    provisioning: Option<ProvisioningStores>,
}

/// What Kueue (or anyone) asks capacity for before it creates pods.
struct ProvisioningStores {
    requests: Store<DynamicObject>,
    templates: Store<PodTemplate>,
}

/// What DRA pods ask (claims, templates) and nodes offer (slices), and the classes both name.
struct DraStores {
    classes: Store<DeviceClass>,
    slices: Store<ResourceSlice>,
    claims: Store<ResourceClaim>,
    templates: Store<ResourceClaimTemplate>,
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
    decide: decide::LoopState,
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
}

/// How long a pod this process evicted is not evicted again while the watch catches up.
const EVICTION_ECHO_WINDOW: Duration = Duration::from_secs(30);

fn spawn_reflector<K>(
    api: Api<K>,
    writer: Writer<K>,
    notify: Arc<Notify>,
    kind: &'static str,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    spawn_reflector_dyn(api, writer, notify, kind, K::DynamicType::default(), |_| {})
}

/// A reflector whose store keeps of each Node only what the loop reads
/// ([`crate::k8s::slim_node`]): node images and system info are most of a Node.
fn spawn_slim_reflector<K>(
    api: Api<K>,
    writer: Writer<K>,
    notify: Arc<Notify>,
    kind: &'static str,
    slim: fn(K) -> K,
) -> JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Default
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    spawn_reflector_dyn(api, writer, notify, kind, (), move |o: &mut K| *o = slim(std::mem::take(o)))
}

fn spawn_reflector_dyn<K>(
    api: Api<K>,
    writer: Writer<K>,
    notify: Arc<Notify>,
    kind: &'static str,
    _dyntype: K::DynamicType,
    prune: impl Fn(&mut K) + Send + Sync + 'static,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    // managedFields are often the largest part of an object and nothing reads them: the stores
    // keep objects without them.
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff().modify(move |o| {
            o.meta_mut().managed_fields = None;
            prune(o);
        }),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => notify.notify_one(),
                Err(e) => tracing::warn!(kind, error = %e, "watch error; retrying with backoff"),
            }
        }
    })
}

/// The PodGroup resource (coscheduling plugin), when its CRD is installed.
pub(crate) fn pod_group_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
        "podgroups",
    )
}

impl Controller {
    /// A controller on `client` acting through `providers`, reporting to `observer`.
    pub fn new(
        client: Client,
        providers: Arc<ProviderSet>,
        options: ControllerOptions,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let (claim, fence) = Fence::channel();
        let actuator = KubeActuator::new(client.clone(), fence.clone());
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
        let cfg = self.options.config.clone();
        let notify = Arc::new(Notify::new());
        let mut tasks = Tasks(Vec::new());

        let node_w = Writer::<Node>::default();
        let (pods, pod_task) = PodStore::spawn(
            Api::all(self.client.clone()),
            cfg.training.checkpoint_annotation.clone(),
            notify.clone(),
        );
        tasks.0.push(pod_task);
        let pdb_w = Writer::<PodDisruptionBudget>::default();
        let claim_w = Writer::<PersistentVolumeClaim>::default();
        let volume_w = Writer::<PersistentVolume>::default();
        let class_w = Writer::<StorageClass>::default();
        let mut stores = Stores {
            nodes: node_w.as_reader(),
            pods,
            pdbs: pdb_w.as_reader(),
            claims: claim_w.as_reader(),
            volumes: volume_w.as_reader(),
            classes: class_w.as_reader(),
            pod_groups: None,
            dra: None,
            provisioning: None,
        };
        // What the loop cannot work without: refused is an RBAC fault, not served an old server;
        // both stop the controller with the reason instead of a silent retry loop.
        for (served, what) in [
            (may_read(&Api::<Node>::all(self.client.clone()), "list nodes").await?, "v1 Node"),
            (may_read(&Api::<Pod>::all(self.client.clone()), "list pods").await?, "v1 Pod"),
            (
                may_read(&Api::<PodDisruptionBudget>::all(self.client.clone()), "list poddisruptionbudgets")
                    .await?,
                "policy/v1 PodDisruptionBudget",
            ),
            (
                may_read(
                    &Api::<PersistentVolumeClaim>::all(self.client.clone()),
                    "list persistentvolumeclaims",
                )
                .await?,
                "v1 PersistentVolumeClaim",
            ),
            (
                may_read(&Api::<PersistentVolume>::all(self.client.clone()), "list persistentvolumes")
                    .await?,
                "v1 PersistentVolume",
            ),
            (
                may_read(&Api::<StorageClass>::all(self.client.clone()), "list storageclasses").await?,
                "storage.k8s.io/v1 StorageClass",
            ),
        ] {
            if !served {
                return Err(ControllerError::NotServed { what });
            }
        }
        tasks.0.push(spawn_slim_reflector(
            Api::all(self.client.clone()),
            node_w,
            notify.clone(),
            "Node",
            crate::k8s::slim_node,
        ));
        tasks.0.push(spawn_reflector(
            Api::all(self.client.clone()),
            pdb_w,
            notify.clone(),
            "PodDisruptionBudget",
        ));
        // What pods' volumes ask of nodes (VolumeBinding, VolumeZone, ReadWriteOncePod).
        tasks.0.push(spawn_reflector(
            Api::all(self.client.clone()),
            claim_w,
            notify.clone(),
            "PersistentVolumeClaim",
        ));
        tasks.0.push(spawn_reflector(
            Api::all(self.client.clone()),
            volume_w,
            notify.clone(),
            "PersistentVolume",
        ));
        tasks.0.push(spawn_reflector(Api::all(self.client.clone()), class_w, notify.clone(), "StorageClass"));
        let ar = pod_group_resource();
        let pg_api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        // An absent CRD turns gang sizes from PodGroups off; a refusal is an error, so gangs are
        // never silently planned as single pods.
        if may_read(&pg_api, "list podgroups.scheduling.x-k8s.io").await? {
            let w = Writer::<DynamicObject>::new(ar.clone());
            stores.pod_groups = Some(w.as_reader());
            tasks.0.push(spawn_reflector_dyn(pg_api, w, notify.clone(), "PodGroup", ar, |_| {}));
        } else {
            tracing::info!(
                "PodGroups (scheduling.x-k8s.io/v1alpha1) not served; gang sizes come from pod annotations"
            );
        }
        // Clusters before 1.34 do not serve resource.k8s.io/v1: their pods have no claims to plan.
        // A refusal is an error, so DRA pods are never silently planned without their claims.
        if may_read(&Api::<ResourceSlice>::all(self.client.clone()), "list resourceslices.resource.k8s.io")
            .await?
        {
            for (what, served) in [
                (
                    "list deviceclasses.resource.k8s.io",
                    may_read(
                        &Api::<DeviceClass>::all(self.client.clone()),
                        "list deviceclasses.resource.k8s.io",
                    )
                    .await?,
                ),
                (
                    "list resourceclaims.resource.k8s.io",
                    may_read(
                        &Api::<ResourceClaim>::all(self.client.clone()),
                        "list resourceclaims.resource.k8s.io",
                    )
                    .await?,
                ),
                (
                    "list resourceclaimtemplates.resource.k8s.io",
                    may_read(
                        &Api::<ResourceClaimTemplate>::all(self.client.clone()),
                        "list resourceclaimtemplates.resource.k8s.io",
                    )
                    .await?,
                ),
            ] {
                if !served {
                    return Err(ControllerError::NotServed { what: what.trim_start_matches("list ") });
                }
            }
            let (class_w, slice_w) = (Writer::<DeviceClass>::default(), Writer::<ResourceSlice>::default());
            let (rc_w, rct_w) =
                (Writer::<ResourceClaim>::default(), Writer::<ResourceClaimTemplate>::default());
            stores.dra = Some(DraStores {
                classes: class_w.as_reader(),
                slices: slice_w.as_reader(),
                claims: rc_w.as_reader(),
                templates: rct_w.as_reader(),
            });
            tasks.0.push(spawn_reflector(
                Api::all(self.client.clone()),
                class_w,
                notify.clone(),
                "DeviceClass",
            ));
            tasks.0.push(spawn_reflector(
                Api::all(self.client.clone()),
                slice_w,
                notify.clone(),
                "ResourceSlice",
            ));
            tasks.0.push(spawn_reflector(
                Api::all(self.client.clone()),
                rc_w,
                notify.clone(),
                "ResourceClaim",
            ));
            tasks.0.push(spawn_reflector(
                Api::all(self.client.clone()),
                rct_w,
                notify.clone(),
                "ResourceClaimTemplate",
            ));
        } else {
            tracing::info!("resource.k8s.io/v1 not served; pods' resource claims are not planned");
        }
        // ProvisioningRequests come with their CRD (Cluster Autoscaler's chart or Kueue's docs
        // install it): absent, the feature is off. Installed later, it is read after a restart.
        let ar = super::provisioning::resource();
        let pr_api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        if may_read(&pr_api, "list provisioningrequests.autoscaling.x-k8s.io").await? {
            if !may_read(&Api::<PodTemplate>::all(self.client.clone()), "list podtemplates").await? {
                return Err(ControllerError::NotServed { what: "podtemplates" });
            }
            let (pr_w, pt_w) = (Writer::<DynamicObject>::new(ar.clone()), Writer::<PodTemplate>::default());
            stores.provisioning =
                Some(ProvisioningStores { requests: pr_w.as_reader(), templates: pt_w.as_reader() });
            tasks.0.push(spawn_reflector_dyn(
                pr_api,
                pr_w,
                notify.clone(),
                "ProvisioningRequest",
                ar,
                |_| {},
            ));
            tasks.0.push(spawn_reflector(Api::all(self.client.clone()), pt_w, notify.clone(), "PodTemplate"));
        } else {
            tracing::info!(
                "ProvisioningRequests (autoscaling.x-k8s.io/v1) not served; capacity requests are off"
            );
        }
        let ready = async {
            stores.nodes.wait_until_ready().await.map_err(|_| ControllerError::NotSynced { kind: "Node" })?;
            stores.pods.wait_until_ready().await.map_err(|_| ControllerError::NotSynced { kind: "Pod" })?;
            stores
                .pdbs
                .wait_until_ready()
                .await
                .map_err(|_| ControllerError::NotSynced { kind: "PodDisruptionBudget" })?;
            for (store_ready, kind) in [
                (stores.claims.wait_until_ready().await, "PersistentVolumeClaim"),
                (stores.volumes.wait_until_ready().await, "PersistentVolume"),
                (stores.classes.wait_until_ready().await, "StorageClass"),
            ] {
                store_ready.map_err(|_| ControllerError::NotSynced { kind })?;
            }
            if let Some(s) = &stores.pod_groups {
                s.wait_until_ready().await.map_err(|_| ControllerError::NotSynced { kind: "PodGroup" })?;
            }
            if let Some(p) = &stores.provisioning {
                for (store_ready, kind) in [
                    (p.requests.wait_until_ready().await, "ProvisioningRequest"),
                    (p.templates.wait_until_ready().await, "PodTemplate"),
                ] {
                    store_ready.map_err(|_| ControllerError::NotSynced { kind })?;
                }
            }
            if let Some(d) = &stores.dra {
                for (store_ready, kind) in [
                    (d.classes.wait_until_ready().await, "DeviceClass"),
                    (d.slices.wait_until_ready().await, "ResourceSlice"),
                    (d.claims.wait_until_ready().await, "ResourceClaim"),
                    (d.templates.wait_until_ready().await, "ResourceClaimTemplate"),
                ] {
                    store_ready.map_err(|_| ControllerError::NotSynced { kind })?;
                }
            }
            Ok::<(), ControllerError>(())
        };
        tokio::select! {
            r = ready => r?,
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
        }
        tracing::info!(identity = %self.options.identity, dry_run = self.options.dry_run, "caches synced");
        self.observer.caches_synced();

        // A dry-run replica acts on nothing, so it does not take part in the election (holding the
        // Lease would stop the acting controller): it plans every pass.
        let claim = self.claim.take().expect("run is called once");
        let mut lead_rx = self.fence.clone();
        let (elector_stop_tx, elector_stop_rx) = watch::channel(false);
        let (elector_task, _never_leading) = if self.options.dry_run {
            (None, Some(claim))
        } else {
            let elector = LeaderElector::new(
                self.client.clone(),
                &self.options.namespace,
                &cfg.lease.name,
                &self.options.identity,
                Duration::from_secs(u64::from(cfg.lease.duration_seconds)),
            );
            let run = elector.run(
                secs(cfg.lease.renew_seconds),
                secs(cfg.lease.renew_deadline_seconds),
                claim,
                elector_stop_rx,
            );
            (Some(tokio::spawn(run)), None)
        };

        let mut state = LoopState {
            batcher: Batcher::new(secs(cfg.batch_idle_seconds), secs(cfg.batch_max_seconds)),
            first_seen: BTreeMap::new(),
            unready_since: BTreeMap::new(),
            cluster: None,
            decide: decide::LoopState::default(),
            gangs_in_flight: Arc::new(Mutex::new(BTreeSet::new())),
            gangs_resumed: false,
            evicted_at: BTreeMap::new(),
            assembly: Default::default(),
            hints: Default::default(),
        };
        let mut was_leading = false;
        let mut last_tick = Instant::now();
        let mut next_pass = Instant::now();
        let mut batch_close: Option<Instant> = None;
        loop {
            let wake = batch_close.map_or(next_pass, |b| b.min(next_pass));
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep_until(wake.into()) => {}
                r = lead_rx.changed() => {
                    if r.is_err() { break; }
                }
                _ = shutdown.wait_for(|s| *s) => break,
            }
            let leader = self.fence.holds();
            if leader != was_leading {
                was_leading = leader;
                self.observer.leadership(leader);
                if leader {
                    next_pass = Instant::now();
                } else {
                    // The next term resumes whatever gang scale-ups are recorded then.
                    state.gangs_resumed = false;
                }
            }
            let tick = Instant::now();
            if self.options.drive_simulated_clock {
                self.providers.advance_simulated(tick - last_tick);
            }
            last_tick = tick;
            let now = Timestamp::now();
            state.batcher.observe(snapshot::pending_pod_ids(&stores.pods.state()), now);
            batch_close = None;
            let run_pass = match state.batcher.state(now) {
                BatchState::Open { closes_at } => {
                    let wait = closes_at.duration_since(now).unsigned_abs();
                    batch_close = Some(tick + wait);
                    false
                }
                BatchState::Ready => true,
                BatchState::Idle => tick >= next_pass,
            };
            if !run_pass || !(self.options.dry_run || leader) {
                if tick >= next_pass {
                    next_pass = tick + secs(cfg.resync_seconds);
                }
                continue;
            }
            state.batcher.close();
            let busy = match self.reconcile_once(&stores, &mut state, now).await {
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
            let interval = secs(cfg.resync_seconds);
            next_pass = Instant::now() + if busy { interval.min(Duration::from_secs(2)) } else { interval };
        }
        drop(tasks);
        elector_stop_tx.send_replace(true);
        if let Some(task) = elector_task {
            let _ = task.await;
        }
        Ok(())
    }

    fn leading(&self) -> bool {
        self.fence.holds()
    }

    /// Name of the ConfigMap that holds the gang scale-ups in progress.
    fn gang_config_map(&self) -> String {
        format!("{}-gangs", self.options.config.lease.name)
    }

    /// One pass; returns whether work is in progress (drains, instances waiting), so the next
    /// pass comes sooner.
    async fn reconcile_once(
        &mut self,
        stores: &Stores,
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<bool, ControllerError> {
        let started = Instant::now();
        let cfg = self.options.config.clone();
        let dry = self.options.dry_run;
        state.cluster.get_or_insert_with(|| (stores.nodes.clone(), stores.pods.clone()));
        let refreshed = self.providers.refresh().await;
        for (account, error) in &refreshed.failures {
            tracing::warn!(
                account,
                error,
                "refreshing the account's node groups failed; its groups are left out of this pass"
            );
        }
        let mut groups = refreshed.groups;
        if self.options.mutant == gate::Mutant::IgnoreMinimum {
            groups.iter_mut().for_each(|g| g.min_size = 0);
        }
        self.observer.groups_refreshed(&groups);
        readiness::track_instances(&mut state.first_seen, &groups, now);
        let pod_groups: Vec<serde_json::Value> = stores
            .pod_groups
            .as_ref()
            .map(|s| s.state().iter().filter_map(|o| serde_json::to_value(o.as_ref()).ok()).collect())
            .unwrap_or_default();
        let converting = Instant::now();
        let mut others = snapshot::storage_objects(
            &stores.claims.state(),
            &stores.volumes.state(),
            &stores.classes.state(),
        );
        if let Some(d) = &stores.dra {
            others.extend(snapshot::dra_objects(
                &d.classes.state(),
                &d.slices.state(),
                &d.claims.state(),
                &d.templates.state(),
            ));
        }
        if let Some(p) = &stores.provisioning {
            others.extend(snapshot::provisioning_objects(&p.requests.state(), &p.templates.state()));
        }
        // Any tenant can create these: one past a bound is left out (a Warning Event on it, a
        // metric), not a reason to stop planning for everyone else.
        let (others, refused) = crate::k8s::refuse_out_of_bounds(others);
        for r in &refused {
            tracing::warn!(object = %r, "object left out of the plan: a value is past gpuscale's limits");
        }
        self.observer.objects_refused(&refused);
        let mut view = snapshot::build(
            &stores.nodes.state(),
            &stores.pods.state(),
            &stores.pdbs.state(),
            &pod_groups,
            others,
            &cfg,
            now,
            &mut state.assembly,
        )?;
        tracing::debug!(
            converted = state.assembly.conversions.counts.converted,
            reused = state.assembly.conversions.counts.reused,
            seconds = converting.elapsed().as_secs_f64(),
            "cluster state converted"
        );
        for w in &view.warnings {
            tracing::debug!("{w}");
        }

        // Which nodes are capacity (starting, Ready, unready), judged as `gpuscale plan` does.
        let lifecycle = cfg.lifecycle_settings(now.as_second(), &self.options.planner.telemetry);
        for v in crate::planner::readiness::judge_nodes(&mut view.snapshot, &groups, &lifecycle) {
            tracing::debug!(node = %v.node, state = ?v.state, why = %v.why, "node not Ready capacity");
        }
        readiness::track_unready(&mut state.unready_since, &mut view.snapshot.nodes, now.as_second());

        // Instances whose nodes never came: remove them, back the group off.
        let stuck = readiness::stuck_instances(
            &groups,
            &view.snapshot.nodes,
            &view.snapshot.workloads,
            &state.first_seen,
            now,
            secs(cfg.registration_timeout_seconds),
        );
        let mut busy =
            !view.drains.is_empty() || groups.iter().any(|g| g.instances.len() as u32 != g.target_size);
        if !dry {
            let mut in_progress = gate::InProgress::of(view.drains.keys(), &view.snapshot.nodes, &groups);
            for s in &stuck {
                if !self.leading() {
                    return Ok(busy);
                }
                let Some(group) = groups.iter().find(|g| g.id == s.group) else { continue };
                if let Err(why) = gate::may_remove_stuck(group, &in_progress, &cfg) {
                    tracing::info!(group = %s.group, instance = %s.instance, reason = %s.reason, refused = %why, "not removing an instance whose node did not come");
                    continue;
                }
                in_progress.add(Some(&s.group));
                self.remove_stuck(s).await;
                busy = true;
            }
        }

        // The snapshot is lent to the planner and taken back: a copy of 50k pods per pass costs
        // more than the conversion of what changed.
        let mut input = PlanInput {
            snapshot: std::mem::take(&mut view.snapshot),
            groups: groups.clone(),
            unavailable: self.providers.unavailable(&groups),
            hints: std::mem::take(&mut state.hints),
        };
        let settings = PlannerSettings {
            now: Some(now.as_second()),
            unready_seconds: cfg.scale_down_unready_seconds,
            ..self.options.planner.clone()
        };
        let planning = Instant::now();
        let plan = planner::plan(&input, &settings);
        view.snapshot = std::mem::take(&mut input.snapshot);
        state.hints = PlacementHints::of(&plan);
        tracing::debug!(seconds = planning.elapsed().as_secs_f64(), hinted = input.hints.len(), "planned");
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
        let (commands, next) = decide_from_marks(
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
        if let Some(p) = &stores.provisioning {
            self.write_request_conditions(&plan, &p.requests, now).await?;
        }
        Ok(busy)
    }

    /// Gives each ProvisioningRequest the conditions this plan decided (after its scale-ups were
    /// asked for), fenced; a request changed since it was read is left to the next pass.
    async fn write_request_conditions(
        &self,
        plan: &Plan,
        requests: &Store<DynamicObject>,
        now: Timestamp,
    ) -> Result<(), ControllerError> {
        if plan.provisioning_requests.is_empty() {
            return Ok(());
        }
        let stored: BTreeMap<String, Arc<DynamicObject>> =
            requests.state().into_iter().map(|r| (super::provisioning::id_of(&r), r)).collect();
        for outcome in &plan.provisioning_requests {
            let Some(r) = stored.get(&outcome.request) else { continue };
            let current = super::provisioning::conditions_of(r);
            let Some(next) =
                super::provisioning::next_conditions(outcome, &current, r.metadata.generation, now)
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

    /// Raises a group's target; a raise for gang members is all-or-nothing, in a background task.
    #[allow(clippy::too_many_arguments)]
    async fn scale_group(
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
                Ok(()) => self.observer.scaled_up(group, from, to, pods),
                Err(e @ ProviderError::NotPermitted { .. }) => {
                    tracing::info!(%group, error = %e, "leadership lost; the scale-up is left to the next leader")
                }
                Err(e) => {
                    self.observer.scale_up_failed(group, &e.to_string());
                    if let Some(b) = provider.group_backoff(group) {
                        self.observer.backoff(group, &format!("{e} (failure {} in a row)", b.failures));
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
    async fn resume_gangs(&self, state: &mut LoopState, now: Timestamp) -> Result<(), ControllerError> {
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
                    Some((nodes, pods)) => gang_may_remove(instance, nodes, pods, &gang_pods),
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

    /// Carries out the decision step's commands through the clouds and the API, fenced before
    /// every write. Returns whether work is in progress (drains, replacements). The replacement
    /// and drain records live on the Node objects (written before the cloud is asked), so a new
    /// leader neither repeats nor forgets them.
    async fn execute(
        &self,
        commands: Vec<Command>,
        view: &mut ClusterView,
        groups: &[NodeGroup],
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<bool, ControllerError> {
        let cfg = &self.options.config;
        for command in commands {
            if !self.leading() {
                return Ok(true);
            }
            match command {
                Command::ScaleGroup { group, from, to, pods, gang } => {
                    self.scale_group(&group, from, to, &pods, gang, state, now).await
                }
                Command::RequestReplacement { node, group, from, target } => {
                    let Some(provider) = self.providers.provider_of(&group) else { continue };
                    if !self.actuator.mark_replacing(&node, &group, target, now).await? {
                        continue;
                    }
                    let marks = drain::ReplaceMarks { group: group.clone(), target, requested_at: now };
                    view.replacing.insert(node.clone(), marks);
                    if !self.leading() {
                        return Ok(true);
                    }
                    match provider.set_target_size(&group, target).await {
                        Ok(()) => self.observer.replacement_requested(&node, &group, from, target),
                        Err(e) => {
                            self.observer.scale_up_failed(&group, &e.to_string());
                            self.actuator.clear_replacing(&node).await?;
                            view.replacing.remove(&node);
                        }
                    }
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
                    let Some(n) = view.snapshot.nodes.iter().find(|n| n.name == node) else { continue };
                    if self.options.mutant == gate::Mutant::SkipDrain {
                        let (pid, group) = (n.provider_id.clone(), gate::member_of(n, groups));
                        if let (Some(pid), Some(g)) = (pid, group) {
                            if let Some(provider) = self.providers.provider_of(&groups[g].id) {
                                let _ = provider.delete_instances(&groups[g].id, &[pid]).await;
                                self.actuator.delete_node(&node).await?;
                                self.observer.node_deleted(&node, &groups[g].id);
                            }
                        }
                        continue;
                    }
                    let in_progress = gate::InProgress::of(view.drains.keys(), &view.snapshot.nodes, groups);
                    if let Err(why) = gate::may_drain(n, groups, &in_progress, cfg) {
                        tracing::info!(%node, %reason, refused = %why, "not draining the node");
                        continue;
                    }
                    if self.actuator.start_drain(&node, &reason, now).await? {
                        self.observer.drain_started(&node, &reason);
                        let marks = drain::DrainMarks {
                            started_at: now,
                            reason,
                            evicted: false,
                            was_cordoned: false,
                        };
                        view.drains.insert(node, marks);
                    }
                }
                Command::Preempt { pod, node, victims, reason } => {
                    if !self.preempt(&pod, &node, &victims, &reason, view, state).await {
                        return Ok(true);
                    }
                }
                Command::AdvanceDrain { node, wanted } => {
                    let Some(marks) = view.drains.get(&node).cloned() else { continue };
                    let pods = view.pods_by_node.get(&node).cloned().unwrap_or_default();
                    let step = drain::step(&marks, wanted, &pods, cfg, now);
                    for (pod, reason) in &step.blocked {
                        self.observer.eviction_blocked(pod, &node, reason);
                    }
                    if !step.evict.is_empty() && !marks.evicted {
                        self.actuator.mark_evicting(&node).await?;
                    }
                    for id in &step.evict {
                        if !self.leading() {
                            return Ok(true);
                        }
                        let grace = eviction_grace(view, &node, id, cfg);
                        self.evict_once(id, &node, grace, state, |e| match e {
                            Eviction::Evicted => tracing::info!(pod = %id, %node, "evicted"),
                            Eviction::Refused(message) => self.observer.eviction_blocked(
                                id,
                                &node,
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
                            self.actuator.abort_drain(&node).await?;
                            // Unneeded for the whole window again before another drain.
                            state.decide.unneeded_since.remove(&node);
                            if marks.evicted {
                                let group = view.snapshot.nodes.iter().find(|n| n.name == node);
                                let group =
                                    group.and_then(|n| group_of(n, groups)).map_or("", |g| &groups[g].id);
                                self.observer.drain_abandoned(&node, group, &reason);
                            }
                        }
                        DrainOutcome::Finish => self.finish(&node, view, groups).await?,
                    }
                }
            }
        }
        Ok(!view.drains.is_empty() || !view.replacing.is_empty() || !state.decide.unneeded_since.is_empty())
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

    /// Deletes a drained node's instance from its group, then the Node.
    async fn finish(
        &self,
        node: &str,
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

/// Whether a gang rollback may remove `instance`: its node never registered, or holds no pod but
/// the gang's (`gang_pods`), DaemonSet and mirror pods.
fn gang_may_remove(
    instance: &str,
    nodes: &Store<Node>,
    pods: &PodStore,
    gang_pods: &BTreeSet<String>,
) -> bool {
    let Some(node) = nodes
        .state()
        .into_iter()
        .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(instance))
    else {
        return true;
    };
    let name = node.metadata.name.as_deref();
    pods.state().iter().all(|r| {
        let Some(w) = r.conversion.pod().map(|p| &p.workload) else { return true };
        w.node_name.as_deref() != name
            || matches!(w.owner, crate::model::OwnerKind::DaemonSet | crate::model::OwnerKind::Node)
            || gang_pods.contains(r.id())
    })
}

/// The grace period pod `id` on `node` is evicted with: its own, capped
/// ([`drain::PodFacts::eviction_grace`]).
fn eviction_grace(view: &ClusterView, node: &str, id: &str, cfg: &ControllerConfig) -> u32 {
    let pods = view.pods_by_node.get(node).map(Vec::as_slice).unwrap_or_default();
    match pods.iter().find(|p| p.id() == id) {
        Some(p) => p.eviction_grace(cfg),
        None => drain::PodFacts::default().eviction_grace(cfg),
    }
}

/// The decision step as the controller runs it: what is under way (replacements, drains) comes
/// from the marks on the Node objects, only the timers from memory, so a restart or a new leader
/// decides as this process would have.
#[allow(clippy::too_many_arguments)]
fn decide_from_marks(
    plan: &Plan,
    timers: &decide::LoopState,
    replacing: &BTreeMap<String, drain::ReplaceMarks>,
    drains: &BTreeMap<String, drain::DrainMarks>,
    observed: Observed<'_>,
    now: Timestamp,
    settings: &DecideSettings,
) -> (Vec<Command>, decide::LoopState) {
    let state = decide::LoopState {
        unneeded_since: timers.unneeded_since.clone(),
        replacing: replacing
            .iter()
            .map(|(n, m)| {
                let r = Replacing {
                    group: m.group.clone(),
                    target: m.target,
                    requested_at: m.requested_at.as_second(),
                };
                (n.clone(), r)
            })
            .collect(),
        draining: drains.keys().cloned().collect(),
    };
    decide(plan, &state, observed, now.as_second(), settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterSnapshot, Instance, InstanceState, NodeState, Resources, Workload};
    use crate::planner::{Replace, ScaleDown};

    /// The replay threads the step's own state; the controller re-reads replacements and drains
    /// from the Node annotations its commands wrote (through `drain::replace_marks_of`, as the
    /// snapshot does). On a scripted sequence of plans and times both must give the same commands.
    #[test]
    fn the_controller_and_the_replay_give_the_same_commands_on_a_scripted_scenario() {
        let (all, _) = crate::sim::autoscale::openb_groups().unwrap();
        let mut groups: Vec<NodeGroup> =
            all.into_iter().filter(|g| g.id.ends_with("/g3") || g.id.ends_with("/g2")).collect();
        let dear = groups.iter().position(|g| g.id.ends_with("/g3")).unwrap();
        let cheap_id = groups[1 - dear].id.clone();
        let mut snapshot = ClusterSnapshot::default();
        for (gi, name) in [(dear, "dear-1"), (dear, "dear-2")] {
            let mut n = crate::planner::cluster::template_node(&groups[gi], name.into(), NodeState::Ready);
            n.provider_id = Some(name.into());
            groups[gi].instances.push(Instance { id: name.into(), state: InstanceState::Running });
            groups[gi].target_size += 1;
            snapshot.nodes.push(n);
        }
        snapshot.workloads.push(Workload {
            id: "default/p".into(),
            requests: Resources::new(1000, 1024),
            node_name: Some("dear-1".into()),
            devices: Some(Default::default()),
            ..Default::default()
        });
        let replace = Replace {
            node: "dear-1".into(),
            group: String::new(),
            replacement_group: cheap_id.clone(),
            pods: vec!["default/p".into()],
            saving_per_hour: 0,
        };
        let remove = ScaleDown {
            node: "dear-2".into(),
            group: String::new(),
            instance: None,
            moves: vec![],
            reason: "empty".into(),
            saving_per_hour: 0,
        };
        let both = Plan {
            replacements: vec![replace.clone()],
            scale_downs: vec![remove.clone()],
            ..Default::default()
        };
        let only_replace = Plan { replacements: vec![replace], ..Default::default() };
        // Unix times with fractions of a second, as the controller's clock gives them.
        let t0 = 1_800_000_000.5_f64;
        let script: Vec<(f64, &Plan)> = vec![
            (0.0, &both),
            (300.0, &only_replace),
            (599.0, &both),
            (600.0, &both),
            (610.0, &both),
            (1199.0, &both),
            (1200.0, &both),
            (1501.0, &both),
            (1502.0, &both),
        ];
        let settings = DecideSettings::default();
        let none = BTreeSet::new();
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &none };
        let at = |dt: f64| Timestamp::from_nanosecond(((t0 + dt) * 1e9) as i128).unwrap();

        let mut replay_state = decide::LoopState::default();
        let mut replay = Vec::new();
        let (mut timers, mut annotations, mut drains) = (
            decide::LoopState::default(),
            BTreeMap::<String, BTreeMap<String, String>>::new(),
            BTreeMap::new(),
        );
        let mut controller = Vec::new();
        for (dt, plan) in script {
            let now = at(dt);
            let (commands, next) = decide(plan, &replay_state, observed, now.as_second(), &settings);
            replay.push(commands);
            replay_state = next;

            let replacing: BTreeMap<String, drain::ReplaceMarks> = annotations
                .iter()
                .filter_map(|(n, a)| Some((n.clone(), drain::replace_marks_of(a)?)))
                .collect();
            let (commands, next) =
                decide_from_marks(plan, &timers, &replacing, &drains, observed, now, &settings);
            timers = next;
            // The marks the controller's writes leave on the Nodes (`execute`, `KubeActuator`).
            for c in &commands {
                match c {
                    Command::RequestReplacement { node, group, target, .. } => {
                        let a = annotations.entry(node.clone()).or_default();
                        a.insert(drain::REPLACE_WITH.into(), group.clone());
                        a.insert(drain::REPLACE_TARGET.into(), target.to_string());
                        a.insert(drain::REPLACE_REQUESTED_AT.into(), now.to_string());
                    }
                    Command::GiveUpReplacement { node, .. } => {
                        annotations.remove(node);
                    }
                    Command::DrainNode { node, reason } => {
                        let marks = drain::DrainMarks {
                            started_at: now,
                            reason: reason.clone(),
                            evicted: false,
                            was_cordoned: false,
                        };
                        drains.insert(node.clone(), marks);
                    }
                    _ => {}
                }
            }
            controller.push(commands);
        }
        assert_eq!(controller, replay);
        // And what they both did: dear-2, out of the plan at 300 s, is timed again from 599 s and
        // drained 600 s later; dear-1's replacement is requested 600 s after 0, re-raised while its
        // group stays below the request, given up more than 900 s after the request (at 1501 s) and
        // requested anew at once, since the plan still replaces the node.
        let kinds: Vec<Vec<String>> = replay
            .iter()
            .map(|cs| {
                cs.iter()
                    .map(|c| match c {
                        Command::ScaleGroup { .. } => "scale".to_string(),
                        Command::DrainNode { node, .. } => format!("drain {node}"),
                        Command::AdvanceDrain { node, .. } => format!("advance {node}"),
                        Command::RequestReplacement { node, target, .. } => {
                            format!("request {node} {target}")
                        }
                        Command::ReraiseReplacement { node, .. } => format!("reraise {node}"),
                        Command::GiveUpReplacement { node, .. } => format!("give up {node}"),
                        Command::Preempt { pod, .. } => format!("preempt for {pod}"),
                    })
                    .collect()
            })
            .collect();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            kinds,
            vec![
                s(&[]),
                s(&[]),
                s(&[]),
                s(&["request dear-1 1"]),
                s(&["reraise dear-1"]),
                s(&["reraise dear-1", "drain dear-2", "advance dear-2"]),
                s(&["reraise dear-1", "advance dear-2"]),
                s(&["give up dear-1", "request dear-1 1", "advance dear-2"]),
                s(&["reraise dear-1", "advance dear-2"]),
            ]
        );
    }
}
