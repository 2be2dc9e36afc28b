//! Pure mappings from Auto Scaling / EC2 API values to the gpuscale model.
//!
//! Everything here is a function of its arguments (no I/O, no clock), so the rules that decide
//! what a group looks like, what it costs and why it failed are unit-tested on SDK-built values.

use crate::model::{
    dollars, CapacityType, ErrorClass, GpuCatalog, GpuDevice, GpuTopology, Instance, InstanceState,
    MicroDollarsPerHour, Node, Resources, Taint, TaintEffect,
};
use aws_sdk_autoscaling::types::{
    Activity, AutoScalingGroup, Filter, InstancesDistribution, LifecycleState, ScalingActivityStatusCode,
    TagDescription,
};
use aws_sdk_ec2::types::{InstanceTypeInfo, SpotPrice};
use aws_smithy_types::DateTime;
use std::collections::BTreeMap;

/// Cluster Autoscaler's tag prefix for node labels of a group's future nodes.
pub const LABEL_TAG_PREFIX: &str = "k8s.io/cluster-autoscaler/node-template/label/";
/// Cluster Autoscaler's tag prefix for node taints (`value:Effect`) of a group's future nodes.
pub const TAINT_TAG_PREFIX: &str = "k8s.io/cluster-autoscaler/node-template/taint/";
/// ASG tag carrying the on-demand price of one instance in dollars per hour.
pub const PRICE_TAG: &str = "gpuscale.io/price-on-demand";

/// Node group id of an ASG: `aws/<account>/<asg-name>`.
pub fn group_id(account: &str, asg_name: &str) -> String {
    format!("aws/{account}/{asg_name}")
}

/// The ASG name in a group reference: a full group id of this account or a bare ASG name.
pub fn asg_name<'a>(account: &str, group: &'a str) -> &'a str {
    group
        .strip_prefix("aws/")
        .and_then(|rest| rest.strip_prefix(account))
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(group)
}

/// Kubernetes provider id of an EC2 instance: `aws:///<az>/<instance-id>`.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// The EC2 instance id in a provider id (`aws:///us-east-1a/i-0abc`, `aws://us-east-1a/i-0abc`)
/// or a bare id (`i-0abc`); `None` when it is neither.
pub fn instance_id_of(reference: &str) -> Option<&str> {
    let id = match reference.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next()?,
        None => reference,
    };
    (id.starts_with("i-") && id.len() > 2 && id[2..].chars().all(|c| c.is_ascii_alphanumeric())).then_some(id)
}

/// DescribeAutoScalingGroups filters selecting the discovery tags: an empty value asks only for
/// the key (`tag-key`), any other value for that exact value (`tag:<key>`).
pub fn discovery_filters(tags: &BTreeMap<String, String>) -> Vec<Filter> {
    tags.iter()
        .map(|(k, v)| {
            if v.is_empty() {
                Filter::builder().name("tag-key").values(k).build()
            } else {
                Filter::builder().name(format!("tag:{k}")).values(v).build()
            }
        })
        .collect()
}

/// An ASG's tags as a map (last value wins for a repeated key, which AWS does not allow anyway).
pub fn tag_map(tags: &[TagDescription]) -> BTreeMap<String, String> {
    tags.iter().filter_map(|t| Some((t.key()?.to_owned(), t.value().unwrap_or("").to_owned()))).collect()
}

/// Node labels from `k8s.io/cluster-autoscaler/node-template/label/<key>` tags.
pub fn template_labels(tags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    tags.iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix(LABEL_TAG_PREFIX)?;
            (!key.is_empty()).then(|| (key.to_owned(), v.clone()))
        })
        .collect()
}

/// A taint tag that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTaintTag {
    /// Full tag key.
    pub key: String,
    /// Tag value as found.
    pub value: String,
}

/// Node taints from `k8s.io/cluster-autoscaler/node-template/taint/<key>` = `value:Effect` tags
/// (Cluster Autoscaler's convention; `:Effect` alone means an empty value). Tags whose effect is
/// not one of Kubernetes' three are returned separately so the caller can warn about them.
pub fn template_taints(tags: &BTreeMap<String, String>) -> (Vec<Taint>, Vec<BadTaintTag>) {
    let mut taints = Vec::new();
    let mut bad = Vec::new();
    for (k, v) in tags {
        let Some(key) = k.strip_prefix(TAINT_TAG_PREFIX) else {
            continue;
        };
        let (value, effect) = v.rsplit_once(':').unwrap_or(("", v.as_str()));
        let effect = match effect {
            "NoSchedule" => Some(TaintEffect::NoSchedule),
            "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
            "NoExecute" => Some(TaintEffect::NoExecute),
            _ => None,
        };
        match effect {
            Some(effect) if !key.is_empty() => {
                taints.push(Taint { key: key.to_owned(), value: value.to_owned(), effect })
            }
            _ => bad.push(BadTaintTag { key: k.clone(), value: v.clone() }),
        }
    }
    (taints, bad)
}

/// On-demand price from the [`PRICE_TAG`] tag: `Ok(None)` without the tag, `Err(value)` when the
/// tag is not a non-negative number of dollars per hour.
pub fn tagged_price(tags: &BTreeMap<String, String>) -> Result<Option<MicroDollarsPerHour>, String> {
    let Some(raw) = tags.get(PRICE_TAG) else {
        return Ok(None);
    };
    match raw.trim().trim_start_matches('$').parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(Some(dollars(p))),
        _ => Err(raw.clone()),
    }
}

/// A launch template reference with the version to read (`$Default` when the ASG names none).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TemplateRef {
    /// Launch template id.
    pub id: Option<String>,
    /// Launch template name.
    pub name: Option<String>,
    /// Version number, `$Latest` or `$Default`.
    pub version: String,
}

/// Where an ASG's instance type and purchase option come from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchPlan {
    /// First instance-type override of a mixed instances policy (the group's primary type).
    pub override_type: Option<String>,
    /// Launch template of the group or of its mixed instances policy.
    pub template: Option<TemplateRef>,
    /// Launch configuration name (legacy groups).
    pub launch_configuration: Option<String>,
    /// Purchase option a mixed instances policy's distribution asks for.
    pub policy_capacity: Option<CapacityType>,
}

/// How an ASG launches instances: mixed instances policy first, then launch template, then
/// launch configuration.
pub fn launch_plan(group: &AutoScalingGroup) -> LaunchPlan {
    let template_ref = |spec: &aws_sdk_autoscaling::types::LaunchTemplateSpecification| TemplateRef {
        id: spec.launch_template_id().map(str::to_owned),
        name: spec.launch_template_name().map(str::to_owned),
        version: spec.version().filter(|v| !v.is_empty()).unwrap_or("$Default").to_owned(),
    };
    let mut plan = LaunchPlan {
        launch_configuration: group.launch_configuration_name().map(str::to_owned),
        template: group.launch_template().map(template_ref),
        ..LaunchPlan::default()
    };
    if let Some(policy) = group.mixed_instances_policy() {
        if let Some(lt) = policy.launch_template() {
            plan.override_type = lt.overrides().iter().find_map(|o| o.instance_type()).map(str::to_owned);
            if let Some(spec) = lt.launch_template_specification() {
                plan.template = Some(template_ref(spec));
            }
        }
        plan.policy_capacity = policy.instances_distribution().map(distribution_capacity);
    }
    plan
}

/// Purchase option of a mixed instances distribution: spot when no on-demand base and 0% of the
/// capacity above it is on-demand (AWS's defaults are a base of 0 and 100% on-demand).
pub fn distribution_capacity(d: &InstancesDistribution) -> CapacityType {
    let base = d.on_demand_base_capacity().unwrap_or(0);
    let above = d.on_demand_percentage_above_base_capacity().unwrap_or(100);
    if base == 0 && above == 0 {
        CapacityType::Spot
    } else {
        CapacityType::OnDemand
    }
}

/// Hardware facts of an instance type from DescribeInstanceTypes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceTypeFacts {
    /// Default vCPUs.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// CPU architecture in Kubernetes' spelling (`amd64`, `arm64`).
    pub arch: Option<String>,
    /// Accelerators, if any.
    pub gpu: Option<GpuFacts>,
}

/// GPUs of an instance type as EC2 reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFacts {
    /// EC2's GPU name (`A100`, `A10G`, `L4`, `H100`).
    pub name: String,
    /// Manufacturer (`NVIDIA`, `AMD`).
    pub manufacturer: String,
    /// Number of GPUs.
    pub count: u32,
    /// Memory per GPU in MiB.
    pub memory_mib: u64,
}

/// Facts of one DescribeInstanceTypes entry.
pub fn instance_type_facts(info: &InstanceTypeInfo) -> InstanceTypeFacts {
    let arch = info.processor_info().and_then(|p| {
        p.supported_architectures()
            .iter()
            .find_map(|a| match a.as_str() {
                "x86_64" => Some("amd64"),
                "arm64" => Some("arm64"),
                _ => None,
            })
            .map(str::to_owned)
    });
    let gpu = info.gpu_info().and_then(|g| {
        let total: u32 = g.gpus().iter().map(|d| d.count().unwrap_or(0).max(0) as u32).sum();
        let first = g.gpus().first()?;
        (total > 0).then(|| GpuFacts {
            name: first.name().unwrap_or("").to_owned(),
            manufacturer: first.manufacturer().unwrap_or("").to_owned(),
            count: total,
            memory_mib: first
                .memory_info()
                .and_then(|m| m.size_in_mib())
                .map(|m| m.max(0) as u64)
                .unwrap_or(0),
        })
    });
    InstanceTypeFacts {
        vcpus: info.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0).max(0) as u32,
        memory_mib: info.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0).max(0) as u64,
        arch,
        gpu,
    }
}

/// Canonical GPU model of EC2's GPU name and per-GPU memory: the name with its memory size
/// first (`A100` with 81920 MiB is an `A100-80GB`), then the name alone.
pub fn canonical_gpu_model(gpu: &GpuFacts) -> Option<&'static str> {
    let catalog = GpuCatalog;
    let gib = gpu.memory_mib.div_ceil(1024);
    let sized = format!("{}-{gib}GB", gpu.name);
    let by_size = catalog.resolve(&sized).filter(|m| {
        // A sized name must not resolve to a model of another size class.
        m.memory_mib == 0 || m.memory_mib.abs_diff(gpu.memory_mib) <= m.memory_mib / 4
    });
    by_size.or_else(|| catalog.resolve(&gpu.name)).map(|m| m.name)
}

/// What a node of the group will look like.
pub struct TemplateInput<'a> {
    /// Group id.
    pub group_id: &'a str,
    /// Instance type.
    pub instance_type: &'a str,
    /// Hardware facts, when DescribeInstanceTypes knew the type.
    pub facts: Option<&'a InstanceTypeFacts>,
    /// The group's zones.
    pub zones: &'a [String],
    /// Region.
    pub region: &'a str,
    /// Purchase option.
    pub capacity: CapacityType,
    /// ASG tags.
    pub tags: &'a BTreeMap<String, String>,
}

/// The template node of a group: the instance type's full vCPU and memory as allocatable (the
/// planner subtracts system reservations), its GPUs with EC2's per-GPU memory, the well-known
/// labels Kubernetes sets plus the group's node-template labels and taints, and the group's first
/// zone (a multi-zone group spreads new nodes, so any one zone is as good a guess).
pub fn template_node(input: &TemplateInput<'_>) -> (Node, Vec<BadTaintTag>) {
    let mut labels = BTreeMap::from([
        ("node.kubernetes.io/instance-type".to_owned(), input.instance_type.to_owned()),
        ("topology.kubernetes.io/region".to_owned(), input.region.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        (
            "eks.amazonaws.com/capacityType".to_owned(),
            match input.capacity {
                CapacityType::OnDemand => "ON_DEMAND",
                CapacityType::Spot => "SPOT",
            }
            .to_owned(),
        ),
    ]);
    for (k, v) in input.capacity.labels() {
        labels.insert(k.to_owned(), v.to_owned());
    }
    let zone = input.zones.first().cloned();
    if let Some(z) = &zone {
        labels.insert("topology.kubernetes.io/zone".to_owned(), z.clone());
    }
    if let Some(arch) = input.facts.and_then(|f| f.arch.as_deref()) {
        labels.insert("kubernetes.io/arch".to_owned(), arch.to_owned());
    }
    labels.extend(template_labels(input.tags));
    let (taints, bad) = template_taints(input.tags);

    let mut node = Node {
        name: format!("template-{}", input.group_id.replace('/', "-")),
        labels: labels.into(),
        taints,
        zone,
        node_group: Some(input.group_id.to_owned()),
        instance_type: Some(input.instance_type.to_owned()),
        ..Node::default()
    };
    if let Some(facts) = input.facts {
        node.allocatable = Resources::new(u64::from(facts.vcpus) * 1000, facts.memory_mib);
        if let Some(gpu) = &facts.gpu {
            let spec = canonical_gpu_model(gpu).and_then(|m| GpuCatalog.resolve(m));
            let memory = if gpu.memory_mib > 0 { gpu.memory_mib } else { spec.map_or(0, |s| s.memory_mib) };
            node.gpu_model = Some(spec.map_or_else(|| gpu.name.clone(), |s| s.name.to_owned()));
            node.gpus = (0..gpu.count.min(u32::from(u8::MAX)))
                .map(|i| GpuDevice::standard(i as u8, memory))
                .collect();
            node.topology = GpuTopology::uniform(node.gpus.len(), spec.is_some_and(|s| s.nvlink));
        }
    }
    (node, bad)
}

/// The most recent spot price of each (instance type, zone), in dollars per hour.
pub fn latest_spot_prices(history: &[SpotPrice]) -> BTreeMap<(String, String), f64> {
    let mut latest: BTreeMap<(String, String), (DateTime, f64)> = BTreeMap::new();
    for p in history {
        let (Some(t), Some(z), Some(price), Some(ts)) = (
            p.instance_type(),
            p.availability_zone(),
            p.spot_price().and_then(|s| s.parse::<f64>().ok()),
            p.timestamp(),
        ) else {
            continue;
        };
        let key = (t.as_str().to_owned(), z.to_owned());
        match latest.get(&key) {
            Some((seen, _)) if seen >= ts => {}
            _ => {
                latest.insert(key, (*ts, price));
            }
        }
    }
    latest.into_iter().map(|(k, (_, p))| (k, p)).collect()
}

/// Spot price of a group: the highest current price over its zones (new instances may land in
/// any of them), `None` when no zone has a price.
pub fn group_spot_price(
    latest: &BTreeMap<(String, String), f64>,
    instance_type: &str,
    zones: &[String],
) -> Option<MicroDollarsPerHour> {
    zones
        .iter()
        .filter_map(|z| latest.get(&(instance_type.to_owned(), z.clone())))
        .copied()
        .fold(None, |acc: Option<f64>, p| Some(acc.map_or(p, |a| a.max(p))))
        .map(dollars)
}

/// State of an ASG instance from its lifecycle state and health: `Pending*` (and root-volume
/// replacement, warm-pool states) are pending; `InService`, `Standby` are running unless
/// unhealthy (the group is about to replace them); `Terminating*`, `Terminated`, `Detach*` and
/// `Quarantined` are going away.
pub fn instance_state(lifecycle: Option<&LifecycleState>, health: Option<&str>) -> InstanceState {
    let Some(state) = lifecycle else {
        return InstanceState::Pending;
    };
    let s = state.as_str();
    if s.starts_with("Terminat")
        || s.starts_with("Detach")
        || s == "Quarantined"
        || s.starts_with("WarmedTerminat")
    {
        InstanceState::Terminating
    } else if s.starts_with("Pending") || s.starts_with("Warmed") || s.contains("RootVolume") {
        InstanceState::Pending
    } else if matches!(s, "InService" | "Standby" | "EnteringStandby") {
        if health.is_some_and(|h| h.eq_ignore_ascii_case("Unhealthy")) {
            InstanceState::Terminating
        } else {
            InstanceState::Running
        }
    } else {
        InstanceState::Pending
    }
}

/// Class of a failed launch from its status message. EC2 error codes appear verbatim in some
/// messages, plain-language descriptions in others.
pub fn classify_launch_message(message: &str) -> ErrorClass {
    let m = message.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    if any(&[
        "insufficientinstancecapacity",
        "insufficientcapacity",
        "insufficienthostcapacity",
        "do not have sufficient",
        "there is no spot capacity",
        "capacity-not-available",
    ]) {
        ErrorClass::OutOfCapacity
    } else if any(&[
        "vcpulimitexceeded",
        "instancelimitexceeded",
        "maxspotinstancecountexceeded",
        "limitexceeded",
        "current vcpu limit",
        "max spot instance count exceeded",
        "quota",
    ]) {
        ErrorClass::Quota
    } else if any(&["throttl", "requestlimitexceeded", "rate exceeded"]) {
        ErrorClass::Throttled
    } else {
        ErrorClass::Other
    }
}

/// Whether the group's latest launch failed, and why: activities newest first, the first
/// launch activity (`Launching a new EC2 instance…`) decides. A later successful launch means
/// the failure is over.
pub fn launch_failure(activities: &[Activity]) -> Option<(ErrorClass, String)> {
    let mut launches: Vec<&Activity> =
        activities.iter().filter(|a| a.description().is_some_and(|d| d.starts_with("Launching"))).collect();
    // Newest first; activities without a start time sort last.
    launches.sort_by(|a, b| b.start_time().cmp(&a.start_time()));
    let latest = launches.first()?;
    if latest.status_code() != Some(&ScalingActivityStatusCode::Failed) {
        return None;
    }
    let message = latest.status_message().or(latest.description()).unwrap_or("launch failed").to_owned();
    Some((classify_launch_message(&message), message))
}

/// Instances of a group, plus one `Failed` placeholder for each missing instance when the
/// latest launch failed (so the planner sees why the group is short).
pub fn group_instances(group: &AutoScalingGroup, failure: Option<&(ErrorClass, String)>) -> Vec<Instance> {
    let name = group.auto_scaling_group_name().unwrap_or("");
    let mut out: Vec<Instance> = group
        .instances()
        .iter()
        .filter_map(|i| {
            let id = i.instance_id()?;
            Some(Instance {
                id: provider_id(i.availability_zone().unwrap_or(""), id),
                state: instance_state(i.lifecycle_state(), i.health_status()),
            })
        })
        .collect();
    if let Some((class, message)) = failure {
        let live = out.iter().filter(|i| i.state != InstanceState::Terminating).count();
        let desired = group.desired_capacity().unwrap_or(0).max(0) as usize;
        let zone = group.availability_zones().first().map_or("", String::as_str);
        for n in live..desired {
            out.push(Instance {
                id: provider_id(zone, &format!("placeholder-{name}-{n}")),
                state: InstanceState::Failed { class: *class, message: message.clone() },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_autoscaling::types::{
        Instance as AsgInstance, LaunchTemplate, LaunchTemplateOverrides, LaunchTemplateSpecification,
        MixedInstancesPolicy,
    };
    use aws_sdk_ec2::types::{
        ArchitectureType, GpuDeviceInfo, GpuDeviceMemoryInfo, GpuInfo, InstanceType, MemoryInfo,
        ProcessorInfo, VCpuInfo,
    };

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn group_ids_and_provider_ids_round_trip() {
        assert_eq!(group_id("prod", "gpu-a100"), "aws/prod/gpu-a100");
        assert_eq!(asg_name("prod", "aws/prod/gpu-a100"), "gpu-a100");
        assert_eq!(asg_name("prod", "gpu-a100"), "gpu-a100");
        // Another account's id is not stripped.
        assert_eq!(asg_name("prod", "aws/dev/gpu"), "aws/dev/gpu");
        let pid = provider_id("us-east-1a", "i-0abc123");
        assert_eq!(pid, "aws:///us-east-1a/i-0abc123");
        assert_eq!(instance_id_of(&pid), Some("i-0abc123"));
        assert_eq!(instance_id_of("i-0abc123"), Some("i-0abc123"));
        assert_eq!(instance_id_of("aws://us-east-1a/i-0f"), Some("i-0f"));
        assert_eq!(instance_id_of("gce://p/z/n"), None);
        assert_eq!(instance_id_of("i-"), None);
        assert_eq!(instance_id_of("node-1"), None);
    }

    #[test]
    fn discovery_tags_become_api_filters() {
        let f = discovery_filters(&tags(&[
            ("k8s.io/cluster-autoscaler/enabled", "true"),
            ("k8s.io/cluster-autoscaler/prod", ""),
        ]));
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].name(), Some("tag:k8s.io/cluster-autoscaler/enabled"));
        assert_eq!(f[0].values(), ["true"]);
        assert_eq!(f[1].name(), Some("tag-key"));
        assert_eq!(f[1].values(), ["k8s.io/cluster-autoscaler/prod"]);
    }

    #[test]
    fn node_template_tags_give_labels_and_taints() {
        let t = tags(&[
            ("k8s.io/cluster-autoscaler/node-template/label/gpu", "a100"),
            ("k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu", "present:NoSchedule"),
            ("k8s.io/cluster-autoscaler/node-template/taint/dedicated", ":NoExecute"),
            ("k8s.io/cluster-autoscaler/node-template/taint/broken", "x:Sometimes"),
            ("Name", "gpu"),
        ]);
        assert_eq!(template_labels(&t), tags(&[("gpu", "a100")]));
        let (taints, bad) = template_taints(&t);
        assert_eq!(
            taints,
            vec![
                Taint { key: "dedicated".into(), value: String::new(), effect: TaintEffect::NoExecute },
                Taint {
                    key: "nvidia.com/gpu".into(),
                    value: "present".into(),
                    effect: TaintEffect::NoSchedule
                },
            ]
        );
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].value, "x:Sometimes");
    }

    #[test]
    fn price_tag_is_parsed_or_rejected() {
        assert_eq!(tagged_price(&tags(&[])), Ok(None));
        assert_eq!(tagged_price(&tags(&[(PRICE_TAG, "32.7726")])), Ok(Some(32_772_600)));
        assert_eq!(tagged_price(&tags(&[(PRICE_TAG, "$1.006")])), Ok(Some(1_006_000)));
        assert_eq!(tagged_price(&tags(&[(PRICE_TAG, "-1")])), Err("-1".to_owned()));
        assert_eq!(tagged_price(&tags(&[(PRICE_TAG, "cheap")])), Err("cheap".to_owned()));
    }

    fn spec(name: &str, version: Option<&str>) -> LaunchTemplateSpecification {
        let b = LaunchTemplateSpecification::builder().launch_template_name(name);
        match version {
            Some(v) => b.version(v).build(),
            None => b.build(),
        }
    }

    #[test]
    fn launch_plan_prefers_mixed_policy_overrides() {
        let plain = AutoScalingGroup::builder().launch_template(spec("lt-gpu", None)).build();
        let p = launch_plan(&plain);
        assert_eq!(p.override_type, None);
        assert_eq!(p.template.as_ref().unwrap().version, "$Default");
        assert_eq!(p.template.unwrap().name.as_deref(), Some("lt-gpu"));
        assert_eq!(p.policy_capacity, None);

        let mixed = AutoScalingGroup::builder()
            .mixed_instances_policy(
                MixedInstancesPolicy::builder()
                    .launch_template(
                        LaunchTemplate::builder()
                            .launch_template_specification(spec("lt-mixed", Some("$Latest")))
                            .overrides(
                                LaunchTemplateOverrides::builder().instance_type("p4d.24xlarge").build(),
                            )
                            .overrides(
                                LaunchTemplateOverrides::builder().instance_type("p4de.24xlarge").build(),
                            )
                            .build(),
                    )
                    .instances_distribution(
                        InstancesDistribution::builder()
                            .on_demand_base_capacity(0)
                            .on_demand_percentage_above_base_capacity(0)
                            .build(),
                    )
                    .build(),
            )
            .build();
        let p = launch_plan(&mixed);
        assert_eq!(p.override_type.as_deref(), Some("p4d.24xlarge"));
        assert_eq!(p.template.unwrap().version, "$Latest");
        assert_eq!(p.policy_capacity, Some(CapacityType::Spot));

        let lc = AutoScalingGroup::builder().launch_configuration_name("lc-old").build();
        assert_eq!(launch_plan(&lc).launch_configuration.as_deref(), Some("lc-old"));
    }

    #[test]
    fn distribution_is_spot_only_without_on_demand_share() {
        let d = |base, pct| {
            InstancesDistribution::builder()
                .set_on_demand_base_capacity(base)
                .set_on_demand_percentage_above_base_capacity(pct)
                .build()
        };
        assert_eq!(distribution_capacity(&d(Some(0), Some(0))), CapacityType::Spot);
        assert_eq!(distribution_capacity(&d(None, Some(0))), CapacityType::Spot);
        // AWS's default is 100% on-demand.
        assert_eq!(distribution_capacity(&d(None, None)), CapacityType::OnDemand);
        assert_eq!(distribution_capacity(&d(Some(1), Some(0))), CapacityType::OnDemand);
        assert_eq!(distribution_capacity(&d(Some(0), Some(50))), CapacityType::OnDemand);
    }

    fn type_info(t: &str, vcpus: i32, mem: i64, gpu: Option<(&str, i32, i32)>) -> InstanceTypeInfo {
        let b = InstanceTypeInfo::builder()
            .instance_type(InstanceType::from(t))
            .v_cpu_info(VCpuInfo::builder().default_v_cpus(vcpus).build())
            .memory_info(MemoryInfo::builder().size_in_mib(mem).build())
            .processor_info(
                ProcessorInfo::builder().supported_architectures(ArchitectureType::X8664).build(),
            );
        match gpu {
            Some((name, count, mib)) => b
                .gpu_info(
                    GpuInfo::builder()
                        .gpus(
                            GpuDeviceInfo::builder()
                                .name(name)
                                .manufacturer("NVIDIA")
                                .count(count)
                                .memory_info(GpuDeviceMemoryInfo::builder().size_in_mib(mib).build())
                                .build(),
                        )
                        .total_gpu_memory_in_mib(count * mib)
                        .build(),
                )
                .build(),
            None => b.build(),
        }
    }

    #[test]
    fn instance_type_gpus_map_to_catalog_models() {
        let p4d = instance_type_facts(&type_info("p4d.24xlarge", 96, 1_179_648, Some(("A100", 8, 40960))));
        assert_eq!(p4d.vcpus, 96);
        assert_eq!(p4d.arch.as_deref(), Some("amd64"));
        let g = p4d.gpu.as_ref().unwrap();
        assert_eq!((g.count, g.memory_mib), (8, 40960));
        assert_eq!(canonical_gpu_model(g), Some("A100-40GB"));

        let p4de = instance_type_facts(&type_info("p4de.24xlarge", 96, 1_179_648, Some(("A100", 8, 81920))));
        assert_eq!(canonical_gpu_model(p4de.gpu.as_ref().unwrap()), Some("A100-80GB"));
        let g5 = instance_type_facts(&type_info("g5.xlarge", 4, 16384, Some(("A10G", 1, 22888))));
        assert_eq!(canonical_gpu_model(g5.gpu.as_ref().unwrap()), Some("A10G"));
        let g6 = instance_type_facts(&type_info("g6.xlarge", 4, 16384, Some(("L4", 1, 22888))));
        assert_eq!(canonical_gpu_model(g6.gpu.as_ref().unwrap()), Some("L4"));
        let p5 = instance_type_facts(&type_info("p5.48xlarge", 192, 2_097_152, Some(("H100", 8, 81920))));
        assert_eq!(canonical_gpu_model(p5.gpu.as_ref().unwrap()), Some("H100-80GB"));
        let m5 = instance_type_facts(&type_info("m5.large", 2, 8192, None));
        assert_eq!(m5.gpu, None);
        assert_eq!(m5.memory_mib, 8192);
    }

    #[test]
    fn template_node_carries_gpus_labels_taints_and_zone() {
        let facts = instance_type_facts(&type_info("p4d.24xlarge", 96, 1_179_648, Some(("A100", 8, 40960))));
        let t = tags(&[
            ("k8s.io/cluster-autoscaler/node-template/label/team", "ml"),
            ("k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu", "true:NoSchedule"),
        ]);
        let zones = vec!["us-east-1b".to_owned(), "us-east-1a".to_owned()];
        let (node, bad) = template_node(&TemplateInput {
            group_id: "aws/prod/gpu",
            instance_type: "p4d.24xlarge",
            facts: Some(&facts),
            zones: &zones,
            region: "us-east-1",
            capacity: CapacityType::Spot,
            tags: &t,
        });
        assert!(bad.is_empty());
        assert_eq!(node.gpu_model.as_deref(), Some("A100-40GB"));
        assert_eq!(node.gpus.len(), 8);
        assert!(node.gpus.iter().all(|g| g.memory_mib == 40960));
        assert_eq!(node.topology.nvlink_of(7), Some(0));
        assert_eq!(node.allocatable.cpu_milli, 96_000);
        assert_eq!(node.allocatable.memory_mib(), 1_179_648);
        assert_eq!(node.zone.as_deref(), Some("us-east-1b"));
        assert_eq!(node.labels["team"], "ml");
        assert_eq!(node.labels["node.kubernetes.io/instance-type"], "p4d.24xlarge");
        assert_eq!(node.labels["eks.amazonaws.com/capacityType"], "SPOT");
        assert_eq!(node.labels["kubernetes.io/arch"], "amd64");
        assert_eq!(node.taints.len(), 1);
        assert_eq!(node.node_group.as_deref(), Some("aws/prod/gpu"));
    }

    fn spot(t: &str, zone: &str, price: &str, secs: i64) -> SpotPrice {
        SpotPrice::builder()
            .instance_type(InstanceType::from(t))
            .availability_zone(zone)
            .spot_price(price)
            .timestamp(DateTime::from_secs(secs))
            .build()
    }

    #[test]
    fn spot_price_is_latest_per_zone_and_highest_over_zones() {
        let history = [
            spot("g5.xlarge", "us-east-1a", "0.40", 100),
            spot("g5.xlarge", "us-east-1a", "0.35", 200),
            spot("g5.xlarge", "us-east-1b", "0.50", 150),
            spot("g5.xlarge", "us-east-1b", "0.45", 50),
            spot("g6.xlarge", "us-east-1a", "0.30", 300),
        ];
        let latest = latest_spot_prices(&history);
        assert_eq!(latest[&("g5.xlarge".into(), "us-east-1a".into())], 0.35);
        assert_eq!(latest[&("g5.xlarge".into(), "us-east-1b".into())], 0.50);
        let zones = |z: &[&str]| z.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(group_spot_price(&latest, "g5.xlarge", &zones(&["us-east-1a"])), Some(350_000));
        assert_eq!(
            group_spot_price(&latest, "g5.xlarge", &zones(&["us-east-1a", "us-east-1b"])),
            Some(500_000)
        );
        assert_eq!(group_spot_price(&latest, "g5.xlarge", &zones(&["us-east-1c"])), None);
    }

    #[test]
    fn lifecycle_states_map_to_instance_states() {
        let s = |l: &str, h: &str| instance_state(Some(&LifecycleState::from(l)), Some(h));
        assert_eq!(s("Pending", "Healthy"), InstanceState::Pending);
        assert_eq!(s("Pending:Wait", "Healthy"), InstanceState::Pending);
        assert_eq!(s("InService", "Healthy"), InstanceState::Running);
        assert_eq!(s("InService", "Unhealthy"), InstanceState::Terminating);
        assert_eq!(s("Standby", "Healthy"), InstanceState::Running);
        assert_eq!(s("Terminating:Wait", "Healthy"), InstanceState::Terminating);
        assert_eq!(s("Terminated", "Healthy"), InstanceState::Terminating);
        assert_eq!(s("Detaching", "Healthy"), InstanceState::Terminating);
        assert_eq!(instance_state(None, None), InstanceState::Pending);
    }

    fn activity(desc: &str, status: ScalingActivityStatusCode, msg: &str, secs: i64) -> Activity {
        Activity::builder()
            .description(desc)
            .status_code(status)
            .status_message(msg)
            .start_time(DateTime::from_secs(secs))
            .build()
    }

    #[test]
    fn latest_failed_launch_marks_the_group() {
        let ice = "We currently do not have sufficient p4d.24xlarge capacity in the Availability \
                   Zone you requested (us-east-1a). Launching EC2 instance failed.";
        let acts = [
            activity("Launching a new EC2 instance: i-1", ScalingActivityStatusCode::Successful, "", 100),
            activity(
                "Launching a new EC2 instance.  Status Reason: ...",
                ScalingActivityStatusCode::Failed,
                ice,
                200,
            ),
            activity("Terminating EC2 instance: i-0", ScalingActivityStatusCode::Successful, "", 300),
        ];
        let (class, message) = launch_failure(&acts).unwrap();
        assert_eq!(class, ErrorClass::OutOfCapacity);
        assert_eq!(message, ice);

        // A later successful launch clears it.
        let mut recovered = acts.to_vec();
        recovered.push(activity(
            "Launching a new EC2 instance: i-2",
            ScalingActivityStatusCode::Successful,
            "",
            400,
        ));
        assert_eq!(launch_failure(&recovered), None);

        assert_eq!(
            classify_launch_message("You have requested more vCPU capacity than your current vCPU limit of 96 allows (VcpuLimitExceeded)"),
            ErrorClass::Quota
        );
        assert_eq!(
            classify_launch_message("InsufficientInstanceCapacity: no capacity"),
            ErrorClass::OutOfCapacity
        );
        assert_eq!(classify_launch_message("AMI not found"), ErrorClass::Other);
    }

    #[test]
    fn failed_launch_adds_placeholders_for_missing_instances() {
        let group = AutoScalingGroup::builder()
            .auto_scaling_group_name("gpu")
            .desired_capacity(3)
            .availability_zones("us-east-1a")
            .instances(
                AsgInstance::builder()
                    .instance_id("i-1")
                    .availability_zone("us-east-1a")
                    .lifecycle_state(LifecycleState::InService)
                    .health_status("Healthy")
                    .build(),
            )
            .build();
        let none = group_instances(&group, None);
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].id, "aws:///us-east-1a/i-1");
        let failure = (ErrorClass::OutOfCapacity, "no capacity".to_owned());
        let with = group_instances(&group, Some(&failure));
        assert_eq!(with.len(), 3);
        assert!(with[1..]
            .iter()
            .all(|i| matches!(&i.state, InstanceState::Failed { class: ErrorClass::OutOfCapacity, .. })));
    }
}
