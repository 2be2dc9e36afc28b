//! GCP provider: zonal managed instance groups (MIGs) through the official Compute Engine client
//! (`google-cloud-compute-v1`, REST).
//!
//! * `refresh` lists the MIGs of each configured zone (filtered by name prefix and by labels of
//!   their instance template), reads each MIG's instance template and machine type (GPU count
//!   and model from the bundled accelerators of a2/a3/g2 machine types or the template's
//!   `guestAccelerators`), and its managed instances with their current action, status and
//!   last creation errors.
//! * `set_target_size` resizes a MIG (no call when it is already at the target) and waits for
//!   the zone operation.
//! * `delete_instances` checks membership, then calls `deleteInstances`, which also lowers the
//!   MIG's target size, and waits for the zone operation.
//!
//! MIGs have no min/max size of their own (only an autoscaler has), so bounds come from
//! `gpuscale-min=N` / `gpuscale-max=N` tokens in the MIG's description, else from the
//! `gpuscale-min` / `gpuscale-max` labels of its instance template, else from
//! [`GcpSettings::default_min_size`] / [`GcpSettings::default_max_size`].
//!
//! Prices are not known here (0, with a warning); a price catalog fills them later.

mod error;
pub mod facts;

pub use error::GcpError;

use crate::model::{CapacityType, ErrorClass, Instance, NodeGroup};
use crate::providers::{BoxError, CloudProvider, ProviderError};
use facts::{MachineFacts, ManagedInstanceFacts, Scope, TemplateFacts};
use google_cloud_auth::credentials::{self, Credentials};
use google_cloud_compute_v1::client::{
    InstanceGroupManagers, InstanceTemplates, MachineTypes, ZoneOperations,
};
use google_cloud_compute_v1::model::{
    operation, InstanceGroupManager, InstanceGroupManagersDeleteInstancesRequest, ManagedInstance, Operation,
};
use google_cloud_gax::error::rpc::StatusDetails;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Largest page the Compute API returns for list calls.
const PAGE_SIZE: u32 = 500;

fn default_operation_timeout_secs() -> u64 {
    300
}

fn default_poll_interval_ms() -> u64 {
    1000
}

/// Configuration of one GCP account (project) whose zonal MIGs the autoscaler manages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpSettings {
    /// Account name used in group ids, logs and metric labels.
    pub account: String,
    /// Project id.
    pub project: String,
    /// Zones whose MIGs are managed, e.g. `us-central1-a`.
    pub zones: Vec<String>,
    /// API endpoint override (an emulator, a private endpoint); default
    /// `https://compute.googleapis.com`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Credentials JSON file (service-account key or authorized user); default: Application
    /// Default Credentials.
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// Send requests without credentials (emulators and test servers only).
    #[serde(default)]
    pub anonymous: bool,
    /// Only MIGs whose name starts with this prefix (e.g. `gke-prod-`).
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// Only MIGs whose instance template carries all these labels.
    #[serde(default)]
    pub label_filter: BTreeMap<String, String>,
    /// Minimum size of MIGs that do not declare `gpuscale-min`.
    #[serde(default)]
    pub default_min_size: u32,
    /// Maximum size of MIGs that do not declare `gpuscale-max`; 0 keeps undeclared MIGs from
    /// growing.
    #[serde(default)]
    pub default_max_size: u32,
    /// How long to wait for a resize or delete operation to finish.
    #[serde(default = "default_operation_timeout_secs")]
    pub operation_timeout_secs: u64,
    /// Pause between operation polls that return unfinished.
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
}

impl GcpSettings {
    /// Settings with defaults for everything but the account, project and zones.
    pub fn new(account: impl Into<String>, project: impl Into<String>, zones: Vec<String>) -> Self {
        Self {
            account: account.into(),
            project: project.into(),
            zones,
            endpoint: None,
            credentials: None,
            anonymous: false,
            name_prefix: None,
            label_filter: BTreeMap::new(),
            default_min_size: 0,
            default_max_size: 0,
            operation_timeout_secs: default_operation_timeout_secs(),
            poll_interval_ms: default_poll_interval_ms(),
        }
    }

    /// The settings of a provider-config account (`provider: gcp`): project, endpoint,
    /// credentials and discovery from the account; the zones are those its node groups declare.
    pub fn from_account(a: &crate::providers::config::AccountConfig) -> Result<Self, GcpError> {
        let bad = |field, problem: String| GcpError::Settings { account: a.name.clone(), field, problem };
        let project =
            a.project.clone().ok_or_else(|| bad("project", "is required for a gcp account".into()))?;
        let zones: BTreeSet<String> = a.node_groups.iter().flat_map(|g| g.zones.iter().cloned()).collect();
        let mut s = Self::new(a.name.clone(), project, zones.into_iter().collect());
        s.endpoint = a.endpoint_url.clone();
        s.credentials = a.credentials.as_ref().and_then(|c| c.service_account_key_file.clone());
        if let Some(d) = &a.discovery {
            s.name_prefix = d.name_prefix.clone();
            s.label_filter = d.tags.clone();
        }
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), GcpError> {
        let bad =
            |field, problem: String| GcpError::Settings { account: self.account.clone(), field, problem };
        let is_name = |s: &str| {
            s.starts_with(|c: char| c.is_ascii_lowercase())
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if self.account.is_empty() || self.account.contains('/') {
            return Err(bad("account", format!("must be non-empty without '/', got {:?}", self.account)));
        }
        if self.project.is_empty() || self.project.contains('/') {
            return Err(bad("project", format!("must be a project id, got {:?}", self.project)));
        }
        if self.zones.is_empty() {
            return Err(bad("zones", "must list at least one zone".into()));
        }
        if let Some(z) = self.zones.iter().find(|z| !is_name(z)) {
            return Err(bad("zones", format!("has the invalid zone name {z:?}")));
        }
        if let Some(p) = &self.name_prefix {
            // MIG names are RFC 1035 labels; a prefix outside that alphabet would also need
            // escaping in the list filter's RE2 expression.
            if !is_name(p) {
                return Err(bad("name_prefix", format!("must match [a-z][-a-z0-9]*, got {p:?}")));
            }
        }
        if self.operation_timeout_secs == 0 {
            return Err(bad("operation_timeout_secs", "must be positive, got 0".into()));
        }
        Ok(())
    }
}

/// The Compute Engine clients of one account.
#[derive(Debug)]
pub struct GcpProvider {
    settings: GcpSettings,
    migs: InstanceGroupManagers,
    templates: InstanceTemplates,
    machine_types: MachineTypes,
    operations: ZoneOperations,
    /// Machine types never change, so their facts are cached for the provider's lifetime.
    machine_cache: Mutex<HashMap<(String, String), MachineFacts>>,
}

fn api_source<E: std::error::Error + Send + Sync + 'static>(
    op: &'static str,
    e: E,
    retryable: bool,
) -> ProviderError {
    ProviderError::Api { op, cause: Box::new(e) as BoxError, retryable }
}

fn invalid(e: GcpError, op: &'static str) -> ProviderError {
    api_source(op, e, false)
}

/// Reasons (`error.errors[].reason`) of a Compute API error response.
fn error_reasons(e: &google_cloud_compute_v1::Error) -> Vec<String> {
    e.status()
        .map(|s| {
            s.details
                .iter()
                .filter_map(|d| match d {
                    StatusDetails::ErrorInfo(info) => Some(info.reason.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn retry_after(e: &google_cloud_compute_v1::Error) -> Option<Duration> {
    e.http_headers()?.get("retry-after")?.to_str().ok()?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Classifies a failed API call: rate limits (429, or 403 `rateLimitExceeded`) are throttling,
/// quota reasons are quota, stockout reasons are capacity, 401/403 are authentication, 5xx and
/// transport failures are retryable.
fn classify_api_error(
    account: &str,
    group: &str,
    op: &'static str,
    e: google_cloud_compute_v1::Error,
) -> ProviderError {
    if e.is_authentication() {
        return ProviderError::Auth { account: account.to_string(), message: format!("{op}: {e}") };
    }
    let code = e.http_status_code();
    let reasons = error_reasons(&e);
    let message = e.status().map(|s| s.message.clone()).unwrap_or_else(|| e.to_string());
    let class = facts::worst_class(reasons.iter().map(String::as_str));
    match (class, code) {
        (ErrorClass::Throttled, _) | (_, Some(429)) => {
            ProviderError::Throttled { retry_after: retry_after(&e) }
        }
        (ErrorClass::Quota, _) => ProviderError::QuotaExceeded(format!("{op}: {message}")),
        (ErrorClass::OutOfCapacity, _) => {
            ProviderError::InsufficientCapacity { group: group.to_string(), message }
        }
        (_, Some(401 | 403)) => ProviderError::Auth {
            account: account.to_string(),
            message: format!("{op}: HTTP {}: {message}", code.unwrap_or_default()),
        },
        (_, Some(c)) if c >= 500 => api_source(op, e, true),
        (_, None) if e.is_io() || e.is_timeout() || e.is_connect() || e.is_transport() => {
            api_source(op, e, true)
        }
        _ => api_source(op, e, false),
    }
}

/// Maps a finished operation to success or a classified error.
fn operation_result(account: &str, group: &str, op: &Operation) -> Result<(), ProviderError> {
    let errors: Vec<(String, String)> = op
        .error
        .iter()
        .flat_map(|e| e.errors.iter())
        .map(|e| (e.code.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect();
    let http = op.http_error_status_code;
    if errors.is_empty() && http.is_none() {
        return Ok(());
    }
    let joined = if errors.is_empty() {
        op.http_error_message.clone().unwrap_or_else(|| format!("HTTP {}", http.unwrap_or_default()))
    } else {
        errors.iter().map(|(c, m)| format!("{c}: {m}")).collect::<Vec<_>>().join("; ")
    };
    let class = facts::worst_class(errors.iter().map(|(c, _)| c.as_str()));
    let detail = || GcpError::Operation {
        operation: op.name.clone().unwrap_or_default(),
        op_type: op.operation_type.clone().unwrap_or_default(),
        target: op.target_link.clone().unwrap_or_default(),
        errors: joined.clone(),
    };
    Err(match (class, http) {
        (ErrorClass::OutOfCapacity, _) => {
            ProviderError::InsufficientCapacity { group: group.to_string(), message: joined }
        }
        (ErrorClass::Quota, _) => ProviderError::QuotaExceeded(joined),
        (ErrorClass::Throttled, _) | (_, Some(429)) => ProviderError::Throttled { retry_after: None },
        (_, Some(401 | 403)) => {
            ProviderError::Auth { account: account.to_string(), message: detail().to_string() }
        }
        (_, Some(c)) if c >= 500 => invalid_retryable(detail()),
        _ => invalid(detail(), "operation"),
    })
}

fn invalid_retryable(e: GcpError) -> ProviderError {
    api_source("operation", e, true)
}

fn credentials_from(settings: &GcpSettings) -> Result<Credentials, ProviderError> {
    let auth_err = |message: String| ProviderError::Auth { account: settings.account.clone(), message };
    if settings.anonymous {
        return Ok(credentials::anonymous::Builder::new().build());
    }
    let Some(path) = &settings.credentials else {
        return credentials::Builder::default()
            .build()
            .map_err(|e| auth_err(format!("application default credentials: {e}")));
    };
    let file_err =
        |problem: String| auth_err(GcpError::CredentialsFile { path: path.clone(), problem }.to_string());
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| file_err(format!("not JSON: {e}")))?;
    let kind = json.get("type").and_then(|t| t.as_str()).unwrap_or_default().to_string();
    let built = match kind.as_str() {
        "service_account" => credentials::service_account::Builder::new(json).build(),
        "authorized_user" => credentials::user_account::Builder::new(json).build(),
        other => {
            return Err(file_err(format!(
                "field `type` is {other:?}; expected \"service_account\" or \"authorized_user\""
            )))
        }
    };
    built.map_err(|e| file_err(e.to_string()))
}

macro_rules! build_client {
    ($client:ty, $settings:expr, $creds:expr) => {{
        let mut builder = <$client>::builder().with_credentials($creds.clone());
        if let Some(endpoint) = &$settings.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        builder.build().await.map_err(|e| api_source("connect", e, false))?
    }};
}

impl GcpProvider {
    /// Validates the settings, loads credentials and builds the Compute clients. Makes no API
    /// call, so it succeeds offline; bad credentials surface on the first request.
    pub async fn connect(settings: GcpSettings) -> Result<Self, ProviderError> {
        settings.validate().map_err(|e| invalid(e, "connect"))?;
        let creds = credentials_from(&settings)?;
        let migs = build_client!(InstanceGroupManagers, settings, creds);
        let templates = build_client!(InstanceTemplates, settings, creds);
        let machine_types = build_client!(MachineTypes, settings, creds);
        let operations = build_client!(ZoneOperations, settings, creds);
        info!(
            account = %settings.account,
            project = %settings.project,
            zones = ?settings.zones,
            endpoint = settings.endpoint.as_deref().unwrap_or("default"),
            "connected GCP provider"
        );
        Ok(Self {
            settings,
            migs,
            templates,
            machine_types,
            operations,
            machine_cache: Mutex::new(HashMap::new()),
        })
    }

    /// The settings this provider was built with.
    pub fn settings(&self) -> &GcpSettings {
        &self.settings
    }

    fn api_error(&self, group: &str, op: &'static str, e: google_cloud_compute_v1::Error) -> ProviderError {
        classify_api_error(&self.settings.account, group, op, e)
    }

    fn name_matches(&self, name: &str) -> bool {
        self.settings.name_prefix.as_deref().is_none_or(|p| name.starts_with(p))
    }

    fn labels_match(&self, template: &TemplateFacts) -> bool {
        self.settings.label_filter.iter().all(|(k, v)| template.labels.get(k) == Some(v))
    }

    /// Zone and MIG name of a group id of this account in a configured zone.
    fn locate<'a>(&self, group: &'a str) -> Result<(&'a str, &'a str), ProviderError> {
        match facts::parse_group_id(&self.settings.account, group) {
            Some((zone, mig)) if self.settings.zones.iter().any(|z| z == zone) && self.name_matches(mig) => {
                Ok((zone, mig))
            }
            _ => Err(ProviderError::GroupNotFound(group.to_string())),
        }
    }

    async fn list_migs(&self, zone: &str) -> Result<Vec<InstanceGroupManager>, ProviderError> {
        let mut out = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut req = self
                .migs
                .list()
                .set_project(&self.settings.project)
                .set_zone(zone)
                .set_max_results(PAGE_SIZE);
            if let Some(prefix) = &self.settings.name_prefix {
                // RE2 full match; the prefix alphabet ([a-z0-9-]) needs no escaping.
                req = req.set_filter(format!("name eq \"{prefix}.*\""));
            }
            if let Some(token) = page_token.take() {
                req = req.set_page_token(token);
            }
            let page = req.send().await.map_err(|e| self.api_error(zone, "instanceGroupManagers.list", e))?;
            out.extend(page.items);
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(t) => page_token = Some(t),
                None => return Ok(out),
            }
        }
    }

    async fn get_mig(
        &self,
        group: &str,
        zone: &str,
        mig: &str,
    ) -> Result<InstanceGroupManager, ProviderError> {
        self.migs
            .get()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_instance_group_manager(mig)
            .send()
            .await
            .map_err(|e| match e.http_status_code() {
                Some(404) => ProviderError::GroupNotFound(group.to_string()),
                _ => self.api_error(group, "instanceGroupManagers.get", e),
            })
    }

    async fn managed_instances(
        &self,
        group: &str,
        zone: &str,
        mig: &str,
    ) -> Result<Vec<ManagedInstance>, ProviderError> {
        let mut out = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut req = self
                .migs
                .list_managed_instances()
                .set_project(&self.settings.project)
                .set_zone(zone)
                .set_instance_group_manager(mig)
                .set_max_results(PAGE_SIZE);
            if let Some(token) = page_token.take() {
                req = req.set_page_token(token);
            }
            let page = req.send().await.map_err(|e| match e.http_status_code() {
                Some(404) => ProviderError::GroupNotFound(group.to_string()),
                _ => self.api_error(group, "instanceGroupManagers.listManagedInstances", e),
            })?;
            out.extend(page.managed_instances);
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(t) => page_token = Some(t),
                None => return Ok(out),
            }
        }
    }

    /// The instance template of a MIG (top-level, else its first version's).
    async fn template_of(
        &self,
        group: &str,
        zone: &str,
        igm: &InstanceGroupManager,
    ) -> Result<TemplateFacts, ProviderError> {
        let mig = igm.name.clone().unwrap_or_default();
        let url = igm
            .instance_template
            .clone()
            .filter(|t| !t.is_empty())
            .or_else(|| {
                igm.versions.iter().find_map(|v| v.instance_template.clone().filter(|t| !t.is_empty()))
            })
            .ok_or_else(|| {
                invalid(
                    GcpError::Response {
                        object: format!("MIG {mig} in {zone}"),
                        field: "instanceTemplate",
                        problem: "is missing (neither the MIG nor its versions name one)".into(),
                    },
                    "instanceTemplates.get",
                )
            })?;
        let parsed = facts::parse_resource_url(&url);
        let (project, name) = match &parsed {
            Some(r) if r.scope == Scope::Global && r.collection == "instanceTemplates" => {
                (r.project.as_str(), r.name.as_str())
            }
            _ => {
                return Err(invalid(
                    GcpError::Response {
                        object: format!("MIG {mig} in {zone}"),
                        field: "instanceTemplate",
                        problem: format!("is {url:?}; only global instance templates are supported"),
                    },
                    "instanceTemplates.get",
                ))
            }
        };
        let t = self
            .templates
            .get()
            .set_project(project)
            .set_instance_template(name)
            .send()
            .await
            .map_err(|e| self.api_error(group, "instanceTemplates.get", e))?;
        let props = t.properties.unwrap_or_default();
        let machine_type = props
            .machine_type
            .as_deref()
            .map(facts::last_segment)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                invalid(
                    GcpError::Response {
                        object: format!("instance template {name}"),
                        field: "properties.machineType",
                        problem: "is missing".into(),
                    },
                    "instanceTemplates.get",
                )
            })?
            .to_string();
        let kube_labels = props
            .metadata
            .iter()
            .flat_map(|m| m.items.iter())
            .find(|i| i.key.as_deref() == Some("kube-labels"))
            .and_then(|i| i.value.as_deref())
            .map(facts::parse_kube_labels)
            .unwrap_or_default();
        let spot = props.scheduling.as_ref().is_some_and(|s| {
            s.preemptible == Some(true)
                || s.provisioning_model.as_ref().and_then(|p| p.name()) == Some("SPOT")
        });
        Ok(TemplateFacts {
            name: name.to_string(),
            machine_type,
            guest_accelerators: props
                .guest_accelerators
                .iter()
                .map(|a| {
                    (
                        facts::last_segment(a.accelerator_type.as_deref().unwrap_or("")).to_string(),
                        a.accelerator_count.unwrap_or(0).max(0) as u32,
                    )
                })
                .collect(),
            labels: props.labels.into_iter().collect(),
            kube_labels,
            spot,
        })
    }

    async fn machine(&self, group: &str, zone: &str, name: &str) -> Result<MachineFacts, ProviderError> {
        let key = (zone.to_string(), name.to_string());
        if let Some(m) = self.machine_cache.lock().expect("machine cache").get(&key) {
            return Ok(m.clone());
        }
        let mt = self
            .machine_types
            .get()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_machine_type(name)
            .send()
            .await
            .map_err(|e| self.api_error(group, "machineTypes.get", e))?;
        let missing = |field| {
            invalid(
                GcpError::Response {
                    object: format!("machine type {name} in {zone}"),
                    field,
                    problem: "is missing or negative".into(),
                },
                "machineTypes.get",
            )
        };
        let facts = MachineFacts {
            name: name.to_string(),
            guest_cpus: mt
                .guest_cpus
                .and_then(|c| u32::try_from(c).ok())
                .ok_or_else(|| missing("guestCpus"))?,
            memory_mib: mt
                .memory_mb
                .and_then(|m| u64::try_from(m).ok())
                .ok_or_else(|| missing("memoryMb"))?,
            accelerators: mt
                .accelerators
                .iter()
                .map(|a| {
                    (
                        a.guest_accelerator_type.clone().unwrap_or_default(),
                        a.guest_accelerator_count.unwrap_or(0).max(0) as u32,
                    )
                })
                .collect(),
            arch: match mt.architecture.as_ref().and_then(|a| a.name()) {
                Some("X86_64") => Some("amd64"),
                Some("ARM64") => Some("arm64"),
                _ => None,
            },
        };
        warn!(
            machine_type = name,
            zone, "no price catalog for GCP machine types yet; pricing the groups at 0"
        );
        self.machine_cache.lock().expect("machine cache").insert(key, facts.clone());
        Ok(facts)
    }

    fn instance_of(&self, zone: &str, mi: &ManagedInstance) -> Option<(String, String)> {
        let url = mi.instance.clone().filter(|u| !u.is_empty());
        let id = match url.as_deref().and_then(facts::parse_resource_url) {
            Some(r) => match r.scope {
                Scope::Zone(z) => facts::provider_id(&r.project, &z, &r.name),
                _ => return None,
            },
            None => facts::provider_id(&self.settings.project, zone, mi.name.as_deref()?),
        };
        let url = url.unwrap_or_else(|| {
            format!(
                "projects/{}/zones/{zone}/instances/{}",
                self.settings.project,
                mi.name.as_deref().unwrap_or_default()
            )
        });
        Some((id, url))
    }

    async fn group_of(
        &self,
        zone: &str,
        igm: InstanceGroupManager,
    ) -> Result<Option<NodeGroup>, ProviderError> {
        let Some(mig) = igm.name.clone().filter(|n| self.name_matches(n)) else {
            return Ok(None);
        };
        let id = facts::group_id(&self.settings.account, zone, &mig);
        let template = match self.template_of(&id, zone, &igm).await {
            Ok(t) => t,
            Err(e @ ProviderError::Api { retryable: false, .. }) => {
                warn!(group = %id, error = %e, "skipping MIG");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if !self.labels_match(&template) {
            debug!(group = %id, "MIG's template does not carry the label filter; skipped");
            return Ok(None);
        }
        let bounds = match facts::bounds(
            &mig,
            igm.description.as_deref(),
            &template.labels,
            self.settings.default_min_size,
            self.settings.default_max_size,
        ) {
            Ok(b) => b,
            Err(e) => {
                warn!(group = %id, error = %e, "skipping MIG with bad size bounds");
                return Ok(None);
            }
        };
        let machine = match self.machine(&id, zone, &template.machine_type).await {
            Ok(m) => m,
            Err(e @ ProviderError::Api { retryable: false, .. }) => {
                warn!(group = %id, error = %e, "skipping MIG whose machine type cannot be read");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let node = match facts::node_template(&id, &mig, zone, &template, &machine) {
            Ok(n) => n,
            Err(e) => {
                warn!(group = %id, error = %e, "skipping MIG whose nodes cannot be described");
                return Ok(None);
            }
        };
        let instances = self
            .managed_instances(&id, zone, &mig)
            .await?
            .iter()
            .filter_map(|mi| {
                let (provider_id, _) = self.instance_of(zone, mi)?;
                let state = facts::instance_state(&ManagedInstanceFacts {
                    current_action: mi.current_action.as_ref().and_then(|a| a.name()).map(str::to_string),
                    instance_status: mi.instance_status.as_ref().and_then(|s| s.name()).map(str::to_string),
                    last_attempt_errors: mi
                        .last_attempt
                        .iter()
                        .flat_map(|a| a.errors.iter())
                        .flat_map(|e| e.errors.iter())
                        .map(|e| (e.code.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
                        .collect(),
                });
                Some(Instance { id: provider_id, state })
            })
            .collect();
        Ok(Some(NodeGroup {
            id,
            account: self.settings.account.clone(),
            instance_type: machine.name.clone(),
            zones: vec![zone.to_string()],
            capacity_type: if template.spot { CapacityType::Spot } else { CapacityType::OnDemand },
            price: 0,
            min_size: bounds.min,
            max_size: bounds.max,
            target_size: igm.target_size.unwrap_or(0).max(0) as u32,
            instances,
            template: node,
        }))
    }

    /// Waits for a zone operation with `zoneOperations.wait` (which returns when the operation
    /// is done or after the server's own cap), polling until the configured timeout.
    async fn wait_operation(&self, group: &str, zone: &str, mut op: Operation) -> Result<(), ProviderError> {
        let timeout = Duration::from_secs(self.settings.operation_timeout_secs);
        let pause = Duration::from_millis(self.settings.poll_interval_ms);
        let start = tokio::time::Instant::now();
        let name = op.name.clone().unwrap_or_default();
        let status_name =
            |op: &Operation| op.status.as_ref().and_then(|s| s.name()).unwrap_or("UNKNOWN").to_string();
        let timed_out = |status: String| {
            api_source(
                "zoneOperations.wait",
                GcpError::OperationTimeout {
                    operation: name.clone(),
                    zone: zone.to_string(),
                    status,
                    waited: timeout,
                },
                true,
            )
        };
        loop {
            if op.status == Some(operation::Status::Done) {
                debug!(group, operation = %name, "operation done");
                return operation_result(&self.settings.account, group, &op);
            }
            if name.is_empty() {
                return Err(invalid(
                    GcpError::Response {
                        object: format!("operation on {group}"),
                        field: "name",
                        problem: "is missing, so the operation cannot be awaited".into(),
                    },
                    "zoneOperations.wait",
                ));
            }
            let remaining = timeout.saturating_sub(start.elapsed());
            if remaining.is_zero() {
                return Err(timed_out(status_name(&op)));
            }
            let call = self
                .operations
                .wait()
                .set_project(&self.settings.project)
                .set_zone(zone)
                .set_operation(&name)
                .send();
            op = match tokio::time::timeout(remaining, call).await {
                Err(_) => return Err(timed_out(status_name(&op))),
                Ok(r) => r.map_err(|e| self.api_error(group, "zoneOperations.wait", e))?,
            };
            if op.status != Some(operation::Status::Done) {
                tokio::time::sleep(pause.min(timeout.saturating_sub(start.elapsed()))).await;
            }
        }
    }
}

impl CloudProvider for GcpProvider {
    fn account(&self) -> &str {
        &self.settings.account
    }

    async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
        let mut groups = Vec::new();
        for zone in &self.settings.zones {
            for igm in self.list_migs(zone).await? {
                if let Some(g) = self.group_of(zone, igm).await? {
                    groups.push(g);
                }
            }
        }
        groups.sort_by(|a, b| a.id.cmp(&b.id));
        debug!(account = %self.settings.account, groups = groups.len(), "refreshed GCP MIGs");
        Ok(groups)
    }

    async fn set_target_size(&self, group: &str, target: u32) -> Result<(), ProviderError> {
        let (zone, mig) = self.locate(group)?;
        let igm = self.get_mig(group, zone, mig).await?;
        let template = self.template_of(group, zone, &igm).await?;
        if !self.labels_match(&template) {
            return Err(ProviderError::GroupNotFound(group.to_string()));
        }
        let b = facts::bounds(
            mig,
            igm.description.as_deref(),
            &template.labels,
            self.settings.default_min_size,
            self.settings.default_max_size,
        )
        .map_err(|e| invalid(e, "instanceGroupManagers.resize"))?;
        if target < b.min || target > b.max {
            return Err(ProviderError::SizeOutOfRange {
                group: group.to_string(),
                target,
                min: b.min,
                max: b.max,
            });
        }
        let current = igm.target_size.unwrap_or(0).max(0) as u32;
        if current == target {
            debug!(group, target, "MIG already at target size; no resize");
            return Ok(());
        }
        let size = i32::try_from(target).map_err(|_| ProviderError::SizeOutOfRange {
            group: group.to_string(),
            target,
            min: b.min,
            max: i32::MAX as u32,
        })?;
        info!(group, from = current, to = target, "resizing MIG");
        let op = self
            .migs
            .resize()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_instance_group_manager(mig)
            .set_size(size)
            .send()
            .await
            .map_err(|e| self.api_error(group, "instanceGroupManagers.resize", e))?;
        self.wait_operation(group, zone, op).await
    }

    async fn delete_instances(&self, group: &str, instances: &[String]) -> Result<(), ProviderError> {
        if instances.is_empty() {
            return Ok(());
        }
        let (zone, mig) = self.locate(group)?;
        let igm = self.get_mig(group, zone, mig).await?;
        if !self.settings.label_filter.is_empty() {
            let template = self.template_of(group, zone, &igm).await?;
            if !self.labels_match(&template) {
                return Err(ProviderError::GroupNotFound(group.to_string()));
            }
        }
        let members: HashMap<String, String> = self
            .managed_instances(group, zone, mig)
            .await?
            .iter()
            .filter_map(|mi| self.instance_of(zone, mi))
            .collect();
        let requested: BTreeSet<&String> = instances.iter().collect();
        let mut urls = Vec::with_capacity(requested.len());
        for id in requested {
            match members.get(id.as_str()) {
                Some(url) => urls.push(url.clone()),
                None => {
                    return Err(ProviderError::InstanceNotFound {
                        group: group.to_string(),
                        instance: id.clone(),
                    })
                }
            }
        }
        info!(group, instances = ?instances, "deleting MIG instances");
        let op = self
            .migs
            .delete_instances()
            .set_project(&self.settings.project)
            .set_zone(zone)
            .set_instance_group_manager(mig)
            .set_body(
                InstanceGroupManagersDeleteInstancesRequest::new()
                    .set_instances(urls)
                    .set_skip_instances_on_validation_error(false),
            )
            .send()
            .await
            .map_err(|e| self.api_error(group, "instanceGroupManagers.deleteInstances", e))?;
        self.wait_operation(group, zone, op).await
    }
}
