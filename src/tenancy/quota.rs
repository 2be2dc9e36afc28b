//! Quota accounting: which tenant a pod belongs to, what it uses of each GPU kind, and whether a
//! new workload is admissible under nominal quota, cohort borrowing and lending limits.

use super::config::{GpuForm, ResourceKind, TenancyConfig};
use crate::model::dra::{AllocationMode, GpuAsk};
use crate::model::{dollars, mig, ClusterSnapshot, GpuDemand, GpuMode, MicroDollarsPerHour, Node, Workload};
use std::collections::{BTreeMap, HashMap};

/// Usage or demand per GPU kind, in internal milli-units (see [`ResourceKind::scale`]).
pub type Usage = BTreeMap<ResourceKind, u64>;

/// Label naming a pod's workload class.
pub const WORKLOAD_CLASS_LABEL: &str = "gpuscale.io/workload-class";
/// Labels naming a pod's priority class (Kueue's, then ours).
pub const PRIORITY_CLASS_LABELS: [&str; 2] = ["kueue.x-k8s.io/priority-class", "gpuscale.io/priority-class"];

/// Quota of one kind, in internal units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Guaranteed.
    pub nominal: u64,
    /// Most borrowed beyond nominal (`None`: unlimited).
    pub borrowing_limit: Option<u64>,
    /// Most lent of the nominal (`None`: all of it).
    pub lending_limit: Option<u64>,
}

impl Quota {
    /// What the tenant lends when it uses `used`.
    fn lendable_unused(&self, used: u64) -> u64 {
        let unused = self.nominal.saturating_sub(used);
        self.lending_limit.map_or(unused, |l| l.min(unused))
    }
}

/// A compiled tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Name.
    pub name: String,
    /// Cohort name.
    pub cohort: Option<String>,
    /// Fair-share weight.
    pub weight: f64,
    /// Quotas by kind.
    pub quotas: BTreeMap<ResourceKind, Quota>,
    /// Budget cap.
    pub budget_per_hour: Option<MicroDollarsPerHour>,
    /// Workload class -> allowed GPU forms (section-wide classes merged with the tenant's).
    pub classes: BTreeMap<String, Vec<GpuForm>>,
}

/// The tenants of a validated [`TenancyConfig`], ready for lookups.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenants {
    /// Tenants in config order.
    pub tenants: Vec<Tenant>,
    /// The section they come from.
    pub config: TenancyConfig,
}

/// Whether a workload may be admitted under its tenant's quota now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Within nominal quota (or the tenant has no quota on the kinds it uses).
    Fits,
    /// Fits by borrowing unused quota of the cohort.
    Borrows {
        /// The kind borrowed most of.
        kind: ResourceKind,
        /// Borrowed beyond nominal after admission.
        amount: u64,
    },
    /// Within nominal quota, but other tenants borrowed the quota: they must give back
    /// `amount` of `kind` first (reclaim).
    NeedsReclaim {
        /// The kind.
        kind: ResourceKind,
        /// How much must be reclaimed.
        amount: u64,
    },
    /// Not admissible now.
    Exceeds {
        /// Why, naming tenant, kind, quota and usage.
        reason: String,
    },
}

/// Who pays for each DRA claim: a claim that several pods share (a named ResourceClaim) is
/// charged once, as its devices are allocated once. A claim running pods use is paid by the first
/// of them (snapshot order); one only pending pods use, by the first of them admitted
/// ([`ClaimPayers::admitted`]), so a rejected pod never leaves its claim free for another.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimPayers {
    running: HashMap<String, usize>,
    admitted: HashMap<String, usize>,
}

impl ClaimPayers {
    /// The payers among the running pods of `workloads`.
    pub fn of(workloads: &[Workload]) -> Self {
        let mut running = HashMap::new();
        for (i, w) in workloads.iter().enumerate().filter(|(_, w)| w.node_name.is_some()) {
            for c in &w.dra_claims {
                running.entry(c.key.clone()).or_insert(i);
            }
        }
        Self { running, admitted: Default::default() }
    }

    /// Records that pending workload `i` (`w`) was admitted: it pays for its claims nobody paid
    /// for yet.
    pub fn admitted(&mut self, i: usize, w: &Workload) {
        for c in w.dra_claims.iter().filter(|c| !self.running.contains_key(&c.key)) {
            self.admitted.entry(c.key.clone()).or_insert(i);
        }
    }

    /// Whether workload `i` pays for claim `key`: it is its payer, or nobody pays yet.
    fn pays(&self, i: usize, key: &str) -> bool {
        self.running.get(key).or_else(|| self.admitted.get(key)).is_none_or(|&p| p == i)
    }
}

/// What a workload uses of each kind; `node` (where it runs) tells MIG geometry and time-slicing
/// replicas. A pending time-sliced replica counts as a whole GPU: conservative until placed.
/// Every DRA claim of the workload counts; [`usage_paid`] counts a shared claim once.
pub fn usage_of(w: &Workload, node: Option<&Node>) -> Usage {
    usage_with(w, node, &|_| true)
}

/// [`usage_of`] of snapshot workload `i`, with only the DRA claims it pays for.
pub fn usage_paid(w: &Workload, i: usize, node: Option<&Node>, payers: &ClaimPayers) -> Usage {
    usage_with(w, node, &|key| payers.pays(i, key))
}

fn usage_with(w: &Workload, node: Option<&Node>, pays: &dyn Fn(&str) -> bool) -> Usage {
    let mut u = Usage::new();
    let gpu = node.and_then(|n| n.gpus.first());
    let eq = match &w.gpu {
        GpuDemand::None => 0,
        GpuDemand::Whole { count } => {
            u.insert(ResourceKind::WholeGpu, u64::from(*count) * 1000);
            u64::from(*count) * 1000
        }
        GpuDemand::Fraction { .. } => {
            let m = w.gpu.gpu_milli(gpu.map_or(0, |g| g.memory_mib), None, 1);
            u.insert(ResourceKind::GpuMilli, m);
            m
        }
        GpuDemand::Shared { count } => {
            let replicas = match gpu.map(|g| &g.mode) {
                Some(GpuMode::TimeSliced { replicas }) => *replicas,
                _ => 1,
            };
            let m = u64::from(*count) * 1000 / u64::from(replicas.max(1));
            u.insert(ResourceKind::GpuMilli, m);
            m
        }
        GpuDemand::Mig { profile, count } => {
            u.insert(ResourceKind::Mig(profile.clone()), u64::from(*count) * 1000);
            u64::from(*count) * mig::profile_milli(profile, node.and_then(|n| n.mig_geometry()))
        }
    };
    let eq = eq + dra_usage(&mut u, w, node, pays);
    if eq > 0 || !w.gpu.is_none() {
        u.insert(ResourceKind::GpuEquivalent, eq);
    }
    u
}

/// Adds the GPUs `w` takes through DRA claims, as device-plugin GPUs count: the devices allocated
/// to its claims on `node` when it runs there, else what its requests ask for (the first
/// alternative; an `All` request counts once allocated). Claims `pays` refuses are skipped.
/// Returns their GPU-equivalent milli.
fn dra_usage(u: &mut Usage, w: &Workload, node: Option<&Node>, pays: &dyn Fn(&str) -> bool) -> u64 {
    let mut eq = 0;
    let mut take = |u: &mut Usage, ask: GpuAsk, n: u64| match ask {
        GpuAsk::Whole => {
            *u.entry(ResourceKind::WholeGpu).or_default() += n * 1000;
            eq += n * 1000;
        }
        GpuAsk::Mig(profile) => {
            eq += n * mig::profile_milli(&profile, None);
            if !profile.is_empty() {
                *u.entry(ResourceKind::Mig(profile)).or_default() += n * 1000;
            }
        }
    };
    for claim in w.dra_claims.iter().filter(|c| pays(&c.key)) {
        if let Some((inv, hold)) = node.and_then(|n| n.dra.claims.get(&claim.key).map(|h| (&n.dra, h))) {
            for device in hold.devices.iter().filter_map(|&d| inv.devices.get(d as usize)) {
                if device.is_gpu() {
                    take(u, GpuAsk::Whole, 1);
                } else if let Some(profile) = device.mig_profile() {
                    take(u, GpuAsk::Mig(profile.to_string()), 1);
                }
            }
            continue;
        }
        for sub in claim.requests.iter().filter_map(|r| r.alternatives.first()) {
            if let (AllocationMode::ExactCount(n), Some(ask)) = (sub.mode, sub.gpu_ask()) {
                take(u, ask, u64::from(n));
            }
        }
    }
    eq
}

/// The GPU form of a demand, for workload-class policies.
pub fn form_of(gpu: &GpuDemand) -> Option<GpuForm> {
    match gpu {
        GpuDemand::None => None,
        GpuDemand::Whole { .. } => Some(GpuForm::Whole),
        GpuDemand::Fraction { .. } => Some(GpuForm::Fraction),
        GpuDemand::Mig { .. } => Some(GpuForm::Mig),
        GpuDemand::Shared { .. } => Some(GpuForm::Shared),
    }
}

/// The GPU form a pod asks for through DRA claims (its first GPU request), for workload-class
/// policies: GPUs of a claim with a sharing strategy (time-slicing, MPS) are the shared form.
fn dra_form(w: &Workload) -> Option<GpuForm> {
    let mut asks = w.dra_claims.iter().flat_map(|c| {
        c.requests.iter().filter_map(move |r| Some((c.sharing.is_some(), r.alternatives.first()?.gpu_ask()?)))
    });
    asks.next().map(|(shared, a)| match a {
        _ if shared => GpuForm::Shared,
        GpuAsk::Whole => GpuForm::Whole,
        GpuAsk::Mig(_) => GpuForm::Mig,
    })
}

/// Adds `b` into `a`.
pub fn add(a: &mut Usage, b: &Usage) {
    for (k, v) in b {
        *a.entry(k.clone()).or_default() += v;
    }
}

/// Subtracts `b` from `a` (saturating).
pub fn sub(a: &mut Usage, b: &Usage) {
    for (k, v) in b {
        let e = a.entry(k.clone()).or_default();
        *e = e.saturating_sub(*v);
    }
}

impl Tenants {
    /// Compiles a validated config (quota keys that do not parse are ignored; `validate` reports them).
    pub fn new(config: &TenancyConfig) -> Self {
        let tenants = config
            .tenants
            .iter()
            .map(|t| {
                let quotas = t
                    .quotas
                    .iter()
                    .filter_map(|(key, q)| {
                        let kind = ResourceKind::parse(key)?;
                        let s = kind.scale();
                        let units = |v: f64| (v * s).round().max(0.0) as u64;
                        let quota = Quota {
                            nominal: units(q.nominal),
                            borrowing_limit: q.borrowing_limit.map(units),
                            lending_limit: q.lending_limit.map(units),
                        };
                        Some((kind, quota))
                    })
                    .collect();
                let mut classes = config.workload_classes.clone();
                classes.extend(t.workload_classes.clone());
                Tenant {
                    name: t.name.clone(),
                    cohort: t.cohort.clone(),
                    weight: t.weight,
                    quotas,
                    budget_per_hour: t.budget_per_hour.map(dollars),
                    classes,
                }
            })
            .collect();
        Self { tenants, config: config.clone() }
    }

    /// The tenant owning a pod: the first whose `match` fits (namespace or labels), else the
    /// one named by the pod's tenant (`gpuscale.io/tenant` / queue-name label, or namespace).
    pub fn tenant_of(&self, w: &Workload) -> Option<usize> {
        let namespace = w.id.split('/').next().unwrap_or_default();
        let by_match = self.config.tenants.iter().position(|t| {
            let m = &t.matcher;
            (!m.namespaces.is_empty() && m.namespaces.iter().any(|n| n == namespace))
                || (!m.labels.is_empty() && m.labels.iter().all(|(k, v)| w.labels.get(k) == Some(v)))
        });
        by_match.or_else(|| {
            let named = w.labels.get("gpuscale.io/tenant").or(w.tenant.as_ref())?;
            self.tenants.iter().position(|t| &t.name == named)
        })
    }

    /// A pod's priority: its priority class (label) mapped by `priorityClasses`, else its own.
    pub fn priority_of(&self, w: &Workload) -> i32 {
        PRIORITY_CLASS_LABELS
            .iter()
            .find_map(|l| w.labels.get(*l).and_then(|c| self.config.priority_classes.get(c)))
            .copied()
            .unwrap_or(w.priority)
    }

    /// Checks the workload-class policy: `Err` names the class, the forms it allows and the
    /// form asked for.
    pub fn check_class(&self, tenant: Option<usize>, w: &Workload) -> Result<(), String> {
        let Some(class) = w.labels.get(WORKLOAD_CLASS_LABEL) else { return Ok(()) };
        let Some(form) = form_of(&w.gpu).or_else(|| dra_form(w)) else { return Ok(()) };
        let classes = match tenant {
            Some(t) => &self.tenants[t].classes,
            None => &self.config.workload_classes,
        };
        let Some(allowed) = classes.get(class) else { return Ok(()) };
        if allowed.contains(&form) {
            return Ok(());
        }
        let who = tenant.map(|t| format!("tenant {}: ", self.tenants[t].name)).unwrap_or_default();
        Err(format!(
            "{who}workload class {class} may use only {} GPUs, the pod asks for {} ({})",
            allowed.iter().map(|f| f.as_str()).collect::<Vec<_>>().join("/"),
            form.as_str(),
            w.gpu.describe()
        ))
    }

    /// Indexes of the tenants sharing `t`'s cohort, `t` included.
    pub fn cohort_members(&self, t: usize) -> Vec<usize> {
        match &self.tenants[t].cohort {
            None => vec![t],
            Some(c) => {
                (0..self.tenants.len()).filter(|&i| self.tenants[i].cohort.as_ref() == Some(c)).collect()
            }
        }
    }
}

/// Usage per tenant, kept current as workloads are admitted and evicted.
#[derive(Debug, Clone, PartialEq)]
pub struct Ledger {
    /// Usage of each tenant (same order as [`Tenants::tenants`]).
    pub usage: Vec<Usage>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new(tenants: &Tenants) -> Self {
        Self { usage: vec![Usage::new(); tenants.tenants.len()] }
    }

    /// Usage of the running (bound) pods of a snapshot.
    pub fn from_snapshot(tenants: &Tenants, snapshot: &ClusterSnapshot) -> Self {
        let mut ledger = Self::new(tenants);
        let nodes: HashMap<&str, &Node> = snapshot.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let payers = ClaimPayers::of(&snapshot.workloads);
        for (i, w) in snapshot.workloads.iter().enumerate() {
            let Some(node) = &w.node_name else { continue };
            if let Some(t) = tenants.tenant_of(w) {
                ledger.charge(t, &usage_paid(w, i, nodes.get(node.as_str()).copied(), &payers));
            }
        }
        ledger
    }

    /// Records admitted usage.
    pub fn charge(&mut self, tenant: usize, demand: &Usage) {
        add(&mut self.usage[tenant], demand);
    }

    /// Records released usage (a departure or an eviction).
    pub fn release(&mut self, tenant: usize, demand: &Usage) {
        sub(&mut self.usage[tenant], demand);
    }

    /// Tenant usage of a kind.
    pub fn used(&self, tenant: usize, kind: &ResourceKind) -> u64 {
        self.usage[tenant].get(kind).copied().unwrap_or(0)
    }

    /// How far a tenant is beyond its nominal quota of a kind.
    pub fn borrowed(&self, tenants: &Tenants, tenant: usize, kind: &ResourceKind) -> u64 {
        tenants.tenants[tenant]
            .quotas
            .get(kind)
            .map_or(0, |q| self.used(tenant, kind).saturating_sub(q.nominal))
    }

    /// Whether a tenant uses more than its nominal quota of any kind.
    pub fn is_borrowing(&self, tenants: &Tenants, tenant: usize) -> bool {
        tenants.tenants[tenant].quotas.keys().any(|k| self.borrowed(tenants, tenant, k) > 0)
    }

    /// Cohort balance of a kind if `tenant` used `used_by_tenant`: (borrowed by all members,
    /// unused quota members lend).
    fn cohort_balance(
        &self,
        tenants: &Tenants,
        tenant: usize,
        kind: &ResourceKind,
        used_by_tenant: u64,
    ) -> (u64, u64) {
        let (mut borrowed, mut lendable) = (0u64, 0u64);
        for c in tenants.cohort_members(tenant) {
            let Some(q) = tenants.tenants[c].quotas.get(kind) else { continue };
            let used = if c == tenant { used_by_tenant } else { self.used(c, kind) };
            borrowed += used.saturating_sub(q.nominal);
            lendable += q.lendable_unused(used);
        }
        (borrowed, lendable)
    }

    /// Whether `tenant` may add `demand` now (Kueue's semantics: nominal always; beyond it by
    /// borrowing the cohort's unused lendable quota up to `borrowingLimit`).
    pub fn check(&self, tenants: &Tenants, tenant: usize, demand: &Usage) -> Admission {
        let t = &tenants.tenants[tenant];
        if t.quotas.is_empty() {
            return Admission::Fits;
        }
        let kinds: Vec<&ResourceKind> = demand.iter().filter(|(_, v)| **v > 0).map(|(k, _)| k).collect();
        if !kinds.is_empty() && !kinds.iter().any(|k| t.quotas.contains_key(*k)) {
            return Admission::Exceeds {
                reason: format!(
                    "tenant {} has no quota for {}",
                    t.name,
                    kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(" or ")
                ),
            };
        }
        let mut result = Admission::Fits;
        for kind in kinds {
            let Some(q) = t.quotas.get(kind) else { continue };
            let d = demand[kind];
            let used = self.used(tenant, kind) + d;
            let borrow = used.saturating_sub(q.nominal);
            if let Some(limit) = q.borrowing_limit {
                if borrow > limit {
                    return Admission::Exceeds {
                        reason: format!(
                            "tenant {}: {kind} quota: using {} + {} would exceed nominal {} + borrowing limit {}",
                            t.name,
                            kind.display_amount(self.used(tenant, kind)),
                            kind.display_amount(d),
                            kind.display_amount(q.nominal),
                            kind.display_amount(limit)
                        ),
                    };
                }
            }
            let (borrowed, lendable) = self.cohort_balance(tenants, tenant, kind, used);
            if borrowed <= lendable {
                if borrow > 0 && !matches!(result, Admission::NeedsReclaim { .. }) {
                    result = Admission::Borrows { kind: kind.clone(), amount: borrow };
                }
                continue;
            }
            if borrow == 0 {
                result = Admission::NeedsReclaim { kind: kind.clone(), amount: borrowed - lendable };
                continue;
            }
            let (used_now, asked, nominal) = (
                kind.display_amount(self.used(tenant, kind)),
                kind.display_amount(d),
                kind.display_amount(q.nominal),
            );
            let reason = match t.cohort.as_deref() {
                None => format!(
                    "tenant {}: {kind} quota: using {used_now} + {asked} exceeds nominal {nominal} (no cohort to borrow from)",
                    t.name
                ),
                Some(c) => format!(
                    "tenant {}: {kind} quota: using {used_now} + {asked} exceeds nominal {nominal} and cohort {c} has {} unused quota to lend",
                    t.name,
                    kind.display_amount(lendable.saturating_sub(borrowed - borrow.min(borrowed)))
                ),
            };
            return Admission::Exceeds { reason };
        }
        result
    }

    /// The cohort invariant a ledger built only by admitted workloads keeps: per tenant, usage
    /// within nominal + borrowing limit; per cohort and kind, borrowed within what is lent.
    /// Returns the first violation.
    pub fn violation(&self, tenants: &Tenants) -> Option<String> {
        for (i, t) in tenants.tenants.iter().enumerate() {
            for (kind, q) in &t.quotas {
                let used = self.used(i, kind);
                if q.borrowing_limit.is_some_and(|b| used > q.nominal + b) {
                    return Some(format!(
                        "tenant {} uses {used} of {kind} beyond nominal + borrowing limit",
                        t.name
                    ));
                }
                let (borrowed, lendable) = self.cohort_balance(tenants, i, kind, used);
                if borrowed > lendable {
                    return Some(format!(
                        "cohort of {}: {borrowed} of {kind} borrowed but only {lendable} lent",
                        t.name
                    ));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tenants(yaml: &str) -> Tenants {
        Tenants::new(&TenancyConfig::parse(Path::new("t.yaml"), yaml).unwrap())
    }

    fn gpus(n: u32) -> Usage {
        usage_of(&Workload { gpu: GpuDemand::Whole { count: n }, ..Default::default() }, None)
    }

    const TWO: &str = r#"
cohorts: [{name: c}]
tenants:
  - {name: a, cohort: c, quotas: {nvidia.com/gpu: {nominal: 4, borrowingLimit: 2}}}
  - {name: b, cohort: c, quotas: {nvidia.com/gpu: {nominal: 4, lendingLimit: 3}}}
"#;

    #[test]
    fn nominal_then_borrowing_within_limits() {
        let t = tenants(TWO);
        let mut l = Ledger::new(&t);
        assert_eq!(l.check(&t, 0, &gpus(4)), Admission::Fits);
        l.charge(0, &gpus(4));
        assert_eq!(
            l.check(&t, 0, &gpus(2)),
            Admission::Borrows { kind: ResourceKind::WholeGpu, amount: 2000 }
        );
        // Borrowing limit 2.
        let Admission::Exceeds { reason } = l.check(&t, 0, &gpus(3)) else { panic!() };
        assert!(reason.contains("tenant a") && reason.contains("borrowing limit 2"), "{reason}");
        l.charge(0, &gpus(2));
        assert_eq!(l.violation(&t), None);
        // b wants its nominal back: a must give 1 GPU back (b lends at most 3).
        assert_eq!(l.check(&t, 1, &gpus(2)), Admission::Fits);
        assert_eq!(
            l.check(&t, 1, &gpus(3)),
            Admission::NeedsReclaim { kind: ResourceKind::WholeGpu, amount: 1000 }
        );
    }

    #[test]
    fn lending_limit_caps_what_others_borrow() {
        let t = tenants(
            "cohorts: [{name: c}]\ntenants:\n  - {name: a, cohort: c, quotas: {nvidia.com/gpu: {nominal: 2}}}\n  - {name: b, cohort: c, quotas: {nvidia.com/gpu: {nominal: 4, lendingLimit: 1}}}\n",
        );
        let mut l = Ledger::new(&t);
        l.charge(0, &gpus(2));
        assert!(matches!(l.check(&t, 0, &gpus(1)), Admission::Borrows { .. }));
        let Admission::Exceeds { reason } = l.check(&t, 0, &gpus(2)) else { panic!() };
        assert!(reason.contains("cohort c"), "{reason}");
    }

    #[test]
    fn kinds_and_classes() {
        let t = tenants(
            "tenants:\n  - name: a\n    match: {namespaces: [ml]}\n    quotas: {nvidia.com/mig-3g.20gb: {nominal: 2}}\n    workloadClasses: {training: [whole]}\n",
        );
        let mig = Workload {
            id: "ml/p".into(),
            gpu: GpuDemand::Mig { profile: "3g.20gb".into(), count: 1 },
            ..Default::default()
        };
        assert_eq!(t.tenant_of(&mig), Some(0));
        let u = usage_of(&mig, None);
        assert_eq!(u[&ResourceKind::Mig("3g.20gb".into())], 1000);
        assert_eq!(u[&ResourceKind::GpuEquivalent], 428);
        let l = Ledger::new(&t);
        assert_eq!(l.check(&t, 0, &u), Admission::Fits);
        let Admission::Exceeds { reason } = l.check(&t, 0, &gpus(1)) else { panic!() };
        assert!(reason.contains("no quota for nvidia.com/gpu"), "{reason}");
        let three = usage_of(
            &Workload { gpu: GpuDemand::Mig { profile: "3g.20gb".into(), count: 3 }, ..mig.clone() },
            None,
        );
        let Admission::Exceeds { reason } = l.check(&t, 0, &three) else { panic!() };
        assert!(reason.contains("using 0 + 3 exceeds nominal 2 (no cohort to borrow from)"), "{reason}");
        let mut trainer = mig.clone();
        trainer.labels.insert(WORKLOAD_CLASS_LABEL.into(), "training".into());
        let e = t.check_class(Some(0), &trainer).unwrap_err();
        assert!(e.contains("workload class training may use only whole GPUs") && e.contains("mig"), "{e}");
        trainer.gpu = GpuDemand::Whole { count: 8 };
        assert!(t.check_class(Some(0), &trainer).is_ok());
    }
}
