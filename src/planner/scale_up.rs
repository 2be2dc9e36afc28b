//! Scale-up: the cheapest node-group growth that fits the pending pods existing capacity cannot.

use super::cluster::{next_node, template_node, NodeInfo, Origin, ZoneCounts};
use super::plan::{ScaleUp, Unschedulable};
use super::{PlanInput, Unit};
use crate::model::{GpuDemand, Node, NodeGroup, NodeId, NodeState, Workload, GPU_MILLI};
use crate::scheduler::{fit, Placement, Placer};
use std::collections::{BTreeMap, BTreeSet};

/// How many following pending pods the packing estimate of a new node looks at.
const LOOKAHEAD: usize = 64;

/// Which nodes a unit may be placed on.
#[derive(Clone, Copy)]
pub(crate) enum Among<'a> {
    /// Any node: the placer may remember that pods of a shape found no room.
    All,
    /// Any node, each pod first on the node its hint names (by snapshot index), if it still
    /// fits there.
    Hinted(&'a [Option<NodeId>]),
    /// The nodes from this one on: those the plan added.
    Added(NodeId),
    /// The nodes the function accepts.
    Where(&'a dyn Fn(NodeId) -> bool),
}

impl Among<'_> {
    fn admits(&self, n: NodeId) -> bool {
        match self {
            Among::All | Among::Hinted(_) => true,
            Among::Added(first) => n >= *first,
            Among::Where(allowed) => allowed(n),
        }
    }
}

/// Places a unit among some nodes: a pod, or a gang all-or-nothing (within one topology domain
/// when it asks for one). Returns the placements, or `None` (and nothing placed).
pub(crate) fn place_unit(
    placer: &mut Placer<'_>,
    workloads: &[Workload],
    unit: &Unit,
    among: Among<'_>,
) -> Option<Vec<(usize, Placement)>> {
    let Some(key) = &unit.topology_key else { return place_members(placer, workloads, unit, among) };
    let labels: Vec<Option<String>> = placer.nodes().iter().map(|n| n.labels.get(key).cloned()).collect();
    let mut domains: Vec<&str> = labels
        .iter()
        .enumerate()
        .filter(|(n, _)| among.admits(*n))
        .filter_map(|(_, l)| l.as_deref())
        .collect();
    domains.sort_unstable();
    domains.dedup();
    for domain in domains {
        let in_domain =
            |n: NodeId| among.admits(n) && labels.get(n).and_then(|l| l.as_deref()) == Some(domain);
        if let Some(placed) = place_members(placer, workloads, unit, Among::Where(&in_domain)) {
            return Some(placed);
        }
    }
    None
}

fn place_members(
    placer: &mut Placer<'_>,
    workloads: &[Workload],
    unit: &Unit,
    among: Among<'_>,
) -> Option<Vec<(usize, Placement)>> {
    let mut placed = Vec::with_capacity(unit.pods.len());
    for &wi in &unit.pods {
        let w = &workloads[wi];
        let found = match among {
            Among::All => placer.find(w),
            Among::Hinted(hints) => match hints.get(wi).copied().flatten() {
                Some(node) => placer.find_on(w, node).or_else(|_| placer.find(w)),
                None => placer.find(w),
            },
            Among::Added(first) => placer.find_from(w, first),
            Among::Where(allowed) => placer.find_where(w, allowed),
        };
        if let Ok(p) = found {
            placer.commit(w, &p);
            placed.push((wi, p));
        }
    }
    if placed.len() >= unit.required.clamp(1, unit.pods.len().max(1)) {
        return Some(placed);
    }
    for (wi, p) in &placed {
        placer.release(&workloads[*wi], p);
    }
    None
}

/// Gang members beyond the gang's minimum that found no room are reported, not dropped.
fn report_left_over(
    unit: &Unit,
    placed: &[(usize, Placement)],
    workloads: &[Workload],
    unschedulable: &mut Vec<Unschedulable>,
) {
    for &wi in unit.pods.iter().filter(|wi| !placed.iter().any(|(p, _)| p == *wi)) {
        unschedulable.push(Unschedulable {
            pod: workloads[wi].id.clone(),
            reason: "gang minimum placed; this member waits for capacity in a later loop".into(),
        });
    }
}

/// Result of the scale-up step.
pub(crate) struct ScaleUps {
    pub scale_ups: Vec<ScaleUp>,
    pub unschedulable: Vec<Unschedulable>,
}

/// GPU demand of a pod in milli-GPU on a node of this template.
fn gpu_milli(w: &Workload, template: &Node) -> f64 {
    let mem = template.gpus.first().map_or(0, |g| g.memory_mib);
    let replicas = template
        .gpus
        .first()
        .map(|g| match g.mode {
            crate::model::GpuMode::TimeSliced { replicas } => replicas,
            _ => 1,
        })
        .unwrap_or(1);
    w.gpu.gpu_milli(mem, template.mig_geometry(), replicas) as f64
}

/// The largest share of the template's capacity the pod takes (CPU, memory or GPU).
fn dominant_share(w: &Workload, template: &Node) -> f64 {
    let cpu = w.requests.cpu_milli as f64 / template.allocatable.cpu_milli.max(1) as f64;
    let mem = w.requests.memory_bytes as f64 / template.allocatable.memory_bytes.max(1) as f64;
    let gpu = if matches!(w.gpu, GpuDemand::None) {
        0.0
    } else {
        gpu_milli(w, template) / template.gpu_milli_capacity().max(u64::from(GPU_MILLI)) as f64
    };
    cpu.max(mem).max(gpu).min(1.0)
}

/// Whether a pod could run on an empty node of the group, and if not why.
pub(crate) fn template_fit(group: &NodeGroup, w: &Workload) -> Result<(), fit::Unfit> {
    let node = template_node(group, String::new(), NodeState::Ready);
    fit::candidates(&node, w).map(|_| ())
}

/// Packs pods onto fresh nodes of a group, first fit in order, opening up to `max_nodes`.
/// Returns how many nodes were needed and which pods fit, or `None` if `required` pods do not.
pub(crate) fn pack_fresh(
    group: &NodeGroup,
    pods: &[&Workload],
    required: usize,
    max_nodes: u32,
) -> Option<(u32, Vec<usize>)> {
    pack_fresh_like(&template_node(group, String::new(), NodeState::Ready), pods, required, max_nodes)
}

/// [`pack_fresh`] onto copies of `prototype` (a group's next node, in the zone it will have).
fn pack_fresh_like(
    prototype: &Node,
    pods: &[&Workload],
    required: usize,
    max_nodes: u32,
) -> Option<(u32, Vec<usize>)> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut fitted = Vec::new();
    for (i, w) in pods.iter().enumerate() {
        let mut placed = false;
        for node in nodes.iter_mut() {
            if let Some(devices) = fit::candidates(node, w).ok().and_then(|c| c.into_iter().next()) {
                node.allocate_pod(w, &devices);
                placed = true;
                break;
            }
        }
        if !placed && (nodes.len() as u32) < max_nodes {
            let mut node = prototype.clone();
            if let Some(devices) = fit::candidates(&node, w).ok().and_then(|c| c.into_iter().next()) {
                node.allocate_pod(w, &devices);
                nodes.push(node);
                placed = true;
            }
        }
        if placed {
            fitted.push(i);
        }
    }
    (fitted.len() >= required).then_some((nodes.len() as u32, fitted))
}

/// Plans the growth for the units existing capacity cannot hold.
pub(crate) fn plan(
    placer: &mut Placer<'_>,
    info: &mut Vec<NodeInfo>,
    input: &PlanInput,
    groups: &[NodeGroup],
    units: &[Unit],
    max_new_nodes: u32,
    mut gate: Option<&mut super::tenancy::Gate>,
) -> ScaleUps {
    let workloads = &input.snapshot.workloads;
    let mut added = vec![0u32; groups.len()];
    // Nodes opened per group, used or retired: they name the next one.
    let mut opened = vec![0u32; groups.len()];
    let mut pods_for: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut unschedulable = Vec::new();
    let mut total_new = 0u32;

    // What each pod would cost on its cheapest fitting group if it could rent just its share;
    // asked again for the same pods as lookahead of unit after unit, hence kept per pod.
    let templates: Vec<Node> =
        groups.iter().map(|g| template_node(g, String::new(), NodeState::Ready)).collect();
    let standalone_of = std::cell::RefCell::new(vec![None::<f64>; workloads.len()]);
    let standalone = |wi: usize| -> f64 {
        if let Some(v) = standalone_of.borrow()[wi] {
            return v;
        }
        let w = &workloads[wi];
        let v = groups
            .iter()
            .zip(&templates)
            .filter(|(_, t)| fit::candidates(t, w).is_ok())
            .map(|(g, _)| g.price as f64 * dominant_share(w, &g.template).max(1e-6))
            .fold(f64::INFINITY, f64::min);
        standalone_of.borrow_mut()[wi] = Some(v);
        v
    };

    // The nodes this step adds come after those it started with.
    let first_added = placer.nodes().len();
    let mut zones = ZoneCounts::of(groups, placer.nodes(), info);
    for (ui, unit) in units.iter().enumerate() {
        // Capacity this plan already adds may hold it.
        if let Some(placed) = place_unit(placer, workloads, unit, Among::Added(first_added)) {
            report_left_over(unit, &placed, workloads, &mut unschedulable);
            for (wi, p) in placed {
                pods_for
                    .entry(info[p.node].group.unwrap_or(usize::MAX))
                    .or_default()
                    .push(workloads[wi].id.clone());
                info[p.node].pods.push((wi, p.devices));
            }
            continue;
        }
        let members: Vec<&Workload> = unit.pods.iter().map(|&i| &workloads[i]).collect();
        let required = unit.required.max(1).min(members.len());
        // Candidate groups and, for the reason if none fits, why each is out.
        let mut why_not: Vec<String> = Vec::new();
        // (cost ratio, preferred node-affinity weight, price, group, nodes)
        let mut best: Option<(f64, u32, u64, usize, u32)> = None;
        for (gi, g) in groups.iter().enumerate() {
            let name = g.id.as_str();
            if let Some(reason) = input.unavailable.get(&g.id) {
                why_not.push(format!("{name}: unavailable ({reason})"));
                continue;
            }
            let probe =
                next_node(g, format!("{}-new-probe", g.name()), NodeState::Upcoming, zones.next(g, gi));
            if let Err(u) = placer.fits_added(&probe, members[0]) {
                why_not.push(format!("{name}: {}", u.as_str()));
                continue;
            }
            let headroom =
                g.max_size.saturating_sub(g.target_size + added[gi]).min(max_new_nodes - total_new);
            if headroom == 0 {
                why_not.push(format!("{name}: at max size {}", g.max_size));
                continue;
            }
            let (nodes, value) = if unit.gang.is_some() {
                let Some((n, fitted)) = pack_fresh_like(&probe, &members, required, headroom) else {
                    why_not.push(format!(
                        "{name}: gang of {} does not fit in {headroom} new node(s)",
                        members.len()
                    ));
                    continue;
                };
                (n, fitted.iter().map(|&i| standalone(unit.pods[i])).sum::<f64>())
            } else {
                // One new node: the pod plus what else pending would share it.
                let ahead: Vec<usize> = std::iter::once(unit.pods[0])
                    .chain(
                        units[ui + 1..]
                            .iter()
                            .filter(|u| u.gang.is_none())
                            .take(LOOKAHEAD)
                            .map(|u| u.pods[0]),
                    )
                    .collect();
                let lookahead: Vec<&Workload> = ahead.iter().map(|&wi| &workloads[wi]).collect();
                let Some((_, fitted)) = pack_fresh_like(&probe, &lookahead, 1, 1) else { continue };
                (1, fitted.iter().map(|&i| standalone(ahead[i])).sum::<f64>())
            };
            let cost = g.price.saturating_mul(u64::from(nodes));
            if let Some(Err(reason)) = gate.as_deref().map(|t| t.check_budget(unit, cost)) {
                why_not.push(format!("{name}: {reason}"));
                continue;
            }
            let ratio = if value > 0.0 { cost as f64 / value } else { f64::INFINITY };
            // Between equally cost-effective groups, the one the pod prefers (kube-scheduler's
            // NodeAffinity score), then the cheaper.
            let weight = members[0].preferences.node_affinity_weight(&probe);
            let better = match best {
                None => true,
                Some((r, w, c, _, _)) => {
                    ratio < r - 1e-9
                        || ((ratio - r).abs() <= 1e-9 && (weight > w || (weight == w && cost < c)))
                }
            };
            if better {
                best = Some((ratio, weight, cost, gi, nodes));
            }
        }
        let Some((_, _, _, gi, nodes)) = best else {
            let reason = if groups.is_empty() {
                "no node groups are configured".to_string()
            } else {
                why_not.sort();
                format!("no node group can run it: {}", why_not.join("; "))
            };
            for &wi in &unit.pods {
                let gang = unit.gang.as_ref().map(|g| format!(" (gang {g})")).unwrap_or_default();
                unschedulable
                    .push(Unschedulable { pod: workloads[wi].id.clone(), reason: format!("{reason}{gang}") });
            }
            continue;
        };
        // Open the estimated nodes and place the unit on them; where pod affinity or spread asks
        // for more nodes than resources do (one per host for anti-affine members), one more
        // at a time up to the headroom. Nodes left empty are retired, never requested.
        let g = &groups[gi];
        let headroom = g.max_size.saturating_sub(g.target_size + added[gi]).min(max_new_nodes - total_new);
        // Never more nodes than members: one each is the most any constraint can ask.
        let most = (headroom as usize).min(unit.pods.len()).max(nodes as usize);
        let first_new = placer.nodes().len();
        let mut placed = None;
        while placed.is_none() && placer.nodes().len() - first_new < most {
            let want = if placer.nodes().len() == first_new { nodes as usize } else { 1 };
            for _ in 0..want {
                opened[gi] += 1;
                let name = format!("{}-new-{}", g.name(), g.target_size + opened[gi]);
                let node = next_node(g, name, NodeState::Upcoming, zones.next(g, gi));
                zones.add(g, gi, &node);
                placer.add_node(node);
                info.push(NodeInfo { group: Some(gi), origin: Origin::New, pods: Vec::new() });
            }
            placed = place_unit(placer, workloads, unit, Among::Added(first_new));
        }
        let used: BTreeSet<usize> = placed.iter().flatten().map(|(_, p)| p.node).collect();
        for n in (first_new..placer.nodes().len()).filter(|n| !used.contains(n)) {
            zones.remove(g, gi, &placer.nodes()[n]);
            placer.retire(n);
        }
        match placed {
            Some(placed) => {
                report_left_over(unit, &placed, workloads, &mut unschedulable);
                let nodes = used.len() as u32;
                added[gi] += nodes;
                total_new += nodes;
                if let Some(t) = gate.as_deref_mut() {
                    t.charge_budget(unit, g.price.saturating_mul(u64::from(nodes)));
                }
                for (wi, p) in placed {
                    pods_for.entry(gi).or_default().push(workloads[wi].id.clone());
                    info[p.node].pods.push((wi, p.devices));
                }
            }
            None => {
                for &wi in &unit.pods {
                    unschedulable.push(Unschedulable {
                        pod: workloads[wi].id.clone(),
                        reason: format!(
                            "does not fit {most} new {} node(s) with the pods placed so far",
                            g.instance_type
                        ),
                    });
                }
            }
        }
    }
    let scale_ups = groups
        .iter()
        .enumerate()
        .filter(|(gi, _)| added[*gi] > 0)
        .map(|(gi, g)| {
            let pods = pods_for.remove(&gi).unwrap_or_default();
            ScaleUp {
                group: g.id.clone(),
                instance_type: g.instance_type.clone(),
                from: g.target_size,
                to: g.target_size + added[gi],
                reason: format!(
                    "{} pending pod(s) fit no existing node; {} x {} is the cheapest fitting capacity per unit of demand",
                    pods.len(),
                    added[gi],
                    g.instance_type
                ),
                pods,
                requests: Vec::new(),
                cost_per_hour: g.price * u64::from(added[gi]),
            }
        })
        .collect();
    ScaleUps { scale_ups, unschedulable }
}
