//! Conversion kept between controller loops. Each Pod is converted once, when it arrives
//! ([`PodConversion`], which the controller's store keeps instead of the Pod), and each Node when
//! it changes (a new `resourceVersion`), its result reused until then; so a loop over a
//! 5,000-node, 60,000-pod cluster converts what changed, not the cluster. Assembling the snapshot
//! (pods onto nodes, devices, storage, budgets) is the same step every source goes through, so the
//! result is the snapshot [`super::convert`] makes of the same objects.

use super::decode::{self, Decoded, PodEntry};
use super::{convert_node, convert_pod, convert_pod_group, volume, ConvertedNode, ConvertedPod};
use super::{LoadedSnapshot, SnapshotError, SourcedObject};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rayon::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// A Pod converted on its own, as soon as it is seen, for snapshots assembled from it again and
/// again: what a controller keeps of each of tens of thousands of pods, in place of the Pod.
#[derive(Debug)]
pub struct PodConversion {
    /// `Pod <namespace>/<name>`.
    origin: String,
    /// The conversion without PodGroup sizes (applied at assembly: they change apart from the
    /// pod), or, when it failed, the pod, converted again at assembly for its error.
    converted: Result<(Option<ConvertedPod>, Vec<String>), Box<Pod>>,
    /// The pod, when it names PersistentVolumeClaims (the storage checks read it).
    with_claims: Option<Box<Pod>>,
    /// Its DRA claim references, when it has any.
    dra: Option<Box<super::dra::PodClaims>>,
}

impl PodConversion {
    /// Converts `pod` (best [`super::slim_pod`]-ed: a failed conversion or one with claims keeps it).
    pub fn new(pod: Pod) -> Self {
        let origin = format!("Pod {}", name(&pod.metadata));
        let mut warnings = Vec::new();
        let converted = match convert_pod(&pod, &origin, &BTreeMap::new(), &mut warnings) {
            Ok(c) => Ok((c, warnings)),
            Err(_) => Err(Box::new(pod.clone())),
        };
        let dra = super::dra::PodClaims::of(&pod).map(Box::new);
        let with_claims = volume::Storage::uses_claims(&pod).then(|| Box::new(pod));
        PodConversion { origin, converted, with_claims, dra }
    }

    /// The converted pod, when it converted and needs resources (not Succeeded or Failed).
    pub fn pod(&self) -> Option<&ConvertedPod> {
        self.converted.as_ref().ok().and_then(|(c, _)| c.as_ref())
    }

    /// What assembly takes: the conversion with the gang's size from its PodGroup (`sizes`), as
    /// [`convert_pod`] with `sizes` gives it.
    fn entry(&self, sizes: &BTreeMap<String, u32>) -> PodEntry {
        let converted = match &self.converted {
            Ok((pod, warnings)) => {
                let mut pod = pod.clone().map(Box::new);
                if let Some(w) = pod.as_mut().map(|p| &mut p.workload) {
                    if let Some(size) = w.gang.as_ref().and_then(|g| sizes.get(g)) {
                        w.gang_min_members = Some(*size);
                    }
                }
                Ok((pod, warnings.clone()))
            }
            Err(pod) => {
                let mut warnings = Vec::new();
                convert_pod(pod, &self.origin, sizes, &mut warnings).map(|c| (c.map(Box::new), warnings))
            }
        };
        PodEntry { converted, with_claims: self.with_claims.clone(), dra: self.dra.clone() }
    }
}

/// One object's conversion and what it said, valid for one version of the object.
struct Entry<T> {
    version: String,
    converted: T,
    warnings: Vec<String>,
    /// The call that last saw the object: entries not seen by the latest are dropped.
    seen: u64,
}

/// One object's conversion and what it said, or why it failed.
type Converted<T> = Result<(T, Vec<String>), SnapshotError>;

/// What a loop converted and reused, for logs and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConversionCounts {
    /// Nodes converted this time (new or changed).
    pub converted: usize,
    /// Nodes whose earlier conversion was reused.
    pub reused: usize,
}

/// The conversions of the Nodes seen last time, by uid. Objects without a uid or
/// `resourceVersion` (never so from an API server) are converted every time.
#[derive(Default)]
pub struct ConversionCache {
    nodes: HashMap<String, Entry<ConvertedNode>>,
    /// Calls so far.
    calls: u64,
    /// The last call's counts.
    pub counts: ConversionCounts,
}

/// `namespace/name`, or `name` of a cluster-scoped object, for messages.
fn name(meta: &ObjectMeta) -> String {
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    }
}

fn identity(meta: &ObjectMeta) -> Option<(&str, &str)> {
    Some((meta.uid.as_deref()?, meta.resource_version.as_deref()?))
}

/// Converts the misses of `objects` in parallel and keeps them; the conversions in object order,
/// taken from `cache` or made now. An object that fails to convert is not kept: it fails again
/// next time, with its error.
fn convert_kind<K: Sync, T: Clone + Send>(
    objects: &[&K],
    meta: impl Fn(&K) -> &ObjectMeta + Sync,
    origin: impl Fn(&K) -> String + Sync,
    (cache, call): (&mut HashMap<String, Entry<T>>, u64),
    convert: impl Fn(&K, &str, &mut Vec<String>) -> Result<T, SnapshotError> + Sync,
    counts: &mut ConversionCounts,
) -> Vec<(String, Converted<T>)> {
    let hits: Vec<bool> = objects
        .iter()
        .map(|k| {
            identity(meta(k))
                .is_some_and(|(uid, version)| cache.get(uid).is_some_and(|e| e.version == version))
        })
        .collect();
    let made: Vec<Option<Converted<T>>> = objects
        .par_iter()
        .zip(&hits)
        .map(|(k, &hit)| {
            (!hit).then(|| {
                let mut warnings = Vec::new();
                convert(k, &origin(k), &mut warnings).map(|c| (c, warnings))
            })
        })
        .collect();
    // Entries stay in place, marked as seen; only the snapshot's copy is made.
    let mut out = Vec::with_capacity(objects.len());
    for ((k, hit), made) in objects.iter().zip(hits).zip(made) {
        let result = match made {
            None if hit => {
                counts.reused += 1;
                let (uid, _) = identity(meta(k)).expect("a hit has an identity");
                let entry = cache.get_mut(uid).expect("a hit is cached");
                entry.seen = call;
                Ok((entry.converted.clone(), entry.warnings.clone()))
            }
            None => unreachable!("every miss is converted"),
            Some(made) => {
                counts.converted += 1;
                if let (Some((uid, version)), Ok((converted, warnings))) = (identity(meta(k)), &made) {
                    let entry = Entry {
                        version: version.to_string(),
                        converted: converted.clone(),
                        warnings: warnings.clone(),
                        seen: call,
                    };
                    cache.insert(uid.to_string(), entry);
                }
                made
            }
        };
        out.push((origin(k), result));
    }
    // Objects gone since last time are forgotten.
    cache.retain(|_, e| e.seen == call);
    out
}

impl ConversionCache {
    /// The snapshot of these objects, in this order (origins `Node <name>`, `Pod <ns>/<name>`,
    /// `PodDisruptionBudget <ns>/<name>`, `PodGroup`); `others` (claims, volumes, storage classes)
    /// are decoded from JSON every time, being few. The same errors and warnings as
    /// [`super::convert`] of the same objects.
    pub fn convert(
        &mut self,
        nodes: &[&Node],
        pods: &[&PodConversion],
        pdbs: &[&PodDisruptionBudget],
        pod_groups: &[Value],
        others: &[SourcedObject],
    ) -> Result<LoadedSnapshot, SnapshotError> {
        self.counts = ConversionCounts::default();
        self.calls += 1;
        let mut sizes = BTreeMap::new();
        for g in pod_groups {
            let (name, size) = convert_pod_group(g, "PodGroup")?;
            sizes.insert(name, size);
        }
        let converted_nodes = convert_kind(
            nodes,
            |n: &Node| &n.metadata,
            |n: &Node| format!("Node {}", name(&n.metadata)),
            (&mut self.nodes, self.calls),
            convert_node,
            &mut self.counts,
        );
        let mut objects: Vec<(String, Decoded)> =
            Vec::with_capacity(nodes.len() + pods.len() + pdbs.len() + pod_groups.len() + others.len());
        objects.extend(converted_nodes.into_iter().map(|(origin, c)| (origin, Decoded::Node(Box::new(c)))));
        let entries: Vec<PodEntry> = pods.par_iter().map(|p| p.entry(&sizes)).collect();
        for (p, entry) in pods.iter().zip(entries) {
            objects.push((p.origin.clone(), Decoded::Pod(entry)));
        }
        for b in pdbs {
            objects.push((
                format!("PodDisruptionBudget {}", name(&b.metadata)),
                Decoded::Pdb(Box::new((*b).clone())),
            ));
        }
        objects.extend(pod_groups.iter().map(|_| ("PodGroup".to_string(), Decoded::PodGroup)));
        objects.extend(decode::decode_all(others)?);
        super::convert_decoded(objects)
    }
}
