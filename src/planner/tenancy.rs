//! The planner's tenancy step: fair-share order, quota and workload-class admission, budget caps
//! on scale-ups, and preemption plans. The decisions themselves live in [`crate::tenancy`].

use super::cluster::{GroupIndex, NodeInfo, Origin};
use super::plan::{Preempt, Unschedulable};
use super::scale_up::template_fit;
use super::{PlanInput, Unit};
use crate::model::{dollars, ClusterSnapshot, MicroDollarsPerHour, Node, NodeGroup, OwnerKind, Workload};
use crate::scheduler::placer::ShapeKey;
use crate::scheduler::{Placement, Placer};
use crate::tenancy::fair_share::{self, Claim};
use crate::tenancy::preemption::{self, Choice, Claimant, RunningPod};
use crate::tenancy::quota::{add, usage_paid, Admission, ClaimPayers, Ledger, Tenants, Usage};
use crate::tenancy::{ResourceKind, TenancyConfig};
use std::collections::{HashMap, HashSet};

fn usd(micro: MicroDollarsPerHour) -> String {
    format!("${:.2}/h", micro as f64 / dollars(1.0) as f64)
}

/// Tenancy state for one plan.
pub(crate) struct Gate {
    pub tenants: Tenants,
    pub ledger: Ledger,
    /// Tenant of each snapshot workload.
    pub tenant_of: Vec<Option<usize>>,
    /// Effective (class-mapped) priority of each snapshot workload.
    pub priority: Vec<i32>,
    /// Planning time, seconds since the epoch.
    pub now: i64,
    /// Spend per tenant (existing share of nodes plus planned scale-ups).
    spend: Vec<MicroDollarsPerHour>,
    /// Who pays for each DRA claim (a shared claim is charged once).
    payers: ClaimPayers,
    /// Preemption searches that found nothing since the last eviction planned: a pod of the same
    /// shape, tenant and priority finds nothing either until something changes. Without it a
    /// queue of thousands of pods costs thousands of searches over every running pod.
    fruitless: HashSet<(ShapeKey, Option<usize>, i32, bool)>,
    /// The running pods preemption chooses from, built at the first search and again after each
    /// eviction planned (nothing else changes them within a plan).
    running: Option<Vec<RunningPod>>,
    /// Evictions each PodDisruptionBudget of the snapshot still allows after the preemptions
    /// planned so far, so that no two sets of one plan together exceed a budget.
    disruptions: Vec<u32>,
}

impl Gate {
    /// Resolves tenants and usage from the snapshot. `now` defaults to the newest creation time.
    pub fn new(
        config: &TenancyConfig,
        snapshot: &ClusterSnapshot,
        groups: &[NodeGroup],
        now: Option<i64>,
    ) -> Self {
        let tenants = Tenants::new(config);
        let ledger = Ledger::from_snapshot(&tenants, snapshot);
        let tenant_of: Vec<Option<usize>> = snapshot.workloads.iter().map(|w| tenants.tenant_of(w)).collect();
        let priority = snapshot.workloads.iter().map(|w| tenants.priority_of(w)).collect();
        let now =
            now.unwrap_or_else(|| snapshot.workloads.iter().filter_map(|w| w.created_at).max().unwrap_or(0));
        // A running pod costs its tenant its share of the node's price (largest of GPU, CPU, memory).
        let payers = ClaimPayers::of(&snapshot.workloads);
        let mut spend = vec![0u64; tenants.tenants.len()];
        let node_named: HashMap<&str, &Node> = snapshot.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let group_index = GroupIndex::of(groups);
        for (i, (w, t)) in snapshot.workloads.iter().zip(&tenant_of).enumerate() {
            let (Some(t), Some(node_name)) = (t, &w.node_name) else { continue };
            let Some(&node) = node_named.get(node_name.as_str()) else { continue };
            let Some(g) = group_index.group_of(node) else { continue };
            let gpu_cap = node.gpu_milli_capacity();
            let gpu =
                usage_paid(w, i, Some(node), &payers).get(&ResourceKind::GpuEquivalent).copied().unwrap_or(0)
                    as f64
                    / gpu_cap.max(1) as f64;
            let cpu = w.requests.cpu_milli as f64 / node.allocatable.cpu_milli.max(1) as f64;
            let mem = w.requests.memory_bytes as f64 / node.allocatable.memory_bytes.max(1) as f64;
            let share = if gpu_cap > 0 && !w.gpu.is_none() { gpu } else { cpu.max(mem) };
            spend[*t] += (groups[g].price as f64 * share.min(1.0)) as u64;
        }
        Self {
            tenants,
            ledger,
            tenant_of,
            priority,
            now,
            spend,
            payers,
            fruitless: HashSet::new(),
            running: None,
            disruptions: snapshot.disruption_budgets.iter().map(|b| b.disruptions_allowed).collect(),
        }
    }

    /// What snapshot workload `i` uses (on `node` when it runs there), shared claims paid once.
    fn usage(&self, workloads: &[Workload], i: usize, node: Option<&crate::model::Node>) -> Usage {
        usage_paid(&workloads[i], i, node, &self.payers)
    }

    fn demand(&self, workloads: &[Workload], unit: &Unit) -> Usage {
        let mut d = Usage::new();
        for &i in &unit.pods {
            add(&mut d, &self.usage(workloads, i, None));
        }
        d
    }

    fn unit_tenant(&self, unit: &Unit) -> Option<usize> {
        unit.pods.first().and_then(|&i| self.tenant_of[i])
    }

    /// Orders units by fair share and admits them against quota. Returns the admitted units in
    /// order and the units that are within their tenant's nominal quota but need borrowers to
    /// give quota back; the rest are reported unschedulable with the quota or class reason.
    pub fn admit(
        &mut self,
        workloads: &[Workload],
        units: Vec<Unit>,
        cluster_gpu_milli: u64,
        unschedulable: &mut Vec<Unschedulable>,
    ) -> (Vec<Unit>, Vec<Unit>) {
        let claims: Vec<Claim> = units
            .iter()
            .map(|u| Claim {
                tenant: self.unit_tenant(u),
                priority: u.pods.iter().map(|&i| self.priority[i]).max().unwrap_or(0),
                created_at: u.pods.iter().filter_map(|&i| workloads[i].created_at).min(),
                demand: self.demand(workloads, u),
                id: u.gang.clone().unwrap_or_else(|| workloads[u.pods[0]].id.clone()),
            })
            .collect();
        let capacity = fair_share::capacity(&self.tenants, cluster_gpu_milli);
        let order = fair_share::order(&self.tenants, &self.ledger, &claims, self.now, &capacity);
        let mut slots: Vec<Option<Unit>> = units.into_iter().map(Some).collect();
        let (mut admitted, mut reclaim) = (Vec::new(), Vec::new());
        for i in order {
            let Some(unit) = slots[i].take() else { continue };
            let tenant = claims[i].tenant;
            let class = unit.pods.iter().find_map(|&p| self.tenants.check_class(tenant, &workloads[p]).err());
            let reason = match (class, tenant) {
                (Some(reason), _) => Some(reason),
                (None, None) => None,
                // Shared claims an earlier admission paid for cost nothing now.
                (None, Some(t)) => {
                    let demand = self.demand(workloads, &unit);
                    match self.ledger.check(&self.tenants, t, &demand) {
                        Admission::Fits | Admission::Borrows { .. } => {
                            self.ledger.charge(t, &demand);
                            for &p in &unit.pods {
                                self.payers.admitted(p, &workloads[p]);
                            }
                            None
                        }
                        Admission::NeedsReclaim { .. } => {
                            reclaim.push(unit);
                            continue;
                        }
                        Admission::Exceeds { reason } => Some(reason),
                    }
                }
            };
            match reason {
                Some(reason) => {
                    for &p in &unit.pods {
                        unschedulable
                            .push(Unschedulable { pod: workloads[p].id.clone(), reason: reason.clone() });
                    }
                }
                None => admitted.push(unit),
            }
        }
        (admitted, reclaim)
    }

    /// `Err` with the reason when adding `cost` for the unit would push its tenant over its cap.
    pub fn check_budget(&self, unit: &Unit, cost: MicroDollarsPerHour) -> Result<(), String> {
        let Some(t) = self.unit_tenant(unit) else { return Ok(()) };
        let tenant = &self.tenants.tenants[t];
        let Some(cap) = tenant.budget_per_hour else { return Ok(()) };
        if self.spend[t] + cost <= cap {
            return Ok(());
        }
        Err(format!(
            "tenant {}: +{} would exceed its budget cap {} (spending {} now)",
            tenant.name,
            usd(cost),
            usd(cap),
            usd(self.spend[t])
        ))
    }

    /// Records planned spend for the unit's tenant.
    pub fn charge_budget(&mut self, unit: &Unit, cost: MicroDollarsPerHour) {
        if let Some(t) = self.unit_tenant(unit) {
            self.spend[t] += cost;
        }
    }

    /// The cheapest group that could take the pod on one new node within its tenant's budget.
    fn scale_up_alternative<'g>(
        &self,
        input: &PlanInput,
        groups: &'g [NodeGroup],
        unit: &Unit,
        w: &Workload,
    ) -> Option<&'g NodeGroup> {
        groups
            .iter()
            .filter(|g| !input.unavailable.contains_key(&g.id) && g.target_size < g.max_size)
            .filter(|g| template_fit(g, w).is_ok() && self.check_budget(unit, g.price).is_ok())
            .min_by(|a, b| a.price.cmp(&b.price).then(a.id.cmp(&b.id)))
    }

    /// For a single-pod unit that found no room (or needs quota reclaimed), plans evictions when
    /// they beat the scale-up alternative. On `Some`, the victims are removed from the placer and
    /// the pod is placed where they were.
    pub fn preempt(
        &mut self,
        placer: &mut Placer<'_>,
        info: &mut [NodeInfo],
        input: &PlanInput,
        groups: &[NodeGroup],
        unit: &Unit,
        reclaim: bool,
    ) -> Option<Preempt> {
        if !self.tenants.config.preemption.enabled || unit.pods.len() != 1 {
            return None;
        }
        let w = &input.snapshot.workloads[unit.pods[0]];
        let alike = w.pod_affinity.is_empty() && w.spread.is_empty() && w.pod_anti_affinity().is_empty();
        let key = alike.then(|| {
            let wi = unit.pods[0];
            (ShapeKey::of(w), self.tenant_of[wi], self.priority[wi], reclaim)
        });
        if key.as_ref().is_some_and(|k| self.fruitless.contains(k)) {
            return None;
        }
        // An admitted unit's quota is already charged; victims are sought as if it were not.
        let demand = self.usage(&input.snapshot.workloads, unit.pods[0], None);
        let charged = if reclaim { None } else { self.unit_tenant(unit) };
        if let Some(t) = charged {
            self.ledger.release(t, &demand);
        }
        let planned = self.plan_preemption(placer, info, input, groups, unit, reclaim);
        if let (Some(t), None) = (charged, &planned) {
            self.ledger.charge(t, &demand);
        }
        match (&planned, key) {
            (Some(_), _) => {
                self.fruitless.clear();
                self.running = None;
            }
            (None, Some(k)) => {
                self.fruitless.insert(k);
            }
            (None, None) => {}
        }
        planned
    }

    /// The pods running on Ready nodes, as preemption weighs them.
    fn running_pods(
        &self,
        placer: &Placer<'_>,
        info: &[NodeInfo],
        snapshot: &ClusterSnapshot,
    ) -> Vec<RunningPod> {
        let workloads = &snapshot.workloads;
        let mut running = Vec::new();
        for (n, node_info) in info.iter().enumerate() {
            if node_info.origin != Origin::Ready {
                continue;
            }
            for (pi, devices) in &node_info.pods {
                let p = &workloads[*pi];
                if p.node_name.is_none() {
                    continue; // a pending pod this plan placed; nothing to evict
                }
                let usage = self.usage(workloads, *pi, Some(&placer.nodes()[n]));
                let gpus = usage.get(&ResourceKind::GpuEquivalent).copied().unwrap_or(0) as f64 / 1000.0;
                let ran = p.created_at.map_or(0, |c| self.now.saturating_sub(c).max(0)) as f64;
                running.push(RunningPod {
                    workload: *pi,
                    id: p.id.clone(),
                    tenant: self.tenant_of[*pi],
                    priority: self.priority[*pi],
                    node: n,
                    footprint: p.footprint(),
                    devices: devices.clone(),
                    usage,
                    lost_gpu_seconds: gpus * ran,
                    // A bare pod would be lost for good, as drains judge it.
                    evictable: p.eviction_blocked.is_none()
                        && !p.terminating
                        && !matches!(p.owner, OwnerKind::DaemonSet | OwnerKind::Node | OwnerKind::None),
                    budgets: (snapshot.disruption_budgets.iter().enumerate())
                        .filter(|(_, b)| b.covers(p))
                        .map(|(i, _)| i)
                        .collect(),
                });
            }
        }
        running
    }

    /// [`Gate::preempt`] with the unit's own quota not charged; charges it on success.
    fn plan_preemption(
        &mut self,
        placer: &mut Placer<'_>,
        info: &mut [NodeInfo],
        input: &PlanInput,
        groups: &[NodeGroup],
        unit: &Unit,
        reclaim: bool,
    ) -> Option<Preempt> {
        let workloads = &input.snapshot.workloads;
        let wi = unit.pods[0];
        let w = &workloads[wi];
        if self.running.is_none() {
            self.running = Some(self.running_pods(placer, info, &input.snapshot));
        }
        let demand = self.usage(workloads, wi, None);
        let running = self.running.as_deref().unwrap_or_default();
        let claimant = Claimant {
            workload: w,
            tenant: self.tenant_of[wi],
            priority: self.priority[wi],
            demand: &demand,
        };
        let victims = preemption::cheapest_victims(
            &self.tenants,
            &self.ledger,
            placer.nodes(),
            running,
            &claimant,
            &self.disruptions,
        )?;
        let alternative = if reclaim { None } else { self.scale_up_alternative(input, groups, unit, w) };
        let what = alternative.map(|g| format!("1 x {} ({})", g.instance_type, g.id));
        let decision = preemption::decide(
            Some(&victims),
            what.as_deref().zip(alternative.map(|g| g.price)),
            &self.tenants.config.preemption,
        );
        if decision.choice != Choice::Preempt {
            return None;
        }
        let reason = if reclaim {
            let t = claimant.tenant.map(|t| self.tenants.tenants[t].name.clone()).unwrap_or_default();
            format!(
                "reclaim: tenant {t} is within its nominal quota that borrowers hold; {}",
                decision.reason
            )
        } else {
            decision.reason
        };
        for &v in &victims.victims {
            let r = &running[v];
            let victim = &workloads[r.workload];
            placer.release(victim, &Placement { node: r.node, devices: r.devices.clone() });
            info[r.node].pods.retain(|(p, _)| *p != r.workload);
            if let Some(t) = r.tenant {
                self.ledger.release(t, &r.usage);
            }
        }
        let Ok(placed) = placer.place_where(w, &|n| n == victims.node) else {
            // The policy refused the node after all: undo the evictions.
            for &v in &victims.victims {
                let r = &running[v];
                placer
                    .commit(&workloads[r.workload], &Placement { node: r.node, devices: r.devices.clone() });
                info[r.node].pods.push((r.workload, r.devices.clone()));
                if let Some(t) = r.tenant {
                    self.ledger.charge(t, &r.usage);
                }
            }
            return None;
        };
        if let Some(t) = claimant.tenant {
            self.ledger.charge(t, &demand);
        }
        for &v in &victims.victims {
            for &b in &running[v].budgets {
                self.disruptions[b] -= 1;
            }
        }
        let node = placer.nodes()[placed.node].name.clone();
        info[placed.node].pods.push((wi, placed.devices));
        Some(Preempt {
            pod: w.id.clone(),
            node,
            victims: victims.victims.iter().map(|&v| running[v].id.clone()).collect(),
            reason,
            alternative_cost: alternative.map(|g| g.price),
        })
    }
}
