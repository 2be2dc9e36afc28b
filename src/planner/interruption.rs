//! The reaction to interruption notices, shared by the controller and the replays.
//!
//! A spot node that is reclaimed without a reaction kills its pods, and their demand is seen only
//! once they are pending again, a boot time later than it could have been. On a notice the step
//! cordons the node, asks at once for a replacement for its pods (the cheapest group they fit,
//! spot or on-demand by their own selectors, a gang member in its gang's topology domain), drains
//! it with the grace period capped to the time left before the deadline (its pods evicted just in
//! time, [`evict_at`], so that they run while the replacement boots), and backs the reclaimed
//! spot pool off so that the replacement does not land in the pool that just failed. A rebalance
//! recommendation replaces the node only when configured to (off by default, as in Karpenter)
//! and only when a replacement outside the pool costs no more than the node does. Pure and
//! deterministic: `now` and the notices come in, nothing here reads a clock.

use super::cluster::{group_of, template_node};
use super::decide::{Command, Observed};
use crate::model::{ClusterSnapshot, Node, NodeGroup, NodeState, Notice, NoticeKind, OwnerKind, Workload};
use crate::scheduler::fit;
use std::collections::{BTreeMap, BTreeSet};

/// How notices are acted on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct InterruptionSettings {
    /// Replace a node on a rebalance recommendation (when a replacement outside its pool costs
    /// at most `rebalance_max_premium` more). Off by default, as Karpenter's: a recommendation is
    /// often not followed by an interruption, and chasing it churns pods.
    pub replace_on_rebalance: bool,
    /// How much more than the node's own price a rebalance replacement may cost, as a fraction
    /// (0.0: only an equal or cheaper one is worth the move).
    pub rebalance_max_premium: f64,
    /// How long a reclaimed spot group is not grown, seconds (Karpenter's unavailable-offerings
    /// cache keeps a failed offering out for 3 minutes).
    pub reclaimed_backoff_seconds: i64,
    /// The pods must be gone this long before the deadline: the grace period is capped to the
    /// time left minus this margin.
    pub deadline_margin_seconds: i64,
    /// How long at most a noticed node's pods keep running after the notice while their
    /// replacement boots (0: evicted at once, as Karpenter and Node Termination Handler do).
    /// They are evicted earlier when the deadline requires: see [`evict_at`].
    pub hold_seconds: i64,
    /// What is kept, besides each pod's grace period and the margin, for the evictions
    /// themselves (a refused one retried, a pod rescheduled), seconds.
    pub eviction_lead_seconds: i64,
}

impl Default for InterruptionSettings {
    fn default() -> Self {
        Self {
            replace_on_rebalance: false,
            rebalance_max_premium: 0.0,
            reclaimed_backoff_seconds: 180,
            deadline_margin_seconds: 5,
            hold_seconds: 300,
            eviction_lead_seconds: 15,
        }
    }
}

/// What the step remembers: notices handled (so each is acted on once), by instance, with the
/// time after which the entry is forgotten.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InterruptionState {
    /// Instances whose notice was acted on, with when the memory may be dropped.
    pub handled: BTreeMap<String, i64>,
    /// Instances whose reclaimed pool was backed off, likewise: once per notice, also while
    /// the node itself waits to be drained.
    pub pools_backed_off: BTreeMap<String, i64>,
}

/// What the caller can see of its own nodes.
#[derive(Clone, Copy)]
pub struct NodeReach<'a> {
    /// Nodes whose reaction is already under way (the controller's drain marks on Nodes, which
    /// survive a restart): no second replacement, no second drain.
    pub handled: &'a BTreeSet<String>,
    /// Whether the caller may drain a node under a notice of a kind (the controller's gate: only
    /// a running instance of a managed group; a rebalance also within minimums and budgets). A
    /// node it may not drain gets neither a drain nor a replacement, and its notice is not
    /// remembered, so it is looked at again on the next pass.
    pub drainable: &'a dyn Fn(&Node, NoticeKind) -> bool,
}

/// The commands for `notices` at `now`, and the new memory; `unavailable` are groups the plan
/// may not grow. Per notice the drain comes before the replacement's raise: the drain mark on the
/// Node is what tells a restarted controller that the notice was handled, so a crash between the
/// two leaves the pods to the next plan (as pending pods) and never launches two replacements.
pub fn react(
    notices: &[Notice],
    state: &InterruptionState,
    observed: Observed<'_>,
    reach: NodeReach<'_>,
    unavailable: &BTreeMap<String, String>,
    now: i64,
    settings: &InterruptionSettings,
) -> (Vec<Command>, InterruptionState) {
    let Observed { snapshot, groups, .. } = observed;
    let mut next = state.clone();
    next.handled.retain(|_, until| *until > now);
    next.pools_backed_off.retain(|_, until| *until > now);
    let mut out = Vec::new();
    // Raises of this step per group, so two replacements from one group add up.
    let mut raised: BTreeMap<usize, u32> = BTreeMap::new();
    let mut backed_off: BTreeSet<usize> = BTreeSet::new();
    // Nodes acted on in this step: two notices for one node (its taint and a queue message,
    // a spot warning and the state change after it) make one reaction.
    let mut acted: BTreeSet<&str> = BTreeSet::new();
    let mut notices: Vec<&Notice> = notices.iter().collect();
    // Most urgent first: the earliest deadline gets the cheapest room.
    notices.sort_by_key(|n| (n.deadline.unwrap_or(i64::MAX), n.instance.clone(), n.kind));
    for notice in notices {
        if next.handled.contains_key(&notice.instance) {
            continue;
        }
        let forget_at =
            notice.deadline.unwrap_or(notice.issued_at).max(now) + settings.reclaimed_backoff_seconds;
        let node = snapshot.nodes.iter().find(|n| n.provider_id.as_deref().is_some_and(|p| notice.is_for(p)));
        let gi = match node {
            Some(n) => group_of(n, groups),
            None => groups.iter().position(|g| g.instances.iter().any(|i| notice.is_for(&i.id))),
        };
        // A reclaimed spot pool is not grown for the backoff time, whether or not its node is here.
        if notice.kind == NoticeKind::SpotInterruption
            && next.pools_backed_off.insert(notice.instance.clone(), forget_at).is_none()
        {
            if let Some(gi) = gi.filter(|&g| backed_off.insert(g)) {
                out.push(Command::BackOffGroup {
                    group: groups[gi].id.clone(),
                    until: now + settings.reclaimed_backoff_seconds,
                    reason: format!("spot capacity reclaimed ({})", notice.instance),
                });
            }
        }
        let Some(node) = node else {
            next.handled.insert(notice.instance.clone(), forget_at);
            continue;
        };
        if reach.handled.contains(&node.name) || acted.contains(node.name.as_str()) {
            next.handled.insert(notice.instance.clone(), forget_at);
            continue;
        }
        let pods: Vec<&Workload> = moving_pods(snapshot, &node.name).collect();
        let excluded: BTreeSet<usize> = backed_off.iter().copied().chain(gi).collect();
        let replacement = cheapest_replacement(node, &pods, groups, &excluded, unavailable, &raised);
        if notice.kind == NoticeKind::Rebalance {
            let worth = settings.replace_on_rebalance
                && !pods.is_empty()
                && replacement.is_some_and(|r| {
                    let own = gi.map_or(u64::MAX, |g| groups[g].price) as f64;
                    groups[r].price as f64 <= own * (1.0 + settings.rebalance_max_premium)
                });
            if !worth {
                tracing::debug!(node = %node.name, "rebalance recommendation: no replacement worth the move");
                next.handled.insert(notice.instance.clone(), forget_at);
                continue;
            }
        }
        if !(reach.drainable)(node, notice.kind) {
            tracing::debug!(node = %node.name, "the noticed node may not be drained; looking again next pass");
            continue;
        }
        acted.insert(&node.name);
        let deadline = notice.deadline.map_or(String::new(), |d| format!(", {}s left", (d - now).max(0)));
        out.push(Command::InterruptNode {
            node: node.name.clone(),
            kind: notice.kind,
            grace_cap_seconds: grace_cap(notice, now, settings),
            deadline: notice.deadline.filter(|_| notice.kind != NoticeKind::Terminating),
            reason: format!("{} of {}{deadline}", notice.kind.name(), notice.instance),
        });
        if let Some(r) = replacement.filter(|_| !pods.is_empty()) {
            let g = &groups[r];
            let extra = raised.entry(r).or_insert(0);
            *extra += 1;
            out.push(Command::ScaleGroup {
                group: g.id.clone(),
                from: g.target_size + *extra - 1,
                to: g.target_size + *extra,
                pods: pods.iter().map(|w| w.id.clone()).collect(),
                gang: false,
            });
        }
        next.handled.insert(notice.instance.clone(), forget_at);
    }
    (out, next)
}

/// The grace period a noticed node's pods get at most, seconds: the time left before the
/// deadline less the margin (0 for an instance already terminating); `None` without a deadline.
pub fn grace_cap(notice: &Notice, now: i64, settings: &InterruptionSettings) -> Option<u32> {
    if notice.kind == NoticeKind::Terminating {
        return Some(0);
    }
    notice.deadline.map(|d| (d - now - settings.deadline_margin_seconds).max(0) as u32)
}

/// When the pods of a node noticed at `noticed_at` are evicted, given the longest grace period
/// they get (`grace`, seconds). Just in time: they keep running while their replacement boots
/// (a pod evicted at the notice waits the whole boot, pending), at most `hold_seconds`, and
/// are evicted early enough that each ends within its grace period `eviction_lead_seconds`
/// before the deadline less the margin. Without a deadline (a rebalance recommendation, an
/// instance already terminating), at once.
pub fn evict_at(noticed_at: i64, deadline: Option<i64>, grace: u32, settings: &InterruptionSettings) -> i64 {
    let Some(deadline) = deadline else { return noticed_at };
    let latest =
        deadline - settings.deadline_margin_seconds - i64::from(grace) - settings.eviction_lead_seconds;
    latest.min(noticed_at + settings.hold_seconds.max(0)).max(noticed_at)
}

/// The taint gpuscale's node agent puts on a Node whose instance received a notice; its value
/// is the notice kind (`spot-interruption`, `rebalance`, `scheduled-maintenance`, `terminating`).
pub const INTERRUPTION_TAINT: &str = "gpuscale.io/interruption";

/// The taints AWS Node Termination Handler (in IMDS mode) puts on a noticed Node, and the kinds
/// they mean: a cluster that runs it gets gpuscale's reaction without the queue.
pub const NTH_TAINTS: [(&str, NoticeKind); 4] = [
    ("aws-node-termination-handler/spot-itn", NoticeKind::SpotInterruption),
    ("aws-node-termination-handler/rebalance-recommendation", NoticeKind::Rebalance),
    ("aws-node-termination-handler/scheduled-maintenance", NoticeKind::ScheduledMaintenance),
    ("aws-node-termination-handler/asg-lifecycle-termination", NoticeKind::Terminating),
];

/// How long after first sight a spot notice read from a taint is assumed to end, seconds: a
/// taint carries no deadline, so the shortest window in use (GCP's 30 s) is assumed unless the
/// instance's provider id says AWS (two minutes).
fn assumed_window(provider_id: &str) -> i64 {
    if provider_id.starts_with("aws://") {
        120
    } else {
        30
    }
}

/// Notices read from Nodes' taints ([`INTERRUPTION_TAINT`], [`NTH_TAINTS`]), issued `now`.
pub fn notices_from_taints(nodes: &[Node], now: i64) -> Vec<Notice> {
    let mut out = Vec::new();
    for n in nodes {
        let Some(pid) = n.provider_id.as_deref() else { continue };
        let kind = n.taints.iter().find_map(|t| {
            if t.key == INTERRUPTION_TAINT {
                serde_json::from_value::<NoticeKind>(serde_json::Value::String(t.value.clone())).ok()
            } else {
                NTH_TAINTS.iter().find(|(k, _)| *k == t.key).map(|(_, kind)| *kind)
            }
        });
        let Some(kind) = kind else { continue };
        let deadline = match kind {
            NoticeKind::SpotInterruption | NoticeKind::ScheduledMaintenance => {
                Some(now + assumed_window(pid))
            }
            NoticeKind::Terminating => Some(now),
            NoticeKind::Rebalance => None,
        };
        out.push(Notice { kind, instance: pid.to_string(), issued_at: now, deadline });
    }
    out
}

/// The pods of `node` that move when it goes: all but DaemonSet and static pods, and those
/// already terminating or finished.
fn moving_pods<'a>(snapshot: &'a ClusterSnapshot, node: &'a str) -> impl Iterator<Item = &'a Workload> {
    snapshot.workloads.iter().filter(move |w| {
        w.node_name.as_deref() == Some(node)
            && !w.terminating
            && !matches!(w.owner, OwnerKind::DaemonSet | OwnerKind::Node)
    })
}

/// The cheapest group (then the first by id) one new node of which holds all of `pods`, that
/// may grow, is not `excluded` or unavailable, and for gang members lies in the node's topology
/// domain (the value of each member's `gang_topology_key` on the interrupted node).
fn cheapest_replacement(
    node: &Node,
    pods: &[&Workload],
    groups: &[NodeGroup],
    excluded: &BTreeSet<usize>,
    unavailable: &BTreeMap<String, String>,
    raised: &BTreeMap<usize, u32>,
) -> Option<usize> {
    let domains: Vec<(&str, Option<&String>)> = pods
        .iter()
        .filter(|w| w.gang.is_some())
        .filter_map(|w| w.gang_topology_key.as_deref())
        .map(|k| (k, node.labels.get(k)))
        .collect();
    let mut candidates: Vec<usize> = (0..groups.len())
        .filter(|g| !excluded.contains(g) && !unavailable.contains_key(&groups[*g].id))
        .filter(|&g| groups[g].target_size + raised.get(&g).copied().unwrap_or(0) < groups[g].max_size)
        .filter(|&g| domains.iter().all(|(k, v)| groups[g].template.labels.get(*k) == *v))
        .collect();
    candidates.sort_by(|&a, &b| groups[a].price.cmp(&groups[b].price).then(groups[a].id.cmp(&groups[b].id)));
    candidates.into_iter().find(|&g| {
        let mut fresh = template_node(&groups[g], format!("{}-replacement", node.name), NodeState::Ready);
        pods.iter().all(|w| match fit::candidates(&fresh, w).ok().and_then(|c| c.into_iter().next()) {
            Some(d) => {
                fresh.allocate_pod(w, &d);
                true
            }
            None => false,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CapacityType, GpuDemand, Instance, InstanceState, Resources};
    use crate::providers::config;

    const GROUPS: &str = r#"
accounts:
  - name: sim
    provider: simulated
    region: us-east-1
    nodeGroups:
      - {name: l4-spot-a, instanceType: g6.12xlarge, zones: [us-east-1a], capacityType: spot, maxSize: 8, price: {onDemand: 4.6, spot: 1.5}}
      - {name: l4-spot-b, instanceType: g6.12xlarge, zones: [us-east-1b], capacityType: spot, maxSize: 8, price: {onDemand: 4.6, spot: 1.7}}
      - {name: l4-od-a, instanceType: g6.12xlarge, zones: [us-east-1a], maxSize: 8, price: {onDemand: 4.6}}
"#;

    fn groups() -> Vec<NodeGroup> {
        config::load_strs(&[("t.yaml", GROUPS)]).unwrap().node_groups()
    }

    /// One running node of group `gi` with instance `i-<name>`.
    fn node_of(groups: &mut [NodeGroup], gi: usize, name: &str) -> Node {
        let id = format!("aws:///{}/i-{name}", groups[gi].zones[0]);
        groups[gi].instances.push(Instance { id: id.clone(), state: InstanceState::Running });
        groups[gi].target_size += 1;
        let mut n = template_node(&groups[gi], name.into(), NodeState::Ready);
        n.provider_id = Some(id);
        n
    }

    fn pod(id: &str, node: &str, gpus: u32) -> Workload {
        Workload {
            id: id.into(),
            requests: Resources::new(1000, 1024),
            gpu: GpuDemand::Whole { count: gpus },
            owner: OwnerKind::Job,
            node_name: Some(node.into()),
            tolerations: vec![crate::model::Toleration {
                key: "nvidia.com/gpu".into(),
                operator: crate::model::TolerationOperator::Exists,
                value: String::new(),
                effect: None,
            }],
            ..Default::default()
        }
    }

    /// Group `gi`'s node `name` running pod `pod` of `gpus` GPUs, and the groups.
    fn one_node_with_a_pod(
        gi: usize,
        name: &str,
        pod_id: &str,
        gpus: u32,
    ) -> (Vec<NodeGroup>, ClusterSnapshot) {
        let mut g = groups();
        let n = node_of(&mut g, gi, name);
        let snapshot = ClusterSnapshot {
            nodes: vec![n],
            workloads: vec![pod(pod_id, name, gpus)],
            ..Default::default()
        };
        (g, snapshot)
    }

    fn spot_notice(name: &str, now: i64) -> Notice {
        Notice {
            kind: NoticeKind::SpotInterruption,
            instance: format!("i-{name}"),
            issued_at: now,
            deadline: Some(now + 120),
        }
    }

    fn run(
        notices: &[Notice],
        snapshot: &ClusterSnapshot,
        groups: &[NodeGroup],
        state: &InterruptionState,
        settings: &InterruptionSettings,
    ) -> (Vec<Command>, InterruptionState) {
        let none = BTreeSet::new();
        let observed = Observed { snapshot, groups, gangs_in_flight: &none };
        let reach = NodeReach { handled: &none, drainable: &|_, _| true };
        react(notices, state, observed, reach, &BTreeMap::new(), 1000, settings)
    }

    #[test]
    fn a_spot_interruption_replaces_cordons_drains_within_the_window_and_backs_the_pool_off() {
        let (g, snapshot) = one_node_with_a_pod(0, "a1", "ml/train", 2);
        let (cmds, state) =
            run(&[spot_notice("a1", 1000)], &snapshot, &g, &Default::default(), &Default::default());
        assert_eq!(
            cmds,
            vec![
                Command::BackOffGroup {
                    group: "sim/l4-spot-a".into(),
                    until: 1180,
                    reason: "spot capacity reclaimed (i-a1)".into()
                },
                // The drain first: its mark on the Node is what a restarted controller reads.
                Command::InterruptNode {
                    node: "a1".into(),
                    kind: NoticeKind::SpotInterruption,
                    grace_cap_seconds: Some(115),
                    deadline: Some(1120),
                    reason: "spot interruption of i-a1, 120s left".into()
                },
                // The reclaimed pool is skipped: the next cheapest, spot in the other zone.
                Command::ScaleGroup {
                    group: "sim/l4-spot-b".into(),
                    from: 0,
                    to: 1,
                    pods: vec!["ml/train".into()],
                    gang: false
                },
            ]
        );
        // Exactly once: the same notice again (a redelivered message, the next pass) does nothing.
        let (again, _) = run(&[spot_notice("a1", 1000)], &snapshot, &g, &state, &Default::default());
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn an_on_demand_only_pod_is_replaced_on_demand_and_a_gang_member_in_its_zone() {
        let mut g = groups();
        let a1 = node_of(&mut g, 0, "a1");
        let mut od = pod("ml/serve", "a1", 1);
        od.node_selector.insert(crate::model::KARPENTER_CAPACITY_TYPE.into(), "on-demand".into());
        let snapshot = ClusterSnapshot { nodes: vec![a1.clone()], workloads: vec![od], ..Default::default() };
        let (cmds, _) =
            run(&[spot_notice("a1", 1000)], &snapshot, &g, &Default::default(), &Default::default());
        assert!(
            cmds.iter().any(|c| matches!(c, Command::ScaleGroup { group, .. } if group == "sim/l4-od-a")),
            "{cmds:?}"
        );

        // A gang member in zone a: spot-b is cheaper than on-demand but in another zone.
        let mut member = pod("ml/worker-0", "a1", 1);
        member.gang = Some("ml/llm".into());
        member.gang_topology_key = Some("topology.kubernetes.io/zone".into());
        let snapshot = ClusterSnapshot { nodes: vec![a1], workloads: vec![member], ..Default::default() };
        let (cmds, _) =
            run(&[spot_notice("a1", 1000)], &snapshot, &g, &Default::default(), &Default::default());
        let raised: Vec<&str> = cmds
            .iter()
            .filter_map(|c| match c {
                Command::ScaleGroup { group, .. } => Some(group.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(raised, vec!["sim/l4-od-a"]);
    }

    #[test]
    fn notices_are_read_from_gpuscale_and_termination_handler_taints() {
        use crate::model::{Taint, TaintEffect};
        let mut g = groups();
        let mut a = node_of(&mut g, 0, "a1");
        let mut b = node_of(&mut g, 1, "b1");
        let c = node_of(&mut g, 2, "c1");
        let taint = |key: &str, value: &str| Taint {
            key: key.into(),
            value: value.into(),
            effect: TaintEffect::NoSchedule,
        };
        a.taints.push(taint(INTERRUPTION_TAINT, "spot-interruption"));
        b.taints.push(taint("aws-node-termination-handler/rebalance-recommendation", ""));
        let notices = notices_from_taints(&[a, b, c], 50);
        assert_eq!(
            notices,
            vec![
                Notice {
                    kind: NoticeKind::SpotInterruption,
                    instance: "aws:///us-east-1a/i-a1".into(),
                    issued_at: 50,
                    deadline: Some(170)
                },
                Notice {
                    kind: NoticeKind::Rebalance,
                    instance: "aws:///us-east-1b/i-b1".into(),
                    issued_at: 50,
                    deadline: None
                },
            ]
        );
    }

    #[test]
    fn a_rebalance_recommendation_replaces_only_when_enabled_and_not_dearer() {
        let (mut g, snapshot) = one_node_with_a_pod(1, "b1", "ml/train", 1);
        let notice =
            Notice { kind: NoticeKind::Rebalance, instance: "i-b1".into(), issued_at: 1000, deadline: None };
        // Off by default: nothing, and no backoff (nothing was reclaimed).
        let (cmds, _) =
            run(std::slice::from_ref(&notice), &snapshot, &g, &Default::default(), &Default::default());
        assert!(cmds.is_empty(), "{cmds:?}");
        // Enabled: spot-a (1.5/h) is cheaper than the node (1.7/h): replaced, drained without cap.
        let on = InterruptionSettings { replace_on_rebalance: true, ..Default::default() };
        let (cmds, _) = run(std::slice::from_ref(&notice), &snapshot, &g, &Default::default(), &on);
        assert!(matches!(&cmds[0], Command::InterruptNode { grace_cap_seconds: None, .. }), "{cmds:?}");
        assert!(
            matches!(&cmds[1], Command::ScaleGroup { group, .. } if group == "sim/l4-spot-a"),
            "{cmds:?}"
        );
        // The cheaper pool full: the only replacement (on-demand, 4.6/h) is dearer: nothing.
        g[0].max_size = 0;
        let (cmds, _) = run(&[notice], &snapshot, &g, &Default::default(), &on);
        assert!(cmds.is_empty(), "{cmds:?}");
    }

    #[test]
    fn empty_nodes_get_no_replacement_and_handled_nodes_nothing_but_the_backoff() {
        let mut g = groups();
        let a1 = node_of(&mut g, 0, "a1");
        let snapshot = ClusterSnapshot { nodes: vec![a1], ..Default::default() };
        let (cmds, _) =
            run(&[spot_notice("a1", 1000)], &snapshot, &g, &Default::default(), &Default::default());
        assert_eq!(cmds.len(), 2, "{cmds:?}");
        assert!(matches!(cmds[1], Command::InterruptNode { .. }));
        // A node whose drain is already marked (a restarted controller) is not acted on again.
        let none = BTreeSet::new();
        let observed = Observed { snapshot: &snapshot, groups: &g, gangs_in_flight: &none };
        let handled = BTreeSet::from(["a1".to_string()]);
        let settings = InterruptionSettings::default();
        let reach = NodeReach { handled: &handled, drainable: &|_, _| true };
        let (cmds, _) = react(
            &[spot_notice("a1", 1000)],
            &Default::default(),
            observed,
            reach,
            &BTreeMap::new(),
            1000,
            &settings,
        );
        assert!(cmds.iter().all(|c| matches!(c, Command::BackOffGroup { .. })), "{cmds:?}");
        assert_eq!(g[0].capacity_type, CapacityType::Spot);
    }

    #[test]
    fn two_notices_for_one_node_make_one_reaction() {
        let (g, snapshot) = one_node_with_a_pod(0, "a1", "ml/train", 2);
        // The queue's warning (a bare instance id) and the termination handler's taint (the
        // provider id), and the state change that follows the warning.
        let mut from_taint = spot_notice("a1", 1000);
        from_taint.instance = "aws:///us-east-1a/i-a1".into();
        let terminating = Notice {
            kind: NoticeKind::Terminating,
            instance: "i-a1".into(),
            issued_at: 1000,
            deadline: Some(1000),
        };
        let (cmds, state) = run(
            &[spot_notice("a1", 1000), from_taint, terminating],
            &snapshot,
            &g,
            &Default::default(),
            &Default::default(),
        );
        let drains = cmds.iter().filter(|c| matches!(c, Command::InterruptNode { .. })).count();
        let raises = cmds.iter().filter(|c| matches!(c, Command::ScaleGroup { .. })).count();
        assert_eq!((drains, raises), (1, 1), "{cmds:?}");
        assert_eq!(state.handled.len(), 2, "both ids remembered: {state:?}");
    }

    #[test]
    fn a_node_the_caller_may_not_drain_gets_no_replacement_and_is_looked_at_again() {
        let (g, snapshot) = one_node_with_a_pod(0, "a1", "ml/train", 1);
        let none = BTreeSet::new();
        let observed = Observed { snapshot: &snapshot, groups: &g, gangs_in_flight: &none };
        let settings = InterruptionSettings::default();
        let notice = [spot_notice("a1", 1000)];
        let refused = NodeReach { handled: &none, drainable: &|_, _| false };
        let (cmds, state) =
            react(&notice, &Default::default(), observed, refused, &BTreeMap::new(), 1000, &settings);
        // The pool is still backed off (it is being reclaimed), but no drain and no raise: a
        // replacement for pods that are not moved would be a second node for the same pods.
        assert!(
            matches!(cmds.as_slice(), [Command::BackOffGroup { group, .. }] if group == "sim/l4-spot-a"),
            "{cmds:?}"
        );
        assert!(state.handled.is_empty(), "not remembered: {state:?}");
        // Once the node may be drained (the next pass), it is handled; the pool is not backed
        // off a second time for the same notice.
        let allowed = NodeReach { handled: &none, drainable: &|_, _| true };
        let (cmds, _) = react(&notice, &state, observed, allowed, &BTreeMap::new(), 1010, &settings);
        assert!(
            matches!(cmds.as_slice(), [Command::InterruptNode { .. }, Command::ScaleGroup { .. }]),
            "{cmds:?}"
        );
    }

    #[test]
    fn pods_are_evicted_just_in_time_within_the_hold() {
        let s = InterruptionSettings::default();
        // AWS's two minutes: 120 - 5 margin - 30 grace - 15 lead.
        assert_eq!(evict_at(1000, Some(1120), 30, &s), 1070);
        // A longer grace period moves the evictions earlier; a window too short for it, to now.
        assert_eq!(evict_at(1000, Some(1120), 90, &s), 1010);
        assert_eq!(evict_at(1000, Some(1030), 30, &s), 1000);
        // A scheduled maintenance an hour ahead: held at most `hold_seconds`.
        assert_eq!(evict_at(1000, Some(4600), 30, &s), 1300);
        // No deadline, or no hold: at once.
        assert_eq!(evict_at(1000, None, 30, &s), 1000);
        assert_eq!(evict_at(1000, Some(1120), 30, &InterruptionSettings { hold_seconds: 0, ..s }), 1000);
    }
}
