//! Cluster-wide default topology spread: kube-scheduler's PodTopologySpread `defaultConstraints`
//! with `defaultingType: List`, which it applies to every pod that declares no constraint of its
//! own and belongs to a controller. A cluster that sets `DoNotSchedule` defaults refuses pods
//! the planner would otherwise place, so they are configured here the same way
//! (`planner.defaultSpreadConstraints`). kube-scheduler's built-in `System` defaults only
//! score, and are left out.

use crate::model::{LabelSelector, OwnerKind, SpreadConstraint, Workload};
use serde::{Deserialize, Serialize};

/// One default constraint, as `PodTopologySpreadArgs.defaultConstraints` has it (no selector:
/// kube-scheduler derives it from the pod's controller).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultSpreadConstraint {
    /// `maxSkew`.
    pub max_skew: u32,
    /// Node label whose values are the domains.
    pub topology_key: String,
    /// `DoNotSchedule` filters, `ScheduleAnyway` only breaks ties.
    pub when_unsatisfiable: WhenUnsatisfiable,
}

/// What a constraint does when it cannot be met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WhenUnsatisfiable {
    /// The pod is not scheduled.
    DoNotSchedule,
    /// The pod is scheduled, preferring the least crowded domain.
    ScheduleAnyway,
}

/// Labels that differ between pods of one controller, so no controller selects by them.
const PER_POD_LABELS: &[&str] =
    &["statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index", "controller-revision-hash"];

/// The selector kube-scheduler's `DefaultSelector` derives for a pod of a ReplicaSet,
/// StatefulSet or ReplicationController: its controller's selector, which every pod of it
/// matches with its template labels (`None` for other pods, which get no defaults). Services
/// selecting a bare pod, which kube-scheduler also reads, are not in snapshots.
fn controller_selector(w: &Workload) -> Option<LabelSelector> {
    let controlled = match &w.owner {
        OwnerKind::ReplicaSet | OwnerKind::StatefulSet => true,
        OwnerKind::Other(kind) => kind == "ReplicationController",
        _ => false,
    };
    let labels: std::collections::BTreeMap<String, String> = w
        .labels
        .iter()
        .filter(|(k, _)| !PER_POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (controlled && !labels.is_empty())
        .then_some(LabelSelector { match_labels: labels, match_expressions: Vec::new() })
}

/// The workloads with `defaults` applied to those that declare no spread constraint of their
/// own; `None` when no workload gets any.
pub fn apply(workloads: &[Workload], defaults: &[DefaultSpreadConstraint]) -> Option<Vec<Workload>> {
    if defaults.is_empty() {
        return None;
    }
    let mut out = workloads.to_vec();
    let mut applied = false;
    for w in out.iter_mut().filter(|w| w.spread.is_empty() && w.preferences.spread.is_empty()) {
        let Some(selector) = controller_selector(w) else { continue };
        for d in defaults {
            let c = SpreadConstraint {
                max_skew: d.max_skew,
                topology_key: d.topology_key.clone(),
                selector: selector.clone(),
                min_domains: 1,
                honor_node_affinity: true,
                honor_node_taints: false,
            };
            match d.when_unsatisfiable {
                WhenUnsatisfiable::DoNotSchedule => w.spread.push(c),
                WhenUnsatisfiable::ScheduleAnyway => w.preferences.spread.push(c),
            }
            applied = true;
        }
    }
    applied.then_some(out)
}

/// What is wrong with the configured defaults, as (field, value, reason).
pub fn problems(defaults: &[DefaultSpreadConstraint]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (i, d) in defaults.iter().enumerate() {
        let at = format!("planner.defaultSpreadConstraints[{i}]");
        if d.max_skew == 0 {
            out.push((format!("{at}.maxSkew"), "0".into(), "must be at least 1".into()));
        }
        if let Err(why) = crate::model::names::qualified_name(&d.topology_key) {
            out.push((format!("{at}.topologyKey"), format!("{:?}", d.topology_key), why));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PodIdentity;
    use std::sync::Arc;

    fn pod(name: &str, owner: OwnerKind, labels: &[(&str, &str)]) -> Workload {
        let labels: std::collections::BTreeMap<String, String> =
            labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Workload {
            id: format!("ml/{name}"),
            owner,
            identity: Some(Arc::new(PodIdentity {
                namespace: "ml".into(),
                labels: labels.clone(),
                ..Default::default()
            })),
            labels,
            ..Default::default()
        }
    }

    /// kube-scheduler's `TestPreScoreDefaultConstraints`-style cases: defaults go to pods of
    /// controllers without constraints of their own, with the controller's selector.
    #[test]
    fn defaults_apply_to_controlled_pods_without_constraints() {
        let zone = DefaultSpreadConstraint {
            max_skew: 1,
            topology_key: "topology.kubernetes.io/zone".into(),
            when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
        };
        let host = DefaultSpreadConstraint {
            max_skew: 3,
            topology_key: "kubernetes.io/hostname".into(),
            when_unsatisfiable: WhenUnsatisfiable::ScheduleAnyway,
        };
        let mut own = pod("own", OwnerKind::ReplicaSet, &[("app", "own")]);
        own.spread.push(SpreadConstraint {
            max_skew: 2,
            topology_key: "rack".into(),
            selector: LabelSelector::default(),
            min_domains: 1,
            honor_node_affinity: true,
            honor_node_taints: false,
        });
        let workloads = vec![
            pod("web-1", OwnerKind::ReplicaSet, &[("app", "web"), ("pod-template-hash", "7d9")]),
            pod(
                "db-0",
                OwnerKind::StatefulSet,
                &[("app", "db"), ("statefulset.kubernetes.io/pod-name", "db-0")],
            ),
            pod("bare", OwnerKind::None, &[("app", "bare")]),
            pod("job", OwnerKind::Job, &[("job-name", "x")]),
            own,
        ];
        assert_eq!(apply(&workloads, &[]), None);
        let out = apply(&workloads, &[zone, host]).expect("defaults apply");
        assert_eq!(out[0].spread.len(), 1);
        assert_eq!(out[0].spread[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(out[0].preferences.spread[0].topology_key, "kubernetes.io/hostname");
        assert_eq!(out[0].spread[0].selector.match_labels.len(), 2);
        let db = &out[1].spread[0].selector.match_labels;
        assert_eq!(
            db.keys().collect::<Vec<_>>(),
            vec!["app"],
            "the pod's own name is no part of the selector"
        );
        assert!(out[2].spread.is_empty() && out[3].spread.is_empty(), "bare pods and jobs get none");
        assert_eq!(out[4].spread.len(), 1, "a pod with its own constraints keeps them alone");
        assert_eq!(out[4].spread[0].topology_key, "rack");
    }

    #[test]
    fn bad_defaults_name_field_and_value() {
        let bad = DefaultSpreadConstraint {
            max_skew: 0,
            topology_key: "not a key".into(),
            when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
        };
        let p = problems(&[bad]);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].0, "planner.defaultSpreadConstraints[0].maxSkew");
        assert_eq!(p[1].0, "planner.defaultSpreadConstraints[0].topologyKey");
    }
}
