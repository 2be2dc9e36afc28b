//! Multi-tenant replay of a trace on a fixed cluster: tenants with weights and quotas share the
//! trace's nodes; pods arrive at their creation time, run for their trace duration, and wait in a
//! queue when they cannot start. The same arrivals are replayed twice, once with quota, fair
//! share and preemption of borrowers and lower priorities ([`crate::tenancy`]) and once in plain
//! FIFO without quotas, to compare fairness (Jain's index of GPU share over entitlement) and
//! waiting times.

use crate::model::{ClusterSnapshot, Node, Workload, GPU_MILLI};
use crate::planner::decide::{decide, Command, DecideSettings, LoopState, Observed};
use crate::planner::{self, PlanInput, PlannerSettings};
use crate::scheduler::policy::{ClusterScale, PolicyKind, TargetWorkload};
use crate::scheduler::{Placement, Placer};
use crate::tenancy::config::{CohortConfig, QuotaConfig, TenantConfig};
use crate::tenancy::fair_share;
use crate::tenancy::quota::{usage_of, Ledger, Tenants, Usage};
use crate::tenancy::{jain_index, ResourceKind, TenancyConfig};
use crate::trace::openb::TracePod;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};

/// Parameters of a multi-tenant replay.
#[derive(Debug, Clone)]
pub struct TenantSimConfig {
    /// Seed of the tenant assignment, node subset and tie-breaks.
    pub seed: u64,
    /// Arrival times are divided by this (durations kept), to raise contention.
    pub arrival_speedup: f64,
    /// Use a seeded subset of the nodes with about this many GPUs (`None`: all).
    pub cluster_gpus: Option<u64>,
    /// Placement policy.
    pub policy: PolicyKind,
}

impl Default for TenantSimConfig {
    fn default() -> Self {
        Self { seed: 42, arrival_speedup: 1.0, cluster_gpus: None, policy: PolicyKind::BestFit }
    }
}

/// One tenant's outcome under one scheduling mode.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantOutcome {
    /// Tenant name.
    pub tenant: String,
    /// Fair-share weight.
    pub weight: f64,
    /// Entitled share of the cluster's GPUs (nominal quota over total).
    pub entitlement: f64,
    /// Share of all GPU time used, over the whole replay.
    pub gpu_share: f64,
    /// Share of GPU time used while some pod waited (the contended periods fairness is about).
    pub contended_share: f64,
    /// Share the tenant would get in those periods under weighted max-min fairness given what
    /// every tenant asked for (its entitlement, capped by its demand).
    pub fair_share: f64,
    /// GPU-hours used.
    pub gpu_hours: f64,
    /// Pods of the tenant.
    pub pods: usize,
    /// Pods that never started before the replay ended.
    pub never_started: usize,
    /// Median wait in seconds (never-started pods count their wait until the end).
    pub p50_wait_s: f64,
    /// 95th-percentile wait in seconds.
    pub p95_wait_s: f64,
    /// Times a pod of the tenant was evicted.
    pub preempted: usize,
}

/// Outcome of one scheduling mode.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeOutcome {
    /// `tenancy` or `fifo`.
    pub mode: String,
    /// Jain's index, across tenants, of GPU time received over weighted max-min fair GPU time
    /// (entitlement capped by demand) while pods waited: 1 = everyone got their fair share.
    pub jain_index: f64,
    /// Jain's index of contended GPU share over static entitlement (ignores demand).
    pub jain_vs_entitlement: f64,
    /// Median wait, all pods, seconds.
    pub p50_wait_s: f64,
    /// 95th-percentile wait, all pods, seconds.
    pub p95_wait_s: f64,
    /// Evictions.
    pub preemptions: usize,
    /// Pods that never started.
    pub never_started: usize,
    /// Scheduling passes after which some tenant exceeded nominal + allowed borrowing (always 0
    /// with tenancy; FIFO ignores quotas).
    pub quota_violations: usize,
    /// Average GPU allocation, % of the cluster's GPUs.
    pub gpu_utilization_pct: f64,
    /// Per tenant.
    pub tenants: Vec<TenantOutcome>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantSimResult {
    /// Seed.
    pub seed: u64,
    /// Nodes used.
    pub nodes: usize,
    /// GPUs of those nodes.
    pub gpus: u64,
    /// Pods replayed.
    pub pods: usize,
    /// Seconds from the first arrival to the end of the replay.
    pub horizon_s: u64,
    /// With quotas, fair share and preemption.
    pub tenancy: ModeOutcome,
    /// Plain FIFO without quotas.
    pub fifo: ModeOutcome,
}

/// FNV-1a over the seed and a name: a stable hash (std's hasher may change between releases).
pub fn stable_hash(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.to_le_bytes().iter().chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `n` tenants `tenant-0..n` in one cohort, weights 1, 2, 3, 1, 2, 3, ..., nominal
/// `gpu-equivalent` quotas proportional to weight and summing to the cluster's GPUs, borrowing
/// unlimited (reclaimable), aging one priority point per minute.
pub fn derive_tenants(n: usize, cluster_gpus: u64) -> TenancyConfig {
    let weights: Vec<f64> = (0..n).map(|i| 1.0 + (i % 3) as f64).collect();
    let total: f64 = weights.iter().sum();
    let tenants = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| TenantConfig {
            name: format!("tenant-{i}"),
            cohort: Some("cluster".into()),
            matcher: Default::default(),
            weight: w,
            quotas: [(
                "gpu-equivalent".to_string(),
                QuotaConfig {
                    nominal: (cluster_gpus as f64 * w / total * 1000.0).floor() / 1000.0,
                    borrowing_limit: None,
                    lending_limit: None,
                },
            )]
            .into(),
            budget_per_hour: None,
            workload_classes: BTreeMap::new(),
        })
        .collect();
    let mut config = TenancyConfig {
        cohorts: vec![CohortConfig { name: "cluster".into() }],
        tenants,
        ..Default::default()
    };
    config.starvation.aging_seconds_per_priority_point = 60.0;
    config
}

/// Tenant of each pod: a seeded hash of its name over the tenants.
pub fn assign(pods: &[TracePod], tenants: usize, seed: u64) -> Vec<usize> {
    pods.iter().map(|p| (stable_hash(seed, &p.workload.id) % tenants.max(1) as u64) as usize).collect()
}

/// A seeded subset of nodes with at least `gpus` GPUs (all nodes when `None`).
pub fn subset(nodes: &[Node], gpus: Option<u64>, seed: u64) -> Vec<Node> {
    let Some(target) = gpus else { return nodes.to_vec() };
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let mut out = Vec::new();
    let mut have = 0u64;
    for i in order {
        if have >= target {
            break;
        }
        have += nodes[i].gpus.len() as u64;
        out.push(nodes[i].clone());
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Departure of a run (pod, run number) sorts before arrivals at the same time.
    Depart(usize, u32),
    Arrive(usize),
}

struct Pod<'a> {
    w: &'a Workload,
    tenant: usize,
    arrival: u64,
    duration: u64,
    demand: Usage,
    gpu_milli: u64,
}

#[derive(Default, Clone)]
struct PodState {
    started: Option<u64>,
    run: u32,
    placement: Option<Placement>,
}

/// The replayed cluster: where each pod runs, what waits, and the tallies the outcome reports.
struct Live<'a, 'p> {
    pods: &'a [Pod<'a>],
    placer: Placer<'p>,
    /// Quota use of running pods, to count passes that break a quota (FIFO does; tenancy must not).
    ledger: Ledger,
    state: Vec<PodState>,
    events: BinaryHeap<Reverse<(u64, Event)>>,
    pending: Vec<usize>,
    running: Vec<usize>,
    /// GPU milli running, per tenant.
    used: Vec<u64>,
    /// GPU milli pending, per tenant.
    waiting: Vec<u64>,
    preempted: Vec<usize>,
    preemptions: usize,
}

impl Live<'_, '_> {
    /// Records that pod `i` runs from `t` where `placement` (committed in the placer) puts it.
    fn start(&mut self, i: usize, placement: Placement, t: u64) {
        let p = &self.pods[i];
        let s = &mut self.state[i];
        s.started.get_or_insert(t);
        s.run += 1;
        s.placement = Some(placement);
        self.used[p.tenant] += p.gpu_milli;
        self.waiting[p.tenant] -= p.gpu_milli;
        self.ledger.charge(p.tenant, &p.demand);
        self.running.push(i);
        self.pending.retain(|&x| x != i);
        self.events.push(Reverse((t + p.duration.max(1), Event::Depart(i, s.run))));
    }

    /// Takes a running pod off its node; `requeue`: it waits to run again (evicted), else it is
    /// done (departed).
    fn stop(&mut self, i: usize, requeue: bool) {
        let Some(pl) = self.state[i].placement.take() else { return };
        let p = &self.pods[i];
        self.placer.release(p.w, &pl);
        self.used[p.tenant] -= p.gpu_milli;
        self.ledger.release(p.tenant, &p.demand);
        self.running.retain(|&r| r != i);
        if requeue {
            self.pending.push(i);
            self.waiting[p.tenant] += p.gpu_milli;
            self.preempted[p.tenant] += 1;
            self.preemptions += 1;
        }
    }

    /// Plain FIFO, as kube-scheduler without quotas: every candidate in arrival order, where the
    /// policy puts it.
    fn fifo_pass(&mut self, candidates: &[usize], t: u64) {
        let mut order = candidates.to_vec();
        order.sort_by_key(|&i| (self.pods[i].arrival, i));
        // Pods of one shape behave alike within a pass: once one fails, skip the rest.
        let mut failed: HashSet<(u64, u64, crate::model::GpuDemand, Vec<String>)> = HashSet::new();
        for i in order {
            let w = self.pods[i].w;
            let key = (w.requests.cpu_milli, w.requests.memory_bytes, w.gpu.clone(), w.gpu_models.clone());
            if failed.contains(&key) {
                continue;
            }
            match self.placer.place(w) {
                Ok(pl) => self.start(i, pl, t),
                Err(_) => {
                    failed.insert(key);
                }
            }
        }
    }

    /// One pass of the product: the planner with the tenancy config (quota admission, fair-share
    /// order, preemption) over the cluster as it is, then the decision step the controller runs
    /// ([`decide`]); its `Preempt` commands evict here, and the pods the plan places on nodes are
    /// bound (kube-scheduler's part, after Kueue's admission).
    fn planned_pass(&mut self, t: u64, run: &PlannedRun<'_>, loop_state: &mut LoopState) {
        let nodes = self.placer.nodes();
        let mut snapshot = ClusterSnapshot {
            nodes: run.nodes.to_vec(),
            workloads: Vec::with_capacity(self.running.len() + self.pending.len()),
            ..Default::default()
        };
        let mut index = Vec::with_capacity(snapshot.workloads.capacity());
        for &i in self.running.iter().chain(&self.pending) {
            let p = &self.pods[i];
            let mut w = super::owned_by_a_job(p.w.clone());
            w.tenant = Some(run.tenant_names[p.tenant].clone());
            w.created_at = Some(p.arrival as i64);
            if let Some(pl) = &self.state[i].placement {
                w.node_name = Some(nodes[pl.node].name.clone());
                w.devices = Some(pl.devices.clone());
            }
            snapshot.workloads.push(w);
            index.push(i);
        }
        let input =
            PlanInput { snapshot, groups: Vec::new(), unavailable: BTreeMap::new(), ..Default::default() };
        let settings = PlannerSettings { now: Some(t as i64), ..run.settings.clone() };
        let plan = planner::plan(&input, &settings);
        let observed = Observed { snapshot: &input.snapshot, groups: &[], gangs_in_flight: &BTreeSet::new() };
        let (commands, next) = decide(&plan, loop_state, observed, t as i64, &DecideSettings::default());
        *loop_state = next;
        let by_id: HashMap<&str, usize> =
            input.snapshot.workloads.iter().zip(&index).map(|(w, &i)| (w.id.as_str(), i)).collect();
        for c in &commands {
            if let Command::Preempt { victims, .. } = c {
                for &i in victims.iter().filter_map(|v| by_id.get(v.as_str())) {
                    self.stop(i, true);
                }
            }
        }
        for p in plan.placements.iter().filter(|p| !p.node_in_flight) {
            let (Some(&i), Some(&n)) = (by_id.get(p.pod.as_str()), run.node_index.get(p.node.as_str()))
            else {
                continue;
            };
            if self.state[i].placement.is_some() {
                continue;
            }
            let w = self.pods[i].w;
            let Some(devices) = super::devices_to_bind(&self.placer.nodes()[n], w, &p.devices) else {
                continue;
            };
            let placement = Placement { node: n, devices };
            self.placer.commit(w, &placement);
            self.start(i, placement, t);
        }
    }
}

/// What every planned pass shares.
struct PlannedRun<'a> {
    nodes: &'a [Node],
    node_index: HashMap<&'a str, usize>,
    tenant_names: Vec<String>,
    settings: PlannerSettings,
}

/// Replays the pods under one mode (`tenancy`: the product's planner and decision step with the
/// tenancy config; otherwise FIFO).
fn replay(
    nodes: &[Node],
    pods: &[Pod<'_>],
    tenants: &Tenants,
    cfg: &TenantSimConfig,
    tenancy: bool,
    end: u64,
) -> ModeOutcome {
    let workloads: Vec<Workload> = pods.iter().map(|p| p.w.clone()).collect();
    let target = TargetWorkload::from_workloads(&workloads, 0.95);
    let policy = cfg.policy.build(&ClusterScale::of(nodes), &target);
    let n_t = tenants.tenants.len();
    let cluster_milli: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * u64::from(GPU_MILLI)).sum();
    let mut live = Live {
        pods,
        placer: Placer::new(nodes.to_vec(), policy.as_ref(), cfg.seed),
        ledger: Ledger::new(tenants),
        state: vec![PodState::default(); pods.len()],
        events: pods.iter().enumerate().map(|(i, p)| Reverse((p.arrival, Event::Arrive(i)))).collect(),
        pending: Vec::new(),
        running: Vec::new(),
        used: vec![0; n_t],
        waiting: vec![0; n_t],
        preempted: vec![0; n_t],
        preemptions: 0,
    };
    let run = PlannedRun {
        nodes,
        node_index: nodes.iter().enumerate().map(|(k, n)| (n.name.as_str(), k)).collect(),
        tenant_names: tenants.tenants.iter().map(|t| t.name.clone()).collect(),
        settings: PlannerSettings {
            policy: cfg.policy,
            seed: cfg.seed,
            scale_down: false,
            tenancy: Some(tenants.config.clone()),
            ..Default::default()
        },
    };
    let mut loop_state = LoopState::default();
    let mut clock = ShareClock::new(cluster_milli, tenants.tenants.iter().map(|t| t.weight).collect());
    let mut dirty = true; // capacity or quota freed since the last pass
    let mut quota_violations = 0usize;
    let mut last = pods.iter().map(|p| p.arrival).min().unwrap_or(0);
    let start = last;

    while let Some(Reverse((t, _))) = live.events.peek().copied() {
        if t > end {
            break;
        }
        clock.advance((t - last) as f64, !live.pending.is_empty(), &live.used, &live.waiting);
        last = t;
        let mut arrived: Vec<usize> = Vec::new();
        while let Some(Reverse((te, ev))) = live.events.peek().copied() {
            if te != t {
                break;
            }
            live.events.pop();
            match ev {
                Event::Arrive(i) => {
                    live.pending.push(i);
                    arrived.push(i);
                    live.waiting[pods[i].tenant] += pods[i].gpu_milli;
                }
                Event::Depart(i, run) => {
                    if live.state[i].run == run {
                        live.stop(i, false); // a run evicted since is not running any more
                        dirty = true;
                    }
                }
            }
        }
        // A pass when room was freed or pods arrived; nothing changes for the waiting pods else.
        if tenancy {
            if dirty || !arrived.is_empty() {
                live.planned_pass(t, &run, &mut loop_state);
            }
        } else {
            // FIFO: everything pending when room was freed, else only the new arrivals.
            let candidates = if dirty { live.pending.clone() } else { arrived };
            live.fifo_pass(&candidates, t);
        }
        dirty = false;
        if live.ledger.violation(tenants).is_some() {
            quota_violations += 1;
        }
    }
    let Live { state, used, waiting, pending, preempted, preemptions, .. } = live;
    let horizon = (end.max(last) - start) as f64;
    // Pods still running at the end keep counting until the end.
    clock.advance(end.saturating_sub(last) as f64, !pending.is_empty(), &used, &waiting);
    let ShareClock { gpu_ms, contended_ms, fair_ms, .. } = clock;

    let wait = |i: usize| state[i].started.unwrap_or(end).saturating_sub(pods[i].arrival) as f64;
    let total_gpu: f64 = gpu_ms.iter().sum::<f64>().max(1e-9);
    let total_contended: f64 = contended_ms.iter().sum::<f64>();
    let total_fair: f64 = fair_ms.iter().sum::<f64>();
    let nominal_total: f64 = tenants.tenants.iter().map(nominal_gpus).sum::<f64>().max(1e-9);
    let mut outcomes = Vec::new();
    for (k, t) in tenants.tenants.iter().enumerate() {
        let mine: Vec<usize> = (0..pods.len()).filter(|&i| pods[i].tenant == k).collect();
        let mut waits: Vec<f64> = mine.iter().map(|&i| wait(i)).collect();
        outcomes.push(TenantOutcome {
            tenant: t.name.clone(),
            weight: t.weight,
            entitlement: nominal_gpus(t) / nominal_total,
            gpu_share: gpu_ms[k] / total_gpu,
            contended_share: if total_contended > 0.0 {
                contended_ms[k] / total_contended
            } else {
                gpu_ms[k] / total_gpu
            },
            fair_share: if total_fair > 0.0 { fair_ms[k] / total_fair } else { 0.0 },
            gpu_hours: gpu_ms[k] / 1000.0 / 3600.0,
            pods: mine.len(),
            never_started: mine.iter().filter(|&&i| state[i].started.is_none()).count(),
            p50_wait_s: percentile(&mut waits, 0.50),
            p95_wait_s: percentile(&mut waits, 0.95),
            preempted: preempted[k],
        });
    }
    let vs_entitlement: Vec<f64> =
        outcomes.iter().filter(|o| o.entitlement > 0.0).map(|o| o.contended_share / o.entitlement).collect();
    let vs_fair: Vec<f64> =
        (0..n_t).filter(|&k| fair_ms[k] > 0.0).map(|k| contended_ms[k] / fair_ms[k]).collect();
    let mut all: Vec<f64> = (0..pods.len()).map(wait).collect();
    ModeOutcome {
        mode: if tenancy { "tenancy" } else { "fifo" }.into(),
        jain_index: jain_index(&vs_fair),
        jain_vs_entitlement: jain_index(&vs_entitlement),
        p50_wait_s: percentile(&mut all, 0.50),
        p95_wait_s: percentile(&mut all, 0.95),
        preemptions,
        never_started: state.iter().filter(|s| s.started.is_none()).count(),
        quota_violations,
        gpu_utilization_pct: if horizon > 0.0 && cluster_milli > 0 {
            100.0 * total_gpu / (cluster_milli as f64 * horizon)
        } else {
            0.0
        },
        tenants: outcomes,
    }
}

/// Per-tenant GPU time (milli-GPU-seconds): all of it, the part while pods waited, and the
/// weighted max-min fair share of the cluster over that contended time.
struct ShareClock {
    cluster_milli: u64,
    weights: Vec<f64>,
    gpu_ms: Vec<f64>,
    contended_ms: Vec<f64>,
    fair_ms: Vec<f64>,
}

impl ShareClock {
    fn new(cluster_milli: u64, weights: Vec<f64>) -> Self {
        let n = weights.len();
        Self {
            cluster_milli,
            weights,
            gpu_ms: vec![0.0; n],
            contended_ms: vec![0.0; n],
            fair_ms: vec![0.0; n],
        }
    }

    /// Counts `dt` seconds at the tenants' `used` and `waiting` GPU milli.
    fn advance(&mut self, dt: f64, contended: bool, used: &[u64], waiting: &[u64]) {
        if dt <= 0.0 {
            return;
        }
        for (total, &u) in self.gpu_ms.iter_mut().zip(used) {
            *total += u as f64 * dt;
        }
        if !contended {
            return;
        }
        let demand: Vec<f64> = used.iter().zip(waiting).map(|(u, w)| (u + w) as f64).collect();
        let fair = fair_share::max_min_fair(self.cluster_milli as f64, &demand, &self.weights);
        for (k, &u) in used.iter().enumerate() {
            self.contended_ms[k] += u as f64 * dt;
            self.fair_ms[k] += fair[k] * dt;
        }
    }
}

fn nominal_gpus(t: &crate::tenancy::Tenant) -> f64 {
    // Internal units are milli-GPUs for all three kinds.
    let q = |k: &ResourceKind| t.quotas.get(k).map_or(0.0, |q| q.nominal as f64 / 1000.0);
    let eq = q(&ResourceKind::GpuEquivalent);
    if eq > 0.0 {
        eq
    } else {
        q(&ResourceKind::WholeGpu) + q(&ResourceKind::GpuMilli)
    }
}

/// Nearest-rank percentile (sorts in place); 0 for no values.
pub fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Runs both modes on the same arrivals. `assignment[i]` is the tenant index of `trace[i]`.
pub fn run(
    nodes: &[Node],
    trace: &[TracePod],
    config: &TenancyConfig,
    assignment: &[usize],
    cfg: &TenantSimConfig,
) -> TenantSimResult {
    let tenants = Tenants::new(config);
    let speed = if cfg.arrival_speedup > 0.0 { cfg.arrival_speedup } else { 1.0 };
    let arrivals: Vec<u64> =
        trace.iter().map(|p| (p.creation_time.unwrap_or(0) as f64 / speed) as u64).collect();
    let trace_end = trace.iter().filter_map(|p| p.deletion_time.or(p.creation_time)).max().unwrap_or(0);
    let pods: Vec<Pod<'_>> = trace
        .iter()
        .zip(assignment)
        .zip(&arrivals)
        .map(|((p, &tenant), &arrival)| {
            let created = p.creation_time.unwrap_or(0);
            let duration = p.deletion_time.unwrap_or(trace_end).saturating_sub(created);
            let demand = usage_of(&p.workload, None);
            let gpu_milli = demand.get(&ResourceKind::GpuEquivalent).copied().unwrap_or(0);
            Pod { w: &p.workload, tenant, arrival, duration, demand, gpu_milli }
        })
        .collect();
    // The replay ends when the last pod would have finished with no waiting at all.
    let end = pods.iter().map(|p| p.arrival + p.duration).max().unwrap_or(0);
    let gpus: u64 = nodes.iter().map(|n| n.gpus.len() as u64).sum();
    tracing::info!(
        nodes = nodes.len(),
        gpus,
        pods = pods.len(),
        tenants = tenants.tenants.len(),
        "multi-tenant replay"
    );
    let tenancy = replay(nodes, &pods, &tenants, cfg, true, end);
    let fifo = replay(nodes, &pods, &tenants, cfg, false, end);
    let start = pods.iter().map(|p| p.arrival).min().unwrap_or(0);
    TenantSimResult {
        seed: cfg.seed,
        nodes: nodes.len(),
        gpus,
        pods: pods.len(),
        horizon_s: end - start,
        tenancy,
        fifo,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_tenants_sum_to_the_cluster_and_hashing_is_stable() {
        let c = derive_tenants(3, 60);
        let nominal: f64 = c.tenants.iter().map(|t| t.quotas["gpu-equivalent"].nominal).sum();
        assert!((nominal - 60.0).abs() < 0.01, "{nominal}");
        assert_eq!(c.tenants[2].weight, 3.0);
        assert_eq!(c.tenants[2].quotas["gpu-equivalent"].nominal, 30.0);
        c.validate(std::path::Path::new("derived")).unwrap();
        assert_eq!(stable_hash(42, "openb/openb-pod-0001"), stable_hash(42, "openb/openb-pod-0001"));
        assert_ne!(stable_hash(42, "a"), stable_hash(43, "a"));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), 10.0);
        assert_eq!(percentile(&mut v, 0.95), 19.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }
}
