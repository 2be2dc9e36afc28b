//! The configured cloud accounts as one set of providers.
//!
//! [`CloudProvider`] uses `impl Future` returns and is not object safe, so the accounts are held
//! in an enum ([`AnyProvider`]), each wrapped in [`Polite`] for rate limits, retries and the
//! memory of capacity failures that backs groups off.

use crate::model::{ErrorClass, NodeGroup};
use crate::providers::config::{ProviderConfig, ProviderKind};
use crate::providers::politeness::{GroupBackoff, Polite, PolitenessConfig, WriteGate};
use crate::providers::simulated::{SimulatedCloud, SimulationSettings};
use crate::providers::{CloudProvider, Delivery, ProviderError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A simulated cloud shared with whoever drives its clock (the controller or a test harness).
#[derive(Debug, Clone)]
pub struct SharedSim(pub Arc<SimulatedCloud>);

impl CloudProvider for SharedSim {
    fn account(&self) -> &str {
        self.0.account()
    }
    async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
        self.0.refresh().await
    }
    async fn set_target_size(&self, group: &str, target: u32) -> Result<(), ProviderError> {
        self.0.set_target_size(group, target).await
    }
    async fn delete_instances(&self, group: &str, instances: &[String]) -> Result<(), ProviderError> {
        self.0.delete_instances(group, instances).await
    }
}

/// One configured account.
pub enum AnyProvider {
    /// A simulated cloud.
    Simulated(Polite<SharedSim>),
    /// EC2 Auto Scaling groups.
    #[cfg(feature = "aws")]
    Aws(Polite<crate::providers::aws::AwsProvider>),
    /// Compute Engine managed instance groups.
    #[cfg(feature = "gcp")]
    Gcp(Polite<crate::providers::gcp::GcpProvider>),
}

macro_rules! each {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            AnyProvider::Simulated($p) => $e,
            #[cfg(feature = "aws")]
            AnyProvider::Aws($p) => $e,
            #[cfg(feature = "gcp")]
            AnyProvider::Gcp($p) => $e,
        }
    };
}

impl CloudProvider for AnyProvider {
    fn account(&self) -> &str {
        each!(self, p => p.account())
    }
    async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
        each!(self, p => p.refresh().await)
    }
    async fn set_target_size(&self, group: &str, target: u32) -> Result<(), ProviderError> {
        each!(self, p => p.set_target_size(group, target).await)
    }
    async fn delete_instances(&self, group: &str, instances: &[String]) -> Result<(), ProviderError> {
        each!(self, p => p.delete_instances(group, instances).await)
    }
    async fn receive_notices(&self) -> Result<Vec<crate::providers::Delivery>, ProviderError> {
        each!(self, p => p.receive_notices().await)
    }
    async fn acknowledge_notices(&self, receipts: &[String]) -> Result<(), ProviderError> {
        each!(self, p => p.acknowledge_notices(receipts).await)
    }
}

impl AnyProvider {
    /// The group's active backoff.
    pub fn group_backoff(&self, group: &str) -> Option<GroupBackoff> {
        each!(self, p => p.group_backoff(group))
    }
    /// Why the group must not be grown now ([`Polite::unavailable_reason`]).
    pub fn unavailable_reason(&self, group: &str) -> Option<String> {
        each!(self, p => p.unavailable_reason(group))
    }
    /// Backs a group off after a failure the cloud did not report (nodes that never came).
    pub fn record_scale_up_failure(&self, group: &str, class: ErrorClass) -> GroupBackoff {
        each!(self, p => p.record_scale_up_failure(group, class))
    }
    /// Clears a group's backoff (its new nodes came up).
    pub fn record_scale_up_success(&self, group: &str) {
        each!(self, p => p.record_scale_up_success(group))
    }
    /// Checks `gate` before every attempt of every write (see [`WriteGate`]).
    pub fn set_write_gate(&self, gate: WriteGate) {
        each!(self, p => p.set_write_gate(gate))
    }
}

/// Setting up an account failed.
#[derive(Debug, thiserror::Error)]
#[error("provider config {file}: account {account}: {message}")]
pub struct ProviderSetupError {
    /// Config file of the account.
    pub file: String,
    /// Account name.
    pub account: String,
    /// What failed.
    pub message: String,
}

/// All configured accounts, and which account owns each group (learnt on refresh).
pub struct ProviderSet {
    providers: Vec<AnyProvider>,
    simulated: Vec<Arc<SimulatedCloud>>,
    owner: Mutex<BTreeMap<String, usize>>,
}

/// The result of refreshing every account.
#[derive(Debug, Default)]
pub struct Refreshed {
    /// Groups of the accounts that answered.
    pub groups: Vec<NodeGroup>,
    /// Accounts that failed, with the error.
    pub failures: Vec<(String, String)>,
}

impl ProviderSet {
    /// Connects to every account of a provider config (simulated accounts get their own
    /// in-memory cloud).
    pub async fn connect(config: &ProviderConfig) -> Result<Self, ProviderSetupError> {
        let mut providers = Vec::new();
        let mut simulated = Vec::new();
        for (a, file) in config.accounts.iter().zip(&config.sources) {
            let err = |message: String| ProviderSetupError {
                file: file.display().to_string(),
                account: a.name.clone(),
                message,
            };
            let polite = PolitenessConfig::from_account(a);
            match a.provider {
                ProviderKind::Simulated => {
                    let settings = a.simulation.as_ref().map(SimulationSettings::from).unwrap_or_default();
                    let sim = Arc::new(SimulatedCloud::new(
                        a.name.clone(),
                        config.node_groups_of(&a.name),
                        settings,
                    ));
                    simulated.push(sim.clone());
                    providers.push(AnyProvider::Simulated(Polite::new(SharedSim(sim), polite)));
                }
                #[cfg(feature = "aws")]
                ProviderKind::Aws => {
                    use crate::providers::aws::{AwsProvider, AwsSettings};
                    let s = AwsSettings::from_account(a).map_err(|e| err(e.to_string()))?;
                    let p = AwsProvider::connect(s).await.map_err(|e| err(e.to_string()))?;
                    providers.push(AnyProvider::Aws(Polite::new(p, polite)));
                }
                #[cfg(feature = "gcp")]
                ProviderKind::Gcp => {
                    use crate::providers::gcp::{GcpProvider, GcpSettings};
                    let s = GcpSettings::from_account(a).map_err(|e| err(e.to_string()))?;
                    let p = GcpProvider::connect(s).await.map_err(|e| err(e.to_string()))?;
                    providers.push(AnyProvider::Gcp(Polite::new(p, polite)));
                }
                #[allow(unreachable_patterns)]
                other => {
                    return Err(err(format!(
                        "provider {other:?} is not compiled into this build (enable its cargo feature)"
                    )))
                }
            }
        }
        Ok(Self { providers, simulated, owner: Mutex::new(BTreeMap::new()) })
    }

    /// A set of simulated clouds driven by someone else (tests).
    pub fn from_simulated(clouds: Vec<Arc<SimulatedCloud>>) -> Self {
        let providers = clouds
            .iter()
            .map(|c| AnyProvider::Simulated(Polite::new(SharedSim(c.clone()), PolitenessConfig::default())))
            .collect();
        Self { providers, simulated: clouds, owner: Mutex::new(BTreeMap::new()) }
    }

    /// Accounts already connected (a provider built against an emulator, in tests).
    pub fn from_providers(providers: Vec<AnyProvider>) -> Self {
        Self { providers, simulated: Vec::new(), owner: Mutex::new(BTreeMap::new()) }
    }

    /// Every account checks `gate` immediately before each attempt of each cloud write, after
    /// any rate-limit wait or retry backoff: the controller passes its leader fence.
    pub fn set_write_gate(&self, gate: WriteGate) {
        for p in &self.providers {
            p.set_write_gate(gate.clone());
        }
    }

    /// The simulated clouds in the set.
    pub fn simulated(&self) -> &[Arc<SimulatedCloud>] {
        &self.simulated
    }

    /// Refreshes every account; an account that fails is reported and its groups left out.
    pub async fn refresh(&self) -> Refreshed {
        let mut out = Refreshed::default();
        let mut owner = BTreeMap::new();
        for (i, p) in self.providers.iter().enumerate() {
            match p.refresh().await {
                Ok(groups) => {
                    for g in &groups {
                        owner.insert(g.id.clone(), i);
                    }
                    out.groups.extend(groups);
                }
                Err(e) => out.failures.push((p.account().to_string(), e.to_string())),
            }
        }
        self.owner.lock().unwrap_or_else(|p| p.into_inner()).extend(owner);
        out
    }

    /// The account that owns a group (known after a refresh that listed it).
    pub fn provider_of(&self, group: &str) -> Option<&AnyProvider> {
        let i = *self.owner.lock().unwrap_or_else(|p| p.into_inner()).get(group)?;
        self.providers.get(i)
    }

    /// Groups that are backing off or whose offerings all failed for capacity, with the reason:
    /// the planner's `unavailable` ([`Polite::unavailable_reason`]).
    pub fn unavailable(&self, groups: &[NodeGroup]) -> BTreeMap<String, String> {
        groups
            .iter()
            .filter_map(|g| Some((g.id.clone(), self.provider_of(&g.id)?.unavailable_reason(&g.id)?)))
            .collect()
    }

    /// The messages waiting in every account's interruption queue, with the account's index. An
    /// account whose queue cannot be read is logged and skipped: its messages wait for the next
    /// pass.
    pub async fn receive_notices(&self) -> Vec<(usize, Delivery)> {
        let mut out = Vec::new();
        for (i, p) in self.providers.iter().enumerate() {
            match p.receive_notices().await {
                Ok(d) => out.extend(d.into_iter().map(|d| (i, d))),
                Err(e) => {
                    tracing::warn!(account = p.account(), error = %e, "the interruption queue could not be read")
                }
            }
        }
        out
    }

    /// Deletes handled messages (`(account index, receipt)`) from their queues. A message not
    /// deleted comes back later and is found handled again.
    pub async fn acknowledge_notices(&self, handled: &[(usize, String)]) {
        for (i, p) in self.providers.iter().enumerate() {
            let receipts: Vec<String> =
                handled.iter().filter(|(a, _)| *a == i).map(|(_, r)| r.clone()).collect();
            if receipts.is_empty() {
                continue;
            }
            if let Err(e) = p.acknowledge_notices(&receipts).await {
                tracing::warn!(account = p.account(), error = %e, "handled interruption messages could not be deleted");
            }
        }
    }

    /// Moves the clocks of the simulated clouds forward.
    pub fn advance_simulated(&self, dt: Duration) {
        for s in &self.simulated {
            s.advance(dt);
        }
    }
}
