//! The decision step shared by the controller and the replays: a plan plus the loop's memory in,
//! the commands to carry out and the new memory out.
//!
//! A plan says what the cluster should look like now; acting on it needs timers (how long a node
//! has been removable, how long a replacement has been awaited) and knowledge of what is already
//! under way (drains, replacements, gang scale-ups). Those rules live here and only here, so the
//! controller (`controller::reconcile`, which carries the commands out through the clouds and the
//! Kubernetes API) and the autoscaling replay (`sim::autoscale`, which carries them out on the
//! simulated cluster) cannot follow different rules, and a figure measured by the replay measures
//! what `gpuscale run` does. Pure and deterministic: `now` comes in with the input, nothing here
//! reads a clock.

use super::Plan;
use crate::model::{ClusterSnapshot, NodeGroup, NodeState, OwnerKind, Workload};
use crate::scheduler::fit;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The timers of the decision step; the one place their defaults are set. The controller's config
/// (`controller.scaleDownUnneededSeconds`, `controller.registrationTimeoutSeconds`) and the
/// replays take them from here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecideSettings {
    /// A node must be planned for removal (or replacement) this long, without interruption,
    /// before its drain (or its replacement) starts: Cluster Autoscaler's
    /// `scale-down-unneeded-time`. It applies to empty nodes too: an empty node is kept this long
    /// in case new pods want it.
    pub unneeded_seconds: f64,
    /// A requested replacement that has no Ready node holding the old node's pods after this long
    /// is given up and the old node kept (the same timeout after which a new instance whose node
    /// never came is removed: Cluster Autoscaler's `max-node-provision-time`).
    pub registration_timeout_seconds: f64,
}

impl Default for DecideSettings {
    fn default() -> Self {
        Self { unneeded_seconds: 600.0, registration_timeout_seconds: 900.0 }
    }
}

/// A consolidation replacement under way: the old node waits for a Ready node of `group`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replacing {
    /// Group the replacement comes from.
    pub group: String,
    /// That group's target size including the replacement.
    pub target: u32,
    /// When it was requested, seconds (Unix time in the controller, virtual time in replays).
    pub requested_at: i64,
}

/// What the loop remembers between steps. The controller rebuilds `replacing` and `draining`
/// from the marks on its Node objects each pass (so a restart loses only the timers, which only
/// delays decisions); the replay keeps all of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoopState {
    /// Since when each node has been planned for removal or replacement without interruption.
    pub unneeded_since: BTreeMap<String, i64>,
    /// Replacements requested and not yet finished or given up, by the node they replace.
    pub replacing: BTreeMap<String, Replacing>,
    /// Nodes being drained.
    pub draining: BTreeSet<String>,
}

/// What the step looks at besides the plan.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The snapshot the plan was made from (nodes, and pods with their nodes and devices).
    pub snapshot: &'a ClusterSnapshot,
    /// Node groups with their current targets.
    pub groups: &'a [NodeGroup],
    /// Groups with an all-or-nothing gang scale-up still in progress: not raised again.
    pub gangs_in_flight: &'a BTreeSet<String>,
}

/// One thing to carry out, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "command", rename_all = "camelCase")]
pub enum Command {
    /// Set a group's target size (absolute, so a retry is idempotent). `gang`: some of the pods
    /// belong to a gang, so the raise is all-or-nothing (rolled back if not every new instance
    /// runs in time).
    ScaleGroup {
        /// Group id.
        group: String,
        /// Target before.
        from: u32,
        /// Target after.
        to: u32,
        /// Pending pods the new nodes are for.
        pods: Vec<String>,
        /// Whether the raise is all-or-nothing.
        gang: bool,
    },
    /// Cordon the node and move its pods away, then delete its instance.
    DrainNode {
        /// Node name.
        node: String,
        /// Why.
        reason: String,
    },
    /// Continue a drain under way (`wanted: false`: the plan no longer removes the node, so the
    /// drain is given back unless it has evicted pods already).
    AdvanceDrain {
        /// Node name.
        node: String,
        /// Whether the plan still removes or replaces it.
        wanted: bool,
    },
    /// Record that `node` is to be replaced by a new node of `group`, and raise the group to
    /// `target`.
    RequestReplacement {
        /// Node to replace.
        node: String,
        /// Replacement group.
        group: String,
        /// Group target before.
        from: u32,
        /// Group target after.
        target: u32,
    },
    /// Raise a replacement's group again: its request was recorded but the target is below it
    /// (a restart between the two writes).
    ReraiseReplacement {
        /// Node being replaced.
        node: String,
        /// Replacement group.
        group: String,
        /// Target to raise to.
        target: u32,
    },
    /// Evict `victims` so that the pending `pod` fits `node` (tenancy: reclaiming lent quota, or
    /// a higher priority where eviction beats a scale-up). kube-scheduler binds the pod once they
    /// are gone.
    Preempt {
        /// Pending pod `namespace/name`.
        pod: String,
        /// Node it fits once the victims are gone.
        node: String,
        /// Pods to evict, `namespace/name`.
        victims: Vec<String>,
        /// Why.
        reason: String,
    },
    /// An interruption notice: cordon the node and drain it now through the usual gate and
    /// Eviction API path, each pod's grace period capped to `grace_cap_seconds` (the time left
    /// before the instance goes; `None`: no deadline, the usual grace). The node is not deleted
    /// by gpuscale before it is empty; the cloud takes it at the deadline.
    InterruptNode {
        /// Node name.
        node: String,
        /// What was announced.
        kind: crate::model::NoticeKind,
        /// Largest grace period a pod gets, seconds.
        grace_cap_seconds: Option<u32>,
        /// When the cloud takes the instance (seconds), if it said: the pods are evicted just in
        /// time before it ([`super::interruption::evict_at`]).
        deadline: Option<i64>,
        /// Why.
        reason: String,
    },
    /// Do not grow `group` until `until` (seconds): its spot capacity was just reclaimed.
    BackOffGroup {
        /// Group id.
        group: String,
        /// End of the backoff, seconds (Unix time in the controller, virtual in replays).
        until: i64,
        /// Why.
        reason: String,
    },
    /// Give a replacement up and keep the node (the replacement did not come in time, or its
    /// group is gone).
    GiveUpReplacement {
        /// Node that stays.
        node: String,
        /// Why.
        reason: String,
    },
}

/// One step: the commands for `plan` at `now`, and the loop's new memory.
pub fn decide(
    plan: &Plan,
    state: &LoopState,
    observed: Observed<'_>,
    now: i64,
    settings: &DecideSettings,
) -> (Vec<Command>, LoopState) {
    let Observed { snapshot, groups, gangs_in_flight } = observed;
    let mut next = state.clone();
    let mut out = Vec::new();
    let waited = |since: i64| (now - since) as f64 >= settings.unneeded_seconds;

    out.extend(scale_ups(plan, observed, &state.replacing));

    // Preemptions. One onto a node where a pod is still terminating waits for it: that pod may
    // be an earlier preemption's victim whose room is not free yet, and evicting more now would
    // evict twice for one pod (kube-scheduler's `PodEligibleToPreemptOthers`). So does one for a
    // claimant nominated to a node where pods still terminate, wherever this plan puts it: its
    // last victims have not gone yet. Nothing to remember: a restart or a new leader sees the
    // same terminating pods and nominations.
    let terminating: BTreeSet<&str> =
        snapshot.workloads.iter().filter(|w| w.terminating).filter_map(|w| w.node_name.as_deref()).collect();
    let waiting: BTreeSet<&str> = snapshot
        .workloads
        .iter()
        .filter(|w| w.nominated_node.as_deref().is_some_and(|n| terminating.contains(n)))
        .map(|w| w.id.as_str())
        .collect();
    for p in &plan.preemptions {
        if terminating.contains(p.node.as_str()) || waiting.contains(p.pod.as_str()) {
            continue;
        }
        out.push(Command::Preempt {
            pod: p.pod.clone(),
            node: p.node.clone(),
            victims: p.victims.clone(),
            reason: p.reason.clone(),
        });
    }

    // Timers: a node is timed while the plan removes or replaces it, and forgotten when not.
    let removals: BTreeMap<&str, &str> =
        plan.scale_downs.iter().map(|s| (s.node.as_str(), s.reason.as_str())).collect();
    let timed: BTreeSet<&str> =
        removals.keys().copied().chain(plan.replacements.iter().map(|r| r.node.as_str())).collect();
    next.unneeded_since.retain(|n, _| timed.contains(n.as_str()));
    for n in &timed {
        next.unneeded_since.entry(n.to_string()).or_insert(now);
    }

    // Replacements under way: drain the old node once a Ready node of the group holds its pods;
    // give up after the registration timeout; re-raise a recorded but unraised request.
    for (node, r) in &state.replacing {
        if state.draining.contains(node) {
            continue;
        }
        let Some(gi) = groups.iter().position(|g| g.id == r.group) else {
            out.push(Command::GiveUpReplacement {
                node: node.clone(),
                reason: format!("replacement group {} is not managed any more", r.group),
            });
            next.replacing.remove(node);
            continue;
        };
        if let Some(to) = replacement_node(node, gi, snapshot, groups, &state.draining) {
            out.push(Command::DrainNode {
                node: node.clone(),
                reason: format!("replaced by the cheaper node {to} of group {}", r.group),
            });
            next.draining.insert(node.clone());
        } else if (now - r.requested_at) as f64 > settings.registration_timeout_seconds {
            out.push(Command::GiveUpReplacement {
                node: node.clone(),
                reason: format!("no Ready node of {} took its pods in time", r.group),
            });
            next.replacing.remove(node);
        } else if groups[gi].target_size < r.target && !gangs_in_flight.contains(&r.group) {
            // Raised again once its group's gang is decided (see the scale-ups above).
            out.push(Command::ReraiseReplacement {
                node: node.clone(),
                group: r.group.clone(),
                target: r.target,
            });
        }
    }

    // New replacements, for nodes replaceable for the unneeded time; each above the group's
    // target and any replacement already requested from it.
    for r in &plan.replacements {
        if next.replacing.contains_key(&r.node) || next.draining.contains(&r.node) {
            continue;
        }
        if !next.unneeded_since.get(&r.node).is_some_and(|&s| waited(s)) {
            continue;
        }
        let Some(g) = groups.iter().find(|g| g.id == r.replacement_group) else { continue };
        if gangs_in_flight.contains(&g.id) {
            continue;
        }
        let reserved = next.replacing.values().filter(|m| m.group == g.id).map(|m| m.target).max();
        let target = reserved.unwrap_or(0).max(g.target_size) + 1;
        out.push(Command::RequestReplacement {
            node: r.node.clone(),
            group: g.id.clone(),
            from: g.target_size,
            target,
        });
        next.replacing.insert(r.node.clone(), Replacing { group: g.id.clone(), target, requested_at: now });
    }

    // New drains, for nodes removable for the unneeded time. Nodes of a group whose new nodes
    // are replacements on their way in are not drained meanwhile (the replacement is for them).
    let reserved: BTreeSet<&str> = next.replacing.values().map(|m| m.group.as_str()).collect();
    let index = super::cluster::GroupIndex::of(groups);
    let group_id = |node: &str| {
        snapshot
            .nodes
            .iter()
            .find(|n| n.name == node)
            .and_then(|n| index.group_of(n))
            .map(|g| groups[g].id.as_str())
    };
    for (node, reason) in &removals {
        if next.draining.contains(*node) {
            continue;
        }
        if group_id(node).is_some_and(|g| reserved.contains(g)) && !next.replacing.contains_key(*node) {
            continue;
        }
        if !next.unneeded_since.get(*node).is_some_and(|&s| waited(s)) {
            continue;
        }
        out.push(Command::DrainNode { node: node.to_string(), reason: reason.to_string() });
        next.draining.insert(node.to_string());
    }

    // Every drain under way, those started by this step included.
    for node in &next.draining {
        let wanted = removals.contains_key(node.as_str()) || next.replacing.contains_key(node);
        out.push(Command::AdvanceDrain { node: node.clone(), wanted });
    }
    (out, next)
}

/// The plan's scale-ups as commands, absolute targets; a group whose gang scale-up is in progress
/// is left alone. A gang's raise also waits for the replacements on their way into its group
/// (`replacing`): a gang counts as its own every instance launched into the group while it waits,
/// so its rollback could take a replacement's node (Ready, about to receive the pods of the node
/// it replaces) for one of its own. Also what the controller carries out when it re-plans within
/// a pass after a launch failed for capacity (the rest of the step ran already).
pub fn scale_ups(
    plan: &Plan,
    observed: Observed<'_>,
    replacing: &BTreeMap<String, Replacing>,
) -> Vec<Command> {
    let Observed { snapshot, gangs_in_flight, .. } = observed;
    let gang_pods: BTreeSet<&str> =
        snapshot.workloads.iter().filter(|w| w.gang.is_some()).map(|w| w.id.as_str()).collect();
    let replacing_into: BTreeSet<&str> = replacing.values().map(|r| r.group.as_str()).collect();
    let mut out = Vec::new();
    for su in plan.scale_ups.iter().filter(|su| !gangs_in_flight.contains(&su.group)) {
        // ProvisioningRequests are served all or nothing, like gangs.
        let gang = !su.requests.is_empty() || su.pods.iter().any(|p| gang_pods.contains(p.as_str()));
        if gang && replacing_into.contains(su.group.as_str()) {
            continue;
        }
        out.push(Command::ScaleGroup {
            group: su.group.clone(),
            from: su.from,
            to: su.to,
            pods: su.pods.clone(),
            gang,
        });
    }
    out
}

/// A Ready, schedulable node of group `gi` (not being drained) with room for the pods of `node`
/// that would move (all but DaemonSet and static pods).
pub fn replacement_node(
    node: &str,
    gi: usize,
    snapshot: &ClusterSnapshot,
    groups: &[NodeGroup],
    draining: &BTreeSet<String>,
) -> Option<String> {
    fn on<'a>(s: &'a ClusterSnapshot, name: &'a str) -> impl Iterator<Item = &'a Workload> {
        s.workloads.iter().filter(move |w| w.node_name.as_deref() == Some(name))
    }
    let moving: Vec<_> =
        on(snapshot, node).filter(|w| !matches!(w.owner, OwnerKind::DaemonSet | OwnerKind::Node)).collect();
    let index = super::cluster::GroupIndex::of(groups);
    snapshot
        .nodes
        .iter()
        .filter(|n| n.name != node && n.state == NodeState::Ready && !n.unschedulable)
        .filter(|n| index.group_of(n) == Some(gi) && !draining.contains(&n.name))
        .find(|n| {
            let mut with_its_pods = (*n).clone();
            for w in on(snapshot, &n.name) {
                if let Some(d) = &w.devices {
                    with_its_pods.allocate(&w.requests, d);
                }
            }
            fit::holds_all(&with_its_pods, moving.iter().copied())
        })
        .map(|n| n.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Instance, InstanceState, Resources};
    use crate::planner::{Replace, ScaleDown, ScaleUp};

    /// Two groups (a dear and a cheap one) of the embedded openb shapes, `node` a Ready node of the
    /// dear group running `pod`, and the cheap group holding `cheap` Ready nodes.
    fn world(cheap_nodes: &[&str]) -> (ClusterSnapshot, Vec<NodeGroup>) {
        let (all, _) = crate::sim::autoscale::openb_groups().unwrap();
        let mut groups: Vec<NodeGroup> =
            all.into_iter().filter(|g| g.id.ends_with("/g3") || g.id.ends_with("/g2")).collect();
        let mut snapshot = ClusterSnapshot::default();
        let mut add = |gi: usize, name: &str, groups: &mut Vec<NodeGroup>| {
            let mut n = crate::planner::cluster::template_node(&groups[gi], name.into(), NodeState::Ready);
            n.provider_id = Some(name.into());
            groups[gi].instances.push(Instance { id: name.into(), state: InstanceState::Running });
            groups[gi].target_size += 1;
            snapshot.nodes.push(n);
        };
        let dear = groups.iter().position(|g| g.id.ends_with("/g3")).unwrap();
        let cheap = 1 - dear;
        add(dear, "dear-1", &mut groups);
        for n in cheap_nodes {
            add(cheap, n, &mut groups);
        }
        snapshot.workloads.push(Workload {
            id: "default/p".into(),
            requests: Resources::new(1000, 1024),
            node_name: Some("dear-1".into()),
            devices: Some(Default::default()),
            ..Default::default()
        });
        (snapshot, groups)
    }

    fn removal(node: &str) -> Plan {
        Plan {
            scale_downs: vec![ScaleDown {
                node: node.into(),
                group: String::new(),
                instance: None,
                moves: vec![],
                reason: "empty".into(),
                saving_per_hour: 0,
            }],
            ..Default::default()
        }
    }

    fn replacement(groups: &[NodeGroup]) -> Plan {
        let cheap = groups.iter().find(|g| g.id.ends_with("/g2")).unwrap();
        Plan {
            replacements: vec![Replace {
                node: "dear-1".into(),
                group: String::new(),
                replacement_group: cheap.id.clone(),
                pods: vec!["default/p".into()],
                saving_per_hour: 0,
            }],
            ..Default::default()
        }
    }

    /// Runs `steps` of (time, plan) through the step, threading its state as both loops do.
    fn script(
        steps: &[(i64, Plan)],
        snapshot: &ClusterSnapshot,
        groups: &[NodeGroup],
    ) -> (Vec<(i64, Command)>, LoopState) {
        let settings = DecideSettings::default();
        let mut state = LoopState::default();
        let mut out = Vec::new();
        let none = BTreeSet::new();
        for (now, plan) in steps {
            let observed = Observed { snapshot, groups, gangs_in_flight: &none };
            let (commands, next) = decide(plan, &state, observed, *now, &settings);
            out.extend(commands.into_iter().map(|c| (*now, c)));
            state = next;
        }
        (out, state)
    }

    #[test]
    fn a_node_is_drained_after_the_unneeded_time_without_interruption_empty_or_not() {
        let (snapshot, groups) = world(&["cheap-1"]);
        let plan = removal("cheap-1");
        // Removable at 0, not at 300 (the timer restarts), removable again from 310: due at 910.
        let steps = [
            (0, plan.clone()),
            (300, Plan::default()),
            (310, plan.clone()),
            (909, plan.clone()),
            (910, plan.clone()),
            (920, plan.clone()),
        ];
        let (commands, state) = script(&steps, &snapshot, &groups);
        assert_eq!(
            commands,
            vec![
                (910, Command::DrainNode { node: "cheap-1".into(), reason: "empty".into() }),
                (910, Command::AdvanceDrain { node: "cheap-1".into(), wanted: true }),
                (920, Command::AdvanceDrain { node: "cheap-1".into(), wanted: true }),
            ]
        );
        assert_eq!(state.unneeded_since["cheap-1"], 310);
        // A drain the plan stops wanting is advanced as unwanted (given back).
        let (commands, _) = decide(
            &Plan::default(),
            &state,
            Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &BTreeSet::new() },
            930,
            &DecideSettings::default(),
        );
        assert_eq!(commands, vec![Command::AdvanceDrain { node: "cheap-1".into(), wanted: false }]);
    }

    #[test]
    fn scale_ups_are_absolute_and_skip_groups_with_a_gang_in_flight() {
        let (mut snapshot, groups) = world(&[]);
        snapshot.workloads.push(Workload {
            id: "default/g0".into(),
            gang: Some("g".into()),
            ..Default::default()
        });
        let up = |group: &str, pods: &[&str]| ScaleUp {
            requests: vec![],
            group: group.into(),
            instance_type: String::new(),
            from: 1,
            to: 3,
            pods: pods.iter().map(|p| p.to_string()).collect(),
            reason: String::new(),
            cost_per_hour: 0,
        };
        let plan =
            Plan { scale_ups: vec![up("a", &["default/g0"]), up("b", &["default/x"])], ..Default::default() };
        let in_flight: BTreeSet<String> = ["b".to_string()].into();
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &in_flight };
        let (commands, _) = decide(&plan, &LoopState::default(), observed, 0, &DecideSettings::default());
        assert_eq!(
            commands,
            vec![Command::ScaleGroup {
                group: "a".into(),
                from: 1,
                to: 3,
                pods: vec!["default/g0".into()],
                gang: true
            }]
        );
    }

    /// A gang's raise and a consolidation replacement never wait on one group at once: the gang
    /// would count the replacement's instance as its own, and its rollback could take it.
    #[test]
    fn a_replacement_and_a_gang_never_wait_on_one_group_at_once() {
        let (mut snapshot, groups) = world(&[]);
        let cheap = groups.iter().find(|g| g.id.ends_with("/g2")).unwrap().id.clone();
        snapshot.workloads.push(Workload {
            id: "default/g0".into(),
            gang: Some("g".into()),
            ..Default::default()
        });
        let settings = DecideSettings::default();
        // A gang in flight in the cheap group: the replacement is not requested, then is.
        let in_flight: BTreeSet<String> = [cheap.clone()].into();
        let plan = replacement(&groups);
        let state = LoopState { unneeded_since: [("dear-1".to_string(), 0)].into(), ..Default::default() };
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &in_flight };
        let (commands, next) = decide(&plan, &state, observed, 600, &settings);
        assert_eq!(commands, vec![]);
        assert!(next.replacing.is_empty());
        let none = BTreeSet::new();
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &none };
        let (commands, replacing) = decide(&plan, &state, observed, 600, &settings);
        assert!(matches!(&commands[..], [Command::RequestReplacement { .. }]), "{commands:?}");
        // A replacement on its way into the cheap group: a gang's raise there waits, and the
        // replacement is not raised again while a gang (a resumed one) waits there.
        let up = |pods: &[&str]| ScaleUp {
            requests: vec![],
            group: cheap.clone(),
            instance_type: String::new(),
            from: 0,
            to: 2,
            pods: pods.iter().map(|p| p.to_string()).collect(),
            reason: String::new(),
            cost_per_hour: 0,
        };
        let gang_up = Plan { scale_ups: vec![up(&["default/g0"])], ..Default::default() };
        let reraise = Command::ReraiseReplacement { node: "dear-1".into(), group: cheap.clone(), target: 1 };
        let (commands, _) = decide(&gang_up, &replacing, observed, 610, &settings);
        assert_eq!(commands, vec![reraise.clone()]);
        let plain_up = Plan { scale_ups: vec![up(&["default/x"])], ..Default::default() };
        let (commands, _) = decide(&plain_up, &replacing, observed, 610, &settings);
        assert!(
            matches!(&commands[..], [Command::ScaleGroup { gang: false, .. }, r] if *r == reraise),
            "{commands:?}"
        );
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &in_flight };
        let (commands, _) = decide(&Plan::default(), &replacing, observed, 610, &settings);
        assert_eq!(commands, vec![]);
    }

    #[test]
    fn a_replacement_is_requested_then_drained_onto_its_ready_node_or_given_up_in_time() {
        let (snapshot, groups) = world(&[]);
        let plan = replacement(&groups);
        let cheap = groups.iter().find(|g| g.id.ends_with("/g2")).unwrap().id.clone();
        // No cheap node ever comes: requested at 600, given up after the registration timeout.
        let steps: Vec<(i64, Plan)> = [0, 600, 610, 1500, 1501].iter().map(|&t| (t, plan.clone())).collect();
        let (commands, state) = script(&steps, &snapshot, &groups);
        let request =
            Command::RequestReplacement { node: "dear-1".into(), group: cheap.clone(), from: 0, target: 1 };
        let reraise = Command::ReraiseReplacement { node: "dear-1".into(), group: cheap.clone(), target: 1 };
        let give_up = Command::GiveUpReplacement {
            node: "dear-1".into(),
            reason: format!("no Ready node of {cheap} took its pods in time"),
        };
        // The group's target (0 in this fixed world) stays below the request: raised again.
        assert_eq!(
            commands,
            vec![
                (600, request.clone()),
                (610, reraise.clone()),
                (1500, reraise),
                (1501, give_up),
                (1501, request)
            ]
        );
        assert_eq!(state.replacing["dear-1"].requested_at, 1501);

        // The cheap node is Ready: the old node is drained onto it.
        let (snapshot, groups) = world(&["cheap-1"]);
        let steps: Vec<(i64, Plan)> = [0, 600, 610].iter().map(|&t| (t, plan.clone())).collect();
        let (commands, _) = script(&steps, &snapshot, &groups);
        assert_eq!(
            commands,
            vec![
                (
                    600,
                    Command::RequestReplacement {
                        node: "dear-1".into(),
                        group: cheap.clone(),
                        from: 1,
                        target: 2
                    }
                ),
                (
                    610,
                    Command::DrainNode {
                        node: "dear-1".into(),
                        reason: format!("replaced by the cheaper node cheap-1 of group {cheap}"),
                    }
                ),
                (610, Command::AdvanceDrain { node: "dear-1".into(), wanted: true }),
            ]
        );
    }

    /// A planned preemption is carried out at once, unless a pod on its node is still
    /// terminating (an earlier eviction's room is not free yet): then it waits, and a restart
    /// changes nothing, since the terminating pod is in the snapshot.
    #[test]
    fn a_preemption_waits_for_pods_terminating_on_its_node() {
        let (mut snapshot, groups) = world(&[]);
        let plan = Plan {
            preemptions: vec![crate::planner::Preempt {
                pod: "ml/claim".into(),
                node: "dear-1".into(),
                victims: vec!["default/p".into()],
                reason: "reclaim".into(),
                alternative_cost: None,
            }],
            ..Default::default()
        };
        let (commands, _) = script(&[(0, plan.clone())], &snapshot, &groups);
        let want = Command::Preempt {
            pod: "ml/claim".into(),
            node: "dear-1".into(),
            victims: vec!["default/p".into()],
            reason: "reclaim".into(),
        };
        assert_eq!(commands, vec![(0, want)]);
        snapshot.workloads.push(Workload {
            id: "default/going".into(),
            node_name: Some("dear-1".into()),
            terminating: true,
            ..Default::default()
        });
        let (commands, _) = script(&[(0, plan.clone()), (10, plan)], &snapshot, &groups);
        assert!(commands.is_empty(), "{commands:?}");
    }

    /// A claimant whose victims still terminate on the node it is nominated to evicts nothing
    /// more, even where this plan would put it instead; once they are gone it may again.
    #[test]
    fn a_claimant_nominated_where_pods_terminate_evicts_nothing_more() {
        let (mut snapshot, groups) = world(&["cheap-1"]);
        snapshot.workloads.push(Workload {
            id: "ml/claim".into(),
            nominated_node: Some("cheap-1".into()),
            ..Default::default()
        });
        let plan = Plan {
            preemptions: vec![crate::planner::Preempt {
                pod: "ml/claim".into(),
                node: "dear-1".into(),
                victims: vec!["default/p".into()],
                reason: "reclaim".into(),
                alternative_cost: None,
            }],
            ..Default::default()
        };
        let (commands, _) = script(&[(0, plan.clone())], &snapshot, &groups);
        assert_eq!(commands.len(), 1, "nothing terminates on cheap-1: {commands:?}");
        snapshot.workloads.push(Workload {
            id: "default/victim".into(),
            node_name: Some("cheap-1".into()),
            terminating: true,
            ..Default::default()
        });
        let (commands, _) = script(&[(0, plan.clone()), (10, plan)], &snapshot, &groups);
        assert!(commands.is_empty(), "{commands:?}");
    }
}
