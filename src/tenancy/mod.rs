//! Multi-tenancy: tenants with GPU quotas per kind, cohort borrowing and lending, weighted fair
//! sharing with aging, budget caps, workload-class policies and preemption plans.
//!
//! Pure decision code over snapshots: the planner ([`crate::planner`]) and the multi-tenant
//! replay ([`crate::sim::tenants`]) both use it.

pub mod config;
pub mod fair_share;
pub mod preemption;
pub mod quota;

pub use config::{FairShareMode, GpuForm, PreemptionConfig, ResourceKind, TenancyConfig, TenantConfig};
pub use fair_share::{jain_index, Claim};
pub use preemption::{Choice, Decision, RunningPod, VictimSet};
pub use quota::{usage_of, usage_paid, Admission, ClaimPayers, Ledger, Tenant, Tenants, Usage};
