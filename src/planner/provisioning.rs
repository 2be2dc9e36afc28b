//! ProvisioningRequests in the plan.
//!
//! A request stands for pods that do not exist yet, so the planner plans stand-ins: one pending
//! pod per pod of each pod set, converted from its PodTemplate like any pod. What happens to
//! them depends on the class and the request's lifecycle, as Cluster Autoscaler does it:
//! - booked (`Provisioned` and within its booking time): the stand-ins of the pods that have not
//!   come yet hold their room before any pending pod is placed, are never scaled for, and keep
//!   their nodes from scale-down;
//! - `check-capacity`: after pending pods have taken what fits, the stand-ins must all fit Ready
//!   nodes (in one topology domain when the template asks for one), or it is not found (asked
//!   again every pass; failed when it says `noRetry`);
//! - `best-effort-atomic-scale-up`: the stand-ins are one gang, planned like pending pods (the
//!   same placement, tenancy quotas and DRA claims), so they fit existing capacity or grow one
//!   group all or nothing, or are not found like check-capacity;
//! - requests past their expiry or booking, or that cannot be served (a missing PodTemplate),
//!   are decided without placement.
//!
//! Pods that consume a request (its annotation) wait for it while it is not provisioned: they
//! neither take capacity nor trigger a scale-up of their own.

use super::cluster::{NodeInfo, Origin};
use super::plan::{Plan, RequestOutcome, RequestState};
use super::scale_up::{place_unit, Among};
use super::{PlanInput, Unit};
use crate::model::provisioning::{ProvisioningClass, ProvisioningRequest, RequestPhase};
use crate::model::{Workload, WorkloadId};
use crate::scheduler::Placer;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Condition reasons, as Cluster Autoscaler writes them (Kueue reads the conditions' types and
/// passes reasons and messages on to users).
pub mod reasons {
    /// The pods fit capacity that exists.
    pub const CAPACITY_FOUND: &str = "CapacityIsFound";
    /// They do not fit now (and, atomic, no scale-up can hold them all).
    pub const CAPACITY_NOT_FOUND: &str = "CapacityIsNotFound";
    /// atomic: the capacity grown for it is running.
    pub const CAPACITY_PROVISIONED: &str = "CapacityIsProvisioned";
    /// atomic: a scale-up for it is under way (gpuscale's: Cluster Autoscaler says Provisioned
    /// as soon as it asks the cloud; gpuscale waits until the nodes are Ready).
    pub const CAPACITY_PROVISIONING: &str = "CapacityIsBeingProvisioned";
    /// The pods cannot be built from its PodTemplates.
    pub const FAILED_TO_CREATE_PODS: &str = "FailedToCreatePods";
    /// Not provisioned within its validity.
    pub const EXPIRED: &str = "Expired";
    /// The booking ran out.
    pub const BOOKING_TIME_EXPIRED: &str = "CapacityReservationTimeExpired";
    /// Every pod of it is scheduled: nothing left to hold.
    pub const BOOKING_CONSUMED: &str = "CapacityBookingConsumed";
    /// Booked and held (gpuscale's; not written).
    pub const BOOKED: &str = "CapacityIsBooked";
    /// A class gpuscale does not serve (not written).
    pub const UNKNOWN_CLASS: &str = "UnknownProvisioningClass";
}

/// What the plan does with one request.
#[derive(Debug, Clone)]
pub(crate) enum Role {
    /// Decided without placement.
    Settled(RequestState, &'static str, String),
    /// Booked for `left` more seconds: its stand-ins hold room and are never scaled for.
    Booked { left: i64, consumers: usize },
    /// check-capacity: its stand-ins must fit Ready nodes now.
    Check,
    /// best-effort-atomic-scale-up: its stand-ins are a gang planned like pending pods.
    Atomic,
}

/// The requests' stand-ins in the expanded workloads, and what to do with each request.
#[derive(Debug, Default)]
pub(crate) struct Expansion {
    /// Index of the first stand-in in the workloads.
    pub first: usize,
    /// The request of each stand-in (by index from `first`).
    owner: Vec<usize>,
    /// One role per request, in the snapshot's order.
    roles: Vec<Role>,
    /// Stand-ins the pending-pod steps leave alone (booked and check-capacity ones).
    reserved: HashSet<WorkloadId>,
    /// Requests whose booking holds room for their pods.
    booked: BTreeSet<String>,
}

/// What the request steps found while planning.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// check-capacity results per request: why not, when they do not fit.
    checks: BTreeMap<usize, Result<(), String>>,
    /// Booked stand-ins that no longer fit anywhere, per request.
    unheld: BTreeMap<usize, usize>,
}

impl Expansion {
    /// Whether the workload is a stand-in the pending-pod steps must leave alone.
    pub fn reserved(&self, w: &Workload) -> bool {
        !self.reserved.is_empty() && self.reserved.contains(&w.id)
    }

    /// Whether the pod consumes a booked request: the booked room is its own, so it is placed
    /// before other pending pods of any priority.
    pub fn uses_booking(&self, w: &Workload) -> bool {
        !self.booked.is_empty() && w.consumes.as_ref().is_some_and(|r| self.booked.contains(r))
    }

    /// Whether the snapshot index is a stand-in.
    pub fn is_stand_in(&self, wi: usize) -> bool {
        !self.owner.is_empty() && wi >= self.first
    }

    fn stand_ins_of(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        self.owner.iter().enumerate().filter(move |(_, o)| **o == r).map(move |(i, _)| self.first + i)
    }
}

/// The gang id of a request's stand-ins.
fn gang_of(request: &ProvisioningRequest) -> String {
    format!("ProvisioningRequest {}", request.id)
}

/// The input with the requests' stand-ins appended, and pods that consume an unprovisioned
/// request held back; `None` when there are no requests.
pub(crate) fn expand(input: &PlanInput, now: Option<i64>) -> Option<(PlanInput, Expansion)> {
    let requests = &input.snapshot.provisioning_requests;
    if requests.is_empty() {
        return None;
    }
    let now = now.unwrap_or_else(|| {
        let pods = input.snapshot.workloads.iter().filter_map(|w| w.created_at);
        pods.chain(requests.iter().filter_map(|r| r.created_at)).max().unwrap_or(0)
    });
    let mut consumers: BTreeMap<&str, Vec<&Workload>> = BTreeMap::new();
    for w in &input.snapshot.workloads {
        if let Some(r) = &w.consumes {
            consumers.entry(r.as_str()).or_default().push(w);
        }
    }
    let mut expanded = input.clone();
    let mut ex = Expansion { first: input.snapshot.workloads.len(), ..Default::default() };
    let mut waiting: BTreeMap<&str, String> = BTreeMap::new();
    for (ri, r) in requests.iter().enumerate() {
        let came = consumers.get(r.id.as_str()).map_or(&[][..], Vec::as_slice);
        let role = role_of(r, now, came);
        let count = |set: &crate::model::provisioning::PodSet| set.count as usize;
        let stand_ins: Vec<(usize, usize)> = match &role {
            Role::Settled(..) => Vec::new(),
            Role::Booked { .. } => still_to_come(r, came),
            Role::Check | Role::Atomic => {
                r.pod_sets.iter().enumerate().map(|(s, set)| (s, count(set))).collect()
            }
        };
        if matches!(role, Role::Booked { .. }) {
            ex.booked.insert(r.id.clone());
        } else if r.class().is_some() {
            waiting
                .insert(r.id.as_str(), format!("waits for ProvisioningRequest {} to be provisioned", r.id));
        }
        for (s, n) in stand_ins {
            let set = &r.pod_sets[s];
            for i in 0..n {
                let mut w = set.pod.clone();
                w.id = format!("{}/{}-{i}", r.id, set.template);
                w.created_at = r.created_at;
                w.node_name = None;
                w.consumes = None;
                match role {
                    Role::Booked { .. } => (w.gang, w.gang_min_members) = (None, None),
                    _ => (w.gang, w.gang_min_members) = (Some(gang_of(r)), None),
                }
                if matches!(role, Role::Booked { .. } | Role::Check) {
                    ex.reserved.insert(w.id.clone());
                }
                ex.owner.push(ri);
                expanded.snapshot.workloads.push(w);
            }
        }
        ex.roles.push(role);
    }
    // Its pods wait for the request; pods that consume a request nobody serves are left alone.
    for w in expanded.snapshot.workloads[..ex.first].iter_mut() {
        if let (None, Some(reason)) = (&w.node_name, w.consumes.as_deref().and_then(|r| waiting.get(r))) {
            w.volume_blocked.get_or_insert_with(|| reason.clone());
        }
    }
    Some((expanded, ex))
}

/// The pods of a booked request that have not come yet, as (pod set, count): each consumer
/// counts against the pod set it looks like (same requests and GPUs), else the first with room.
fn still_to_come(r: &ProvisioningRequest, came: &[&Workload]) -> Vec<(usize, usize)> {
    let mut left: Vec<usize> = r.pod_sets.iter().map(|s| s.count as usize).collect();
    let mut unmatched = 0;
    for c in came {
        let like = r
            .pod_sets
            .iter()
            .enumerate()
            .position(|(s, set)| left[s] > 0 && set.pod.requests == c.requests && set.pod.gpu == c.gpu);
        match like {
            Some(s) => left[s] -= 1,
            None => unmatched += 1,
        }
    }
    for l in left.iter_mut() {
        let taken = (*l).min(unmatched);
        *l -= taken;
        unmatched -= taken;
    }
    left.into_iter().enumerate().filter(|(_, n)| *n > 0).collect()
}

fn role_of(r: &ProvisioningRequest, now: i64, came: &[&Workload]) -> Role {
    let Some(class) = r.class() else {
        return Role::Settled(
            RequestState::Ignored,
            reasons::UNKNOWN_CLASS,
            format!("class {} is not one gpuscale serves; left to whoever serves it", r.class_name),
        );
    };
    let consumers = came.len();
    match r.phase {
        RequestPhase::Finished => Role::Settled(RequestState::Ignored, "", "finished".into()),
        RequestPhase::Provisioned { since } => {
            let until = since.saturating_add(r.booking_seconds);
            let scheduled = came.iter().filter(|w| w.node_name.is_some()).count();
            if scheduled >= r.pod_count() as usize {
                Role::Settled(
                    RequestState::BookingExpired,
                    reasons::BOOKING_CONSUMED,
                    format!("all {} of its pod(s) are scheduled; the booking is used", r.pod_count()),
                )
            } else if now >= until {
                Role::Settled(
                    RequestState::BookingExpired,
                    reasons::BOOKING_TIME_EXPIRED,
                    format!(
                        "capacity was booked for {} s after it was provisioned; {scheduled} of its {} pod(s) were scheduled",
                        r.booking_seconds,
                        r.pod_count()
                    ),
                )
            } else {
                Role::Booked { left: until - now, consumers }
            }
        }
        RequestPhase::Open => {
            if let Some(why) = &r.invalid {
                return Role::Settled(RequestState::Failed, reasons::FAILED_TO_CREATE_PODS, why.clone());
            }
            if r.created_at.is_some_and(|c| now >= c.saturating_add(r.expiry_seconds)) {
                return Role::Settled(
                    RequestState::Failed,
                    reasons::EXPIRED,
                    format!("not provisioned within {} s of its creation", r.expiry_seconds),
                );
            }
            match class {
                ProvisioningClass::CheckCapacity => Role::Check,
                ProvisioningClass::AtomicScaleUp => Role::Atomic,
            }
        }
    }
}

/// Places booked stand-ins first: the room their pods will take is not there for others.
pub(crate) fn hold_bookings(
    ex: &Expansion,
    found: &mut Found,
    placer: &mut Placer<'_>,
    info: &mut [NodeInfo],
    workloads: &[Workload],
) {
    for (i, &ri) in ex.owner.iter().enumerate() {
        if !matches!(ex.roles[ri], Role::Booked { .. }) {
            continue;
        }
        let wi = ex.first + i;
        let unit = Unit { pods: vec![wi], required: 1, topology_key: None, gang: None };
        match place_unit(placer, workloads, &unit, Among::All) {
            Some(placed) => {
                for (wi, p) in placed {
                    info[p.node].pods.push((wi, p.devices));
                }
            }
            None => *found.unheld.entry(ri).or_default() += 1,
        }
    }
}

/// check-capacity: each request's stand-ins all fit Ready nodes (booking them in this plan), or
/// the request fails with why.
pub(crate) fn check_capacity(
    ex: &Expansion,
    found: &mut Found,
    placer: &mut Placer<'_>,
    info: &mut [NodeInfo],
    workloads: &[Workload],
) {
    let ready: Vec<bool> = info.iter().map(|n| n.origin == Origin::Ready).collect();
    for ri in 0..ex.roles.len() {
        if !matches!(ex.roles[ri], Role::Check) {
            continue;
        }
        let pods: Vec<usize> = ex.stand_ins_of(ri).collect();
        let total = pods.len();
        let topology_key = pods.first().and_then(|&wi| workloads[wi].gang_topology_key.clone());
        let unit = Unit { pods, required: total, topology_key, gang: None };
        let result = match place_unit(
            placer,
            workloads,
            &unit,
            Among::Where(&|n| ready.get(n).copied().unwrap_or(false)),
        ) {
            Some(placed) => {
                for (wi, p) in placed {
                    info[p.node].pods.push((wi, p.devices));
                }
                Ok(())
            }
            None => {
                // How many would fit one by one, for the message.
                let mut fits = 0;
                for &wi in &unit.pods {
                    let single = Unit { pods: vec![wi], required: 1, topology_key: None, gang: None };
                    if let Some(placed) = place_unit(
                        placer,
                        workloads,
                        &single,
                        Among::Where(&|n| ready.get(n).copied().unwrap_or(false)),
                    ) {
                        fits += 1;
                        for (wi, p) in placed {
                            placer.release(&workloads[wi], &p);
                        }
                    }
                }
                Err(format!(
                    "{fits} of its {total} pod(s) fit the free capacity of Ready nodes{}",
                    unit.topology_key.as_ref().map(|k| format!(" (all in one {k})")).unwrap_or_default()
                ))
            }
        };
        found.checks.insert(ri, result);
    }
}

/// The requests' outcomes into the plan, and their stand-ins out of its pod lists.
pub(crate) fn report(
    plan: &mut Plan,
    ex: &Expansion,
    found: &Found,
    workloads: &[Workload],
    requests: &[ProvisioningRequest],
) {
    let stand_in_ids: BTreeMap<&str, usize> =
        workloads[ex.first..].iter().zip(&ex.owner).map(|(w, &r)| (w.id.as_str(), r)).collect();
    // Where each request's stand-ins are.
    let mut nodes: BTreeMap<usize, Vec<(String, bool)>> = BTreeMap::new();
    plan.placements.retain(|p| match stand_in_ids.get(p.pod.as_str()) {
        Some(&r) => {
            nodes.entry(r).or_default().push((p.node.clone(), p.node_in_flight));
            false
        }
        None => true,
    });
    let mut failed: BTreeMap<usize, String> = BTreeMap::new();
    plan.unschedulable.retain(|u| match stand_in_ids.get(u.pod.as_str()) {
        Some(&r) => {
            failed.entry(r).or_insert_with(|| u.reason.clone());
            false
        }
        None => true,
    });
    let mut grown: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for su in &mut plan.scale_ups {
        let before = su.pods.len();
        let mut served: BTreeSet<usize> = BTreeSet::new();
        su.pods.retain(|p| match stand_in_ids.get(p.as_str()) {
            Some(&r) => {
                served.insert(r);
                false
            }
            None => true,
        });
        for &r in &served {
            su.requests.push(requests[r].id.clone());
            grown.entry(r).or_default().push(format!("{} +{}", su.group, su.to - su.from));
        }
        if !served.is_empty() {
            su.reason = su.reason.replacen(
                &format!("{before} pending pod(s)"),
                &format!(
                    "{} pod(s) of ProvisioningRequest {}{}",
                    before - su.pods.len(),
                    su.requests.join(", "),
                    if su.pods.is_empty() {
                        String::new()
                    } else {
                        format!(" and {} pending pod(s)", su.pods.len())
                    }
                ),
                1,
            );
        }
    }
    for d in &mut plan.scale_downs {
        d.moves.retain(|(p, _)| !stand_in_ids.contains_key(p.as_str()));
    }
    for r in &mut plan.replacements {
        r.pods.retain(|p| !stand_in_ids.contains_key(p.as_str()));
    }

    for (ri, (r, role)) in requests.iter().zip(&ex.roles).enumerate() {
        let on: Vec<String> = summarise(nodes.get(&ri));
        let (state, reason, message) = match role {
            Role::Settled(RequestState::Ignored, "", _) => continue,
            Role::Settled(state, reason, message) => (*state, *reason, message.clone()),
            Role::Booked { left, consumers } => {
                let unheld = found.unheld.get(&ri).copied().unwrap_or(0);
                let mut message = format!(
                    "booked for {} more; {consumers} of its {} pod(s) came",
                    crate::model::telemetry::format_duration((*left).max(0) as u64),
                    r.pod_count()
                );
                if unheld > 0 {
                    message.push_str(&format!("; {unheld} booked pod(s) no longer fit the cluster"));
                }
                (RequestState::Booked, reasons::BOOKED, message)
            }
            Role::Check => match found.checks.get(&ri) {
                Some(Ok(())) => (
                    RequestState::Provisioned,
                    reasons::CAPACITY_FOUND,
                    format!("its {} pod(s) fit Ready nodes now", r.pod_count()),
                ),
                Some(Err(why)) => (not_found(r), reasons::CAPACITY_NOT_FOUND, why.clone()),
                None => continue,
            },
            Role::Atomic => {
                if let Some(why) = failed.get(&ri) {
                    (not_found(r), reasons::CAPACITY_NOT_FOUND, why.clone())
                } else if grown.contains_key(&ri) {
                    (
                        RequestState::ScalingUp,
                        reasons::CAPACITY_PROVISIONING,
                        format!("new nodes for its {} pod(s), all or nothing", r.pod_count()),
                    )
                } else if nodes.get(&ri).is_some_and(|n| n.iter().any(|(_, in_flight)| *in_flight)) {
                    (
                        RequestState::Provisioning,
                        reasons::CAPACITY_PROVISIONING,
                        format!("its {} pod(s) fit nodes on their way", r.pod_count()),
                    )
                } else if r.waiting_reason.as_deref() == Some(reasons::CAPACITY_PROVISIONING) {
                    (
                        RequestState::Provisioned,
                        reasons::CAPACITY_PROVISIONED,
                        format!("the nodes grown for its {} pod(s) are Ready", r.pod_count()),
                    )
                } else {
                    (
                        RequestState::Provisioned,
                        reasons::CAPACITY_FOUND,
                        format!("its {} pod(s) fit Ready nodes", r.pod_count()),
                    )
                }
            }
        };
        plan.provisioning_requests.push(RequestOutcome {
            request: r.id.clone(),
            class: r.class_name.clone(),
            pods: r.pod_count(),
            state,
            reason: reason.to_string(),
            message,
            nodes: on,
            groups: grown.remove(&ri).unwrap_or_default(),
        });
    }
}

/// Capacity not found: asked again every pass, as Cluster Autoscaler does (`Provisioned=False`,
/// so Kueue keeps waiting instead of spending its retries), unless the request says `noRetry`.
fn not_found(r: &ProvisioningRequest) -> RequestState {
    if r.no_retry {
        RequestState::Failed
    } else {
        RequestState::NotFound
    }
}

/// `node (xN)` per node, in name order.
fn summarise(nodes: Option<&Vec<(String, bool)>>) -> Vec<String> {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for (n, _) in nodes.into_iter().flatten() {
        *count.entry(n.as_str()).or_default() += 1;
    }
    count.into_iter().map(|(n, c)| if c == 1 { n.to_string() } else { format!("{n} (x{c})") }).collect()
}
