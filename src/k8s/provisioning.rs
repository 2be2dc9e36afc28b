//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`) and the PodTemplates their pod sets name.
//!
//! The API types are not in `k8s-openapi` (the CRD is Cluster Autoscaler's), so the fields read
//! are declared here, as the CRD's schema spells them. A pod set becomes one pending pod converted
//! like any other (resources, GPU forms, affinity, DRA claims), so a request is planned with the
//! same rules as the pods it stands for.

use super::dra::{Dra, PodClaims};
use super::error::ObjCtx;
use super::slim::null_default;
use super::{convert_pod, SnapshotError};
use crate::model::provisioning::{
    PodSet, ProvisioningRequest, RequestPhase, DEFAULT_BOOKING_SECONDS, DEFAULT_EXPIRY_SECONDS,
};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API versions read (v1beta1 has the same fields and is still served by older releases).
pub const PROVISIONING_REQUEST_API_VERSIONS: [&str; 2] =
    ["autoscaling.x-k8s.io/v1", "autoscaling.x-k8s.io/v1beta1"];

/// Condition types of the API.
pub mod conditions {
    /// The autoscaler has seen the request and serves its class.
    pub const ACCEPTED: &str = "Accepted";
    /// The capacity exists and is booked.
    pub const PROVISIONED: &str = "Provisioned";
    /// The request cannot be served.
    pub const FAILED: &str = "Failed";
    /// The booking ran out before the pods came.
    pub const BOOKING_EXPIRED: &str = "BookingExpired";
    /// Booked capacity was taken back.
    pub const CAPACITY_REVOKED: &str = "CapacityRevoked";
}

/// `spec.parameters` keys Kueue passes through from its `ProvisioningRequestConfig`.
pub mod parameters {
    /// Seconds booked capacity is held after `Provisioned`.
    pub const BOOKING_SECONDS: &str = "bookingTimeSeconds";
    /// Seconds after creation an undecided request expires.
    pub const VALID_UNTIL_SECONDS: &str = "ValidUntilSeconds";
    /// `"true"`: fail when capacity is not found, rather than keep looking.
    pub const NO_RETRY: &str = "noRetry";
}

/// A ProvisioningRequest as the CRD defines it (the fields the plan reads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestObject {
    /// Name, namespace, creation time.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What is asked.
    pub spec: ProvisioningRequestSpec,
    /// Conditions so far.
    #[serde(default)]
    pub status: Option<ProvisioningRequestStatus>,
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestSpec {
    /// Pod sets (1 to 32 in the CRD).
    pub pod_sets: Vec<PodSetSpec>,
    /// The class.
    pub provisioning_class_name: String,
    /// Class parameters (strings in the API).
    #[serde(default, deserialize_with = "null_default")]
    pub parameters: BTreeMap<String, String>,
}

/// `spec.podSets[i]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSetSpec {
    /// The PodTemplate in the request's namespace.
    #[serde(default, deserialize_with = "null_default")]
    pub pod_template_ref: TemplateRef,
    /// How many pods.
    pub count: i32,
}

/// `spec.podSets[i].podTemplateRef`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateRef {
    /// PodTemplate name.
    #[serde(default)]
    pub name: String,
}

/// `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestStatus {
    /// Standard conditions.
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: Vec<Condition>,
}

/// `namespace/name` of a namespaced object (`default` when the namespace is left out), as
/// requests, their templates and the pods consuming them name each other.
pub fn namespaced_id(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

impl ProvisioningRequestObject {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        namespaced_id(&self.metadata)
    }

    /// The condition of this type, when present.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == kind)
    }

    fn is_true(&self, kind: &str) -> bool {
        self.condition(kind).is_some_and(|c| c.status == "True")
    }
}

/// Requests and templates read, converted once every DRA object is known.
#[derive(Default)]
pub(super) struct Requests {
    requests: Vec<(String, ProvisioningRequestObject)>,
    templates: BTreeMap<String, core::PodTemplate>,
}

impl Requests {
    pub fn add_request(&mut self, origin: &str, r: ProvisioningRequestObject) {
        self.requests.push((origin.to_string(), r));
    }

    pub fn add_template(&mut self, t: core::PodTemplate) {
        self.templates.insert(namespaced_id(&t.metadata), t);
    }

    /// The requests, in identity order. Malformed specs are errors naming the field; a missing
    /// or unusable PodTemplate makes the request invalid (it fails with that reason) rather than
    /// stopping the plan of everything else.
    pub fn convert(
        self,
        dra: &mut Dra,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<ProvisioningRequest>, SnapshotError> {
        let mut out = Vec::with_capacity(self.requests.len());
        let mut requests = self.requests;
        requests.sort_by_key(|(_, r)| r.id());
        for (origin, r) in requests {
            out.push(convert_request(&origin, &r, &self.templates, dra, warnings)?);
        }
        Ok(out)
    }
}

fn seconds_parameter(
    ctx: &ObjCtx<'_>,
    r: &ProvisioningRequestObject,
    key: &str,
) -> Result<Option<i64>, SnapshotError> {
    let Some(v) = r.spec.parameters.get(key) else { return Ok(None) };
    match v.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(ctx.invalid(
            format!("spec.parameters[{key}]"),
            v,
            "must be a whole number of seconds above 0",
        )),
    }
}

fn convert_request(
    origin: &str,
    r: &ProvisioningRequestObject,
    templates: &BTreeMap<String, core::PodTemplate>,
    dra: &mut Dra,
    warnings: &mut Vec<String>,
) -> Result<ProvisioningRequest, SnapshotError> {
    let id = r.id();
    let ctx = ObjCtx { origin, object: format!("ProvisioningRequest {id}") };
    let namespace = r.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    if r.spec.pod_sets.is_empty() {
        return Err(ctx.invalid("spec.podSets", "[]", "a ProvisioningRequest needs at least one pod set"));
    }
    let phase = if [conditions::FAILED, conditions::BOOKING_EXPIRED, conditions::CAPACITY_REVOKED]
        .iter()
        .any(|c| r.is_true(c))
    {
        RequestPhase::Finished
    } else if let Some(c) = r.condition(conditions::PROVISIONED).filter(|c| c.status == "True") {
        RequestPhase::Provisioned { since: c.last_transition_time.0.as_second() }
    } else {
        RequestPhase::Open
    };
    let mut request = ProvisioningRequest {
        id: id.clone(),
        class_name: r.spec.provisioning_class_name.clone(),
        pod_sets: Vec::new(),
        created_at: r.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        phase,
        booking_seconds: seconds_parameter(&ctx, r, parameters::BOOKING_SECONDS)?
            .unwrap_or(DEFAULT_BOOKING_SECONDS),
        expiry_seconds: seconds_parameter(&ctx, r, parameters::VALID_UNTIL_SECONDS)?
            .unwrap_or(DEFAULT_EXPIRY_SECONDS),
        waiting_reason: r
            .condition(conditions::PROVISIONED)
            .filter(|c| c.status != "True")
            .map(|c| c.reason.clone())
            .filter(|r| !r.is_empty()),
        invalid: None,
        no_retry: match r.spec.parameters.get(parameters::NO_RETRY).map(String::as_str) {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(ctx.invalid(
                    format!("spec.parameters[{}]", parameters::NO_RETRY),
                    other,
                    "must be \"true\" or \"false\"",
                ))
            }
        },
    };
    for (i, set) in r.spec.pod_sets.iter().enumerate() {
        let field = |f: &str| format!("spec.podSets[{i}].{f}");
        if set.count < 1 {
            return Err(ctx.invalid(field("count"), set.count.to_string(), "must be at least 1"));
        }
        // (Checked before decoding as well; objects built in memory come here directly.)
        if set.count as u32 > crate::limits::MAX_PODS_PER_POD_SET {
            return Err(ctx.invalid(
                field("count"),
                set.count.to_string(),
                format!("more than {}, gpuscale's bound for this count", crate::limits::MAX_PODS_PER_POD_SET),
            ));
        }
        let name = &set.pod_template_ref.name;
        if name.is_empty() {
            return Err(ctx.invalid(field("podTemplateRef.name"), "", "names no PodTemplate"));
        }
        let Some(template) = templates.get(&format!("{namespace}/{name}")) else {
            request.invalid =
                Some(format!("PodTemplate {namespace}/{name} ({}) not found", field("podTemplateRef.name")));
            break;
        };
        let t = template.template.clone().unwrap_or_default();
        let mut meta = t.metadata.unwrap_or_default();
        meta.namespace = Some(namespace.clone());
        meta.name = Some(name.clone());
        meta.creation_timestamp = r.metadata.creation_timestamp.clone();
        // The pods to come, as they will be once admitted: Kueue copies its pods' templates,
        // gates included, and lifts the gates when the request is provisioned.
        let spec = t.spec.map(|s| core::PodSpec { scheduling_gates: None, node_name: None, ..s });
        let pod = core::Pod {
            metadata: meta,
            spec,
            status: Some(core::PodStatus { phase: Some("Pending".into()), ..Default::default() }),
        };
        let template_origin = format!("{origin} (PodTemplate {namespace}/{name})");
        // A template that is not a valid pod is bad input, as a bad Pod is.
        let Some(converted) = convert_pod(&pod, &template_origin, &BTreeMap::new(), warnings)? else {
            request.invalid = Some(format!("PodTemplate {namespace}/{name} describes no pod to plan"));
            break;
        };
        let mut workload = converted.workload;
        if let Some(refs) = PodClaims::of(&pod) {
            match dra.claims_for(&template_origin, &refs, warnings)? {
                Ok(claims) => workload.dra_claims = claims,
                Err(reason) => {
                    request.invalid = Some(format!("PodTemplate {namespace}/{name}: {reason}"));
                    break;
                }
            }
        }
        request.pod_sets.push(PodSet { template: name.clone(), count: set.count as u32, pod: workload });
    }
    if request.invalid.is_some() {
        request.pod_sets.clear();
    }
    if request.class().is_none() {
        warnings.push(ctx.warning(format!(
            "spec.provisioningClassName {:?} is not a class gpuscale serves ({}, {}); the request is left to whoever serves it",
            request.class_name,
            crate::model::provisioning::CHECK_CAPACITY_CLASS,
            crate::model::provisioning::ATOMIC_SCALE_UP_CLASS
        )));
    }
    Ok(request)
}
