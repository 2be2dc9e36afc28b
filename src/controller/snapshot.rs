//! From the reflector stores to the planner's [`ClusterSnapshot`], through the same conversion
//! `gpuscale plan` uses on `kubectl` output ([`crate::k8s::convert`]).
//!
//! A node whose drain has not evicted anything yet is shown to the planner as it was before the
//! drain by the conversion itself (so `gpuscale plan` shows it the same way). One adjustment is
//! the controller's own: running training pods under their protection are marked not evictable so
//! the planner does not pick their nodes.

use super::config::ControllerConfig;
use super::drain::{self, DrainMarks, PodFacts, ReplaceMarks};
use super::pod_store::PodRecord;
use crate::k8s::{ConversionCache, SnapshotError, SourcedObject};
use crate::model::ClusterSnapshot;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, PodTemplate};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use rayon::slice::ParallelSliceMut;
use rustc_hash::FxHashSet;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The cluster as the loop sees it.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// The planner's snapshot.
    pub snapshot: ClusterSnapshot,
    /// Conversion notes.
    pub warnings: Vec<String>,
    /// Nodes being drained, with their marks.
    pub drains: BTreeMap<String, DrainMarks>,
    /// Consolidation replacements in progress, by the name of the node being replaced.
    pub replacing: BTreeMap<String, ReplaceMarks>,
    /// What drains need about each pod, by node name.
    pub pods_by_node: BTreeMap<String, Vec<PodFacts>>,
}

/// What one assembly keeps for the next, so that a loop redoes what changed rather than the
/// cluster: each Node's conversion, and the pods in the snapshot's order.
#[derive(Default)]
pub struct AssemblyCache {
    /// Each Node's conversion, kept until the node changes.
    pub conversions: ConversionCache,
    /// The last assembly's pods in identity order. The records themselves are kept, not only
    /// their addresses, which a new record could otherwise take over.
    sorted: Vec<Arc<PodRecord>>,
}

impl AssemblyCache {
    /// Puts `pods` (in the store's hash order) in identity order into `sorted`. A record the store
    /// still holds is the same version of the pod (a change replaces the record), so it keeps its
    /// place; only records new since the last assembly are sorted and merged in. Sorting all
    /// 50,000 by their names was a sixth of an assembly, mostly cache misses.
    fn order(&mut self, pods: &[Arc<PodRecord>]) {
        let by_identity = |a: &Arc<PodRecord>, b: &Arc<PodRecord>| a.identity().cmp(&b.identity());
        let known: FxHashSet<*const PodRecord> = self.sorted.iter().map(Arc::as_ptr).collect();
        let mut fresh: Vec<Arc<PodRecord>> =
            pods.iter().filter(|p| !known.contains(&Arc::as_ptr(p))).cloned().collect();
        if fresh.len() > pods.len() / 4 {
            // The first assembly, or most of the cluster changed: one sort of all.
            self.sorted = pods.to_vec();
            // Tens of thousands of records scattered in memory: the sort is mostly cache misses,
            // and the second core halves it.
            self.sorted.par_sort_unstable_by(by_identity);
            return;
        }
        let present: FxHashSet<*const PodRecord> = pods.iter().map(Arc::as_ptr).collect();
        let mut kept = std::mem::take(&mut self.sorted);
        kept.retain(|p| present.contains(&Arc::as_ptr(p)));
        fresh.sort_unstable_by(by_identity);
        // Where each new record goes among the kept ones, then both moved into place.
        let places: Vec<usize> =
            fresh.iter().map(|f| kept.partition_point(|p| by_identity(p, f).is_lt())).collect();
        self.sorted.reserve(kept.len() + fresh.len());
        let mut kept = kept.into_iter();
        let mut taken = 0;
        for (f, at) in fresh.into_iter().zip(places) {
            self.sorted.extend(kept.by_ref().take(at - taken));
            taken = at;
            self.sorted.push(f);
        }
        self.sorted.extend(kept);
        debug_assert!(self.sorted.is_sorted_by(|a, b| by_identity(a, b).is_le()), "pods in identity order");
    }
}

/// Pods waiting for a node: no `spec.nodeName`, not finished, not being deleted.
pub fn pending_pod_ids(pods: &[impl AsRef<PodRecord>]) -> impl Iterator<Item = &str> {
    pods.iter().map(AsRef::as_ref).filter(|p| p.waiting).map(PodRecord::id)
}

fn to_value<T: serde::Serialize>(kind: &str, api_version: &str, obj: &T) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version.into()));
        m.insert("kind".into(), Value::String(kind.into()));
    }
    v
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    }
}

/// Stored objects of one kind as the conversion reads them, in identity order.
fn sourced<K: kube::Resource<DynamicType = ()> + serde::Serialize>(
    objects: &[impl AsRef<K>],
    out: &mut Vec<SourcedObject>,
) {
    let mut sorted: Vec<&K> = objects.iter().map(AsRef::as_ref).collect();
    sorted.sort_by(|a, b| (&a.meta().namespace, &a.meta().name).cmp(&(&b.meta().namespace, &b.meta().name)));
    let (kind, api_version) = (K::kind(&()), K::api_version(&()));
    for o in sorted {
        out.push(SourcedObject::new(
            format!("{kind} {}", name_of(o.meta())),
            to_value(&kind, &api_version, o),
        ));
    }
}

/// The stored PersistentVolumeClaims, PersistentVolumes and StorageClasses as the conversion
/// reads them (what pods' volumes ask of nodes), in identity order.
pub fn storage_objects(
    claims: &[impl AsRef<PersistentVolumeClaim>],
    volumes: &[impl AsRef<PersistentVolume>],
    classes: &[impl AsRef<StorageClass>],
) -> Vec<SourcedObject> {
    let mut out = Vec::new();
    sourced::<PersistentVolumeClaim>(claims, &mut out);
    sourced::<PersistentVolume>(volumes, &mut out);
    sourced::<StorageClass>(classes, &mut out);
    out
}

/// The stored Dynamic Resource Allocation objects as the conversion reads them (what nodes
/// offer through ResourceSlices, what pods' claims ask), in identity order.
pub fn dra_objects(
    classes: &[impl AsRef<DeviceClass>],
    slices: &[impl AsRef<ResourceSlice>],
    claims: &[impl AsRef<ResourceClaim>],
    templates: &[impl AsRef<ResourceClaimTemplate>],
) -> Vec<SourcedObject> {
    let mut out = Vec::new();
    sourced::<DeviceClass>(classes, &mut out);
    sourced::<ResourceSlice>(slices, &mut out);
    sourced::<ResourceClaim>(claims, &mut out);
    sourced::<ResourceClaimTemplate>(templates, &mut out);
    out
}

/// The stored ProvisioningRequests and PodTemplates as the conversion reads them, in identity
/// order.
pub fn provisioning_objects(
    requests: &[impl AsRef<kube::api::DynamicObject>],
    templates: &[impl AsRef<PodTemplate>],
) -> Vec<SourcedObject> {
    let mut out = super::provisioning::sourced(requests);
    sourced::<PodTemplate>(templates, &mut out);
    out
}

/// Builds the view from the stored objects; pods come converted already ([`PodRecord`]),
/// `pod_groups` are PodGroup objects as JSON, `storage` what [`storage_objects`] and
/// [`dra_objects`] make. `cache` keeps each Node's conversion and the pods' order between calls,
/// so a loop converts and sorts only what changed.
#[allow(clippy::too_many_arguments)]
pub fn build(
    nodes: &[impl AsRef<Node>],
    pods: &[Arc<PodRecord>],
    pdbs: &[impl AsRef<PodDisruptionBudget>],
    pod_groups: &[Value],
    storage: Vec<SourcedObject>,
    config: &ControllerConfig,
    now: Timestamp,
    cache: &mut AssemblyCache,
) -> Result<ClusterView, SnapshotError> {
    let mut view = ClusterView::default();
    // Reflector stores hand objects out in hash order; sorted by identity, the same cluster gives
    // the same snapshot and so the same plan (a new leader continues what the old one chose).
    let by_identity =
        |a: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
         b: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid))
        };
    let mut nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
    nodes.sort_by(|a, b| by_identity(&&a.metadata, &&b.metadata));
    cache.order(pods);
    let pods: Vec<&PodRecord> = cache.sorted.iter().map(AsRef::as_ref).collect();
    let mut pdbs: Vec<&PodDisruptionBudget> = pdbs.iter().map(AsRef::as_ref).collect();
    pdbs.sort_by(|a, b| by_identity(&&a.metadata, &&b.metadata));
    let no_annotations = BTreeMap::new();
    for n in nodes.iter().copied() {
        let annotations = n.metadata.annotations.as_ref().unwrap_or(&no_annotations);
        let name = || n.metadata.name.clone().unwrap_or_default();
        if let Some(marks) = drain::replace_marks_of(annotations) {
            view.replacing.insert(name(), marks);
        }
        // The conversion shows a node whose drain has not evicted anything as it was before
        // (crate::k8s::convert_node); the marks say what the drain has done.
        let taints = n.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
        if let Some(marks) = drain::marks_of(annotations, taints.iter().map(|t| t.key.as_str()), now) {
            view.drains.insert(name(), marks);
        }
    }
    let pod_groups: Vec<Value> = pod_groups
        .iter()
        .map(|g| {
            let mut value = g.clone();
            if let Some(m) = value.as_object_mut() {
                m.entry("apiVersion").or_insert_with(|| Value::String("scheduling.x-k8s.io/v1alpha1".into()));
                m.entry("kind").or_insert_with(|| Value::String("PodGroup".into()));
            }
            value
        })
        .collect();
    let conversions: Vec<_> = pods.iter().map(|p| &p.conversion).collect();
    let loaded = cache.conversions.convert(&nodes, &conversions, &pdbs, &pod_groups, &storage)?;
    view.snapshot = loaded.snapshot;
    view.warnings = loaded.warnings;

    // The snapshot's workloads are the pods that converted, in the pods' order: walked side by
    // side, each pod meets its workload, if it has one.
    let mut protected = Vec::new();
    let mut next = 0;
    for p in &pods {
        let workloads = &view.snapshot.workloads;
        if workloads.get(next).is_none_or(|w| w.id != p.id()) {
            continue;
        }
        let (wi, w) = (next, &workloads[next]);
        next += 1;
        let Some(node) = &w.node_name else { continue };
        // Every node's pods, not only those of nodes draining now: a drain this pass starts
        // advances in the same pass.
        let facts = p.facts(w);
        if w.eviction_blocked.is_none() && facts.is_training() {
            if let Some(reason) = drain::protection(&facts, config, now) {
                protected.push((wi, reason));
            }
        }
        view.pods_by_node.entry(node.clone()).or_default().push(facts);
    }
    debug_assert_eq!(next, view.snapshot.workloads.len(), "every workload is one of the pods");
    for (wi, reason) in protected {
        view.snapshot.workloads[wi].eviction_blocked = Some(reason);
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::drain::DISRUPTING_TAINT;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;
    use std::sync::Arc;

    fn node(name: &str, extra: Value) -> Node {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"gpuscale.io/node-group": "gpu"}},
            "spec": {"providerID": format!("sim:///{name}")},
            "status": {
                "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn pod(name: &str, node: Option<&str>, extra: Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ml",
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        });
        if let Some(n) = node {
            v["spec"]["nodeName"] = json!(n);
        }
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn record(p: Pod) -> Arc<PodRecord> {
        Arc::new(PodRecord::new(p, &ControllerConfig::default().training.checkpoint_annotation))
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn converts_stores_and_presents_unstarted_drains_as_before() {
        let draining = node(
            "n1",
            json!({
                "metadata": {"annotations": {drain::DRAIN_STARTED_AT: t(0).to_string(), drain::DRAIN_REASON: "empty"}},
                "spec": {"unschedulable": true, "taints": [{"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"}]}
            }),
        );
        let evicting = node(
            "n2",
            json!({
                "metadata": {"annotations": {drain::DRAIN_STARTED_AT: t(0).to_string(), drain::DRAIN_EVICTED: "true"}},
                "spec": {"unschedulable": true, "taints": [{"key": DISRUPTING_TAINT, "value": "true", "effect": "NoSchedule"}]}
            }),
        );
        let pods = vec![
            record(pod("a", None, json!({}))),
            record(pod("b", Some("n2"), json!({"status": {"startTime": t(-10).to_string()}}))),
        ];
        let nodes = vec![Arc::new(draining), Arc::new(evicting), Arc::new(node("n3", json!({})))];
        let pdbs: Vec<Arc<PodDisruptionBudget>> = vec![];
        let view = build(
            &nodes,
            &pods,
            &pdbs,
            &[],
            Vec::new(),
            &ControllerConfig::default(),
            t(10),
            &mut Default::default(),
        )
        .unwrap();
        assert_eq!(view.snapshot.nodes.len(), 3);
        let n1 = view.snapshot.nodes.iter().find(|n| n.name == "n1").unwrap();
        assert!(!n1.unschedulable && n1.taints.is_empty(), "{n1:?}");
        let n2 = view.snapshot.nodes.iter().find(|n| n.name == "n2").unwrap();
        assert!(n2.unschedulable && n2.taints.len() == 1);
        assert_eq!(view.drains.keys().collect::<Vec<_>>(), vec!["n1", "n2"]);
        assert!(view.drains["n2"].evicted && !view.drains["n1"].evicted);
        assert_eq!(pending_pod_ids(&pods).collect::<Vec<_>>(), vec!["ml/a"]);
        // The running GPU Job pod has run 20s: protected as a training pod, for planner and drain.
        let b = view.snapshot.workloads.iter().find(|w| w.id == "ml/b").unwrap();
        assert!(b.eviction_blocked.as_deref().unwrap().contains("minimum runtime"), "{b:?}");
        let facts = &view.pods_by_node["n2"][0];
        assert!(facts.is_training() && facts.started_at == Some(t(-10)));
    }

    #[test]
    fn the_same_objects_in_any_store_order_give_the_same_snapshot_and_plan() {
        let nodes: Vec<Arc<Node>> = (0..6).map(|i| Arc::new(node(&format!("n{i}"), json!({})))).collect();
        let pods: Vec<Arc<PodRecord>> = (0..6)
            .map(|i| {
                record(pod(&format!("p{i}"), (i % 2 == 0).then(|| format!("n{i}")).as_deref(), json!({})))
            })
            .collect();
        let pdbs: Vec<Arc<PodDisruptionBudget>> = vec![];
        let config = ControllerConfig::default();
        let forward =
            build(&nodes, &pods, &pdbs, &[], Vec::new(), &config, t(10), &mut Default::default()).unwrap();
        let (mut rn, mut rp) = (nodes.clone(), pods.clone());
        rn.reverse();
        rp.rotate_left(2);
        let shuffled =
            build(&rn, &rp, &pdbs, &[], Vec::new(), &config, t(10), &mut Default::default()).unwrap();
        let names = |v: &ClusterView| v.snapshot.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        let ids = |v: &ClusterView| v.snapshot.workloads.iter().map(|w| w.id.clone()).collect::<Vec<_>>();
        assert_eq!(names(&forward), names(&shuffled));
        assert_eq!(ids(&forward), ids(&shuffled));
        assert_eq!(names(&forward), vec!["n0", "n1", "n2", "n3", "n4", "n5"]);
    }

    /// The order kept between assemblies is the order a fresh sort gives, whatever came, went or
    /// changed in between (a changed pod is a new record of the same name).
    #[test]
    fn the_kept_order_is_the_sorted_order_after_pods_come_go_and_change() {
        let ids = |records: &[Arc<PodRecord>]| records.iter().map(|p| p.id().to_string()).collect::<Vec<_>>();
        let sorted = |records: &[Arc<PodRecord>]| {
            let mut all = records.to_vec();
            all.sort_by(|a, b| a.identity().cmp(&b.identity()));
            ids(&all)
        };
        let mut store: Vec<Arc<PodRecord>> =
            (0..40).rev().map(|i| record(pod(&format!("p{:02}", i * 5), None, json!({})))).collect();
        let mut cache = AssemblyCache::default();
        cache.order(&store);
        assert_eq!(ids(&cache.sorted), sorted(&store));
        for round in 0..6usize {
            // Two gone, one changed, three new (before, between and after the others).
            store.remove(round * 3 % store.len());
            store.remove(round * 7 % store.len());
            let changed = round * 5 % store.len();
            let name = store[changed].name().to_string();
            let new_record = record(pod(&name, Some("n1"), json!({})));
            store[changed] = new_record.clone();
            store.push(record(pod(&format!("a{round}"), None, json!({}))));
            store.push(record(pod(&format!("p{:02}x", round * 11), None, json!({}))));
            store.push(record(pod(&format!("z{round}"), None, json!({}))));
            store.rotate_left(round);
            // Four new records among ~40: merged into the kept order, not sorted afresh.
            assert!(4 <= store.len() / 4);
            cache.order(&store);
            assert_eq!(ids(&cache.sorted), sorted(&store), "round {round}");
            let i = cache.sorted.iter().position(|p| p.name() == name).expect("the changed pod");
            assert!(Arc::ptr_eq(&cache.sorted[i], &new_record), "the changed pod's new record");
        }
    }
}
