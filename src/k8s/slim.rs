//! The parts of Nodes and Pods the conversion reads, deserialized straight from JSON text.
//!
//! A `kubectl get -o json` Pod is mostly what the plan never reads: container environment,
//! probes, images and statuses, `managedFields`, node images and system info. Deserializing the
//! `k8s-openapi` types builds all of it (and `managedFields` as generic JSON trees); these types
//! skip it while parsing (serde ignores unknown fields without allocating) and then assemble the
//! `k8s-openapi` objects the conversion takes, with the fields it reads. Field names and nesting
//! are the API's, so decode errors name the same paths as the full types would.

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// `null` and a missing field both give the default, as `k8s-openapi` treats required fields.
pub(crate) fn null_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaIn {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    // Not read by the conversion; the controller's stores key their conversions by version and
    // its drains honour the grace period of a deletion under way.
    resource_version: Option<String>,
    deletion_grace_period_seconds: Option<i64>,
}

impl From<ObjectMeta> for MetaIn {
    fn from(m: ObjectMeta) -> Self {
        MetaIn {
            name: m.name,
            generate_name: m.generate_name,
            namespace: m.namespace,
            uid: m.uid,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            resource_version: m.resource_version,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        }
    }
}

impl From<MetaIn> for ObjectMeta {
    fn from(m: MetaIn) -> Self {
        ObjectMeta {
            name: m.name,
            generate_name: m.generate_name,
            namespace: m.namespace,
            uid: m.uid,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            resource_version: m.resource_version,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            ..ObjectMeta::default()
        }
    }
}

/// A Pod as [`super::convert_pod`] and the storage checks read it.
#[derive(Deserialize)]
pub(super) struct PodIn {
    #[serde(default, deserialize_with = "null_default")]
    metadata: MetaIn,
    spec: Option<PodSpecIn>,
    status: Option<PodStatusIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecIn {
    #[serde(default, deserialize_with = "null_default")]
    containers: Vec<ContainerIn>,
    init_containers: Option<Vec<ContainerIn>>,
    affinity: Option<k8s::Affinity>,
    node_name: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    overhead: Option<BTreeMap<String, Quantity>>,
    priority: Option<i32>,
    resource_claims: Option<Vec<k8s::PodResourceClaim>>,
    resources: Option<k8s::ResourceRequirements>,
    scheduler_name: Option<String>,
    scheduling_gates: Option<Vec<k8s::PodSchedulingGate>>,
    tolerations: Option<Vec<k8s::Toleration>>,
    topology_spread_constraints: Option<Vec<k8s::TopologySpreadConstraint>>,
    volumes: Option<Vec<k8s::Volume>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerIn {
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    ports: Option<Vec<k8s::ContainerPort>>,
    resources: Option<k8s::ResourceRequirements>,
    restart_policy: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStatusIn {
    nominated_node_name: Option<String>,
    phase: Option<String>,
    resource_claim_statuses: Option<Vec<k8s::PodResourceClaimStatus>>,
    /// Not read by the conversion; the controller's training protection counts runtime from it.
    start_time: Option<Time>,
}

impl From<ContainerIn> for k8s::Container {
    fn from(c: ContainerIn) -> Self {
        k8s::Container {
            name: c.name,
            ports: c.ports,
            resources: c.resources,
            restart_policy: c.restart_policy,
            ..k8s::Container::default()
        }
    }
}

impl From<PodIn> for k8s::Pod {
    fn from(p: PodIn) -> Self {
        k8s::Pod {
            metadata: p.metadata.into(),
            spec: p.spec.map(|s| k8s::PodSpec {
                containers: s.containers.into_iter().map(Into::into).collect(),
                init_containers: s.init_containers.map(|c| c.into_iter().map(Into::into).collect()),
                affinity: s.affinity,
                node_name: s.node_name,
                node_selector: s.node_selector,
                overhead: s.overhead,
                priority: s.priority,
                resource_claims: s.resource_claims,
                resources: s.resources,
                scheduler_name: s.scheduler_name,
                scheduling_gates: s.scheduling_gates,
                tolerations: s.tolerations,
                topology_spread_constraints: s.topology_spread_constraints,
                volumes: s.volumes,
                ..k8s::PodSpec::default()
            }),
            status: p.status.map(|s| k8s::PodStatus {
                nominated_node_name: s.nominated_node_name,
                phase: s.phase,
                resource_claim_statuses: s.resource_claim_statuses,
                start_time: s.start_time,
                ..k8s::PodStatus::default()
            }),
        }
    }
}

/// A Node as [`super::convert_node`] reads it.
#[derive(Deserialize)]
pub(super) struct NodeIn {
    #[serde(default, deserialize_with = "null_default")]
    metadata: MetaIn,
    spec: Option<k8s::NodeSpec>,
    status: Option<NodeStatusIn>,
}

#[derive(Deserialize)]
struct NodeStatusIn {
    allocatable: Option<BTreeMap<String, Quantity>>,
    capacity: Option<BTreeMap<String, Quantity>>,
    conditions: Option<Vec<k8s::NodeCondition>>,
}

impl From<NodeIn> for k8s::Node {
    fn from(n: NodeIn) -> Self {
        k8s::Node {
            metadata: n.metadata.into(),
            spec: n.spec,
            status: n.status.map(|s| k8s::NodeStatus {
                allocatable: s.allocatable,
                capacity: s.capacity,
                conditions: s.conditions,
                ..k8s::NodeStatus::default()
            }),
        }
    }
}

/// `pod` with only what the conversion and the controller read: what a reflector store keeps of
/// each of tens of thousands of pods (container environment, probes, images and statuses go).
pub fn slim_pod(pod: k8s::Pod) -> k8s::Pod {
    let c = |c: k8s::Container| ContainerIn {
        name: c.name,
        ports: c.ports,
        resources: c.resources,
        restart_policy: c.restart_policy,
    };
    PodIn {
        metadata: pod.metadata.into(),
        spec: pod.spec.map(|s| PodSpecIn {
            containers: s.containers.into_iter().map(c).collect(),
            init_containers: s.init_containers.map(|v| v.into_iter().map(c).collect()),
            affinity: s.affinity,
            node_name: s.node_name,
            node_selector: s.node_selector,
            overhead: s.overhead,
            priority: s.priority,
            resource_claims: s.resource_claims,
            resources: s.resources,
            scheduler_name: s.scheduler_name,
            scheduling_gates: s.scheduling_gates,
            tolerations: s.tolerations,
            topology_spread_constraints: s.topology_spread_constraints,
            // Only claims place a pod and only local storage blocks a drain; the service-account
            // token volume every pod has (a projection of three sources, k8s-openapi structs with
            // every optional field inline) would be kept for each of tens of thousands of pods.
            volumes: s.volumes.map(|v| v.into_iter().filter(read_by_the_conversion).collect()),
        }),
        status: pod.status.map(|s| PodStatusIn {
            nominated_node_name: s.nominated_node_name,
            phase: s.phase,
            resource_claim_statuses: s.resource_claim_statuses,
            start_time: s.start_time,
        }),
    }
    .into()
}

/// Whether the conversion reads the volume: a PersistentVolumeClaim, an ephemeral one (a claim
/// made from its template), or local storage (`hostPath`, `emptyDir`).
fn read_by_the_conversion(v: &k8s::Volume) -> bool {
    v.persistent_volume_claim.is_some()
        || v.ephemeral.is_some()
        || v.host_path.is_some()
        || v.empty_dir.is_some()
}

/// `node` with only what the conversion and the controller read (node images and system info
/// go).
pub fn slim_node(node: k8s::Node) -> k8s::Node {
    NodeIn {
        metadata: node.metadata.into(),
        spec: node.spec,
        status: node.status.map(|s| NodeStatusIn {
            allocatable: s.allocatable,
            capacity: s.capacity,
            conditions: s.conditions,
        }),
    }
    .into()
}
