//! Weighted fair sharing between tenants, with starvation prevention by aging.
//!
//! Kueue-like: within a tenant, pending work goes by (aged) priority, then age; across tenants,
//! the tenant whose share after admitting its head would be lowest goes next. The share is
//! weighted dominant-resource share (DRF over the quota kinds) or the GPU-equivalent share.

use super::config::{FairShareMode, ResourceKind};
use super::quota::{add, Ledger, Tenants, Usage};
use std::collections::BTreeMap;

/// A pending claim to rank: one pod or one gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Owning tenant, if any (unmanaged claims are ranked by priority alone, ahead of tenants).
    pub tenant: Option<usize>,
    /// Priority.
    pub priority: i32,
    /// Creation time, seconds.
    pub created_at: Option<i64>,
    /// Demand.
    pub demand: Usage,
    /// Name, for a stable tie-break.
    pub id: String,
}

/// Priority raised by waiting: one point per `aging` seconds waited (0 = no aging).
pub fn effective_priority(priority: i32, created_at: Option<i64>, now: i64, aging: f64) -> f64 {
    let waited = created_at.map_or(0, |c| now.saturating_sub(c).max(0)) as f64;
    f64::from(priority) + if aging > 0.0 { waited / aging } else { 0.0 }
}

/// Denominators of shares: the total nominal quota of each kind over all tenants; the
/// GPU-equivalent total is `cluster_gpu_milli` when given (cluster capacity).
pub fn capacity(tenants: &Tenants, cluster_gpu_milli: u64) -> Usage {
    let mut cap = Usage::new();
    for t in &tenants.tenants {
        for (k, q) in &t.quotas {
            *cap.entry(k.clone()).or_default() += q.nominal;
        }
    }
    if cluster_gpu_milli > 0 {
        cap.insert(ResourceKind::GpuEquivalent, cluster_gpu_milli);
    }
    cap
}

/// A tenant's weighted share of `usage`.
pub fn share(tenants: &Tenants, tenant: usize, usage: &Usage, capacity: &Usage) -> f64 {
    share_with(tenants, tenant, usage, &Usage::new(), capacity)
}

/// A tenant's weighted share of `usage` plus `extra`, without building the sum.
pub fn share_with(tenants: &Tenants, tenant: usize, usage: &Usage, extra: &Usage, capacity: &Usage) -> f64 {
    let t = &tenants.tenants[tenant];
    let of = |k: &ResourceKind| {
        let c = capacity.get(k).copied().unwrap_or(0);
        if c == 0 {
            0.0
        } else {
            (usage.get(k).copied().unwrap_or(0) + extra.get(k).copied().unwrap_or(0)) as f64 / c as f64
        }
    };
    let raw = match tenants.config.fair_share.mode {
        FairShareMode::GpuShare => of(&ResourceKind::GpuEquivalent),
        FairShareMode::Drf => {
            let mut kinds: Vec<&ResourceKind> = t.quotas.keys().collect();
            if kinds.is_empty() {
                kinds.push(&ResourceKind::GpuEquivalent);
            }
            kinds.into_iter().map(of).fold(0.0, f64::max)
        }
    };
    raw / t.weight.max(1e-9)
}

/// Orders claims: returns their indexes in admission order. Usage grows as claims are taken, so
/// a tenant that gets one claim is less likely to get the next (Kueue's fair-sharing admission).
pub fn order(tenants: &Tenants, ledger: &Ledger, claims: &[Claim], now: i64, capacity: &Usage) -> Vec<usize> {
    let aging = tenants.config.starvation.aging_seconds_per_priority_point;
    let eff: Vec<f64> =
        claims.iter().map(|c| effective_priority(c.priority, c.created_at, now, aging)).collect();
    // Queue per tenant (None = unmanaged), best first.
    let mut queues: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for (i, c) in claims.iter().enumerate() {
        queues.entry(c.tenant).or_default().push(i);
    }
    for q in queues.values_mut() {
        q.sort_by(|&a, &b| {
            eff[b]
                .total_cmp(&eff[a])
                .then(claims[a].created_at.cmp(&claims[b].created_at))
                .then(claims[a].id.cmp(&claims[b].id))
        });
        q.reverse(); // pop from the back
    }
    let mut usage = ledger.usage.clone();
    let mut out = Vec::with_capacity(claims.len());
    loop {
        // Per tenant head: (share after admitting it, effective priority, id).
        let mut best: Option<(f64, f64, Option<usize>)> = None;
        for (&tenant, q) in &queues {
            let Some(&head) = q.last() else { continue };
            let s = match tenant {
                None => f64::NEG_INFINITY,
                Some(t) => share_with(tenants, t, &usage[t], &claims[head].demand, capacity),
            };
            let better = match best {
                None => true,
                Some((bs, be, bt)) => {
                    s < bs - 1e-12
                        || ((s - bs).abs() <= 1e-12
                            && (eff[head] > be || (eff[head] == be && bt.is_some_and(|_| tenant < bt))))
                }
            };
            if better {
                best = Some((s, eff[head], tenant));
            }
        }
        let Some((_, _, tenant)) = best else { break };
        let Some(head) = queues.get_mut(&tenant).and_then(|q| q.pop()) else { break };
        if let Some(t) = tenant {
            add(&mut usage[t], &claims[head].demand);
        }
        out.push(head);
    }
    out
}

/// Weighted max-min fair division of `capacity` among demands (water-filling): no tenant gets
/// more than it asks, the rest is split in proportion to weights. The reference a fair scheduler
/// is measured against.
pub fn max_min_fair(capacity: f64, demands: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut alloc = vec![0.0; demands.len()];
    let mut active: Vec<usize> =
        (0..demands.len()).filter(|&i| demands[i] > 0.0 && weights[i] > 0.0).collect();
    let mut left = capacity.max(0.0);
    while !active.is_empty() && left > 1e-12 {
        let w: f64 = active.iter().map(|&i| weights[i]).sum();
        let per = left / w;
        // Tenants whose remaining demand is below their slice are satisfied this round.
        let (done, rest): (Vec<usize>, Vec<usize>) =
            active.iter().partition(|&&i| demands[i] - alloc[i] <= per * weights[i] + 1e-12);
        if done.is_empty() {
            for &i in &active {
                alloc[i] += per * weights[i];
            }
            break;
        }
        for &i in &done {
            left -= demands[i] - alloc[i];
            alloc[i] = demands[i];
        }
        active = rest;
    }
    alloc
}

/// Jain's fairness index of allocations (1 = perfectly even, 1/n = one takes all). Callers pass
/// shares normalised by entitlement to measure fairness relative to weights.
pub fn jain_index(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if values.is_empty() || squares == 0.0 {
        1.0
    } else {
        sum * sum / (n * squares)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuDemand, Workload};
    use crate::tenancy::config::TenancyConfig;
    use crate::tenancy::quota::usage_of;
    use std::path::Path;

    fn gpus(n: u32) -> Usage {
        usage_of(&Workload { gpu: GpuDemand::Whole { count: n }, ..Default::default() }, None)
    }

    fn claim(tenant: usize, priority: i32, created: i64, n: u32, id: &str) -> Claim {
        Claim { tenant: Some(tenant), priority, created_at: Some(created), demand: gpus(n), id: id.into() }
    }

    #[test]
    fn water_filling() {
        let a = max_min_fair(10.0, &[2.0, 8.0, 8.0], &[1.0, 1.0, 2.0]);
        // 2 is satisfied; 8 left split 1:2.
        assert!(
            (a[0] - 2.0).abs() < 1e-9 && (a[1] - 8.0 / 3.0).abs() < 1e-9 && (a[2] - 16.0 / 3.0).abs() < 1e-9,
            "{a:?}"
        );
        assert_eq!(max_min_fair(10.0, &[1.0, 2.0], &[1.0, 1.0]), vec![1.0, 2.0]);
    }

    #[test]
    fn jain_on_known_inputs() {
        assert!((jain_index(&[1.0, 1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        // (1+2+3)^2 / (3 * 14) = 36/42
        assert!((jain_index(&[1.0, 2.0, 3.0]) - 36.0 / 42.0).abs() < 1e-12);
        assert_eq!(jain_index(&[]), 1.0);
    }

    #[test]
    fn weighted_shares_interleave_tenants_and_aging_lifts_the_old() {
        let cfg = TenancyConfig::parse(
            Path::new("t"),
            "tenants:\n  - {name: a, weight: 2, quotas: {nvidia.com/gpu: {nominal: 8}}}\n  - {name: b, quotas: {nvidia.com/gpu: {nominal: 8}}}\n",
        )
        .unwrap();
        let t = Tenants::new(&cfg);
        let l = Ledger::new(&t);
        let claims: Vec<Claim> = (0..3)
            .map(|i| claim(0, 0, i, 2, &format!("a{i}")))
            .chain((0..3).map(|i| claim(1, 0, i, 2, &format!("b{i}"))))
            .collect();
        let cap = capacity(&t, 0);
        let ids: Vec<&str> =
            order(&t, &l, &claims, 100, &cap).iter().map(|&i| claims[i].id.as_str()).collect();
        // a has twice the weight: it gets two claims for each of b's.
        assert_eq!(ids, vec!["a0", "a1", "b0", "a2", "b1", "b2"]);

        // Priority orders within a tenant; aging lets an old low-priority claim overtake.
        let claims = vec![claim(0, 10, 90, 1, "new-high"), claim(0, 0, 0, 1, "old-low")];
        let first = |aging: f64| {
            let mut cfg = cfg.clone();
            cfg.starvation.aging_seconds_per_priority_point = aging;
            let t = Tenants::new(&cfg);
            claims[order(&t, &l, &claims, 100, &cap)[0]].id.clone()
        };
        assert_eq!(first(0.0), "new-high");
        assert_eq!(first(5.0), "old-low"); // 100s / 5 = 20 points > 10
    }
}
