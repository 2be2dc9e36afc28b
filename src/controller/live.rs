//! One read of the live cluster, for `gpuscale plan` without a snapshot: paged lists of exactly
//! what the controller's reflectors watch, turned into the loop's view by the same
//! [`snapshot::build`], so the dry run plans what `gpuscale run` would plan.

use super::config::ControllerConfig;
use super::pod_store::PodRecord;
use super::reconcile::pod_group_resource;
use super::snapshot::{self, ClusterView};
use crate::k8s::SnapshotError;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, PodTemplate};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use std::sync::Arc;

/// Objects per list page: kubectl's default `--chunk-size`, so a 60,000-pod list is many small
/// answers instead of one the API server has to hold in memory at once.
const PAGE: u32 = 500;

/// Why the live cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// A list failed (refused, not served, unreachable).
    #[error("list {what}: {source}")]
    List {
        /// The resource, e.g. `nodes`.
        what: &'static str,
        /// The client's error.
        source: kube::Error,
    },
    /// The objects could not be converted.
    #[error("converting the cluster state: {0}")]
    Snapshot(#[from] SnapshotError),
}

/// Every object of `api`, page by page (the pages of one list are one consistent read: the
/// continue token pins the first page's resourceVersion).
async fn list_all<K>(api: &Api<K>, what: &'static str) -> Result<Vec<Arc<K>>, LiveError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(|source| LiveError::List { what, source })?;
        out.extend(page.items.into_iter().map(Arc::new));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// Reads the cluster through `client` and converts it as the controller does at `now`. PodGroups
/// are read when their CRD is served (absent, gang sizes come from pod annotations, as in the
/// controller), DRA objects when `resource.k8s.io/v1` is.
pub async fn read(
    client: &Client,
    config: &ControllerConfig,
    now: Timestamp,
) -> Result<ClusterView, LiveError> {
    let nodes = list_all(&Api::<Node>::all(client.clone()), "nodes").await?;
    let pods = list_all(&Api::<Pod>::all(client.clone()), "pods").await?;
    let pdbs = list_all(&Api::<PodDisruptionBudget>::all(client.clone()), "poddisruptionbudgets").await?;
    let claims =
        list_all(&Api::<PersistentVolumeClaim>::all(client.clone()), "persistentvolumeclaims").await?;
    let volumes = list_all(&Api::<PersistentVolume>::all(client.clone()), "persistentvolumes").await?;
    let classes = list_all(&Api::<StorageClass>::all(client.clone()), "storageclasses").await?;
    let ar = pod_group_resource();
    let pg_api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let pod_groups: Vec<serde_json::Value> = match list_all(&pg_api, "podgroups.scheduling.x-k8s.io").await {
        Ok(groups) => groups.iter().filter_map(|g| serde_json::to_value(g.as_ref()).ok()).collect(),
        Err(LiveError::List { source: kube::Error::Api(e), .. }) if e.code == 404 => {
            tracing::info!(
                "PodGroups (scheduling.x-k8s.io/v1alpha1) not served; gang sizes come from pod annotations"
            );
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    let mut storage = snapshot::storage_objects(&claims, &volumes, &classes);
    // Dynamic Resource Allocation, where served (Kubernetes 1.34 and later).
    let slices = Api::<ResourceSlice>::all(client.clone());
    match list_all(&slices, "resourceslices.resource.k8s.io").await {
        Ok(slices) => {
            let device_classes =
                list_all(&Api::<DeviceClass>::all(client.clone()), "deviceclasses.resource.k8s.io").await?;
            let claims =
                list_all(&Api::<ResourceClaim>::all(client.clone()), "resourceclaims.resource.k8s.io")
                    .await?;
            let templates = list_all(
                &Api::<ResourceClaimTemplate>::all(client.clone()),
                "resourceclaimtemplates.resource.k8s.io",
            )
            .await?;
            storage.extend(snapshot::dra_objects(&device_classes, &slices, &claims, &templates));
        }
        Err(LiveError::List { source: kube::Error::Api(e), .. }) if e.code == 404 => {
            tracing::info!("resource.k8s.io/v1 not served; pods' resource claims are not planned");
        }
        Err(e) => return Err(e),
    }
    // ProvisioningRequests, where their CRD is installed.
    let ar = super::provisioning::resource();
    let pr_api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    match list_all(&pr_api, "provisioningrequests.autoscaling.x-k8s.io").await {
        Ok(requests) => {
            let templates = list_all(&Api::<PodTemplate>::all(client.clone()), "podtemplates").await?;
            storage.extend(snapshot::provisioning_objects(&requests, &templates));
        }
        Err(LiveError::List { source: kube::Error::Api(e), .. }) if e.code == 404 => {
            tracing::info!(
                "ProvisioningRequests (autoscaling.x-k8s.io/v1) not served; capacity requests are off"
            );
        }
        Err(e) => return Err(e),
    }
    let checkpoint = &config.training.checkpoint_annotation;
    let pods: Vec<Arc<PodRecord>> =
        pods.into_iter().map(|p| Arc::new(PodRecord::new(Arc::unwrap_or_clone(p), checkpoint))).collect();
    let mut cache = snapshot::AssemblyCache::default();
    Ok(snapshot::build(&nodes, &pods, &pdbs, &pod_groups, storage, config, now, &mut cache)?)
}
