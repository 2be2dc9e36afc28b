//! The one gate every destructive call of the controller passes: starting a drain (whose
//! evictions follow), terminating a drained node's instance and deleting its Node, removing an
//! instance that never became capacity. Each check is pure, reads what is under way from the
//! cluster (drain marks live on the Node objects, so a restart or a new leader counts them too)
//! and says why it refuses; leadership is checked by the actuator's fence before each write.
//!
//! The rules are Cluster Autoscaler's (`core/scaledown`'s NodeDeletionTracker and
//! `max-scale-down-parallelism`, `utils/drain`) and Karpenter's (disruption budgets count nodes
//! already being disrupted; only nodes it owns are touched):
//! - only a node the cloud lists as a running instance of a managed group is ever drained for
//!   removal or terminated (a node matched to a group by its label alone is not);
//! - a group never goes below its minimum size, counting the removals already under way;
//! - no more nodes are drained or removed at once than `maxScaleDownParallelism`;
//! - an instance is terminated only when no pod but DaemonSet and mirror pods is left on its
//!   node, terminating ones included.

use super::config::ControllerConfig;
use super::drain::PodFacts;
use crate::model::{InstanceState, Node, NodeGroup, NoticeKind};
use std::collections::BTreeMap;

/// A rule of the gate broken on purpose: the fault-injection suite runs a controller with one
/// and checks that its auditor sees the violation, so an invariant that never fires is known to be
/// able to. Reached only through [`super::reconcile::ControllerOptions`], never from a config.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mutant {
    /// Every rule kept.
    #[default]
    None,
    /// A node chosen for removal is terminated at once, without a drain.
    SkipDrain,
    /// Minimum sizes are taken to be 0, in the plan and in the gate.
    IgnoreMinimum,
    /// `maxScaleDownParallelism` is taken to be unbounded.
    IgnoreParallelism,
    /// Pods are deleted instead of evicted through the Eviction API (PodDisruptionBudgets are
    /// not asked).
    DeletePods,
    /// The replica acts whether or not it holds the leader Lease.
    IgnoreLease,
}

/// Removals under way: drains started (their marks are on the Nodes) and instances removed in
/// this pass, per group and in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InProgress {
    per_group: BTreeMap<String, u32>,
    total: u32,
}

impl InProgress {
    /// What is under way: the nodes being drained (`drains`, by name) of `nodes`.
    pub fn of<'a>(
        drains: impl IntoIterator<Item = &'a String>,
        nodes: &[Node],
        groups: &[NodeGroup],
    ) -> Self {
        let mut out = Self::default();
        let by_name: BTreeMap<&str, &Node> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        for name in drains {
            let group = by_name.get(name.as_str()).and_then(|n| member_of(n, groups)).map(|g| &groups[g].id);
            out.add(group.map(String::as_str));
        }
        out
    }

    /// Counts one more removal (of a node of `group`, if known).
    pub fn add(&mut self, group: Option<&str>) {
        self.total += 1;
        if let Some(g) = group {
            *self.per_group.entry(g.to_string()).or_default() += 1;
        }
    }

    /// Removals under way in `group`.
    pub fn in_group(&self, group: &str) -> u32 {
        self.per_group.get(group).copied().unwrap_or(0)
    }
}

/// The group whose cloud-listed, live instances include `node`'s provider id: the only proof
/// that a node is ours to remove.
pub fn member_of(node: &Node, groups: &[NodeGroup]) -> Option<usize> {
    let pid = node.provider_id.as_deref()?;
    groups.iter().position(|g| {
        g.instances
            .iter()
            .any(|i| i.id == pid && matches!(i.state, InstanceState::Pending | InstanceState::Running))
    })
}

/// Whether one more node of `group` may be removed now: the group stays at or above its minimum
/// counting the removals under way, and the cluster-wide parallelism is not exceeded.
fn room(group: &NodeGroup, in_progress: &InProgress, config: &ControllerConfig) -> Result<(), String> {
    let leaving = in_progress.in_group(&group.id);
    if group.target_size.saturating_sub(leaving) <= group.min_size {
        return Err(format!(
            "group {} at its min size {} (target {}, {leaving} removal(s) under way)",
            group.id, group.min_size, group.target_size
        ));
    }
    if in_progress.total >= config.max_scale_down_parallelism {
        return Err(format!(
            "{} removal(s) under way, the most maxScaleDownParallelism allows",
            in_progress.total
        ));
    }
    Ok(())
}

/// May the drain of `node` (for removal or replacement) start? Returns its group.
pub fn may_drain(
    node: &Node,
    groups: &[NodeGroup],
    in_progress: &InProgress,
    config: &ControllerConfig,
) -> Result<usize, String> {
    let g = member_of(node, groups).ok_or_else(|| {
        format!(
            "node {} is not a running instance of any managed group the cloud lists (provider id {})",
            node.name,
            node.provider_id.as_deref().unwrap_or("none")
        )
    })?;
    room(&groups[g], in_progress, config)?;
    Ok(g)
}

/// May the drain of a node under a notice of `kind` start? A node the cloud takes anyway
/// ([`NoticeKind::is_involuntary`]) needs only to be a confirmed member: its pods leave before
/// the deadline whatever the minimum or the parallelism, since they would die with it otherwise.
/// A rebalance recommendation is a voluntary disruption and passes [`may_drain`].
pub fn may_drain_noticed(
    node: &Node,
    kind: NoticeKind,
    groups: &[NodeGroup],
    in_progress: &InProgress,
    config: &ControllerConfig,
) -> Result<usize, String> {
    if !kind.is_involuntary() {
        return may_drain(node, groups, in_progress, config);
    }
    member_of(node, groups).ok_or_else(|| {
        format!(
            "node {} under a {} notice is not a running instance of any managed group the cloud lists",
            node.name,
            kind.name()
        )
    })
}

/// May a drained node's instance be terminated and its Node deleted? Only a confirmed member
/// whose pods (other than DaemonSet and mirror pods) are all gone, in a group above its minimum.
/// `in_progress` counts the other removals under way (not this node's).
pub fn may_terminate(
    node: &Node,
    pods: &[PodFacts],
    groups: &[NodeGroup],
    in_progress: &InProgress,
) -> Result<usize, String> {
    let g = member_of(node, groups)
        .ok_or_else(|| format!("node {} is not a running instance of a managed group", node.name))?;
    if let Some(p) = pods.iter().find(|p| !p.terminal && !p.is_node_bound()) {
        return Err(format!("pod {} is still on node {}", p.id(), node.name));
    }
    let group = &groups[g];
    let leaving = in_progress.in_group(&group.id);
    if group.target_size.saturating_sub(leaving) <= group.min_size {
        return Err(format!(
            "group {} at its min size {} (target {}, {leaving} other removal(s) under way)",
            group.id, group.min_size, group.target_size
        ));
    }
    Ok(g)
}

/// May an instance that never became capacity be removed from `group`?
pub fn may_remove_stuck(
    group: &NodeGroup,
    in_progress: &InProgress,
    config: &ControllerConfig,
) -> Result<(), String> {
    room(group, in_progress, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Instance, OwnerKind};

    fn group(target: u32, min: u32, ids: &[&str]) -> NodeGroup {
        NodeGroup {
            id: "aws/prod/gpu".into(),
            account: "prod".into(),
            instance_type: "p4d.24xlarge".into(),
            zones: vec![],
            capacity_type: Default::default(),
            price: 1,
            min_size: min,
            max_size: 10,
            target_size: target,
            instances: ids
                .iter()
                .map(|id| Instance { id: id.to_string(), state: InstanceState::Running })
                .collect(),
            template: Node::default(),
        }
    }

    fn node(name: &str, pid: &str) -> Node {
        Node {
            name: name.into(),
            provider_id: Some(pid.into()),
            node_group: Some("gpu".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_matched_by_label_alone_is_never_drained() {
        let groups = vec![group(3, 0, &["i-1", "i-2", "i-3"])];
        let cfg = ControllerConfig::default();
        let none = InProgress::default();
        assert_eq!(may_drain(&node("a", "i-1"), &groups, &none, &cfg), Ok(0));
        // Same group label, an instance the cloud does not list in the group (a Karpenter node,
        // another account's group of the same name).
        let err = may_drain(&node("k", "i-other"), &groups, &none, &cfg).unwrap_err();
        assert!(err.contains("not a running instance"), "{err}");
    }

    #[test]
    fn removals_under_way_count_against_the_minimum_and_the_parallelism() {
        let groups = vec![group(3, 2, &["i-1", "i-2", "i-3"])];
        let nodes = vec![node("a", "i-1"), node("b", "i-2"), node("c", "i-3")];
        let cfg = ControllerConfig::default();
        assert_eq!(may_drain(&nodes[1], &groups, &InProgress::default(), &cfg), Ok(0));
        // Node a is being drained (its PDB refuses for long): b may not start, the group would
        // end at 1 < min 2.
        let drains = ["a".to_string()];
        let under_way = InProgress::of(&drains, &nodes, &groups);
        let err = may_drain(&nodes[1], &groups, &under_way, &cfg).unwrap_err();
        assert!(err.contains("min size 2") && err.contains("1 removal(s) under way"), "{err}");
        // Parallelism across groups.
        let wide = vec![group(10, 0, &["i-1", "i-2", "i-3"])];
        let cfg = ControllerConfig { max_scale_down_parallelism: 1, ..Default::default() };
        let under_way = InProgress::of(&drains, &nodes, &wide);
        assert!(may_drain(&nodes[1], &wide, &under_way, &cfg)
            .unwrap_err()
            .contains("maxScaleDownParallelism"));
    }

    #[test]
    fn a_node_the_cloud_takes_is_drained_at_the_minimum_but_only_if_it_is_ours() {
        // One node, at the group's minimum, with a drain already under way elsewhere and a
        // parallelism of 1: a voluntary drain is refused, the reclaimed node's is not.
        let groups = vec![group(1, 1, &["i-1"])];
        let nodes = vec![node("a", "i-1"), node("x", "i-x")];
        let cfg = ControllerConfig { max_scale_down_parallelism: 1, ..Default::default() };
        let under_way = InProgress::of(&["x".to_string()], &nodes, &groups);
        let rebalance = may_drain_noticed(&nodes[0], NoticeKind::Rebalance, &groups, &under_way, &cfg);
        assert!(rebalance.unwrap_err().contains("min size 1"));
        for kind in [NoticeKind::SpotInterruption, NoticeKind::ScheduledMaintenance, NoticeKind::Terminating]
        {
            assert_eq!(may_drain_noticed(&nodes[0], kind, &groups, &under_way, &cfg), Ok(0), "{kind:?}");
        }
        // Not a listed instance of a managed group: not ours to drain, whatever the notice.
        let err = may_drain_noticed(&nodes[1], NoticeKind::SpotInterruption, &groups, &under_way, &cfg);
        assert!(err.unwrap_err().contains("not a running instance"));
    }

    #[test]
    fn an_instance_is_terminated_only_when_its_pods_are_gone() {
        let groups = vec![group(3, 0, &["i-1", "i-2", "i-3"])];
        let n = node("a", "i-1");
        let none = InProgress::default();
        let ds = PodFacts { name: "ds".into(), owner: OwnerKind::DaemonSet, ..Default::default() };
        assert_eq!(may_terminate(&n, std::slice::from_ref(&ds), &groups, &none), Ok(0));
        let web = PodFacts {
            namespace: "ml".into(),
            name: "trainer".into(),
            owner: OwnerKind::Job,
            deletion: Some(super::super::drain::Deletion {
                at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                grace: std::time::Duration::from_secs(30),
            }),
            ..Default::default()
        };
        let err = may_terminate(&n, &[ds, web], &groups, &none).unwrap_err();
        assert!(err.contains("ml/trainer is still on node a"), "{err}");
        assert!(may_terminate(&node("k", "i-9"), &[], &groups, &none).is_err());
    }
}
