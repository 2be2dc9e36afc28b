//! Decoding and converting objects in parallel, one at a time.
//!
//! Each object is decoded and, for the two kinds a cluster has by the thousand (Nodes, Pods),
//! converted at once, so the decoded API object is dropped before the next is read: a
//! 60,000-pod List never exists as API objects all at once. Messages and errors come out in the
//! order a one-by-one conversion gives (decode errors in object order first, then node, then pod
//! errors), whatever order the threads finish in.

use super::{convert_node, convert_pod, convert_pod_group, slim, volume, ConvertedNode, ConvertedPod};
use super::{SnapshotError, SourcedObject, POD_GROUP_API_VERSIONS};
use k8s_openapi::api::{
    core::v1 as core, policy::v1 as policy, resource::v1 as resource, storage::v1 as storage,
};
use rayon::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// An object as read, before decoding: a JSON value, or a List item still as text.
pub(super) trait RawObject: Sync {
    /// `apiVersion` and `kind`.
    fn head(&self) -> (&str, &str);
    /// Where it was read, for messages.
    fn origin(&self) -> Cow<'_, str>;
    /// Decodes it with errors naming the field.
    fn decode<T: DeserializeOwned>(&self) -> Result<T, SnapshotError>;
    /// It as a JSON value, for the rare kinds and messages that read it so.
    fn value(&self) -> Cow<'_, Value>;
    /// The first value past a bound of [`crate::limits`], read before decoding.
    fn check_bounds(&self) -> Option<super::bounds::Violation>;
    /// `Kind namespace/name`, for messages.
    fn describe(&self) -> String {
        super::describe(&self.value())
    }
}

impl RawObject for SourcedObject {
    fn head(&self) -> (&str, &str) {
        (
            self.value["apiVersion"].as_str().unwrap_or_default(),
            self.value["kind"].as_str().unwrap_or_default(),
        )
    }
    fn origin(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.origin)
    }
    fn decode<T: DeserializeOwned>(&self) -> Result<T, SnapshotError> {
        serde_path_to_error::deserialize(&self.value).map_err(|e| SnapshotError::Decode {
            origin: self.origin.clone(),
            object: super::describe(&self.value),
            field: e.path().to_string(),
            message: e.inner().to_string(),
        })
    }
    fn value(&self) -> Cow<'_, Value> {
        Cow::Borrowed(&self.value)
    }
    fn check_bounds(&self) -> Option<super::bounds::Violation> {
        super::bounds::check_value(self.head().1, &self.value)
    }
}

/// A pod converted, with what its conversion said, and the API object when the pod names
/// volume claims (the storage checks read it once every claim is known).
pub(super) struct PodEntry {
    /// Boxed, as the tens of thousands of entries move through several vectors on their way.
    pub converted: Result<(Option<Box<ConvertedPod>>, Vec<String>), SnapshotError>,
    pub with_claims: Option<Box<core::Pod>>,
    /// Its DRA claim references, when it has any.
    pub dra: Option<Box<super::dra::PodClaims>>,
}

/// An object decoded, the thousands converted already.
pub(super) enum Decoded {
    /// Boxed: a Node is large, and every pod's entry would be as large otherwise.
    Node(Box<Result<(ConvertedNode, Vec<String>), SnapshotError>>),
    Pod(PodEntry),
    Pdb(Box<policy::PodDisruptionBudget>),
    Claim(Box<core::PersistentVolumeClaim>),
    Volume(Box<core::PersistentVolume>),
    Class(Box<storage::StorageClass>),
    DeviceClass(Box<resource::DeviceClass>),
    ResourceSlice(Box<resource::ResourceSlice>),
    ResourceClaim(Box<resource::ResourceClaim>),
    ResourceClaimTemplate(Box<resource::ResourceClaimTemplate>),
    ProvisioningRequest(Box<super::provisioning::ProvisioningRequestObject>),
    PodTemplate(Box<core::PodTemplate>),
    /// A gang's PodGroup (read before the pods, see [`decode_all`]).
    PodGroup,
    /// A kind the plan does not read: `Kind (apiVersion)`.
    Skipped(String),
    /// A kind the plan reads, in an API version it does not: the warning naming the object.
    UnknownVersion(String),
}

/// The API versions the plan reads each kind in (for the warning on another version).
fn versions_read(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Node" | "Pod" | "PersistentVolumeClaim" | "PersistentVolume" | "PodTemplate" => &["v1"],
        "PodDisruptionBudget" => &["policy/v1"],
        "StorageClass" => &["storage.k8s.io/v1"],
        "DeviceClass" | "ResourceSlice" | "ResourceClaim" | "ResourceClaimTemplate" => {
            &["resource.k8s.io/v1"]
        }
        "ProvisioningRequest" => &super::provisioning::PROVISIONING_REQUEST_API_VERSIONS,
        _ => return None,
    })
}

fn is_pod_group((api_version, kind): (&str, &str)) -> bool {
    kind == "PodGroup" && POD_GROUP_API_VERSIONS.contains(&api_version)
}

/// Decodes every object (in parallel) into `(origin, Decoded)`, in order; the first decode
/// error in object order is the error.
pub(super) fn decode_all<O: RawObject>(objects: &[O]) -> Result<Vec<(String, Decoded)>, SnapshotError> {
    // Pods read their gang's size from its PodGroup, so PodGroups come first.
    let groups: BTreeMap<usize, Result<(String, u32), SnapshotError>> = objects
        .iter()
        .enumerate()
        .filter(|(_, o)| is_pod_group(o.head()))
        .map(|(i, o)| (i, convert_pod_group(&o.value(), &o.origin())))
        .collect();
    let sizes: BTreeMap<String, u32> = groups.values().filter_map(|g| g.as_ref().ok().cloned()).collect();
    let decoded: Vec<Result<(String, Decoded), SnapshotError>> = objects
        .par_iter()
        .enumerate()
        .map(|(i, o)| {
            let decoded = match groups.get(&i) {
                Some(Ok(_)) => Decoded::PodGroup,
                // (The error again: errors are not `Clone`.)
                Some(Err(_)) => convert_pod_group(&o.value(), &o.origin()).map(|_| Decoded::PodGroup)?,
                None => decode_one(o, &sizes)?,
            };
            Ok((o.origin().into_owned(), decoded))
        })
        .collect();
    decoded.into_iter().collect()
}

/// Whether the plan reads objects of this `apiVersion` and kind (the others are skipped).
pub(super) fn is_read((api_version, kind): (&str, &str)) -> bool {
    matches!(
        (api_version, kind),
        ("v1", "Node" | "Pod" | "PersistentVolumeClaim" | "PersistentVolume" | "PodTemplate")
            | ("policy/v1", "PodDisruptionBudget")
            | ("storage.k8s.io/v1", "StorageClass")
            | (
                "resource.k8s.io/v1",
                "DeviceClass" | "ResourceSlice" | "ResourceClaim" | "ResourceClaimTemplate"
            )
    ) || (kind == "ProvisioningRequest"
        && super::provisioning::PROVISIONING_REQUEST_API_VERSIONS.contains(&api_version))
}

/// The object's first value past a bound of [`crate::limits`], as an error naming it.
pub(super) fn check_bounds<O: RawObject>(o: &O) -> Result<(), SnapshotError> {
    if !is_read(o.head()) {
        return Ok(());
    }
    match o.check_bounds() {
        None => Ok(()),
        Some(v) => Err(SnapshotError::Invalid {
            origin: o.origin().into_owned(),
            object: o.describe(),
            field: v.field,
            value: v.value,
            reason: v.reason,
        }),
    }
}

fn decode_one<O: RawObject>(o: &O, pod_groups: &BTreeMap<String, u32>) -> Result<Decoded, SnapshotError> {
    check_bounds(o)?;
    Ok(match o.head() {
        ("v1", "Node") => {
            let k: core::Node = o.decode::<slim::NodeIn>()?.into();
            let mut warnings = Vec::new();
            Decoded::Node(Box::new(convert_node(&k, &o.origin(), &mut warnings).map(|c| (c, warnings))))
        }
        ("v1", "Pod") => {
            let k: core::Pod = o.decode::<slim::PodIn>()?.into();
            let mut warnings = Vec::new();
            let converted =
                convert_pod(&k, &o.origin(), pod_groups, &mut warnings).map(|c| (c.map(Box::new), warnings));
            let dra = super::dra::PodClaims::of(&k).map(Box::new);
            let with_claims = volume::Storage::uses_claims(&k).then(|| Box::new(k));
            Decoded::Pod(PodEntry { converted, with_claims, dra })
        }
        ("policy/v1", "PodDisruptionBudget") => Decoded::Pdb(o.decode()?),
        ("v1", "PersistentVolumeClaim") => Decoded::Claim(o.decode()?),
        ("v1", "PersistentVolume") => Decoded::Volume(o.decode()?),
        ("storage.k8s.io/v1", "StorageClass") => Decoded::Class(o.decode()?),
        ("resource.k8s.io/v1", "DeviceClass") => Decoded::DeviceClass(o.decode()?),
        ("resource.k8s.io/v1", "ResourceSlice") => Decoded::ResourceSlice(o.decode()?),
        ("resource.k8s.io/v1", "ResourceClaim") => Decoded::ResourceClaim(o.decode()?),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => Decoded::ResourceClaimTemplate(o.decode()?),
        (v, "ProvisioningRequest") if super::provisioning::PROVISIONING_REQUEST_API_VERSIONS.contains(&v) => {
            Decoded::ProvisioningRequest(o.decode()?)
        }
        ("v1", "PodTemplate") => Decoded::PodTemplate(o.decode()?),
        (_, "") => {
            return Err(SnapshotError::NotObjects {
                origin: o.origin().into_owned(),
                reason: format!("not a Kubernetes object (no kind): {}", super::preview(&o.value())),
            })
        }
        (v, k) => match versions_read(k) {
            Some(read) => Decoded::UnknownVersion(format!(
                "{}: {}: apiVersion {v:?} is not one gpuscale reads {k} objects in ({}); the object is skipped",
                o.origin(),
                o.describe(),
                read.join(", ")
            )),
            None => Decoded::Skipped(format!("{k} ({v})")),
        },
    })
}
