//! Kubernetes `Node` → [`model::Node`]: capacity, GPUs in every sharing mode the NVIDIA stack
//! advertises (whole, time-sliced, MIG mixed/single, HAMi), topology and lifecycle state.

use super::error::{ObjCtx, SnapshotError};
use super::instance_types::instance_gpus;
use super::quantity;
use crate::model::mig::{MigGeometry, MigPlacement, MigProfile};
use crate::model::telemetry::{NodeTelemetry, TELEMETRY_ANNOTATION};
use crate::model::{
    GpuCatalog, GpuDevice, GpuMode, GpuTopology, GpusHeld, MigInstance, Node, NodeLifecycle, NodeState,
    Resources, Taint, TaintEffect,
};
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use std::collections::BTreeMap;

/// Labels naming the node group, most specific first (`gpuscale.io/node-group` overrides).
pub const NODE_GROUP_LABELS: &[&str] = &[
    "gpuscale.io/node-group",
    "eks.amazonaws.com/nodegroup",
    "alpha.eksctl.io/nodegroup-name",
    "cloud.google.com/gke-nodepool",
    "karpenter.sh/nodepool",
];

/// Taints that mark a node as being removed by an autoscaler.
const DELETION_TAINTS: &[&str] = &["ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"];

const HAMI_REGISTER: &str = "hami.io/node-nvidia-register";

pub use crate::model::DISRUPTING_TAINT;
/// Annotation: RFC 3339 time a gpuscale drain started.
pub const DRAIN_STARTED_AT: &str = "gpuscale.io/drain-started-at";
/// Annotation: `"true"` once a drain attempted an eviction; from then on the drain always finishes.
pub const DRAIN_EVICTED: &str = "gpuscale.io/drain-evicted";
/// Annotation: `"true"` when the node was already cordoned before the drain.
pub const DRAIN_WAS_CORDONED: &str = "gpuscale.io/drain-was-cordoned";
/// The GPU Operator's label that turns the device plugin off on a node (`"false"`), as on nodes
/// whose GPUs NVIDIA's DRA driver publishes instead.
pub const DEVICE_PLUGIN_DEPLOY_LABEL: &str = "nvidia.com/gpu.deploy.device-plugin";

use crate::model::{
    GKE_ACCELERATOR_COUNT_LABEL as GKE_ACCELERATOR_COUNT,
    GKE_MAX_SHARED_CLIENTS_LABEL as GKE_MAX_SHARED_CLIENTS, GKE_PARTITION_SIZE_LABEL as GKE_PARTITION_SIZE,
    GKE_SHARING_STRATEGY_LABEL as GKE_SHARING_STRATEGY,
};

/// Most time-slicing replicas (or GKE shared clients) one GPU may be advertised as. NVIDIA's
/// device plugin and GKE document far smaller numbers (GKE: 48); above this a label is an error,
/// not a reason to build millions of slots: [`crate::limits::MAX_GPU_REPLICAS`].
pub use crate::limits::MAX_GPU_REPLICAS;

/// Most GPUs one node may have (the largest servers have 16; NVL72 trays 4). Above this an
/// advertised count is an error naming the field, not an allocation of that many devices:
/// [`crate::limits::MAX_GPUS_PER_NODE`].
pub use crate::limits::MAX_GPUS_PER_NODE;

/// A GKE node's GPU sharing: time-sharing or MPS with a number of clients per GPU, and MIG
/// partitions of one size.
#[derive(Debug, Default)]
struct GkeSharing {
    clients: Option<u32>,
    partition: Option<String>,
}

impl GkeSharing {
    fn read(ctx: &ObjCtx<'_>, labels: &BTreeMap<String, String>) -> Result<Self, SnapshotError> {
        let label = |k: &str| format!("metadata.labels[{k}]");
        let strategy = labels.get(GKE_SHARING_STRATEGY).map(String::as_str);
        let clients: Option<u32> = label_num(ctx, labels, GKE_MAX_SHARED_CLIENTS)?;
        let clients = match (strategy, clients) {
            (Some("time-sharing" | "mps"), Some(0)) | (None, Some(0)) => {
                return Err(ctx.invalid(label(GKE_MAX_SHARED_CLIENTS), "0", "must be at least 1"))
            }
            (Some("time-sharing" | "mps"), Some(n)) => Some(n),
            (Some("time-sharing" | "mps"), None) => {
                return Err(ctx.invalid(
                    label(GKE_MAX_SHARED_CLIENTS),
                    "",
                    format!("{GKE_SHARING_STRATEGY} needs the number of clients per GPU"),
                ))
            }
            (Some(other), _) => {
                return Err(ctx.invalid(label(GKE_SHARING_STRATEGY), other, "expected time-sharing or mps"))
            }
            // GKE sets the strategy with the count; a count alone is time-sharing (its default).
            (None, n) => n,
        };
        let partition = labels.get(GKE_PARTITION_SIZE).filter(|p| !p.is_empty()).cloned();
        Ok(Self { clients, partition })
    }
}

/// A converted node plus what pod accounting needs to know about its devices.
#[derive(Debug, Clone)]
pub struct ConvertedNode {
    /// The node.
    pub node: Node,
    /// HAMi device UUIDs by GPU index (empty on non-HAMi nodes).
    pub gpu_uuids: Vec<String>,
    /// Ready, and initializing only because no device plugin advertises its GPUs: a node whose
    /// GPUs come through DRA ResourceSlices instead is Ready capacity.
    pub awaiting_device_plugin_only: bool,
}

/// One GPU as HAMi's device plugin registers it on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HamiDevice {
    /// GPU UUID.
    pub uuid: String,
    /// How many tasks may share it (`deviceSplitCount`).
    pub split_count: u32,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// Compute cores, percent.
    pub cores: u32,
    /// Device type, e.g. `NVIDIA-NVIDIA A100-SXM4-40GB`.
    pub model: String,
    /// NUMA node.
    pub numa: u8,
    /// Healthy.
    pub healthy: bool,
}

/// Parses `hami.io/node-nvidia-register`: `uuid,count,mem,cores,type,numa,health:` per GPU
/// (HAMi ≤ 2.4), or the JSON array of later versions.
pub fn parse_hami_register(value: &str) -> Result<Vec<HamiDevice>, String> {
    let value = value.trim();
    if value.starts_with('[') {
        let items: Vec<serde_json::Value> =
            serde_json::from_str(value).map_err(|e| format!("invalid JSON: {e}"))?;
        return items
            .iter()
            .map(|d| {
                let s = |k: &str| d.get(k).and_then(|v| v.as_str()).map(str::to_string);
                let n = |k: &str| d.get(k).and_then(serde_json::Value::as_u64);
                Ok(HamiDevice {
                    uuid: s("id").ok_or("device without id")?,
                    split_count: n("count").unwrap_or(1) as u32,
                    memory_mib: n("devmem").ok_or("device without devmem")?,
                    cores: n("devcore").unwrap_or(100) as u32,
                    model: s("type").unwrap_or_default(),
                    numa: n("numa").unwrap_or(0) as u8,
                    healthy: d.get("health").and_then(serde_json::Value::as_bool).unwrap_or(true),
                })
            })
            .collect();
    }
    value
        .split(':')
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            let f: Vec<&str> = d.split(',').map(str::trim).collect();
            if f.len() < 7 {
                return Err(format!(
                    "device {d:?} has {} fields, expected uuid,count,mem,cores,type,numa,health",
                    f.len()
                ));
            }
            let num = |i: usize, what: &str| {
                f[i].parse::<u64>().map_err(|_| format!("device {}: {what} {:?} is not a number", f[0], f[i]))
            };
            Ok(HamiDevice {
                uuid: f[0].to_string(),
                split_count: num(1, "count")? as u32,
                memory_mib: num(2, "memory")?,
                cores: num(3, "cores")? as u32,
                model: f[4].to_string(),
                numa: num(5, "numa")? as u8,
                healthy: f[6].eq_ignore_ascii_case("true"),
            })
        })
        .collect()
}

/// Reads quantities out of `status.allocatable` with errors naming the field.
struct Allocatable<'a> {
    map: &'a BTreeMap<String, K8sQuantity>,
    field: &'static str,
    ctx: &'a ObjCtx<'a>,
}

impl Allocatable<'_> {
    fn get(
        &self,
        key: &str,
        parse: fn(&str) -> Result<u64, quantity::QuantityError>,
    ) -> Result<u64, SnapshotError> {
        match self.map.get(key) {
            None => Ok(0),
            Some(q) => parse(&q.0).map_err(|e| self.ctx.quantity(format!("{}.{key}", self.field), &q.0, e)),
        }
    }

    fn count(&self, key: &str) -> Result<u32, SnapshotError> {
        let v = self.get(key, quantity::count)?;
        u32::try_from(v).map_err(|_| {
            self.ctx.quantity(
                format!("{}.{key}", self.field),
                &v.to_string(),
                quantity::QuantityError::Overflow,
            )
        })
    }
}

fn label_num<T: std::str::FromStr>(
    ctx: &ObjCtx<'_>,
    labels: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<T>, SnapshotError> {
    labels
        .get(key)
        .map(|v| {
            v.trim().parse::<T>().map_err(|_| {
                ctx.invalid(format!("metadata.labels[{key}]"), v, "expected a non-negative integer")
            })
        })
        .transpose()
}

/// Converts a Kubernetes Node. `origin` names the file for errors; unknown GPU products and
/// similar oddities are reported in `warnings`.
pub fn convert_node(
    k: &k8s::Node,
    origin: &str,
    warnings: &mut Vec<String>,
) -> Result<ConvertedNode, SnapshotError> {
    let meta = &k.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let ctx = ObjCtx { origin, object: format!("Node {name}") };
    if name.is_empty() {
        return Err(ctx.invalid("metadata.name", "", "a node needs a name"));
    }
    super::validation::check_meta(&ctx, meta, false, warnings);
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
    let spec = k.spec.clone().unwrap_or_default();
    let status = k.status.clone().unwrap_or_default();
    let empty = BTreeMap::new();
    let (map, field) = match (&status.allocatable, &status.capacity) {
        (Some(a), _) => (a, "status.allocatable"),
        (None, Some(c)) => {
            warnings.push(ctx.warning("no status.allocatable; using status.capacity"));
            (c, "status.capacity")
        }
        (None, None) => {
            warnings.push(ctx.warning("no status.allocatable; the node offers nothing"));
            (&empty, "status.allocatable")
        }
    };
    let alloc = Allocatable { map, field, ctx: &ctx };
    let allocatable = Resources {
        cpu_milli: alloc.get("cpu", quantity::milli)?,
        memory_bytes: alloc.get("memory", quantity::units)?,
    };
    let max_pods = alloc.count("pods")?;
    let mut extended_allocatable = BTreeMap::new();
    for name in map.keys().filter(|k| super::pod::is_other_resource(k)) {
        let parse = if name.contains('/') { quantity::count } else { quantity::units };
        extended_allocatable.insert(name.clone(), alloc.get(name, parse)?);
    }

    let mut taints = spec
        .taints
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| {
            super::validation::check_taint(&ctx, i, t, warnings);
            let effect = match t.effect.as_str() {
                "NoSchedule" => TaintEffect::NoSchedule,
                "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
                "NoExecute" => TaintEffect::NoExecute,
                other => {
                    return Err(ctx.invalid(
                        format!("spec.taints[{i}].effect"),
                        other,
                        "expected NoSchedule, PreferNoSchedule or NoExecute",
                    ))
                }
            };
            Ok(Taint { key: t.key.clone(), value: t.value.clone().unwrap_or_default(), effect })
        })
        .collect::<Result<Vec<_>, _>>()?;

    // A gpuscale drain that has not evicted anything yet can still be given up: the node is
    // shown as it was before the drain (without the drain's taint, cordoned only if it was), so
    // the plan says whether removing it is still worth it. `gpuscale run` plans from this view
    // and `gpuscale plan` shows the same.
    let mark = |key: &str| annotations.get(key).is_some_and(|v| v == "true");
    let mut unschedulable = spec.unschedulable.unwrap_or(false);
    let drain_marked =
        taints.iter().any(|t| t.key == DISRUPTING_TAINT) || annotations.contains_key(DRAIN_STARTED_AT);
    if drain_marked && !mark(DRAIN_EVICTED) {
        taints.retain(|t| t.key != DISRUPTING_TAINT);
        unschedulable = mark(DRAIN_WAS_CORDONED);
    }

    let first_label =
        |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).filter(|v| !v.is_empty()).cloned());
    let zone = first_label(&["topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"]);
    let instance_type =
        first_label(&["node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"]);
    let node_group = first_label(NODE_GROUP_LABELS);

    let gpus = node_gpus(&ctx, &labels, &annotations, &alloc, instance_type.as_deref(), warnings)?;
    let nvlink = gpus.model.as_deref().and_then(|m| GpuCatalog.resolve(m)).is_some_and(|m| m.nvlink);
    let mut topology = GpuTopology::uniform(gpus.devices.len(), nvlink);
    topology.clique = labels.get("nvidia.com/gpu.clique").cloned();
    if !gpus.numa.is_empty() && gpus.numa.iter().any(|&n| n != 0) {
        topology.numa = gpus.numa.clone();
    }

    let ready_condition = status.conditions.iter().flatten().find(|c| c.type_ == "Ready");
    let ready = ready_condition.is_some_and(|c| c.status == "True");
    let mig_reconfiguring = matches!(
        labels.get("nvidia.com/mig.config.state").map(String::as_str),
        Some("pending" | "rebooting")
    );
    let deleting = meta.deletion_timestamp.is_some()
        || taints.iter().any(|t| {
            DELETION_TAINTS.contains(&t.key.as_str())
                || (t.key == "karpenter.sh/disruption" && t.value == "disrupting")
        });
    let awaiting_device_plugin_only = ready && !deleting && !mig_reconfiguring && gpus.awaiting_device_plugin;
    let state = if deleting {
        NodeState::Deleting
    } else if !ready || gpus.awaiting_device_plugin || mig_reconfiguring {
        NodeState::Initializing
    } else {
        NodeState::Ready
    };
    let lifecycle = NodeLifecycle {
        created_at: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        not_ready: !ready,
        ready_changed_at: ready_condition
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.as_second()),
        gpus_held: if mig_reconfiguring {
            Some(GpusHeld::MigReconfiguring)
        } else if gpus.awaiting_device_plugin {
            Some(GpusHeld::DevicePlugin)
        } else {
            None
        },
        device_plugin_disabled: labels.get(DEVICE_PLUGIN_DEPLOY_LABEL).is_some_and(|v| v == "false"),
        mig_layout_applied: labels.get("nvidia.com/mig.config.state").is_some_and(|v| v == "success"),
        unready_since: None,
    };
    let is_true = |key: &str| annotations.get(key).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let scale_down_disabled = is_true("cluster-autoscaler.kubernetes.io/scale-down-disabled")
        || is_true("karpenter.sh/do-not-disrupt");
    // A broken agent must not stop autoscaling: a bad annotation is a warning.
    let telemetry = annotations.get(TELEMETRY_ANNOTATION).and_then(|v| {
        NodeTelemetry::decode(&name, v).map_err(|e| warnings.push(ctx.warning(format!("{e}; ignored")))).ok()
    });

    Ok(ConvertedNode {
        node: Node {
            name,
            allocatable,
            allocated: Resources::default(),
            gpu_model: gpus.model,
            gpus: gpus.devices,
            topology,
            labels: labels.into(),
            taints,
            zone,
            node_group,
            instance_type,
            provider_id: spec.provider_id.clone(),
            unschedulable,
            state,
            lifecycle,
            scale_down_disabled,
            telemetry,
            max_pods,
            pod_count: 0,
            extended_allocatable,
            extended_allocated: BTreeMap::new(),
            host_ports: Vec::new(),
            dra: Default::default(),
            residents: Vec::new(),
        },
        gpu_uuids: gpus.uuids,
        awaiting_device_plugin_only,
    })
}

/// The GPU side of a node.
#[derive(Debug, Default)]
struct NodeGpus {
    model: Option<String>,
    devices: Vec<GpuDevice>,
    uuids: Vec<String>,
    numa: Vec<u8>,
    /// A GPU node whose device plugin advertises no GPUs yet.
    awaiting_device_plugin: bool,
}

fn node_gpus(
    ctx: &ObjCtx<'_>,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    alloc: &Allocatable<'_>,
    instance_type: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<NodeGpus, SnapshotError> {
    let gke = GkeSharing::read(ctx, labels)?;
    let (replicas, replicas_label): (u32, &str) = match gke.clients {
        Some(clients) => (clients, GKE_MAX_SHARED_CLIENTS),
        None => (label_num(ctx, labels, "nvidia.com/gpu.replicas")?.unwrap_or(1), "nvidia.com/gpu.replicas"),
    };
    if replicas > MAX_GPU_REPLICAS {
        return Err(ctx.invalid(
            format!("metadata.labels[{replicas_label}]"),
            replicas.to_string(),
            format!("more than {MAX_GPU_REPLICAS} replicas per GPU"),
        ));
    }
    let label_count: Option<u32> =
        label_num(ctx, labels, "nvidia.com/gpu.count")?.or(label_num(ctx, labels, GKE_ACCELERATOR_COUNT)?);
    let label_memory: Option<u64> = label_num(ctx, labels, "nvidia.com/gpu.memory")?;
    let karpenter_count: Option<u32> = label_num(ctx, labels, "karpenter.k8s.aws/instance-gpu-count")?;
    let karpenter_memory: Option<u64> = label_num(ctx, labels, "karpenter.k8s.aws/instance-gpu-memory")?;
    let from_instance = instance_type.and_then(instance_gpus);
    let hami = annotations
        .get(HAMI_REGISTER)
        .map(|v| {
            parse_hami_register(v)
                .map_err(|e| ctx.invalid(format!("metadata.annotations[{HAMI_REGISTER}]"), v, e))
        })
        .transpose()?;

    let product_label = labels.get("nvidia.com/gpu.product").cloned();
    let raw_product = product_label
        .clone()
        .or_else(|| labels.get("cloud.google.com/gke-accelerator").cloned())
        .or_else(|| labels.get("karpenter.k8s.aws/instance-gpu-name").cloned())
        .or_else(|| hami.as_ref().and_then(|d| d.first()).map(|d| d.model.clone()))
        .or_else(|| from_instance.map(|(m, _)| m.to_string()));
    let product = raw_product.as_deref().map(|p| p.strip_suffix("-SHARED").unwrap_or(p));
    let spec = product.and_then(|p| GpuCatalog.resolve(p));
    let model = match (spec, product) {
        (Some(s), _) => Some(s.name.to_string()),
        (None, Some(p)) if crate::model::vgpu_profile(p).is_some() => {
            warnings.push(ctx.warning(format!(
                "GPU product {p:?} is an NVIDIA vGPU profile: planned as its own GPU model, not the physical GPU"
            )));
            Some(p.to_string())
        }
        (None, Some(p)) => {
            warnings.push(
                ctx.warning(format!("GPU product {p:?} is not in the GPU catalog; keeping the raw name")),
            );
            Some(p.to_string())
        }
        (None, None) => None,
    };
    let geometry = spec.and_then(|s| s.mig);
    // NVIDIA's MIG manager applies the layout named by `nvidia.com/mig.config`; an `all-<profile>`
    // layout of a profile the GPU does not have is one it can never apply (other names are the
    // cluster's own mig-parted configs, which the snapshot does not hold).
    if let (Some(value), Some(g)) = (labels.get("nvidia.com/mig.config"), geometry) {
        let known = matches!(value.as_str(), "all-disabled" | "all-enabled" | "all-balanced");
        if let Some(profile) = value.strip_prefix("all-").filter(|_| !known) {
            if g.profile(profile).is_none() {
                let names: Vec<&str> = g.profiles.iter().map(|p| p.name).collect();
                warnings.push(ctx.warning(format!(
                    "metadata.labels[nvidia.com/mig.config] {value:?}: {} has no MIG profile {profile:?} (it has {}); the MIG manager cannot apply this layout",
                    model.as_deref().unwrap_or("the GPU"),
                    names.join(", ")
                )));
            }
        }
    }
    // GKE exposes each MIG partition of a `gke-gpu-partition-size` pool as one `nvidia.com/gpu`,
    // as the NVIDIA single strategy does.
    let mig_single = labels.get("nvidia.com/mig.strategy").map(String::as_str) == Some("single")
        || gke.partition.is_some();
    let single_profile = gke.partition.clone().or_else(|| {
        product_label.as_deref().and_then(|p| p.split_once("-MIG-")).map(|(_, profile)| profile.to_string())
    });
    // In the single strategy GFD reports MIG devices as the GPUs (count and memory of the
    // instances), so physical numbers come from the catalog and the instance type instead.
    let physical_count = if mig_single && single_profile.is_some() {
        from_instance.map(|(_, n)| n).or(karpenter_count)
    } else {
        label_count.or(karpenter_count).or(from_instance.map(|(_, n)| n))
    };
    let memory_mib = if mig_single && single_profile.is_some() {
        spec.map(|s| s.memory_mib).or(karpenter_memory).unwrap_or(0)
    } else {
        let vgpu = product.and_then(crate::model::vgpu_profile).filter(|&g| g > 0).map(|g| g * 1024);
        label_memory.or(karpenter_memory).or(spec.map(|s| s.memory_mib)).or(vgpu).unwrap_or(0)
    };

    // Counts are capped to physical sense before any device is built from them.
    let max_slots = MAX_GPUS_PER_NODE * MAX_GPU_REPLICAS;
    let capped = |key: &str, max: u32, what: &str| -> Result<u32, SnapshotError> {
        let n = alloc.count(key)?;
        if n > max {
            return Err(ctx.invalid(
                format!("{}.{key}", alloc.field),
                n.to_string(),
                format!("more than {max} {what} on one node"),
            ));
        }
        Ok(n)
    };
    if let Some(n) = physical_count {
        too_many_gpus(ctx, "metadata.labels[nvidia.com/gpu.count]", n, n)?;
    }
    let whole = capped("nvidia.com/gpu", max_slots, "GPUs or GPU replicas")?;
    let shared = capped("nvidia.com/gpu.shared", max_slots, "GPU replicas")?;
    let mut mig: Vec<(String, u32)> = Vec::new();
    for key in alloc.map.keys() {
        if let Some(profile) = key.strip_prefix("nvidia.com/mig-") {
            let n = capped(key, MAX_GPUS_PER_NODE * 7, "MIG instances")?;
            if n > 0 {
                mig.push((profile.to_string(), n));
            }
        } else if key.starts_with("nvidia.com/") && key != "nvidia.com/gpu" && key != "nvidia.com/gpu.shared"
        {
            warnings.push(ctx.warning(format!("ignoring unknown GPU resource {key}")));
        }
    }

    let mut out = NodeGpus { model, ..Default::default() };
    let standard = |n: u32| (0..n).map(|i| GpuDevice::standard(i as u8, memory_mib)).collect();

    if let Some(devices) = hami {
        let n = devices.len() as u32;
        too_many_gpus(ctx, &format!("metadata.annotations[{HAMI_REGISTER}]"), n, n)?;
        // HAMi shares each GPU by memory and cores: physical devices in Standard mode.
        for d in devices {
            if !d.healthy {
                warnings.push(ctx.warning(format!("HAMi reports GPU {} unhealthy; skipped", d.uuid)));
                continue;
            }
            out.devices.push(GpuDevice::standard(out.devices.len() as u8, d.memory_mib));
            out.numa.push(d.numa);
            out.uuids.push(d.uuid);
        }
        return Ok(out);
    }

    if mig_single && whole > 0 {
        if let Some(profile_name) = single_profile {
            let field = format!("{}.nvidia.com/gpu", alloc.field);
            // A shared GKE partition counts once per client; the model shares whole GPUs only,
            // so such a pool is planned with one client per partition (never over-counted).
            let whole = match gke.clients.filter(|_| gke.partition.is_some()) {
                Some(clients) if clients > 1 => {
                    warnings.push(ctx.warning(format!(
                        "GKE MIG partitions shared by {clients} clients are planned as one client each"
                    )));
                    whole / clients
                }
                _ => whole,
            };
            let (geometry, profile) = mig_profile(ctx, geometry, &out.model, &profile_name, &field)?;
            let per_gpu = max_per_gpu(geometry, profile).max(1);
            let n = physical_count.unwrap_or(whole.div_ceil(per_gpu));
            too_many_gpus(ctx, &field, whole, n)?;
            let layouts = layout_mig(geometry, &[(profile, whole)], Some(n as usize)).ok_or_else(|| {
                ctx.invalid(
                    field,
                    whole.to_string(),
                    format!("{whole} MIG {profile_name} instances do not fit on {n} GPUs"),
                )
            })?;
            out.devices = mig_devices(layouts, memory_mib, 0);
            return Ok(out);
        }
    }

    if !mig.is_empty() {
        let mut requests = Vec::new();
        for (name, n) in &mig {
            let field = format!("{}.nvidia.com/mig-{name}", alloc.field);
            let (_, profile) = mig_profile(ctx, geometry, &out.model, name, &field)?;
            requests.push((profile, *n));
        }
        let geometry = geometry.expect("mig_profile checked the geometry");
        // GPUs with MIG disabled still advertise nvidia.com/gpu in the mixed strategy.
        let mig_gpus = physical_count.map(|n| n.saturating_sub(whole)).filter(|&n| n > 0);
        let layouts = layout_mig(geometry, &requests, mig_gpus.map(|n| n as usize)).ok_or_else(|| {
            let listed: Vec<String> = mig.iter().map(|(p, n)| format!("{n}x {p}")).collect();
            ctx.invalid(
                format!("{}.nvidia.com/mig-*", alloc.field),
                listed.join(", "),
                format!("the MIG instances do not fit on {} GPUs", mig_gpus.unwrap_or_default()),
            )
        })?;
        too_many_gpus(
            ctx,
            &format!("{}.nvidia.com/mig-*", alloc.field),
            whole + layouts.len() as u32,
            whole + layouts.len() as u32,
        )?;
        let mut devices: Vec<GpuDevice> = standard(whole);
        devices.extend(mig_devices(layouts, memory_mib, whole));
        out.devices = devices;
        return Ok(out);
    }

    if replicas > 1 && (whole > 0 || shared > 0) {
        let slots = if shared > 0 { shared } else { whole };
        let n = slots.div_ceil(replicas);
        let key = if shared > 0 { "nvidia.com/gpu.shared" } else { "nvidia.com/gpu" };
        too_many_gpus(ctx, &format!("{}.{key}", alloc.field), slots, n)?;
        if slots % replicas != 0 {
            warnings.push(ctx.warning(format!(
                "{slots} time-sliced replicas is not a multiple of nvidia.com/gpu.replicas={replicas}; assuming {n} GPUs"
            )));
        }
        out.devices = (0..n)
            .map(|i| GpuDevice {
                mode: GpuMode::TimeSliced { replicas },
                ..GpuDevice::standard(i as u8, memory_mib)
            })
            .collect();
        return Ok(out);
    }

    if shared > 0 {
        // Renamed shared resource without the replicas label: derive replicas from the count.
        let n = physical_count.filter(|&n| n > 0 && shared % n == 0).ok_or_else(|| {
            ctx.invalid(
                format!("{}.nvidia.com/gpu.shared", alloc.field),
                shared.to_string(),
                "time-sliced GPUs without nvidia.com/gpu.replicas need nvidia.com/gpu.count dividing the shared count",
            )
        })?;
        out.devices = (0..n)
            .map(|i| GpuDevice {
                mode: GpuMode::TimeSliced { replicas: shared / n },
                ..GpuDevice::standard(i as u8, memory_mib)
            })
            .collect();
        return Ok(out);
    }

    if whole > 0 {
        too_many_gpus(ctx, &format!("{}.nvidia.com/gpu", alloc.field), whole, whole)?;
        out.devices = standard(whole);
        return Ok(out);
    }

    // No GPU resources advertised: a GPU node here is one whose device plugin (or MIG manager)
    // has not finished. Count its expected GPUs as capacity on the way.
    let gpu_node = labels.get("nvidia.com/gpu.present").map(String::as_str) == Some("true")
        || physical_count.unwrap_or(0) > 0
        || product_label.is_some();
    if gpu_node {
        out.awaiting_device_plugin = true;
        let n = physical_count.unwrap_or(0);
        out.devices = (0..n)
            .map(|i| GpuDevice {
                mode: if replicas > 1 { GpuMode::TimeSliced { replicas } } else { GpuMode::Standard },
                ..GpuDevice::standard(i as u8, memory_mib)
            })
            .collect();
        if n == 0 {
            warnings.push(ctx.warning(
                "GPU node advertises no GPUs and its GPU count is unknown; counted as initializing with 0 GPUs",
            ));
        }
    } else {
        out.model = None;
    }
    Ok(out)
}

/// An error when `gpus` physical GPUs (derived from the advertised `advertised`) exceed
/// [`MAX_GPUS_PER_NODE`].
fn too_many_gpus(ctx: &ObjCtx<'_>, field: &str, advertised: u32, gpus: u32) -> Result<(), SnapshotError> {
    if gpus > MAX_GPUS_PER_NODE {
        return Err(ctx.invalid(
            field,
            advertised.to_string(),
            format!("{gpus} GPUs on one node; at most {MAX_GPUS_PER_NODE} are planned"),
        ));
    }
    Ok(())
}

fn mig_profile<'g>(
    ctx: &ObjCtx<'_>,
    geometry: Option<&'g MigGeometry>,
    model: &Option<String>,
    profile: &str,
    field: &str,
) -> Result<(&'g MigGeometry, &'g MigProfile), SnapshotError> {
    let model = model.as_deref().unwrap_or("unknown");
    let geometry = geometry
        .ok_or_else(|| ctx.invalid(field, profile, format!("GPU model {model} has no known MIG geometry")))?;
    let p = geometry.profile(profile).ok_or_else(|| {
        let known: Vec<&str> = geometry.profiles.iter().map(|p| p.name).collect();
        ctx.invalid(
            field,
            profile,
            format!("MIG profile {profile} does not exist on {model} (known: {})", known.join(", ")),
        )
    })?;
    Ok((geometry, p))
}

/// How many instances of `profile` one empty GPU holds.
fn max_per_gpu(geometry: &MigGeometry, profile: &MigProfile) -> u32 {
    let mut layout = Vec::new();
    while let Some(start) = geometry.best_start(&layout, profile) {
        layout.push(MigPlacement { profile: profile.name.to_string(), start });
    }
    layout.len() as u32
}

/// Turns per-GPU MIG layouts into devices, indexed from `first_index`.
fn mig_devices(layouts: Vec<Vec<MigPlacement>>, memory_mib: u64, first_index: u32) -> Vec<GpuDevice> {
    layouts
        .into_iter()
        .enumerate()
        .map(|(i, mut layout)| {
            layout.sort_by_key(|p| p.start);
            GpuDevice {
                mode: GpuMode::Mig {
                    instances: layout
                        .into_iter()
                        .map(|placement| MigInstance { placement, used: false })
                        .collect(),
                    dynamic: false,
                },
                ..GpuDevice::standard((first_index as usize + i) as u8, memory_mib)
            }
        })
        .collect()
}

/// Distributes MIG instances over GPUs with valid placements, largest profiles first. With
/// `gpus = None` it uses as few GPUs as it can. Tries spreading (most free compute first, which
/// reproduces the uniform per-GPU layouts of mig-parted configs) and then first fit.
pub fn layout_mig(
    geometry: &MigGeometry,
    requests: &[(&MigProfile, u32)],
    gpus: Option<usize>,
) -> Option<Vec<Vec<MigPlacement>>> {
    let mut instances: Vec<&MigProfile> =
        requests.iter().flat_map(|(p, n)| std::iter::repeat_n(*p, *n as usize)).collect();
    instances.sort_by(|a, b| {
        (b.memory_slices, b.compute_slices, a.name).cmp(&(a.memory_slices, a.compute_slices, b.name))
    });
    let try_with =
        |n: usize| [true, false].into_iter().find_map(|spread| place_all(geometry, &instances, n, spread));
    match gpus {
        Some(n) => try_with(n),
        None => {
            let compute: u32 = instances.iter().map(|p| u32::from(p.compute_slices)).sum();
            let memory: u32 = instances.iter().map(|p| u32::from(p.memory_slices)).sum();
            let lower = compute
                .div_ceil(u32::from(geometry.compute_slices))
                .max(memory.div_ceil(u32::from(geometry.memory_slices)))
                .max(1) as usize;
            (lower..=instances.len().max(lower)).find_map(try_with)
        }
    }
}

fn place_all(
    geometry: &MigGeometry,
    instances: &[&MigProfile],
    gpus: usize,
    spread: bool,
) -> Option<Vec<Vec<MigPlacement>>> {
    let mut layouts: Vec<Vec<MigPlacement>> = vec![Vec::new(); gpus];
    for profile in instances {
        let mut best: Option<(usize, u8, (u8, u32))> = None;
        for (g, layout) in layouts.iter().enumerate() {
            let Some(start) = geometry.best_start(layout, profile) else {
                continue;
            };
            let (occupied, compute) = geometry.occupancy(layout)?;
            let free = (
                geometry.compute_slices - compute,
                u32::from(geometry.memory_slices) - occupied.count_ones(),
            );
            let better = match &best {
                None => true,
                Some((_, _, f)) => spread && free > *f,
            };
            if better {
                best = Some((g, start, free));
            }
            if !spread {
                break;
            }
        }
        let (g, start, _) = best?;
        layouts[g].push(MigPlacement { profile: profile.name.to_string(), start });
    }
    debug_assert!(layouts.iter().all(|l| geometry.validate(l).is_ok()));
    Some(layouts)
}
