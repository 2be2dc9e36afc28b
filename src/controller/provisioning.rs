//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`) in the controller: the resource, read when
//! its CRD is served, and the status conditions each plan gives the requests, in the words
//! Cluster Autoscaler writes and Kueue reads.
//!
//! What a request is (booked, waiting for nodes, failed) lives only in its conditions: a new
//! leader re-reads them, so a restart neither forgets a request nor provisions it twice (the
//! nodes of a scale-up under way are in-flight capacity its pods already fit).

use crate::k8s::provisioning::conditions;
use crate::k8s::SourcedObject;
use crate::planner::{RequestOutcome, RequestState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

/// The API version gpuscale reads and writes (served since Cluster Autoscaler 1.30's CRD).
pub const API_VERSION: &str = "autoscaling.x-k8s.io/v1";

/// The ProvisioningRequest resource.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("autoscaling.x-k8s.io", "v1", "ProvisioningRequest"),
        "provisioningrequests",
    )
}

/// Stored requests as the conversion reads them (kind and apiVersion set: list items may lack
/// them), in identity order.
pub fn sourced(requests: &[impl AsRef<DynamicObject>]) -> Vec<SourcedObject> {
    let mut sorted: Vec<&DynamicObject> = requests.iter().map(AsRef::as_ref).collect();
    sorted.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    sorted
        .into_iter()
        .filter_map(|r| {
            let mut value = serde_json::to_value(r).ok()?;
            let m = value.as_object_mut()?;
            m.insert("apiVersion".into(), Value::String(API_VERSION.into()));
            m.insert("kind".into(), Value::String("ProvisioningRequest".into()));
            Some(SourcedObject::new(format!("ProvisioningRequest {}", id_of(r)), value))
        })
        .collect()
}

/// `namespace/name` of a stored request.
pub fn id_of(r: &DynamicObject) -> String {
    crate::k8s::provisioning::namespaced_id(&r.metadata)
}

/// A request's current conditions (none when its status is empty or unreadable).
pub fn conditions_of(r: &DynamicObject) -> Vec<Condition> {
    r.data
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default()
}

/// The message gpuscale accepts requests with (Cluster Autoscaler's, with its own name).
const ACCEPTED_MESSAGE: &str = "ProvisioningRequest is accepted by gpuscale";

/// The conditions a request should have after a plan gave it `outcome`, or `None` when it has
/// them already. Only a change of status or reason is a change (messages carry figures that move
/// every pass: rewriting them would be a write per request per pass); `lastTransitionTime` moves
/// when the status does.
///
/// - every served request: `Accepted=True`;
/// - waiting for nodes, or not found now: `Provisioned=False` with the reason (Kueue keeps
///   waiting; gpuscale asks again every pass, as Cluster Autoscaler does);
/// - provisioned: `Provisioned=True` (the booking starts);
/// - failed: `Failed=True` (Kueue retries with a new request);
/// - booking over (time, or every pod scheduled): `BookingExpired=True`.
///
/// `CapacityRevoked` is never set: gpuscale takes no booked node away (Kueue deactivates the
/// workload of a revoked request).
pub fn next_conditions(
    outcome: &RequestOutcome,
    current: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    let (kind, status) = match outcome.state {
        RequestState::Ignored => return None,
        RequestState::Booked => (None, "True"),
        RequestState::Provisioning | RequestState::ScalingUp | RequestState::NotFound => {
            (Some(conditions::PROVISIONED), "False")
        }
        RequestState::Provisioned => (Some(conditions::PROVISIONED), "True"),
        RequestState::Failed => (Some(conditions::FAILED), "True"),
        RequestState::BookingExpired => (Some(conditions::BOOKING_EXPIRED), "True"),
    };
    let mut next = current.to_vec();
    let mut changed = false;
    let mut set = |kind: &str, status: &str, reason: &str, message: &str| {
        let condition = Condition {
            type_: kind.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            observed_generation: generation,
            last_transition_time: Time(now),
        };
        match next.iter_mut().find(|c| c.type_ == kind) {
            Some(c) if c.status == status && c.reason == reason => {}
            Some(c) => {
                let moved = c.status != status;
                let since = c.last_transition_time.clone();
                *c = condition;
                if !moved {
                    c.last_transition_time = since;
                }
                changed = true;
            }
            None => {
                next.push(condition);
                changed = true;
            }
        }
    };
    set(conditions::ACCEPTED, "True", "Accepted", ACCEPTED_MESSAGE);
    if let Some(kind) = kind {
        set(kind, status, &outcome.reason, &outcome.message);
    }
    changed.then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(state: RequestState, reason: &str) -> RequestOutcome {
        RequestOutcome {
            request: "ml/train-prov-1".into(),
            class: crate::model::provisioning::ATOMIC_SCALE_UP_CLASS.into(),
            pods: 4,
            state,
            reason: reason.into(),
            message: "why".into(),
            nodes: vec![],
            groups: vec![],
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + s).unwrap()
    }

    fn summary(cs: &[Condition]) -> Vec<(String, String, String, i64)> {
        cs.iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.last_transition_time.0.as_second() - 1_790_000_000,
                )
            })
            .collect()
    }

    fn row(t: &str, s: &str, r: &str, at: i64) -> (String, String, String, i64) {
        (t.into(), s.into(), r.into(), at)
    }

    #[test]
    fn a_request_goes_accepted_provisioning_provisioned_booking_expired_with_one_write_each() {
        let scaling = outcome(RequestState::ScalingUp, "CapacityIsBeingProvisioned");
        let c1 = next_conditions(&scaling, &[], Some(1), at(0)).expect("a new request is written");
        assert_eq!(
            summary(&c1),
            vec![
                row("Accepted", "True", "Accepted", 0),
                row("Provisioned", "False", "CapacityIsBeingProvisioned", 0)
            ]
        );
        assert_eq!(c1[1].observed_generation, Some(1));
        // The nodes are on their way: same status and reason, nothing to write.
        let waiting = outcome(RequestState::Provisioning, "CapacityIsBeingProvisioned");
        assert_eq!(next_conditions(&waiting, &c1, Some(1), at(30)), None);
        // Provisioned: the status moves, and its transition time with it.
        let done = outcome(RequestState::Provisioned, "CapacityIsProvisioned");
        let c2 = next_conditions(&done, &c1, Some(1), at(60)).expect("provisioned is written");
        assert_eq!(
            summary(&c2),
            vec![
                row("Accepted", "True", "Accepted", 0),
                row("Provisioned", "True", "CapacityIsProvisioned", 60)
            ]
        );
        // Booked: nothing changes while the booking lasts.
        assert_eq!(next_conditions(&outcome(RequestState::Booked, "Booked"), &c2, Some(1), at(90)), None);
        let expired = outcome(RequestState::BookingExpired, "CapacityReservationTimeExpired");
        let c3 = next_conditions(&expired, &c2, Some(1), at(660)).expect("expiry is written");
        assert_eq!(summary(&c3)[2], row("BookingExpired", "True", "CapacityReservationTimeExpired", 660));
        assert_eq!(summary(&c3)[1], row("Provisioned", "True", "CapacityIsProvisioned", 60));
    }

    #[test]
    fn a_reason_change_is_written_without_moving_the_transition_time_and_ignored_is_never_written() {
        let scaling = outcome(RequestState::ScalingUp, "CapacityIsBeingProvisioned");
        let c1 = next_conditions(&scaling, &[], None, at(0)).unwrap();
        let not_found = outcome(RequestState::NotFound, "CapacityIsNotFound");
        let c2 = next_conditions(&not_found, &c1, None, at(30)).expect("the reason changed");
        assert_eq!(summary(&c2)[1], row("Provisioned", "False", "CapacityIsNotFound", 0));
        assert_eq!(c2[1].message, "why");
        assert_eq!(next_conditions(&outcome(RequestState::Ignored, ""), &[], None, at(0)), None);
        let failed = next_conditions(&outcome(RequestState::Failed, "Expired"), &c2, None, at(60)).unwrap();
        assert_eq!(summary(&failed)[2], row("Failed", "True", "Expired", 60));
    }
}
