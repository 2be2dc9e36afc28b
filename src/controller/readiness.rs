//! New-node readiness.
//!
//! A node is in flight until it is Ready and advertises the GPU resources its group's template
//! promises (whole GPUs, MIG profiles, time-sliced replicas): a GPU node whose device plugin has
//! not started yet would otherwise look like an empty node to remove, or a full one to scale
//! past. Instances that never register, or never become ready with their GPUs, are removed after a
//! timeout and their group is backed off (through the provider's
//! [`crate::providers::politeness::Polite`] memory), so the planner tries another group.

use crate::model::{InstanceState, Node, NodeGroup, NodeState};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::planner::readiness::{classify, Readiness};

/// Keeps, per live instance, when this controller first saw it (providers do not all report
/// launch times). Instances that are gone are forgotten.
pub fn track_instances(first_seen: &mut BTreeMap<String, Timestamp>, groups: &[NodeGroup], now: Timestamp) {
    let mut live = BTreeMap::new();
    for i in groups.iter().flat_map(|g| &g.instances) {
        if matches!(i.state, InstanceState::Pending | InstanceState::Running) {
            live.insert(i.id.clone(), first_seen.get(&i.id).copied().unwrap_or(now));
        }
    }
    *first_seen = live;
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

/// Instances older than `timeout` whose node has not registered, or is still in flight.
pub fn stuck_instances(
    groups: &[NodeGroup],
    nodes: &[Node],
    first_seen: &BTreeMap<String, Timestamp>,
    now: Timestamp,
    timeout: Duration,
) -> Vec<Stuck> {
    let mut out = Vec::new();
    for g in groups {
        for i in &g.instances {
            if !matches!(i.state, InstanceState::Pending | InstanceState::Running) {
                continue;
            }
            let Some(&seen) = first_seen.get(&i.id) else { continue };
            if now <= seen || now.duration_since(seen).unsigned_abs() < timeout {
                continue;
            }
            let node = nodes.iter().find(|n| n.provider_id.as_deref() == Some(i.id.as_str()));
            let reason = match node.map(|n| (n, classify(n, Some(&g.template)))) {
                None => format!("no node registered within {}s", timeout.as_secs()),
                Some((_, Readiness::Ready)) => continue,
                Some((n, Readiness::InFlight(why))) if n.state != NodeState::Deleting => {
                    format!("node {} {why} after {}s", n.name, timeout.as_secs())
                }
                Some(_) => continue,
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

    #[test]
    fn instances_without_a_ready_node_are_stuck_after_the_timeout() {
        let template = gpu_node(8, GpuMode::Standard);
        let group = NodeGroup {
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
            template: template.clone(),
        };
        let mut seen = BTreeMap::new();
        track_instances(&mut seen, std::slice::from_ref(&group), t(0));
        let mut ready = gpu_node(8, GpuMode::Standard);
        ready.provider_id = Some("i-1".into());
        let mut partial = gpu_node(2, GpuMode::Standard);
        partial.name = "n2".into();
        partial.provider_id = Some("i-2".into());
        let nodes = vec![ready, partial];
        let timeout = Duration::from_secs(600);
        assert!(stuck_instances(std::slice::from_ref(&group), &nodes, &seen, t(599), timeout).is_empty());
        let stuck = stuck_instances(std::slice::from_ref(&group), &nodes, &seen, t(601), timeout);
        let ids: Vec<_> = stuck.iter().map(|s| (s.instance.as_str(), s.node.as_deref())).collect();
        assert_eq!(ids, vec![("i-2", Some("n2")), ("i-3", None)]);
        assert!(stuck[1].reason.contains("no node registered"));
        // First-seen times survive refreshes; gone instances are forgotten.
        let mut later = group.clone();
        later.instances.truncate(1);
        track_instances(&mut seen, &[later], t(700));
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![("i-1".to_string(), t(0))]);
    }
}
