//! The planner: from a cluster snapshot and its node groups to a scaling plan.
//!
//! Pure: it reads a snapshot and returns a [`Plan`]; actuation is someone else's job. The steps
//! follow how a cluster operator reasons:
//! 1. Which pending pods fit the nodes that exist or are on their way ([`cluster`]).
//! 2. The cheapest node-group growth for the rest, gangs all-or-nothing (module `scale_up`).
//! 3. Which under-used nodes can go because their pods fit elsewhere, and which expensive nodes a
//!    cheaper one can replace (module `scale_down`).

pub mod cluster;
pub mod decide;
pub mod default_spread;
mod hints;
mod idle;
pub mod interruption;
mod mig_advice;
mod plan;
mod provisioning;
pub mod readiness;
mod scale_down;
mod scale_up;
mod tenancy;

pub use hints::PlacementHints;
pub use plan::{
    IdleGpu, Kept, MigRepartition, PendingPlacement, Plan, Preempt, Replace, RequestOutcome, RequestState,
    ScaleDown, ScaleUp, Unschedulable,
};

use crate::model::{ClusterSnapshot, Node, NodeGroup, Resources, Workload};
use crate::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};
use cluster::Origin;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What the planner looks at.
#[derive(Debug, Clone, Default)]
pub struct PlanInput {
    /// The cluster.
    pub snapshot: ClusterSnapshot,
    /// Node groups the autoscaler manages, with current target sizes.
    pub groups: Vec<NodeGroup>,
    /// Groups not to grow now (recent capacity errors, backoff), with the reason.
    pub unavailable: BTreeMap<String, String>,
    /// Where the last plan put pending pods, tried first (the controller's loops; see
    /// [`PlacementHints`]).
    pub hints: PlacementHints,
}

/// Cluster Autoscaler's `scale-down-unready-time`: 20 minutes.
pub const DEFAULT_UNREADY_SECONDS: f64 = 1200.0;

/// Planner knobs (the `planner:` section of the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PlannerSettings {
    /// Placement policy for pending pods.
    pub policy: PolicyKind,
    /// Seed for tie-breaks.
    pub seed: u64,
    /// Whether to remove under-used nodes.
    pub scale_down: bool,
    /// A node is a scale-down candidate below this utilisation (GPU allocation for GPU nodes,
    /// max of CPU and memory otherwise); at 1.0 (the default) every node whose pods fit elsewhere
    /// is one, as with Karpenter's `WhenEmptyOrUnderutilized`. 0.5 is Cluster Autoscaler's rule,
    /// which keeps fully allocated but badly packed nodes (a 2-GPU node whose CPU-heavy pods would
    /// fit in the spare room of others) for as long as their pods run.
    pub scale_down_utilization: f64,
    /// Whether to replace nodes by cheaper ones.
    pub consolidation: bool,
    /// Most nodes one plan may add.
    pub max_new_nodes: u32,
    /// Most nodes one plan may drain or replace: a disruption budget per loop, like Cluster
    /// Autoscaler's scale-down parallelism and Karpenter's disruption budgets. Later loops
    /// continue where this one stopped.
    pub max_disruptions: u32,
    /// A node running a pod with local storage (`hostPath`, an `emptyDir` not in memory) is not
    /// removed, as with Cluster Autoscaler's `--skip-nodes-with-local-storage` (its default):
    /// eviction loses that data. `safe-to-evict: "true"` or `safe-to-evict-local-volumes` listing
    /// the volumes lets the pod go.
    pub skip_nodes_with_local_storage: bool,
    /// A node running a `kube-system` pod (not a DaemonSet or mirror pod) that no
    /// PodDisruptionBudget covers is not removed, as with Cluster Autoscaler's
    /// `--skip-nodes-with-system-pods` (its default): cluster services go down while they move.
    pub skip_nodes_with_system_pods: bool,
    /// How agent telemetry is used (the config file's `telemetry:` section, copied in by the
    /// caller).
    #[serde(skip)]
    pub telemetry: crate::model::TelemetrySettings,
    /// Tenants and quotas (the config file's `tenancy:` section, set by the caller).
    #[serde(skip)]
    pub tenancy: Option<crate::tenancy::TenancyConfig>,
    /// The `schedulerName`s whose pods are planned: kube-scheduler, the scheduler-plugins build
    /// (coscheduling PodGroups) and the GPU schedulers whose resource forms the planner reads (HAMi,
    /// KAI, Volcano). Pods of any other scheduler are
    /// reported and left to it, neither placed nor scaled for.
    pub scheduler_names: Vec<String>,
    /// Taint keys an agent removes from a node once it has started (a CNI or GPU-readiness agent),
    /// as Karpenter's `startupTaints` and Cluster Autoscaler's `--startup-taint`: pods need not
    /// tolerate them, new nodes are planned without them, and a Ready node that still has one is
    /// still starting. Kubernetes' own condition taints and keys with Cluster Autoscaler's
    /// `startup-taint.cluster-autoscaler.kubernetes.io/` prefix always count.
    pub startup_taints: Vec<String>,
    /// Taint keys a running node may carry that a new one will not (Cluster Autoscaler's
    /// `--status-taint`): never copied from a group's nodes into its template. Kubernetes' and
    /// autoscalers' run-time taints (pressure, cordon, deletion marks) and the
    /// `status-taint.cluster-autoscaler.kubernetes.io/` prefix always count.
    pub ignored_taints: Vec<String>,
    /// The cluster's default topology spread constraints when kube-scheduler is configured with
    /// `defaultingType: List` (its `PodTopologySpreadArgs.defaultConstraints`): applied, as there,
    /// to pods of ReplicaSets, StatefulSets and ReplicationControllers that declare none.
    pub default_spread_constraints: Vec<default_spread::DefaultSpreadConstraint>,
    /// Planning time in seconds since the epoch, for waiting time and work lost (default: the
    /// newest pod creation time in the snapshot).
    #[serde(skip)]
    pub now: Option<i64>,
    /// An unready node is a scale-down candidate (through the drain path, only when its pods fit
    /// elsewhere) after being unready this long: the controller's `scaleDownUnreadySeconds`,
    /// Cluster Autoscaler's `scale-down-unready-time`, set by the caller.
    #[serde(skip)]
    pub unready_seconds: f64,
    /// The snapshot was saved earlier and does not say when (`gpuscale plan --snapshot`): its
    /// telemetry is judged against its newest sample, not against `now`, so that planning a saved
    /// file gives the same plan whenever it runs. Otherwise telemetry older than
    /// `telemetry.maxAge` at `now` never counts, however recent the other nodes' samples are.
    #[serde(skip)]
    pub saved_snapshot: bool,
}

impl PlannerSettings {
    /// The drain rules scale-down applies.
    pub fn drain_rules(&self) -> crate::model::DrainRules {
        crate::model::DrainRules {
            local_storage: self.skip_nodes_with_local_storage,
            system_pods: self.skip_nodes_with_system_pods,
        }
    }

    /// What is wrong with the settings, as (field, value, reason).
    pub fn problems(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        if !(0.0..=1.0).contains(&self.scale_down_utilization) {
            out.push((
                "planner.scaleDownUtilization".into(),
                self.scale_down_utilization.to_string(),
                "must be between 0 and 1".into(),
            ));
        }
        out.extend(default_spread::problems(&self.default_spread_constraints));
        out
    }
}

impl Default for PlannerSettings {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Gpuscale,
            seed: 42,
            scale_down: true,
            scale_down_utilization: 1.0,
            consolidation: true,
            max_new_nodes: 1000,
            max_disruptions: 50,
            skip_nodes_with_local_storage: true,
            skip_nodes_with_system_pods: true,
            telemetry: Default::default(),
            tenancy: None,
            scheduler_names: [
                crate::model::DEFAULT_SCHEDULER,
                "scheduler-plugins-scheduler",
                "hami-scheduler",
                "kai-scheduler",
                "volcano",
            ]
            .map(String::from)
            .to_vec(),
            startup_taints: Vec::new(),
            ignored_taints: Vec::new(),
            default_spread_constraints: Vec::new(),
            now: None,
            unready_seconds: DEFAULT_UNREADY_SECONDS,
            saved_snapshot: false,
        }
    }
}

/// A unit of pending work: one pod, or a gang placed all-or-nothing.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// Snapshot indexes of the pods.
    pub pods: Vec<usize>,
    /// Members that must be placed together (gang minimum).
    pub required: usize,
    /// Node label all members must share.
    pub topology_key: Option<String>,
    /// Gang id, for reasons.
    pub gang: Option<String>,
}

/// Groups pending pods into units: pods that use a booking first, then highest priority,
/// then largest first, then oldest, then by name.
///
/// Within a priority, pods are packed largest first (by their dominant share of `capacity`), as
/// Cluster Autoscaler's bin-packing estimator does: first-fit decreasing needs markedly fewer nodes
/// than arrival order when many pods wait at once (a cold start, a burst).
fn pending_units(
    workloads: &[Workload],
    planned: &dyn Fn(&Workload) -> bool,
    first: &dyn Fn(&Workload) -> bool,
    capacity: &Resources,
    gpu_capacity_milli: u64,
) -> Vec<Unit> {
    let mut pending: Vec<usize> = (0..workloads.len())
        .filter(|&i| workloads[i].node_name.is_none() && planned(&workloads[i]))
        .collect();
    let share = |w: &Workload| -> f64 {
        let cpu = w.requests.cpu_milli as f64 / capacity.cpu_milli.max(1) as f64;
        let mem = w.requests.memory_bytes as f64 / capacity.memory_bytes.max(1) as f64;
        let gpu = w.gpu.gpu_milli(0, None, 1) as f64 / gpu_capacity_milli.max(1) as f64;
        cpu.max(mem).max(gpu)
    };
    pending.sort_by(|&a, &b| {
        let (x, y) = (&workloads[a], &workloads[b]);
        first(y)
            .cmp(&first(x))
            .then(y.priority.cmp(&x.priority))
            .then(share(y).total_cmp(&share(x)))
            .then(x.created_at.cmp(&y.created_at))
            .then(x.id.cmp(&y.id))
    });
    let mut units: Vec<Unit> = Vec::new();
    let mut gang_unit: BTreeMap<&str, usize> = BTreeMap::new();
    for i in pending {
        let w = &workloads[i];
        match &w.gang {
            Some(g) => match gang_unit.get(g.as_str()) {
                Some(&u) => units[u].pods.push(i),
                None => {
                    gang_unit.insert(g, units.len());
                    units.push(Unit {
                        pods: vec![i],
                        required: 0,
                        topology_key: w.gang_topology_key.clone(),
                        gang: Some(g.clone()),
                    });
                }
            },
            None => units.push(Unit { pods: vec![i], required: 1, topology_key: None, gang: None }),
        }
    }
    // A gang needs its minimum, counting members already running.
    for u in units.iter_mut().filter(|u| u.gang.is_some()) {
        let gang = u.gang.as_deref();
        let running = workloads.iter().filter(|w| w.gang.as_deref() == gang && w.node_name.is_some()).count();
        let min = u.pods.iter().find_map(|&i| workloads[i].gang_min_members).map(|m| m as usize);
        u.required = min.map_or(u.pods.len(), |m| m.saturating_sub(running).min(u.pods.len()));
    }
    units
}

/// Makes the plan.
pub fn plan(input: &PlanInput, settings: &PlannerSettings) -> Plan {
    match provisioning::expand(input, settings.now) {
        Some((expanded, ex)) => {
            let mut found = provisioning::Found::default();
            let mut out = plan_with(&expanded, settings, &ex, &mut found);
            provisioning::report(
                &mut out,
                &ex,
                &found,
                &expanded.snapshot.workloads,
                &input.snapshot.provisioning_requests,
            );
            out
        }
        None => plan_with(input, settings, &Default::default(), &mut Default::default()),
    }
}

/// [`plan`] with ProvisioningRequests' stand-ins in the workloads (`ex` says which).
fn plan_with(
    input: &PlanInput,
    settings: &PlannerSettings,
    ex: &provisioning::Expansion,
    found: &mut provisioning::Found,
) -> Plan {
    if let Some(workloads) =
        default_spread::apply(&input.snapshot.workloads, &settings.default_spread_constraints)
    {
        let mut defaulted = input.clone();
        defaulted.snapshot.workloads = workloads;
        return plan_with(
            &defaulted,
            &PlannerSettings { default_spread_constraints: Vec::new(), ..settings.clone() },
            ex,
            found,
        );
    }
    let mut out = Plan::default();
    // Where a plan's time goes, for `RUST_LOG=gpuscale::planner=debug`.
    let started = std::time::Instant::now();
    let mut steps: Vec<(&str, std::time::Duration)> = Vec::new();
    let snapshot = &input.snapshot;
    let target = TargetWorkload::from_workloads(&snapshot.workloads, 0.95);
    let taints = cluster::TaintRules::of(settings);
    let groups = cluster::learn_templates(&input.groups, snapshot, taints);
    for (configured, learned) in input.groups.iter().zip(&groups) {
        if !configured.template.gpus.is_empty() && learned.template.gpus.is_empty() {
            out.warnings.push(format!(
                "node group {}: the config promises {} device-plugin GPU(s) per node, its Ready nodes advertise none and publish {} DRA device(s) (device plugin off): new nodes are planned as its Ready nodes are",
                configured.id,
                configured.template.gpus.len(),
                learned.template.dra.devices.len()
            ));
        }
    }
    // The nodes there are and one of each group's: what the scale of scores is taken from.
    let scale_nodes = || snapshot.nodes.iter().chain(groups.iter().map(|g| &g.template));
    let policy = settings.policy.build(&ClusterScale::of(scale_nodes()), &target);
    let (mut placer, mut info) =
        cluster::build(snapshot, &groups, policy.as_ref(), settings.seed, taints, &mut out.warnings);
    out.cost_before = groups.iter().map(|g| u64::from(g.target_size) * g.price).sum();

    // 0. Tenancy: fair-share order, quota and workload-class admission.
    let mut gate = settings.tenancy.as_ref().map(|c| tenancy::Gate::new(c, snapshot, &groups, settings.now));
    let capacity = scale_nodes().fold(Resources::default(), |acc, n| acc.saturating_add(&n.allocatable));
    let gpu_capacity: u64 = scale_nodes().map(Node::gpu_milli_capacity).sum();
    // Pods of a scheduler the planner does not model, and pods whose volumes no node can
    // serve: reported, never placed or scaled for.
    let ours = |w: &Workload| {
        let name = w.scheduler.as_deref().unwrap_or(crate::model::DEFAULT_SCHEDULER);
        settings.scheduler_names.iter().any(|s| s == name)
    };
    // Booked and check-capacity stand-ins of ProvisioningRequests have steps of their own.
    let planned = |w: &Workload| ours(w) && w.volume_blocked.is_none() && !ex.reserved(w);
    let reported = |w: &Workload| w.node_name.is_none() && !planned(w) && !ex.reserved(w);
    for w in snapshot.workloads.iter().filter(|w| reported(w)) {
        let reason = match &w.volume_blocked {
            Some(blocked) if ours(w) => blocked.clone(),
            _ => format!(
                "schedulerName {}: not a scheduler gpuscale plans for (planner.schedulerNames: {}); left to it",
                w.scheduler.as_deref().unwrap_or_default(),
                settings.scheduler_names.join(", ")
            ),
        };
        out.unschedulable.push(Unschedulable { pod: w.id.clone(), reason });
    }
    // Booked capacity is taken before any pending pod is placed.
    provisioning::hold_bookings(ex, found, &mut placer, &mut info, &snapshot.workloads);
    let mut units =
        pending_units(&snapshot.workloads, &planned, &|w| ex.uses_booking(w), &capacity, gpu_capacity);
    let mut reclaim = Vec::new();
    if let Some(g) = gate.as_mut() {
        let gpu_milli = snapshot.nodes.iter().map(|n| n.gpu_milli_capacity()).sum();
        (units, reclaim) = g.admit(&snapshot.workloads, units, gpu_milli, &mut out.unschedulable);
    }
    // Pods held back by quota wait for quota, not capacity, and pods of other schedulers for
    // those: they do not block scale-down.
    let held = out.unschedulable.len();

    steps.push(("prepare", started.elapsed()));
    // 1. Pending pods onto existing and in-flight capacity.
    let mut unplaced: Vec<Unit> = Vec::new();
    let hinted = input.hints.resolve(&snapshot.workloads, placer.nodes());
    let among = if hinted.is_empty() { scale_up::Among::All } else { scale_up::Among::Hinted(&hinted) };
    for unit in units {
        match scale_up::place_unit(&mut placer, &snapshot.workloads, &unit, among) {
            Some(placed) => {
                // A gang whose minimum is placed: its other members scale like single pods.
                for &wi in unit.pods.iter().filter(|wi| !placed.iter().any(|(p, _)| p == *wi)) {
                    unplaced.push(Unit { pods: vec![wi], required: 1, topology_key: None, gang: None });
                }
                for (wi, p) in placed {
                    info[p.node].pods.push((wi, p.devices));
                }
            }
            None => unplaced.push(unit),
        }
    }

    steps.push(("place", started.elapsed()));
    // 1a. check-capacity requests: what is left on Ready nodes.
    provisioning::check_capacity(ex, found, &mut placer, &mut info, &snapshot.workloads);

    // 1b. Preemption: evict when cheaper than scaling up, and reclaim lent quota. Stand-ins of
    // requests never evict: Kueue preempts before it asks for capacity.
    let (stand_ins, unplaced): (Vec<Unit>, Vec<Unit>) =
        unplaced.into_iter().partition(|u| u.pods.iter().any(|&wi| ex.is_stand_in(wi)));
    let mut unplaced = unplaced;
    if let Some(g) = gate.as_mut() {
        for unit in reclaim {
            if g.preempt(&mut placer, &mut info, input, &groups, &unit, true)
                .map(|p| out.preemptions.push(p))
                .is_none()
            {
                for &wi in &unit.pods {
                    out.unschedulable.push(Unschedulable {
                        pod: snapshot.workloads[wi].id.clone(),
                        reason: "within its tenant's nominal quota, which borrowers hold; no allowed victims to reclaim it from".into(),
                    });
                }
            }
        }
        let mut rest = Vec::new();
        for unit in unplaced {
            match g.preempt(&mut placer, &mut info, input, &groups, &unit, false) {
                Some(p) => out.preemptions.push(p),
                None => rest.push(unit),
            }
        }
        unplaced = rest;
    }

    // 2. MIG re-partitioning of idle GPUs instead of new nodes, then scale-up for the rest.
    let advice = mig_advice::advise(&mut placer, &mut info, input, &groups, unplaced);
    out.mig_repartitions = advice.repartitions;
    let mut unplaced = advice.remaining;
    unplaced.extend(stand_ins);
    let ups = scale_up::plan(
        &mut placer,
        &mut info,
        input,
        &groups,
        &unplaced,
        settings.max_new_nodes,
        gate.as_mut(),
    );
    out.unschedulable.extend(ups.unschedulable);
    out.scale_ups = ups.scale_ups;
    steps.push(("scale_up", started.elapsed()));

    // 3. Scale-down and consolidation, only when nothing waits for new capacity.
    let clock = if settings.saved_snapshot { None } else { settings.now };
    let idle = idle::find(&placer, &info, &snapshot.workloads, &groups, &settings.telemetry, clock);
    out.idle_gpus = idle.idle;
    if settings.scale_down {
        let waiting: BTreeSet<&str> = out.unschedulable[held..].iter().map(|u| u.pod.as_str()).collect();
        let growth = scale_down::Growth {
            pending: !waiting.is_empty() || !out.scale_ups.is_empty(),
            groups: groups.iter().map(|g| out.scale_ups.iter().any(|s| s.group == g.id)).collect(),
        };
        let downs =
            scale_down::plan(&mut placer, &mut info, input, &groups, settings, &growth, &idle.reclaimable);
        out.scale_downs = downs.scale_downs;
        out.replacements = downs.replacements;
        out.kept = downs.kept;
    }
    steps.push(("scale_down", started.elapsed()));
    tracing::debug!(?steps, "plan steps (time since the plan started)");
    // Where pending pods end up on capacity that exists or is on its way (after any moves);
    // pods served by a MIG re-partition are listed there.
    let repartitioned: BTreeSet<&str> =
        out.mig_repartitions.iter().flat_map(|r| r.pods.iter().map(String::as_str)).collect();
    for (n, node_info) in info.iter().enumerate() {
        if node_info.origin == Origin::New {
            continue;
        }
        for (wi, devices) in &node_info.pods {
            let id = snapshot.workloads[*wi].id.as_str();
            if snapshot.workloads[*wi].node_name.is_none() && !repartitioned.contains(id) {
                out.placements.push(PendingPlacement {
                    pod: snapshot.workloads[*wi].id.clone(),
                    node: placer.nodes()[n].name.clone(),
                    devices: devices.clone(),
                    node_in_flight: node_info.origin != Origin::Ready,
                });
            }
        }
    }
    out.placements.sort_by(|a, b| a.pod.cmp(&b.pod));
    let added: u64 = out.scale_ups.iter().map(|s| s.cost_per_hour).sum();
    let saved: u64 = out.scale_downs.iter().map(|s| s.saving_per_hour).sum::<u64>()
        + out.replacements.iter().map(|r| r.saving_per_hour).sum::<u64>();
    out.cost_after = (out.cost_before + added).saturating_sub(saved);
    out
}
