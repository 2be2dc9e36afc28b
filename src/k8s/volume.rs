//! What a pod's PersistentVolumeClaims ask of its node, as kube-scheduler's VolumeBinding,
//! VolumeZone and VolumeRestrictions plugins read them (`pkg/scheduler/framework/plugins/
//! volumebinding`, `volumezone`, `volumerestrictions`, Kubernetes 1.35): a bound volume's node
//! affinity and zone labels; for an unbound `WaitForFirstConsumer` claim, the available volumes it
//! could bind and the class's allowed topologies; and the claims no node can serve (missing, an
//! unbound claim of an `Immediate` class, a `ReadWriteOncePod` claim another pod uses).

use super::error::{ObjCtx, SnapshotError};
use super::pod::node_selector_terms;
use super::quantity;
use crate::model::{NodeSelectorRequirement, SelectorOperator, VolumeNeed, VOLUME_TOPOLOGY_LABELS};
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeSet, HashMap};

/// The class that provisions nothing: its claims bind only to volumes made beforehand (local).
/// The volume controller's mark on a claim whose binding is complete.
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// kube-scheduler's words for a claim that must bind before the pod is scheduled.
const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// The annotation that marks the cluster's default StorageClass.
const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The access mode that lets only one pod use a claim.
const READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";

/// A claim's volume requirements in the units the binder compares.
struct Claim<'a> {
    object: &'a k8s::PersistentVolumeClaim,
    request: u64,
}

/// The snapshot's PersistentVolumeClaims, PersistentVolumes and StorageClasses.
#[derive(Default)]
pub struct Storage {
    claims: HashMap<(String, String), k8s::PersistentVolumeClaim>,
    volumes: HashMap<String, (String, k8s::PersistentVolume)>,
    classes: HashMap<String, StorageClass>,
    /// Claims `ReadWriteOncePod` that a scheduled pod uses: no other pod can have them.
    held_once: BTreeSet<(String, String)>,
}

impl Storage {
    /// Whether the snapshot carries any storage objects at all (without them, claims cannot be
    /// judged and are left unchecked).
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.volumes.is_empty() && self.classes.is_empty()
    }

    /// Whether a pod names any claim.
    pub fn uses_claims(pod: &k8s::Pod) -> bool {
        !claims_of(pod).is_empty()
    }

    /// Adds a claim.
    pub fn add_claim(&mut self, c: k8s::PersistentVolumeClaim) {
        let ns = c.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = c.metadata.name.clone().unwrap_or_default();
        self.claims.insert((ns, name), c);
    }

    /// Adds a volume, with where it was read from (for errors).
    pub fn add_volume(&mut self, origin: &str, v: k8s::PersistentVolume) {
        self.volumes.insert(v.metadata.name.clone().unwrap_or_default(), (origin.to_string(), v));
    }

    /// Adds a class.
    pub fn add_class(&mut self, c: StorageClass) {
        self.classes.insert(c.metadata.name.clone().unwrap_or_default(), c);
    }

    /// Records the `ReadWriteOncePod` claims that scheduled pods (`pods`, bound and not done)
    /// use.
    pub fn note_users<'a>(&mut self, pods: impl Iterator<Item = &'a k8s::Pod>) {
        for pod in pods {
            let spec = pod.spec.as_ref();
            let done =
                matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
            if done || spec.and_then(|s| s.node_name.as_ref()).is_none() {
                continue;
            }
            let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            for (claim, _) in claims_of(pod) {
                let key = (ns.clone(), claim);
                let once =
                    self.claims.get(&key).is_some_and(|c| access_modes(c).contains(&READ_WRITE_ONCE_POD));
                if once {
                    self.held_once.insert(key);
                }
            }
        }
    }

    /// What the pod's claims ask of a node: `Ok(needs)`, or `Err(reason)` when no node can serve
    /// them. Invalid storage objects are errors naming the object and field.
    pub fn needs_of(
        &self,
        pod: &k8s::Pod,
        warnings: &mut Vec<String>,
    ) -> Result<Result<Vec<VolumeNeed>, String>, SnapshotError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let mut needs = Vec::new();
        for (name, ephemeral) in claims_of(pod) {
            let id = format!("{ns}/{name}");
            let Some(object) = self.claims.get(&(ns.clone(), name.clone())) else {
                // An ephemeral volume's claim is made by a controller right after the pod; it
                // asks what its template's class asks.
                match ephemeral {
                    Some(class) => match self.unbound(
                        &id,
                        class.or_else(|| self.default_class()).as_deref(),
                        None,
                        warnings,
                    )? {
                        Ok(mut n) => needs.append(&mut n),
                        Err(reason) => return Ok(Err(reason)),
                    },
                    None => return Ok(Err(format!("persistentvolumeclaim \"{name}\" not found"))),
                }
                continue;
            };
            if object.metadata.deletion_timestamp.is_some() {
                return Ok(Err(format!("persistentvolumeclaim \"{name}\" is being deleted")));
            }
            if self.held_once.contains(&(ns.clone(), name.clone()))
                && pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
            {
                return Ok(Err(
                    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
                        .into(),
                ));
            }
            let named = object.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty());
            let completed =
                object.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(BIND_COMPLETED));
            // Bound only once the volume controller has finished (`isPVCFullyBound`): a claim
            // that names its volume before that is, to kube-scheduler, an unbound immediate one.
            if named.is_some() && !completed {
                return Ok(Err(UNBOUND_IMMEDIATE.into()));
            }
            match named {
                Some(pv) => {
                    let Some((origin, volume)) = self.volumes.get(&pv) else {
                        return Ok(Err(format!("pvc(s) bound to non-existent pv(s): {pv}")));
                    };
                    let ctx = ObjCtx { origin, object: format!("PersistentVolume {pv}") };
                    if let Some(required) = volume
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_affinity.as_ref())
                        .and_then(|a| a.required.as_ref())
                    {
                        let terms =
                            node_selector_terms(&ctx, "spec.nodeAffinity.required", required, warnings)?;
                        needs.push(VolumeNeed::NodeAffinity { claim: id.clone(), bound: true, terms });
                    }
                    for key in VOLUME_TOPOLOGY_LABELS {
                        if let Some(v) = volume.metadata.labels.as_ref().and_then(|l| l.get(key)) {
                            let values = v.split("__").map(str::to_string).collect();
                            needs.push(VolumeNeed::Zone { claim: id.clone(), key: key.to_string(), values });
                        }
                    }
                }
                None => {
                    let class = claim_class(object);
                    let claim = Claim { object, request: request_of(object) };
                    match self.unbound(&id, class.as_deref(), Some(&claim), warnings)? {
                        Ok(mut n) => needs.append(&mut n),
                        Err(reason) => return Ok(Err(reason)),
                    }
                }
            }
        }
        Ok(Ok(needs))
    }

    /// An unbound claim of `class`: an `Immediate` class (or none) cannot wait for the pod; a
    /// `WaitForFirstConsumer` one binds on the node where a matching available volume is, or
    /// provisions where the class's allowed topologies reach.
    fn unbound(
        &self,
        id: &str,
        class: Option<&str>,
        claim: Option<&Claim<'_>>,
        warnings: &mut Vec<String>,
    ) -> Result<Result<Vec<VolumeNeed>, String>, SnapshotError> {
        let immediate = Err(UNBOUND_IMMEDIATE.to_string());
        // A claim without a class binds only to class-less volumes, through the volume
        // controller: nothing the pod's node decides.
        let Some(class_name) = class.map(str::to_string) else { return Ok(immediate) };
        let Some(sc) = self.classes.get(&class_name) else {
            return Ok(Err(format!("storageclass.storage.k8s.io \"{class_name}\" not found")));
        };
        if sc.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
            return Ok(immediate);
        }
        // Alternatives: every available volume the claim could bind, then provisioning.
        let mut terms: Vec<Vec<NodeSelectorRequirement>> = Vec::new();
        let mut anywhere = false;
        for (name, (origin, pv)) in &self.volumes {
            if !claim.is_some_and(|c| could_bind(c, &class_name, pv)) {
                continue;
            }
            let ctx = ObjCtx { origin, object: format!("PersistentVolume {name}") };
            match pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref()) {
                Some(required) => {
                    terms.extend(node_selector_terms(&ctx, "spec.nodeAffinity.required", required, warnings)?)
                }
                None => anywhere = true,
            }
        }
        if sc.provisioner != NO_PROVISIONER {
            match sc.allowed_topologies.as_ref().filter(|t| !t.is_empty()) {
                None => anywhere = true,
                Some(allowed) => terms.extend(allowed.iter().map(|t| {
                    t.match_label_expressions
                        .iter()
                        .flatten()
                        .map(|e| NodeSelectorRequirement {
                            key: e.key.clone(),
                            operator: SelectorOperator::In,
                            values: e.values.clone(),
                        })
                        .collect()
                })),
            }
        }
        if anywhere {
            return Ok(Ok(Vec::new()));
        }
        Ok(Ok(vec![VolumeNeed::NodeAffinity { claim: id.to_string(), bound: false, terms }]))
    }

    /// The class marked default (what admission gives a claim made without one, such as an
    /// ephemeral volume's); the first by name if several are.
    fn default_class(&self) -> Option<String> {
        self.classes
            .iter()
            .filter(|(_, c)| {
                c.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                    .is_some_and(|v| v == "true")
            })
            .map(|(n, _)| n.clone())
            .min()
    }
}

/// The claims a pod's volumes name: `(claim, None)` for a `persistentVolumeClaim`, and
/// `(pod-volume, Some(template class))` for a generic ephemeral volume.
fn claims_of(pod: &k8s::Pod) -> Vec<(String, Option<Option<String>>)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                return Some((c.claim_name.clone(), None));
            }
            let template = v.ephemeral.as_ref()?.volume_claim_template.as_ref()?;
            Some((format!("{name}-{}", v.name), Some(template.spec.storage_class_name.clone())))
        })
        .collect()
}

/// The claim's class: the beta annotation, else `spec.storageClassName` (`""` asks for none).
fn claim_class(c: &k8s::PersistentVolumeClaim) -> Option<String> {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class").cloned())
        .or_else(|| c.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
        .filter(|s| !s.is_empty())
}

fn access_modes(c: &k8s::PersistentVolumeClaim) -> Vec<&str> {
    c.spec.iter().flat_map(|s| s.access_modes.iter().flatten()).map(String::as_str).collect()
}

/// Bytes a claim requests (0 when unreadable: any size then matches).
fn request_of(c: &k8s::PersistentVolumeClaim) -> u64 {
    c.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity::units(&q.0).ok())
        .unwrap_or(0)
}

/// Whether an available volume could bind the claim, as the binder's `FindMatchingVolume` asks:
/// same class, available (or reserved for this claim), big enough, with every access mode and
/// the same volume mode.
fn could_bind(claim: &Claim<'_>, class: &str, pv: &k8s::PersistentVolume) -> bool {
    let Some(spec) = pv.spec.as_ref() else { return false };
    if spec.storage_class_name.as_deref().unwrap_or_default() != class {
        return false;
    }
    let c = claim.object;
    if let Some(r) = &spec.claim_ref {
        if r.name.as_deref() != c.metadata.name.as_deref()
            || r.namespace.as_deref() != c.metadata.namespace.as_deref()
        {
            return false;
        }
    } else if pv.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p != "Available") {
        return false;
    }
    if pv.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let size = spec.capacity.as_ref().and_then(|c| c.get("storage")).and_then(|q| quantity::units(&q.0).ok());
    if size.is_some_and(|s| s < claim.request) {
        return false;
    }
    let modes: Vec<&str> = spec.access_modes.iter().flatten().map(String::as_str).collect();
    if !access_modes(c).iter().all(|m| modes.contains(m)) {
        return false;
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", |s| s.as_str()).to_string();
    mode(spec.volume_mode.as_ref()) == mode(c.spec.as_ref().and_then(|s| s.volume_mode.as_ref()))
}
