//! Embedded catalog of common cloud instance types and the node a new instance becomes.
//!
//! The planner must know what a scale-up buys before the instance exists: CPU, memory and GPUs
//! after the kubelet's reservations, the labels gpu-feature-discovery will put on it, and what it
//! costs. This module holds that knowledge for the common GPU (and a few CPU) instance types and
//! builds template [`Node`]s from it.
//!
//! # Prices
//!
//! On-demand Linux list prices in US dollars per hour:
//! - AWS: region `us-east-1`, as published by the AWS Price List API on 2026-01-19 (after the
//!   June 2025 P4/P5 price reduction). `p5e.48xlarge` has no on-demand list price in `us-east-1`
//!   (it is sold through capacity blocks), so its price is `None` and must come from config.
//! - GCP: region `us-central1`, from the Compute Engine VM pricing page as of 2025-12 (vCPU,
//!   memory and GPU components summed as Google bills them). `a3-megagpu-8g` has no published
//!   on-demand price (reservations / DWS only) and is `None`.
//!
//! Spot prices are never guessed here: they come from the provider config or the cloud.
//!
//! # Allocatable
//!
//! [`allocatable`] subtracts what the managed node images reserve:
//! - EKS (Amazon Linux bootstrap / nodeadm): `kube-reserved` CPU 6% of the first core, 1% of the
//!   second, 0.5% of cores 3-4 and 0.25% of every further core; `kube-reserved` memory
//!   `11 MiB * maxPods + 255 MiB` where `maxPods` is the ENI limit from `eni-max-pods.txt`
//!   (`ENIs * (IPv4 per ENI - 1) + 2`); no `system-reserved`; hard eviction at
//!   `memory.available < 100Mi`.
//! - GKE: the same CPU ladder; memory 25% of the first 4 GiB, 20% of the next 4, 10% of the next
//!   8, 6% of the next 112 and 2% above 128 GiB (255 MiB below 1 GiB); hard eviction at
//!   `memory.available < 100Mi`.
//!
//! Memory the hypervisor and kernel keep (the gap between the nominal instance memory and the
//! kubelet's `capacity`) is not modelled; it is a few percent and makes templates slightly
//! optimistic on memory.

use crate::model::{
    mig::{MigGeometry, MigPlacement},
    GpuCatalog, GpuDevice, GpuMode, GpuTopology, MigInstance, Node, NodeState, Resources, Taint,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::LazyLock;
use thiserror::Error;

/// Which cloud an instance type belongs to; decides reservations, labels and provider ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    /// Amazon EC2 (EKS node images).
    Aws,
    /// Google Compute Engine (GKE node images).
    Gcp,
}

/// What one instance type offers and costs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceSpec {
    /// Instance type / machine type, e.g. `p4d.24xlarge`.
    pub instance_type: String,
    /// Cloud of the type.
    pub cloud: Cloud,
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Instance memory in MiB.
    pub memory_mib: u64,
    /// GPUs attached.
    pub gpus: u32,
    /// Canonical GPU model name ([`GpuCatalog`]); `None` for CPU-only types.
    pub gpu_model: Option<String>,
    /// Whether the GPUs are connected by NVLink/NVSwitch.
    pub nvlink: bool,
    /// On-demand price, US dollars per hour; `None` when there is no public list price.
    pub on_demand_usd: Option<f64>,
    /// Pod limit: the EKS ENI table (AWS) or the group's `maxPods`; on AWS it also decides the
    /// kube-reserved memory. `None`: 110.
    pub max_pods: Option<u32>,
    /// GKE accelerator name (`cloud.google.com/gke-accelerator`), GCP GPU types only.
    pub accelerator: Option<String>,
}

/// Default pod limit when the ENI limit of a (custom) AWS type is unknown, as Karpenter assumes;
/// also GKE Standard's default maximum pods per node.
pub const DEFAULT_MAX_PODS: u32 = 110;

#[allow(clippy::too_many_arguments)]
fn aws(
    t: &str,
    vcpu: u32,
    mem_gib: u64,
    gpus: u32,
    model: Option<&str>,
    nvlink: bool,
    price: Option<f64>,
    max_pods: u32,
) -> InstanceSpec {
    InstanceSpec {
        instance_type: t.to_string(),
        cloud: Cloud::Aws,
        vcpu,
        memory_mib: mem_gib * 1024,
        gpus,
        gpu_model: model.map(str::to_string),
        nvlink,
        on_demand_usd: price,
        max_pods: Some(max_pods),
        accelerator: None,
    }
}

#[allow(clippy::too_many_arguments)]
fn gcp(
    t: &str,
    vcpu: u32,
    mem_gib: u64,
    gpus: u32,
    model: Option<&str>,
    accelerator: Option<&str>,
    nvlink: bool,
    price: Option<f64>,
) -> InstanceSpec {
    InstanceSpec {
        instance_type: t.to_string(),
        cloud: Cloud::Gcp,
        vcpu,
        memory_mib: mem_gib * 1024,
        gpus,
        gpu_model: model.map(str::to_string),
        nvlink,
        on_demand_usd: price,
        max_pods: None,
        accelerator: accelerator.map(str::to_string),
    }
}

static CATALOG: LazyLock<Vec<InstanceSpec>> = LazyLock::new(build_catalog);

fn build_catalog() -> Vec<InstanceSpec> {
    let t4 = Some("T4");
    let a10g = Some("A10G");
    let l4 = Some("L4");
    let l40s = Some("L40S");
    let mut v = vec![
        // g4dn: NVIDIA T4.
        aws("g4dn.xlarge", 4, 16, 1, t4, false, Some(0.526), 29),
        aws("g4dn.2xlarge", 8, 32, 1, t4, false, Some(0.752), 29),
        aws("g4dn.4xlarge", 16, 64, 1, t4, false, Some(1.204), 29),
        aws("g4dn.8xlarge", 32, 128, 1, t4, false, Some(2.176), 58),
        aws("g4dn.12xlarge", 48, 192, 4, t4, false, Some(3.912), 234),
        aws("g4dn.16xlarge", 64, 256, 1, t4, false, Some(4.352), 58),
        aws("g4dn.metal", 96, 384, 8, t4, false, Some(7.824), 737),
        // g5: NVIDIA A10G.
        aws("g5.xlarge", 4, 16, 1, a10g, false, Some(1.006), 58),
        aws("g5.2xlarge", 8, 32, 1, a10g, false, Some(1.212), 58),
        aws("g5.4xlarge", 16, 64, 1, a10g, false, Some(1.624), 234),
        aws("g5.8xlarge", 32, 128, 1, a10g, false, Some(2.448), 234),
        aws("g5.12xlarge", 48, 192, 4, a10g, false, Some(5.672), 737),
        aws("g5.16xlarge", 64, 256, 1, a10g, false, Some(4.096), 234),
        aws("g5.24xlarge", 96, 384, 4, a10g, false, Some(8.144), 737),
        aws("g5.48xlarge", 192, 768, 8, a10g, false, Some(16.288), 345),
        // g6: NVIDIA L4.
        aws("g6.xlarge", 4, 16, 1, l4, false, Some(0.8048), 58),
        aws("g6.2xlarge", 8, 32, 1, l4, false, Some(0.9776), 58),
        aws("g6.4xlarge", 16, 64, 1, l4, false, Some(1.3232), 234),
        aws("g6.8xlarge", 32, 128, 1, l4, false, Some(2.0144), 234),
        aws("g6.12xlarge", 48, 192, 4, l4, false, Some(4.6016), 234),
        aws("g6.16xlarge", 64, 256, 1, l4, false, Some(3.3968), 737),
        aws("g6.24xlarge", 96, 384, 4, l4, false, Some(6.6752), 737),
        aws("g6.48xlarge", 192, 768, 8, l4, false, Some(13.3504), 737),
        // g6e: NVIDIA L40S.
        aws("g6e.xlarge", 4, 32, 1, l40s, false, Some(1.861), 58),
        aws("g6e.2xlarge", 8, 64, 1, l40s, false, Some(2.24208), 58),
        aws("g6e.4xlarge", 16, 128, 1, l40s, false, Some(3.00424), 234),
        aws("g6e.8xlarge", 32, 256, 1, l40s, false, Some(4.52856), 234),
        aws("g6e.12xlarge", 48, 384, 4, l40s, false, Some(10.49264), 292),
        aws("g6e.16xlarge", 64, 512, 1, l40s, false, Some(7.57719), 737),
        aws("g6e.24xlarge", 96, 768, 4, l40s, false, Some(15.06559), 492),
        aws("g6e.48xlarge", 192, 1536, 8, l40s, false, Some(30.13118), 492),
        // P-family: 8 SXM GPUs on NVSwitch.
        aws("p4d.24xlarge", 96, 1152, 8, Some("A100-40GB"), true, Some(21.957642), 737),
        aws("p4de.24xlarge", 96, 1152, 8, Some("A100-80GB"), true, Some(27.44705), 737),
        aws("p5.48xlarge", 192, 2048, 8, Some("H100-80GB"), true, Some(55.04), 100),
        // Same network cards as p5.48xlarge, hence the same ENI pod limit.
        aws("p5e.48xlarge", 192, 2048, 8, Some("H200-141GB"), true, None, 100),
    ];
    // CPU types for CPU pods: (size, vcpu, m6i GiB, c6i GiB, m6i $, c6i $, max pods).
    for (size, vcpu, m_mem, c_mem, m_price, c_price, pods) in [
        ("large", 2, 8, 4, 0.096, 0.085, 29),
        ("xlarge", 4, 16, 8, 0.192, 0.17, 58),
        ("2xlarge", 8, 32, 16, 0.384, 0.34, 58),
        ("4xlarge", 16, 64, 32, 0.768, 0.68, 234),
    ] {
        v.push(aws(&format!("m6i.{size}"), vcpu, m_mem, 0, None, false, Some(m_price), pods));
        v.push(aws(&format!("c6i.{size}"), vcpu, c_mem, 0, None, false, Some(c_price), pods));
    }
    // GCP G2 (L4): billed as 0.0366975 $/h per (vCPU + 4 GB) plus 0.56004 $/h per L4 GPU.
    for (vcpu, gpus, price) in [
        (4, 1, 0.70683228),
        (8, 1, 0.85362),
        (12, 1, 1.00041),
        (16, 1, 1.1472),
        (24, 2, 2.00083),
        (32, 1, 1.7343),
        (48, 4, 4.00165),
        (96, 8, 8.0033),
    ] {
        v.push(gcp(
            &format!("g2-standard-{vcpu}"),
            vcpu,
            u64::from(vcpu) * 4,
            gpus,
            l4,
            Some("nvidia-l4"),
            false,
            Some(price),
        ));
    }
    // A2 High / Mega (A100 40GB).
    for (name, vcpu, mem, gpus, price) in [
        ("a2-highgpu-1g", 12, 85, 1, 3.673385),
        ("a2-highgpu-2g", 24, 170, 2, 7.34677),
        ("a2-highgpu-4g", 48, 340, 4, 14.69354),
        ("a2-highgpu-8g", 96, 680, 8, 29.38708),
        ("a2-megagpu-16g", 96, 1360, 16, 55.739504),
    ] {
        v.push(gcp(
            name,
            vcpu,
            mem,
            gpus,
            Some("A100-40GB"),
            Some("nvidia-tesla-a100"),
            gpus > 1,
            Some(price),
        ));
    }
    // A2 Ultra (A100 80GB).
    for (name, vcpu, mem, gpus, price) in [
        ("a2-ultragpu-1g", 12, 170, 1, 5.06879789),
        ("a2-ultragpu-2g", 24, 340, 2, 10.137595781),
        ("a2-ultragpu-4g", 48, 680, 4, 20.275191562),
        ("a2-ultragpu-8g", 96, 1360, 8, 40.550383123),
    ] {
        v.push(gcp(
            name,
            vcpu,
            mem,
            gpus,
            Some("A100-80GB"),
            Some("nvidia-a100-80gb"),
            gpus > 1,
            Some(price),
        ));
    }
    // A3 (H100 80GB).
    v.push(gcp(
        "a3-highgpu-8g",
        208,
        1872,
        8,
        Some("H100-80GB"),
        Some("nvidia-h100-80gb"),
        true,
        Some(88.49),
    ));
    v.push(gcp("a3-megagpu-8g", 208, 1872, 8, Some("H100-80GB"), Some("nvidia-h100-mega-80gb"), true, None));
    // N2 standard: 0.031611 $/h per vCPU + 0.004237 $/h per GB, 4 GB per vCPU.
    for vcpu in [2u32, 4, 8, 16, 32] {
        v.push(gcp(
            &format!("n2-standard-{vcpu}"),
            vcpu,
            u64::from(vcpu) * 4,
            0,
            None,
            None,
            false,
            Some((f64::from(vcpu) * 0.048559 * 1e6).round() / 1e6),
        ));
    }
    v
}

/// Every instance type in the embedded catalog.
pub fn all() -> &'static [InstanceSpec] {
    &CATALOG
}

/// Looks an instance type up in the embedded catalog.
pub fn lookup(instance_type: &str) -> Option<&'static InstanceSpec> {
    CATALOG.iter().find(|s| s.instance_type == instance_type)
}

/// How a node's GPUs are shared, as set by the GPU operator / device plugin config.
///
/// In YAML: `{mig: all-1g.5gb}`, `{timeSlicing: {replicas: 4}}`, or `{}` for none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(try_from = "GpuSharingRepr", into = "GpuSharingRepr")]
pub enum GpuSharing {
    /// Whole GPUs (or fractional shares scheduled by gpuscale).
    #[default]
    None,
    /// MIG partitioned with a layout named as in NVIDIA mig-parted's default config
    /// (`all-1g.5gb`, `all-3g.20gb`, `all-balanced`, `all-1g.5gb.me`), or `all-enabled` for MIG
    /// mode with instances created on demand (dynamic MIG).
    Mig(String),
    /// Time-sliced by the device plugin into `replicas` per GPU.
    TimeSlicing {
        /// Replicas per GPU.
        replicas: u32,
    },
}

/// The YAML shape of [`GpuSharing`]: a map with at most one key (serde_yaml wants `!tags` for
/// enums, which are unusual in hand-written config).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GpuSharingRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mig: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    time_slicing: Option<TimeSlicingRepr>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TimeSlicingRepr {
    replicas: u32,
}

impl TryFrom<GpuSharingRepr> for GpuSharing {
    type Error = String;

    fn try_from(r: GpuSharingRepr) -> Result<Self, String> {
        match (r.mig, r.time_slicing) {
            (None, None) => Ok(GpuSharing::None),
            (Some(layout), None) => Ok(GpuSharing::Mig(layout)),
            (None, Some(t)) => Ok(GpuSharing::TimeSlicing { replicas: t.replicas }),
            (Some(_), Some(_)) => Err("give either mig or timeSlicing, not both".into()),
        }
    }
}

impl From<GpuSharing> for GpuSharingRepr {
    fn from(s: GpuSharing) -> Self {
        match s {
            GpuSharing::None => Self::default(),
            GpuSharing::Mig(layout) => Self { mig: Some(layout), time_slicing: None },
            GpuSharing::TimeSlicing { replicas } => {
                Self { mig: None, time_slicing: Some(TimeSlicingRepr { replicas }) }
            }
        }
    }
}

/// Why a GPU sharing mode cannot be applied to an instance type.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SharingError {
    /// Sharing configured on a type without GPUs.
    #[error("GPU sharing needs GPUs, but the instance type has none")]
    NoGpus,
    /// The GPU model is unknown to the catalog.
    #[error("unknown GPU model {0:?}")]
    UnknownGpuModel(String),
    /// MIG on a GPU without MIG support.
    #[error("GPU model {0} does not support MIG")]
    NotMigCapable(String),
    /// The layout name is not one mig-parted defines for this GPU.
    #[error("MIG layout {layout:?} is not defined for {model} (valid: {valid})")]
    UnknownLayout {
        /// Layout name.
        layout: String,
        /// GPU model.
        model: String,
        /// Valid names, comma-separated.
        valid: String,
    },
    /// The layout's instances do not fit the GPU's placement rules.
    #[error("MIG layout {layout:?} is invalid on {model}: {reason}")]
    InvalidLayout {
        /// Layout name.
        layout: String,
        /// GPU model.
        model: String,
        /// Validation failure.
        reason: String,
    },
    /// Zero time-slicing replicas.
    #[error("time-slicing replicas must be at least 1, got {0}")]
    ZeroReplicas(u32),
}

/// The MIG layout names mig-parted's default config defines for a geometry.
pub fn mig_layout_names(geometry: &MigGeometry) -> Vec<String> {
    let mut names = vec!["all-balanced".to_string(), "all-enabled".to_string()];
    for p in geometry.profiles {
        names.push(match p.name.strip_suffix("+me") {
            Some(base) => format!("all-{base}.me"),
            None => format!("all-{}", p.name),
        });
    }
    names
}

/// Resolves a mig-parted layout name to per-GPU placements on `geometry`; `None` when the name is
/// not defined for it. `all-<profile>` packs as many instances of the profile as fit (what the
/// default config lists), `all-balanced` is one 3g, one 2g and two 1g instances (one 2g and two
/// 1g on four-slice GPUs such as the A30), `all-enabled` has no instances.
pub fn mig_layout(geometry: &MigGeometry, name: &str) -> Option<Vec<MigPlacement>> {
    let profile_named = |n: &str| geometry.profile(n);
    let wanted: Vec<&crate::model::mig::MigProfile> = match name {
        "all-enabled" => vec![],
        "all-balanced" => {
            // The smallest-memory, non-media profile of each compute size.
            let by_compute = |c: u8| {
                geometry
                    .profiles
                    .iter()
                    .filter(|p| !p.media_extensions && p.compute_slices == c)
                    .min_by_key(|p| p.memory_slices)
            };
            let sizes: &[u8] = if geometry.memory_slices >= 8 { &[3, 2, 1, 1] } else { &[2, 1, 1] };
            sizes.iter().map(|&c| by_compute(c)).collect::<Option<Vec<_>>>()?
        }
        _ => {
            let rest = name.strip_prefix("all-")?;
            let profile = match rest.strip_suffix(".me") {
                Some(base) => profile_named(&format!("{base}+me"))?,
                None => profile_named(rest)?,
            };
            let mut layout = Vec::new();
            while let Some(start) = geometry.best_start(&layout, profile) {
                layout.push(MigPlacement { profile: profile.name.to_string(), start });
            }
            layout.sort_by_key(|p| p.start);
            return Some(layout);
        }
    };
    let mut layout = Vec::new();
    for profile in wanted {
        let start = geometry.best_start(&layout, profile)?;
        layout.push(MigPlacement { profile: profile.name.to_string(), start });
    }
    layout.sort_by_key(|p| p.start);
    Some(layout)
}

/// Checks that `sharing` can be applied to a node of `spec` and returns the mode of each GPU.
pub fn gpu_mode(spec: &InstanceSpec, sharing: &GpuSharing) -> Result<GpuMode, SharingError> {
    match sharing {
        GpuSharing::None => Ok(GpuMode::Standard),
        GpuSharing::TimeSlicing { replicas } => {
            if spec.gpus == 0 {
                return Err(SharingError::NoGpus);
            }
            if *replicas == 0 {
                return Err(SharingError::ZeroReplicas(*replicas));
            }
            Ok(GpuMode::TimeSliced { replicas: *replicas })
        }
        GpuSharing::Mig(layout) => {
            let model_name = spec.gpu_model.as_deref().ok_or(SharingError::NoGpus)?;
            if spec.gpus == 0 {
                return Err(SharingError::NoGpus);
            }
            let model = GpuCatalog
                .resolve(model_name)
                .ok_or_else(|| SharingError::UnknownGpuModel(model_name.to_string()))?;
            let geometry = model.mig.ok_or_else(|| SharingError::NotMigCapable(model.name.to_string()))?;
            let placements = mig_layout(geometry, layout).ok_or_else(|| SharingError::UnknownLayout {
                layout: layout.clone(),
                model: model.name.to_string(),
                valid: mig_layout_names(geometry).join(", "),
            })?;
            geometry.validate(&placements).map_err(|e| SharingError::InvalidLayout {
                layout: layout.clone(),
                model: model.name.to_string(),
                reason: e.to_string(),
            })?;
            Ok(GpuMode::Mig {
                dynamic: placements.is_empty(),
                instances: placements
                    .into_iter()
                    .map(|placement| MigInstance { placement, used: false })
                    .collect(),
            })
        }
    }
}

/// CPU the kubelet reserves (`kube-reserved`), in milli-CPU; the same ladder on EKS and GKE.
pub fn reserved_cpu_milli(vcpu: u32) -> u64 {
    // In micro-cores to keep the 0.25% step exact: 6%, 1%, 0.5%, 0.5%, then 0.25% per core.
    let per_core_micro = |core: u32| match core {
        0 => 60_000u64,
        1 => 10_000,
        2 | 3 => 5_000,
        _ => 2_500,
    };
    let micro: u64 = (0..vcpu).map(per_core_micro).sum();
    micro.div_ceil(1000)
}

/// Memory a node image reserves (kube-reserved + system-reserved + hard eviction), in MiB.
pub fn reserved_memory_mib(spec: &InstanceSpec) -> u64 {
    const EVICTION_MIB: u64 = 100;
    match spec.cloud {
        Cloud::Aws => {
            let pods = u64::from(spec.max_pods.unwrap_or(DEFAULT_MAX_PODS));
            11 * pods + 255 + EVICTION_MIB
        }
        Cloud::Gcp => {
            let mem = spec.memory_mib;
            let kube = if mem < 1024 {
                255
            } else {
                // (upper bound of the band in MiB, percent of the band reserved)
                let bands: [(u64, u64); 5] =
                    [(4 * 1024, 25), (8 * 1024, 20), (16 * 1024, 10), (128 * 1024, 6), (u64::MAX, 2)];
                let mut lower = 0u64;
                let mut reserved = 0u64;
                for (upper, pct) in bands {
                    if mem > lower {
                        reserved += (mem.min(upper) - lower) * pct;
                    }
                    lower = upper;
                }
                reserved.div_ceil(100)
            };
            kube + EVICTION_MIB
        }
    }
}

/// CPU and memory pods may request on a node of `spec`.
pub fn allocatable(spec: &InstanceSpec) -> Resources {
    let cpu = u64::from(spec.vcpu) * 1000;
    Resources::new(
        cpu.saturating_sub(reserved_cpu_milli(spec.vcpu)),
        spec.memory_mib.saturating_sub(reserved_memory_mib(spec)),
    )
}

/// What gpu-feature-discovery reports for a GPU model: product label, `nvidia-smi` total memory
/// in MiB, architecture family and CUDA compute capability.
struct GfdInfo {
    product: &'static str,
    memory_mib: u64,
    family: &'static str,
    compute: (u8, u8),
}

/// NVIDIA's DRA driver's `productName` and `architecture` of a catalog model (NVML's names).
fn nvml_names(model: &str) -> Option<(&'static str, &'static str)> {
    Some(match model {
        "T4" => ("Tesla T4", "Turing"),
        "A10G" => ("NVIDIA A10G", "Ampere"),
        "L4" => ("NVIDIA L4", "Ada Lovelace"),
        "L40S" => ("NVIDIA L40S", "Ada Lovelace"),
        "A100-40GB" => ("NVIDIA A100-SXM4-40GB", "Ampere"),
        "A100-80GB" => ("NVIDIA A100-SXM4-80GB", "Ampere"),
        "H100-80GB" => ("NVIDIA H100 80GB HBM3", "Hopper"),
        "H200-141GB" => ("NVIDIA H200", "Hopper"),
        _ => return None,
    })
}

/// The devices NVIDIA's DRA driver publishes on a new node like `template` (pool: the node):
/// `gpu-N` for each GPU in standard mode, `gpu-N-mig-…` for each MIG instance of a GPU in MIG
/// mode, with the attributes and `memory` capacity the driver sets from NVML. Attributes NVML
/// reports per machine (`uuid`, `driverVersion`, `pcieBusID`) are left out unless the group's
/// `dra.attributes` sets them.
pub fn nvidia_dra_devices(template: &Node) -> Vec<crate::model::dra::DraDevice> {
    use crate::model::cel::{AttrValue, Semver};
    use crate::model::dra::{DraDevice, NVIDIA_GPU_DRIVER};
    let Some(model) = template.gpu_model.as_deref() else {
        return Vec::new();
    };
    let info = gfd_info(model);
    let names = nvml_names(model);
    let q = |k: &str| format!("{NVIDIA_GPU_DRIVER}/{k}");
    let mut out = Vec::new();
    for g in &template.gpus {
        let mut attributes = BTreeMap::new();
        if let Some((product, arch)) = names {
            attributes.insert(q("productName"), AttrValue::Str(product.into()));
            attributes.insert(q("architecture"), AttrValue::Str(arch.into()));
            attributes
                .insert(q("brand"), AttrValue::Str(if model == "T4" { "Tesla" } else { "Nvidia" }.into()));
        }
        if let Some(i) = &info {
            let cc = Semver { core: (u64::from(i.compute.0), u64::from(i.compute.1), 0), pre: String::new() };
            attributes.insert(q("cudaComputeCapability"), AttrValue::Version(cc));
        }
        let memory_mib = info.as_ref().map_or(g.memory_mib, |i| i.memory_mib);
        let mib = |m: u64| i128::from(m) * (1 << 20) * 1_000_000_000;
        match &g.mode {
            GpuMode::Mig { instances, .. } => {
                let geometry = GpuCatalog.resolve(model).and_then(|m| m.mig);
                for inst in instances {
                    let p = geometry.and_then(|geo| geo.profile(&inst.placement.profile));
                    let size = p.map_or(1, |p| p.memory_slices);
                    let mut a = attributes.clone();
                    a.insert(q("type"), AttrValue::Str("mig".into()));
                    a.insert(q("profile"), AttrValue::Str(inst.placement.profile.clone()));
                    // `1g.10gb`: the profile names its memory (NVML reports a little less).
                    let gb =
                        inst.placement.profile.split('.').nth(1).and_then(|m| {
                            m.trim_end_matches(|c: char| !c.is_ascii_digit()).parse::<u64>().ok()
                        });
                    let capacity = gb.map(|gb| (q("memory"), mib(gb * 1024))).into_iter().collect();
                    out.push(DraDevice {
                        driver: NVIDIA_GPU_DRIVER.into(),
                        pool: template.name.clone(),
                        name: format!(
                            "gpu-{}-mig-{}-{}-{}",
                            g.index, inst.placement.profile, inst.placement.start, size
                        ),
                        attributes: a,
                        capacity,
                        consumes: BTreeMap::new(),
                    });
                }
            }
            _ => {
                attributes.insert(q("type"), AttrValue::Str("gpu".into()));
                out.push(DraDevice {
                    driver: NVIDIA_GPU_DRIVER.into(),
                    pool: template.name.clone(),
                    name: format!("gpu-{}", g.index),
                    attributes,
                    capacity: BTreeMap::from([(q("memory"), mib(memory_mib))]),
                    consumes: BTreeMap::new(),
                });
            }
        }
    }
    out
}

fn gfd_info(model: &str) -> Option<GfdInfo> {
    let (product, memory_mib, family, compute) = match model {
        "T4" => ("Tesla-T4", 15360, "turing", (7, 5)),
        "A10G" => ("NVIDIA-A10G", 23028, "ampere", (8, 6)),
        "L4" => ("NVIDIA-L4", 23034, "ada-lovelace", (8, 9)),
        "L40S" => ("NVIDIA-L40S", 46068, "ada-lovelace", (8, 9)),
        "A100-40GB" => ("NVIDIA-A100-SXM4-40GB", 40960, "ampere", (8, 0)),
        "A100-80GB" => ("NVIDIA-A100-SXM4-80GB", 81920, "ampere", (8, 0)),
        "H100-80GB" => ("NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0)),
        "H200-141GB" => ("NVIDIA-H200", 143771, "hopper", (9, 0)),
        _ => return None,
    };
    Some(GfdInfo { product, memory_mib, family, compute })
}

/// AWS's public commercial, GovCloud and China regions (2026-01).
pub const AWS_REGIONS: &[&str] = &[
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-south-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-6",
    "ap-southeast-7",
    "ca-central-1",
    "ca-west-1",
    "cn-north-1",
    "cn-northwest-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "mx-central-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-gov-east-1",
    "us-gov-west-1",
    "us-west-1",
    "us-west-2",
];

/// Google Cloud's public regions (2026-01).
pub const GCP_REGIONS: &[&str] = &[
    "africa-south1",
    "asia-east1",
    "asia-east2",
    "asia-northeast1",
    "asia-northeast2",
    "asia-northeast3",
    "asia-south1",
    "asia-south2",
    "asia-southeast1",
    "asia-southeast2",
    "australia-southeast1",
    "australia-southeast2",
    "europe-central2",
    "europe-north1",
    "europe-north2",
    "europe-southwest1",
    "europe-west1",
    "europe-west10",
    "europe-west12",
    "europe-west2",
    "europe-west3",
    "europe-west4",
    "europe-west6",
    "europe-west8",
    "europe-west9",
    "me-central1",
    "me-central2",
    "me-west1",
    "northamerica-northeast1",
    "northamerica-northeast2",
    "northamerica-south1",
    "southamerica-east1",
    "southamerica-west1",
    "us-central1",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
    "us-west4",
];

/// Whether `region` is one of `cloud`'s regions.
pub fn is_known_region(cloud: Cloud, region: &str) -> bool {
    match cloud {
        Cloud::Aws => AWS_REGIONS.contains(&region),
        Cloud::Gcp => GCP_REGIONS.contains(&region),
    }
}

/// Region of a zone: `us-east-1a` → `us-east-1` (AWS), `us-central1-a` → `us-central1` (GCP).
pub fn region_of_zone(cloud: Cloud, zone: &str) -> String {
    match cloud {
        Cloud::Aws => zone.trim_end_matches(|c: char| c.is_ascii_alphabetic()).to_string(),
        Cloud::Gcp => zone.rsplit_once('-').map_or(zone, |(region, _)| region).to_string(),
    }
}

/// The node a new instance of `spec` in `zone` becomes: allocatable after the node image's
/// reservations, GPUs in the configured sharing mode with the model's memory, uniform topology,
/// and the labels the kubelet, the cloud and gpu-feature-discovery set, plus `labels` and
/// `taints` from config (config labels win).
pub fn template_node(
    spec: &InstanceSpec,
    zone: &str,
    labels: &BTreeMap<String, String>,
    taints: &[Taint],
    gpu_sharing: &GpuSharing,
) -> Result<Node, SharingError> {
    let mode = gpu_mode(spec, gpu_sharing)?;
    let model = spec
        .gpu_model
        .as_deref()
        .filter(|_| spec.gpus > 0)
        .map(|m| GpuCatalog.resolve(m).ok_or_else(|| SharingError::UnknownGpuModel(m.to_string())))
        .transpose()?;
    let n = spec.gpus as usize;
    let gpus: Vec<GpuDevice> = match model {
        Some(m) => (0..n)
            .map(|i| GpuDevice { mode: mode.clone(), ..GpuDevice::standard(i as u8, m.memory_mib) })
            .collect(),
        None => vec![],
    };

    let mut l = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        l.insert(k.to_string(), v);
    };
    set("kubernetes.io/os", "linux".into());
    set("kubernetes.io/arch", "amd64".into());
    set("node.kubernetes.io/instance-type", spec.instance_type.clone());
    set("topology.kubernetes.io/zone", zone.to_string());
    set("topology.kubernetes.io/region", region_of_zone(spec.cloud, zone));
    if spec.cloud == Cloud::Gcp {
        if let Some(family) = spec.instance_type.split('-').next() {
            set("cloud.google.com/machine-family", family.to_string());
        }
        if let Some(acc) = &spec.accelerator {
            set("cloud.google.com/gke-accelerator", acc.clone());
        }
    }
    if let Some(m) = model {
        let info = gfd_info(m.name);
        let product = info.as_ref().map_or(m.name, |i| i.product);
        set("nvidia.com/gpu.present", "true".into());
        set("nvidia.com/gpu.count", spec.gpus.to_string());
        set("nvidia.com/gpu.memory", info.as_ref().map_or(m.memory_mib, |i| i.memory_mib).to_string());
        if let Some(i) = &info {
            set("nvidia.com/gpu.family", i.family.to_string());
            set("nvidia.com/gpu.compute.major", i.compute.0.to_string());
            set("nvidia.com/gpu.compute.minor", i.compute.1.to_string());
        }
        set("nvidia.com/mig.capable", m.mig.is_some().to_string());
        match &mode {
            GpuMode::Standard => {
                set("nvidia.com/gpu.product", product.to_string());
                set("nvidia.com/gpu.replicas", "1".into());
                set("nvidia.com/gpu.sharing-strategy", "none".into());
            }
            GpuMode::TimeSliced { replicas } => {
                set("nvidia.com/gpu.product", format!("{product}-SHARED"));
                set("nvidia.com/gpu.replicas", replicas.to_string());
                set("nvidia.com/gpu.sharing-strategy", "time-slicing".into());
            }
            GpuMode::Mig { instances, .. } => {
                set("nvidia.com/gpu.product", product.to_string());
                set("nvidia.com/gpu.replicas", "1".into());
                set("nvidia.com/gpu.sharing-strategy", "none".into());
                set("nvidia.com/mig.strategy", "mixed".into());
                if let GpuSharing::Mig(name) = gpu_sharing {
                    set("nvidia.com/mig.config", name.clone());
                }
                let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                for inst in instances {
                    *counts.entry(inst.placement.profile.as_str()).or_default() += n;
                }
                let geometry = m.mig;
                for (profile, count) in counts {
                    // GFD names `+me` profiles with a `.me` suffix in labels.
                    let label = profile.replace('+', ".");
                    set(&format!("nvidia.com/mig-{label}.count"), count.to_string());
                    if let Some(p) = geometry.and_then(|g| g.profile(profile)) {
                        set(&format!("nvidia.com/mig-{label}.slices.gi"), p.compute_slices.to_string());
                        set(&format!("nvidia.com/mig-{label}.slices.ci"), p.compute_slices.to_string());
                    }
                }
            }
        }
    }
    if spec.cloud == Cloud::Gcp && model.is_some() {
        gke_sharing_labels(&mode, spec.gpus, &mut l);
    }
    for (k, v) in labels {
        l.insert(k.clone(), v.clone());
    }

    Ok(Node {
        name: format!("{}-template", spec.instance_type),
        allocatable: allocatable(spec),
        gpu_model: model.map(|m| m.name.to_string()),
        gpus,
        topology: GpuTopology::uniform(n, spec.nvlink && model.is_some()),
        labels: l.into(),
        taints: taints.to_vec(),
        zone: Some(zone.to_string()),
        instance_type: Some(spec.instance_type.clone()),
        state: NodeState::Upcoming,
        // EKS's ENI table where known; GKE Standard's default per-node limit.
        max_pods: spec.max_pods.unwrap_or(DEFAULT_MAX_PODS),
        ..Node::default()
    })
}

/// The labels GKE puts on the nodes of a GPU node pool created with GPU sharing, which pods
/// select to land on shared GPUs: time-sharing clients per GPU, or the size of uniform MIG
/// partitions (GKE supports one partition size per pool).
fn gke_sharing_labels(mode: &GpuMode, gpus: u32, l: &mut BTreeMap<String, String>) {
    use crate::model::{
        GKE_ACCELERATOR_COUNT_LABEL, GKE_MAX_SHARED_CLIENTS_LABEL, GKE_PARTITION_SIZE_LABEL,
        GKE_SHARING_STRATEGY_LABEL,
    };
    l.insert(GKE_ACCELERATOR_COUNT_LABEL.into(), gpus.to_string());
    match mode {
        GpuMode::Standard => {}
        GpuMode::TimeSliced { replicas } => {
            l.insert(GKE_SHARING_STRATEGY_LABEL.into(), "time-sharing".into());
            l.insert(GKE_MAX_SHARED_CLIENTS_LABEL.into(), replicas.to_string());
        }
        GpuMode::Mig { instances, .. } => {
            let mut profiles = instances.iter().map(|i| i.placement.profile.as_str());
            if let Some(first) = profiles.next() {
                if profiles.all(|p| p == first) {
                    l.insert(GKE_PARTITION_SIZE_LABEL.into(), first.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_model_in_the_catalog_resolves() {
        for s in all() {
            if let Some(m) = &s.gpu_model {
                let resolved = GpuCatalog.resolve(m).expect(m);
                assert_eq!(resolved.name, m, "{} uses a non-canonical name", s.instance_type);
                assert!(s.gpus > 0, "{}", s.instance_type);
            } else {
                assert_eq!(s.gpus, 0, "{}", s.instance_type);
            }
        }
    }

    #[test]
    fn cpu_reservation_ladder() {
        assert_eq!(reserved_cpu_milli(1), 60);
        assert_eq!(reserved_cpu_milli(2), 70);
        assert_eq!(reserved_cpu_milli(4), 80);
        assert_eq!(reserved_cpu_milli(8), 90);
        assert_eq!(reserved_cpu_milli(96), 310);
    }

    #[test]
    fn gke_memory_ladder() {
        // 16 GiB: 1 GiB + 0.8 GiB + 0.8 GiB = 2.6 GiB reserved, plus 100 MiB eviction.
        let g2 = lookup("g2-standard-4").unwrap();
        assert_eq!(reserved_memory_mib(g2), 2663 + 100);
        // EKS p4d: 11 * 737 + 255 + 100.
        assert_eq!(reserved_memory_mib(lookup("p4d.24xlarge").unwrap()), 8107 + 255 + 100);
    }

    #[test]
    fn regions() {
        assert_eq!(region_of_zone(Cloud::Aws, "us-east-1a"), "us-east-1");
        assert_eq!(region_of_zone(Cloud::Gcp, "us-central1-a"), "us-central1");
    }
}
