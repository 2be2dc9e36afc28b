//! The controller's writes to the API server: drain marks on Nodes, evictions, preemptors'
//! nominated nodes, Node deletion.
//!
//! Node updates read the Node, change it and write it back with the `resourceVersion` read
//! (HTTP PUT), retrying on 409 Conflict, so concurrent changes by the kubelet or an operator are
//! never overwritten.
//!
//! Every write is fenced: the actuator checks the leader [`Fence`] immediately before issuing it
//! and refuses ([`ApiCause::NotLeading`]) once this replica may no longer act.

use super::drain::{
    NoticeMarks, DISRUPTING_TAINT, DRAIN_DEADLINE, DRAIN_EVICTED, DRAIN_EVICT_AT, DRAIN_NOTICE, DRAIN_REASON,
    DRAIN_STARTED_AT, DRAIN_WAS_CORDONED, REPLACE_REQUESTED_AT, REPLACE_TARGET, REPLACE_WITH,
};
use super::leader::{Fence, NotLeading};
use crate::providers::gang::GangRecord;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use std::collections::BTreeMap;
use thiserror::Error;

/// An API call of the controller failed.
#[derive(Debug, Error)]
#[error("{op} {object}: {cause}")]
pub struct ApiError {
    /// The operation, e.g. `evict`.
    pub op: &'static str,
    /// `Node n1`, `Pod ns/name`.
    pub object: String,
    /// Cause (in the message, so not also a `source()`).
    pub cause: ApiCause,
}

/// Why an API call failed.
#[derive(Debug, Error)]
pub enum ApiCause {
    /// The API server or the connection to it.
    #[error("{0}")]
    Kube(kube::Error),
    /// Not issued: this replica no longer leads.
    #[error("{0}")]
    NotLeading(NotLeading),
}

impl ApiError {
    /// Whether the call was not issued because leadership was lost.
    pub fn is_not_leading(&self) -> bool {
        matches!(self.cause, ApiCause::NotLeading(_))
    }
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Key of a gang's record in the gang ConfigMap (keys allow `[-._a-zA-Z0-9]`).
pub fn gang_key(group: &str) -> String {
    group.chars().map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '_' }).collect()
}

/// How an eviction request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted: the pod is being deleted.
    Evicted,
    /// Refused for now (HTTP 429: a PodDisruptionBudget allows no disruption); retry later.
    Refused(String),
    /// The pod no longer exists.
    Gone,
}

/// Writes to the API server.
#[derive(Clone)]
pub struct KubeActuator {
    client: Client,
    fence: Fence,
    /// A rule broken on purpose by the fault-injection suite (`DeletePods`); `None` otherwise.
    mutant: super::gate::Mutant,
}

const CONFLICT_RETRIES: usize = 5;

impl KubeActuator {
    /// An actuator on `client` whose writes are issued only while `fence` holds.
    pub fn new(client: Client, fence: Fence) -> Self {
        Self { client, fence, mutant: Default::default() }
    }

    /// This actuator with a rule broken on purpose (the fault-injection suite's mutants).
    #[doc(hidden)]
    pub fn with_mutant(self, mutant: super::gate::Mutant) -> Self {
        Self { mutant, ..self }
    }

    /// The leadership check before a write.
    fn fenced(&self, op: &'static str, object: impl FnOnce() -> String) -> Result<(), ApiError> {
        self.fence.check().map_err(|e| ApiError { op, object: object(), cause: ApiCause::NotLeading(e) })
    }

    /// The gang records in ConfigMap `namespace/name` (absent: none). Undecodable entries are
    /// logged and left out.
    pub async fn gang_records(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<BTreeMap<String, GangRecord>, ApiError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let err = |e| ApiError {
            op: "get",
            object: format!("ConfigMap {namespace}/{name}"),
            cause: ApiCause::Kube(e),
        };
        let Some(cm) = api.get_opt(name).await.map_err(err)? else { return Ok(BTreeMap::new()) };
        let mut out = BTreeMap::new();
        for (key, value) in cm.data.unwrap_or_default() {
            match serde_json::from_str::<GangRecord>(&value) {
                Ok(r) => {
                    out.insert(key, r);
                }
                Err(e) => tracing::warn!(%key, error = %e, "ignoring an undecodable gang record"),
            }
        }
        Ok(out)
    }

    /// Writes (`Some`) or removes (`None`) the record under `key` of ConfigMap `namespace/name`,
    /// creating the ConfigMap when absent. Fenced.
    pub async fn put_gang_record(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        record: Option<&GangRecord>,
    ) -> Result<(), ApiError> {
        let object = || format!("ConfigMap {namespace}/{name}");
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let value = record.map(|r| serde_json::to_string(r).expect("a gang record serialises"));
        let err = |op, e| ApiError { op, object: object(), cause: ApiCause::Kube(e) };
        for _ in 0..CONFLICT_RETRIES {
            self.fenced("patch", object)?;
            let patch = serde_json::json!({"data": {key: value}});
            match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                Err(e) if status_code(&e) == Some(404) => {
                    let Some(value) = &value else { return Ok(()) };
                    let cm = ConfigMap {
                        metadata: kube::api::ObjectMeta {
                            name: Some(name.to_string()),
                            namespace: Some(namespace.to_string()),
                            ..Default::default()
                        },
                        data: Some([(key.to_string(), value.clone())].into()),
                        ..Default::default()
                    };
                    self.fenced("create", object)?;
                    match api.create(&PostParams::default(), &cm).await {
                        Ok(_) => return Ok(()),
                        Err(e) if status_code(&e) == Some(409) => continue,
                        Err(e) => return Err(err("create", e)),
                    }
                }
                Err(e) => return Err(err("patch", e)),
            }
        }
        Err(ApiError {
            op: "create",
            object: object(),
            cause: ApiCause::Kube(kube::Error::Service("conflicts on every attempt".into())),
        })
    }

    /// Reads a Node, applies `change`, writes it back; retries on 409. `change` returns false to
    /// skip the write. `Ok(false)` when the node does not exist.
    async fn update_node(
        &self,
        name: &str,
        op: &'static str,
        change: impl Fn(&mut Node) -> bool,
    ) -> Result<bool, ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let err = |cause| ApiError { op, object: format!("Node {name}"), cause: ApiCause::Kube(cause) };
        for attempt in 0.. {
            let Some(mut node) = api.get_opt(name).await.map_err(err)? else { return Ok(false) };
            if !change(&mut node) {
                return Ok(true);
            }
            self.fenced(op, || format!("Node {name}"))?;
            match api.replace(name, &PostParams::default(), &node).await {
                Ok(_) => return Ok(true),
                Err(e) if status_code(&e) == Some(409) && attempt < CONFLICT_RETRIES => continue,
                Err(e) if status_code(&e) == Some(404) => return Ok(false),
                Err(e) => return Err(err(e)),
            }
        }
        unreachable!("the retry loop returns")
    }

    /// Marks a node as draining: cordon, taint `gpuscale.io/disrupting=true:NoSchedule`, and the
    /// start time and reason annotations, and under a notice its marks ([`NoticeMarks`]).
    /// Idempotent.
    pub async fn start_drain(
        &self,
        node: &str,
        reason: &str,
        now: Timestamp,
        notice: Option<&NoticeMarks>,
    ) -> Result<bool, ApiError> {
        self.update_node(node, "start drain of", |n| {
            let ann = n.metadata.annotations.get_or_insert_with(Default::default);
            if ann.contains_key(DRAIN_STARTED_AT) {
                return false;
            }
            let spec = n.spec.get_or_insert_with(Default::default);
            let was_cordoned = spec.unschedulable.unwrap_or(false);
            ann.insert(DRAIN_STARTED_AT.into(), now.to_string());
            ann.insert(DRAIN_REASON.into(), reason.to_string());
            for (k, v) in notice.map(NoticeMarks::annotations).unwrap_or_default() {
                ann.insert(k.into(), v);
            }
            if was_cordoned {
                ann.insert(DRAIN_WAS_CORDONED.into(), "true".into());
            }
            spec.unschedulable = Some(true);
            let taints = spec.taints.get_or_insert_with(Vec::new);
            if !taints.iter().any(|t| t.key == DISRUPTING_TAINT) {
                taints.push(Taint {
                    key: DISRUPTING_TAINT.into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
            true
        })
        .await
    }

    /// Records on the node that evictions begin (before the first one), so a new leader finishes
    /// the drain instead of giving the node back.
    pub async fn mark_evicting(&self, node: &str) -> Result<bool, ApiError> {
        self.update_node(node, "mark evictions on", |n| {
            let ann = n.metadata.annotations.get_or_insert_with(Default::default);
            if ann.get(DRAIN_EVICTED).is_some_and(|v| v == "true") {
                return false;
            }
            ann.insert(DRAIN_EVICTED.into(), "true".into());
            true
        })
        .await
    }

    /// Gives a node back: removes the drain marks and restores its schedulability.
    pub async fn abort_drain(&self, node: &str) -> Result<bool, ApiError> {
        self.update_node(node, "abort drain of", |n| {
            let ann = n.metadata.annotations.get_or_insert_with(Default::default);
            let was_cordoned = ann.get(DRAIN_WAS_CORDONED).is_some_and(|v| v == "true");
            let notice = [DRAIN_NOTICE, DRAIN_DEADLINE, DRAIN_EVICT_AT];
            for k in
                [DRAIN_STARTED_AT, DRAIN_REASON, DRAIN_EVICTED, DRAIN_WAS_CORDONED].into_iter().chain(notice)
            {
                ann.remove(k);
            }
            let spec = n.spec.get_or_insert_with(Default::default);
            spec.unschedulable = if was_cordoned { Some(true) } else { None };
            if let Some(taints) = spec.taints.as_mut() {
                taints.retain(|t| t.key != DISRUPTING_TAINT);
            }
            true
        })
        .await
    }

    /// Records on a node that a cheaper node of `group` (whose target becomes `target`) is
    /// requested to replace it. `Ok(false)` when the node is gone or already has a replacement.
    pub async fn mark_replacing(
        &self,
        node: &str,
        group: &str,
        target: u32,
        now: Timestamp,
    ) -> Result<bool, ApiError> {
        let written = std::sync::atomic::AtomicBool::new(false);
        let exists = self
            .update_node(node, "mark replacement of", |n| {
                let ann = n.metadata.annotations.get_or_insert_with(Default::default);
                if ann.contains_key(REPLACE_WITH) {
                    return false;
                }
                ann.insert(REPLACE_WITH.into(), group.to_string());
                ann.insert(REPLACE_TARGET.into(), target.to_string());
                ann.insert(REPLACE_REQUESTED_AT.into(), now.to_string());
                written.store(true, std::sync::atomic::Ordering::Relaxed);
                true
            })
            .await?;
        Ok(exists && written.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Forgets a replacement that did not come (the node stays).
    pub async fn clear_replacing(&self, node: &str) -> Result<bool, ApiError> {
        self.update_node(node, "clear replacement of", |n| {
            let ann = n.metadata.annotations.get_or_insert_with(Default::default);
            let had = ann.contains_key(REPLACE_WITH);
            for k in [REPLACE_WITH, REPLACE_TARGET, REPLACE_REQUESTED_AT] {
                ann.remove(k);
            }
            had
        })
        .await
    }

    /// Evicts a pod through the Eviction API (which enforces PodDisruptionBudgets), asking for
    /// `grace_seconds` of graceful termination (the pod's own, capped by the caller).
    pub async fn evict(&self, namespace: &str, name: &str, grace_seconds: u32) -> Result<Eviction, ApiError> {
        self.eviction(namespace, name, Some(grace_seconds), false).await
    }

    /// What [`Self::evict`] would answer now, asked as a dry run (`dryRun: All`): the API server
    /// checks the budgets and changes nothing.
    pub async fn evict_dry_run(&self, namespace: &str, name: &str) -> Result<Eviction, ApiError> {
        self.eviction(namespace, name, None, true).await
    }

    async fn eviction(
        &self,
        namespace: &str,
        name: &str,
        grace_seconds: Option<u32>,
        dry_run: bool,
    ) -> Result<Eviction, ApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        self.fenced("evict", || format!("Pod {namespace}/{name}"))?;
        // Posted as its own body: kube 5's `Api::evict` writes the options as `delete_options`,
        // which the API server ignores, so every eviction would keep the pod's full grace period.
        let mut eviction = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        });
        if let Some(g) = grace_seconds {
            eviction["deleteOptions"] = serde_json::json!({"gracePeriodSeconds": g});
        }
        if self.mutant == super::gate::Mutant::DeletePods && !dry_run {
            let params = DeleteParams { grace_period_seconds: grace_seconds, ..Default::default() };
            return match api.delete(name, &params).await {
                Ok(_) => Ok(Eviction::Evicted),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(Eviction::Gone),
                Err(cause) => Err(ApiError {
                    op: "delete",
                    object: format!("Pod {namespace}/{name}"),
                    cause: ApiCause::Kube(cause),
                }),
            };
        }
        let params = PostParams { dry_run, ..Default::default() };
        let posted: Result<serde_json::Value, _> =
            api.create_subresource("eviction", name, &params, &eviction).await;
        match posted {
            Ok(_) => Ok(Eviction::Evicted),
            Err(kube::Error::Api(s)) if s.code == 429 => Ok(Eviction::Refused(s.message.clone())),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Eviction::Gone),
            Err(cause) => Err(ApiError {
                op: "evict",
                object: format!("Pod {namespace}/{name}"),
                cause: ApiCause::Kube(cause),
            }),
        }
    }

    /// Sets a pending pod's `status.nominatedNodeName` to the node a preemption makes room on,
    /// as kube-scheduler does: it tells the scheduler, operators and later passes where its
    /// victims went from. `Ok(false)` when the pod is gone.
    pub async fn nominate(&self, namespace: &str, name: &str, node: &str) -> Result<bool, ApiError> {
        let object = || format!("Pod {namespace}/{name}");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"status": {"nominatedNodeName": node}});
        self.fenced("patch", object)?;
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(true),
            Err(e) if status_code(&e) == Some(404) => Ok(false),
            Err(cause) => Err(ApiError { op: "patch", object: object(), cause: ApiCause::Kube(cause) }),
        }
    }

    /// Deletes a Node object; a missing node is fine.
    pub async fn delete_node(&self, name: &str) -> Result<(), ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.fenced("delete", || format!("Node {name}"))?;
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(cause) => {
                Err(ApiError { op: "delete", object: format!("Node {name}"), cause: ApiCause::Kube(cause) })
            }
        }
    }

    /// Writes a ProvisioningRequest's status conditions, if it is still at `resource_version`
    /// (a merge patch of the status subresource carrying the version read). Returns false when
    /// it changed since (the next pass decides again on what it became) or is gone.
    pub async fn set_request_conditions(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) -> Result<bool, ApiError> {
        let object = || format!("ProvisioningRequest {namespace}/{name}");
        let ar = super::provisioning::resource();
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &ar);
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": conditions},
        });
        self.fenced("patch", object)?;
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => Ok(false),
            Err(cause) => Err(ApiError { op: "patch", object: object(), cause: ApiCause::Kube(cause) }),
        }
    }
}
