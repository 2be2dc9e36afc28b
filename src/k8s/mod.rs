//! Reading real Kubernetes cluster snapshots into the model.
//!
//! Input is what users have at hand: `kubectl get nodes,pods,poddisruptionbudgets -A -o json`
//! (a `v1 List`), single objects, multi-document YAML, or a folder of manifests. Objects are
//! parsed generically first and dispatched on `apiVersion`/`kind`, then decoded with the
//! `k8s-openapi` types and converted by pure functions ([`convert`], [`convert_node`],
//! [`convert_pod`]) that unit tests drive without files. Pods bound to nodes are accounted on
//! those nodes (CPU, memory and the GPUs or MIG instances they hold), so the snapshot says what
//! is free, not just what exists.

mod bounds;
mod decode;
mod dra;
mod error;
mod incremental;
mod instance_types;
mod json_list;
mod node;
mod pod;
mod policy;
pub mod provisioning;
pub mod quantity;
mod slim;
mod source;
mod validation;
mod volume;
mod yaml_json;

pub use error::SnapshotError;
pub use incremental::{ConversionCache, ConversionCounts, PodConversion};
pub use instance_types::instance_gpus;
pub use node::{
    convert_node, layout_mig, parse_hami_register, ConvertedNode, HamiDevice, DISRUPTING_TAINT,
    DRAIN_EVICTED, DRAIN_STARTED_AT, DRAIN_WAS_CORDONED, NODE_GROUP_LABELS,
};
pub use pod::{convert_pod, ConvertedPod, EffectiveRequests, HAMI_ALLOCATED};
pub use policy::{convert_pdb, convert_pod_group, POD_GROUP_API_VERSIONS};
pub use slim::{slim_node, slim_pod};
pub use source::{parse_text, read_path, read_path_with, SourcedObject};

use crate::model::{ClusterSnapshot, DeviceAssignment, GpuDemand, Node, GPU_MILLI};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A converted snapshot and what was skipped or guessed on the way.
#[derive(Debug, Clone, Default)]
pub struct LoadedSnapshot {
    /// The cluster.
    pub snapshot: ClusterSnapshot,
    /// Human-readable notes: skipped kinds, unknown GPU products, inconsistent bindings.
    pub warnings: Vec<String>,
}

/// Loads a snapshot from a file (JSON List, single object, multi-document YAML) or a directory
/// of `*.json`/`*.yaml`/`*.yml` files (recursively, in path order).
pub fn load_snapshot(path: &Path) -> Result<LoadedSnapshot, SnapshotError> {
    load_snapshot_with(path, crate::textfile::InputLimits::default())
}

/// [`load_snapshot`] within input limits; `-` reads standard input.
pub fn load_snapshot_with(
    path: &Path,
    limits: crate::textfile::InputLimits,
) -> Result<LoadedSnapshot, SnapshotError> {
    let start = std::time::Instant::now();
    let mut warnings = Vec::new();
    let mut loaded = match source::read_single(path, limits)? {
        Some((name, text)) => load_text(&name, &text)?,
        None => convert(&read_path_with(path, limits, &mut warnings)?)?,
    };
    warnings.append(&mut loaded.warnings);
    loaded.warnings = warnings;
    for w in &loaded.warnings {
        tracing::warn!(target: "gpuscale::k8s", "{w}");
    }
    tracing::info!(
        target: "gpuscale::k8s",
        nodes = loaded.snapshot.nodes.len(),
        workloads = loaded.snapshot.workloads.len(),
        budgets = loaded.snapshot.disruption_budgets.len(),
        seconds = start.elapsed().as_secs_f32(),
        "loaded snapshot from {}",
        path.display()
    );
    Ok(loaded)
}

/// Converts the text of one snapshot file named `name` (its extension says JSON or YAML, else
/// its first character; YAML is transcoded to JSON text first). Documents that are Lists,
/// objects with their `apiVersion` and `kind`, or empty take the fast path; anything else the
/// general one.
pub fn load_text(name: &Path, text: &str) -> Result<LoadedSnapshot, SnapshotError> {
    source::with_json_docs(name, text, |docs| match json_list::convert(&name.display().to_string(), docs) {
        Some(loaded) => loaded,
        None => convert(&source::parse_json_docs(name, docs)?),
    })
}

/// An object left out of the cluster's state because a value in it is past a bound of
/// [`crate::limits`] (the controller skips it with a Warning Event on it and keeps serving every
/// other object; `gpuscale plan` refuses the snapshot with the same message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedObject {
    /// `apiVersion`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace (none for cluster-scoped objects).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// Its uid, for the Event's reference.
    pub uid: Option<String>,
    /// The field past its bound, e.g. `spec.podSets[0].count`.
    pub field: String,
    /// Its value.
    pub value: String,
    /// The bound.
    pub reason: String,
}

impl std::fmt::Display for RefusedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = self.namespace.as_deref().map(|n| format!("{n}/")).unwrap_or_default();
        write!(f, "{} {ns}{}: {}: {:?}: {}", self.kind, self.name, self.field, self.value, self.reason)
    }
}

/// Splits `objects` into those within every bound of [`crate::limits`] and those refused.
pub fn refuse_out_of_bounds(objects: Vec<SourcedObject>) -> (Vec<SourcedObject>, Vec<RefusedObject>) {
    let mut kept = Vec::with_capacity(objects.len());
    let mut refused = Vec::new();
    for o in objects {
        match decode::check_bounds(&o) {
            Ok(()) => kept.push(o),
            Err(SnapshotError::Invalid { field, value, reason, .. }) => {
                let text = |v: &Value| v.as_str().map(str::to_string);
                refused.push(RefusedObject {
                    api_version: text(&o.value["apiVersion"]).unwrap_or_default(),
                    kind: text(&o.value["kind"]).unwrap_or_default(),
                    namespace: text(&o.value["metadata"]["namespace"]),
                    name: text(&o.value["metadata"]["name"]).unwrap_or_default(),
                    uid: text(&o.value["metadata"]["uid"]),
                    field,
                    value,
                    reason,
                });
            }
            Err(_) => kept.push(o),
        }
    }
    (kept, refused)
}

/// A pod waiting for a node that the controller leaves out because it is past a bound of
/// [`crate::limits`] the API server does not enforce itself: its count of labels (the server
/// bounds each label's syntax and the object's size, not how many there are). `gpuscale plan`
/// refuses a snapshot holding it with the same words. A pod bound to a node is never left out:
/// without it its node would look emptier than it is, and a consolidation could drain it.
pub fn refuse_waiting_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Option<RefusedObject> {
    use crate::limits::MAX_LABELS;
    let meta = &pod.metadata;
    let labels = meta.labels.as_ref().map_or(0, |l| l.len());
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.as_deref().is_some_and(|n| !n.is_empty()));
    (labels > MAX_LABELS && !bound).then(|| RefusedObject {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: meta.namespace.clone(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone(),
        field: "metadata.labels".into(),
        value: format!("more than {MAX_LABELS} labels ({labels})"),
        reason: format!("at most {MAX_LABELS} labels per object"),
    })
}

/// `Kind namespace/name` of a raw object, for messages.
fn describe(value: &Value) -> String {
    let kind = value["kind"].as_str().unwrap_or("object");
    let name = value["metadata"]["name"].as_str().unwrap_or("<unnamed>");
    match value["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// The start of a value, for an error message.
fn preview(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Converts parsed objects into a snapshot: Nodes, Pods (Pending and Running), PDBs, and
/// PodGroups (for gang sizes); other kinds are skipped with a warning. Pure: the same objects
/// always give the same snapshot.
pub fn convert(objects: &[SourcedObject]) -> Result<LoadedSnapshot, SnapshotError> {
    convert_decoded(decode::decode_all(objects)?)
}

/// [`convert`] of decoded objects: nodes, then the pods on them.
fn convert_decoded(objects: Vec<(String, decode::Decoded)>) -> Result<LoadedSnapshot, SnapshotError> {
    use decode::Decoded;
    let mut warnings = Vec::new();
    // Sized up front: tens of thousands of pods, grown by doubling, were copied again and again.
    let pod_count = objects.iter().filter(|(_, d)| matches!(d, decode::Decoded::Pod(_))).count();
    let mut nodes = Vec::new();
    let mut pods = Vec::with_capacity(pod_count);
    let mut pdbs = Vec::new();
    let mut storage = volume::Storage::default();
    let mut dra = dra::Dra::default();
    let mut requests = provisioning::Requests::default();
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    for (origin, decoded) in objects {
        match decoded {
            Decoded::Node(c) => nodes.push((origin, *c)),
            Decoded::Pod(p) => pods.push((origin, p)),
            Decoded::Pdb(k) => pdbs.push((origin, k)),
            Decoded::Claim(k) => storage.add_claim(*k),
            Decoded::Volume(k) => storage.add_volume(&origin, *k),
            Decoded::Class(k) => storage.add_class(*k),
            Decoded::DeviceClass(k) => dra.add_class(&origin, *k)?,
            Decoded::ResourceSlice(k) => dra.add_slice(&origin, *k),
            Decoded::ResourceClaim(k) => dra.add_claim(&origin, *k),
            Decoded::ResourceClaimTemplate(k) => dra.add_template(&origin, *k),
            Decoded::ProvisioningRequest(k) => requests.add_request(&origin, *k),
            Decoded::PodTemplate(k) => requests.add_template(*k),
            Decoded::PodGroup => {}
            Decoded::Skipped(kind) => *skipped.entry(kind).or_insert(0usize) += 1,
            Decoded::UnknownVersion(warning) => warnings.push(warning),
        }
    }
    // Kinds the plan does not read (Services, ConfigMaps, a Helm release's objects): one line,
    // not one warning per object.
    if !skipped.is_empty() {
        let kinds: Vec<String> = skipped.iter().map(|(k, n)| format!("{n} {k}")).collect();
        warnings.push(format!("objects of kinds the plan does not read, skipped: {}", kinds.join(", ")));
    }

    let mut snapshot = ClusterSnapshot::default();
    let mut extras: Vec<ConvertedNode> = Vec::with_capacity(nodes.len());
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (origin, converted) in nodes {
        let (c, mut said) = converted?;
        warnings.append(&mut said);
        if by_name.contains_key(&c.node.name) {
            warnings
                .push(format!("{origin}: Node {} appears more than once; keeping the first", c.node.name));
            continue;
        }
        by_name.insert(c.node.name.clone(), extras.len());
        extras.push(c);
    }
    dra.supply(&mut extras, &mut warnings)?;

    let mut seen = std::collections::HashSet::new();
    let mut converted = Vec::with_capacity(pods.len());
    storage.note_users(pods.iter().filter_map(|(_, p)| p.with_claims.as_deref()));
    let mut unchecked_claims = 0;
    for (origin, entry) in pods {
        let (pod, mut said) = entry.converted?;
        warnings.append(&mut said);
        let Some(mut p) = pod else {
            continue;
        };
        if let (None, Some(k)) = (&p.workload.node_name, &entry.with_claims) {
            if storage.is_empty() {
                unchecked_claims += 1;
            } else {
                match storage.needs_of(k, &mut warnings)? {
                    Ok(needs) => p.workload.volumes = needs,
                    Err(reason) => p.workload.volume_blocked = Some(reason),
                }
            }
        }
        if let Some(refs) = &entry.dra {
            match dra.claims_for(&origin, refs, &mut warnings)? {
                Ok(claims) => p.workload.dra_claims = claims,
                Err(reason) => p.workload.volume_blocked = Some(reason),
            }
        }
        if !seen.insert(p.workload.id.clone()) {
            warnings
                .push(format!("{origin}: Pod {} appears more than once; keeping the first", p.workload.id));
            continue;
        }
        converted.push(p);
    }

    let provisioning_requests = requests.convert(&mut dra, &mut warnings)?;
    if unchecked_claims > 0 {
        warnings.push(format!(
            "{unchecked_claims} pending pod(s) use PersistentVolumeClaims, but the snapshot has no claims, volumes or \
             storage classes: their volume placement is not checked (add pv,pvc,storageclass to `kubectl get`)"
        ));
    }
    // Nodes are returned with their capacity only; running pods carry the devices they hold.
    // The allocation below is a scratch copy that lets each pod's device choice see the pods
    // before it.
    let fresh_nodes: Vec<Node> = extras.iter().map(|c| c.node.clone()).collect();
    snapshot.workloads.reserve_exact(converted.len());
    for mut p in converted {
        let bound = p.workload.node_name.as_ref().and_then(|n| by_name.get(n).copied());
        resolve_memory_percentage(&mut p, bound.map(|i| &extras[i].node), &mut warnings);
        match (&p.workload.node_name, bound) {
            (Some(_), Some(i)) => match bound_devices(&extras[i], &p) {
                Ok(devices) => {
                    extras[i].node.allocate_pod(&p.workload, &devices);
                    p.workload.devices = Some(devices);
                }
                Err(reason) => {
                    warnings.push(format!(
                        "Pod {} on Node {}: {reason}; its GPU use is not recorded",
                        p.workload.id, extras[i].node.name
                    ));
                    let node = &mut extras[i].node;
                    node.allocate_pod(&p.workload, &DeviceAssignment::None);
                }
            },
            (Some(n), None) => warnings
                .push(format!("Pod {} is bound to Node {n}, which is not in the snapshot", p.workload.id)),
            (None, _) => {}
        }
        snapshot.workloads.push(p.workload);
    }
    snapshot.nodes = fresh_nodes;
    snapshot.provisioning_requests = provisioning_requests;

    for (origin, k) in &pdbs {
        if let Some(b) = convert_pdb(k, origin, &mut warnings)? {
            snapshot.disruption_budgets.push(b);
        }
    }
    Ok(LoadedSnapshot { snapshot, warnings })
}

/// HAMi `gpumem-percentage` becomes MiB on the node's GPU when the pod is bound. A pending pod
/// has no GPU yet, so its memory share is kept as a compute share (the same fraction of a GPU).
fn resolve_memory_percentage(p: &mut ConvertedPod, node: Option<&Node>, warnings: &mut Vec<String>) {
    let Some(pct) = p.gpumem_percentage else {
        return;
    };
    let GpuDemand::Fraction { milli, memory_mib, .. } = &mut p.workload.gpu else {
        return;
    };
    match node.and_then(|n| n.gpus.first()).map(|g| g.memory_mib) {
        Some(mem) if mem > 0 => *memory_mib = mem * u64::from(pct) / 100,
        _ => {
            *milli = (*milli).max(pct * GPU_MILLI / 100);
            warnings.push(format!(
                "Pod {}: nvidia.com/gpumem-percentage={pct} without a known GPU; modelled as {} milli-GPU",
                p.workload.id, milli
            ));
        }
    }
}

/// Which devices a bound pod holds on its node. The API does not say which physical GPU a pod
/// got (except HAMi's annotation), so the choice is deterministic: the lowest-indexed devices
/// that hold the request, the way the device plugin hands them out.
fn bound_devices(node: &ConvertedNode, pod: &ConvertedPod) -> Result<DeviceAssignment, String> {
    // HAMi records the GPUs it gave a pod; use them when they are all known.
    if let GpuDemand::Fraction { count, milli, memory_mib } = &pod.workload.gpu {
        let mut gpus: Vec<u8> = pod
            .gpu_uuids
            .iter()
            .filter_map(|u| node.gpu_uuids.iter().position(|x| x == u))
            .map(|i| i as u8)
            .collect();
        if !gpus.is_empty() && gpus.len() == *count as usize {
            gpus.sort_unstable();
            return Ok(DeviceAssignment::Fraction { gpus, milli: *milli, memory_mib: *memory_mib });
        }
    }
    crate::scheduler::fit::replay(&node.node, &pod.workload.gpu).map_err(|reason| {
        format!("{} does not fit the node's free GPUs ({})", pod.workload.gpu.describe(), reason.as_str())
    })
}

#[cfg(test)]
mod tests;
