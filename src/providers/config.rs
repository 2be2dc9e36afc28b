//! Provider config files: which cloud accounts gpuscale manages and their node groups.
//!
//! YAML, camelCase keys, unknown keys rejected; one or several accounts per file and several
//! files per run. The schema is documented in `examples/providers/README.md`. Everything is
//! validated on load and errors name the file, the field path (e.g.
//! `accounts[0].nodeGroups[2].maxSize`) and the offending value, so a bad config fails at
//! start-up rather than at the first scale-up.

use super::catalog::{self, Cloud, GpuSharing, InstanceSpec};
use crate::model::{dollars, CapacityType, GpuCatalog, NodeGroup, Taint};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The embedded default config (`examples/providers/simulated.yaml`): a simulated AWS account
/// with MIG, H100, time-sliced L4, spot L4, A10G and CPU groups. Used by `gpuscale plan` when no
/// provider config is given.
pub const DEFAULT_SIMULATED_YAML: &str = include_str!("../../examples/providers/simulated.yaml");

/// Which cloud API an account talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// AWS Auto Scaling groups.
    Aws,
    /// GCP managed instance groups.
    Gcp,
    /// The in-memory [`super::simulated::SimulatedCloud`].
    Simulated,
}

impl ProviderKind {
    fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Aws => "aws",
            ProviderKind::Gcp => "gcp",
            ProviderKind::Simulated => "simulated",
        }
    }

    /// Whether the provider can look spot prices up itself (AWS: `DescribeSpotPriceHistory`).
    pub fn supplies_spot_prices(self) -> bool {
        self == ProviderKind::Aws
    }
}

/// One config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFile {
    /// The accounts the file declares.
    pub accounts: Vec<AccountConfig>,
}

/// One cloud account (AWS account + region, GCP project + region, or a simulated cloud).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccountConfig {
    /// Unique name; prefixes group ids (`<account>/<group>`) and labels metrics.
    pub name: String,
    /// Cloud API.
    pub provider: ProviderKind,
    /// AWS region or GCP region.
    #[serde(default)]
    pub region: Option<String>,
    /// GCP project.
    #[serde(default)]
    pub project: Option<String>,
    /// Where credentials come from; the SDK default chain when absent.
    #[serde(default)]
    pub credentials: Option<Credentials>,
    /// API endpoint override (emulators, tests).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Client-side API rate limit.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// Retries of failed API calls.
    #[serde(default)]
    pub retry: Option<RetryConfig>,
    /// Backoff after capacity failures.
    #[serde(default)]
    pub backoff: Option<BackoffConfig>,
    /// Which existing groups to manage.
    #[serde(default)]
    pub discovery: Option<DiscoveryConfig>,
    /// Prices by instance type, overriding the catalog.
    #[serde(default)]
    pub price_overrides: BTreeMap<String, PriceConfig>,
    /// Groups declared statically.
    #[serde(default)]
    pub node_groups: Vec<NodeGroupConfig>,
    /// Behaviour of a simulated cloud.
    #[serde(default)]
    pub simulation: Option<SimulationConfig>,
    /// The SQS queue (name, or URL) that EventBridge fills with the account's spot interruption
    /// warnings, rebalance recommendations, instance state changes and AWS Health scheduled
    /// changes (AWS only; docs/spot.md).
    #[serde(default)]
    pub interruption_queue: Option<String>,
}

/// Credential source. Exactly one of `profile`, `roleArn`, `env` or `serviceAccountKeyFile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credentials {
    /// AWS shared-config profile.
    #[serde(default)]
    pub profile: Option<String>,
    /// AWS role to assume.
    #[serde(default)]
    pub role_arn: Option<String>,
    /// External id for the role (with `roleArn` only).
    #[serde(default)]
    pub external_id: Option<String>,
    /// Take credentials from the environment (`AWS_*`, `GOOGLE_APPLICATION_CREDENTIALS`).
    #[serde(default)]
    pub env: Option<bool>,
    /// GCP service-account key file.
    #[serde(default)]
    pub service_account_key_file: Option<PathBuf>,
}

/// The validated credential source of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// SDK default chain.
    Default,
    /// AWS named profile.
    Profile(String),
    /// AWS assumed role.
    AssumeRole {
        /// Role ARN.
        role_arn: String,
        /// External id.
        external_id: Option<String>,
    },
    /// Environment variables.
    Env,
    /// GCP service-account key file.
    ServiceAccountKeyFile(PathBuf),
}

/// Client-side rate limit of an account's API calls.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per second (may be fractional).
    pub requests_per_second: f64,
    /// Requests allowed in a burst.
    #[serde(default = "one")]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

/// Retries of retryable API failures (throttling, 5xx), full-jitter exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts including the first.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Backoff base in milliseconds.
    #[serde(default = "default_base_ms")]
    pub base_delay_ms: u64,
    /// Backoff cap in milliseconds.
    #[serde(default = "default_cap_ms")]
    pub max_delay_ms: u64,
    /// Seed of the jitter RNG.
    #[serde(default)]
    pub seed: u64,
}

fn default_attempts() -> u32 {
    5
}
fn default_base_ms() -> u64 {
    200
}
fn default_cap_ms() -> u64 {
    20_000
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: default_attempts(),
            base_delay_ms: default_base_ms(),
            max_delay_ms: default_cap_ms(),
            seed: 0,
        }
    }
}

/// How long capacity failures keep an offering or a group out of scale-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackoffConfig {
    /// How long an (instance type, zone, capacity type) stays unavailable after an
    /// insufficient-capacity error.
    #[serde(default = "default_offering_ttl")]
    pub unavailable_offering_seconds: u64,
    /// First backoff of a group after a failed scale-up; doubles per consecutive failure.
    #[serde(default = "default_group_base")]
    pub scale_up_failure_base_seconds: u64,
    /// Longest group backoff.
    #[serde(default = "default_group_max")]
    pub scale_up_failure_max_seconds: u64,
}

fn default_offering_ttl() -> u64 {
    180
}
fn default_group_base() -> u64 {
    60
}
fn default_group_max() -> u64 {
    1800
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            unavailable_offering_seconds: default_offering_ttl(),
            scale_up_failure_base_seconds: default_group_base(),
            scale_up_failure_max_seconds: default_group_max(),
        }
    }
}

/// Which existing cloud groups an account manages besides the declared ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Tags (AWS) or labels (GCP) a group must carry, all of them.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Group-name prefix.
    #[serde(default)]
    pub name_prefix: Option<String>,
}

/// Prices in US dollars per hour.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceConfig {
    /// On-demand price.
    #[serde(default)]
    pub on_demand: Option<f64>,
    /// Spot price.
    #[serde(default)]
    pub spot: Option<f64>,
}

/// A statically declared node group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGroupConfig {
    /// Name, unique in the account (the ASG / MIG name).
    pub name: String,
    /// Instance type / machine type.
    pub instance_type: String,
    /// Specs of a type the embedded catalog lacks.
    #[serde(default)]
    pub instance_spec: Option<InstanceSpecConfig>,
    /// Zones the group launches in.
    #[serde(default)]
    pub zones: Vec<String>,
    /// On-demand or spot.
    #[serde(default)]
    pub capacity_type: CapacityType,
    /// Smallest size.
    #[serde(default)]
    pub min_size: u32,
    /// Largest size.
    pub max_size: u32,
    /// Current desired size (offline plans, simulated clouds); `minSize` when absent.
    #[serde(default)]
    pub target_size: Option<u32>,
    /// Extra node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// GPU sharing mode.
    #[serde(default)]
    pub gpu_sharing: GpuSharing,
    /// The kubelet's pod limit on the group's nodes (e.g. raised by VPC CNI prefix delegation);
    /// default: the instance type's ENI limit on AWS, GKE's 110 on GCP. Registered nodes of the
    /// group, when they all agree, say better.
    #[serde(default)]
    pub max_pods: Option<u32>,
    /// Extended resources the group's nodes advertise besides CPU, memory and GPUs (device
    /// plugins: `vpc.amazonaws.com/efa: 32`, `rdma/ib: 8`), so that pods asking for them scale
    /// this group before any of its nodes has registered.
    #[serde(default)]
    pub extended_resources: BTreeMap<String, u64>,
    /// Price override for this group.
    #[serde(default)]
    pub price: Option<PriceConfig>,
    /// New nodes publish their GPUs through NVIDIA's DRA driver (ResourceSlices of
    /// `gpu.nvidia.com`) instead of the device plugin's `nvidia.com/gpu`: the devices are derived
    /// from the instance type's GPUs (and MIG layout), with these overrides. Registered nodes of
    /// the group that publish slices say better.
    #[serde(default)]
    pub dra: Option<DraConfig>,
}

/// What a group's new nodes publish through DRA, beyond what the catalog derives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraConfig {
    /// Attributes of every device (`driverVersion: "570.124.6"`, `productName: ...`), by
    /// name in the driver's domain or fully qualified; `driverVersion`, `cudaDriverVersion` and
    /// `cudaComputeCapability` are versions.
    #[serde(default)]
    pub attributes: BTreeMap<String, DraAttributeConfig>,
    /// Capacities of every device (`memory: 81559Mi`).
    #[serde(default)]
    pub capacity: BTreeMap<String, String>,
}

/// A DRA attribute value in config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DraAttributeConfig {
    /// `true`/`false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string (or a version, by name).
    Str(String),
}

/// Largest group size a config may declare (a bigger one only makes a plan invent nodes by the
/// million): [`crate::limits::MAX_GROUP_SIZE`].
pub use crate::limits::MAX_GROUP_SIZE;

/// Largest pod limit a group may declare (a kubelet's `maxPods` beyond this is no real node).
pub const MAX_PODS_LIMIT: u32 = 10_000;
/// Largest count of one extended resource a group may declare.
pub const EXTENDED_RESOURCE_LIMIT: u64 = 1_000_000;

/// Specs of an instance type that is not in the embedded catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceSpecConfig {
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in GiB.
    #[serde(rename = "memoryGiB")]
    pub memory_gib: f64,
    /// GPUs.
    #[serde(default)]
    pub gpus: u32,
    /// GPU model (any name [`GpuCatalog::resolve`] knows).
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// Whether GPUs are NVLink-connected.
    #[serde(default)]
    pub nvlink: bool,
    /// EKS pod limit (AWS only); 110 when absent.
    #[serde(default)]
    pub max_pods: Option<u32>,
    /// Prices.
    #[serde(default)]
    pub price: Option<PriceConfig>,
}

/// Behaviour of a simulated cloud.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimulationConfig {
    /// Seconds from launch to Running.
    #[serde(default = "default_boot")]
    pub boot_seconds: u64,
    /// Probability that a launch fails with out-of-capacity.
    #[serde(default)]
    pub capacity_error_rate: f64,
    /// Rate at which each running spot instance is interrupted, per hour.
    #[serde(default)]
    pub spot_interruptions_per_hour: f64,
    /// Most live instances per zone across the account; launches beyond fail out-of-capacity.
    #[serde(default)]
    pub zone_capacity: BTreeMap<String, u32>,
    /// RNG seed.
    #[serde(default)]
    pub seed: u64,
}

fn default_boot() -> u64 {
    120
}

impl Default for SimulationConfig {
    fn default() -> Self {
        Self {
            boot_seconds: default_boot(),
            capacity_error_rate: 0.0,
            spot_interruptions_per_hour: 0.0,
            zone_capacity: BTreeMap::new(),
            seed: 0,
        }
    }
}

/// A config load failure. Messages name the file, the field path and the value.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// No files were given.
    #[error("no provider config files given")]
    NoFiles,
    /// The file could not be read.
    #[error("{file}: cannot read: {cause}")]
    Io {
        /// File.
        file: PathBuf,
        /// Cause (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// The file is not text within the limits (binary, too large, nested too deep).
    #[error("{file}: {reason}")]
    Text {
        /// File.
        file: PathBuf,
        /// What is wrong with it.
        reason: crate::textfile::TextError,
    },
    /// Malformed YAML or a value of the wrong shape.
    #[error("{}: {message}", at(.file, *.line, *.column))]
    Yaml {
        /// File.
        file: PathBuf,
        /// 1-based line (0 when unknown).
        line: usize,
        /// 1-based column (0 when unknown).
        column: usize,
        /// Parser message, including the field path.
        message: String,
    },
    /// The file holds no document.
    #[error("{file}: the file is empty; expected a mapping with `accounts`")]
    Empty {
        /// File.
        file: PathBuf,
    },
    /// A value that parses but is not acceptable.
    #[error("{file}: {field} = {value}: {reason}")]
    Invalid {
        /// File.
        file: PathBuf,
        /// Field path, e.g. `accounts[0].nodeGroups[2].maxSize`.
        field: String,
        /// The offending value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Several problems.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Multiple(Vec<ConfigError>),
}

/// A validated set of accounts from one or more files.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProviderConfig {
    /// The accounts, in file order.
    pub accounts: Vec<AccountConfig>,
    /// The file each account came from.
    pub sources: Vec<PathBuf>,
    groups: Vec<NodeGroup>,
}

/// Reads, parses and validates config files.
pub fn load_files<P: AsRef<Path>>(paths: &[P]) -> Result<ProviderConfig, ConfigError> {
    if paths.is_empty() {
        return Err(ConfigError::NoFiles);
    }
    let mut files = Vec::new();
    for p in paths {
        for path in config_files(p.as_ref())? {
            let file =
                std::fs::File::open(&path).map_err(|cause| ConfigError::Io { file: path.clone(), cause })?;
            let limits = crate::textfile::InputLimits { max_bytes: MAX_CONFIG_BYTES, ..Default::default() };
            let text = crate::textfile::read_text(file, limits)
                .map_err(|reason| ConfigError::Text { file: path.clone(), reason })?;
            files.push((path, text));
        }
    }
    load_strs(&files)
}

use crate::limits::MAX_CONFIG_BYTES;

/// A config path as files: a file, or a folder's `*.yaml`/`*.yml` files in name order.
fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let io = |cause| ConfigError::Io { file: path.to_path_buf(), cause };
    if !std::fs::metadata(path).map_err(io)?.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let p = entry.map_err(io)?.path();
        let ext = p.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        if p.is_file() && matches!(ext.as_deref(), Some("yaml" | "yml")) {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(ConfigError::Invalid {
            file: path.to_path_buf(),
            field: "(folder)".into(),
            value: String::new(),
            reason: "no *.yaml or *.yml provider config files in the folder".into(),
        });
    }
    Ok(files)
}

/// Parses and validates config texts given as `(file name, contents)`; the names appear in errors.
pub fn load_strs<P: AsRef<Path>, S: AsRef<str>>(files: &[(P, S)]) -> Result<ProviderConfig, ConfigError> {
    if files.is_empty() {
        return Err(ConfigError::NoFiles);
    }
    let mut accounts = Vec::new();
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    for (path, text) in files {
        let path = path.as_ref();
        match parse_file(path, text.as_ref()) {
            Ok(file) => {
                for a in file.accounts {
                    accounts.push(a);
                    sources.push(path.to_path_buf());
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(collapse(errors));
    }
    let mut v = Validator { errors: Vec::new(), groups: Vec::new() };
    v.validate(&accounts, &sources);
    if !v.errors.is_empty() {
        return Err(collapse(v.errors));
    }
    Ok(ProviderConfig { accounts, sources, groups: v.groups })
}

fn collapse(mut errors: Vec<ConfigError>) -> ConfigError {
    if errors.len() == 1 {
        errors.remove(0)
    } else {
        ConfigError::Multiple(errors)
    }
}

/// `file:line:column`, or the file alone when the position is unknown (0).
fn at(file: &Path, line: usize, column: usize) -> String {
    if line == 0 {
        file.display().to_string()
    } else {
        format!("{}:{line}:{column}", file.display())
    }
}

impl ConfigError {
    /// A YAML error of `file`: the position leads the message once (serde_yaml also appends
    /// ` at line L column C`, which would repeat it).
    pub fn yaml(file: &Path, e: &serde_yaml::Error) -> Self {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        let message = e.to_string().replacen(&format!(" at line {line} column {column}"), "", 1);
        ConfigError::Yaml { file: file.to_path_buf(), line, column, message }
    }
}

fn parse_file(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
    let yaml_err = |e: serde_yaml::Error| ConfigError::yaml(path, &e);
    // First as a generic value: syntax errors with positions, and empty files (comments only).
    let mut value: serde_yaml::Value = serde_yaml::from_str(text).map_err(yaml_err)?;
    if value.is_null() {
        return Err(ConfigError::Empty { file: path.to_path_buf() });
    }
    // Merge keys (`<<: *defaults`, YAML 1.1) share settings between groups; applying them needs
    // the value, whose errors have no position, so only files that use them take that path.
    let file: ConfigFile = if text.contains("<<") {
        value.apply_merge().map_err(yaml_err)?;
        serde_yaml::from_value(value).map_err(yaml_err)?
    } else {
        serde_yaml::from_str(text).map_err(yaml_err)?
    };
    if file.accounts.is_empty() {
        return Err(ConfigError::Invalid {
            file: path.to_path_buf(),
            field: "accounts".into(),
            value: "[]".into(),
            reason: "the file declares no accounts".into(),
        });
    }
    Ok(file)
}

impl ProviderConfig {
    /// Parses the embedded default config ([`DEFAULT_SIMULATED_YAML`]).
    pub fn embedded_default() -> Result<ProviderConfig, ConfigError> {
        load_strs(&[("<embedded>/simulated.yaml", DEFAULT_SIMULATED_YAML)])
    }

    /// The node groups declared in config: id `<account>/<group>`, template node from the catalog
    /// (or the group's `instanceSpec`), price in micro-dollars per hour, bounds and target size,
    /// no instances.
    pub fn node_groups(&self) -> Vec<NodeGroup> {
        self.groups.clone()
    }

    /// The declared node groups of one account.
    pub fn node_groups_of(&self, account: &str) -> Vec<NodeGroup> {
        self.groups.iter().filter(|g| g.account == account).cloned().collect()
    }

    /// Looks an account up by name.
    pub fn account(&self, name: &str) -> Option<&AccountConfig> {
        self.accounts.iter().find(|a| a.name == name)
    }
}

impl AccountConfig {
    /// The account's credential source (validated on load).
    pub fn credential_source(&self) -> CredentialSource {
        let Some(c) = &self.credentials else {
            return CredentialSource::Default;
        };
        if let Some(p) = &c.profile {
            CredentialSource::Profile(p.clone())
        } else if let Some(r) = &c.role_arn {
            CredentialSource::AssumeRole { role_arn: r.clone(), external_id: c.external_id.clone() }
        } else if let Some(f) = &c.service_account_key_file {
            CredentialSource::ServiceAccountKeyFile(f.clone())
        } else if c.env == Some(true) {
            CredentialSource::Env
        } else {
            CredentialSource::Default
        }
    }

    /// Which cloud the account's custom instance types and templates follow.
    pub fn cloud_flavor(&self) -> Cloud {
        match self.provider {
            ProviderKind::Gcp => Cloud::Gcp,
            ProviderKind::Aws | ProviderKind::Simulated => Cloud::Aws,
        }
    }
}

/// The instance spec a group uses: its `instanceSpec` block, else the catalog entry.
pub fn resolve_spec(
    account: &AccountConfig,
    group: &NodeGroupConfig,
) -> Option<std::borrow::Cow<'static, InstanceSpec>> {
    use std::borrow::Cow;
    if let Some(c) = &group.instance_spec {
        let cloud = account.cloud_flavor();
        return Some(Cow::Owned(InstanceSpec {
            instance_type: group.instance_type.clone(),
            cloud,
            vcpu: c.vcpu,
            memory_mib: (c.memory_gib * 1024.0).round().max(0.0) as u64,
            gpus: c.gpus,
            gpu_model: c
                .gpu_model
                .as_deref()
                .map(|m| GpuCatalog.resolve(m).map_or(m, |s| s.name).to_string()),
            nvlink: c.nvlink,
            on_demand_usd: c.price.and_then(|p| p.on_demand),
            max_pods: (cloud == Cloud::Aws).then_some(c.max_pods.unwrap_or(catalog::DEFAULT_MAX_PODS)),
            accelerator: None,
        }));
    }
    catalog::lookup(&group.instance_type).map(Cow::Borrowed)
}

struct Validator {
    errors: Vec<ConfigError>,
    groups: Vec<NodeGroup>,
}

fn show<T: fmt::Debug>(v: T) -> String {
    format!("{v:?}")
}

/// An SQS queue name (up to 80 letters, digits, `-` and `_`, a FIFO queue's `.fifo` suffix) or a
/// queue URL.
fn is_queue_name_or_url(queue: &str) -> bool {
    if queue.starts_with("https://") || queue.starts_with("http://") {
        return queue.len() <= 2048 && !queue.chars().any(char::is_whitespace);
    }
    let name = queue.strip_suffix(".fifo").unwrap_or(queue);
    (1..=80).contains(&queue.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Validator {
    fn err(&mut self, file: &Path, field: String, value: String, reason: impl Into<String>) {
        self.errors.push(ConfigError::Invalid {
            file: file.to_path_buf(),
            field,
            value,
            reason: reason.into(),
        });
    }

    fn validate(&mut self, accounts: &[AccountConfig], sources: &[PathBuf]) {
        let mut names: BTreeMap<&str, (&Path, usize)> = BTreeMap::new();
        // Index of each account inside its own file, for field paths.
        let mut per_file: BTreeMap<&Path, usize> = BTreeMap::new();
        for (a, file) in accounts.iter().zip(sources) {
            let idx = per_file.entry(file.as_path()).or_insert(0);
            let i = *idx;
            *idx += 1;
            let at = format!("accounts[{i}]");
            if a.name.trim().is_empty() || a.name.contains('/') {
                self.err(
                    file,
                    format!("{at}.name"),
                    show(&a.name),
                    "account names must be non-empty and must not contain '/'",
                );
            } else if let Some((first_file, first_i)) = names.get(a.name.as_str()) {
                let reason = format!(
                    "duplicate account name (first declared in {} at accounts[{first_i}])",
                    first_file.display()
                );
                self.err(file, format!("{at}.name"), show(&a.name), reason);
            } else {
                names.insert(&a.name, (file, i));
            }
            self.account(file, &at, a);
        }
    }

    fn account(&mut self, file: &Path, at: &str, a: &AccountConfig) {
        let kind = a.provider;
        match kind {
            ProviderKind::Aws | ProviderKind::Gcp if a.region.is_none() => {
                self.err(
                    file,
                    format!("{at}.region"),
                    "null".into(),
                    format!("provider {} needs a region", kind.as_str()),
                );
            }
            // A simulated account's region is whatever it says (a fictional `sim-1` too); a real
            // account's is where its API calls go and what its prices are for.
            ProviderKind::Aws | ProviderKind::Gcp => {
                let region = a.region.as_deref().unwrap_or_default();
                if !catalog::is_known_region(a.cloud_flavor(), region) {
                    self.err(
                        file,
                        format!("{at}.region"),
                        show(region),
                        format!(
                            "not a {} region gpuscale knows (for example {})",
                            kind.as_str(),
                            if kind == ProviderKind::Aws {
                                "us-east-1, eu-west-1"
                            } else {
                                "us-central1, europe-west4"
                            }
                        ),
                    );
                }
            }
            _ => {}
        }
        if kind == ProviderKind::Gcp && a.project.as_deref().is_none_or(str::is_empty) {
            self.err(file, format!("{at}.project"), show(&a.project), "provider gcp needs a project");
        }
        if kind != ProviderKind::Gcp && a.project.is_some() {
            self.err(
                file,
                format!("{at}.project"),
                show(&a.project),
                format!("project is a gcp setting, provider is {}", kind.as_str()),
            );
        }
        if kind != ProviderKind::Simulated && a.simulation.is_some() {
            self.err(
                file,
                format!("{at}.simulation"),
                "{...}".into(),
                format!(
                    "simulation settings apply to provider simulated only, provider is {}",
                    kind.as_str()
                ),
            );
        }
        if let Some(queue) = &a.interruption_queue {
            if kind != ProviderKind::Aws {
                self.err(
                    file,
                    format!("{at}.interruptionQueue"),
                    show(queue),
                    format!("the interruption queue is an aws setting, provider is {}", kind.as_str()),
                );
            } else if !is_queue_name_or_url(queue) {
                self.err(
                    file,
                    format!("{at}.interruptionQueue"),
                    show(queue),
                    "must be an SQS queue name (1-80 letters, digits, '-' or '_', '.fifo' allowed) or an https:// queue URL",
                );
            }
        }
        if kind == ProviderKind::Simulated && a.node_groups.is_empty() {
            self.err(
                file,
                format!("{at}.nodeGroups"),
                "[]".into(),
                "a simulated account needs its node groups declared",
            );
        }
        if let Some(url) = &a.endpoint_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                self.err(file, format!("{at}.endpointUrl"), show(url), "must be an http:// or https:// URL");
            }
        }
        if let Some(c) = &a.credentials {
            self.credentials(file, &format!("{at}.credentials"), kind, c);
        }
        if let Some(r) = &a.rate_limit {
            if !(r.requests_per_second.is_finite() && r.requests_per_second > 0.0) {
                self.err(
                    file,
                    format!("{at}.rateLimit.requestsPerSecond"),
                    r.requests_per_second.to_string(),
                    "must be a positive number",
                );
            }
            if r.burst == 0 {
                self.err(file, format!("{at}.rateLimit.burst"), "0".into(), "must be at least 1");
            }
        }
        if let Some(r) = &a.retry {
            if r.max_attempts == 0 {
                self.err(file, format!("{at}.retry.maxAttempts"), "0".into(), "must be at least 1");
            }
            if r.max_delay_ms < r.base_delay_ms {
                self.err(
                    file,
                    format!("{at}.retry.maxDelayMs"),
                    r.max_delay_ms.to_string(),
                    format!("must be at least baseDelayMs ({})", r.base_delay_ms),
                );
            }
        }
        if let Some(b) = &a.backoff {
            if b.scale_up_failure_max_seconds < b.scale_up_failure_base_seconds {
                self.err(
                    file,
                    format!("{at}.backoff.scaleUpFailureMaxSeconds"),
                    b.scale_up_failure_max_seconds.to_string(),
                    format!(
                        "must be at least scaleUpFailureBaseSeconds ({})",
                        b.scale_up_failure_base_seconds
                    ),
                );
            }
        }
        if let Some(s) = &a.simulation {
            if !(0.0..=1.0).contains(&s.capacity_error_rate) {
                self.err(
                    file,
                    format!("{at}.simulation.capacityErrorRate"),
                    s.capacity_error_rate.to_string(),
                    "must be a probability in [0, 1]",
                );
            }
            if !(s.spot_interruptions_per_hour.is_finite() && s.spot_interruptions_per_hour >= 0.0) {
                self.err(
                    file,
                    format!("{at}.simulation.spotInterruptionsPerHour"),
                    s.spot_interruptions_per_hour.to_string(),
                    "must be a non-negative rate",
                );
            }
        }
        for (ty, p) in &a.price_overrides {
            self.price(file, &format!("{at}.priceOverrides.{ty:?}"), p);
        }
        let mut group_names = BTreeSet::new();
        for (gi, g) in a.node_groups.iter().enumerate() {
            let gat = format!("{at}.nodeGroups[{gi}]");
            if g.name.trim().is_empty() || g.name.contains('/') {
                self.err(
                    file,
                    format!("{gat}.name"),
                    show(&g.name),
                    "group names must be non-empty and must not contain '/'",
                );
            } else if !group_names.insert(g.name.as_str()) {
                self.err(
                    file,
                    format!("{gat}.name"),
                    show(&g.name),
                    format!("duplicate node group name in account {:?}", a.name),
                );
            }
            self.group(file, &gat, a, g);
        }
    }

    fn credentials(&mut self, file: &Path, at: &str, kind: ProviderKind, c: &Credentials) {
        let set: Vec<&str> = [
            ("profile", c.profile.is_some()),
            ("roleArn", c.role_arn.is_some()),
            ("env", c.env == Some(true)),
            ("serviceAccountKeyFile", c.service_account_key_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, on)| on.then_some(n))
        .collect();
        if set.len() > 1 {
            self.err(
                file,
                at.to_string(),
                format!("{{{}}}", set.join(", ")),
                "give exactly one of profile, roleArn, env or serviceAccountKeyFile",
            );
        }
        if c.external_id.is_some() && c.role_arn.is_none() {
            self.err(
                file,
                format!("{at}.externalId"),
                show(&c.external_id),
                "externalId is only meaningful with roleArn",
            );
        }
        let aws_only = c.profile.is_some() || c.role_arn.is_some();
        if aws_only && kind != ProviderKind::Aws {
            self.err(
                file,
                at.to_string(),
                set.join(", "),
                format!("profile and roleArn are aws credentials, provider is {}", kind.as_str()),
            );
        }
        if let Some(f) = &c.service_account_key_file {
            if kind != ProviderKind::Gcp {
                self.err(
                    file,
                    format!("{at}.serviceAccountKeyFile"),
                    show(f),
                    format!("serviceAccountKeyFile is a gcp credential, provider is {}", kind.as_str()),
                );
            }
        }
        if let Some(r) = &c.role_arn {
            if !r.starts_with("arn:") {
                self.err(
                    file,
                    format!("{at}.roleArn"),
                    show(r),
                    "must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)",
                );
            }
        }
    }

    fn price(&mut self, file: &Path, at: &str, p: &PriceConfig) {
        for (name, v) in [("onDemand", p.on_demand), ("spot", p.spot)] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    self.err(
                        file,
                        format!("{at}.{name}"),
                        v.to_string(),
                        "prices must be non-negative dollars per hour",
                    );
                } else if v > crate::limits::MAX_PRICE_USD_PER_HOUR {
                    self.err(
                        file,
                        format!("{at}.{name}"),
                        v.to_string(),
                        format!(
                            "more than ${} per hour for one instance (the dearest cost about $400/h): \
                             prices are dollars per instance-hour",
                            crate::limits::MAX_PRICE_USD_PER_HOUR
                        ),
                    );
                }
            }
        }
    }

    fn group(&mut self, file: &Path, at: &str, a: &AccountConfig, g: &NodeGroupConfig) {
        let errors_before = self.errors.len();
        if g.max_size > MAX_GROUP_SIZE {
            self.err(
                file,
                format!("{at}.maxSize"),
                g.max_size.to_string(),
                format!("more nodes than any Kubernetes cluster runs (at most {MAX_GROUP_SIZE})"),
            );
        }
        if g.min_size > g.max_size {
            self.err(
                file,
                format!("{at}.minSize"),
                g.min_size.to_string(),
                format!("minSize is greater than maxSize ({})", g.max_size),
            );
        }
        if let Some(t) = g.target_size {
            if t < g.min_size || t > g.max_size {
                self.err(
                    file,
                    format!("{at}.targetSize"),
                    t.to_string(),
                    format!("outside [minSize, maxSize] = [{}, {}]", g.min_size, g.max_size),
                );
            }
        }
        if g.zones.is_empty() {
            self.err(file, format!("{at}.zones"), "[]".into(), "a node group needs at least one zone");
        }
        // A simulated account may mirror either cloud: catalog types bring theirs. Custom types
        // and real accounts follow the account.
        let cloud = catalog::lookup(&g.instance_type)
            .filter(|_| g.instance_spec.is_none() && a.provider == ProviderKind::Simulated)
            .map_or(a.cloud_flavor(), |s| s.cloud);
        if let Some(region) = &a.region {
            for (zi, z) in g.zones.iter().enumerate() {
                if catalog::region_of_zone(cloud, z) != *region {
                    self.err(
                        file,
                        format!("{at}.zones[{zi}]"),
                        show(z),
                        format!("zone is not in the account's region {region:?}"),
                    );
                }
            }
        }
        if let Some(p) = &g.price {
            self.price(file, &format!("{at}.price"), p);
        }
        if let Some(m) = g.max_pods.filter(|m| !(1..=MAX_PODS_LIMIT).contains(m)) {
            self.err(file, format!("{at}.maxPods"), m.to_string(), format!("must be 1 to {MAX_PODS_LIMIT}"));
        }
        for (name, &count) in &g.extended_resources {
            let field = format!("{at}.extendedResources.{name:?}");
            let why = if !name.contains('/')
                || name.contains("kubernetes.io/")
                || crate::model::names::qualified_name(name).is_err()
            {
                Some(
                    "an extended resource name is a qualified name with a domain, like vpc.amazonaws.com/efa"
                        .into(),
                )
            } else if name.starts_with("nvidia.com/") {
                Some("GPU resources come from the instance type and gpuSharing, not extendedResources".into())
            } else if count == 0 || count > EXTENDED_RESOURCE_LIMIT {
                Some(format!("count must be 1 to {EXTENDED_RESOURCE_LIMIT}"))
            } else {
                None
            };
            if let Some(why) = why {
                self.err(file, field, count.to_string(), why);
            }
        }
        if let Some(s) = &g.instance_spec {
            let sat = format!("{at}.instanceSpec");
            use crate::limits::{MAX_GPUS_PER_NODE, MAX_MEMORY_GIB_PER_NODE, MAX_VCPUS_PER_NODE};
            if !(1..=MAX_VCPUS_PER_NODE).contains(&s.vcpu) {
                self.err(
                    file,
                    format!("{sat}.vcpu"),
                    s.vcpu.to_string(),
                    format!("must be 1 to {MAX_VCPUS_PER_NODE}"),
                );
            }
            if !(s.memory_gib.is_finite() && s.memory_gib > 0.0) {
                self.err(
                    file,
                    format!("{sat}.memoryGiB"),
                    s.memory_gib.to_string(),
                    "must be a positive number of GiB",
                );
            } else if s.memory_gib > MAX_MEMORY_GIB_PER_NODE {
                self.err(
                    file,
                    format!("{sat}.memoryGiB"),
                    s.memory_gib.to_string(),
                    format!("more than {MAX_MEMORY_GIB_PER_NODE} GiB on one instance"),
                );
            }
            if let Some(m) = s.max_pods.filter(|m| !(1..=MAX_PODS_LIMIT).contains(m)) {
                self.err(
                    file,
                    format!("{sat}.maxPods"),
                    m.to_string(),
                    format!("must be 1 to {MAX_PODS_LIMIT}"),
                );
            }
            if s.gpus > MAX_GPUS_PER_NODE {
                self.err(
                    file,
                    format!("{sat}.gpus"),
                    s.gpus.to_string(),
                    format!("more than {MAX_GPUS_PER_NODE} GPUs on one instance; at most {MAX_GPUS_PER_NODE} are planned"),
                );
            }
            match (&s.gpu_model, s.gpus) {
                (Some(m), _) if GpuCatalog.resolve(m).is_none() => {
                    let known: Vec<&str> = GpuCatalog.models().iter().map(|m| m.name).collect();
                    self.err(
                        file,
                        format!("{sat}.gpuModel"),
                        show(m),
                        format!("unknown GPU model (known: {})", known.join(", ")),
                    );
                }
                (Some(m), 0) => self.err(
                    file,
                    format!("{sat}.gpus"),
                    "0".into(),
                    format!("gpuModel {m:?} is set but gpus is 0"),
                ),
                (None, n) if n > 0 => self.err(
                    file,
                    format!("{sat}.gpuModel"),
                    "null".into(),
                    format!("gpus is {n} but no gpuModel is given"),
                ),
                _ => {}
            }
            if let Some(p) = &s.price {
                self.price(file, &format!("{sat}.price"), p);
            }
        }
        if self.errors.len() > errors_before {
            return;
        }
        let Some(spec) = resolve_spec(a, g) else {
            self.err(
                file,
                format!("{at}.instanceType"),
                show(&g.instance_type),
                "unknown instance type: not in the embedded catalog; add an instanceSpec block \
                 (vcpu, memoryGiB, gpus, gpuModel, price)",
            );
            return;
        };
        if g.instance_spec.is_none() && a.provider != ProviderKind::Simulated {
            let flavor = match a.provider {
                ProviderKind::Gcp => Cloud::Gcp,
                _ => Cloud::Aws,
            };
            if spec.cloud != flavor {
                self.err(
                    file,
                    format!("{at}.instanceType"),
                    show(&g.instance_type),
                    format!(
                        "instance type belongs to {:?}, the account's provider is {}",
                        spec.cloud,
                        a.provider.as_str()
                    ),
                );
                return;
            }
        }

        // Price: group price > account override > instanceSpec price > catalog.
        let overrides = a.price_overrides.get(&g.instance_type);
        let spec_price = g.instance_spec.as_ref().and_then(|s| s.price);
        let pick = |f: fn(&PriceConfig) -> Option<f64>| {
            g.price
                .as_ref()
                .and_then(f)
                .or_else(|| overrides.and_then(f))
                .or_else(|| spec_price.as_ref().and_then(f))
        };
        let on_demand = pick(|p| p.on_demand).or(spec.on_demand_usd);
        let spot = pick(|p| p.spot);
        let price = match g.capacity_type {
            CapacityType::OnDemand => on_demand,
            CapacityType::Spot => match spot {
                Some(s) => Some(s),
                // The cloud fills the real price in on refresh; on-demand is the cap a spot price
                // never exceeds, so plans made before that are conservative.
                None if a.provider.supplies_spot_prices() => on_demand,
                None => {
                    self.err(
                        file,
                        format!("{at}.price.spot"),
                        "null".into(),
                        format!(
                            "spot group of {:?} has no spot price: set price.spot or \
                             priceOverrides.{:?}.spot (provider {} cannot supply spot prices)",
                            g.instance_type,
                            g.instance_type,
                            a.provider.as_str()
                        ),
                    );
                    return;
                }
            },
        };
        let Some(price) = price else {
            self.err(
                file,
                format!("{at}.price.onDemand"),
                "null".into(),
                format!(
                    "no on-demand price for {:?}: the catalog has no public price for it; set \
                     price.onDemand or priceOverrides.{:?}.onDemand",
                    g.instance_type, g.instance_type
                ),
            );
            return;
        };

        let zone = g.zones.first().cloned().unwrap_or_default();
        let mut spec = spec;
        if let Some(m) = g.max_pods {
            // On EKS the pod limit also sizes kube-reserved memory.
            spec.to_mut().max_pods = Some(m);
        }
        let mut template = match catalog::template_node(&spec, &zone, &g.labels, &g.taints, &g.gpu_sharing) {
            Ok(t) => t,
            Err(e) => {
                let value = match &g.gpu_sharing {
                    GpuSharing::Mig(l) => show(l),
                    GpuSharing::TimeSlicing { replicas } => {
                        format!("{{timeSlicing: {{replicas: {replicas}}}}}")
                    }
                    GpuSharing::None => "none".into(),
                };
                let field = match &g.gpu_sharing {
                    GpuSharing::Mig(_) => format!("{at}.gpuSharing.mig"),
                    GpuSharing::TimeSlicing { .. } => {
                        format!("{at}.gpuSharing.timeSlicing.replicas")
                    }
                    GpuSharing::None => format!("{at}.gpuSharing"),
                };
                self.err(file, field, value, format!("{e} (instance type {})", g.instance_type));
                return;
            }
        };
        if let Some(dra) = &g.dra {
            if let Err((field, value, reason)) = apply_dra(&mut template, dra) {
                self.err(file, format!("{at}.dra.{field}"), value, reason);
                return;
            }
        }
        let id = format!("{}/{}", a.name, g.name);
        let capacity_labels: &[(&str, &str)] = match (cloud, g.capacity_type) {
            (Cloud::Aws, CapacityType::OnDemand) => &[
                ("eks.amazonaws.com/capacityType", "ON_DEMAND"),
                ("karpenter.sh/capacity-type", "on-demand"),
            ],
            (Cloud::Aws, CapacityType::Spot) => {
                &[("eks.amazonaws.com/capacityType", "SPOT"), ("karpenter.sh/capacity-type", "spot")]
            }
            (Cloud::Gcp, CapacityType::OnDemand) => &[],
            (Cloud::Gcp, CapacityType::Spot) => &[("cloud.google.com/gke-spot", "true")],
        };
        for (k, v) in capacity_labels {
            template.labels.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
        // Whether a pod accepts spot is read from its node selector or required node affinity on
        // these two keys (Karpenter's, which pods written for Karpenter already carry, and
        // gpuscale's own), so every group's template carries both, on every cloud: a pod asking
        // for `on-demand` then fits no spot group and the reverse (docs/spot.md).
        for (k, v) in g.capacity_type.labels() {
            template.labels.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
        // The node-group label the cloud's managed node groups put on their nodes, so that pods
        // selecting a group by it match the group's new nodes.
        let group_label = match cloud {
            Cloud::Gcp => "cloud.google.com/gke-nodepool",
            _ => "eks.amazonaws.com/nodegroup",
        };
        template.labels.entry(group_label.into()).or_insert_with(|| g.name.clone());
        template.labels.entry("gpuscale.io/node-group".into()).or_insert_with(|| g.name.clone());
        template.name = format!("{}-template", id.replace('/', "-"));
        template.node_group = Some(id.clone());
        template.extended_allocatable.extend(g.extended_resources.iter().map(|(k, &v)| (k.clone(), v)));
        self.groups.push(NodeGroup {
            id,
            account: a.name.clone(),
            instance_type: g.instance_type.clone(),
            zones: g.zones.clone(),
            capacity_type: g.capacity_type,
            price: dollars(price),
            min_size: g.min_size,
            max_size: g.max_size,
            target_size: g.target_size.unwrap_or(g.min_size),
            instances: vec![],
            template,
        });
    }
}

/// Makes `template` a node that publishes its GPUs through DRA: the derived devices with the
/// config's overrides, and no device-plugin GPUs. An error names the field.
fn apply_dra(template: &mut crate::model::Node, dra: &DraConfig) -> Result<(), (String, String, String)> {
    use crate::model::cel::{parse_quantity_nanos, AttrValue, Semver};
    use crate::model::dra::NVIDIA_GPU_DRIVER;
    let mut devices = catalog::nvidia_dra_devices(template);
    if devices.is_empty() {
        return Err((
            "".into(),
            "set".into(),
            "the instance type has no GPUs of a known model to publish".into(),
        ));
    }
    let qualify = |n: &str| if n.contains('/') { n.to_string() } else { format!("{NVIDIA_GPU_DRIVER}/{n}") };
    for (name, v) in &dra.attributes {
        let value = match v {
            DraAttributeConfig::Bool(b) => AttrValue::Bool(*b),
            DraAttributeConfig::Int(i) => AttrValue::Int(*i),
            DraAttributeConfig::Str(s)
                if name.ends_with("Version") || name.ends_with("cudaComputeCapability") =>
            {
                let v = Semver::parse(s).ok_or_else(|| {
                    (
                        format!("attributes.{name}"),
                        s.clone(),
                        "a semantic version (major.minor.patch)".to_string(),
                    )
                })?;
                AttrValue::Version(v)
            }
            DraAttributeConfig::Str(s) => AttrValue::Str(s.clone()),
        };
        devices.iter_mut().for_each(|d| {
            d.attributes.insert(qualify(name), value.clone());
        });
    }
    for (name, v) in &dra.capacity {
        let q = parse_quantity_nanos(v).ok_or_else(|| {
            (format!("capacity.{name}"), v.clone(), "a quantity such as 81559Mi".to_string())
        })?;
        devices.iter_mut().for_each(|d| {
            d.capacity.insert(qualify(name), q);
        });
    }
    template.dra.devices = devices;
    template.gpus.clear();
    Ok(())
}
