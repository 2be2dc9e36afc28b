//! Scale-down and consolidation: which nodes can go because their pods fit elsewhere, and which
//! expensive nodes one cheaper node can replace.

use super::cluster::{members_of, next_node, next_zone, NodeInfo, Origin};
use super::plan::{Kept, Replace, ScaleDown};
use super::scale_up::pack_fresh;
use super::{PlanInput, PlannerSettings};
use crate::model::{
    DeviceAssignment, DrainRules, Node, NodeGroup, NodeId, NodeState, OwnerKind, Workload, GPU_MILLI,
};
use crate::scheduler::{Placement, Placer};
use std::collections::BTreeMap;

/// What the scale-down step has decided so far.
struct DrainState {
    /// Nodes already removed.
    removed: Vec<bool>,
    /// Nodes that take pods moved off removed nodes: they stay, so that no pod is evicted twice
    /// in one plan (once off its node, again off the node it went to).
    received: Vec<bool>,
    /// Per group, how many more nodes may go before its min size.
    removable: Vec<u32>,
    /// Per PDB, evictions still allowed.
    budgets: BTreeMap<String, u32>,
}

impl DrainState {
    /// Records pods moved off a removed node: their destinations stay, and each running pod's
    /// eviction uses up one disruption of every PDB covering it.
    fn count_moves(&mut self, moved: &[(usize, Placement)], input: &PlanInput) {
        let workloads = &input.snapshot.workloads;
        for (wi, p) in moved.iter().filter(|(wi, _)| workloads[*wi].node_name.is_some()) {
            self.received[p.node] = true;
            for b in input.snapshot.disruption_budgets.iter().filter(|b| b.covers(&workloads[*wi])) {
                let left = self.budgets.entry(b.id.clone()).or_default();
                *left = left.saturating_sub(1);
            }
        }
    }
}

/// Result of the scale-down step.
pub(crate) struct ScaleDowns {
    pub scale_downs: Vec<ScaleDown>,
    pub replacements: Vec<Replace>,
    pub kept: Vec<Kept>,
}

/// How much of a node is in use: GPU allocation for GPU nodes (device-plugin GPUs, else the
/// GPUs it publishes through DRA, whole or as MIG devices), otherwise the larger of CPU and
/// memory. GPU nodes are judged by their GPUs because that is what they cost.
pub fn utilization(node: &Node) -> f64 {
    let (capacity, used) = gpu_milli(node);
    if capacity > 0 {
        return used as f64 / capacity as f64;
    }
    let cpu = node.allocated.cpu_milli as f64 / node.allocatable.cpu_milli.max(1) as f64;
    let mem = node.allocated.memory_bytes as f64 / node.allocatable.memory_bytes.max(1) as f64;
    cpu.max(mem)
}

/// A node's GPU capacity and what pods hold of it, in milli-GPU: its device-plugin GPUs and
/// the GPUs it publishes through DRA together (a node may have both).
fn gpu_milli(node: &Node) -> (u64, u64) {
    let (dra_gpus, dra_held) = node.dra.gpu_use();
    let plugin = node.gpu_milli_capacity();
    let plugin_used = (node.gpu_allocation() * plugin as f64).round() as u64;
    (plugin + dra_gpus as u64 * u64::from(GPU_MILLI), plugin_used + dra_held)
}

/// Pods that must move off a node, or why the node cannot be drained.
fn movable_pods(
    workloads: &[Workload],
    pods: &[(usize, DeviceAssignment)],
    budgets: &BTreeMap<String, u32>,
    input: &PlanInput,
    rules: DrainRules,
) -> Result<Vec<(usize, DeviceAssignment)>, String> {
    let mut out = Vec::new();
    let mut needed: BTreeMap<&str, u32> = BTreeMap::new();
    for (wi, devices) in pods {
        let w = &workloads[*wi];
        if matches!(w.owner, OwnerKind::DaemonSet | OwnerKind::Node) {
            continue;
        }
        let running = w.node_name.is_some();
        if running {
            if let Some(reason) = w.drain_blocker(rules, &input.snapshot.disruption_budgets) {
                return Err(reason);
            }
            for b in input.snapshot.disruption_budgets.iter().filter(|b| b.covers(w)) {
                let n = needed.entry(b.id.as_str()).or_default();
                *n += 1;
                if *n > budgets.get(&b.id).copied().unwrap_or(0) {
                    return Err(format!(
                        "PodDisruptionBudget {} allows no more disruptions (pod {})",
                        b.id, w.id
                    ));
                }
            }
        }
        out.push((*wi, devices.clone()));
    }
    Ok(out)
}

/// Moves pods off `from` onto nodes `allowed` accepts; all or nothing.
fn relocate(
    placer: &mut Placer<'_>,
    info: &mut [NodeInfo],
    workloads: &[Workload],
    from: NodeId,
    pods: &[(usize, DeviceAssignment)],
    (allowed, preferred): (&dyn Fn(NodeId) -> bool, &dyn Fn(NodeId) -> bool),
) -> Option<Vec<(usize, Placement)>> {
    for (wi, devices) in pods {
        placer.release(&workloads[*wi], &Placement { node: from, devices: devices.clone() });
    }
    // Claims no pod left on the node uses are given up with it (the resourceclaim controller
    // deletes a pod's generated claim and deallocates a named one nobody reserves): the moved
    // pods need their claims allocated afresh where they go.
    let freed = placer.free_unused_claims(from);
    let freed_keys: std::collections::HashSet<String> = freed.iter().map(|(k, _)| k.clone()).collect();
    let moving: Vec<std::borrow::Cow<'_, Workload>> = pods
        .iter()
        .map(|(wi, _)| {
            let w = &workloads[*wi];
            if w.dra_claims.iter().any(|c| freed_keys.contains(&c.key)) {
                let mut w = w.clone();
                for c in w.dra_claims.iter_mut().filter(|c| freed_keys.contains(&c.key)) {
                    (c.allocated, c.allocated_on) = (false, None);
                }
                std::borrow::Cow::Owned(w)
            } else {
                std::borrow::Cow::Borrowed(w)
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..pods.len()).collect();
    // Hardest to place first.
    order.sort_by_key(|&i| {
        let w = &moving[i];
        std::cmp::Reverse((w.gpu.gpu_milli(0, None, 1), w.requests.cpu_milli, w.requests.memory_bytes))
    });
    let mut moved = Vec::new();
    for i in order {
        let placed = placer
            .place_where(&moving[i], &|n| n != from && allowed(n) && preferred(n))
            .or_else(|_| placer.place_where(&moving[i], &|n| n != from && allowed(n)));
        match placed {
            Ok(p) => moved.push((i, p)),
            Err(_) => {
                for (i, p) in &moved {
                    placer.release(&moving[*i], p);
                }
                placer.restore_claims(from, freed);
                for (wi, devices) in pods {
                    placer.commit(&workloads[*wi], &Placement { node: from, devices: devices.clone() });
                }
                return None;
            }
        }
    }
    let moved: Vec<(usize, Placement)> = moved.into_iter().map(|(i, p)| (pods[i].0, p)).collect();
    for (wi, p) in &moved {
        info[p.node].pods.push((*wi, p.devices.clone()));
    }
    info[from].pods.clear();
    Some(moved)
}

/// What the plan's scale-up leaves for scale-down to respect.
pub(crate) struct Growth {
    /// Pods wait for new capacity (then nothing is replaced).
    pub pending: bool,
    /// Per group, whether this plan grows it (then none of its nodes is drained).
    pub groups: Vec<bool>,
}

/// Plans removals and replacements.
/// Per group, how many nodes may still go before its min size: nodes already leaving (being
/// deleted, or drained past their first eviction) count against it, as Cluster Autoscaler's
/// deletions in progress do, so drains that take long never take a group below its minimum.
fn removable_per_group(groups: &[NodeGroup], info: &[NodeInfo], nodes: &[Node]) -> Vec<u32> {
    let mut leaving = vec![0u32; groups.len()];
    for (node, i) in nodes.iter().zip(info) {
        let Some(g) = i.group else { continue };
        if node.state == NodeState::Deleting
            || node.taints.iter().any(|t| t.key == crate::model::DISRUPTING_TAINT)
        {
            leaving[g] += 1;
        }
    }
    groups
        .iter()
        .zip(leaving)
        .map(|(g, l)| g.target_size.saturating_sub(g.min_size).saturating_sub(l))
        .collect()
}

/// Since when an unready node has been unready, where known (and the plan has a clock).
fn unready_since(node: &Node, settings: &PlannerSettings) -> Option<i64> {
    settings.now?;
    node.lifecycle.unready_since.filter(|_| node.state == NodeState::Unready)
}

/// How long an unready node has been unready, where known.
fn unready_for(node: &Node, settings: &PlannerSettings) -> Option<f64> {
    Some(settings.now?.saturating_sub(unready_since(node, settings)?) as f64)
}

pub(crate) fn plan(
    placer: &mut Placer<'_>,
    info: &mut Vec<NodeInfo>,
    input: &PlanInput,
    groups: &[NodeGroup],
    settings: &PlannerSettings,
    growth: &Growth,
    reclaimable: &[u64],
) -> ScaleDowns {
    let workloads = &input.snapshot.workloads;
    let mut out = ScaleDowns { scale_downs: Vec::new(), replacements: Vec::new(), kept: Vec::new() };
    let mut state = DrainState {
        removed: vec![false; placer.nodes().len()],
        received: vec![false; placer.nodes().len()],
        removable: removable_per_group(groups, info, placer.nodes()),
        budgets: input
            .snapshot
            .disruption_budgets
            .iter()
            .map(|b| (b.id.clone(), b.disruptions_allowed))
            .collect(),
    };

    let managed = |n: NodeId, info: &[NodeInfo], nodes: &[Node]| {
        let node = &nodes[n];
        info[n].group.is_some()
            && ((info[n].origin == Origin::Ready && node.state == NodeState::Ready && !node.unschedulable)
                || unready_for(node, settings).is_some_and(|s| s >= settings.unready_seconds))
    };
    let mut candidates: Vec<(f64, u64, String, NodeId)> = (0..info.len())
        .filter(|&n| managed(n, info, placer.nodes()))
        .map(|n| {
            let node = &placer.nodes()[n];
            let price = info[n].group.map_or(0, |g| groups[g].price);
            // GPUs held idle by pods that opted in to reclaim count as free.
            let reclaim = reclaimable.get(n).copied().unwrap_or(0) as f64 / gpu_milli(node).0.max(1) as f64;
            ((utilization(node) - reclaim).max(0.0), price, node.name.clone(), n)
        })
        .filter(|(u, ..)| *u < settings.scale_down_utilization || settings.scale_down_utilization >= 1.0)
        .collect();
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    // Candidates not judged yet: moved pods go elsewhere where they can, so that taking them does
    // not keep those nodes.
    let mut undecided = vec![false; info.len()];
    for c in &candidates {
        undecided[c.3] = true;
    }

    for (util, price, name, n) in candidates {
        if out.scale_downs.len() as u32 >= settings.max_disruptions {
            break;
        }
        undecided[n] = false;
        let gi = info[n].group.unwrap_or_default();
        if placer.nodes()[n].scale_down_disabled {
            out.kept.push(Kept { node: name, reason: "scale-down disabled by annotation".into() });
            continue;
        }
        if growth.groups.get(gi).copied().unwrap_or(false) {
            // Draining it only for a new node of the same kind to take its place is disruption
            // for nothing (and the capacity it frees is what the growth is for).
            out.kept.push(Kept { node: name, reason: format!("{} grows in this plan", groups[gi].id) });
            continue;
        }
        if state.removable[gi] == 0 {
            out.kept.push(Kept {
                node: name,
                reason: format!("{} at min size {}", groups[gi].id, groups[gi].min_size),
            });
            continue;
        }
        if state.received[n] {
            out.kept.push(Kept {
                node: name,
                reason: "takes pods moved off nodes this plan removes (a pod moves at most once per plan)"
                    .into(),
            });
            continue;
        }
        let pods = match movable_pods(workloads, &info[n].pods, &state.budgets, input, settings.drain_rules())
        {
            Ok(p) => p,
            Err(reason) => {
                out.kept.push(Kept { node: name, reason });
                continue;
            }
        };
        // Pods move only to ready nodes that stay (not to capacity that is still on its way).
        let targets: Vec<bool> = (0..info.len())
            .map(|m| !state.removed.get(m).copied().unwrap_or(true) && info[m].origin == Origin::Ready)
            .collect();
        let ready_elsewhere = |m: NodeId| targets.get(m).copied().unwrap_or(false);
        let decided = |m: NodeId| !undecided.get(m).copied().unwrap_or(false);
        match relocate(placer, info, workloads, n, &pods, (&ready_elsewhere, &decided)) {
            Some(moved) => {
                state.removed[n] = true;
                state.removable[gi] -= 1;
                state.count_moves(&moved, input);
                let node = &placer.nodes()[n];
                let what = if gpu_milli(node).0 > 0 { "GPU allocation" } else { "CPU and memory" };
                out.scale_downs.push(ScaleDown {
                    node: name,
                    group: groups[gi].id.clone(),
                    instance: node.provider_id.clone(),
                    // Pending pods this plan had put on the node just go elsewhere: not moves.
                    moves: moved
                        .iter()
                        .filter(|(wi, _)| workloads[*wi].node_name.is_some())
                        .map(|(wi, p)| (workloads[*wi].id.clone(), placer.nodes()[p.node].name.clone()))
                        .collect(),
                    // A date, not an age: two plans of one cluster a second apart say the same.
                    reason: if let Some(since) = unready_since(node, settings) {
                        format!("unready since {}; its pods fit on other nodes", super::readiness::utc(since))
                    } else if moved.is_empty() && util == 0.0 {
                        "empty".to_string()
                    } else if settings.scale_down_utilization >= 1.0 {
                        format!("{what} {:.0}%; its pods fit on other nodes", util * 100.0)
                    } else {
                        format!(
                            "{what} {:.0}% < {:.0}%; its pods fit on other nodes",
                            util * 100.0,
                            settings.scale_down_utilization * 100.0
                        )
                    },
                    saving_per_hour: price,
                });
            }
            None => {
                out.kept.push(Kept { node: name, reason: "its pods do not all fit on other nodes".into() });
            }
        }
    }

    if settings.consolidation && !growth.pending {
        let budget = settings.max_disruptions.saturating_sub(out.scale_downs.len() as u32);
        replace_expensive(
            placer,
            info,
            input,
            groups,
            &mut state,
            (budget, settings.drain_rules()),
            &mut out,
        );
    }
    out
}

/// Replaces nodes by one node of a cheaper group that holds all their pods.
fn replace_expensive(
    placer: &mut Placer<'_>,
    info: &mut Vec<NodeInfo>,
    input: &PlanInput,
    groups: &[NodeGroup],
    state: &mut DrainState,
    (budget, rules): (u32, DrainRules),
    out: &mut ScaleDowns,
) {
    let workloads = &input.snapshot.workloads;
    let mut added = vec![0u32; groups.len()];
    let mut nodes: Vec<(u64, String, NodeId)> = (0..info.len())
        .filter(|&n| {
            info[n].origin == Origin::Ready
                && !state.removed[n]
                && !state.received[n]
                && placer.nodes()[n].state == NodeState::Ready
        })
        .filter(|&n| !placer.nodes()[n].scale_down_disabled)
        .filter_map(|n| info[n].group.map(|g| (groups[g].price, placer.nodes()[n].name.clone(), n)))
        .collect();
    nodes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (price, name, n) in nodes {
        if out.replacements.len() as u32 >= budget {
            break;
        }
        let gi = info[n].group.unwrap_or_default();
        if state.removable[gi] == 0 || info[n].pods.is_empty() {
            continue;
        }
        let Ok(pods) = movable_pods(workloads, &info[n].pods, &state.budgets, input, rules) else { continue };
        if pods.is_empty() {
            continue;
        }
        let members: Vec<&Workload> = pods.iter().map(|(wi, _)| &workloads[*wi]).collect();
        let cheaper = groups
            .iter()
            .enumerate()
            .filter(|(h, g)| {
                *h != gi
                    && g.price < price
                    && !input.unavailable.contains_key(&g.id)
                    && g.max_size > g.target_size + added[*h]
            })
            .filter(|(_, g)| pack_fresh(g, &members, members.len(), 1).is_some())
            .min_by(|a, b| a.1.price.cmp(&b.1.price).then(a.1.id.cmp(&b.1.id)));
        let Some((h, g)) = cheaper else { continue };
        // Move the pods onto the replacement node in the simulation.
        let new_name = format!("{}-new-{}", g.name(), g.target_size + added[h] + 1);
        let new_node =
            next_node(g, new_name, NodeState::Upcoming, next_zone(g, members_of(placer.nodes(), info, h)));
        let new_id = placer.add_node(new_node);
        info.push(NodeInfo { group: Some(h), origin: Origin::New, pods: Vec::new() });
        state.removed.push(false);
        state.received.push(false);
        let Some(moved) = relocate(placer, info, workloads, n, &pods, (&|m| m == new_id, &|_| true)) else {
            continue;
        };
        state.removed[n] = true;
        state.removable[gi] -= 1;
        state.count_moves(&moved, input);
        added[h] += 1;
        out.replacements.push(Replace {
            node: name,
            group: groups[gi].id.clone(),
            replacement_group: g.id.clone(),
            pods: members.iter().map(|w| w.id.clone()).collect(),
            saving_per_hour: price - g.price,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cel::AttrValue;
    use crate::model::dra::{ClaimHold, DraDevice, NVIDIA_GPU_DRIVER};
    use crate::model::{
        ClusterSnapshot, DisruptionBudget, GpuDemand, Resources, Toleration, TolerationOperator,
    };
    use crate::planner::cluster::template_node;
    use crate::planner::Plan;
    use crate::scheduler::policy::PolicyKind;

    /// One group of 4-GPU L4 nodes, three of them running.
    fn l4_group() -> NodeGroup {
        let yaml = "accounts:\n  - name: c\n    provider: simulated\n    region: us-east-1\n    nodeGroups:\n      - {name: l4-4, instanceType: g6.12xlarge, zones: [us-east-1a], minSize: 0, maxSize: 5, targetSize: 3}\n";
        crate::providers::config::load_strs(&[("test.yaml", yaml)]).unwrap().node_groups().remove(0)
    }

    fn running(id: &str, gpus: u32, node: &str) -> Workload {
        Workload {
            id: id.into(),
            requests: Resources::new(1000, 1024),
            gpu: GpuDemand::Whole { count: gpus },
            owner: OwnerKind::ReplicaSet,
            tolerations: vec![Toleration { operator: TolerationOperator::Exists, ..Default::default() }],
            node_name: Some(node.into()),
            ..Default::default()
        }
    }

    fn plan_of(nodes: Vec<Node>, workloads: Vec<Workload>, settings: &PlannerSettings) -> Plan {
        let snapshot = ClusterSnapshot { nodes, workloads, ..Default::default() };
        crate::planner::plan(
            &PlanInput { snapshot, groups: vec![l4_group()], ..Default::default() },
            settings,
        )
    }

    /// Every move's destination stays and no pod moves twice.
    fn assert_each_pod_moves_once(plan: &Plan) {
        let removed: Vec<&str> = plan.scale_downs.iter().map(|d| d.node.as_str()).collect();
        let mut moved: Vec<&str> = Vec::new();
        for (pod, to) in plan.scale_downs.iter().flat_map(|d| &d.moves) {
            assert!(
                !removed.contains(&to.as_str()),
                "{pod} moves to {to}, which the plan removes:\n{}",
                plan.to_table()
            );
            moved.push(pod);
        }
        moved.extend(plan.replacements.iter().flat_map(|r| r.pods.iter().map(String::as_str)));
        let n = moved.len();
        moved.sort_unstable();
        moved.dedup();
        assert_eq!(moved.len(), n, "a pod moves twice:\n{}", plan.to_table());
    }

    #[test]
    fn a_pod_moved_off_a_removed_node_is_not_moved_again() {
        // a runs 1 GPU of 4, b 2, c none (its scale-down is disabled). Best fit put a's pod on b,
        // the tighter fit; b's pods, a's among them, would then fit c, and the old plan removed b
        // as well, evicting a's pod a second time. Now a's pod goes to c, which stays anyway, and
        // b's follows it.
        let g = l4_group();
        let node = |name: &str| template_node(&g, name.into(), NodeState::Ready);
        let c = Node { scale_down_disabled: true, ..node("c") };
        let settings = PlannerSettings { policy: PolicyKind::BestFit, ..Default::default() };
        let plan = plan_of(
            vec![node("a"), node("b"), c],
            vec![running("x/one", 1, "a"), running("x/two", 2, "b")],
            &settings,
        );
        let removed: Vec<&str> = plan.scale_downs.iter().map(|d| d.node.as_str()).collect();
        assert_eq!(removed, ["a", "b"], "{}", plan.to_table());
        assert_each_pod_moves_once(&plan);
    }

    /// Plans a, running `pod` (1 GPU of 4), beside b (2 GPUs) and c (empty, kept by annotation);
    /// says whether a goes, else why not.
    fn a_goes(
        pod: Workload,
        budgets: Vec<DisruptionBudget>,
        settings: &PlannerSettings,
    ) -> Result<(), String> {
        let g = l4_group();
        let node = |name: &str| template_node(&g, name.into(), NodeState::Ready);
        let c = Node { scale_down_disabled: true, ..node("c") };
        let snapshot = ClusterSnapshot {
            nodes: vec![node("a"), node("b"), c],
            workloads: vec![Workload { node_name: Some("a".into()), ..pod }, running("x/two", 2, "b")],
            disruption_budgets: budgets,
            ..Default::default()
        };
        let plan = crate::planner::plan(
            &PlanInput { snapshot, groups: vec![g.clone()], ..Default::default() },
            settings,
        );
        if plan.scale_downs.iter().any(|d| d.node == "a") {
            return Ok(());
        }
        Err(plan.kept.iter().find(|k| k.node == "a").map_or_else(|| plan.to_table(), |k| k.reason.clone()))
    }

    #[test]
    fn a_pod_with_local_storage_keeps_its_node_unless_it_is_safe_to_evict() {
        let pod = Workload { local_storage: vec!["scratch".into()], ..running("x/one", 1, "a") };
        let defaults = PlannerSettings::default();
        let err = a_goes(pod.clone(), vec![], &defaults).unwrap_err();
        assert!(err.contains("x/one has local storage") && err.contains("scratch"), "{err}");
        assert_eq!(a_goes(Workload { safe_to_evict: true, ..pod.clone() }, vec![], &defaults), Ok(()));
        let off = PlannerSettings { skip_nodes_with_local_storage: false, ..Default::default() };
        assert_eq!(a_goes(pod, vec![], &off), Ok(()));
        // Volumes that lose nothing (memory, listed as safe) are not in `local_storage`.
        assert_eq!(a_goes(running("x/one", 1, "a"), vec![], &defaults), Ok(()));
    }

    #[test]
    fn a_kube_system_pod_without_a_pdb_keeps_its_node() {
        let pod = Workload {
            labels: [("k8s-app".to_string(), "metrics".to_string())].into(),
            ..running("kube-system/metrics-server-7d9", 1, "a")
        };
        let defaults = PlannerSettings::default();
        let err = a_goes(pod.clone(), vec![], &defaults).unwrap_err();
        assert!(err.contains("kube-system pod no PodDisruptionBudget covers"), "{err}");
        let pdb = |ns: &str| DisruptionBudget {
            id: format!("{ns}/metrics"),
            namespace: ns.into(),
            selector: crate::model::LabelSelector {
                match_labels: [("k8s-app".to_string(), "metrics".to_string())].into(),
                ..Default::default()
            },
            disruptions_allowed: 1,
        };
        // A budget of another namespace does not cover it; one of its own lets it go.
        assert!(a_goes(pod.clone(), vec![pdb("default")], &defaults).is_err());
        assert_eq!(a_goes(pod.clone(), vec![pdb("kube-system")], &defaults), Ok(()));
        assert_eq!(a_goes(Workload { safe_to_evict: true, ..pod.clone() }, vec![], &defaults), Ok(()));
        let off = PlannerSettings { skip_nodes_with_system_pods: false, ..Default::default() };
        assert_eq!(a_goes(pod.clone(), vec![], &off), Ok(()));
        // DaemonSet pods stay with their node and never block it.
        assert_eq!(
            a_goes(Workload { owner: OwnerKind::DaemonSet, gpu: GpuDemand::None, ..pod }, vec![], &defaults),
            Ok(())
        );
    }

    #[test]
    fn on_a_generated_500_node_cluster_each_pod_moves_at_most_once() {
        use crate::sim::kubectl_list::{cluster, ListShape};
        // `gpuscale generate --nodes 500 --running 5000 --pending 1000`: the old plan removed 33
        // nodes and moved 117 pods two to six times.
        let shape = ListShape { nodes: 500, running: 5000, pending: 1000, seed: 1, managed_fields: false };
        let (generated, groups) = cluster(&shape);
        // The generator's nodes hold its pods; planned, as `plan` loads them, with their capacity.
        let (fresh, _) =
            crate::sim::synthetic::cluster(shape.nodes, shape.running, shape.pending, shape.seed);
        let snapshot = ClusterSnapshot { nodes: fresh.nodes, ..generated };
        let plan =
            crate::planner::plan(&PlanInput { snapshot, groups, ..Default::default() }, &Default::default());
        let moves: usize = plan.scale_downs.iter().map(|d| d.moves.len()).sum();
        assert!(plan.scale_downs.len() >= 10 && moves >= 100, "{}", plan.to_table());
        assert_each_pod_moves_once(&plan);
    }

    #[test]
    fn a_dra_gpu_node_is_judged_by_its_held_gpus_not_its_cpu() {
        let gpu = |i: u32| DraDevice {
            driver: NVIDIA_GPU_DRIVER.into(),
            pool: "n".into(),
            name: format!("gpu-{i}"),
            attributes: [(format!("{NVIDIA_GPU_DRIVER}/type"), AttrValue::Str("gpu".into()))].into(),
            capacity: Default::default(),
            consumes: Default::default(),
        };
        let mut node =
            Node { allocatable: crate::model::Resources::new(192_000, 1 << 20), ..Node::default() };
        node.dra.devices = (0..8).map(gpu).collect();
        assert_eq!(utilization(&node), 0.0);
        node.dra.claims.insert("ns/c".into(), ClaimHold { devices: (0..6).collect(), users: 1, fixed: true });
        // Six of eight GPUs held, though hardly any CPU is requested.
        assert_eq!(utilization(&node), 0.75);
        // With four idle device-plugin GPUs besides: six of twelve.
        node.gpus = (0..4).map(|i| crate::model::GpuDevice::standard(i, 81_920)).collect();
        assert_eq!(utilization(&node), 0.5);
    }

    #[test]
    fn a_dra_mig_node_is_judged_by_the_share_of_its_gpus_that_mig_devices_hold() {
        let mig = |gpu: u32, profile: &str, start: u32| {
            let attr = |a: &str| format!("{NVIDIA_GPU_DRIVER}/{a}");
            DraDevice {
                driver: NVIDIA_GPU_DRIVER.into(),
                pool: "n".into(),
                name: format!("gpu-{gpu}-mig-{profile}-{start}"),
                attributes: [
                    (attr("type"), AttrValue::Str("mig".into())),
                    (attr("profile"), AttrValue::Str(profile.into())),
                    (attr("parentUUID"), AttrValue::Str(format!("GPU-{gpu}"))),
                ]
                .into(),
                capacity: Default::default(),
                consumes: Default::default(),
            }
        };
        let mut node = Node::default();
        // Two GPUs, each split into a 3g and a 4g device.
        node.dra.devices =
            vec![mig(0, "3g.40gb", 0), mig(0, "4g.40gb", 4), mig(1, "3g.40gb", 0), mig(1, "4g.40gb", 4)];
        assert_eq!(node.dra.gpu_use(), (2, 0));
        assert_eq!(utilization(&node), 0.0);
        node.dra.claims.insert("ns/c".into(), ClaimHold { devices: vec![1], users: 1, fixed: true });
        // A 4g device of one of two GPUs: 4/7 of a GPU of two, not "no GPU in use".
        assert_eq!(node.dra.gpu_use(), (2, 571));
        assert!((utilization(&node) - 0.2855).abs() < 1e-9, "{}", utilization(&node));
    }
}
