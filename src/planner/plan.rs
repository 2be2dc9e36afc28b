//! The output of planning: actions with their reasons, and what they cost.

use crate::model::mig::MigPlacement;
use crate::model::telemetry::format_duration;
use crate::model::{dollars, DeviceAssignment, MicroDollarsPerHour};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt::Write;

/// A pending pod that fits capacity that exists or is already on its way.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPlacement {
    /// Pod `namespace/name`.
    pub pod: String,
    /// Node it fits on.
    pub node: String,
    /// Devices it would get.
    pub devices: DeviceAssignment,
    /// The node is still booting or waiting for its GPUs to be advertised.
    pub node_in_flight: bool,
}

/// Grow a node group.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleUp {
    /// Node group id.
    pub group: String,
    /// Instance type.
    pub instance_type: String,
    /// Current target size.
    pub from: u32,
    /// New target size (absolute, so retries are idempotent).
    pub to: u32,
    /// Pending pods the new nodes are for.
    pub pods: Vec<String>,
    /// ProvisioningRequests the new nodes are for (all or nothing, like a gang).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// Why this group.
    pub reason: String,
    /// Added cost per hour (decimal dollars in JSON and YAML).
    #[serde(rename = "costPerHourUsd", serialize_with = "usd_value")]
    pub cost_per_hour: MicroDollarsPerHour,
}

/// Remove one node (drain it, then delete its instance).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleDown {
    /// Node name.
    pub node: String,
    /// Node group id.
    pub group: String,
    /// Cloud instance id, when known.
    pub instance: Option<String>,
    /// Pods that move, with the node each would move to; in JSON and YAML, objects
    /// `{pod, toNode}`.
    #[serde(serialize_with = "moves_value")]
    pub moves: Vec<(String, String)>,
    /// Why.
    pub reason: String,
    /// Saved cost per hour.
    #[serde(rename = "savingPerHourUsd", serialize_with = "usd_value")]
    pub saving_per_hour: MicroDollarsPerHour,
}

/// Replace a node by a cheaper one that holds all its pods.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replace {
    /// Node to remove.
    pub node: String,
    /// Its group.
    pub group: String,
    /// Group to add one node to.
    pub replacement_group: String,
    /// Pods that move to the replacement.
    pub pods: Vec<String>,
    /// Saved cost per hour.
    #[serde(rename = "savingPerHourUsd", serialize_with = "usd_value")]
    pub saving_per_hour: MicroDollarsPerHour,
}

/// A pending pod no action can serve.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unschedulable {
    /// Pod `namespace/name`.
    pub pod: String,
    /// Why (the `NotTriggerScaleUp` reason).
    pub reason: String,
}

/// Evict lower-priority or borrowing pods so that a pending pod runs now instead of waiting for
/// (or paying for) a scale-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preempt {
    /// Pending pod `namespace/name`.
    pub pod: String,
    /// Node it runs on once the victims are gone.
    pub node: String,
    /// Pods to evict.
    pub victims: Vec<String>,
    /// Why eviction and not scale-up (costs compared), or why reclaim.
    pub reason: String,
    /// $/h of the scale-up alternative, when there was one.
    #[serde(rename = "alternativeCostPerHourUsd", serialize_with = "usd_option")]
    pub alternative_cost: Option<MicroDollarsPerHour>,
}

/// A node that stays although it is under-used, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    /// Node name.
    pub node: String,
    /// Why it is not removed.
    pub reason: String,
}

/// A GPU that pods hold but the node's agent measured idle for longer than the idle window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleGpu {
    /// Node name.
    pub node: String,
    /// GPU index on the node.
    pub gpu: u8,
    /// GPU UUID.
    pub uuid: String,
    /// Pods holding it.
    pub pods: Vec<String>,
    /// Seconds it has been idle, as of the agent's last sample.
    pub idle_for: u64,
    /// Every holder opted in to reclaim, so the GPU counted as free for scale-down.
    pub reclaimable: bool,
    /// Its share of the node's price.
    #[serde(rename = "costPerHourUsd", serialize_with = "usd_value")]
    pub cost_per_hour: MicroDollarsPerHour,
}

/// Re-partition MIG GPUs of an existing node instead of adding a node for pending MIG pods.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigRepartition {
    /// Node name.
    pub node: String,
    /// GPUs that change.
    pub gpus: Vec<u8>,
    /// Their current layouts (empty: MIG off).
    pub from_layout: Vec<Vec<MigPlacement>>,
    /// Their new layouts.
    pub to_layout: Vec<Vec<MigPlacement>>,
    /// Running MIG instances on the changed GPUs, restarted by the re-partition.
    pub disrupted_instances: u32,
    /// Value of `nvidia.com/mig.config` for NVIDIA's MIG manager.
    pub mig_config_label: String,
    /// The mig-parted `mig-configs` entry that defines the label (stock `all-*` names are in
    /// NVIDIA's default config already).
    pub mig_parted_config: String,
    /// Pending pods the new instances are for.
    pub pods: Vec<String>,
    /// Price of the scale-up this avoids.
    #[serde(rename = "savingPerHourUsd", serialize_with = "usd_value")]
    pub saving_per_hour: MicroDollarsPerHour,
}

/// What a ProvisioningRequest is in this plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RequestState {
    /// Its pods fit Ready nodes now: the capacity is there (and booked from now).
    Provisioned,
    /// Provisioned before and within its booking: its capacity is held for its pods.
    Booked,
    /// Its pods fit nodes still on their way (a scale-up for it under way).
    Provisioning,
    /// This plan grows node groups for it.
    ScalingUp,
    /// Its pods do not fit now (the message says why): asked again every pass.
    NotFound,
    /// It cannot be served (the reason says why); Kueue retries with a new request.
    Failed,
    /// Its booking ran out before its pods came: the capacity is released.
    BookingExpired,
    /// Its class is not one gpuscale serves: left to whoever serves it.
    Ignored,
}

impl RequestState {
    /// Every state, for reports that show zeros.
    pub const ALL: [RequestState; 8] = [
        Self::Provisioned,
        Self::Booked,
        Self::Provisioning,
        Self::ScalingUp,
        Self::NotFound,
        Self::Failed,
        Self::BookingExpired,
        Self::Ignored,
    ];

    /// The state as plans and metrics name it (`scalingUp`).
    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }
}

/// What a ProvisioningRequest gets from this plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestOutcome {
    /// `namespace/name`.
    pub request: String,
    /// `spec.provisioningClassName`.
    pub class: String,
    /// Pods it asks for.
    pub pods: u32,
    /// Its state.
    pub state: RequestState,
    /// The condition reason (Cluster Autoscaler's words, which Kueue reads).
    pub reason: String,
    /// Why, for people.
    pub message: String,
    /// Nodes its pods fit on (with how many), existing or on their way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Groups this plan grows for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

pub use crate::shown::shown;

/// The scaling plan for one snapshot.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Pending pods that fit existing or in-flight capacity.
    pub placements: Vec<PendingPlacement>,
    /// Groups to grow.
    pub scale_ups: Vec<ScaleUp>,
    /// Nodes to remove.
    pub scale_downs: Vec<ScaleDown>,
    /// Nodes to replace by cheaper ones.
    pub replacements: Vec<Replace>,
    /// Pending pods nothing can serve.
    pub unschedulable: Vec<Unschedulable>,
    /// Evictions that make room for higher-priority or reclaiming pods.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preemptions: Vec<Preempt>,
    /// Under-used nodes that stay, with the reason.
    pub kept: Vec<Kept>,
    /// MIG re-partitions that serve pending pods instead of a scale-up.
    pub mig_repartitions: Vec<MigRepartition>,
    /// Allocated GPUs measured idle for longer than the idle window.
    pub idle_gpus: Vec<IdleGpu>,
    /// ProvisioningRequests and what each gets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub provisioning_requests: Vec<RequestOutcome>,
    /// Cost per hour of the node groups now (target sizes).
    #[serde(rename = "costBeforePerHourUsd", serialize_with = "usd_value")]
    pub cost_before: MicroDollarsPerHour,
    /// Cost per hour after the plan.
    #[serde(rename = "costAfterPerHourUsd", serialize_with = "usd_value")]
    pub cost_after: MicroDollarsPerHour,
    /// Non-fatal notes about the input.
    pub warnings: Vec<String>,
}

/// Money in JSON and YAML: decimal dollars (the field name says the unit), rounded to the
/// micro-dollar the planner counts in.
fn usd_value<S: serde::Serializer>(micro: &MicroDollarsPerHour, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(*micro as f64 / 1e6)
}

fn usd_option<S: serde::Serializer>(micro: &Option<MicroDollarsPerHour>, s: S) -> Result<S::Ok, S::Error> {
    match micro {
        Some(m) => usd_value(m, s),
        None => s.serialize_none(),
    }
}

/// Pod moves as named fields: `{"pod": "ml/web-0", "toNode": "ip-10-0-1-2"}`.
fn moves_value<S: serde::Serializer>(moves: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Move<'a> {
        pod: &'a str,
        to_node: &'a str,
    }
    s.collect_seq(moves.iter().map(|(pod, to_node)| Move { pod, to_node }))
}

fn usd(micro: MicroDollarsPerHour) -> String {
    format!("${:.2}/h", micro as f64 / dollars(1.0) as f64)
}

impl Plan {
    /// True when the plan changes nothing in the cloud.
    pub fn is_noop(&self) -> bool {
        self.scale_ups.is_empty() && self.scale_downs.is_empty() && self.replacements.is_empty()
    }

    /// One line per action, sorted, for people.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let list = |pods: &[String]| {
            let pods: Vec<Cow<str>> = pods.iter().map(|p| shown(p)).collect();
            if pods.len() <= 4 {
                pods.join(", ")
            } else {
                format!("{}, … (+{} more)", pods[..3].join(", "), pods.len() - 3)
            }
        };
        for a in &self.scale_ups {
            let _ = writeln!(
                out,
                "SCALE-UP      {:<28} {} → {} (+{}) {}  +{}  for {}\n              reason: {}",
                shown(&a.group),
                a.from,
                a.to,
                a.to - a.from,
                shown(&a.instance_type),
                usd(a.cost_per_hour),
                match (a.pods.is_empty(), a.requests.is_empty()) {
                    (false, true) => format!("{} pod(s): {}", a.pods.len(), list(&a.pods)),
                    (true, false) => format!("ProvisioningRequest {}", list(&a.requests)),
                    _ => format!(
                        "{} pod(s): {}; ProvisioningRequest {}",
                        a.pods.len(),
                        list(&a.pods),
                        list(&a.requests)
                    ),
                },
                shown(&a.reason)
            );
        }
        for a in &self.scale_downs {
            let moves: Vec<String> =
                a.moves.iter().map(|(p, n)| format!("{} → {}", shown(p), shown(n))).collect();
            let _ = writeln!(
                out,
                "SCALE-DOWN    {:<28} node {}  -{}  {}{}",
                shown(&a.group),
                shown(&a.node),
                usd(a.saving_per_hour),
                shown(&a.reason),
                if moves.is_empty() { String::new() } else { format!("; moves {}", list(&moves)) }
            );
        }
        for a in &self.replacements {
            let _ = writeln!(
                out,
                "REPLACE       {:<28} node {} by 1 node of {}  -{}  ({} pod(s) move)",
                shown(&a.group),
                shown(&a.node),
                shown(&a.replacement_group),
                usd(a.saving_per_hour),
                a.pods.len()
            );
        }
        for r in &self.mig_repartitions {
            let changes: Vec<String> = r
                .gpus
                .iter()
                .zip(r.from_layout.iter().zip(&r.to_layout))
                .map(|(g, (from, to))| {
                    format!(
                        "GPU {g}: {} → {}",
                        super::mig_advice::layout_text(from),
                        super::mig_advice::layout_text(to)
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "MIG-REPARTITION {:<26} nvidia.com/mig.config={}  -{} (no scale-up)  for {} pod(s): {}\n              {}{}",
                shown(&r.node),
                shown(&r.mig_config_label),
                usd(r.saving_per_hour),
                r.pods.len(),
                list(&r.pods),
                changes.join("; "),
                if r.disrupted_instances > 0 {
                    format!("; restarts {} running instance(s)", r.disrupted_instances)
                } else {
                    String::new()
                }
            );
            if !r.mig_config_label.starts_with("all-") {
                // A custom name: the MIG manager's config map needs its entry.
                let _ = writeln!(out, "              mig-parted entry:");
                for line in r.mig_parted_config.lines() {
                    let _ = writeln!(out, "                {}", shown(line));
                }
            }
        }
        for p in &self.preemptions {
            let _ = writeln!(
                out,
                "PREEMPT       {:<28} on {} evicting {}{}\n              reason: {}",
                shown(&p.pod),
                shown(&p.node),
                list(&p.victims),
                p.alternative_cost.map(|c| format!(" (scale-up alternative {})", usd(c))).unwrap_or_default(),
                shown(&p.reason)
            );
        }
        for r in &self.provisioning_requests {
            let _ = writeln!(
                out,
                "PROVISIONING  {:<28} {} ({}, {} pod(s)): {}{}{}",
                shown(&r.request),
                r.state.name(),
                shown(r.class.split('.').next().unwrap_or_default()),
                r.pods,
                shown(&r.message),
                if r.groups.is_empty() { String::new() } else { format!("; grows {}", list(&r.groups)) },
                if r.nodes.is_empty() { String::new() } else { format!("; on {}", list(&r.nodes)) },
            );
        }
        for p in &self.placements {
            let _ = writeln!(
                out,
                "FITS          {:<28} on {}{}",
                shown(&p.pod),
                shown(&p.node),
                if p.node_in_flight { " (in flight)" } else { "" }
            );
        }
        for u in &self.unschedulable {
            let _ = writeln!(out, "UNSCHEDULABLE {:<28} {}", shown(&u.pod), shown(&u.reason));
        }
        for k in &self.kept {
            let _ = writeln!(out, "KEEP          {:<28} {}", shown(&k.node), shown(&k.reason));
        }
        for i in &self.idle_gpus {
            let _ = writeln!(
                out,
                "IDLE-GPU      {:<28} GPU {} idle {}  {}  held by {}{}",
                shown(&i.node),
                i.gpu,
                format_duration(i.idle_for),
                usd(i.cost_per_hour),
                list(&i.pods),
                if i.reclaimable { " (reclaim opted in)" } else { "" }
            );
        }
        for w in &self.warnings {
            let _ = writeln!(out, "WARNING       {}", shown(w));
        }
        if self.is_noop()
            && self.placements.is_empty()
            && self.unschedulable.is_empty()
            && self.mig_repartitions.is_empty()
            && self.preemptions.is_empty()
            && self.provisioning_requests.is_empty()
        {
            let _ = writeln!(out, "nothing to do");
        }
        let _ = writeln!(
            out,
            "COST          {} → {} ({}{})",
            usd(self.cost_before),
            usd(self.cost_after),
            if self.cost_after >= self.cost_before { "+" } else { "-" },
            usd(self.cost_after.abs_diff(self.cost_before))
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name from the snapshot cannot forge a plan line or send terminal escapes (issue #28).
    #[test]
    fn control_characters_in_names_are_escaped_in_the_table() {
        let plan = Plan {
            unschedulable: vec![Unschedulable {
                pod: "ml/evil\nSCALE-UP      prod/gpu 0 → 100".into(),
                reason: "\u{1b}[2Jcleared \u{202e}reversed".into(),
            }],
            ..Default::default()
        };
        let table = plan.to_table();
        assert!(!table.contains('\u{1b}') && !table.contains('\u{202e}'), "{table:?}");
        assert!(table.lines().all(|l| !l.starts_with("SCALE-UP")), "{table}");
        assert!(table.contains(r"ml/evil\nSCALE-UP") && table.contains(r"\u{1b}[2Jcleared"), "{table}");
        assert_eq!(shown("ml/web-0"), Cow::Borrowed("ml/web-0"));
    }
}
