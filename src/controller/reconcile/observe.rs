//! Everything the loop reads: the watches (reflectors into stores), their first sync, and each
//! pass's view of the cluster (groups from the clouds, the snapshot, which nodes are capacity).
//! Nothing here writes to the cluster or the clouds.

use super::{Controller, ControllerError, LoopState};
use crate::controller::config::ControllerConfig;
use crate::controller::pod_store::PodStore;
use crate::controller::snapshot::{self, ClusterView};
use crate::controller::{gate, provisioning, readiness, Observer};
use crate::k8s::SnapshotError;
use crate::model::NodeGroup;
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
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

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

/// Aborts spawned tasks when dropped, so a cancelled controller leaves nothing running.
pub(super) struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The stores the loop reads.
pub(super) struct Stores {
    pub(super) nodes: Store<Node>,
    /// Pods, converted as they arrive.
    pub(super) pods: PodStore,
    pdbs: Store<PodDisruptionBudget>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    pod_groups: Option<Store<DynamicObject>>,
    /// Dynamic Resource Allocation objects, where `resource.k8s.io/v1` is served.
    dra: Option<DraStores>,
    /// ProvisioningRequests and the PodTemplates they name, where their CRD is installed.
    pub(super) provisioning: Option<ProvisioningStores>,
}

/// What Kueue (or anyone) asks capacity for before it creates pods.
pub(super) struct ProvisioningStores {
    pub(super) requests: Store<DynamicObject>,
    templates: Store<PodTemplate>,
}

/// What DRA pods ask (claims, templates) and nodes offer (slices), and the classes both name.
struct DraStores {
    classes: Store<DeviceClass>,
    slices: Store<ResourceSlice>,
    claims: Store<ResourceClaim>,
    templates: Store<ResourceClaimTemplate>,
}

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

/// Starts the watches: what every watch needs to begin, held while they are started.
struct Watches {
    client: Client,
    notify: Arc<Notify>,
    tasks: Tasks,
}

impl Watches {
    /// Whether every `K` in the cluster may be read ([`may_read`]).
    async fn may_read_all<K>(&self, what: &str) -> Result<bool, ControllerError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        may_read(&Api::<K>::all(self.client.clone()), what).await
    }

    /// Follows every `K` in the cluster into `writer`'s store.
    fn reflect<K>(&mut self, writer: Writer<K>, kind: &'static str)
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        self.tasks.0.push(spawn_reflector(Api::all(self.client.clone()), writer, self.notify.clone(), kind));
    }

    /// What the loop cannot work without: refused is an RBAC fault, not served an old server;
    /// both stop the controller with the reason instead of a silent retry loop.
    async fn require_core(&self) -> Result<(), ControllerError> {
        for (served, what) in [
            (self.may_read_all::<Node>("list nodes").await?, "v1 Node"),
            (self.may_read_all::<Pod>("list pods").await?, "v1 Pod"),
            (
                self.may_read_all::<PodDisruptionBudget>("list poddisruptionbudgets").await?,
                "policy/v1 PodDisruptionBudget",
            ),
            (
                self.may_read_all::<PersistentVolumeClaim>("list persistentvolumeclaims").await?,
                "v1 PersistentVolumeClaim",
            ),
            (self.may_read_all::<PersistentVolume>("list persistentvolumes").await?, "v1 PersistentVolume"),
            (
                self.may_read_all::<StorageClass>("list storageclasses").await?,
                "storage.k8s.io/v1 StorageClass",
            ),
        ] {
            if !served {
                return Err(ControllerError::NotServed { what });
            }
        }
        Ok(())
    }

    /// The watches every cluster serves: Nodes, Pods, PodDisruptionBudgets and what pods'
    /// volumes ask of nodes (VolumeBinding, VolumeZone, ReadWriteOncePod).
    async fn core(&mut self, cfg: &ControllerConfig) -> Result<Stores, ControllerError> {
        let node_w = Writer::<Node>::default();
        let (pods, pod_task) = PodStore::spawn(
            Api::all(self.client.clone()),
            cfg.training.checkpoint_annotation.clone(),
            self.notify.clone(),
        );
        self.tasks.0.push(pod_task);
        let pdb_w = Writer::<PodDisruptionBudget>::default();
        let claim_w = Writer::<PersistentVolumeClaim>::default();
        let volume_w = Writer::<PersistentVolume>::default();
        let class_w = Writer::<StorageClass>::default();
        let stores = Stores {
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
        self.require_core().await?;
        self.tasks.0.push(spawn_slim_reflector(
            Api::all(self.client.clone()),
            node_w,
            self.notify.clone(),
            "Node",
            crate::k8s::slim_node,
        ));
        self.reflect(pdb_w, "PodDisruptionBudget");
        self.reflect(claim_w, "PersistentVolumeClaim");
        self.reflect(volume_w, "PersistentVolume");
        self.reflect(class_w, "StorageClass");
        Ok(stores)
    }

    /// An absent CRD turns gang sizes from PodGroups off; a refusal is an error, so gangs are
    /// never silently planned as single pods.
    async fn pod_groups(&mut self) -> Result<Option<Store<DynamicObject>>, ControllerError> {
        let ar = pod_group_resource();
        let pg_api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        if !may_read(&pg_api, "list podgroups.scheduling.x-k8s.io").await? {
            tracing::info!(
                "PodGroups (scheduling.x-k8s.io/v1alpha1) not served; gang sizes come from pod annotations"
            );
            return Ok(None);
        }
        let w = Writer::<DynamicObject>::new(ar.clone());
        let store = w.as_reader();
        self.tasks.0.push(spawn_reflector_dyn(pg_api, w, self.notify.clone(), "PodGroup", ar, |_| {}));
        Ok(Some(store))
    }

    /// Clusters before 1.34 do not serve resource.k8s.io/v1: their pods have no claims to plan.
    /// A refusal is an error, so DRA pods are never silently planned without their claims.
    async fn dra(&mut self) -> Result<Option<DraStores>, ControllerError> {
        if !self.may_read_all::<ResourceSlice>("list resourceslices.resource.k8s.io").await? {
            tracing::info!("resource.k8s.io/v1 not served; pods' resource claims are not planned");
            return Ok(None);
        }
        for (what, served) in [
            (
                "list deviceclasses.resource.k8s.io",
                self.may_read_all::<DeviceClass>("list deviceclasses.resource.k8s.io").await?,
            ),
            (
                "list resourceclaims.resource.k8s.io",
                self.may_read_all::<ResourceClaim>("list resourceclaims.resource.k8s.io").await?,
            ),
            (
                "list resourceclaimtemplates.resource.k8s.io",
                self.may_read_all::<ResourceClaimTemplate>("list resourceclaimtemplates.resource.k8s.io")
                    .await?,
            ),
        ] {
            if !served {
                return Err(ControllerError::NotServed { what: what.trim_start_matches("list ") });
            }
        }
        let (class_w, slice_w) = (Writer::<DeviceClass>::default(), Writer::<ResourceSlice>::default());
        let (rc_w, rct_w) = (Writer::<ResourceClaim>::default(), Writer::<ResourceClaimTemplate>::default());
        let stores = DraStores {
            classes: class_w.as_reader(),
            slices: slice_w.as_reader(),
            claims: rc_w.as_reader(),
            templates: rct_w.as_reader(),
        };
        self.reflect(class_w, "DeviceClass");
        self.reflect(slice_w, "ResourceSlice");
        self.reflect(rc_w, "ResourceClaim");
        self.reflect(rct_w, "ResourceClaimTemplate");
        Ok(Some(stores))
    }

    /// ProvisioningRequests come with their CRD (Cluster Autoscaler's chart or Kueue's docs
    /// install it): absent, the feature is off. Installed later, it is read after a restart.
    async fn provisioning(&mut self) -> Result<Option<ProvisioningStores>, ControllerError> {
        let ar = provisioning::resource();
        let pr_api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        if !may_read(&pr_api, "list provisioningrequests.autoscaling.x-k8s.io").await? {
            tracing::info!(
                "ProvisioningRequests (autoscaling.x-k8s.io/v1) not served; capacity requests are off"
            );
            return Ok(None);
        }
        if !self.may_read_all::<PodTemplate>("list podtemplates").await? {
            return Err(ControllerError::NotServed { what: "podtemplates" });
        }
        let (pr_w, pt_w) = (Writer::<DynamicObject>::new(ar.clone()), Writer::<PodTemplate>::default());
        let stores = ProvisioningStores { requests: pr_w.as_reader(), templates: pt_w.as_reader() };
        self.tasks.0.push(spawn_reflector_dyn(
            pr_api,
            pr_w,
            self.notify.clone(),
            "ProvisioningRequest",
            ar,
            |_| {},
        ));
        self.reflect(pt_w, "PodTemplate");
        Ok(Some(stores))
    }
}

/// Checks that the controller may read what it needs and starts watching it; `notify` hears of
/// every change. Dropping the [`Tasks`] stops the watches.
pub(super) async fn watch(
    client: &Client,
    cfg: &ControllerConfig,
    notify: Arc<Notify>,
) -> Result<(Stores, Tasks), ControllerError> {
    let mut w = Watches { client: client.clone(), notify, tasks: Tasks(Vec::new()) };
    let mut stores = w.core(cfg).await?;
    stores.pod_groups = w.pod_groups().await?;
    stores.dra = w.dra().await?;
    stores.provisioning = w.provisioning().await?;
    Ok((stores, w.tasks))
}

impl Stores {
    /// Waits for every watch's first complete list.
    pub(super) async fn synced(&self) -> Result<(), ControllerError> {
        self.nodes.wait_until_ready().await.map_err(|_| ControllerError::NotSynced { kind: "Node" })?;
        self.pods.wait_until_ready().await.map_err(|_| ControllerError::NotSynced { kind: "Pod" })?;
        self.pdbs
            .wait_until_ready()
            .await
            .map_err(|_| ControllerError::NotSynced { kind: "PodDisruptionBudget" })?;
        for (store_ready, kind) in [
            (self.claims.wait_until_ready().await, "PersistentVolumeClaim"),
            (self.volumes.wait_until_ready().await, "PersistentVolume"),
            (self.classes.wait_until_ready().await, "StorageClass"),
        ] {
            store_ready.map_err(|_| ControllerError::NotSynced { kind })?;
        }
        if let Some(s) = &self.pod_groups {
            s.wait_until_ready().await.map_err(|_| ControllerError::NotSynced { kind: "PodGroup" })?;
        }
        if let Some(p) = &self.provisioning {
            for (store_ready, kind) in [
                (p.requests.wait_until_ready().await, "ProvisioningRequest"),
                (p.templates.wait_until_ready().await, "PodTemplate"),
            ] {
                store_ready.map_err(|_| ControllerError::NotSynced { kind })?;
            }
        }
        if let Some(d) = &self.dra {
            for (store_ready, kind) in [
                (d.classes.wait_until_ready().await, "DeviceClass"),
                (d.slices.wait_until_ready().await, "ResourceSlice"),
                (d.claims.wait_until_ready().await, "ResourceClaim"),
                (d.templates.wait_until_ready().await, "ResourceClaimTemplate"),
            ] {
                store_ready.map_err(|_| ControllerError::NotSynced { kind })?;
            }
        }
        Ok(())
    }

    /// The cluster as the stores hold it now, converted ([`snapshot::build`]).
    fn view(
        &self,
        cfg: &ControllerConfig,
        now: Timestamp,
        assembly: &mut snapshot::AssemblyCache,
        observer: &dyn Observer,
    ) -> Result<ClusterView, SnapshotError> {
        let pod_groups: Vec<serde_json::Value> = self
            .pod_groups
            .as_ref()
            .map(|s| s.state().iter().filter_map(|o| serde_json::to_value(o.as_ref()).ok()).collect())
            .unwrap_or_default();
        let converting = Instant::now();
        let mut others =
            snapshot::storage_objects(&self.claims.state(), &self.volumes.state(), &self.classes.state());
        if let Some(d) = &self.dra {
            others.extend(snapshot::dra_objects(
                &d.classes.state(),
                &d.slices.state(),
                &d.claims.state(),
                &d.templates.state(),
            ));
        }
        if let Some(p) = &self.provisioning {
            others.extend(snapshot::provisioning_objects(&p.requests.state(), &p.templates.state()));
        }
        // Any tenant can create these: one past a bound is left out (a Warning Event on it, a
        // metric), not a reason to stop planning for everyone else.
        let (others, mut refused) = crate::k8s::refuse_out_of_bounds(others);
        let mut pods = self.pods.state();
        if pods.iter().any(|p| p.refused.is_some()) {
            refused.extend(pods.iter().filter_map(|p| p.refused.as_deref().cloned()));
            pods.retain(|p| p.refused.is_none());
        }
        for r in &refused {
            tracing::warn!(object = %r, "object left out of the plan: a value is past gpuscale's limits");
        }
        observer.objects_refused(&refused);
        let view = snapshot::build(
            &self.nodes.state(),
            &pods,
            &self.pdbs.state(),
            &pod_groups,
            others,
            cfg,
            now,
            assembly,
        )?;
        tracing::debug!(
            converted = assembly.conversions.counts.converted,
            reused = assembly.conversions.counts.reused,
            seconds = converting.elapsed().as_secs_f64(),
            "cluster state converted"
        );
        for w in &view.warnings {
            tracing::debug!("{w}");
        }
        Ok(view)
    }
}

/// What one pass sees: the managed groups as the clouds list them and the cluster as the stores
/// hold it, its nodes judged.
pub(super) struct Pass {
    pub(super) groups: Vec<NodeGroup>,
    pub(super) view: ClusterView,
}

impl Controller {
    /// Reads the clouds and the stores into this pass's [`Pass`], tracking instances and unready
    /// nodes in `state` as it goes.
    pub(super) async fn observe(
        &self,
        stores: &Stores,
        state: &mut LoopState,
        now: Timestamp,
    ) -> Result<Pass, ControllerError> {
        let cfg = &self.options.config;
        state.cluster.get_or_insert_with(|| (stores.nodes.clone(), stores.pods.clone()));
        let groups = self.refresh_groups(state, now).await;
        let mut view = stores.view(cfg, now, &mut state.assembly, self.observer.as_ref())?;

        // Which nodes are capacity (starting, Ready, unready), judged as `gpuscale plan` does.
        let lifecycle = cfg.lifecycle_settings(now.as_second(), &self.options.planner.telemetry);
        for v in crate::planner::readiness::judge_nodes(&mut view.snapshot, &groups, &lifecycle) {
            tracing::debug!(node = %v.node, state = ?v.state, why = %v.why, "node not Ready capacity");
        }
        readiness::track_unready(&mut state.unready_since, &mut view.snapshot.nodes, now.as_second());
        Ok(Pass { groups, view })
    }

    /// The managed groups as the clouds list them now; an account that fails is left out of this
    /// pass. Records when each instance was first seen.
    async fn refresh_groups(&self, state: &mut LoopState, now: Timestamp) -> Vec<NodeGroup> {
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
        groups
    }
}
