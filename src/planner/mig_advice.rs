//! MIG re-partitioning advice: pending MIG pods that fit no existing node may fit once idle GPUs
//! of an existing node are re-partitioned into a different valid layout, which is cheaper than a
//! new node. The advice is a new `nvidia.com/mig.config` label for NVIDIA's MIG manager.
//!
//! Layouts come from [`MigGeometry::maximal_layouts`] (valid by construction, checked again with
//! [`MigGeometry::validate`]). GPUs are tried cheapest first: idle MIG GPUs, then idle GPUs with MIG
//! off, then GPUs whose running instances would be restarted (a re-partition clears the GPU),
//! fewest such instances first, and only with a layout that keeps those instances where they are.
//!
//! Nodes whose GPUs NVIDIA's DRA driver publishes get the same advice for pods whose claims ask
//! for `mig.nvidia.com` devices of one profile: the driver names a MIG device after its physical
//! placement (`gpu-<gpu>-mig-<profile id>-<start>-<size>`), which gives each GPU's layout, and it
//! publishes the new devices once the MIG manager has applied the label. Nodes with partitionable
//! devices (shared counters) are left out: there the allocator picks placements itself.

use super::cluster::{NodeInfo, Origin};
use super::plan::MigRepartition;
use super::scale_up::pack_fresh;
use super::{PlanInput, Unit};
use crate::model::dra::{AllocationMode, DraDevice, GpuAsk};
use crate::model::mig::{MigGeometry, MigPlacement};
use crate::model::{
    DeviceAssignment, GpuCatalog, GpuDemand, GpuMode, Node, NodeGroup, NodeState, Resources, Workload,
};
use crate::scheduler::{Placement, Placer};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One GPU the search may change.
#[derive(Debug, Clone)]
struct GpuOption {
    /// GPU index on the node.
    index: u8,
    /// Current layout; empty with MIG off.
    current: Vec<MigPlacement>,
    /// Instances in use (kept in place by any new layout; restarted by the re-partition).
    used: Vec<MigPlacement>,
    /// MIG is off on this GPU now.
    mig_off: bool,
    /// The DRA devices of this GPU that no claim holds (a re-partition removes them); empty for
    /// device-plugin GPUs.
    dra_free: Vec<u32>,
}

impl GpuOption {
    /// Search order: fewest disrupted instances, GPUs already in MIG mode first, then by index.
    fn cost(&self) -> (usize, bool, u8) {
        (self.used.len(), self.mig_off, self.index)
    }
}

/// A GPU with its chosen new layout.
#[derive(Debug, Clone)]
struct Change {
    option: GpuOption,
    layout: Vec<MigPlacement>,
    /// Instances of the new layout handed to pending pods so far.
    taken: Vec<MigPlacement>,
}

impl Change {
    fn free_of(&self, profile: &str) -> Vec<MigPlacement> {
        self.layout
            .iter()
            .filter(|p| p.profile == profile && !self.option.used.contains(p) && !self.taken.contains(p))
            .cloned()
            .collect()
    }
}

fn count(layout: &[MigPlacement], profile: &str) -> usize {
    layout.iter().filter(|p| p.profile == profile).count()
}

/// The GPUs of a node that a re-partition may touch, cheapest first.
fn options(node: &Node) -> Vec<GpuOption> {
    let mut out: Vec<GpuOption> = node
        .gpus
        .iter()
        .filter_map(|d| match &d.mode {
            GpuMode::Mig { instances, dynamic: false } => Some(GpuOption {
                index: d.index,
                current: instances.iter().map(|i| i.placement.clone()).collect(),
                used: instances.iter().filter(|i| i.used).map(|i| i.placement.clone()).collect(),
                mig_off: false,
                dra_free: vec![],
            }),
            GpuMode::Standard if d.is_idle() => Some(GpuOption {
                index: d.index,
                current: vec![],
                used: vec![],
                mig_off: true,
                dra_free: vec![],
            }),
            _ => None,
        })
        .collect();
    out.sort_by_key(GpuOption::cost);
    out
}

/// The GPU and placement start NVIDIA's DRA driver names a device after: `gpu-<gpu>` for a GPU,
/// `gpu-<gpu>-mig-<profile id>-<start>-<size>` for a MIG device.
fn dra_placement(name: &str) -> Option<(u8, Option<u8>)> {
    let rest = name.strip_prefix("gpu-")?;
    match rest.split_once("-mig-") {
        None => Some((rest.parse().ok()?, None)),
        Some((gpu, mig)) => {
            let parts: Vec<&str> = mig.split('-').collect();
            let [_, start, _] = parts[..] else { return None };
            Some((gpu.parse().ok()?, Some(start.parse().ok()?)))
        }
    }
}

/// One physical GPU a node publishes through DRA.
#[derive(Debug, Default)]
struct DraGpu {
    /// Its MIG devices' placements; empty for a whole GPU.
    layout: Vec<MigPlacement>,
    /// The placements claims hold.
    held: Vec<MigPlacement>,
    /// Its devices no claim holds (indices into the node's DRA devices).
    free_devices: Vec<u32>,
    /// A whole GPU a claim holds.
    whole_held: bool,
}

/// Each DRA GPU of a node (whole or MIG) by index. `None` when the node has no NVIDIA GPUs
/// through DRA, publishes partitionable devices, or names a device otherwise.
fn dra_gpus(node: &Node) -> Option<BTreeMap<u8, DraGpu>> {
    let inv = &node.dra;
    if !node.gpus.is_empty() || inv.devices.iter().any(|d| !d.consumes.is_empty()) {
        return None;
    }
    let used = inv.used();
    let mut gpus: BTreeMap<u8, DraGpu> = BTreeMap::new();
    for (i, d) in inv.devices.iter().enumerate() {
        if d.gpu_milli().is_none() {
            continue;
        }
        let (g, start) = dra_placement(&d.name)?;
        let gpu = gpus.entry(g).or_default();
        match (d.mig_profile(), start) {
            (Some(profile), Some(start)) => {
                let p = MigPlacement { profile: profile.to_string(), start };
                if used[i] {
                    gpu.held.push(p.clone());
                }
                gpu.layout.push(p);
            }
            (None, None) => gpu.whole_held = used[i],
            _ => return None,
        }
        if !used[i] {
            gpu.free_devices.push(i as u32);
        }
    }
    (!gpus.is_empty()).then_some(gpus)
}

/// [`options`] of a node whose GPUs come through DRA: MIG GPUs, and whole GPUs no claim holds.
fn dra_options(node: &Node) -> Vec<GpuOption> {
    let Some(gpus) = dra_gpus(node) else { return Vec::new() };
    let mut out: Vec<GpuOption> = gpus
        .into_iter()
        .filter(|(_, g)| !g.layout.is_empty() || !g.whole_held)
        .map(|(index, g)| GpuOption {
            index,
            mig_off: g.layout.is_empty(),
            current: g.layout,
            used: g.held,
            dra_free: g.free_devices,
        })
        .collect();
    out.sort_by_key(GpuOption::cost);
    out
}

/// What a pending pod asks of MIG: a profile and how many instances, through the device plugin
/// (`nvidia.com/mig-<profile>`) or through unallocated DRA claims whose requests all ask for
/// exactly so many `mig.nvidia.com` devices of one named profile, without constraints between
/// them (which a layout of free instances alone cannot promise).
fn mig_need(w: &Workload) -> Option<(String, usize)> {
    if let GpuDemand::Mig { profile, count } = &w.gpu {
        return Some((profile.clone(), *count as usize));
    }
    if !w.gpu.is_none() || w.dra_claims.is_empty() {
        return None;
    }
    let mut need: Option<(String, usize)> = None;
    for c in &w.dra_claims {
        if c.allocated || !c.constraints.is_empty() {
            return None;
        }
        for r in &c.requests {
            let [sub] = &r.alternatives[..] else { return None };
            let (AllocationMode::ExactCount(n), Some(GpuAsk::Mig(p))) = (sub.mode, sub.gpu_ask()) else {
                return None;
            };
            match &mut need {
                _ if p.is_empty() => return None,
                None => need = Some((p, n as usize)),
                Some((q, m)) if *q == p => *m += n as usize,
                Some(_) => return None,
            }
        }
    }
    need
}

/// Whether a DRA pod's selectors would take a new MIG device of `profile` on `node`: judged on a
/// device the node publishes of that profile, else on one of another profile renamed (its
/// capacities are then the other profile's).
fn dra_selectors_take(node: &Node, w: &Workload, profile: &str) -> bool {
    if w.dra_claims.is_empty() {
        return true;
    }
    let migs = || node.dra.devices.iter().filter(|d| d.mig_profile().is_some());
    let Some(like) = migs().find(|d| d.mig_profile() == Some(profile)).or_else(|| migs().next()) else {
        return false;
    };
    let mut probe: DraDevice = like.clone();
    let key = format!("{}/profile", crate::model::dra::NVIDIA_GPU_DRIVER);
    probe.attributes.insert(key, crate::model::cel::AttrValue::Str(profile.to_string()));
    w.dra_claims.iter().flat_map(|c| &c.requests).all(|r| r.alternatives.iter().any(|a| a.matches(&probe)))
}

/// The best new layout of one GPU for a pod needing `need` instances of `profile`, with
/// `demand` (profile → instances still wanted on this node) as the tie-break, or `None` when no
/// valid layout that keeps the GPU's running instances holds any.
fn best_layout(
    geometry: &MigGeometry,
    layouts: &[Vec<MigPlacement>],
    option: &GpuOption,
    profile: &str,
    need: usize,
    demand: &BTreeMap<String, usize>,
) -> Option<Vec<MigPlacement>> {
    layouts
        .iter()
        .filter(|l| option.used.iter().all(|u| l.contains(u)))
        .filter(|l| geometry.validate(l).is_ok())
        .filter_map(|l| {
            let free = |p: &str| count(l, p) - count(&option.used, p);
            let for_pod = free(profile).min(need);
            if for_pod == 0 {
                return None;
            }
            let for_all: usize = demand.iter().map(|(p, n)| free(p).min(*n)).sum();
            let kept = l.iter().filter(|p| option.current.contains(p)).count();
            // Most instances for this pod, then for the other pending pods, then the layout
            // closest to the current one.
            Some(((for_pod, for_all, kept), l))
        })
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, l)| l.clone())
}

/// What the search decided on one node.
struct NodeAdvice {
    changes: Vec<Change>,
    pods: Vec<(usize, Vec<(u8, MigPlacement)>)>,
}

/// Re-partitions GPUs of one node for as many of `pods` (snapshot indexes, in priority order) as
/// it can: each pod all-or-nothing.
fn advise_node(
    node: &Node,
    geometry: &MigGeometry,
    layouts: &[Vec<MigPlacement>],
    workloads: &[Workload],
    pods: &[usize],
) -> NodeAdvice {
    let options = if node.gpus.is_empty() { dra_options(node) } else { options(node) };
    let mut changes: Vec<Change> = Vec::new();
    let mut assigned: Vec<(usize, Vec<(u8, MigPlacement)>)> = Vec::new();
    let mut free: Resources = node.free();
    let mut demand: BTreeMap<String, usize> = BTreeMap::new();
    for &wi in pods {
        if let Some((profile, count)) = mig_need(&workloads[wi]) {
            *demand.entry(profile).or_default() += count;
        }
    }
    for &wi in pods {
        let w = &workloads[wi];
        let Some((profile, need)) = mig_need(w) else { continue };
        let profile = &profile;
        let Some(after) = free.checked_sub(&w.requests) else { continue };
        let saved = changes.clone();
        let mut got: Vec<(u8, MigPlacement)> = Vec::new();
        // Instances already freed by earlier changes first.
        for c in changes.iter_mut() {
            for p in c.free_of(profile).into_iter().take(need - got.len()) {
                c.taken.push(p.clone());
                got.push((c.option.index, p));
            }
        }
        for option in &options {
            if got.len() == need {
                break;
            }
            if changes.iter().any(|c| c.option.index == option.index) {
                continue;
            }
            let Some(layout) = best_layout(geometry, layouts, option, profile, need - got.len(), &demand)
            else {
                continue;
            };
            let mut change = Change { option: option.clone(), layout, taken: Vec::new() };
            for p in change.free_of(profile).into_iter().take(need - got.len()) {
                change.taken.push(p.clone());
                got.push((option.index, p));
            }
            changes.push(change);
        }
        if let Some(n) = demand.get_mut(profile.as_str()) {
            *n = n.saturating_sub(need);
        }
        if got.len() == need {
            free = after;
            assigned.push((wi, got));
        } else {
            changes = saved;
        }
    }
    changes.sort_by_key(|c| c.option.index);
    NodeAdvice { changes, pods: assigned }
}

/// Layout as text: `1g.10gb@0,1g.10gb@1`, or `MIG off`.
pub(crate) fn layout_text(layout: &[MigPlacement]) -> String {
    if layout.is_empty() {
        return "MIG off".into();
    }
    layout.iter().map(|p| format!("{}@{}", p.profile, p.start)).collect::<Vec<_>>().join(",")
}

/// Profile counts of a layout in mig-parted's form, in profile order.
fn profile_counts(layout: &[MigPlacement]) -> BTreeMap<&str, usize> {
    let mut m = BTreeMap::new();
    for p in layout {
        *m.entry(p.profile.as_str()).or_default() += 1;
    }
    m
}

/// The `nvidia.com/mig.config` value for a node's full set of per-GPU layouts, and the
/// mig-parted config entry that defines it. Uniform single-profile layouts at the profile's
/// maximum get the stock `all-<profile>` name of NVIDIA's default config; anything else a
/// `gpuscale-<hash>` name whose entry must be added to the MIG manager's config map.
fn mig_config(geometry: &MigGeometry, layouts: &[(u8, Vec<MigPlacement>)]) -> (String, String) {
    let first = layouts.first().map(|(_, l)| profile_counts(l)).unwrap_or_default();
    let uniform = layouts.iter().all(|(_, l)| profile_counts(l) == first);
    if uniform && first.len() == 1 {
        let (&profile, &n) = first.iter().next().expect("one profile");
        let max = geometry.profile(profile).map_or(0, |p| {
            let mut l = Vec::new();
            while let Some(s) = geometry.best_start(&l, p) {
                l.push(MigPlacement { profile: profile.to_string(), start: s });
            }
            l.len()
        });
        if n == max {
            let name = format!("all-{profile}");
            let entry = format!(
                "{name}:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n      \"{profile}\": {n}\n"
            );
            return (name, entry);
        }
    }
    // Group GPUs with the same layout, as mig-parted entries do.
    let mut groups: BTreeMap<Vec<(&str, usize)>, Vec<u8>> = BTreeMap::new();
    for (g, l) in layouts {
        groups.entry(profile_counts(l).into_iter().collect()).or_default().push(*g);
    }
    let mut body = String::new();
    for (counts, gpus) in &groups {
        let devices: Vec<String> = gpus.iter().map(u8::to_string).collect();
        let _ = writeln!(body, "  - devices: [{}]", devices.join(", "));
        if counts.is_empty() {
            let _ = writeln!(body, "    mig-enabled: false");
            continue;
        }
        let _ = writeln!(body, "    mig-enabled: true\n    mig-devices:");
        for (p, n) in counts {
            let _ = writeln!(body, "      \"{p}\": {n}");
        }
    }
    // FNV-1a: stable across builds and platforms.
    let hash = body.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let name = format!("gpuscale-{hash:08x}");
    (name.clone(), format!("{name}:\n{body}"))
}

/// What the advice step decided.
pub(crate) struct MigAdvice {
    /// Re-partitions to propose.
    pub repartitions: Vec<MigRepartition>,
    /// Units the advice does not cover (they go on to scale-up).
    pub remaining: Vec<Unit>,
}

/// Looks for re-partitions that place pending single-pod MIG units on existing ready nodes, and
/// records those pods on the re-partitioned GPUs in the simulation so later steps see the
/// capacity as taken.
pub(crate) fn advise(
    placer: &mut Placer<'_>,
    info: &mut [NodeInfo],
    input: &PlanInput,
    groups: &[NodeGroup],
    unplaced: Vec<Unit>,
) -> MigAdvice {
    let workloads = &input.snapshot.workloads;
    // A claim several pods share is allocated once, for all of them: advice per pod would hand
    // each its own instances, so such pods get none.
    let mut users: BTreeMap<&str, usize> = BTreeMap::new();
    for c in workloads.iter().flat_map(|w| &w.dra_claims) {
        *users.entry(c.key.as_str()).or_default() += 1;
    }
    let is_mig = |u: &Unit| {
        let w = &workloads[u.pods[0]];
        u.gang.is_none() && mig_need(w).is_some() && w.dra_claims.iter().all(|c| users[c.key.as_str()] == 1)
    };
    let mut waiting: Vec<usize> = unplaced.iter().filter(|u| is_mig(u)).map(|u| u.pods[0]).collect();
    if waiting.is_empty() {
        return MigAdvice { repartitions: Vec::new(), remaining: unplaced };
    }
    let covered_before = waiting.clone();
    let mut nodes: Vec<usize> = (0..info.len())
        .filter(|&n| {
            let node = &placer.nodes()[n];
            info[n].origin == Origin::Ready && node.state == NodeState::Ready && !node.unschedulable
        })
        .collect();
    nodes.sort_by(|&a, &b| placer.nodes()[a].name.cmp(&placer.nodes()[b].name));
    let mut repartitions = Vec::new();
    let mut layout_cache: BTreeMap<usize, Vec<Vec<MigPlacement>>> = BTreeMap::new();
    for n in nodes {
        if waiting.is_empty() {
            break;
        }
        let node = placer.nodes()[n].clone();
        let Some(geometry) =
            node.gpu_model.as_deref().and_then(|m| GpuCatalog.resolve(m)).and_then(|s| s.mig)
        else {
            continue;
        };
        let fits_node = |wi: &&usize| {
            let w = &workloads[**wi];
            let Some((profile, _)) = mig_need(w) else { return false };
            let served = if node.gpus.is_empty() {
                w.gpu.is_none() && dra_selectors_take(&node, w, &profile)
            } else {
                w.dra_claims.is_empty()
            };
            served && geometry.profile(&profile).is_some() && w.allowed_on(&node)
        };
        let candidates: Vec<usize> = waiting.iter().filter(fits_node).copied().collect();
        if candidates.is_empty() {
            continue;
        }
        // Maximal layouts per GPU model, enumerated once per plan.
        let key = std::ptr::from_ref(geometry) as usize;
        let layouts = layout_cache.entry(key).or_insert_with(|| geometry.maximal_layouts());
        let advice = advise_node(&node, geometry, layouts, workloads, &candidates);
        if advice.pods.is_empty() {
            continue;
        }
        // Only the GPUs a placed pod uses change, and a "change" to the current layout is none.
        let used_gpus: Vec<u8> =
            advice.pods.iter().flat_map(|(_, got)| got.iter().map(|(g, _)| *g)).collect();
        let sorted = |l: &[MigPlacement]| {
            let mut l: Vec<(String, u8)> = l.iter().map(|p| (p.profile.clone(), p.start)).collect();
            l.sort();
            l
        };
        let changes: Vec<&Change> = advice
            .changes
            .iter()
            .filter(|c| used_gpus.contains(&c.option.index) && sorted(&c.layout) != sorted(&c.option.current))
            .collect();
        if changes.is_empty() {
            continue; // the instances exist already: what keeps the pods waiting is not the layout
        }
        let mut pods: Vec<String> = advice.pods.iter().map(|(wi, _)| workloads[*wi].id.clone()).collect();
        pods.sort();
        waiting.retain(|wi| !advice.pods.iter().any(|(p, _)| p == wi));

        // The simulated node: instances the re-partition destroys are withdrawn (held by no pod,
        // so nothing else is placed on them), then the pods take their new instances.
        let withdrawn: Vec<(u8, MigPlacement)> = changes
            .iter()
            .flat_map(|c| {
                c.option
                    .current
                    .iter()
                    .filter(|p| !c.option.used.contains(p))
                    .map(|p| (c.option.index, p.clone()))
            })
            .collect();
        let gone = Workload { id: format!("{}/mig-repartition", node.name), ..Default::default() };
        let dra_withdrawn: Vec<u32> =
            changes.iter().flat_map(|c| c.option.dra_free.iter().copied()).collect();
        if node.gpus.is_empty() {
            // DRA: the free devices of the changed GPUs go; the pods' claims are served by
            // devices the driver publishes after the change, so only their CPU and memory count.
            placer.reserve_dra_devices(n, &gone.id, dra_withdrawn);
            for (wi, _) in &advice.pods {
                placer.commit(&workloads[*wi], &Placement { node: n, devices: DeviceAssignment::None });
                info[n].pods.push((*wi, DeviceAssignment::None));
            }
        } else if !withdrawn.is_empty() {
            placer.commit(
                &gone,
                &Placement { node: n, devices: DeviceAssignment::Mig { instances: withdrawn } },
            );
        }
        // A GPU switched from whole to MIG is no longer available whole.
        let switched: Vec<u8> = changes.iter().filter(|c| c.option.mig_off).map(|c| c.option.index).collect();
        if !switched.is_empty() && !node.gpus.is_empty() {
            placer.commit(&gone, &Placement { node: n, devices: DeviceAssignment::Whole { gpus: switched } });
        }
        if !node.gpus.is_empty() {
            for (wi, got) in &advice.pods {
                let devices = DeviceAssignment::Mig { instances: got.clone() };
                placer.commit(&workloads[*wi], &Placement { node: n, devices: devices.clone() });
                info[n].pods.push((*wi, devices));
            }
        }

        // The layouts of every GPU after the change, for the mig-parted config.
        let current: Vec<(u8, Vec<MigPlacement>)> = match dra_gpus(&node) {
            Some(gpus) => gpus.into_iter().map(|(i, g)| (i, g.layout)).collect(),
            None => node
                .gpus
                .iter()
                .map(|d| match &d.mode {
                    GpuMode::Mig { instances, .. } => {
                        (d.index, instances.iter().map(|i| i.placement.clone()).collect())
                    }
                    _ => (d.index, Vec::new()),
                })
                .collect(),
        };
        let after: Vec<(u8, Vec<MigPlacement>)> = current
            .into_iter()
            .map(|(g, layout)| match changes.iter().find(|c| c.option.index == g) {
                Some(c) => (g, c.layout.clone()),
                None => (g, layout),
            })
            .collect();
        let (label, config) = mig_config(geometry, &after);
        let members: Vec<&Workload> = advice.pods.iter().map(|(wi, _)| &workloads[*wi]).collect();
        let avoided = groups
            .iter()
            .filter(|g| !input.unavailable.contains_key(&g.id) && g.max_size > g.target_size)
            .filter_map(|g| {
                pack_fresh(g, &members, members.len(), g.max_size - g.target_size)
                    .map(|(k, _)| g.price.saturating_mul(u64::from(k)))
            })
            .min();
        repartitions.push(MigRepartition {
            node: node.name.clone(),
            gpus: changes.iter().map(|c| c.option.index).collect(),
            from_layout: changes.iter().map(|c| c.option.current.clone()).collect(),
            to_layout: changes.iter().map(|c| c.layout.clone()).collect(),
            disrupted_instances: changes.iter().map(|c| c.option.used.len() as u32).sum(),
            mig_config_label: label,
            mig_parted_config: config,
            pods,
            saving_per_hour: avoided.unwrap_or(0),
        });
    }
    // Units keep the priority order they came in.
    let advised =
        |u: &Unit| is_mig(u) && covered_before.contains(&u.pods[0]) && !waiting.contains(&u.pods[0]);
    let remaining = unplaced.into_iter().filter(|u| !advised(u)).collect();
    MigAdvice { repartitions, remaining }
}
