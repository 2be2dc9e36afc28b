//! Preemption plans: for a pending workload that does not fit (quota or capacity), the cheapest
//! set of running workloads to evict, and whether evicting beats scaling up.
//!
//! Who may be evicted (Kueue's `withinClusterQueue: LowerPriority` and `reclaimWithinCohort`):
//! lower-priority workloads of the claimant's own tenant, and workloads of cohort tenants that
//! borrow beyond their nominal quota while the claimant stays within its own. Never a tenant
//! within its nominal quota for someone else, never a pod of no configured tenant (unmanaged),
//! never an eviction-blocked pod or one without a controller (nothing would recreate it).
//!
//! PodDisruptionBudgets: no victim set evicts more pods of a budget than it allows now, counting
//! the set's other victims and the sets planned before it. kube-scheduler only *prefers* sets
//! that violate no budget because it deletes victims; gpuscale evicts through the Eviction API,
//! which refuses a violating eviction, so such a set could never make room.
//!
//! Cost of a victim: the GPU-seconds of work it loses (run time so far plus a restart), divided
//! by `1 + gap/100` where `gap` is how many priority points below the claimant it is. The
//! eviction's dollar value (`gpuHourValue` per GPU-hour) is compared with paying for the
//! scale-up alternative over `scaleUpHorizonHours`.

use super::config::PreemptionConfig;
use super::quota::{Admission, Ledger, Tenants, Usage};
use crate::model::{dollars, DeviceAssignment, MicroDollarsPerHour, Node, Workload};
use crate::scheduler::fit;

/// GPU-seconds a restart costs a victim per GPU it holds (image pull, warm-up, checkpoint load).
pub const RESTART_GPU_SECONDS: f64 = 300.0;

/// A running workload that might be evicted.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningPod {
    /// Caller's index (snapshot index in the planner).
    pub workload: usize,
    /// `namespace/name`.
    pub id: String,
    /// Its tenant.
    pub tenant: Option<usize>,
    /// Its priority.
    pub priority: i32,
    /// Node index it runs on.
    pub node: usize,
    /// What it holds on its node besides devices (CPU, memory, its pod slot, extended resources,
    /// host ports, its place in others' pod affinity): [`Workload::footprint`].
    pub footprint: Workload,
    /// Devices it holds.
    pub devices: DeviceAssignment,
    /// Its quota usage.
    pub usage: Usage,
    /// GPU-seconds lost if evicted now (GPU-equivalents x seconds run).
    pub lost_gpu_seconds: f64,
    /// False for DaemonSet, static, bare (no controller), eviction-blocked and terminating pods.
    pub evictable: bool,
    /// The PodDisruptionBudgets covering it: indexes into the `disruptions` given to
    /// [`cheapest_victims`].
    pub budgets: Vec<usize>,
}

/// The workload that wants room.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The pod.
    pub workload: &'a Workload,
    /// Its tenant.
    pub tenant: Option<usize>,
    /// Its priority.
    pub priority: i32,
    /// Its quota usage.
    pub demand: &'a Usage,
}

/// A chosen set of victims.
#[derive(Debug, Clone, PartialEq)]
pub struct VictimSet {
    /// Node the claimant would run on.
    pub node: usize,
    /// Indexes into the `running` slice given to [`cheapest_victims`].
    pub victims: Vec<usize>,
    /// GPU-seconds of work lost.
    pub lost_gpu_seconds: f64,
    /// Priority-weighted GPU-seconds (the cost minimised).
    pub cost: f64,
}

/// Weighted cost of evicting `victim` for a claimant of `priority`.
pub fn victim_cost(victim: &RunningPod, priority: i32) -> f64 {
    let gap = f64::from(priority.saturating_sub(victim.priority).max(0));
    let gpus =
        victim.usage.get(&super::config::ResourceKind::GpuEquivalent).copied().unwrap_or(0) as f64 / 1000.0;
    (victim.lost_gpu_seconds + RESTART_GPU_SECONDS * gpus) / (1.0 + gap / 100.0)
}

/// Whether `victim` may be evicted for `claimant` given current usage.
pub fn may_evict(tenants: &Tenants, ledger: &Ledger, claimant: &Claimant<'_>, victim: &RunningPod) -> bool {
    // Untenanted pods are unmanaged: not even another untenanted pod may evict them.
    let (Some(v), Some(c)) = (victim.tenant, claimant.tenant) else { return false };
    if !victim.evictable {
        return false;
    }
    if v == c {
        return victim.priority < claimant.priority;
    }
    if !tenants.cohort_members(c).contains(&v) || !ledger.is_borrowing(tenants, v) {
        return false;
    }
    // Reclaim only for a claimant that stays within its own nominal quota.
    !matches!(
        ledger.check(tenants, c, claimant.demand),
        Admission::Borrows { .. } | Admission::Exceeds { .. }
    ) || victim.priority < claimant.priority
}

/// Whether every budget covering `victim` allows one more eviction (`left`: allowed per budget).
fn disruption_allowed(left: &[u32], victim: &RunningPod) -> bool {
    victim.budgets.iter().all(|&b| left.get(b).is_some_and(|&n| n > 0))
}

/// Takes one eviction of `victim` from the `left` allowances of the budgets covering it; false
/// (nothing taken) when one of them allows no more.
fn take_disruption(left: &mut [u32], victim: &RunningPod) -> bool {
    if !disruption_allowed(left, victim) {
        return false;
    }
    for &b in &victim.budgets {
        left[b] -= 1;
    }
    true
}

fn quota_ok(tenants: &Tenants, ledger: &Ledger, claimant: &Claimant<'_>) -> bool {
    claimant.tenant.is_none_or(|t| {
        matches!(ledger.check(tenants, t, claimant.demand), Admission::Fits | Admission::Borrows { .. })
    })
}

/// The cheapest victim set that makes room for the claimant on one node and, if its quota
/// needs it, gives back borrowed quota. `nodes` carry current allocations; `running` lists the
/// pods on them; `disruptions` the evictions each PodDisruptionBudget still allows (what sets
/// planned earlier took is already gone). `None` when no allowed set of victims makes room.
pub fn cheapest_victims(
    tenants: &Tenants,
    ledger: &Ledger,
    nodes: &[Node],
    running: &[RunningPod],
    claimant: &Claimant<'_>,
    disruptions: &[u32],
) -> Option<VictimSet> {
    let w = claimant.workload;
    let cost = |i: usize| victim_cost(&running[i], claimant.priority);
    let mut by_cost: Vec<usize> = (0..running.len())
        .filter(|&i| {
            may_evict(tenants, ledger, claimant, &running[i]) && disruption_allowed(disruptions, &running[i])
        })
        .collect();
    by_cost.sort_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(running[a].id.cmp(&running[b].id)));
    if by_cost.is_empty() {
        return None;
    }
    let mut best: Option<VictimSet> = None;
    for (n, node) in nodes.iter().enumerate() {
        if !w.allowed_on(node) || node.unschedulable || node.allocatable.checked_sub(&w.requests).is_none() {
            continue;
        }
        let local: Vec<usize> = by_cost.iter().copied().filter(|&i| running[i].node == n).collect();
        if local.is_empty() && fit::candidates(node, w).is_err() {
            continue;
        }
        // Feasible with these victims (each evicted from its own node)?
        let feasible = |set: &[usize]| -> bool {
            let mut node = node.clone();
            let mut l = ledger.clone();
            for &v in set {
                let r = &running[v];
                if r.node == n {
                    node.release_pod(&r.footprint, &r.devices);
                }
                if let Some(t) = r.tenant {
                    l.release(t, &r.usage);
                }
            }
            fit::candidates(&node, w).is_ok() && quota_ok(tenants, &l, claimant)
        };
        if feasible(&[]) {
            return Some(VictimSet { node: n, victims: Vec::new(), lost_gpu_seconds: 0.0, cost: 0.0 });
        }
        // Greedy: victims on this node first (they make room and may give quota back), then
        // borrowers elsewhere for quota only. State is updated incrementally.
        let mut set: Vec<usize> = Vec::new();
        let mut ok = false;
        let mut sim_node = node.clone();
        let mut sim = ledger.clone();
        let mut left = disruptions.to_vec();
        let others = by_cost.iter().copied().filter(|&i| running[i].node != n);
        for i in local.iter().copied().chain(others) {
            let r = &running[i];
            if r.node != n && fit::candidates(&sim_node, w).is_err() {
                break; // other nodes' victims cannot make room here
            }
            // Re-check reclaim eligibility against usage after earlier victims.
            if !may_evict(tenants, &sim, claimant, r) {
                continue;
            }
            // A victim its budgets no longer allow is skipped, as kube-scheduler reprieves
            // PDB-violating victims first; the set it would complete could never be evicted.
            if !take_disruption(&mut left, r) {
                continue;
            }
            set.push(i);
            if r.node == n {
                sim_node.release_pod(&r.footprint, &r.devices);
            }
            if let Some(t) = r.tenant {
                sim.release(t, &r.usage);
            }
            if fit::candidates(&sim_node, w).is_ok() && quota_ok(tenants, &sim, claimant) {
                ok = true;
                break;
            }
        }
        if !ok {
            continue;
        }
        // Drop victims that turn out unnecessary, most expensive first.
        let mut k = set.len();
        while k > 0 {
            k -= 1;
            let mut fewer = set.clone();
            fewer.remove(k);
            if feasible(&fewer) {
                set = fewer;
            }
        }
        let total: f64 = set.iter().map(|&i| cost(i)).sum();
        let better = best.as_ref().is_none_or(|b| {
            total < b.cost - 1e-9 || ((total - b.cost).abs() <= 1e-9 && set.len() < b.victims.len())
        });
        if better {
            let lost = set.iter().map(|&i| running[i].lost_gpu_seconds).sum();
            set.sort_by(|&a, &b| running[a].id.cmp(&running[b].id));
            best = Some(VictimSet { node: n, victims: set, lost_gpu_seconds: lost, cost: total });
        }
    }
    best
}

/// What to do for a claimant that does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Evict the victim set.
    Preempt,
    /// Grow a node group.
    ScaleUp,
    /// Neither is possible; wait.
    Wait,
}

/// The decision with its reason and the two costs compared.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What was chosen.
    pub choice: Choice,
    /// Why, in words.
    pub reason: String,
    /// Dollar value of the work the eviction loses (priority-weighted).
    pub preempt_cost: Option<f64>,
    /// Dollars the scale-up costs over the horizon.
    pub scale_up_cost: Option<f64>,
}

/// Compares evicting `victims` with the scale-up alternative (`description`, $/h), if any.
pub fn decide(
    victims: Option<&VictimSet>,
    scale_up: Option<(&str, MicroDollarsPerHour)>,
    cfg: &PreemptionConfig,
) -> Decision {
    let preempt_cost = victims.map(|v| v.cost / 3600.0 * cfg.gpu_hour_value);
    let scale_up_cost = scale_up.map(|(_, p)| p as f64 / dollars(1.0) as f64 * cfg.scale_up_horizon_hours);
    let horizon = cfg.scale_up_horizon_hours;
    let describe_victims = |v: &VictimSet, usd: f64| {
        format!(
            "evicting {} pod(s) loses {:.2} GPU-h of work, worth ${usd:.2} weighted by priority",
            v.victims.len(),
            v.lost_gpu_seconds / 3600.0,
        )
    };
    let (choice, reason) = match (victims, preempt_cost, scale_up, scale_up_cost) {
        (Some(v), Some(p), Some((what, _)), Some(s)) => {
            if p <= s {
                (
                    Choice::Preempt,
                    format!("{} <= scale-up {what} at ${s:.2} over {horizon}h", describe_victims(v, p)),
                )
            } else {
                (
                    Choice::ScaleUp,
                    format!("scale-up {what} at ${s:.2} over {horizon}h < {}", describe_victims(v, p)),
                )
            }
        }
        (Some(v), Some(p), _, _) => {
            (Choice::Preempt, format!("{}; no scale-up can serve it", describe_victims(v, p)))
        }
        (None, _, Some((what, _)), Some(s)) => {
            (Choice::ScaleUp, format!("no allowed victims; scale-up {what} at ${s:.2} over {horizon}h"))
        }
        _ => (Choice::Wait, "no allowed victims and no scale-up can serve it".to_string()),
    };
    Decision { choice, reason, preempt_cost, scale_up_cost }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDemand, GpuDevice, Resources};
    use crate::tenancy::config::TenancyConfig;
    use crate::tenancy::quota::usage_of;
    use std::path::Path;

    fn node(gpus: usize) -> Node {
        Node {
            name: "n".into(),
            allocatable: Resources::new(64000, 1 << 20),
            gpus: (0..gpus).map(|i| GpuDevice::standard(i as u8, 81920)).collect(),
            gpu_model: Some("H100-80GB".into()),
            ..Default::default()
        }
    }

    fn running(
        node_state: &mut Node,
        i: usize,
        tenant: usize,
        priority: i32,
        n: u32,
        lost: f64,
    ) -> RunningPod {
        let w = Workload {
            id: format!("t/r{i}"),
            requests: Resources::new(1000, 1024),
            gpu: GpuDemand::Whole { count: n },
            ..Default::default()
        };
        let devices = fit::candidates(node_state, &w).unwrap().remove(0);
        node_state.allocate_pod(&w, &devices);
        RunningPod {
            workload: i,
            id: w.id.clone(),
            tenant: Some(tenant),
            priority,
            node: 0,
            footprint: w.footprint(),
            devices,
            usage: usage_of(&w, None),
            lost_gpu_seconds: lost,
            evictable: true,
            budgets: Vec::new(),
        }
    }

    #[test]
    fn picks_the_cheapest_lower_priority_victims_and_compares_with_scale_up() {
        let t = Tenants::new(
            &TenancyConfig::parse(
                Path::new("t"),
                "tenants: [{name: a, quotas: {nvidia.com/gpu: {nominal: 8}}}]",
            )
            .unwrap(),
        );
        let mut n = node(8);
        let pods = vec![
            running(&mut n, 0, 0, 0, 2, 36000.0), // 10 GPU-h
            running(&mut n, 1, 0, 0, 2, 3600.0),  // 1 GPU-h
            running(&mut n, 2, 0, 0, 2, 7200.0),
            running(&mut n, 3, 0, 500, 2, 0.0), // same priority as the claimant: not a victim
        ];
        let mut ledger = Ledger::new(&t);
        for p in &pods {
            ledger.charge(0, &p.usage);
        }
        let w = Workload {
            id: "t/high".into(),
            requests: Resources::new(1000, 1024),
            gpu: GpuDemand::Whole { count: 2 },
            ..Default::default()
        };
        let demand = usage_of(&w, None);
        let c = Claimant { workload: &w, tenant: Some(0), priority: 500, demand: &demand };
        // Quota is full too (8 of 8): one 2-GPU victim frees both room and quota.
        let v = cheapest_victims(&t, &ledger, &[n], &pods, &c, &[]).unwrap();
        assert_eq!(v.victims, vec![1]);
        assert_eq!(v.lost_gpu_seconds, 3600.0);
        // (3600 + 600) / 6 = 700 weighted GPU-seconds.
        assert!((v.cost - 700.0).abs() < 1e-6, "{}", v.cost);
        let cfg = PreemptionConfig::default();
        let d = decide(Some(&v), Some(("1 x p5.48xlarge", dollars(98.32))), &cfg);
        assert_eq!(d.choice, Choice::Preempt, "{}", d.reason);
        // A cheap node beats evicting expensive work.
        let costly = VictimSet { cost: 360_000.0, ..v.clone() };
        let d = decide(Some(&costly), Some(("1 x g6.xlarge", dollars(0.80))), &cfg);
        assert_eq!(d.choice, Choice::ScaleUp, "{}", d.reason);
        assert!(d.reason.contains("g6.xlarge at $0.80 over 1h"), "{}", d.reason);
        assert_eq!(decide(None, None, &cfg).choice, Choice::Wait);
    }

    #[test]
    fn an_eviction_frees_the_victims_pod_slot() {
        // GPUs are free but the node is at its pod limit: only evicting a pod makes room, as
        // kube-scheduler's preemption frees the victim's slot with its resources.
        let t = Tenants::new(
            &TenancyConfig::parse(
                Path::new("t"),
                "tenants: [{name: a, quotas: {nvidia.com/gpu: {nominal: 16}}}]",
            )
            .unwrap(),
        );
        let mut n = Node { max_pods: 2, ..node(8) };
        let pods = vec![running(&mut n, 0, 0, 0, 1, 600.0), running(&mut n, 1, 0, 0, 1, 60.0)];
        let mut ledger = Ledger::new(&t);
        for p in &pods {
            ledger.charge(0, &p.usage);
        }
        let w = Workload { id: "t/high".into(), gpu: GpuDemand::Whole { count: 1 }, ..Default::default() };
        let demand = usage_of(&w, None);
        let c = Claimant { workload: &w, tenant: Some(0), priority: 500, demand: &demand };
        assert_eq!(fit::candidates(&n, &w).unwrap_err(), fit::Unfit::TooManyPods);
        let v = cheapest_victims(&t, &ledger, &[n], &pods, &c, &[]).expect("a victim frees a slot");
        assert_eq!(v.victims, vec![1], "the one with less work lost");
    }

    #[test]
    fn reclaims_from_borrowers_only() {
        let t = Tenants::new(
            &TenancyConfig::parse(
                Path::new("t"),
                "cohorts: [{name: c}]\ntenants:\n  - {name: a, cohort: c, quotas: {nvidia.com/gpu: {nominal: 4}}}\n  - {name: b, cohort: c, quotas: {nvidia.com/gpu: {nominal: 4}}}\n",
            )
            .unwrap(),
        );
        let mut n = node(8);
        // b runs 6 GPUs (borrowing 2), a runs 2.
        let pods = vec![
            running(&mut n, 0, 1, 100, 4, 100.0),
            running(&mut n, 1, 1, 100, 2, 100.0),
            running(&mut n, 2, 0, 0, 2, 10.0),
        ];
        let mut ledger = Ledger::new(&t);
        for p in &pods {
            ledger.charge(p.tenant.unwrap(), &p.usage);
        }
        let w = Workload { id: "a/x".into(), gpu: GpuDemand::Whole { count: 2 }, ..Default::default() };
        let demand = usage_of(&w, None);
        // a (priority 0, within its nominal after admission) reclaims b's borrowed GPUs although
        // b's pods have higher priority; a's own pod has the same priority and is not a victim.
        let c = Claimant { workload: &w, tenant: Some(0), priority: 0, demand: &demand };
        let v = cheapest_victims(&t, &ledger, &[n.clone()], &pods, &c, &[]).unwrap();
        assert_eq!(v.victims, vec![1]);
        // Once b is within nominal, nothing of b may go.
        let mut within = ledger.clone();
        within.release(1, &pods[1].usage);
        assert!(!may_evict(&t, &within, &c, &pods[0]));
        // b (a borrower) cannot take from a for a claim beyond its nominal.
        let cb = Claimant { workload: &w, tenant: Some(1), priority: 1000, demand: &demand };
        assert!(!may_evict(&t, &ledger, &cb, &pods[2]));
    }

    #[test]
    fn no_set_takes_more_evictions_than_a_budget_allows() {
        let t = Tenants::new(
            &TenancyConfig::parse(
                Path::new("t"),
                "tenants: [{name: a, quotas: {nvidia.com/gpu: {nominal: 16}}}]",
            )
            .unwrap(),
        );
        let mut n = node(8);
        // Cheapest first: r0, r1, r2, r3. Budget 0 covers r0 and allows nothing; budget 1
        // covers r1 and r2 and allows one eviction.
        let mut pods: Vec<RunningPod> =
            (0..4).map(|i| running(&mut n, i, 0, 0, 2, 60.0 * (i + 1) as f64)).collect();
        pods[0].budgets = vec![0];
        pods[1].budgets = vec![1];
        pods[2].budgets = vec![1];
        let ledger = Ledger::new(&t);
        let w = Workload { id: "t/high".into(), gpu: GpuDemand::Whole { count: 4 }, ..Default::default() };
        let demand = usage_of(&w, None);
        let c = Claimant { workload: &w, tenant: Some(0), priority: 500, demand: &demand };
        let unbounded = cheapest_victims(&t, &ledger, &[n.clone()], &pods, &c, &[8, 8]).unwrap();
        assert_eq!(unbounded.victims, vec![0, 1]);
        let v = cheapest_victims(&t, &ledger, &[n.clone()], &pods, &c, &[0, 1]).unwrap();
        assert_eq!(v.victims, vec![1, 3], "r0 not at all, only one of r1 and r2");
        // An earlier set of the plan took budget 1's eviction: no set is left.
        pods[3].budgets = vec![1];
        assert_eq!(cheapest_victims(&t, &ledger, &[n], &pods, &c, &[0, 0]), None);
    }

    #[test]
    fn a_pod_of_no_tenant_is_nobodys_victim() {
        let t = Tenants::new(
            &TenancyConfig::parse(
                Path::new("t"),
                "tenants: [{name: a, quotas: {nvidia.com/gpu: {nominal: 8}}}]",
            )
            .unwrap(),
        );
        let mut n = node(8);
        let mut low = running(&mut n, 0, 0, 0, 8, 60.0);
        low.tenant = None;
        let w = Workload { id: "x/high".into(), gpu: GpuDemand::Whole { count: 8 }, ..Default::default() };
        let demand = usage_of(&w, None);
        let ledger = Ledger::new(&t);
        for tenant in [None, Some(0)] {
            let c = Claimant { workload: &w, tenant, priority: 1000, demand: &demand };
            assert!(!may_evict(&t, &ledger, &c, &low), "claimant of tenant {tenant:?}");
        }
        // Of its own tenant, the same pod is a victim.
        low.tenant = Some(0);
        let c = Claimant { workload: &w, tenant: Some(0), priority: 1000, demand: &demand };
        assert!(may_evict(&t, &ledger, &c, &low));
    }
}
