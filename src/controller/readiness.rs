//! Instances that never became capacity, and how long nodes have been unready.
//!
//! Which nodes are capacity is judged by [`crate::planner::readiness::judge_nodes`], the same in
//! `gpuscale plan`. What this module adds is the controller's memory and the one removal that
//! skips the drain path, Cluster Autoscaler's `max-node-provision-time`: an instance whose node
//! never registered, or registered and never turned Ready, is removed after
//! `registrationTimeoutSeconds` and its group backed off (through the provider's
//! [`crate::providers::politeness::Polite`] memory), so the planner tries another group. A node
//! that has been Ready, or that holds any pod other than DaemonSet and mirror pods, is never
//! removed here: it is unready at worst, and leaves only through a drain.

use crate::model::{InstanceState, Node, NodeGroup, NodeState, OwnerKind, Workload};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

pub use crate::planner::readiness::{classify, Readiness};

/// A Ready condition that changed this soon after the node registered has never been True: the
/// kubelet posts NotReady on registration and the node lifecycle controller turns a silent one
/// Unknown after its grace period (40 s by default).
pub const NEVER_READY_SLACK_SECONDS: i64 = 120;

/// Keeps, per live instance, when this controller first saw it (providers do not all report
/// launch times). In memory only: after a restart the count starts again, which only delays a
/// removal. Instances that are gone are forgotten.
pub fn track_instances(first_seen: &mut BTreeMap<String, Timestamp>, groups: &[NodeGroup], now: Timestamp) {
    let mut live = BTreeMap::new();
    for i in groups.iter().flat_map(|g| &g.instances) {
        if matches!(i.state, InstanceState::Pending | InstanceState::Running) {
            live.insert(i.id.clone(), first_seen.get(&i.id).copied().unwrap_or(now));
        }
    }
    *first_seen = live;
}

/// Keeps when each node was first seen unready for a reason no condition dates (its GPUs
/// regressed while Ready), and writes it into the nodes' `unready_since`, so the unready time
/// counts from there. In memory only: a restart starts the count again (a removal is delayed,
/// never hastened). Nodes no longer unready are forgotten.
pub fn track_unready(since: &mut BTreeMap<String, i64>, nodes: &mut [Node], now: i64) {
    let mut kept = BTreeMap::new();
    for n in nodes.iter_mut().filter(|n| n.state == NodeState::Unready) {
        if n.lifecycle.unready_since.is_none() {
            let t = since.get(&n.name).copied().unwrap_or(now);
            n.lifecycle.unready_since = Some(t);
        }
        kept.insert(n.name.clone(), n.lifecycle.unready_since.unwrap_or(now));
    }
    *since = kept;
}

/// An instance to remove because its node did not come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// Group id.
    pub group: String,
    /// Instance id.
    pub instance: String,
    /// Its Node, if it registered.
    pub node: Option<String>,
    /// Why.
    pub reason: String,
}

/// Whether `node` has never been Ready: NotReady now, and its Ready condition has not changed
/// since it registered (or it has none).
pub fn never_ready(node: &Node) -> bool {
    let l = &node.lifecycle;
    l.not_ready
        && match (l.created_at, l.ready_changed_at) {
            (Some(created), Some(changed)) => changed - created <= NEVER_READY_SLACK_SECONDS,
            (_, None) => true,
            (None, Some(_)) => false,
        }
}

/// Instances that never became capacity within `timeout`: no Node registered (counted from when
/// this controller first saw the instance), or a Node that registered more than `timeout` ago,
/// has never been Ready and holds no pod but DaemonSet and mirror pods. `nodes` are judged
/// already ([`crate::planner::readiness::judge_nodes`]); `pods` are the snapshot's.
pub fn stuck_instances(
    groups: &[NodeGroup],
    nodes: &[Node],
    pods: &[Workload],
    first_seen: &BTreeMap<String, Timestamp>,
    now: Timestamp,
    timeout: Duration,
) -> Vec<Stuck> {
    let busy: HashSet<&str> = pods
        .iter()
        .filter(|w| !matches!(w.owner, OwnerKind::DaemonSet | OwnerKind::Node))
        .filter_map(|w| w.node_name.as_deref())
        .collect();
    let by_instance: BTreeMap<&str, &Node> =
        nodes.iter().filter_map(|n| n.provider_id.as_deref().map(|p| (p, n))).collect();
    let older = |t: Timestamp| now > t && now.duration_since(t).unsigned_abs() >= timeout;
    let mut out = Vec::new();
    for g in groups {
        for i in &g.instances {
            if !matches!(i.state, InstanceState::Pending | InstanceState::Running) {
                continue;
            }
            let Some(&seen) = first_seen.get(&i.id) else { continue };
            if !older(seen) {
                continue;
            }
            let node = by_instance.get(i.id.as_str()).copied();
            let reason = match node {
                None => format!("no node registered within {}s", timeout.as_secs()),
                Some(n) => {
                    let registered = n.lifecycle.created_at.and_then(|c| Timestamp::from_second(c).ok());
                    if n.state == NodeState::Deleting
                        || !never_ready(n)
                        || busy.contains(n.name.as_str())
                        || !registered.is_some_and(older)
                    {
                        continue;
                    }
                    format!("node {} registered but never became Ready within {}s", n.name, timeout.as_secs())
                }
            };
            out.push(Stuck {
                group: g.id.clone(),
                instance: i.id.clone(),
                node: node.map(|n| n.name.clone()),
                reason,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDevice, GpuMode, Instance, MigInstance};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn gpu_node(n: usize, mode: GpuMode) -> Node {
        Node {
            name: "n".into(),
            gpus: (0..n)
                .map(|i| GpuDevice { mode: mode.clone(), ..GpuDevice::standard(i as u8, 81920) })
                .collect(),
            gpu_model: Some("A100-SXM4-80GB".into()),
            ..Default::default()
        }
    }

    #[test]
    fn ready_only_with_the_templates_gpus() {
        let template = gpu_node(8, GpuMode::Standard);
        assert_eq!(classify(&gpu_node(8, GpuMode::Standard), Some(&template)), Readiness::Ready);
        assert!(
            matches!(classify(&gpu_node(4, GpuMode::Standard), Some(&template)), Readiness::InFlight(r) if r.contains("4 of the 8"))
        );
        let mut init = gpu_node(8, GpuMode::Standard);
        init.state = NodeState::Initializing;
        assert!(matches!(classify(&init, Some(&template)), Readiness::InFlight(_)));
        let sliced = gpu_node(2, GpuMode::TimeSliced { replicas: 4 });
        assert!(
            matches!(classify(&gpu_node(2, GpuMode::Standard), Some(&sliced)), Readiness::InFlight(r) if r.contains("time-sliced"))
        );
        assert_eq!(
            classify(&gpu_node(2, GpuMode::TimeSliced { replicas: 4 }), Some(&sliced)),
            Readiness::Ready
        );
        let geometry = crate::model::GpuCatalog.resolve("A100-SXM4-80GB").and_then(|m| m.mig).unwrap();
        let layout = geometry.maximal_layouts().into_iter().next().unwrap();
        let mig = |k: usize| GpuMode::Mig {
            instances: layout
                .iter()
                .take(k)
                .map(|p| MigInstance { placement: p.clone(), used: false })
                .collect(),
            dynamic: false,
        };
        let want = layout.len();
        assert!(
            matches!(classify(&gpu_node(1, GpuMode::Standard), Some(&gpu_node(1, mig(want)))), Readiness::InFlight(r) if r.contains("MIG"))
        );
        assert_eq!(classify(&gpu_node(1, mig(want)), Some(&gpu_node(1, mig(want)))), Readiness::Ready);
        // A CPU group's node is ready when the node is.
        assert_eq!(classify(&Node::default(), Some(&Node::default())), Readiness::Ready);
    }

    fn group_of_three(template: Node) -> NodeGroup {
        NodeGroup {
            id: "sim/gpu".into(),
            account: "sim".into(),
            instance_type: "p4d.24xlarge".into(),
            zones: vec![],
            capacity_type: Default::default(),
            price: 1,
            min_size: 0,
            max_size: 10,
            target_size: 3,
            instances: ["i-1", "i-2", "i-3"]
                .iter()
                .map(|id| Instance { id: id.to_string(), state: InstanceState::Running })
                .collect(),
            template,
        }
    }

    fn registered(name: &str, instance: &str, created: i64) -> Node {
        let mut n = gpu_node(8, GpuMode::Standard);
        n.name = name.into();
        n.provider_id = Some(instance.into());
        n.lifecycle.created_at = Some(t(created).as_second());
        n
    }

    #[test]
    fn instances_whose_node_never_came_are_stuck_after_the_timeout() {
        let group = group_of_three(gpu_node(8, GpuMode::Standard));
        let mut seen = BTreeMap::new();
        track_instances(&mut seen, std::slice::from_ref(&group), t(0));
        let ready = registered("n1", "i-1", 60);
        // Registered, never Ready: NotReady since it registered.
        let mut never = registered("n2", "i-2", 60);
        never.state = NodeState::Initializing;
        never.lifecycle.not_ready = true;
        never.lifecycle.ready_changed_at = Some(t(70).as_second());
        let nodes = vec![ready, never];
        let timeout = Duration::from_secs(600);
        let stuck = |nodes: &[Node], pods: &[Workload], at| {
            stuck_instances(std::slice::from_ref(&group), nodes, pods, &seen, t(at), timeout)
        };
        assert!(stuck(&nodes, &[], 599).is_empty());
        // i-3 never registered; n2 registered at 60 s, so it is judged from 660 s.
        let ids = |s: Vec<Stuck>| s.into_iter().map(|s| (s.instance, s.node)).collect::<Vec<_>>();
        assert_eq!(ids(stuck(&nodes, &[], 601)), vec![("i-3".to_string(), None)]);
        assert_eq!(
            ids(stuck(&nodes, &[], 661)),
            vec![("i-2".to_string(), Some("n2".to_string())), ("i-3".to_string(), None)]
        );
        // A pod on it (kube-scheduler binds to NotReady nodes only with tolerations; a DaemonSet
        // pod does not count): kept.
        let pod =
            |owner| Workload { id: "ml/p".into(), node_name: Some("n2".into()), owner, ..Default::default() };
        assert_eq!(stuck(&nodes, &[pod(OwnerKind::DaemonSet)], 661).len(), 2);
        assert_eq!(ids(stuck(&nodes, &[pod(OwnerKind::Job)], 661)), vec![("i-3".to_string(), None)]);
        // First-seen times survive refreshes; gone instances are forgotten.
        let mut later = group.clone();
        later.instances.truncate(1);
        track_instances(&mut seen, &[later], t(700));
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![("i-1".to_string(), t(0))]);
    }

    /// The review's finding 0: any node "in flight" after a controller start was terminated
    /// without a drain 15 minutes later: one NotReady for a pass, every node during a device
    /// plugin restart, a node the MIG manager re-partitions, one with an unhealthy GPU. A node
    /// that has been Ready is never stuck, whatever it looks like now.
    #[test]
    fn a_node_that_has_been_ready_is_never_stuck() {
        let group = group_of_three(gpu_node(8, GpuMode::Standard));
        let mut seen = BTreeMap::new();
        track_instances(&mut seen, std::slice::from_ref(&group), t(0));
        let timeout = Duration::from_secs(900);
        // NotReady for a pass, a day after it registered and turned Ready.
        let mut blip = registered("blip", "i-1", -86_400);
        blip.state = NodeState::Unready;
        blip.lifecycle.not_ready = true;
        blip.lifecycle.ready_changed_at = Some(t(-5).as_second());
        // Its device plugin restarting: Ready, no GPUs advertised.
        let mut plugin = registered("plugin", "i-2", -86_400);
        plugin.state = NodeState::Unready;
        plugin.gpus.clear();
        plugin.lifecycle.gpus_held = Some(crate::model::GpusHeld::DevicePlugin);
        // Re-partitioned by the MIG manager.
        let mut mig = registered("mig", "i-3", -86_400);
        mig.state = NodeState::Unready;
        mig.lifecycle.gpus_held = Some(crate::model::GpusHeld::MigReconfiguring);
        let nodes = [blip, plugin, mig];
        for at in [901, 100_000] {
            let stuck = stuck_instances(std::slice::from_ref(&group), &nodes, &[], &seen, t(at), timeout);
            assert!(stuck.is_empty(), "{stuck:?}");
        }
    }

    #[test]
    fn unready_time_counts_from_the_first_pass_that_saw_it_and_is_forgotten_when_ready() {
        let mut since = BTreeMap::new();
        let mut n = registered("a", "i-1", 0);
        n.state = NodeState::Unready;
        let mut nodes = vec![n.clone()];
        track_unready(&mut since, &mut nodes, 100);
        assert_eq!(nodes[0].lifecycle.unready_since, Some(100));
        let mut nodes = vec![n.clone()];
        track_unready(&mut since, &mut nodes, 500);
        assert_eq!(nodes[0].lifecycle.unready_since, Some(100), "kept between passes");
        n.state = NodeState::Ready;
        track_unready(&mut since, &mut [n.clone()], 600);
        assert!(since.is_empty());
    }
}
