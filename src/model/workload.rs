//! A workload (pod) as the scheduler sees it: what it requests and where it may run.

use super::demand::GpuDemand;
use super::node::{Node, TaintEffect};
use super::resources::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Identity of a workload: `namespace/name`.
pub type WorkloadId = String;

/// Operator of a node selector requirement, as in Kubernetes node affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SelectorOperator {
    /// Label value is one of `values`.
    In,
    /// Label value is none of `values` (or the label is absent).
    NotIn,
    /// Label present.
    Exists,
    /// Label absent.
    DoesNotExist,
    /// Label value, as an integer, is greater than the single value.
    Gt,
    /// Label value, as an integer, is less than the single value.
    Lt,
}

/// One requirement of a required node-affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeSelectorRequirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub operator: SelectorOperator,
    /// Values.
    #[serde(default)]
    pub values: Vec<String>,
}

impl NodeSelectorRequirement {
    /// Whether a node's labels satisfy the requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let as_int = |v: &str| v.parse::<i64>().ok();
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
            SelectorOperator::Gt | SelectorOperator::Lt => {
                let (Some(v), Some(bound)) =
                    (value.and_then(|v| as_int(v)), self.values.first().and_then(|b| as_int(b)))
                else {
                    return false;
                };
                if self.operator == SelectorOperator::Gt {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

/// Operator of a toleration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum TolerationOperator {
    /// Key and value must match.
    #[default]
    Equal,
    /// Key must match (or be empty, tolerating everything).
    Exists,
}

/// A pod toleration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Toleration {
    /// Taint key; empty with `Exists` tolerates every taint.
    #[serde(default)]
    pub key: String,
    /// Operator.
    #[serde(default)]
    pub operator: TolerationOperator,
    /// Value for `Equal`.
    #[serde(default)]
    pub value: String,
    /// Effect tolerated; `None` = all effects.
    #[serde(default)]
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    /// Whether this toleration covers a taint.
    pub fn tolerates(&self, taint: &super::node::Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => self.key.is_empty() || self.key == taint.key,
            TolerationOperator::Equal => self.key == taint.key && self.value == taint.value,
        }
    }
}

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: u32 = 30;

/// A workload to place: a pod, pending or running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Workload {
    /// `namespace/name`.
    pub id: WorkloadId,
    /// CPU and memory requests.
    pub requests: Resources,
    /// GPU demand.
    #[serde(default)]
    pub gpu: GpuDemand,
    /// Canonical GPU models the workload accepts; empty = any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Scheduling priority (higher first).
    #[serde(default)]
    pub priority: i32,
    /// Owning tenant (team/queue).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Gang (pod group) the workload belongs to; a gang is placed all-or-nothing.
    #[serde(default)]
    pub gang: Option<String>,
    /// What its PersistentVolumes ask of the node (kube-scheduler's VolumeBinding and
    /// VolumeZone); read when the snapshot has the claims, volumes and classes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeNeed>,
    /// Why no node can take it for its volumes (a missing claim, an unbound claim of an
    /// `Immediate` class, a `ReadWriteOncePod` claim another pod uses) or its DRA claims (a
    /// missing ResourceClaim, template or DeviceClass), in kube-scheduler's words; or why it is
    /// not demand yet (scheduling gates, a ProvisioningRequest it waits for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_blocked: Option<String>,
    /// Its DRA ResourceClaims (`spec.resourceClaims`), resolved from claims and templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dra_claims: Vec<super::dra::DraClaim>,
    /// `spec.schedulerName` when not kube-scheduler's `default-scheduler`: only schedulers whose
    /// placement the planner models are planned for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    /// `spec.nodeSelector`.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Required node-affinity terms: the node must match one term, all requirements of it.
    #[serde(default)]
    pub affinity_terms: Vec<Vec<NodeSelectorRequirement>>,
    /// Tolerations.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// The node it runs on, when already bound.
    #[serde(default)]
    pub node_name: Option<String>,
    /// Pod labels (PDB selectors, gang and tenant conventions).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What created the pod; DaemonSet pods never need a new home, bare pods cannot be recreated.
    #[serde(default)]
    pub owner: OwnerKind,
    /// Why the pod must not be evicted (e.g. `karpenter.sh/do-not-disrupt`,
    /// `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`), if it must not.
    #[serde(default)]
    pub eviction_blocked: Option<String>,
    /// `cluster-autoscaler.kubernetes.io/safe-to-evict: "true"`: evicting it is fine although it
    /// has local storage or runs in `kube-system` without a PodDisruptionBudget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub safe_to_evict: bool,
    /// Its volumes that keep data on the node (`hostPath`, an `emptyDir` not in memory) and that
    /// `cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes` does not list: an eviction
    /// loses that data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_storage: Vec<String>,
    /// Minimum members of its gang that must be placed together (PodGroup `minMember`); `None`
    /// means all members of the gang.
    #[serde(default)]
    pub gang_min_members: Option<u32>,
    /// Node label whose value all gang members must share (e.g. `topology.kubernetes.io/zone`).
    #[serde(default)]
    pub gang_topology_key: Option<String>,
    /// Creation time, seconds since the Unix epoch (waiting time, starvation).
    #[serde(default)]
    pub created_at: Option<i64>,
    /// Devices a running pod holds on its node, when known (annotations, or replayed by the
    /// snapshot loader so that every consumer sees the same assignment).
    #[serde(default)]
    pub devices: Option<super::device::DeviceAssignment>,
    /// The owner opted in to idle-GPU reclaim (`gpuscale.io/reclaim-idle: "true"`): GPUs it holds
    /// but leaves idle count as free when deciding consolidation.
    #[serde(default)]
    pub reclaim_idle: bool,
    /// Requests of every resource other than CPU, memory and the GPU forms [`Self::gpu`] models:
    /// extended resources (`vpc.amazonaws.com/efa`, RDMA, vendor devices), `ephemeral-storage`,
    /// `hugepages-*`. kube-scheduler's NodeResourcesFit checks each against the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, u64>,
    /// Host ports its containers bind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
    /// Required pod affinity terms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_affinity: Vec<PodAffinityTerm>,
    /// `DoNotSchedule` topology spread constraints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread: Vec<SpreadConstraint>,
    /// What the pod prefers without requiring it (preferred node affinity, `ScheduleAnyway`
    /// spread): kube-scheduler's scores, used to break ties between equally good nodes.
    #[serde(default, skip_serializing_if = "Preferences::is_empty")]
    pub preferences: Preferences,
    /// Namespace, labels and required anti-affinity terms ([`Self::pod_anti_affinity`]) as nodes
    /// record them; `None` for workloads no pod affinity can see (traces). Derived by the conversion, not serialised.
    #[serde(skip)]
    pub identity: Option<std::sync::Arc<PodIdentity>>,
    /// The ProvisioningRequest (`namespace/name`) whose capacity the pod uses
    /// (`autoscaling.x-k8s.io/consume-provisioning-request`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumes: Option<String>,
    /// The pod is being deleted (`metadata.deletionTimestamp`): it holds its room until it is
    /// gone, is nobody's preemption victim again, and a preemption onto its node waits for it
    /// (kube-scheduler's rule for nominated nodes with terminating pods).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminating: bool,
    /// `status.nominatedNodeName`: where a preemption made room for the pending pod. While pods
    /// terminate there, nothing more is evicted for it (kube-scheduler's
    /// `PodEligibleToPreemptOthers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominated_node: Option<String>,
}

/// Node labels a PersistentVolume's zone and region are read from (VolumeZone's list).
pub const VOLUME_TOPOLOGY_LABELS: [&str; 4] = [
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region",
];

/// What one of a pod's PersistentVolumeClaims asks of the node it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum VolumeNeed {
    /// The node must match one of `terms` (OR of ANDs): a bound volume's node affinity, or for an
    /// unbound `WaitForFirstConsumer` claim the volumes it could bind and the class's allowed
    /// topologies. No terms: no node can (nothing to bind).
    NodeAffinity {
        /// `namespace/claim`.
        claim: String,
        /// Whether the claim is bound (kube-scheduler words the two conflicts differently).
        bound: bool,
        /// Alternatives, each a set of requirements.
        terms: Vec<Vec<NodeSelectorRequirement>>,
    },
    /// A bound volume's zone or region label: the node's must be one of `values` (a node with no
    /// zone or region label at all passes, as in single-zone clusters).
    Zone {
        /// `namespace/claim`.
        claim: String,
        /// The volume's label key.
        key: String,
        /// Its values (`a__b` lists several zones).
        values: Vec<String>,
    },
}

impl VolumeNeed {
    /// Whether a node satisfies it, as VolumeBinding's and VolumeZone's filters decide.
    pub fn admits(&self, node: &Node) -> bool {
        match self {
            VolumeNeed::NodeAffinity { terms, .. } => {
                terms.iter().any(|term| term.iter().all(|r| r.matches(&node.labels)))
            }
            VolumeNeed::Zone { key, values, .. } => {
                if !VOLUME_TOPOLOGY_LABELS.iter().any(|k| node.labels.contains_key(*k)) {
                    return true;
                }
                let ga = key.replace("failure-domain.beta.kubernetes.io/", "topology.kubernetes.io/");
                node.labels.get(key).or_else(|| node.labels.get(&ga)).is_some_and(|v| values.contains(v))
            }
        }
    }

    /// Whether it names hosts (local volumes pin pods by hostname).
    pub fn names_a_host(&self) -> bool {
        matches!(self, VolumeNeed::NodeAffinity { terms, .. }
            if terms.iter().flatten().any(|r| r.key == super::HOSTNAME_LABEL))
    }
}

/// kube-scheduler's name: the `schedulerName` of pods that do not set one.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// A host port a container binds (`ports[].hostPort`), as kube-scheduler's NodePorts filter
/// compares them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostPort {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `hostIP`; empty or `0.0.0.0` binds every address.
    #[serde(default)]
    pub ip: String,
    /// The port.
    pub port: u16,
}

impl HostPort {
    /// Whether two bindings collide: same protocol and port, and the same address or either on
    /// every address.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || any(&self.ip) || any(&other.ip))
    }
}

/// A required pod (anti-)affinity term: the pods it selects, in which namespaces, over which
/// topology domain (`topologyKey`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodAffinityTerm {
    /// Pods selected (`labelSelector`, with `matchLabelKeys`/`mismatchLabelKeys` already merged
    /// in from the pod's own labels).
    pub selector: LabelSelector,
    /// Namespaces searched; empty = every namespace (an empty `namespaceSelector`).
    pub namespaces: Vec<String>,
    /// Node label whose value is the domain.
    pub topology_key: String,
}

impl PodAffinityTerm {
    /// Whether a pod in `namespace` with `labels` is one the term selects.
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && self.selector.matches(labels)
    }
}

/// A `whenUnsatisfiable: DoNotSchedule` topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpreadConstraint {
    /// `maxSkew`.
    pub max_skew: u32,
    /// Node label whose value is the domain.
    pub topology_key: String,
    /// Pods counted (in the pod's namespace), `matchLabelKeys` merged in.
    pub selector: LabelSelector,
    /// `minDomains` (1 when unset).
    pub min_domains: u32,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's node selector and
    /// required affinity accept are domains.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor`: only nodes whose taints the pod tolerates are domains.
    pub honor_node_taints: bool,
}

/// A pod's soft placement wishes, which kube-scheduler scores but never filters on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Preferences {
    /// Preferred node-affinity terms with their weights (1-100).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_affinity: Vec<(u32, Vec<NodeSelectorRequirement>)>,
    /// `ScheduleAnyway` topology spread constraints (`maxSkew` unused: they only score).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread: Vec<SpreadConstraint>,
}

impl Preferences {
    /// No preference at all.
    pub fn is_empty(&self) -> bool {
        self.node_affinity.is_empty() && self.spread.is_empty()
    }

    /// The summed weight of the preferred node-affinity terms a node matches (NodeAffinity's
    /// score before normalisation).
    pub fn node_affinity_weight(&self, node: &Node) -> u32 {
        self.node_affinity
            .iter()
            .filter(|(_, term)| term.iter().all(|r| r.matches(&node.labels)))
            .map(|(w, _)| *w)
            .sum()
    }
}

/// What other pods' placement needs to know about a pod on a node: its namespace, labels and
/// required anti-affinity (the symmetric check). Shared, so nodes record it cheaply.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct PodIdentity {
    /// Namespace.
    pub namespace: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Its required anti-affinity terms.
    pub anti_affinity: Vec<PodAffinityTerm>,
}

/// The controller that owns a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum OwnerKind {
    /// No owner: a bare pod, lost if evicted.
    #[default]
    None,
    /// A ReplicaSet (Deployment).
    ReplicaSet,
    /// A StatefulSet.
    StatefulSet,
    /// A Job (also JobSet, PyTorchJob workers).
    Job,
    /// A DaemonSet: runs on every node, never moved.
    DaemonSet,
    /// The node itself (static/mirror pod).
    Node,
    /// Another controller kind.
    Other(String),
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct LabelSelector {
    /// Exact label matches.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions, all of which must hold.
    #[serde(default)]
    pub match_expressions: Vec<NodeSelectorRequirement>,
}

impl LabelSelector {
    /// Whether labels satisfy the selector (an empty selector matches everything).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

/// A PodDisruptionBudget, reduced to what decides whether a pod may be evicted now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisruptionBudget {
    /// `namespace/name`.
    pub id: String,
    /// Namespace the selector applies in.
    pub namespace: String,
    /// Pods covered.
    pub selector: LabelSelector,
    /// `status.disruptionsAllowed`: evictions allowed right now.
    pub disruptions_allowed: u32,
}

/// Cluster Autoscaler's drain rules that are a policy choice, its `--skip-nodes-with-local-storage`
/// and `--skip-nodes-with-system-pods` (both on by default); a pod annotated
/// `cluster-autoscaler.kubernetes.io/safe-to-evict: "true"` passes both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainRules {
    /// A pod with local storage keeps its node.
    pub local_storage: bool,
    /// A `kube-system` pod no PodDisruptionBudget covers keeps its node.
    pub system_pods: bool,
}

impl Workload {
    /// Why evicting this running pod (not a DaemonSet or mirror pod) would lose work or break the
    /// cluster, if it would, by the rules Cluster Autoscaler drains by; whether a covering budget
    /// allows the eviction now is the caller's count.
    pub fn drain_blocker(&self, rules: DrainRules, budgets: &[DisruptionBudget]) -> Option<String> {
        let id = &self.id;
        if let Some(reason) = &self.eviction_blocked {
            return Some(format!("pod {id} must not be evicted ({reason})"));
        }
        if self.owner == OwnerKind::None {
            return Some(format!("pod {id} has no controller and would be lost"));
        }
        if self.safe_to_evict {
            return None;
        }
        if rules.system_pods && id.starts_with("kube-system/") && !budgets.iter().any(|b| b.covers(self)) {
            return Some(format!(
                "pod {id} is a kube-system pod no PodDisruptionBudget covers (planner.skipNodesWithSystemPods)"
            ));
        }
        if rules.local_storage && !self.local_storage.is_empty() {
            return Some(format!(
                "pod {id} has local storage that eviction would lose ({}; planner.skipNodesWithLocalStorage)",
                self.local_storage.join(", ")
            ));
        }
        None
    }
}

impl DisruptionBudget {
    /// Whether the budget covers a workload.
    pub fn covers(&self, w: &Workload) -> bool {
        w.id.split('/').next() == Some(self.namespace.as_str()) && self.selector.matches(&w.labels)
    }
}

impl Workload {
    /// Whether the node's labels, taints and GPU model allow the workload, regardless of free
    /// capacity. These are the static checks that can be decided once per node shape.
    pub fn allowed_on(&self, node: &Node) -> bool {
        self.allowed_by_node_affinity(node)
            && self.tolerates_taints_of(node)
            && (self.gpu.is_none()
                || self.gpu_models.is_empty()
                || node.gpu_model.as_ref().is_some_and(|m| self.gpu_models.contains(m)))
    }

    /// What the pod holds on a node besides its devices, all that [`Node::release_pod`] gives
    /// back (so a simulated eviction frees its pod slot, extended resources and host ports too).
    pub fn footprint(&self) -> Workload {
        Workload {
            requests: self.requests,
            extended: self.extended.clone(),
            host_ports: self.host_ports.clone(),
            identity: self.identity.clone(),
            ..Default::default()
        }
    }

    /// Required pod anti-affinity terms (kept in [`Self::identity`], which nodes share).
    pub fn pod_anti_affinity(&self) -> &[PodAffinityTerm] {
        self.identity.as_deref().map_or(&[], |i| &i.anti_affinity)
    }

    /// Whether the node's labels satisfy `spec.nodeSelector` and the required node affinity.
    pub fn allowed_by_node_affinity(&self, node: &Node) -> bool {
        self.node_selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
            && (self.affinity_terms.is_empty()
                || self.affinity_terms.iter().any(|term| term.iter().all(|r| r.matches(&node.labels))))
    }

    /// Whether the workload tolerates every `NoSchedule` and `NoExecute` taint of the node.
    pub fn tolerates_taints_of(&self, node: &Node) -> bool {
        node.taints
            .iter()
            .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
            .all(|t| self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::node::Taint;

    fn node_with(labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        Node {
            name: "n".into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            taints,
            gpu_model: Some("A100-40GB".into()),
            ..Default::default()
        }
    }

    #[test]
    fn taints_need_tolerations() {
        let taint =
            Taint { key: "nvidia.com/gpu".into(), value: "present".into(), effect: TaintEffect::NoSchedule };
        let node = node_with(&[], vec![taint]);
        let mut w = Workload { id: "a/b".into(), ..Default::default() };
        assert!(!w.allowed_on(&node));
        w.tolerations.push(Toleration {
            key: "nvidia.com/gpu".into(),
            operator: TolerationOperator::Exists,
            ..Default::default()
        });
        assert!(w.allowed_on(&node));
        let prefer = Taint { key: "x".into(), value: String::new(), effect: TaintEffect::PreferNoSchedule };
        assert!(Workload::default().allowed_on(&node_with(&[], vec![prefer])));
    }

    #[test]
    fn selectors_and_affinity_terms() {
        let node = node_with(&[("zone", "a"), ("gpus", "8")], vec![]);
        let mut w = Workload::default();
        w.node_selector.insert("zone".into(), "b".into());
        assert!(!w.allowed_on(&node));
        w.node_selector.clear();
        let req = |k: &str, op, v: &[&str]| NodeSelectorRequirement {
            key: k.into(),
            operator: op,
            values: v.iter().map(|s| s.to_string()).collect(),
        };
        w.affinity_terms = vec![
            vec![req("zone", SelectorOperator::In, &["b"])],
            vec![req("gpus", SelectorOperator::Gt, &["4"])],
        ];
        assert!(w.allowed_on(&node), "second term matches");
        w.affinity_terms = vec![vec![req("gpus", SelectorOperator::Lt, &["4"])]];
        assert!(!w.allowed_on(&node));
        w.affinity_terms = vec![vec![
            req("zone", SelectorOperator::NotIn, &["c"]),
            req("spot", SelectorOperator::DoesNotExist, &[]),
        ]];
        assert!(w.allowed_on(&node));
    }

    #[test]
    fn gpu_model_constraint_applies_only_to_gpu_workloads() {
        let node = node_with(&[], vec![]);
        let mut w = Workload { gpu_models: vec!["H100-80GB".into()], ..Default::default() };
        assert!(w.allowed_on(&node), "CPU-only workload ignores the GPU model list");
        w.gpu = GpuDemand::Whole { count: 1 };
        assert!(!w.allowed_on(&node));
        w.gpu_models.push("A100-40GB".into());
        assert!(w.allowed_on(&node));
    }
}
