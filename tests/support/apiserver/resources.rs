//! The resource table: which API groups, versions and resources the fake serves, and how each
//! one behaves (scope, status subresource, custom resource or built-in, field selectors).

/// One served resource.
#[derive(Debug)]
pub struct ResourceKind {
    /// API group, "" for the core group.
    pub group: &'static str,
    /// API version inside the group.
    pub version: &'static str,
    /// Kind, e.g. `Pod`.
    pub kind: &'static str,
    /// Plural resource name used in URLs, e.g. `pods`.
    pub plural: &'static str,
    /// Singular name (discovery and kind-ish lookups).
    pub singular: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Has a `/status` subresource: main-resource writes keep the stored status, status writes
    /// change only the status.
    pub status_subresource: bool,
    /// A custom resource: list items keep kind/apiVersion (unstructured), strategic merge patch
    /// is refused with 415 like the real server does for CRDs.
    pub custom: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Field labels supported by `fieldSelector` besides metadata.name and metadata.namespace.
    pub field_labels: &'static [&'static str],
}

impl ResourceKind {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `leases.coordination.k8s.io`, as the real server names the resource in
    /// Status messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The list kind, e.g. `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

pub const NAMESPACES: usize = 0;
pub const NODES: usize = 1;
pub const PODS: usize = 2;
pub const CONFIGMAPS: usize = 3;
pub const EVENTS: usize = 4;
pub const SERVICES: usize = 5;
pub const PDBS: usize = 6;
pub const LEASES: usize = 7;
pub const EVENTS_V1: usize = 8;
pub const PODGROUPS: usize = 9;
pub const REPLICASETS: usize = 10;
pub const DEPLOYMENTS: usize = 11;
pub const STATEFULSETS: usize = 12;
pub const REPLICATIONCONTROLLERS: usize = 13;

/// Every served resource; the index is the resource id used across the store.
pub static RESOURCES: &[ResourceKind] = &[
    ResourceKind {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        singular: "namespace",
        namespaced: false,
        status_subresource: true,
        custom: false,
        short_names: &["ns"],
        field_labels: &["status.phase"],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        singular: "node",
        namespaced: false,
        status_subresource: true,
        custom: false,
        short_names: &["no"],
        field_labels: &["spec.unschedulable"],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        singular: "pod",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["po"],
        field_labels: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        singular: "configmap",
        namespaced: true,
        status_subresource: false,
        custom: false,
        short_names: &["cm"],
        field_labels: &[],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        namespaced: true,
        status_subresource: false,
        custom: false,
        short_names: &["ev"],
        field_labels: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        singular: "service",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["svc"],
        field_labels: &[],
    },
    ResourceKind {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["pdb"],
        field_labels: &[],
    },
    ResourceKind {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        singular: "lease",
        namespaced: true,
        status_subresource: false,
        custom: false,
        short_names: &[],
        field_labels: &[],
    },
    ResourceKind {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        namespaced: true,
        status_subresource: false,
        custom: false,
        short_names: &[],
        field_labels: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
    },
    ResourceKind {
        group: "scheduling.x-k8s.io",
        version: "v1alpha1",
        kind: "PodGroup",
        plural: "podgroups",
        singular: "podgroup",
        namespaced: true,
        status_subresource: true,
        custom: true,
        short_names: &["pg", "podgroup"],
        field_labels: &[],
    },
    // Workload controllers: served so PDBs with maxUnavailable or percentages can find the
    // scale of the pods' owners, as the disruption controller does.
    ResourceKind {
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        singular: "replicaset",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["rs"],
        field_labels: &["status.replicas"],
    },
    ResourceKind {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        singular: "deployment",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["deploy"],
        field_labels: &[],
    },
    ResourceKind {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        singular: "statefulset",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["sts"],
        field_labels: &[],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "ReplicationController",
        plural: "replicationcontrollers",
        singular: "replicationcontroller",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["rc"],
        field_labels: &["status.replicas"],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "PersistentVolumeClaim",
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        namespaced: true,
        status_subresource: true,
        custom: false,
        short_names: &["pvc"],
        field_labels: &[],
    },
    ResourceKind {
        group: "",
        version: "v1",
        kind: "PersistentVolume",
        plural: "persistentvolumes",
        singular: "persistentvolume",
        namespaced: false,
        status_subresource: true,
        custom: false,
        short_names: &["pv"],
        field_labels: &[],
    },
    ResourceKind {
        group: "storage.k8s.io",
        version: "v1",
        kind: "StorageClass",
        plural: "storageclasses",
        singular: "storageclass",
        namespaced: false,
        status_subresource: false,
        custom: false,
        short_names: &["sc"],
        field_labels: &[],
    },
];

/// The resource served at `group/version` under `plural`.
pub fn by_path(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES.iter().position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of an object from its `apiVersion` and `kind`.
pub fn by_type(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES.iter().position(|r| r.api_version() == api_version && r.kind == kind)
}

/// A forgiving lookup for test code: `Pod`, `pod`, `pods`, `po`, `v1/Pod`,
/// `policy/v1/PodDisruptionBudget`, `pdb`, `leases.coordination.k8s.io`, `events.k8s.io`
/// (the events.k8s.io/v1 Event; plain `Event`/`events` is core/v1).
pub fn lookup(kindish: &str) -> Option<usize> {
    let k = kindish.trim();
    if let Some((api_version, kind)) = k.rsplit_once('/') {
        return RESOURCES
            .iter()
            .position(|r| r.api_version() == api_version && r.kind.eq_ignore_ascii_case(kind));
    }
    if k.eq_ignore_ascii_case("events.k8s.io") {
        return Some(EVENTS_V1);
    }
    if let Some(i) = RESOURCES.iter().position(|r| r.group_resource() == k && !r.group.is_empty()) {
        return Some(i);
    }
    let lower = k.to_ascii_lowercase();
    RESOURCES.iter().position(|r| {
        r.kind.eq_ignore_ascii_case(&lower)
            || r.plural == lower
            || r.singular == lower
            || r.short_names.contains(&lower.as_str())
    })
}

/// The discovery groups: (group, version) pairs, core excluded, in table order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}
