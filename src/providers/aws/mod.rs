//! The AWS provider: EC2 Auto Scaling groups as node groups.
//!
//! [`AwsProvider::refresh`] discovers groups by tag (Cluster Autoscaler's
//! `k8s.io/cluster-autoscaler/...` convention) and name prefix, reads each group's instance type
//! from its mixed instances policy, launch template or launch configuration, the type's vCPUs,
//! memory and GPUs from DescribeInstanceTypes, spot prices from DescribeSpotPriceHistory and
//! launch failures from DescribeScalingActivities. Decisions about what those answers mean live
//! in the pure [`mapping`] and [`error`] modules; this file only calls the APIs.

pub mod error;
pub mod events;
pub mod mapping;
pub mod queue;

use crate::model::{CapacityType, ErrorClass, MicroDollarsPerHour, NodeGroup};
use crate::providers::{CloudProvider, ProviderError};
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_autoscaling::types::AutoScalingGroup;
use aws_sdk_ec2::types::InstanceType;
use aws_smithy_types::DateTime;
use mapping::{InstanceTypeFacts, TemplateRef};
use queue::InterruptionQueue;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, SystemTime};
use thiserror::Error;
use tracing::{debug, warn};

pub use error::AwsApiError;

/// One AWS account and region to manage, from the provider config.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AwsSettings {
    /// Account name used in group ids (`aws/<account>/<asg>`), logs and metrics.
    pub account: String,
    /// Region, e.g. `us-east-1`.
    pub region: String,
    /// Shared-config profile to take credentials from instead of the default chain's choice.
    #[serde(default)]
    pub profile: Option<String>,
    /// Role to assume (with the default chain's credentials) for this account.
    #[serde(default)]
    pub role_arn: Option<String>,
    /// External id the role's trust policy demands.
    #[serde(default)]
    pub external_id: Option<String>,
    /// Endpoint override for every service, for emulators such as moto.
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Tags a group must carry to be managed; an empty value matches any value of the key.
    #[serde(default)]
    pub discovery_tags: BTreeMap<String, String>,
    /// Only groups whose name starts with this prefix are managed.
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// Timeout of one API request, in seconds. The SDK does not retry: retries (of throttling,
    /// 5xx and timeouts) are the account's `retry` block, in [`crate::providers::politeness`],
    /// where every attempt passes the account's rate limiter.
    #[serde(default = "default_timeout_secs")]
    pub operation_timeout_secs: u64,
    /// The interruption queue (an SQS queue name or URL), if the account has one.
    #[serde(default)]
    pub interruption_queue: Option<String>,
    /// Fixed credentials that bypass the default chain. Only for tests against emulators;
    /// never read from config files.
    #[serde(skip)]
    pub static_credentials_for_tests: Option<StaticCredentials>,
}

fn default_timeout_secs() -> u64 {
    60
}

impl AwsSettings {
    /// Settings for an account and region with the default discovery tag
    /// (`k8s.io/cluster-autoscaler/enabled`, any value) and everything else defaulted.
    pub fn new(account: impl Into<String>, region: impl Into<String>) -> Self {
        Self {
            account: account.into(),
            region: region.into(),
            profile: None,
            role_arn: None,
            external_id: None,
            endpoint_url: None,
            discovery_tags: BTreeMap::from([("k8s.io/cluster-autoscaler/enabled".to_owned(), String::new())]),
            name_prefix: None,
            operation_timeout_secs: default_timeout_secs(),
            interruption_queue: None,
            static_credentials_for_tests: None,
        }
    }
}

impl AwsSettings {
    /// The settings of a provider-config account (`provider: aws`): region, credentials,
    /// endpoint and discovery come from the account; the rest is defaulted.
    pub fn from_account(a: &crate::providers::config::AccountConfig) -> Result<Self, AwsSettingsError> {
        let region = a.region.clone().ok_or_else(|| AwsSettingsError::Invalid {
            account: a.name.clone(),
            field: "region",
            value: String::new(),
            reason: "an aws account needs a region",
        })?;
        let mut s = Self::new(a.name.clone(), region);
        if let Some(c) = &a.credentials {
            s.profile = c.profile.clone();
            s.role_arn = c.role_arn.clone();
            s.external_id = c.external_id.clone();
        }
        s.endpoint_url = a.endpoint_url.clone();
        s.interruption_queue = a.interruption_queue.clone();
        if let Some(d) = &a.discovery {
            if !d.tags.is_empty() {
                s.discovery_tags = d.tags.clone();
            }
            s.name_prefix = d.name_prefix.clone();
        }
        s.validate()?;
        Ok(s)
    }
}

impl fmt::Debug for AwsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsSettings")
            .field("account", &self.account)
            .field("region", &self.region)
            .field("profile", &self.profile)
            .field("role_arn", &self.role_arn)
            .field("external_id", &self.external_id.as_ref().map(|_| "<set>"))
            .field("endpoint_url", &self.endpoint_url)
            .field("discovery_tags", &self.discovery_tags)
            .field("name_prefix", &self.name_prefix)
            .field("operation_timeout_secs", &self.operation_timeout_secs)
            .field("interruption_queue", &self.interruption_queue)
            .field(
                "static_credentials_for_tests",
                &self.static_credentials_for_tests.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

/// An access key pair (test-only, see [`AwsSettings::static_credentials_for_tests`]).
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token.
    pub session_token: Option<String>,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Settings that cannot work, caught before any call.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AwsSettingsError {
    /// A field has an unusable value.
    #[error("AWS settings of account {account:?}: field {field} = {value:?}: {reason}")]
    Invalid {
        /// Account name.
        account: String,
        /// Field name.
        field: &'static str,
        /// The bad value.
        value: String,
        /// Why it is bad.
        reason: &'static str,
    },
}

impl AwsSettings {
    /// Checks the settings without calling AWS.
    pub fn validate(&self) -> Result<(), AwsSettingsError> {
        let bad = |field, value: &str, reason| {
            Err(AwsSettingsError::Invalid {
                account: self.account.clone(),
                field,
                value: value.to_owned(),
                reason,
            })
        };
        if self.account.is_empty() || self.account.contains('/') {
            return bad("account", &self.account, "must be non-empty and contain no '/'");
        }
        if self.region.is_empty() || !self.region.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return bad("region", &self.region, "must be a region name such as us-east-1");
        }
        if self.discovery_tags.is_empty() && self.name_prefix.as_deref().unwrap_or("").is_empty() {
            return bad(
                "discovery_tags",
                "{}",
                "set discovery tags or a name prefix; refusing to manage every group in the account",
            );
        }
        if let Some(k) = self.discovery_tags.keys().find(|k| k.is_empty()) {
            return bad("discovery_tags", k, "tag keys must be non-empty");
        }
        if let Some(url) = &self.endpoint_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return bad("endpoint_url", url, "must start with http:// or https://");
            }
        }
        if let Some(arn) = &self.role_arn {
            if !arn.starts_with("arn:") {
                return bad("role_arn", arn, "must be an IAM role ARN (arn:aws:iam::...:role/...)");
            }
        }
        if self.external_id.is_some() && self.role_arn.is_none() {
            return bad("external_id", "<set>", "only meaningful with role_arn");
        }
        if self.operation_timeout_secs == 0 {
            return bad("operation_timeout_secs", "0", "must be at least 1");
        }
        Ok(())
    }
}

/// How a group's price was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PriceSource {
    /// The `gpuscale.io/price-on-demand` tag.
    Tag,
    /// DescribeSpotPriceHistory (highest current price over the group's zones).
    SpotHistory,
    /// Unknown: the group's price is 0 until a price catalog fills it in.
    Unknown,
}

/// A discovered group with the raw facts behind its [`NodeGroup`], for price catalogs and
/// diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredGroup {
    /// The node group (price 0 when `price_source` is `Unknown`).
    pub group: NodeGroup,
    /// Where `group.price` came from.
    pub price_source: PriceSource,
    /// Hardware facts of the instance type, when EC2 knew it.
    pub facts: Option<InstanceTypeFacts>,
    /// Current spot price per zone of the group's instance type, in dollars per hour.
    pub spot_prices: BTreeMap<String, f64>,
    /// The latest launch failure, if the latest launch failed.
    pub launch_failure: Option<(ErrorClass, String)>,
}

/// An AWS account's Auto Scaling groups behind the [`CloudProvider`] interface.
#[derive(Debug, Clone)]
pub struct AwsProvider {
    settings: AwsSettings,
    asg: aws_sdk_autoscaling::Client,
    ec2: aws_sdk_ec2::Client,
    queue: Option<InterruptionQueue>,
}

/// Launch template facts: instance type and whether it asks for spot.
type TemplateFacts = (Option<String>, bool);

impl AwsProvider {
    /// Builds SDK clients: credentials from the default chain (environment, shared profile, SSO,
    /// container/instance roles), or the given profile, then an assumed role when `role_arn` is
    /// set; endpoint override for emulators. Credentials are resolved lazily, on the first call.
    pub async fn connect(settings: AwsSettings) -> Result<Self, AwsSettingsError> {
        settings.validate()?;
        let region = Region::new(settings.region.clone());
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(region.clone())
            // One retry layer, ours (`Polite`): SDK retries would multiply its attempts and skip
            // its rate limiter.
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(settings.operation_timeout_secs))
                    .build(),
            );
        if let Some(p) = &settings.profile {
            loader = loader.profile_name(p);
        }
        if let Some(url) = &settings.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some(c) = &settings.static_credentials_for_tests {
            loader = loader.credentials_provider(aws_credential_types::Credentials::new(
                c.access_key_id.clone(),
                c.secret_access_key.clone(),
                c.session_token.clone(),
                None,
                "gpuscale-static-test-credentials",
            ));
        }
        let mut config = loader.load().await;
        if let Some(role) = &settings.role_arn {
            let mut b = aws_config::sts::AssumeRoleProvider::builder(role)
                .session_name(format!("gpuscale-{}", settings.account))
                .region(region)
                .configure(&config);
            if let Some(id) = &settings.external_id {
                b = b.external_id(id);
            }
            let assumed = b.build().await;
            config = config
                .into_builder()
                .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(assumed))
                .build();
        }
        Ok(Self {
            asg: aws_sdk_autoscaling::Client::new(&config),
            ec2: aws_sdk_ec2::Client::new(&config),
            queue: settings
                .interruption_queue
                .as_deref()
                .map(|q| InterruptionQueue::new(&config, &settings.account, q)),
            settings,
        })
    }

    /// The settings this provider was built from.
    pub fn settings(&self) -> &AwsSettings {
        &self.settings
    }

    fn err<E>(
        &self,
        op: &'static str,
        group: &str,
        e: aws_sdk_autoscaling::error::SdkError<E, aws_sdk_autoscaling::config::http::HttpResponse>,
    ) -> ProviderError
    where
        E: aws_sdk_autoscaling::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        error::from_sdk(op, &self.settings.account, group, e)
    }

    /// Managed groups as the API returns them: tag filters server-side, name prefix here.
    async fn describe_groups(&self, names: &[String]) -> Result<Vec<AutoScalingGroup>, ProviderError> {
        let op = "DescribeAutoScalingGroups";
        let mut req = self.asg.describe_auto_scaling_groups();
        if names.is_empty() {
            req = req.set_filters(Some(mapping::discovery_filters(&self.settings.discovery_tags)));
        } else {
            req = req.set_auto_scaling_group_names(Some(names.to_vec()));
        }
        let mut pages = req.into_paginator().send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.err(op, names.first().map_or("", |s| s), e))?;
            out.extend(page.auto_scaling_groups().iter().cloned());
        }
        let prefix = self.settings.name_prefix.as_deref().unwrap_or("");
        // Groups being deleted can no longer be scaled.
        out.retain(|g| {
            g.auto_scaling_group_name().is_some_and(|n| n.starts_with(prefix))
                && g.status() != Some("Delete in progress")
        });
        Ok(out)
    }

    /// One managed group by node-group id or ASG name; [`ProviderError::GroupNotFound`] when
    /// it does not exist or is not managed (wrong tags or prefix).
    async fn managed_group(&self, group: &str) -> Result<AutoScalingGroup, ProviderError> {
        let name = mapping::asg_name(&self.settings.account, group);
        let found = self.describe_groups(&[name.to_owned()]).await?;
        let managed = found.into_iter().find(|g| {
            g.auto_scaling_group_name() == Some(name) && {
                let tags = mapping::tag_map(g.tags());
                self.settings
                    .discovery_tags
                    .iter()
                    .all(|(k, v)| tags.get(k).is_some_and(|have| v.is_empty() || have == v))
            }
        });
        managed.ok_or_else(|| ProviderError::GroupNotFound(group.to_owned()))
    }

    async fn template_facts(&self, t: &TemplateRef, group: &str) -> Result<TemplateFacts, ProviderError> {
        let op = "DescribeLaunchTemplateVersions";
        let req = self
            .ec2
            .describe_launch_template_versions()
            .set_launch_template_id(t.id.clone())
            .set_launch_template_name(if t.id.is_some() { None } else { t.name.clone() })
            .versions(&t.version);
        let out = req.send().await.map_err(|e| error::from_sdk(op, &self.settings.account, group, e))?;
        let Some(data) = out.launch_template_versions().first().and_then(|v| v.launch_template_data()) else {
            warn!(group, template = ?t, "launch template version has no data; instance type unknown");
            return Ok((None, false));
        };
        let spot = data
            .instance_market_options()
            .and_then(|m| m.market_type())
            .is_some_and(|m| m.as_str() == "spot");
        Ok((data.instance_type().map(|t| t.as_str().to_owned()), spot))
    }

    async fn launch_configuration_facts(
        &self,
        name: &str,
        group: &str,
    ) -> Result<TemplateFacts, ProviderError> {
        let out = self
            .asg
            .describe_launch_configurations()
            .launch_configuration_names(name)
            .send()
            .await
            .map_err(|e| self.err("DescribeLaunchConfigurations", group, e))?;
        Ok(out
            .launch_configurations()
            .first()
            .map_or((None, false), |lc| (lc.instance_type().map(str::to_owned), lc.spot_price().is_some())))
    }

    async fn instance_types(
        &self,
        types: &BTreeSet<String>,
    ) -> Result<HashMap<String, InstanceTypeFacts>, ProviderError> {
        let mut out = HashMap::new();
        let list: Vec<&String> = types.iter().collect();
        // DescribeInstanceTypes takes at most 100 types per call.
        for chunk in list.chunks(100) {
            let req = self
                .ec2
                .describe_instance_types()
                .set_instance_types(Some(chunk.iter().map(|t| InstanceType::from(t.as_str())).collect()));
            let mut pages = req.into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = page
                    .map_err(|e| error::from_sdk("DescribeInstanceTypes", &self.settings.account, "", e))?;
                for info in page.instance_types() {
                    if let Some(t) = info.instance_type() {
                        out.insert(t.as_str().to_owned(), mapping::instance_type_facts(info));
                    }
                }
            }
        }
        Ok(out)
    }

    async fn spot_prices(
        &self,
        types: &BTreeSet<String>,
    ) -> Result<BTreeMap<(String, String), f64>, ProviderError> {
        if types.is_empty() {
            return Ok(BTreeMap::new());
        }
        // With a start time of now, the API returns the price in force now in each zone.
        let now = DateTime::from(SystemTime::now());
        let req = self
            .ec2
            .describe_spot_price_history()
            .set_instance_types(Some(types.iter().map(|t| InstanceType::from(t.as_str())).collect()))
            .product_descriptions("Linux/UNIX")
            .product_descriptions("Linux/UNIX (Amazon VPC)")
            .start_time(now);
        let mut pages = req.into_paginator().send();
        let mut history = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| error::from_sdk("DescribeSpotPriceHistory", &self.settings.account, "", e))?;
            history.extend(page.spot_price_history().iter().cloned());
        }
        Ok(mapping::latest_spot_prices(&history))
    }

    async fn launch_failure(&self, name: &str) -> Result<Option<(ErrorClass, String)>, ProviderError> {
        let out = self
            .asg
            .describe_scaling_activities()
            .auto_scaling_group_name(name)
            .max_records(20)
            .send()
            .await
            .map_err(|e| self.err("DescribeScalingActivities", name, e))?;
        Ok(mapping::launch_failure(out.activities()))
    }

    /// Discovers the managed groups with the raw facts behind each [`NodeGroup`].
    pub async fn discover(&self) -> Result<Vec<DiscoveredGroup>, ProviderError> {
        let groups = self.describe_groups(&[]).await?;
        let account = self.settings.account.as_str();

        // Instance type and purchase option of each group.
        let mut template_cache: HashMap<TemplateRef, TemplateFacts> = HashMap::new();
        let mut launch: Vec<(Option<String>, CapacityType)> = Vec::with_capacity(groups.len());
        for g in &groups {
            let name = g.auto_scaling_group_name().unwrap_or("");
            let plan = mapping::launch_plan(g);
            let mut instance_type = plan.override_type.clone();
            let mut spot = plan.policy_capacity == Some(CapacityType::Spot);
            if let Some(t) = &plan.template {
                if instance_type.is_none() || plan.policy_capacity.is_none() {
                    let facts = match template_cache.get(t) {
                        Some(f) => f.clone(),
                        None => {
                            let f = self.template_facts(t, name).await?;
                            template_cache.insert(t.clone(), f.clone());
                            f
                        }
                    };
                    instance_type = instance_type.or(facts.0);
                    spot |= plan.policy_capacity.is_none() && facts.1;
                }
            } else if let Some(lc) = &plan.launch_configuration {
                let (t, lc_spot) = self.launch_configuration_facts(lc, name).await?;
                instance_type = instance_type.or(t);
                spot |= lc_spot;
            }
            if instance_type.is_none() {
                // Attribute-based selection (InstanceRequirements): fall back to what runs.
                instance_type = g.instances().iter().find_map(|i| i.instance_type()).map(str::to_owned);
            }
            if instance_type.is_none() {
                warn!(group = name, "cannot tell the group's instance type (no override, template type, launch configuration or instance); its template node has no resources");
            }
            launch.push((instance_type, if spot { CapacityType::Spot } else { CapacityType::OnDemand }));
        }

        let all_types: BTreeSet<String> = launch.iter().filter_map(|(t, _)| t.clone()).collect();
        let spot_types: BTreeSet<String> =
            launch.iter().filter(|(_, c)| *c == CapacityType::Spot).filter_map(|(t, _)| t.clone()).collect();
        let facts = self.instance_types(&all_types).await?;
        let spot_prices = self.spot_prices(&spot_types).await?;

        let mut out = Vec::with_capacity(groups.len());
        for (g, (instance_type, capacity)) in groups.iter().zip(launch) {
            let name = g.auto_scaling_group_name().unwrap_or("");
            let id = mapping::group_id(account, name);
            let tags = mapping::tag_map(g.tags());
            let zones = g.availability_zones().to_vec();
            let instance_type = instance_type.unwrap_or_default();
            let type_facts = facts.get(&instance_type).cloned();
            if type_facts.is_none() && !instance_type.is_empty() {
                warn!(group = %id, instance_type, "DescribeInstanceTypes does not know the group's instance type");
            }
            let (template, bad_taints) = mapping::template_node(&mapping::TemplateInput {
                group_id: &id,
                instance_type: &instance_type,
                facts: type_facts.as_ref(),
                zones: &zones,
                region: &self.settings.region,
                capacity,
                tags: &tags,
            });
            for b in bad_taints {
                warn!(group = %id, tag = b.key, value = b.value, "ignoring taint tag: value must be `value:Effect` with Effect NoSchedule, PreferNoSchedule or NoExecute");
            }

            let zone_prices: BTreeMap<String, f64> = spot_prices
                .iter()
                .filter(|((t, _), _)| *t == instance_type)
                .map(|((_, z), p)| (z.clone(), *p))
                .collect();
            let (price, price_source) =
                self.price(&id, &tags, capacity, &instance_type, &zones, &spot_prices);

            let desired = g.desired_capacity().unwrap_or(0).max(0);
            let live = g
                .instances()
                .iter()
                .filter(|i| {
                    mapping::instance_state(i.lifecycle_state(), i.health_status())
                        != crate::model::InstanceState::Terminating
                })
                .count();
            // Only a group short of its target can have a launch failure that matters.
            let failure = if live < desired as usize { self.launch_failure(name).await? } else { None };
            if let Some((class, message)) = &failure {
                warn!(group = %id, ?class, message, "the group's latest launch failed");
            }

            let group = NodeGroup {
                id: id.clone(),
                account: account.to_owned(),
                instance_type,
                zones,
                capacity_type: capacity,
                price,
                min_size: g.min_size().unwrap_or(0).max(0) as u32,
                max_size: g.max_size().unwrap_or(0).max(0) as u32,
                target_size: desired as u32,
                instances: mapping::group_instances(g, failure.as_ref()),
                template,
            };
            debug!(group = %id, instance_type = group.instance_type, target = group.target_size, instances = group.instances.len(), "discovered group");
            out.push(DiscoveredGroup {
                group,
                price_source,
                facts: type_facts,
                spot_prices: zone_prices,
                launch_failure: failure,
            });
        }
        Ok(out)
    }

    fn price(
        &self,
        id: &str,
        tags: &BTreeMap<String, String>,
        capacity: CapacityType,
        instance_type: &str,
        zones: &[String],
        spot_prices: &BTreeMap<(String, String), f64>,
    ) -> (MicroDollarsPerHour, PriceSource) {
        if capacity == CapacityType::Spot {
            if let Some(p) = mapping::group_spot_price(spot_prices, instance_type, zones) {
                return (p, PriceSource::SpotHistory);
            }
            warn!(
                group = id,
                instance_type,
                ?zones,
                "no spot price history for the group's instance type in its zones"
            );
        }
        match mapping::tagged_price(tags) {
            Ok(Some(p)) => (p, PriceSource::Tag),
            Ok(None) => {
                warn!(
                    group = id,
                    instance_type,
                    tag = mapping::PRICE_TAG,
                    "no price known for the group; price 0 until a price catalog fills it in"
                );
                (0, PriceSource::Unknown)
            }
            Err(bad) => {
                warn!(
                    group = id,
                    tag = mapping::PRICE_TAG,
                    value = bad,
                    "ignoring price tag: not a non-negative number of dollars per hour; price 0"
                );
                (0, PriceSource::Unknown)
            }
        }
    }
}

impl CloudProvider for AwsProvider {
    fn account(&self) -> &str {
        &self.settings.account
    }

    async fn receive_notices(&self) -> Result<Vec<crate::providers::Delivery>, ProviderError> {
        match &self.queue {
            Some(q) => q.receive().await,
            None => Ok(Vec::new()),
        }
    }

    async fn acknowledge_notices(&self, receipts: &[String]) -> Result<(), ProviderError> {
        match &self.queue {
            Some(q) => q.delete(receipts).await,
            None => Ok(()),
        }
    }

    async fn refresh(&self) -> Result<Vec<NodeGroup>, ProviderError> {
        Ok(self.discover().await?.into_iter().map(|d| d.group).collect())
    }

    /// SetDesiredCapacity without honoring cooldowns, after checking the group's bounds (so an
    /// out-of-range target never reaches AWS) and skipping the call when the target is already
    /// set.
    async fn set_target_size(&self, group: &str, target: u32) -> Result<(), ProviderError> {
        let g = self.managed_group(group).await?;
        let name = g.auto_scaling_group_name().unwrap_or(group).to_owned();
        let min = g.min_size().unwrap_or(0).max(0) as u32;
        let max = g.max_size().unwrap_or(0).max(0) as u32;
        if target < min || target > max {
            return Err(ProviderError::SizeOutOfRange { group: group.to_owned(), target, min, max });
        }
        if g.desired_capacity() == Some(target as i32) {
            debug!(group = name, target, "desired capacity already set");
            return Ok(());
        }
        self.asg
            .set_desired_capacity()
            .auto_scaling_group_name(&name)
            .desired_capacity(target as i32)
            .honor_cooldown(false)
            .send()
            .await
            .map_err(|e| self.err("SetDesiredCapacity", &name, e))?;
        debug!(group = name, target, "set desired capacity");
        Ok(())
    }

    /// TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity for each
    /// instance, after checking that every instance belongs to the group and that the group
    /// stays at or above its minimum. Instances already terminating are skipped, so a retried
    /// call does not shrink the group twice.
    async fn delete_instances(&self, group: &str, instances: &[String]) -> Result<(), ProviderError> {
        if instances.is_empty() {
            return Ok(());
        }
        let g = self.managed_group(group).await?;
        let name = g.auto_scaling_group_name().unwrap_or(group).to_owned();
        let mut ids: Vec<&str> = Vec::new();
        for reference in instances {
            let not_found =
                || ProviderError::InstanceNotFound { group: group.to_owned(), instance: reference.clone() };
            let id = mapping::instance_id_of(reference).ok_or_else(not_found)?;
            let member = g.instances().iter().find(|i| i.instance_id() == Some(id)).ok_or_else(not_found)?;
            if member.lifecycle_state().is_some_and(|s| s.as_str().starts_with("Terminat")) {
                debug!(group = name, instance = id, "already terminating");
                continue;
            }
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let desired = g.desired_capacity().unwrap_or(0).max(0) as u32;
        let min = g.min_size().unwrap_or(0).max(0) as u32;
        let max = g.max_size().unwrap_or(0).max(0) as u32;
        let after = desired.saturating_sub(ids.len() as u32);
        if (ids.len() as u32) > desired || after < min {
            return Err(ProviderError::SizeOutOfRange { group: group.to_owned(), target: after, min, max });
        }
        for id in ids {
            self.asg
                .terminate_instance_in_auto_scaling_group()
                .instance_id(id)
                .should_decrement_desired_capacity(true)
                .send()
                .await
                .map_err(|e| self.err("TerminateInstanceInAutoScalingGroup", &name, e))?;
            debug!(group = name, instance = id, "terminating instance");
        }
        Ok(())
    }
}
