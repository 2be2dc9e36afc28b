//! Pure translations between Compute Engine resources and the gpuscale model: resource URLs and
//! provider ids, group ids, error-code classes, managed-instance states, size bounds, GKE node
//! allocatable and the node template of a group. No I/O here, so every rule is unit-tested.

use super::error::GcpError;
use crate::model::{
    CapacityType, ErrorClass, GpuCatalog, GpuDevice, GpuTopology, InstanceState, Node, Resources,
};
use std::collections::BTreeMap;

/// MIG description token / instance-template label holding the group's minimum size.
pub const MIN_SIZE_KEY: &str = "gpuscale-min";
/// MIG description token / instance-template label holding the group's maximum size.
pub const MAX_SIZE_KEY: &str = "gpuscale-max";
/// Instance-template label GKE sets to the node pool name.
pub const GKE_NODE_POOL_TEMPLATE_LABEL: &str = "goog-k8s-node-pool-name";
/// Node label of a GKE node pool.
pub const GKE_NODE_POOL_NODE_LABEL: &str = "cloud.google.com/gke-nodepool";
/// Node label GKE puts on GPU nodes, valued with the accelerator type.
pub const GKE_ACCELERATOR_LABEL: &str = "cloud.google.com/gke-accelerator";

/// The last path segment of a resource URL or partial URL (`.../machineTypes/a2-highgpu-8g`
/// → `a2-highgpu-8g`); a bare name is returned unchanged.
pub fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// Where a Compute resource lives, parsed from its (full or partial) URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    /// Project id.
    pub project: String,
    /// `global`, `zones/<zone>` or `regions/<region>` scope.
    pub scope: Scope,
    /// Collection, e.g. `instances`, `instanceTemplates`.
    pub collection: String,
    /// Resource name.
    pub name: String,
}

/// Scope of a Compute resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `projects/<p>/global/...`
    Global,
    /// `projects/<p>/zones/<zone>/...`
    Zone(String),
    /// `projects/<p>/regions/<region>/...`
    Region(String),
}

/// Parses `https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/n` or any suffix
/// of it starting at `projects/`.
pub fn parse_resource_url(url: &str) -> Option<ResourceRef> {
    let start = url.find("projects/")?;
    let parts: Vec<&str> = url[start..].split('/').collect();
    let (scope, rest) = match parts.as_slice() {
        ["projects", _, "global", rest @ ..] => (Scope::Global, rest),
        ["projects", _, "zones", zone, rest @ ..] => (Scope::Zone((*zone).to_string()), rest),
        ["projects", _, "regions", region, rest @ ..] => (Scope::Region((*region).to_string()), rest),
        _ => return None,
    };
    match rest {
        [collection, name] if !collection.is_empty() && !name.is_empty() => Some(ResourceRef {
            project: parts[1].to_string(),
            scope,
            collection: (*collection).to_string(),
            name: (*name).to_string(),
        }),
        _ => None,
    }
}

/// The Kubernetes provider id of a GCE instance, `gce://<project>/<zone>/<name>`.
pub fn provider_id(project: &str, zone: &str, name: &str) -> String {
    format!("gce://{project}/{zone}/{name}")
}

/// Splits a `gce://<project>/<zone>/<name>` provider id.
pub fn parse_provider_id(id: &str) -> Option<(&str, &str, &str)> {
    let rest = id.strip_prefix("gce://")?;
    let mut it = rest.split('/');
    let (project, zone, name) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || project.is_empty() || zone.is_empty() || name.is_empty() {
        return None;
    }
    Some((project, zone, name))
}

/// The node-group id of a zonal MIG: `gcp/<account>/<zone>/<mig>`. MIG names are unique per
/// zone only, so the zone is part of the id.
pub fn group_id(account: &str, zone: &str, mig: &str) -> String {
    format!("gcp/{account}/{zone}/{mig}")
}

/// Splits a group id made by [`group_id`] into (zone, MIG name) when it belongs to `account`.
pub fn parse_group_id<'a>(account: &str, id: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = id.strip_prefix("gcp/")?.strip_prefix(account)?.strip_prefix('/')?;
    let (zone, mig) = rest.split_once('/')?;
    if zone.is_empty() || mig.is_empty() || mig.contains('/') {
        return None;
    }
    Some((zone, mig))
}

/// Class of a Compute error code (operation `error.errors[].code`, managed-instance
/// `lastAttempt.errors.errors[].code`) or legacy API error reason (`rateLimitExceeded`).
pub fn classify_code(code: &str) -> ErrorClass {
    let up = code.to_ascii_uppercase();
    if up.contains("RESOURCE_POOL_EXHAUSTED") || up.contains("STOCKOUT") {
        ErrorClass::OutOfCapacity
    } else if up.contains("QUOTA_EXCEEDED") || up == "QUOTAEXCEEDED" {
        ErrorClass::Quota
    } else if up.contains("RATE_LIMIT_EXCEEDED") || up.contains("RATELIMITEXCEEDED") {
        ErrorClass::Throttled
    } else {
        ErrorClass::Other
    }
}

/// The class of the most specific of several error codes: capacity beats quota beats
/// throttling beats anything else, so a capacity stockout is never hidden behind a generic code.
pub fn worst_class<'a>(codes: impl IntoIterator<Item = &'a str>) -> ErrorClass {
    codes.into_iter().map(classify_code).min().unwrap_or(ErrorClass::Other)
}

/// What the MIG reports about one managed instance, as plain strings (the API's enum names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagedInstanceFacts {
    /// `currentAction`, e.g. `CREATING`, `NONE`, `DELETING`.
    pub current_action: Option<String>,
    /// `instanceStatus`, e.g. `PROVISIONING`, `RUNNING`.
    pub instance_status: Option<String>,
    /// `lastAttempt.errors.errors[]` as (code, message).
    pub last_attempt_errors: Vec<(String, String)>,
}

/// Maps a managed instance to an [`InstanceState`]. A creation that the MIG keeps retrying after
/// errors (stockout, quota) is reported as failed with the error class, so the planner backs off
/// from the group instead of waiting for capacity that will not come.
pub fn instance_state(m: &ManagedInstanceFacts) -> InstanceState {
    let action = m.current_action.as_deref().unwrap_or("NONE");
    let creating = matches!(action, "CREATING" | "CREATING_WITHOUT_RETRIES" | "RECREATING" | "VERIFYING");
    if creating && !m.last_attempt_errors.is_empty() {
        let class = worst_class(m.last_attempt_errors.iter().map(|(c, _)| c.as_str()));
        let message =
            m.last_attempt_errors.iter().map(|(c, msg)| format!("{c}: {msg}")).collect::<Vec<_>>().join("; ");
        return InstanceState::Failed { class, message };
    }
    if creating || matches!(action, "STARTING" | "RESUMING") {
        return InstanceState::Pending;
    }
    if matches!(action, "DELETING" | "ABANDONING" | "STOPPING" | "SUSPENDING") {
        return InstanceState::Terminating;
    }
    // NONE, REFRESHING, RESTARTING: the instance exists; its own status decides.
    match m.instance_status.as_deref() {
        Some("RUNNING") => InstanceState::Running,
        Some("STOPPING" | "STOPPED" | "TERMINATED" | "SUSPENDING" | "SUSPENDED")
        | Some("PENDING_STOP" | "DEPROVISIONING") => InstanceState::Terminating,
        _ => InstanceState::Pending,
    }
}

/// Size bounds of a MIG and where they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Minimum size.
    pub min: u32,
    /// Maximum size.
    pub max: u32,
}

/// Reads `gpuscale-min=N` / `gpuscale-max=N` tokens from a MIG description (tokens separated by
/// whitespace, `,` or `;`; `:` also accepted instead of `=`).
fn description_bound(mig: &str, description: &str, key: &str) -> Result<Option<u32>, GcpError> {
    for token in description.split(|c: char| c.is_whitespace() || c == ',' || c == ';') {
        let Some((k, v)) = token.split_once('=').or_else(|| token.split_once(':')) else {
            continue;
        };
        if k.trim() == key {
            return parse_bound(mig, "description", key, v.trim()).map(Some);
        }
    }
    Ok(None)
}

fn parse_bound(mig: &str, field: &'static str, key: &str, value: &str) -> Result<u32, GcpError> {
    value.parse::<u32>().map_err(|_| GcpError::BadBound {
        mig: mig.to_string(),
        field,
        key: key.to_string(),
        value: value.to_string(),
    })
}

/// Size bounds of a MIG. MIGs have no min/max of their own (only an autoscaler has), so they are
/// read, in order of precedence, from `gpuscale-min=`/`gpuscale-max=` tokens in the MIG's
/// description, from the `gpuscale-min`/`gpuscale-max` labels of its instance template, and
/// from the settings' defaults.
pub fn bounds(
    mig: &str,
    description: Option<&str>,
    template_labels: &BTreeMap<String, String>,
    default_min: u32,
    default_max: u32,
) -> Result<Bounds, GcpError> {
    let pick = |key: &str, default: u32| -> Result<u32, GcpError> {
        if let Some(v) = description_bound(mig, description.unwrap_or(""), key)? {
            return Ok(v);
        }
        match template_labels.get(key) {
            Some(v) => parse_bound(mig, "instance template label", key, v),
            None => Ok(default),
        }
    };
    let min = pick(MIN_SIZE_KEY, default_min)?;
    let max = pick(MAX_SIZE_KEY, default_max)?;
    if min > max {
        return Err(GcpError::InvertedBounds { mig: mig.to_string(), min, max });
    }
    Ok(Bounds { min, max })
}

/// CPU and memory a GKE node keeps for the system (kube-reserved plus the 100 MiB hard eviction
/// threshold), by GKE's published allocatable formula, subtracted from the machine's capacity.
pub fn gke_allocatable(guest_cpus: u32, memory_mib: u64) -> Resources {
    // CPU: 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% of the rest
    // (computed in micro-cores to stay exact).
    let cores = u64::from(guest_cpus);
    let band = |from: u64, to: u64| cores.min(to).saturating_sub(from);
    let reserved_micro =
        band(0, 1) * 60_000 + band(1, 2) * 10_000 + band(2, 4) * 5_000 + cores.saturating_sub(4) * 2_500;
    let reserved_cpu_milli = reserved_micro.div_ceil(1000);
    // Memory: 255 MiB below 1 GiB; else 25% of the first 4 GiB, 20% of the next 4, 10% of the
    // next 8, 6% of the next 112 and 2% above 128 GiB.
    let reserved_mem_mib = if memory_mib < 1024 {
        255
    } else {
        let m = memory_mib;
        let mband = |from: u64, to: u64| m.min(to).saturating_sub(from);
        let basis = mband(0, 4096) * 25
            + mband(4096, 8192) * 20
            + mband(8192, 16384) * 10
            + mband(16384, 131072) * 6
            + m.saturating_sub(131072) * 2;
        basis.div_ceil(100)
    };
    let eviction_mib = 100;
    Resources::new(
        (cores * 1000).saturating_sub(reserved_cpu_milli),
        memory_mib.saturating_sub(reserved_mem_mib + eviction_mib),
    )
}

/// What a Compute machine type offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFacts {
    /// Machine type name.
    pub name: String,
    /// `guestCpus`.
    pub guest_cpus: u32,
    /// `memoryMb`.
    pub memory_mib: u64,
    /// Bundled accelerators (a2/a3/g2), as (accelerator type, count).
    pub accelerators: Vec<(String, u32)>,
    /// Kubernetes `kubernetes.io/arch` value, when the API reports the architecture.
    pub arch: Option<&'static str>,
}

/// What the instance template of a MIG says about new instances.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateFacts {
    /// Template name.
    pub name: String,
    /// Machine type name.
    pub machine_type: String,
    /// Attached accelerators (`guestAccelerators`, N1 style), as (type, count).
    pub guest_accelerators: Vec<(String, u32)>,
    /// Instance labels.
    pub labels: BTreeMap<String, String>,
    /// `kube-labels` metadata item of a GKE node pool template, parsed.
    pub kube_labels: BTreeMap<String, String>,
    /// Spot or preemptible provisioning.
    pub spot: bool,
}

/// Parses GKE's `kube-labels` metadata value (`k1=v1,k2=v2`).
pub fn parse_kube_labels(value: &str) -> BTreeMap<String, String> {
    value
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The accelerators a new instance gets: the template's attached GPUs if it lists any, else the
/// ones bundled with the machine type. Zero counts are dropped.
pub fn accelerators<'a>(template: &'a TemplateFacts, machine: &'a MachineFacts) -> Vec<(&'a str, u32)> {
    let source = if template.guest_accelerators.iter().any(|(_, n)| *n > 0) {
        &template.guest_accelerators
    } else {
        &machine.accelerators
    };
    source.iter().filter(|(_, n)| *n > 0).map(|(t, n)| (t.as_str(), *n)).collect()
}

/// The GKE node pool a template belongs to, if any.
pub fn gke_node_pool(template: &TemplateFacts) -> Option<&str> {
    template
        .kube_labels
        .get(GKE_NODE_POOL_NODE_LABEL)
        .or_else(|| template.labels.get(GKE_NODE_POOL_TEMPLATE_LABEL))
        .map(String::as_str)
}

/// The node a scale-up of the group would create: allocatable (GKE formula for GKE node pools,
/// raw capacity otherwise), GPUs resolved through [`GpuCatalog`], zone, instance type and the
/// labels the node will carry. Unknown accelerator types are reported as an error naming the
/// template and the value, since a GPU node the scheduler cannot describe must not be planned.
pub fn node_template(
    group_id: &str,
    mig: &str,
    zone: &str,
    template: &TemplateFacts,
    machine: &MachineFacts,
) -> Result<Node, GcpError> {
    let gke_pool = gke_node_pool(template);
    let allocatable = if gke_pool.is_some() {
        gke_allocatable(machine.guest_cpus, machine.memory_mib)
    } else {
        Resources::new(u64::from(machine.guest_cpus) * 1000, machine.memory_mib)
    };
    let mut labels: BTreeMap<String, String> = template.kube_labels.clone();
    let region = zone.rsplit_once('-').map_or(zone, |(r, _)| r);
    labels.insert("topology.kubernetes.io/zone".into(), zone.into());
    labels.insert("topology.kubernetes.io/region".into(), region.into());
    labels.insert("node.kubernetes.io/instance-type".into(), machine.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    if let Some(arch) = machine.arch {
        labels.insert("kubernetes.io/arch".into(), arch.into());
    }
    let capacity = if template.spot { CapacityType::Spot } else { CapacityType::OnDemand };
    for (k, v) in capacity.labels() {
        labels.entry(k.into()).or_insert_with(|| v.into());
    }
    if let Some(pool) = gke_pool {
        labels.insert(GKE_NODE_POOL_NODE_LABEL.into(), pool.into());
        if template.spot {
            labels.insert("cloud.google.com/gke-spot".into(), "true".into());
        }
    }

    let accels = accelerators(template, machine);
    let (mut gpu_model, mut gpus, mut topology) = (None, Vec::new(), GpuTopology::default());
    if let Some(&(accel_type, _)) = accels.first() {
        if accels.iter().any(|(t, _)| *t != accel_type) {
            return Err(GcpError::MixedAccelerators {
                template: template.name.clone(),
                types: accels.iter().map(|(t, _)| t.to_string()).collect(),
            });
        }
        let spec = GpuCatalog.resolve(accel_type).ok_or_else(|| GcpError::UnknownAccelerator {
            template: template.name.clone(),
            machine_type: machine.name.clone(),
            accelerator: accel_type.to_string(),
        })?;
        let count: u32 = accels.iter().map(|(_, n)| n).sum();
        gpus = (0..count).map(|i| GpuDevice::standard(i as u8, spec.memory_mib)).collect();
        topology = GpuTopology::uniform(count as usize, spec.nvlink);
        gpu_model = Some(spec.name.to_string());
        labels.insert(GKE_ACCELERATOR_LABEL.into(), accel_type.into());
        labels.insert("nvidia.com/gpu.count".into(), count.to_string());
        labels.insert("nvidia.com/gpu.present".into(), "true".into());
    }

    Ok(Node {
        name: format!("{mig}-template"),
        allocatable,
        gpu_model,
        gpus,
        topology,
        labels: labels.into(),
        zone: Some(zone.to_string()),
        node_group: Some(group_id.to_string()),
        instance_type: Some(machine.name.clone()),
        ..Node::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_ids_round_trip() {
        let url = "https://www.googleapis.com/compute/v1/projects/p1/zones/us-central1-a/instances/gpu-x1";
        let r = parse_resource_url(url).unwrap();
        assert_eq!(r.project, "p1");
        assert_eq!(r.scope, Scope::Zone("us-central1-a".into()));
        assert_eq!(r.collection, "instances");
        assert_eq!(r.name, "gpu-x1");
        let t = parse_resource_url("projects/p1/global/instanceTemplates/t1").unwrap();
        assert_eq!(t.scope, Scope::Global);
        assert!(parse_resource_url("projects/p1/zones/z").is_none());

        let id = provider_id("p1", "us-central1-a", "gpu-x1");
        assert_eq!(id, "gce://p1/us-central1-a/gpu-x1");
        assert_eq!(parse_provider_id(&id), Some(("p1", "us-central1-a", "gpu-x1")));
        assert_eq!(parse_provider_id("aws:///us-east-1a/i-1"), None);
        assert_eq!(parse_provider_id("gce://p/z/n/extra"), None);

        let g = group_id("prod", "us-central1-a", "gpu-a100");
        assert_eq!(parse_group_id("prod", &g), Some(("us-central1-a", "gpu-a100")));
        assert_eq!(parse_group_id("staging", &g), None);
        assert_eq!(parse_group_id("prod", "gcp/prod/zone-only"), None);
    }

    #[test]
    fn error_codes_are_classified() {
        assert_eq!(classify_code("ZONE_RESOURCE_POOL_EXHAUSTED"), ErrorClass::OutOfCapacity);
        assert_eq!(classify_code("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"), ErrorClass::OutOfCapacity);
        assert_eq!(classify_code("QUOTA_EXCEEDED"), ErrorClass::Quota);
        assert_eq!(classify_code("quotaExceeded"), ErrorClass::Quota);
        assert_eq!(classify_code("rateLimitExceeded"), ErrorClass::Throttled);
        assert_eq!(classify_code("RESOURCE_NOT_FOUND"), ErrorClass::Other);
        assert_eq!(
            worst_class(["RESOURCE_NOT_READY", "QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED"]),
            ErrorClass::OutOfCapacity
        );
    }

    #[test]
    fn managed_instance_states() {
        let f = |a: &str, s: Option<&str>, errs: &[(&str, &str)]| ManagedInstanceFacts {
            current_action: Some(a.into()),
            instance_status: s.map(Into::into),
            last_attempt_errors: errs.iter().map(|(c, m)| (c.to_string(), m.to_string())).collect(),
        };
        assert_eq!(instance_state(&f("CREATING", None, &[])), InstanceState::Pending);
        assert_eq!(instance_state(&f("NONE", Some("RUNNING"), &[])), InstanceState::Running);
        assert_eq!(instance_state(&f("NONE", Some("STAGING"), &[])), InstanceState::Pending);
        assert_eq!(instance_state(&f("DELETING", Some("RUNNING"), &[])), InstanceState::Terminating);
        assert_eq!(instance_state(&f("NONE", Some("TERMINATED"), &[])), InstanceState::Terminating);
        match instance_state(&f("CREATING", None, &[("ZONE_RESOURCE_POOL_EXHAUSTED", "no a2 in zone")])) {
            InstanceState::Failed { class, message } => {
                assert_eq!(class, ErrorClass::OutOfCapacity);
                assert!(message.contains("no a2 in zone"));
            }
            other => panic!("{other:?}"),
        }
        // Errors of an earlier attempt do not fail an instance that is now running.
        assert_eq!(
            instance_state(&f("NONE", Some("RUNNING"), &[("QUOTA_EXCEEDED", "x")])),
            InstanceState::Running
        );
    }

    #[test]
    fn bounds_precedence_and_errors() {
        let mut labels = BTreeMap::new();
        labels.insert("gpuscale-min".to_string(), "1".to_string());
        labels.insert("gpuscale-max".to_string(), "8".to_string());
        let b = bounds("m", Some("team=ml gpuscale-max=16"), &labels, 0, 0).unwrap();
        assert_eq!(b, Bounds { min: 1, max: 16 });
        let b = bounds("m", None, &BTreeMap::new(), 0, 3).unwrap();
        assert_eq!(b, Bounds { min: 0, max: 3 });
        let e = bounds("m", Some("gpuscale-max=lots"), &labels, 0, 0).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("lots") && msg.contains("gpuscale-max") && msg.contains('m'), "{msg}");
        assert!(bounds("m", Some("gpuscale-min=5,gpuscale-max=2"), &labels, 0, 0).is_err());
    }

    #[test]
    fn gke_allocatable_matches_the_published_examples() {
        // n1-standard-1 style: 1 vCPU → 940m allocatable CPU.
        assert_eq!(gke_allocatable(1, 3840).cpu_milli, 940);
        // 4 vCPU: 60 + 10 + 2*5 = 80m reserved.
        assert_eq!(gke_allocatable(4, 15360).cpu_milli, 3920);
        // 96 vCPU: 80 + 92*2.5 = 310m reserved.
        assert_eq!(gke_allocatable(96, 368_640).cpu_milli, 95_690);
        // 16 GiB: 1024 + 819.2 + 819.2 = 2662.4 → 2663 MiB reserved, plus 100 MiB eviction.
        assert_eq!(gke_allocatable(4, 16384).memory_mib(), 16384 - 2663 - 100);
        assert_eq!(gke_allocatable(1, 600).memory_mib(), 600 - 255 - 100);
    }

    fn a2() -> MachineFacts {
        MachineFacts {
            name: "a2-highgpu-8g".into(),
            guest_cpus: 96,
            memory_mib: 696_320,
            accelerators: vec![("nvidia-tesla-a100".into(), 8)],
            arch: Some("amd64"),
        }
    }

    #[test]
    fn template_node_of_a_gke_a100_pool() {
        let t = TemplateFacts {
            name: "gke-c1-a100-tmpl".into(),
            machine_type: "a2-highgpu-8g".into(),
            kube_labels: parse_kube_labels(
                "cloud.google.com/gke-nodepool=a100,cloud.google.com/gke-os-distribution=cos",
            ),
            spot: true,
            ..Default::default()
        };
        let n = node_template("gcp/p/us-central1-a/m", "m", "us-central1-a", &t, &a2()).unwrap();
        assert_eq!(n.gpu_model.as_deref(), Some("A100-40GB"));
        assert_eq!(n.gpus.len(), 8);
        assert_eq!(n.gpus[0].memory_mib, 40 * 1024);
        assert_eq!(n.topology.nvlink_of(7), Some(0));
        assert_eq!(n.labels[GKE_NODE_POOL_NODE_LABEL], "a100");
        assert_eq!(n.labels["cloud.google.com/gke-spot"], "true");
        assert_eq!(n.labels[GKE_ACCELERATOR_LABEL], "nvidia-tesla-a100");
        assert_eq!(n.labels["topology.kubernetes.io/region"], "us-central1");
        assert!(n.allocatable.cpu_milli < 96_000);
    }

    #[test]
    fn template_accelerators_override_and_unknown_ones_fail() {
        let mut m = a2();
        m.accelerators.clear();
        m.name = "n1-standard-8".into();
        let t = TemplateFacts {
            name: "t4-tmpl".into(),
            guest_accelerators: vec![("nvidia-tesla-t4".into(), 2)],
            ..Default::default()
        };
        let n = node_template("g", "m", "europe-west4-b", &t, &m).unwrap();
        assert_eq!(n.gpu_model.as_deref(), Some("T4"));
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.allocatable.cpu_milli, 96_000);

        let t = TemplateFacts {
            name: "odd-tmpl".into(),
            guest_accelerators: vec![("amd-mi300x".into(), 1)],
            ..Default::default()
        };
        let e = node_template("g", "m", "z", &t, &m).unwrap_err().to_string();
        assert!(e.contains("amd-mi300x") && e.contains("odd-tmpl"), "{e}");
    }
}
