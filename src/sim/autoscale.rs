//! Autoscaling replay: a trace with arrivals and departures on a cluster that grows and shrinks
//! through a [`SimulatedCloud`], comparing gpuscale's planner with a Cluster-Autoscaler-like
//! baseline, a static cluster sized for the peak, and the cost lower bound.
//!
//! Every `interval` seconds of virtual time a loop sees the cloud's instances (Running ones are
//! Ready nodes, Pending ones are in flight through the target sizes), decides, actuates through the
//! cloud, binds pending pods to Ready nodes and advances the cloud's clock. Pods run for their
//! trace duration once bound; an evicted pod is re-queued and runs its full duration again.
//!
//! gpuscale: `planner::plan` on a snapshot of the Ready nodes and the pods; scale-ups set the
//! plan's absolute targets, pending pods are bound per the plan's placements on Ready nodes,
//! scale-downs (and consolidation replacements: cordon, add the cheaper node, move the pods once it
//! is Ready) happen after the node has been removable for `unneeded` seconds. Groups whose launch
//! failed are passed as unavailable for `backoff` seconds.
//!
//! The Cluster-Autoscaler-like baseline follows CA's defaults: one expansion per loop chosen by
//! the least-waste expander on CPU and memory only, node estimates in a whole-GPU view (fractional
//! GPU requests rounded up to whole GPUs), scale-down of nodes whose CPU/memory utilisation is
//! below 0.5 for 10 minutes when their pods fit elsewhere (all empty nodes and at most one
//! non-empty node per loop, not within 10 minutes of a scale-up), first-fit binding.

use crate::model::{
    CapacityType, ClusterSnapshot, DeviceAssignment, GpuDemand, InstanceState, Node, NodeGroup, NodeState,
    OwnerKind, Workload, DEFAULT_GRACE_SECONDS, GPU_MILLI,
};
use crate::planner::decide::{self, decide, replacement_node, Command, DecideSettings, Observed};
use crate::planner::interruption::{self, InterruptionSettings, InterruptionState};
use crate::planner::{self, PlanInput, PlannerSettings};
use crate::providers::config::{self, ConfigError};
use crate::providers::simulated::{Operation, SimulatedCloud, SimulationSettings};
use crate::providers::CloudProvider;
use crate::scheduler::fit;
use crate::trace::openb::TracePod;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Node groups mirroring the openb node shapes (custom `instanceSpec`s). Prices: the closest
/// embedded-catalog type by GPU count/family and vCPUs, scaled by the vCPU ratio:
/// G2 8×, 96 vCPU, 384 GiB = g4dn.metal ($7.824); T4 2×, 104 vCPU, 512 GiB = g4dn.metal × 104/96;
/// P100 2×, 64 vCPU, 256 GiB = g4dn.16xlarge ($4.352); V100M16 4×, 32 vCPU, 128 GiB =
/// g5.12xlarge × 32/48; V100M32 8×, 96 vCPU, 768 GiB = g5.48xlarge × 96/192; G3 8×, 128 vCPU,
/// 768 GiB = g5.48xlarge × 128/192; A10 1×, 128 vCPU, 1 TiB = g5.16xlarge × 2.
pub const OPENB_GROUPS: &str = r#"
accounts:
  - name: openb
    provider: simulated
    region: sim-1
    simulation: {bootSeconds: 120, capacityErrorRate: 0.02, seed: 1}
    nodeGroups:
      - {name: g2, instanceType: openb-g2, instanceSpec: {vcpu: 96, memoryGiB: 384, gpus: 8, gpuModel: G2, price: {onDemand: 7.824}}, zones: [sim-1a], maxSize: 2000}
      - {name: t4, instanceType: openb-t4, instanceSpec: {vcpu: 104, memoryGiB: 512, gpus: 2, gpuModel: T4, price: {onDemand: 8.476}}, zones: [sim-1a], maxSize: 2000}
      - {name: p100, instanceType: openb-p100, instanceSpec: {vcpu: 64, memoryGiB: 256, gpus: 2, gpuModel: P100, price: {onDemand: 4.352}}, zones: [sim-1a], maxSize: 2000}
      - {name: v100m16, instanceType: openb-v100m16, instanceSpec: {vcpu: 32, memoryGiB: 128, gpus: 4, gpuModel: V100M16, nvlink: true, price: {onDemand: 3.781}}, zones: [sim-1a], maxSize: 2000}
      - {name: v100m32, instanceType: openb-v100m32, instanceSpec: {vcpu: 96, memoryGiB: 768, gpus: 8, gpuModel: V100M32, nvlink: true, price: {onDemand: 8.144}}, zones: [sim-1a], maxSize: 2000}
      - {name: g3, instanceType: openb-g3, instanceSpec: {vcpu: 128, memoryGiB: 768, gpus: 8, gpuModel: G3, price: {onDemand: 10.859}}, zones: [sim-1a], maxSize: 2000}
      - {name: a10, instanceType: openb-a10, instanceSpec: {vcpu: 128, memoryGiB: 1024, gpus: 1, gpuModel: A10, price: {onDemand: 8.192}}, zones: [sim-1a], maxSize: 2000}
"#;

/// The embedded openb-shaped node groups and their simulation settings.
pub fn openb_groups() -> Result<(Vec<NodeGroup>, SimulationSettings), ConfigError> {
    let cfg = config::load_strs(&[("<embedded openb groups>", OPENB_GROUPS)])?;
    let settings = cfg.accounts[0].simulation.as_ref().map(SimulationSettings::from).unwrap_or_default();
    Ok((cfg.node_groups(), settings))
}

/// One pod of the replay: when it arrives (seconds from the window start) and how long it runs.
#[derive(Debug, Clone)]
pub struct Job {
    /// The pod.
    pub workload: Workload,
    /// Arrival, seconds from the window start.
    pub arrival: u64,
    /// Run time once bound, seconds.
    pub duration: u64,
}

/// The jobs of a trace window.
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    /// Jobs by arrival.
    pub jobs: Vec<Job>,
    /// Trace pods without creation or deletion time (not replayed).
    pub skipped_without_times: usize,
    /// Window start, seconds from trace start.
    pub start: u64,
    /// Window length, seconds.
    pub length: u64,
}

/// The pods of an openb trace alive in `[start, start + hours)`; `start` defaults to the first
/// creation time. Pods created before the window that are still running arrive at its start with
/// their remaining time.
pub fn jobs_from_openb(pods: &[TracePod], start: Option<u64>, hours: f64) -> Jobs {
    let timed: Vec<(&TracePod, u64, u64)> = pods
        .iter()
        .filter_map(|p| Some((p, p.creation_time?, p.deletion_time?)))
        .filter(|(_, c, d)| d > c)
        .collect();
    let skipped_without_times = pods.len() - timed.len();
    let start = start.unwrap_or_else(|| timed.iter().map(|t| t.1).min().unwrap_or(0));
    let length = (hours.max(0.0) * 3600.0).round() as u64;
    let mut jobs: Vec<Job> = timed
        .into_iter()
        .filter(|(_, c, d)| *c < start + length && *d > start)
        .map(|(p, c, d)| {
            let arrival = c.saturating_sub(start);
            let workload = super::owned_by_a_job(p.workload.clone());
            Job { workload, arrival, duration: d - c.max(start) }
        })
        .collect();
    jobs.sort_by(|a, b| a.arrival.cmp(&b.arrival).then(a.workload.id.cmp(&b.workload.id)));
    Jobs { jobs, skipped_without_times, start, length }
}

/// The start (a whole hour of the trace) of the `hours`-long window holding the most GPU demand,
/// in GPU-seconds of the pods alive in it: the default replay window, because a trace's first day
/// is often nearly empty (openb's holds a single pod) and says nothing about autoscaling.
pub fn busiest_window_start(pods: &[TracePod], hours: f64) -> u64 {
    let length = (hours.max(0.0) * 3600.0).round() as u64;
    let spans: Vec<(u64, u64, f64)> = pods
        .iter()
        .filter_map(|p| {
            let gpus = demand_milli(&p.workload) as f64 / f64::from(GPU_MILLI);
            Some((p.creation_time?, p.deletion_time?, gpus))
        })
        .filter(|&(c, d, gpus)| d > c && gpus > 0.0)
        .collect();
    let Some(first) = spans.iter().map(|s| s.0).min() else { return 0 };
    let last = spans.iter().map(|s| s.1).max().unwrap_or(first);
    let first_hour = first / 3600 * 3600;
    let mut best = (f64::NEG_INFINITY, first_hour);
    let mut start = first_hour;
    while start <= last {
        let end = start + length;
        let demand: f64 =
            spans.iter().map(|&(c, d, gpus)| gpus * d.min(end).saturating_sub(c.max(start)) as f64).sum();
        if demand > best.0 {
            best = (demand, start);
        }
        start += 3600;
    }
    best.1
}

/// Replay knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscaleConfig {
    /// Autoscaler loop period, seconds (Cluster Autoscaler's scan interval).
    pub interval: u64,
    /// The decision step's timers, the controller's defaults unless changed: how long a node
    /// must stay removable before it is removed (also the CA-like baseline's unneeded time, which
    /// has the same 10-minute default), and when a replacement is given up.
    pub decide: DecideSettings,
    /// No scale-down for this long after a scale-up (CA baseline), seconds.
    pub scale_down_delay_after_add: u64,
    /// A group whose launch failed is not grown for this long, seconds.
    pub backoff: u64,
    /// Seed of the simulated cloud (capacity errors) and tie-breaks.
    pub seed: u64,
    /// gpuscale planner's scale-down threshold (GPU allocation of GPU nodes; 1.0: every node).
    pub scale_down_utilization: f64,
    /// Whether gpuscale replaces nodes by cheaper ones (the planner's consolidation).
    pub consolidation: bool,
    /// Cloud behaviour (boot time, capacity error rate); the seed is replaced by `seed`.
    pub cloud: SimulationSettings,
    /// gpuscale: whether it reads interruption notices (the CA-like baseline never does, as
    /// Cluster Autoscaler without a termination handler), and how it reacts to them.
    pub notices: Option<InterruptionSettings>,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        Self {
            interval: 10,
            decide: DecideSettings::default(),
            scale_down_delay_after_add: 600,
            backoff: 300,
            seed: 42,
            scale_down_utilization: 1.0,
            consolidation: true,
            cloud: SimulationSettings { boot: Duration::from_secs(120), ..Default::default() },
            notices: Some(InterruptionSettings::default()),
        }
    }
}

/// The policies of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Autoscaler {
    /// gpuscale's planner.
    Gpuscale,
    /// The Cluster-Autoscaler-like baseline.
    ClusterAutoscaler,
    /// A fixed cluster sized for the peak.
    Static,
}

impl Autoscaler {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Autoscaler::Gpuscale => "gpuscale",
            Autoscaler::ClusterAutoscaler => "ca-like",
            Autoscaler::Static => "static-peak",
        }
    }
}

/// One sample of the time series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// Seconds from the window start.
    pub time: u64,
    /// GPUs of live (booting or running) instances.
    pub capacity_gpus: f64,
    /// GPUs allocated to running pods.
    pub allocated_gpus: f64,
    /// GPUs demanded by running and pending pods.
    pub demanded_gpus: f64,
    /// Pending pods.
    pub pending: usize,
}

/// What one policy did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRun {
    /// Policy.
    pub policy: Autoscaler,
    /// Cost of live instances over the window, dollars.
    pub cost: f64,
    /// GPU-hours of live instances.
    pub gpu_hours: f64,
    /// Mean allocated / capacity GPUs over the samples with capacity.
    pub mean_allocation: f64,
    /// Pending time percentiles (p50, p95, p99), seconds; pods that never ran count with their
    /// wait until the window end.
    pub pending_p50: f64,
    /// See `pending_p50`.
    pub pending_p95: f64,
    /// See `pending_p50`.
    pub pending_p99: f64,
    /// Scale-ups (target raises) plus removed nodes.
    pub scale_actions: u64,
    /// Pods evicted by scale-down (or lost with their instance).
    pub disrupted: u64,
    /// Pods that ran at least once.
    pub ran: usize,
    /// Pods still pending at the window end, never having run.
    pub never_ran: usize,
    /// Launches that failed for lack of capacity.
    pub launch_failures: u64,
    /// Spot instances reclaimed by the cloud (their notice's deadline came).
    pub reclaimed: u64,
    /// Interruption notices the policy acted on.
    pub notices_handled: u64,
    /// Pods still running on a node when the cloud took it: killed without being drained.
    pub killed_without_notice: u64,
    /// GPU-hours that pods had run before they were evicted or killed, lost because they start
    /// again from the beginning.
    pub work_lost_gpu_hours: f64,
    /// Time series, one sample per loop.
    pub samples: Vec<Sample>,
    /// gpuscale: the decision step's commands, with the virtual time of their pass (what the
    /// controller would have carried out).
    #[serde(skip)]
    pub commands: Vec<(u64, Command)>,
}

/// The lower bound: exactly the demanded GPU capacity at the cheapest $/GPU-hour it may use.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LowerBound {
    /// Dollars.
    pub cost: f64,
    /// GPU-hours.
    pub gpu_hours: f64,
}

/// Runs one autoscaled or static replay.
pub fn run(jobs: &Jobs, groups: &[NodeGroup], policy: Autoscaler, cfg: &AutoscaleConfig) -> PolicyRun {
    let mut groups = groups.to_vec();
    for g in &mut groups {
        g.target_size = 0;
        g.min_size = 0;
        g.instances.clear();
    }
    if policy == Autoscaler::Static {
        for (gi, count) in static_peak_nodes(jobs, &groups) {
            groups[gi].target_size = count;
            groups[gi].max_size = groups[gi].max_size.max(count);
        }
    }
    let mut settings = cfg.cloud.clone();
    settings.seed = cfg.seed;
    let cloud = SimulatedCloud::new("replay", groups, settings);
    Sim::new(jobs, cloud, policy, cfg).run()
}

/// The whole comparison of one seed: the three policies and the lower bound.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// Lower bound.
    pub lower_bound: LowerBound,
    /// Runs in the order gpuscale, CA-like, static.
    pub runs: Vec<PolicyRun>,
}

/// Runs gpuscale, the CA-like baseline and the static cluster on the same jobs.
pub fn compare(jobs: &Jobs, groups: &[NodeGroup], cfg: &AutoscaleConfig) -> Comparison {
    let runs = [Autoscaler::Gpuscale, Autoscaler::ClusterAutoscaler, Autoscaler::Static]
        .into_iter()
        .map(|p| run(jobs, groups, p, cfg))
        .collect();
    Comparison { lower_bound: lower_bound(jobs, groups), runs }
}

/// Each group and a spot twin of it (`<name>-spot`, at `spot_price_factor` of its price), for
/// the replays with interruptions: the same shapes, both capacity types, so a pod may go to
/// either unless its selectors say otherwise.
pub fn with_spot_twins(groups: &[NodeGroup], spot_price_factor: f64) -> Vec<NodeGroup> {
    let mut out = groups.to_vec();
    for g in groups.iter().filter(|g| g.capacity_type == CapacityType::OnDemand) {
        let mut t = g.clone();
        t.id = format!("{}-spot", g.id);
        t.capacity_type = CapacityType::Spot;
        t.price = (g.price as f64 * spot_price_factor).round() as u64;
        let name = t.name().to_string();
        for (k, v) in CapacityType::Spot.labels() {
            t.template.labels.insert(k.to_string(), v.to_string());
        }
        t.template.labels.insert("gpuscale.io/node-group".into(), name.clone());
        t.template.node_group = Some(t.id.clone());
        t.template.name = format!("{}-template", t.id.replace('/', "-"));
        out.push(t);
    }
    out
}

/// The replay with spot interruptions and capacity errors: gpuscale (reading notices) and the
/// CA-like baseline (which sees none), each with spot allowed and on-demand only, and the lower
/// bound of each.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpotComparison {
    /// Lower bound with spot allowed (spot prices, no interruptions).
    pub lower_bound_spot: LowerBound,
    /// Lower bound on on-demand groups only.
    pub lower_bound_on_demand: LowerBound,
    /// Runs, each with its label: `gpuscale spot`, `gpuscale on-demand`, `ca-like spot`,
    /// `ca-like on-demand`, `gpuscale spot, no notices`.
    pub runs: Vec<(String, PolicyRun)>,
}

/// Runs the spot comparison on `on_demand` groups and their spot twins.
pub fn compare_spot(
    jobs: &Jobs,
    on_demand: &[NodeGroup],
    spot_price_factor: f64,
    cfg: &AutoscaleConfig,
) -> SpotComparison {
    let spot = with_spot_twins(on_demand, spot_price_factor);
    let without = AutoscaleConfig { notices: None, ..cfg.clone() };
    let runs = vec![
        ("gpuscale spot".to_string(), run(jobs, &spot, Autoscaler::Gpuscale, cfg)),
        ("gpuscale on-demand".to_string(), run(jobs, on_demand, Autoscaler::Gpuscale, cfg)),
        ("ca-like spot".to_string(), run(jobs, &spot, Autoscaler::ClusterAutoscaler, cfg)),
        ("ca-like on-demand".to_string(), run(jobs, on_demand, Autoscaler::ClusterAutoscaler, cfg)),
        ("gpuscale spot, no notices".to_string(), run(jobs, &spot, Autoscaler::Gpuscale, &without)),
    ];
    SpotComparison {
        lower_bound_spot: lower_bound(jobs, &spot),
        lower_bound_on_demand: lower_bound(jobs, on_demand),
        runs,
    }
}

/// Milli-GPUs a pod asks for (fractions as their share, whole GPUs as 1000 each).
pub fn demand_milli(w: &Workload) -> u64 {
    match &w.gpu {
        GpuDemand::None => 0,
        GpuDemand::Whole { count } | GpuDemand::Shared { count } | GpuDemand::Mig { count, .. } => {
            u64::from(*count) * u64::from(GPU_MILLI)
        }
        GpuDemand::Fraction { count, milli, .. } => u64::from(*count) * u64::from(*milli),
    }
}

fn gpu_model_allowed(w: &Workload, g: &NodeGroup) -> bool {
    w.gpu_models.is_empty() || g.template.gpu_model.as_ref().is_some_and(|m| w.gpu_models.contains(m))
}

/// The lower bound (see [`LowerBound`]); durations are clipped to the window.
pub fn lower_bound(jobs: &Jobs, groups: &[NodeGroup]) -> LowerBound {
    let mut lb = LowerBound { cost: 0.0, gpu_hours: 0.0 };
    for j in &jobs.jobs {
        let milli = demand_milli(&j.workload);
        if milli == 0 {
            continue;
        }
        let per_gpu = groups
            .iter()
            .filter(|g| !g.template.gpus.is_empty() && gpu_model_allowed(&j.workload, g))
            .map(|g| g.price as f64 / 1e6 / g.template.gpus.len() as f64)
            .fold(f64::INFINITY, f64::min);
        if !per_gpu.is_finite() {
            continue;
        }
        let hours = (j.arrival + j.duration).min(jobs.length).saturating_sub(j.arrival) as f64 / 3600.0;
        let gpus = milli as f64 / f64::from(GPU_MILLI);
        lb.gpu_hours += gpus * hours;
        lb.cost += gpus * hours * per_gpu;
    }
    lb
}

/// The static cluster: the pods alive at the instant of peak GPU demand, placed best-fit
/// (largest first) on as few nodes as possible, each new node from the cheapest group that holds
/// the pod. Returns node counts per group index.
pub fn static_peak_nodes(jobs: &Jobs, groups: &[NodeGroup]) -> BTreeMap<usize, u32> {
    // Peak instant over arrival events (demand only rises at arrivals).
    let mut events: Vec<(u64, i64)> = Vec::new();
    for j in &jobs.jobs {
        let m = demand_milli(&j.workload) as i64;
        events.push((j.arrival, m));
        events.push(j.arrival.checked_add(j.duration).map_or((u64::MAX, -m), |e| (e, -m)));
    }
    events.sort_by_key(|e| (e.0, e.1));
    let (mut level, mut peak, mut peak_at) = (0i64, -1i64, 0u64);
    for (t, d) in events {
        level += d;
        if level > peak && t < jobs.length.max(1) {
            peak = level;
            peak_at = t;
        }
    }
    let mut set: Vec<&Workload> = jobs
        .jobs
        .iter()
        .filter(|j| j.arrival <= peak_at && j.arrival + j.duration > peak_at)
        .map(|j| &j.workload)
        .collect();
    set.sort_by(|a, b| {
        demand_milli(b)
            .cmp(&demand_milli(a))
            .then(b.requests.cpu_milli.cmp(&a.requests.cpu_milli))
            .then(a.id.cmp(&b.id))
    });
    let mut nodes: Vec<(usize, Node)> = Vec::new();
    let mut by_price: Vec<usize> = (0..groups.len()).collect();
    by_price.sort_by_key(|&g| (groups[g].price, g));
    for w in set {
        if let Some((ni, devices)) = best_fit(nodes.iter().map(|(_, n)| n), w) {
            nodes[ni].1.allocate_pod(w, &devices);
            continue;
        }
        for &gi in &by_price {
            let mut node = fresh_node(&groups[gi], format!("static-{}", nodes.len()));
            if let Ok(c) = fit::candidates(&node, w) {
                if let Some(devices) = c.into_iter().next() {
                    node.allocate(&w.requests, &devices);
                    nodes.push((gi, node));
                    break;
                }
            }
        }
    }
    let mut counts = BTreeMap::new();
    for (gi, _) in nodes {
        *counts.entry(gi).or_insert(0) += 1;
    }
    counts
}

/// The node leaving the least free GPU (then CPU) after placing `w`, with its devices.
fn best_fit<'a>(nodes: impl Iterator<Item = &'a Node>, w: &Workload) -> Option<(usize, DeviceAssignment)> {
    let need = demand_milli(w);
    let mut best: Option<(u64, u64, usize, DeviceAssignment)> = None;
    for (i, n) in nodes.enumerate() {
        if let Ok(c) = fit::candidates(n, w) {
            if let Some(d) = c.into_iter().next() {
                let key = (n.gpu_milli_free().saturating_sub(need), n.free().cpu_milli);
                if best.as_ref().is_none_or(|b| key < (b.0, b.1)) {
                    best = Some((key.0, key.1, i, d));
                }
            }
        }
    }
    best.map(|b| (b.2, b.3))
}

fn first_fit<'a>(nodes: impl Iterator<Item = &'a Node>, w: &Workload) -> Option<(usize, DeviceAssignment)> {
    for (i, n) in nodes.enumerate() {
        if let Ok(c) = fit::candidates(n, w) {
            if let Some(d) = c.into_iter().next() {
                return Some((i, d));
            }
        }
    }
    None
}

/// A Ready node of a group, as a new instance registers.
fn fresh_node(g: &NodeGroup, name: String) -> Node {
    let mut n = planner::cluster::template_node(g, name.clone(), NodeState::Ready);
    n.provider_id = Some(name);
    n
}

/// Runs a future of the simulated cloud, which is always ready at once.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

#[derive(Debug, Clone)]
enum PodState {
    Waiting,
    Pending { since: u64 },
    Running { node: String, devices: DeviceAssignment, ends: u64, started: u64 },
    Done,
}

#[derive(Debug, Clone)]
struct SimNode {
    group: String,
    /// Clean copy (no allocations) for planner snapshots.
    clean: Node,
    /// With the running pods' allocations.
    live: Node,
    pods: BTreeSet<usize>,
    unneeded_since: Option<u64>,
}

struct Sim<'a> {
    jobs: &'a Jobs,
    cloud: SimulatedCloud,
    policy: Autoscaler,
    cfg: &'a AutoscaleConfig,
    now: u64,
    pods: Vec<PodState>,
    /// Time each pod has spent pending so far.
    waited: Vec<u64>,
    ran: Vec<bool>,
    nodes: BTreeMap<String, SimNode>,
    next_arrival: usize,
    backoff: BTreeMap<String, u64>,
    last_scale_up: Option<u64>,
    rng: ChaCha8Rng,
    out: PolicyRun,
    /// gpuscale: the decision step's memory.
    decide: decide::LoopState,
    /// gpuscale: the interruption step's memory.
    interruption: InterruptionState,
    /// gpuscale: noticed nodes, cordoned, whose pods keep running until this time.
    held: BTreeMap<String, u64>,
}

impl<'a> Sim<'a> {
    fn new(jobs: &'a Jobs, cloud: SimulatedCloud, policy: Autoscaler, cfg: &'a AutoscaleConfig) -> Self {
        let n = jobs.jobs.len();
        Self {
            jobs,
            cloud,
            policy,
            cfg,
            now: 0,
            pods: vec![PodState::Waiting; n],
            waited: vec![0; n],
            ran: vec![false; n],
            nodes: BTreeMap::new(),
            next_arrival: 0,
            backoff: BTreeMap::new(),
            last_scale_up: None,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5ca1e),
            out: PolicyRun {
                policy,
                cost: 0.0,
                gpu_hours: 0.0,
                mean_allocation: 0.0,
                pending_p50: 0.0,
                pending_p95: 0.0,
                pending_p99: 0.0,
                scale_actions: 0,
                disrupted: 0,
                ran: 0,
                never_ran: 0,
                launch_failures: 0,
                reclaimed: 0,
                notices_handled: 0,
                killed_without_notice: 0,
                work_lost_gpu_hours: 0.0,
                samples: Vec::new(),
                commands: Vec::new(),
            },
            decide: decide::LoopState::default(),
            interruption: InterruptionState::default(),
            held: BTreeMap::new(),
        }
    }

    fn run(mut self) -> PolicyRun {
        let interval = self.cfg.interval.max(1);
        let groups = self.cloud.snapshot();
        let gpus_of: BTreeMap<String, (usize, u64)> =
            groups.iter().map(|g| (g.id.clone(), (g.template.gpus.len(), g.price))).collect();
        // Instances of the static cluster exist from the start.
        self.sync_nodes();
        while self.now < self.jobs.length {
            self.finish_and_arrive();
            self.sync_nodes();
            match self.policy {
                Autoscaler::Gpuscale => self.gpuscale_loop(),
                Autoscaler::ClusterAutoscaler => self.ca_loop(),
                Autoscaler::Static => self.bind_pending(true),
            }
            // Bill live instances for this step.
            let dt = interval.min(self.jobs.length - self.now);
            let mut capacity = 0usize;
            for g in self.cloud.snapshot() {
                let live = g
                    .instances
                    .iter()
                    .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
                    .count();
                let (gpus, price) = gpus_of.get(&g.id).copied().unwrap_or((0, 0));
                capacity += live * gpus;
                self.out.cost += live as f64 * price as f64 / 1e6 * dt as f64 / 3600.0;
                self.out.gpu_hours += (live * gpus) as f64 * dt as f64 / 3600.0;
            }
            self.sample(capacity as f64);
            self.cloud.advance(Duration::from_secs(dt));
            for op in self.cloud.take_operations() {
                match op.op {
                    Operation::LaunchFailed { group, .. } => {
                        self.out.launch_failures += 1;
                        self.backoff.insert(group, self.now + dt + self.cfg.backoff);
                    }
                    Operation::SpotInterrupted { .. } => self.out.reclaimed += 1,
                    _ => {}
                }
            }
            self.now += dt;
        }
        self.finish_report();
        self.out
    }

    fn sample(&mut self, capacity: f64) {
        let (mut allocated, mut demanded, mut pending) = (0u64, 0u64, 0usize);
        for (i, p) in self.pods.iter().enumerate() {
            let m = demand_milli(&self.jobs.jobs[i].workload);
            match p {
                PodState::Running { .. } => {
                    allocated += m;
                    demanded += m;
                }
                PodState::Pending { .. } => {
                    demanded += m;
                    pending += 1;
                }
                _ => {}
            }
        }
        self.out.samples.push(Sample {
            time: self.now,
            capacity_gpus: capacity,
            allocated_gpus: allocated as f64 / 1000.0,
            demanded_gpus: demanded as f64 / 1000.0,
            pending,
        });
    }

    fn finish_report(&mut self) {
        let mut waits: Vec<u64> = Vec::new();
        for (i, p) in self.pods.iter().enumerate() {
            let mut w = self.waited[i];
            if let PodState::Pending { since } = p {
                w += self.jobs.length.saturating_sub(*since);
                if !self.ran[i] {
                    self.out.never_ran += 1;
                }
            }
            if !matches!(p, PodState::Waiting) {
                waits.push(w);
            }
        }
        self.out.ran = self.ran.iter().filter(|r| **r).count();
        waits.sort_unstable();
        let pct = |q: f64| -> f64 {
            if waits.is_empty() {
                return 0.0;
            }
            let idx = ((q * waits.len() as f64).ceil() as usize).clamp(1, waits.len()) - 1;
            waits[idx] as f64
        };
        self.out.pending_p50 = pct(0.50);
        self.out.pending_p95 = pct(0.95);
        self.out.pending_p99 = pct(0.99);
        let with_cap: Vec<&Sample> = self.out.samples.iter().filter(|s| s.capacity_gpus > 0.0).collect();
        if !with_cap.is_empty() {
            self.out.mean_allocation =
                with_cap.iter().map(|s| (s.allocated_gpus / s.capacity_gpus).min(1.0)).sum::<f64>()
                    / with_cap.len() as f64;
        }
    }

    /// Completes pods whose time is up and queues arrivals.
    fn finish_and_arrive(&mut self) {
        for i in 0..self.pods.len() {
            if let PodState::Running { node, devices, ends, .. } = &self.pods[i] {
                if *ends <= self.now {
                    if let Some(n) = self.nodes.get_mut(node) {
                        n.live.release(&self.jobs.jobs[i].workload.requests, devices);
                        n.pods.remove(&i);
                    }
                    self.pods[i] = PodState::Done;
                }
            }
        }
        while self.next_arrival < self.jobs.jobs.len()
            && self.jobs.jobs[self.next_arrival].arrival <= self.now
        {
            let j = &self.jobs.jobs[self.next_arrival];
            self.pods[self.next_arrival] = PodState::Pending { since: j.arrival };
            self.next_arrival += 1;
        }
    }

    /// Running instances become Ready nodes; nodes whose instance is gone lose their pods.
    fn sync_nodes(&mut self) {
        let groups = self.cloud.snapshot();
        let mut running: BTreeMap<String, usize> = BTreeMap::new();
        for (gi, g) in groups.iter().enumerate() {
            for i in &g.instances {
                if i.state == InstanceState::Running {
                    running.insert(i.id.clone(), gi);
                }
            }
        }
        let gone: Vec<String> = self.nodes.keys().filter(|k| !running.contains_key(*k)).cloned().collect();
        for name in gone {
            self.remove_node(&name);
        }
        for (id, gi) in running {
            if let std::collections::btree_map::Entry::Vacant(e) = self.nodes.entry(id) {
                let node = fresh_node(&groups[gi], e.key().clone());
                e.insert(SimNode {
                    group: groups[gi].id.clone(),
                    clean: node.clone(),
                    live: node,
                    pods: BTreeSet::new(),
                    unneeded_since: None,
                });
            }
        }
    }

    /// Drops a node whose instance is gone, re-queueing its pods (each counts as disrupted, and
    /// as killed: nothing drained them before the cloud took the node).
    fn remove_node(&mut self, name: &str) {
        if let Some(n) = self.nodes.remove(name) {
            for i in n.pods {
                self.out.killed_without_notice += 1;
                self.evict(i);
            }
        }
    }

    fn evict(&mut self, i: usize) {
        if let PodState::Running { node, devices, started, .. } = &self.pods[i] {
            if let Some(n) = self.nodes.get_mut(node) {
                n.live.release(&self.jobs.jobs[i].workload.requests, devices);
                n.pods.remove(&i);
            }
            let gpus = demand_milli(&self.jobs.jobs[i].workload) as f64 / f64::from(GPU_MILLI);
            self.out.work_lost_gpu_hours += gpus * self.now.saturating_sub(*started) as f64 / 3600.0;
            self.out.disrupted += 1;
            self.pods[i] = PodState::Pending { since: self.now };
        }
    }

    fn bind(&mut self, i: usize, node: &str, devices: DeviceAssignment) {
        let PodState::Pending { since } = self.pods[i] else { return };
        let Some(n) = self.nodes.get_mut(node) else { return };
        let w = &self.jobs.jobs[i].workload;
        n.live.allocate(&w.requests, &devices);
        n.pods.insert(i);
        n.unneeded_since = None;
        self.waited[i] += self.now.saturating_sub(since);
        self.ran[i] = true;
        self.pods[i] = PodState::Running {
            node: node.to_string(),
            devices,
            ends: self.now + self.jobs.jobs[i].duration,
            started: self.now,
        };
    }

    fn pending(&self) -> Vec<usize> {
        (0..self.pods.len()).filter(|&i| matches!(self.pods[i], PodState::Pending { .. })).collect()
    }

    /// Binds pending pods (oldest first) to Ready nodes, best-fit or first-fit.
    fn bind_pending(&mut self, best: bool) {
        for i in self.pending() {
            let w = &self.jobs.jobs[i].workload;
            let names: Vec<String> = self.nodes.keys().cloned().collect();
            let found = if best {
                best_fit(self.nodes.values().map(|n| &n.live), w)
            } else {
                first_fit(self.nodes.values().map(|n| &n.live), w)
            };
            if let Some((ni, devices)) = found {
                self.bind(i, &names[ni], devices);
            }
        }
    }

    fn set_target(&mut self, group: &str, to: u32) {
        if let Err(e) = ready(self.cloud.set_target_size(group, to)) {
            tracing::warn!(group, to, error = %e, "scale-up rejected by the simulated cloud");
        } else {
            self.out.scale_actions += 1;
            self.last_scale_up = Some(self.now);
        }
    }

    /// Drains a node (its pods re-queued, then re-bound where they fit) and deletes its instance.
    fn drain_and_delete(&mut self, name: &str, moves: &[(usize, String)]) {
        let Some(group) = self.nodes.get(name).map(|n| n.group.clone()) else { return };
        let pods: Vec<usize> = self.nodes[name].pods.iter().copied().collect();
        for i in pods {
            self.evict(i);
        }
        self.nodes.remove(name);
        for (i, to) in moves {
            let devices = self
                .nodes
                .get(to)
                .and_then(|n| fit::candidates(&n.live, &self.jobs.jobs[*i].workload).ok())
                .and_then(|c| c.into_iter().next());
            if let Some(d) = devices {
                self.bind(*i, to, d);
            }
        }
        match ready(self.cloud.delete_instances(&group, &[name.to_string()])) {
            Ok(()) => self.out.scale_actions += 1,
            Err(e) => tracing::warn!(node = name, error = %e, "instance deletion rejected"),
        }
    }

    fn unavailable(&self) -> BTreeMap<String, String> {
        self.backoff
            .iter()
            .filter(|(_, until)| **until > self.now)
            .map(|(g, until)| (g.clone(), format!("launch failed; backoff until t={until}s")))
            .collect()
    }

    // ---- gpuscale ----

    /// One pass of the controller's loop on the simulated cluster: plan, bind pending pods where
    /// the plan places them on Ready nodes (kube-scheduler's part), then carry out the commands of
    /// the decision step the controller runs (`planner::decide`), so the replay follows the
    /// controller's rules and timers. Drains finish at once here (no PDBs, no grace periods): the
    /// drained pods are re-queued and bound where the plan moves them.
    fn gpuscale_loop(&mut self) {
        if let Some(settings) = self.cfg.notices {
            self.react_to_notices(&settings);
        }
        let (snapshot, index) = self.gpuscale_snapshot();
        self.gpuscale_plan_and_act(snapshot, index);
    }

    /// The interruption step on the cloud's notices, carried out as the controller does: the
    /// replacement's group raised, the reclaimed pool backed off, the node cordoned and drained
    /// at once (drains finish within the pass here) and its instance deleted, so the group does
    /// not launch a new one into the pool that is being reclaimed.
    fn react_to_notices(&mut self, settings: &InterruptionSettings) {
        // Held nodes whose time has come are drained.
        let due: Vec<String> =
            self.held.iter().filter(|(_, t)| **t <= self.now).map(|(n, _)| n.clone()).collect();
        for node in due {
            self.held.remove(&node);
            self.drain_and_delete(&node, &[]);
        }
        self.held.retain(|n, _| self.nodes.contains_key(n));
        let notices = self.cloud.notices();
        if notices.is_empty() {
            return;
        }
        let (snapshot, _) = self.gpuscale_snapshot();
        let groups = self.cloud.snapshot();
        let observed = Observed { snapshot: &snapshot, groups: &groups, gangs_in_flight: &BTreeSet::new() };
        let (commands, next) = interruption::react(
            &notices,
            &self.interruption,
            observed,
            interruption::NodeReach { handled: &BTreeSet::new(), drainable: &|_, _| true },
            &self.unavailable(),
            self.now as i64,
            settings,
        );
        self.interruption = next;
        self.out.commands.extend(commands.iter().map(|c| (self.now, c.clone())));
        for command in commands {
            match command {
                Command::ScaleGroup { group, to, .. } => self.set_target(&group, to),
                Command::BackOffGroup { group, until, .. } => {
                    let until = until.max(0) as u64;
                    let entry = self.backoff.entry(group).or_insert(until);
                    *entry = (*entry).max(until);
                }
                Command::InterruptNode { node, deadline, .. } => {
                    self.out.notices_handled += 1;
                    if let Some(n) = self.nodes.get_mut(&node) {
                        n.clean.unschedulable = true;
                        n.live.unschedulable = true;
                    }
                    // The replay's pods have Kubernetes' default grace period; the pass that
                    // drains them comes up to an interval after the time.
                    let lead = self.cfg.interval.max(1) as i64;
                    let at =
                        interruption::evict_at(self.now as i64, deadline, DEFAULT_GRACE_SECONDS, settings)
                            - lead;
                    if at > self.now as i64 {
                        self.held.insert(node, at as u64);
                    } else {
                        self.drain_and_delete(&node, &[]);
                    }
                }
                _ => {}
            }
        }
    }

    /// The snapshot the controller would see: Ready nodes and the pending and running pods,
    /// with each workload's index in the jobs.
    fn gpuscale_snapshot(&self) -> (ClusterSnapshot, Vec<usize>) {
        let mut snapshot = ClusterSnapshot {
            nodes: self.nodes.values().map(|n| n.clean.clone()).collect(),
            ..Default::default()
        };
        let mut index: Vec<usize> = Vec::new();
        for (i, p) in self.pods.iter().enumerate() {
            let mut w = match p {
                PodState::Pending { .. } => self.jobs.jobs[i].workload.clone(),
                PodState::Running { node, devices, .. } => {
                    let mut w = self.jobs.jobs[i].workload.clone();
                    w.node_name = Some(node.clone());
                    w.devices = Some(devices.clone());
                    w
                }
                _ => continue,
            };
            w.created_at = Some(self.jobs.jobs[i].arrival as i64);
            snapshot.workloads.push(w);
            index.push(i);
        }
        (snapshot, index)
    }

    fn gpuscale_plan_and_act(&mut self, snapshot: ClusterSnapshot, index: Vec<usize>) {
        let by_id: BTreeMap<String, usize> =
            snapshot.workloads.iter().enumerate().map(|(k, w)| (w.id.clone(), index[k])).collect();
        let groups = self.cloud.snapshot();
        let input = PlanInput { snapshot, groups, unavailable: self.unavailable(), ..Default::default() };
        let settings = PlannerSettings {
            seed: self.cfg.seed,
            consolidation: self.cfg.consolidation,
            scale_down_utilization: self.cfg.scale_down_utilization,
            ..Default::default()
        };
        let plan = planner::plan(&input, &settings);
        let observed =
            Observed { snapshot: &input.snapshot, groups: &input.groups, gangs_in_flight: &BTreeSet::new() };
        let (commands, next) = decide(&plan, &self.decide, observed, self.now as i64, &self.cfg.decide);
        self.decide = next;
        self.out.commands.extend(commands.iter().map(|c| (self.now, c.clone())));
        // Preemptions first: their pods are bound where the victims were, below.
        for c in &commands {
            if let Command::Preempt { victims, .. } = c {
                for i in victims.iter().filter_map(|v| by_id.get(v)) {
                    self.evict(*i);
                }
            }
        }
        // Bind to Ready nodes, checking the live node still has room.
        for p in plan.placements.iter().filter(|p| !p.node_in_flight) {
            let Some(&i) = by_id.get(&p.pod) else { continue };
            let Some(n) = self.nodes.get(&p.node) else { continue };
            let Some(devices) = super::devices_to_bind(&n.live, &self.jobs.jobs[i].workload, &p.devices)
            else {
                continue;
            };
            let node = p.node.clone();
            self.bind(i, &node, devices);
        }
        for command in commands {
            match command {
                Command::ScaleGroup { group, to, .. } => self.set_target(&group, to),
                Command::RequestReplacement { node, group, target, .. } => {
                    if ready(self.cloud.set_target_size(&group, target)).is_ok() {
                        self.out.scale_actions += 1;
                    } else {
                        self.decide.replacing.remove(&node);
                    }
                }
                Command::ReraiseReplacement { group, target, .. } => {
                    let _ = ready(self.cloud.set_target_size(&group, target));
                }
                Command::GiveUpReplacement { .. } => {}
                Command::DrainNode { node, .. } => {
                    let moves: Vec<(usize, String)> = match plan.scale_downs.iter().find(|s| s.node == node) {
                        Some(sd) => sd
                            .moves
                            .iter()
                            .filter_map(|(pod, to)| by_id.get(pod).map(|&i| (i, to.clone())))
                            .collect(),
                        None => {
                            let to = self.decide.replacing.get(&node).and_then(|r| {
                                let gi = input.groups.iter().position(|g| g.id == r.group)?;
                                replacement_node(&node, gi, &input.snapshot, &input.groups, &BTreeSet::new())
                            });
                            let pods = self.nodes.get(&node).map(|n| n.pods.clone()).unwrap_or_default();
                            to.map(|to| pods.into_iter().map(|i| (i, to.clone())).collect())
                                .unwrap_or_default()
                        }
                    };
                    self.drain_and_delete(&node, &moves);
                    self.decide.draining.remove(&node);
                    self.decide.replacing.remove(&node);
                    self.decide.unneeded_since.remove(&node);
                }
                // Drains finish within the pass that starts them; preemptions were carried out
                // before binding; notices are the interruption step's.
                Command::AdvanceDrain { .. }
                | Command::Preempt { .. }
                | Command::InterruptNode { .. }
                | Command::BackOffGroup { .. } => {}
            }
        }
        // Pods still pending that fit Ready nodes (evicted ones whose move target filled).
        self.bind_pending(true);
    }

    // ---- Cluster-Autoscaler-like baseline ----

    fn ca_loop(&mut self) {
        // kube-scheduler binds first (first-fit over nodes in random order each loop).
        self.bind_pending_random();
        self.ca_scale_up();
        self.ca_scale_down();
    }

    fn bind_pending_random(&mut self) {
        let mut names: Vec<String> = self.nodes.keys().cloned().collect();
        for i in self.pending() {
            // Shuffle (Fisher-Yates) per pod: kube-scheduler's spreading is not bin-packing.
            for k in (1..names.len()).rev() {
                let j = self.rng.random_range(0..=k);
                names.swap(k, j);
            }
            let w = &self.jobs.jobs[i].workload;
            let found = first_fit(names.iter().map(|n| &self.nodes[n].live), w);
            if let Some((ni, devices)) = found {
                let name = names[ni].clone();
                self.bind(i, &name, devices);
            }
        }
    }

    fn ca_scale_up(&mut self) {
        let pending = self.pending();
        if pending.is_empty() {
            return;
        }
        let groups = self.cloud.snapshot();
        // Upcoming nodes (target above registered and failed) absorb pods first.
        let mut upcoming: Vec<Node> = Vec::new();
        for g in &groups {
            let registered = self.nodes.values().filter(|n| n.group == g.id).count() as u32;
            let failed =
                g.instances.iter().filter(|i| matches!(i.state, InstanceState::Failed { .. })).count() as u32;
            for k in 0..g.target_size.saturating_sub(registered + failed) {
                upcoming.push(fresh_node(g, format!("{}-upcoming-{k}", g.id)));
            }
        }
        let mut rest: Vec<Workload> = Vec::new();
        for i in pending {
            let w = whole_gpu_view(&self.jobs.jobs[i].workload);
            match first_fit(upcoming.iter(), &w) {
                Some((ni, d)) => upcoming[ni].allocate(&w.requests, &d),
                None => rest.push(w),
            }
        }
        if rest.is_empty() {
            return;
        }
        let unavailable = self.unavailable();
        // Expansion options: binpacking estimate per group.
        let mut options: Vec<(f64, usize, u32)> = Vec::new();
        for (gi, g) in groups.iter().enumerate() {
            if unavailable.contains_key(&g.id) || g.max_size.saturating_sub(g.target_size) == 0 {
                continue;
            }
            let mut new_nodes: Vec<Node> = Vec::new();
            let mut helped = 0usize;
            for w in &rest {
                if let Some((ni, d)) = first_fit(new_nodes.iter(), w) {
                    new_nodes[ni].allocate(&w.requests, &d);
                    helped += 1;
                    continue;
                }
                if new_nodes.len() as u32 >= g.max_size.saturating_sub(g.target_size) {
                    continue;
                }
                let mut n = fresh_node(g, format!("est-{}", new_nodes.len()));
                if let Some(d) = fit::candidates(&n, w).ok().and_then(|c| c.into_iter().next()) {
                    n.allocate(&w.requests, &d);
                    new_nodes.push(n);
                    helped += 1;
                }
            }
            if helped == 0 {
                continue;
            }
            // Least waste: unused CPU and memory share of the new nodes; GPUs are ignored.
            let (mut cpu_a, mut cpu_u, mut mem_a, mut mem_u) = (0f64, 0f64, 0f64, 0f64);
            for n in &new_nodes {
                cpu_a += n.allocatable.cpu_milli as f64;
                cpu_u += n.allocated.cpu_milli as f64;
                mem_a += n.allocatable.memory_bytes as f64;
                mem_u += n.allocated.memory_bytes as f64;
            }
            let waste = (cpu_a - cpu_u) / cpu_a.max(1.0) + (mem_a - mem_u) / mem_a.max(1.0);
            options.push((waste, gi, new_nodes.len() as u32));
        }
        let Some(best) = options.iter().map(|o| o.0).reduce(f64::min) else { return };
        let ties: Vec<&(f64, usize, u32)> = options.iter().filter(|o| (o.0 - best).abs() < 1e-9).collect();
        let pick = ties[self.rng.random_range(0..ties.len())];
        let g = &groups[pick.1];
        let to = g.target_size + pick.2;
        let id = g.id.clone();
        self.set_target(&id, to);
    }

    fn ca_scale_down(&mut self) {
        let now = self.now;
        if self.last_scale_up.is_some_and(|t| now < t + self.cfg.scale_down_delay_after_add) {
            for n in self.nodes.values_mut() {
                n.unneeded_since = None;
            }
            return;
        }
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        let mut due: Vec<(String, Vec<(usize, String)>)> = Vec::new();
        for name in &names {
            let n = &self.nodes[name];
            let util = (n.live.allocated.cpu_milli as f64 / n.live.allocatable.cpu_milli.max(1) as f64)
                .max(n.live.allocated.memory_bytes as f64 / n.live.allocatable.memory_bytes.max(1) as f64);
            let moves = if util < 0.5 { self.ca_moves(name) } else { None };
            let n = self.nodes.get_mut(name).expect("node exists");
            match moves {
                Some(m) => {
                    let since = *n.unneeded_since.get_or_insert(now);
                    if (now - since) as f64 >= self.cfg.decide.unneeded_seconds {
                        due.push((name.clone(), m));
                    }
                }
                None => n.unneeded_since = None,
            }
        }
        let mut non_empty_done = false;
        for (name, moves) in due {
            if !moves.is_empty() {
                if non_empty_done {
                    continue;
                }
                // Destinations may have filled since the check.
                let Some(fresh) = self.ca_moves(&name) else { continue };
                non_empty_done = true;
                self.drain_and_delete(&name, &fresh);
            } else if self.nodes.get(&name).is_some_and(|n| n.pods.is_empty()) {
                self.drain_and_delete(&name, &[]);
            }
        }
    }

    /// Where each pod of a node would go on the other Ready nodes (first-fit), if all fit.
    fn ca_moves(&self, name: &str) -> Option<Vec<(usize, String)>> {
        let node = &self.nodes[name];
        if node.pods.is_empty() {
            return Some(Vec::new());
        }
        let others: Vec<&String> = self.nodes.keys().filter(|k| k.as_str() != name).collect();
        let mut sims: Vec<Node> = others.iter().map(|k| self.nodes[*k].live.clone()).collect();
        let mut moves = Vec::new();
        for &i in &node.pods {
            let w = &self.jobs.jobs[i].workload;
            // Like CA: bare pods, DaemonSet/static pods and blocked evictions keep the node.
            if matches!(w.owner, OwnerKind::None | OwnerKind::DaemonSet | OwnerKind::Node)
                || w.eviction_blocked.is_some()
            {
                return None;
            }
            let (ni, d) = first_fit(sims.iter(), w)?;
            sims[ni].allocate(&w.requests, &d);
            moves.push((i, others[ni].clone()));
        }
        Some(moves)
    }
}

/// Cluster Autoscaler's view of a GPU request: whole GPUs only (a share of a GPU is one GPU).
fn whole_gpu_view(w: &Workload) -> Workload {
    let mut w = w.clone();
    if let GpuDemand::Fraction { count, .. } = w.gpu {
        w.gpu = GpuDemand::Whole { count };
    }
    w
}
