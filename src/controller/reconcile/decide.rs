//! The pass's decisions, pure: when a pass is due, the plan, the decision step's commands from
//! the marks on the Nodes, and the numbers the actions need (eviction grace, what a gang rollback
//! may remove). No I/O happens here, so each is tested without a cluster.

use crate::controller::batch::BatchState;
use crate::controller::config::ControllerConfig;
use crate::controller::drain;
use crate::controller::pod_store::PodRecord;
use crate::controller::snapshot::ClusterView;
use crate::model::{NodeGroup, OwnerKind};
use crate::planner::decide::{self as step, Command, DecideSettings, Observed, Replacing};
use crate::planner::{self, PlacementHints, Plan, PlanInput, PlannerSettings};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether a pass is due at `tick` (`now` on the wall clock) given the batch of pending pods and
/// when the next pass was set for; and, while the batch is open, when it closes: planning before
/// then would scale up for part of a burst of pods.
pub(super) fn pass_due(
    batch: BatchState,
    now: Timestamp,
    tick: Instant,
    next_pass: Instant,
) -> (bool, Option<Instant>) {
    match batch {
        BatchState::Open { closes_at } => {
            let wait = closes_at.duration_since(now).unsigned_abs();
            (false, Some(tick + wait))
        }
        BatchState::Ready => (true, None),
        BatchState::Idle => (tick >= next_pass, None),
    }
}

/// How long until the next pass: sooner while work is in progress, so drains and new instances
/// are followed closely.
pub(super) fn pass_interval(busy: bool, resync: Duration) -> Duration {
    if busy {
        resync.min(Duration::from_secs(2))
    } else {
        resync
    }
}

/// Whether the cluster is moving before anything is done this pass: drains under way, or a group
/// whose instances differ from its target.
pub(super) fn in_motion(view: &ClusterView, groups: &[NodeGroup]) -> bool {
    !view.drains.is_empty() || groups.iter().any(|g| g.instances.len() as u32 != g.target_size)
}

/// The planner's settings for a pass at `now`.
pub(super) fn planner_settings(
    planner: &PlannerSettings,
    cfg: &ControllerConfig,
    now: Timestamp,
) -> PlannerSettings {
    PlannerSettings {
        now: Some(now.as_second()),
        unready_seconds: cfg.scale_down_unready_seconds,
        ..planner.clone()
    }
}

/// Plans the pass and keeps where the plan put pending pods for the next one (`hints`).
pub(super) fn plan(
    view: &mut ClusterView,
    groups: &[NodeGroup],
    unavailable: BTreeMap<String, String>,
    hints: &mut PlacementHints,
    settings: &PlannerSettings,
) -> Plan {
    // The snapshot is lent to the planner and taken back: a copy of 50k pods per pass costs
    // more than the conversion of what changed.
    let mut input = PlanInput {
        snapshot: std::mem::take(&mut view.snapshot),
        groups: groups.to_vec(),
        unavailable,
        hints: std::mem::take(hints),
    };
    let planning = Instant::now();
    let plan = planner::plan(&input, settings);
    view.snapshot = std::mem::take(&mut input.snapshot);
    *hints = PlacementHints::of(&plan);
    tracing::debug!(seconds = planning.elapsed().as_secs_f64(), hinted = input.hints.len(), "planned");
    plan
}

/// Whether a gang rollback may remove `instance`: its node (among `nodes`) never registered, or
/// holds no pod but the gang's (`gang_pods`), DaemonSet and mirror pods. `pods` is asked only when
/// the node is there: a rollback mostly meets instances that never registered.
pub(super) fn gang_may_remove(
    instance: &str,
    nodes: &[Arc<Node>],
    pods: impl FnOnce() -> Vec<Arc<PodRecord>>,
    gang_pods: &BTreeSet<String>,
) -> bool {
    let Some(node) =
        nodes.iter().find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(instance))
    else {
        return true;
    };
    let name = node.metadata.name.as_deref();
    pods().iter().all(|r| {
        let Some(w) = r.conversion.pod().map(|p| &p.workload) else { return true };
        w.node_name.as_deref() != name
            || matches!(w.owner, OwnerKind::DaemonSet | OwnerKind::Node)
            || gang_pods.contains(r.id())
    })
}

/// The grace period pod `id` on `node` is evicted with: its own, capped
/// ([`drain::PodFacts::eviction_grace`]).
pub(super) fn eviction_grace(view: &ClusterView, node: &str, id: &str, cfg: &ControllerConfig) -> u32 {
    let pods = view.pods_by_node.get(node).map(Vec::as_slice).unwrap_or_default();
    match pods.iter().find(|p| p.id() == id) {
        Some(p) => p.eviction_grace(cfg),
        None => drain::PodFacts::default().eviction_grace(cfg),
    }
}

/// The decision step as the controller runs it: what is under way (replacements, drains) comes
/// from the marks on the Node objects, only the timers from memory, so a restart or a new leader
/// decides as this process would have.
#[allow(clippy::too_many_arguments)]
pub(super) fn decide_from_marks(
    plan: &Plan,
    timers: &step::LoopState,
    replacing: &BTreeMap<String, drain::ReplaceMarks>,
    drains: &BTreeMap<String, drain::DrainMarks>,
    observed: Observed<'_>,
    now: Timestamp,
    settings: &DecideSettings,
) -> (Vec<Command>, step::LoopState) {
    let state = step::LoopState {
        unneeded_since: timers.unneeded_since.clone(),
        replacing: replacing
            .iter()
            .map(|(n, m)| {
                let r = Replacing {
                    group: m.group.clone(),
                    target: m.target,
                    requested_at: m.requested_at.as_second(),
                };
                (n.clone(), r)
            })
            .collect(),
        draining: drains.keys().cloned().collect(),
    };
    step::decide(plan, &state, observed, now.as_second(), settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterSnapshot, Instance, InstanceState, NodeGroup, NodeState, Resources, Workload};
    use crate::planner::decide::decide;
    use crate::planner::{Replace, ScaleDown};
    use std::collections::BTreeSet;

    /// The replay threads the step's own state; the controller re-reads replacements and drains
    /// from the Node annotations its commands wrote (through `drain::replace_marks_of`, as the
    /// snapshot does). On a scripted sequence of plans and times both must give the same commands.
    #[test]
    fn the_controller_and_the_replay_give_the_same_commands_on_a_scripted_scenario() {
        let (all, _) = crate::sim::autoscale::openb_groups().unwrap();
        let mut groups: Vec<NodeGroup> =
            all.into_iter().filter(|g| g.id.ends_with("/g3") || g.id.ends_with("/g2")).collect();
        let dear = groups.iter().position(|g| g.id.ends_with("/g3")).unwrap();
        let cheap_id = groups[1 - dear].id.clone();
        let mut snapshot = ClusterSnapshot::default();
        for (gi, name) in [(dear, "dear-1"), (dear, "dear-2")] {
            let mut n = crate::planner::cluster::template_node(&groups[gi], name.into(), NodeState::Ready);
            n.provider_id = Some(name.into());
            groups[gi].instances.push(Instance { id: name.into(), state: InstanceState::Running });
            groups[gi].target_size += 1;
            snapshot.nodes.push(n);
        }
        snapshot.workloads.push(Workload {
            id: "default/p".into(),
            requests: Resources::new(1000, 1024),
            node_name: Some("dear-1".into()),
            devices: Some(Default::default()),
            ..Default::default()
        });
        let replace = Replace {
            node: "dear-1".into(),
            group: String::new(),
            replacement_group: cheap_id.clone(),
            pods: vec!["default/p".into()],
            saving_per_hour: 0,
        };
        let remove = ScaleDown {
            node: "dear-2".into(),
            group: String::new(),
            instance: None,
            moves: vec![],
            reason: "empty".into(),
            saving_per_hour: 0,
        };
        let both = Plan {
            replacements: vec![replace.clone()],
            scale_downs: vec![remove.clone()],
            ..Default::default()
        };
        let only_replace = Plan { replacements: vec![replace], ..Default::default() };
        // Unix times with fractions of a second, as the controller's clock gives them.
        let t0 = 1_800_000_000.5_f64;
        let script: Vec<(f64, &Plan)> = vec![
            (0.0, &both),
            (300.0, &only_replace),
            (599.0, &both),
            (600.0, &both),
            (610.0, &both),
            (1199.0, &both),
            (1200.0, &both),
            (1501.0, &both),
            (1502.0, &both),
        ];
        let settings = DecideSettings::default();
        let none = BTreeSet::new();
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &none };
        let at = |dt: f64| Timestamp::from_nanosecond(((t0 + dt) * 1e9) as i128).unwrap();

        let mut replay_state = step::LoopState::default();
        let mut replay = Vec::new();
        let (mut timers, mut annotations, mut drains) = (
            step::LoopState::default(),
            BTreeMap::<String, BTreeMap<String, String>>::new(),
            BTreeMap::new(),
        );
        let mut controller = Vec::new();
        for (dt, plan) in script {
            let now = at(dt);
            let (commands, next) = decide(plan, &replay_state, observed, now.as_second(), &settings);
            replay.push(commands);
            replay_state = next;

            let replacing: BTreeMap<String, drain::ReplaceMarks> = annotations
                .iter()
                .filter_map(|(n, a)| Some((n.clone(), drain::replace_marks_of(a)?)))
                .collect();
            let (commands, next) =
                decide_from_marks(plan, &timers, &replacing, &drains, observed, now, &settings);
            timers = next;
            // The marks the controller's writes leave on the Nodes (`execute`, `KubeActuator`).
            for c in &commands {
                match c {
                    Command::RequestReplacement { node, group, target, .. } => {
                        let a = annotations.entry(node.clone()).or_default();
                        a.insert(drain::REPLACE_WITH.into(), group.clone());
                        a.insert(drain::REPLACE_TARGET.into(), target.to_string());
                        a.insert(drain::REPLACE_REQUESTED_AT.into(), now.to_string());
                    }
                    Command::GiveUpReplacement { node, .. } => {
                        annotations.remove(node);
                    }
                    Command::DrainNode { node, reason } => {
                        let marks = drain::DrainMarks {
                            started_at: now,
                            reason: reason.clone(),
                            evicted: false,
                            was_cordoned: false,
                            notice: None,
                        };
                        drains.insert(node.clone(), marks);
                    }
                    _ => {}
                }
            }
            controller.push(commands);
        }
        assert_eq!(controller, replay);
        // And what they both did: dear-2, out of the plan at 300 s, is timed again from 599 s and
        // drained 600 s later; dear-1's replacement is requested 600 s after 0, re-raised while its
        // group stays below the request, given up more than 900 s after the request (at 1501 s) and
        // requested anew at once, since the plan still replaces the node.
        let kinds: Vec<Vec<String>> = replay
            .iter()
            .map(|cs| {
                cs.iter()
                    .map(|c| match c {
                        Command::ScaleGroup { .. } => "scale".to_string(),
                        Command::DrainNode { node, .. } => format!("drain {node}"),
                        Command::AdvanceDrain { node, .. } => format!("advance {node}"),
                        Command::RequestReplacement { node, target, .. } => {
                            format!("request {node} {target}")
                        }
                        Command::ReraiseReplacement { node, .. } => format!("reraise {node}"),
                        Command::GiveUpReplacement { node, .. } => format!("give up {node}"),
                        Command::Preempt { pod, .. } => format!("preempt for {pod}"),
                        Command::InterruptNode { node, .. } => format!("interrupt {node}"),
                        Command::BackOffGroup { group, .. } => format!("back off {group}"),
                    })
                    .collect()
            })
            .collect();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            kinds,
            vec![
                s(&[]),
                s(&[]),
                s(&[]),
                s(&["request dear-1 1"]),
                s(&["reraise dear-1"]),
                s(&["reraise dear-1", "drain dear-2", "advance dear-2"]),
                s(&["reraise dear-1", "advance dear-2"]),
                s(&["give up dear-1", "request dear-1 1", "advance dear-2"]),
                s(&["reraise dear-1", "advance dear-2"]),
            ]
        );
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    #[test]
    fn a_pass_waits_for_an_open_batch_and_is_due_when_it_closes_or_at_the_resync() {
        let tick = Instant::now();
        let later = tick + Duration::from_secs(60);
        let open = BatchState::Open { closes_at: at(5) };
        assert_eq!(pass_due(open, at(0), tick, tick), (false, Some(tick + Duration::from_secs(5))));
        assert_eq!(pass_due(BatchState::Ready, at(0), tick, later), (true, None));
        assert_eq!(pass_due(BatchState::Idle, at(0), tick, later), (false, None));
        assert_eq!(pass_due(BatchState::Idle, at(0), later, later), (true, None));
        let resync = Duration::from_secs(30);
        assert_eq!(pass_interval(true, resync), Duration::from_secs(2));
        assert_eq!(pass_interval(false, resync), resync);
        assert_eq!(pass_interval(true, Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[test]
    fn evictions_ask_the_pods_own_grace_capped_and_the_default_for_an_unknown_pod() {
        let cfg = ControllerConfig { drain_grace_cap_seconds: 120.0, ..Default::default() };
        let facts = |name: &str, grace| drain::PodFacts {
            namespace: "ml".into(),
            name: name.into(),
            grace_seconds: grace,
            ..Default::default()
        };
        let mut view = ClusterView::default();
        view.pods_by_node.insert("n1".into(), vec![facts("short", Some(10)), facts("long", Some(1800))]);
        assert_eq!(eviction_grace(&view, "n1", "ml/short", &cfg), 10);
        assert_eq!(eviction_grace(&view, "n1", "ml/long", &cfg), 120);
        assert_eq!(eviction_grace(&view, "n2", "ml/short", &cfg), drain::DEFAULT_GRACE_SECONDS);
    }

    fn pod_on(name: &str, node: &str, owner: &str) -> Arc<PodRecord> {
        let api = if owner == "Job" { "batch/v1" } else { "apps/v1" };
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml",
                "ownerReferences": [{"apiVersion": api, "kind": owner, "name": "o", "uid": "u", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        Arc::new(PodRecord::new(pod, &ControllerConfig::default().training.checkpoint_annotation))
    }

    #[test]
    fn a_gang_rollback_removes_only_unregistered_instances_and_nodes_holding_nothing_else() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"}, "spec": {"providerID": "i-1"}
        }))
        .unwrap();
        let nodes = vec![Arc::new(node)];
        let gang: BTreeSet<String> = ["ml/g-0".to_string()].into();
        // Never registered: the pods are not even read.
        assert!(gang_may_remove("i-2", &nodes, || unreachable!(), &gang));
        let gang_and_daemons = || vec![pod_on("g-0", "n1", "Job"), pod_on("agent", "n1", "DaemonSet")];
        assert!(gang_may_remove("i-1", &nodes, gang_and_daemons, &gang));
        let elsewhere = || vec![pod_on("g-0", "n1", "Job"), pod_on("other", "n9", "Job")];
        assert!(gang_may_remove("i-1", &nodes, elsewhere, &gang));
        let other_work = || vec![pod_on("g-0", "n1", "Job"), pod_on("other", "n1", "Job")];
        assert!(!gang_may_remove("i-1", &nodes, other_work, &gang));
    }
}
