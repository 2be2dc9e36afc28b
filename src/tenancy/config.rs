//! The `tenancy:` section of the gpuscale config file: tenants, cohorts and their GPU quotas.
//!
//! The vocabulary follows Kueue so that people who run it recognise it: a tenant is a
//! ClusterQueue, tenants of one `cohort` lend each other unused `nominal` quota, a tenant may
//! borrow at most `borrowingLimit` beyond its nominal quota and lends at most `lendingLimit` of
//! its own. Quantities are per GPU kind (see [`ResourceKind`]).

use crate::providers::config::ConfigError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// A kind of GPU capacity a quota can be set on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ResourceKind {
    /// `nvidia.com/gpu`: whole, exclusive GPUs (quantity in GPUs).
    WholeGpu,
    /// `gpu-milli`: fractional and time-sliced shares (quantity in thousandths of a GPU).
    GpuMilli,
    /// `nvidia.com/mig-<profile>`: MIG instances of one profile (quantity in instances).
    Mig(String),
    /// `gpu-equivalent`: every form of GPU demand, in GPUs (a 3g.20gb slice of an A100 is 3/7).
    GpuEquivalent,
}

impl ResourceKind {
    /// Parses a quota key as written in the config.
    pub fn parse(key: &str) -> Option<Self> {
        match key {
            "nvidia.com/gpu" => Some(Self::WholeGpu),
            "gpu-milli" => Some(Self::GpuMilli),
            "gpu-equivalent" => Some(Self::GpuEquivalent),
            _ => key
                .strip_prefix("nvidia.com/mig-")
                .filter(|p| !p.is_empty())
                .map(|p| Self::Mig(p.to_string())),
        }
    }

    /// Internal units per configured unit: quotas are kept in integer milli-units (GPUs and MIG
    /// instances times 1000; `gpu-milli` is already milli).
    pub fn scale(&self) -> f64 {
        match self {
            Self::GpuMilli => 1.0,
            _ => 1000.0,
        }
    }

    /// Converts internal milli-units back to the configured unit, for messages.
    pub fn display_amount(&self, units: u64) -> String {
        let v = units as f64 / self.scale();
        if (v - v.round()).abs() < 1e-9 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WholeGpu => f.write_str("nvidia.com/gpu"),
            Self::GpuMilli => f.write_str("gpu-milli"),
            Self::Mig(p) => write!(f, "nvidia.com/mig-{p}"),
            Self::GpuEquivalent => f.write_str("gpu-equivalent"),
        }
    }
}

/// A form of GPU a workload class may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GpuForm {
    /// Whole, exclusive GPUs.
    Whole,
    /// MIG instances.
    Mig,
    /// Fractional shares (HAMi, KAI, milli-GPU).
    Fraction,
    /// Time-sliced replicas.
    Shared,
}

impl GpuForm {
    /// Config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::Mig => "mig",
            Self::Fraction => "fraction",
            Self::Shared => "shared",
        }
    }
}

/// The whole `tenancy:` section.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TenancyConfig {
    /// Cohorts: tenants of one cohort lend each other unused quota.
    pub cohorts: Vec<CohortConfig>,
    /// Tenants, matched in order; the first whose `match` fits a pod owns it.
    pub tenants: Vec<TenantConfig>,
    /// Priority class name -> priority, for pods labelled `kueue.x-k8s.io/priority-class` or
    /// `gpuscale.io/priority-class` (overrides the pod's own priority).
    pub priority_classes: BTreeMap<String, i32>,
    /// Starvation prevention: waiting raises a pending pod's rank.
    pub starvation: StarvationConfig,
    /// How tenants' shares are compared.
    pub fair_share: FairShareConfig,
    /// Workload class -> GPU forms it may use, for every tenant (a tenant's own map overrides
    /// a class). The class of a pod is its `gpuscale.io/workload-class` label.
    pub workload_classes: BTreeMap<String, Vec<GpuForm>>,
    /// Preemption knobs.
    pub preemption: PreemptionConfig,
}

/// A cohort.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CohortConfig {
    /// Name tenants refer to.
    pub name: String,
}

/// One tenant (a Kueue ClusterQueue).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantConfig {
    /// Name; also matched against a pod's `gpuscale.io/tenant` / `kueue.x-k8s.io/queue-name`.
    pub name: String,
    /// Cohort it borrows from and lends to.
    #[serde(default)]
    pub cohort: Option<String>,
    /// Which pods belong to it.
    #[serde(default, rename = "match")]
    pub matcher: TenantMatch,
    /// Weight in fair sharing (a tenant of weight 2 is entitled to twice the share).
    #[serde(default = "one")]
    pub weight: f64,
    /// Quota per GPU kind (`nvidia.com/gpu`, `gpu-milli`, `nvidia.com/mig-<profile>`,
    /// `gpu-equivalent`). No quotas: the tenant is not limited by quota.
    #[serde(default)]
    pub quotas: BTreeMap<String, QuotaConfig>,
    /// Most dollars per hour the tenant's share of the nodes may cost; scale-ups that would
    /// exceed it are skipped.
    #[serde(default)]
    pub budget_per_hour: Option<f64>,
    /// Workload class -> GPU forms, overriding the section-wide classes for this tenant.
    #[serde(default)]
    pub workload_classes: BTreeMap<String, Vec<GpuForm>>,
}

fn one() -> f64 {
    1.0
}

/// Which pods belong to a tenant: in one of `namespaces`, or carrying all of `labels`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TenantMatch {
    /// Namespaces.
    pub namespaces: Vec<String>,
    /// Labels, all of which must be present with these values.
    pub labels: BTreeMap<String, String>,
}

/// Quota of one GPU kind.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaConfig {
    /// Guaranteed quota.
    pub nominal: f64,
    /// Most the tenant may use beyond `nominal` by borrowing from its cohort; absent = no limit.
    #[serde(default)]
    pub borrowing_limit: Option<f64>,
    /// Most of its `nominal` the tenant lends to its cohort when unused; absent = all of it.
    #[serde(default)]
    pub lending_limit: Option<f64>,
}

/// Starvation prevention.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StarvationConfig {
    /// Seconds of waiting that count as one priority point; 0 disables aging.
    pub aging_seconds_per_priority_point: f64,
}

impl Default for StarvationConfig {
    fn default() -> Self {
        Self { aging_seconds_per_priority_point: 0.0 }
    }
}

/// How tenants' usage is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FairShareConfig {
    /// Share measure.
    pub mode: FairShareMode,
}

/// Share measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FairShareMode {
    /// Weighted dominant-resource fairness over the quota kinds.
    #[default]
    Drf,
    /// Weighted share of GPU-equivalents.
    GpuShare,
}

/// Preemption knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PreemptionConfig {
    /// Whether the planner proposes preemptions at all.
    pub enabled: bool,
    /// Dollar value of one lost GPU-hour of work, to compare evictions with scale-ups.
    pub gpu_hour_value: f64,
    /// Hours a scale-up node is assumed to be paid for when compared with an eviction.
    pub scale_up_horizon_hours: f64,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        Self { enabled: true, gpu_hour_value: 3.0, scale_up_horizon_hours: 1.0 }
    }
}

impl TenancyConfig {
    /// Checks values serde cannot: names, references, quota kinds and ranges. Errors name the
    /// file, the field path (`tenancy.tenants[1].quotas.nvidia.com/gpu.lendingLimit`) and value.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        let mut bad = |field: String, value: String, reason: &str| {
            errors.push(ConfigError::Invalid {
                file: file.to_path_buf(),
                field,
                value,
                reason: reason.into(),
            })
        };
        let mut cohorts = std::collections::BTreeSet::new();
        for (i, c) in self.cohorts.iter().enumerate() {
            if c.name.is_empty() {
                bad(format!("tenancy.cohorts[{i}].name"), "\"\"".into(), "a cohort needs a name");
            } else if !cohorts.insert(c.name.as_str()) {
                bad(format!("tenancy.cohorts[{i}].name"), c.name.clone(), "duplicate cohort name");
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            let at = format!("tenancy.tenants[{i}]");
            if t.name.is_empty() {
                bad(format!("{at}.name"), "\"\"".into(), "a tenant needs a name");
            } else if !names.insert(t.name.as_str()) {
                bad(format!("{at}.name"), t.name.clone(), "duplicate tenant name");
            }
            if let Some(c) = &t.cohort {
                if !cohorts.contains(c.as_str()) {
                    bad(
                        format!("{at}.cohort"),
                        c.clone(),
                        "not one of the cohorts listed under tenancy.cohorts",
                    );
                }
            }
            if !(t.weight.is_finite() && t.weight > 0.0) {
                bad(format!("{at}.weight"), t.weight.to_string(), "must be a positive number");
            }
            if let Some(b) = t.budget_per_hour {
                if !(b.is_finite() && b >= 0.0) {
                    bad(
                        format!("{at}.budgetPerHour"),
                        b.to_string(),
                        "must be zero or more dollars per hour",
                    );
                }
            }
            for (key, q) in &t.quotas {
                let qat = format!("{at}.quotas.{key}");
                if ResourceKind::parse(key).is_none() {
                    bad(
                        qat.clone(),
                        key.clone(),
                        "unknown GPU kind; expected nvidia.com/gpu, gpu-milli, nvidia.com/mig-<profile> or gpu-equivalent",
                    );
                }
                for (name, v) in [("nominal", Some(q.nominal)), ("borrowingLimit", q.borrowing_limit)] {
                    if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                        bad(format!("{qat}.{name}"), v.to_string(), "must be zero or more");
                    }
                }
                if let Some(l) = q.lending_limit {
                    if !(l.is_finite() && l >= 0.0 && l <= q.nominal) {
                        bad(format!("{qat}.lendingLimit"), l.to_string(), "must be between 0 and nominal");
                    }
                }
                if t.cohort.is_none() && q.borrowing_limit.is_some_and(|b| b > 0.0) {
                    bad(
                        format!("{qat}.borrowingLimit"),
                        format!("{:?}", q.borrowing_limit),
                        "borrowing needs a cohort",
                    );
                }
            }
            for (class, forms) in &t.workload_classes {
                if forms.is_empty() {
                    bad(format!("{at}.workloadClasses.{class}"), "[]".into(), "list at least one GPU form");
                }
            }
        }
        for (class, forms) in &self.workload_classes {
            if forms.is_empty() {
                bad(format!("tenancy.workloadClasses.{class}"), "[]".into(), "list at least one GPU form");
            }
        }
        let aging = self.starvation.aging_seconds_per_priority_point;
        if !(aging.is_finite() && aging >= 0.0) {
            bad(
                "tenancy.starvation.agingSecondsPerPriorityPoint".into(),
                aging.to_string(),
                "must be zero (off) or more seconds",
            );
        }
        let p = &self.preemption;
        if !(p.gpu_hour_value.is_finite() && p.gpu_hour_value >= 0.0) {
            bad(
                "tenancy.preemption.gpuHourValue".into(),
                p.gpu_hour_value.to_string(),
                "must be zero or more",
            );
        }
        if !(p.scale_up_horizon_hours.is_finite() && p.scale_up_horizon_hours > 0.0) {
            bad(
                "tenancy.preemption.scaleUpHorizonHours".into(),
                p.scale_up_horizon_hours.to_string(),
                "must be more than zero",
            );
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Multiple(errors)),
        }
    }

    /// Parses and validates a `tenancy:` section on its own (or a whole config file's
    /// `tenancy:` key when the text has one); `path` names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let yaml_err = |e: serde_yaml::Error| ConfigError::yaml(path, &e);
        let mut value: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_err)?;
        if let Some(inner) = value.get("tenancy") {
            value = inner.clone();
        }
        if value.is_null() {
            return Ok(Self::default());
        }
        let config: Self = serde_yaml::from_value(value).map_err(yaml_err)?;
        config.validate(path)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
cohorts: [{name: ml}]
tenants:
  - name: research
    cohort: ml
    match: {namespaces: [research]}
    weight: 2
    quotas:
      nvidia.com/gpu: {nominal: 8, borrowingLimit: 8, lendingLimit: 4}
      nvidia.com/mig-3g.20gb: {nominal: 4}
    budgetPerHour: 120
  - name: prod
    cohort: ml
    match: {labels: {team: prod}}
    quotas: {gpu-equivalent: {nominal: 16}}
    workloadClasses: {inference: [mig, fraction]}
priorityClasses: {high: 1000, low: 10}
starvation: {agingSecondsPerPriorityPoint: 60}
fairShare: {mode: gpuShare}
workloadClasses: {training: [whole]}
"#;

    #[test]
    fn parses_a_kueue_like_section() {
        let c = TenancyConfig::parse(Path::new("t.yaml"), EXAMPLE).unwrap();
        assert_eq!(c.tenants.len(), 2);
        assert_eq!(c.tenants[0].weight, 2.0);
        assert_eq!(c.tenants[1].weight, 1.0);
        assert_eq!(c.tenants[0].quotas["nvidia.com/gpu"].lending_limit, Some(4.0));
        assert_eq!(c.fair_share.mode, FairShareMode::GpuShare);
        assert_eq!(c.workload_classes["training"], vec![GpuForm::Whole]);
        assert_eq!(c.priority_classes["high"], 1000);
        assert!(c.preemption.enabled);
    }

    #[test]
    fn kinds_parse_and_print_back() {
        for k in ["nvidia.com/gpu", "gpu-milli", "gpu-equivalent", "nvidia.com/mig-1g.5gb"] {
            assert_eq!(ResourceKind::parse(k).unwrap().to_string(), k);
        }
        assert_eq!(ResourceKind::parse("nvidia.com/mig-"), None);
        assert_eq!(ResourceKind::parse("amd.com/gpu"), None);
    }

    #[test]
    fn errors_name_file_field_and_value() {
        let p = Path::new("/etc/gpuscale.yaml");
        let e = |t: &str| TenancyConfig::parse(p, t).unwrap_err().to_string();
        let msg = e("tenants: [{name: a, quotas: {nvidia.com/gpu: {nominal: 4, lendingLimit: 6}}}]");
        assert!(
            msg.contains("/etc/gpuscale.yaml: tenancy.tenants[0].quotas.nvidia.com/gpu.lendingLimit = 6"),
            "{msg}"
        );
        let msg = e("tenants: [{name: a, cohort: nope}]");
        assert!(msg.contains("tenancy.tenants[0].cohort = nope"), "{msg}");
        let msg = e("tenants: [{name: a, quotas: {amd.com/gpu: {nominal: 1}}}]");
        assert!(msg.contains("amd.com/gpu") && msg.contains("unknown GPU kind"), "{msg}");
        let msg = e("tenants: [{name: a}, {name: a, weight: 0}]");
        assert!(msg.contains("duplicate tenant name") && msg.contains("tenants[1].weight = 0"), "{msg}");
        let msg = e("tenants: [{name: a, budgetPerHour: -3}]");
        assert!(msg.contains("budgetPerHour = -3"), "{msg}");
        let msg = e("tenants: [{name: a, quota: {}}]");
        assert!(msg.contains("/etc/gpuscale.yaml:") && msg.contains("quota"), "{msg}");
        let msg = e("workloadClasses: {training: [wholes]}");
        assert!(msg.contains("wholes"), "{msg}");
    }
}
