//! The GPU part of a workload's request, in every form the ecosystem uses.

use super::mig::MigGeometry;
use super::resources::GPU_MILLI;
use serde::{Deserialize, Serialize};

/// What a workload asks of GPUs. Device plugins, HAMi, KAI and MIG each spell demand differently;
/// the adapters translate them all into this one type so that placement and scaling see the same
/// thing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum GpuDemand {
    /// No GPU.
    #[default]
    None,
    /// `count` whole, exclusive GPUs (`nvidia.com/gpu: N`).
    Whole {
        /// Number of GPUs.
        count: u32,
    },
    /// A share of each of `count` GPUs: `milli` thousandths of its compute and, when non-zero,
    /// `memory_mib` of its memory (HAMi `gpumem`/`gpucores`, KAI `gpu-fraction`/`gpu-memory`,
    /// milli-GPU traces).
    Fraction {
        /// Number of GPUs, each getting the share.
        count: u32,
        /// Compute share of one GPU, 1..=1000 (0 when only memory is asked).
        milli: u32,
        /// GPU memory per GPU in MiB (0 = unconstrained).
        memory_mib: u64,
    },
    /// `count` MIG instances of one profile (`nvidia.com/mig-3g.20gb: N`).
    Mig {
        /// Profile name, e.g. `3g.20gb`.
        profile: String,
        /// Number of instances.
        count: u32,
    },
    /// `count` time-sliced replicas (`nvidia.com/gpu.shared`, or `nvidia.com/gpu` on a
    /// time-sliced node).
    Shared {
        /// Number of replicas.
        count: u32,
    },
}

impl GpuDemand {
    /// True when the workload needs no GPU at all.
    pub fn is_none(&self) -> bool {
        matches!(self, GpuDemand::None)
    }

    /// GPU capacity the demand takes, in milli-GPU, for accounting and for sizing scale-ups.
    /// A memory-only fraction counts its share of `gpu_memory_mib`; a MIG instance its memory
    /// slices; a time-sliced replica `1000 / replicas_per_gpu`.
    pub fn gpu_milli(&self, gpu_memory_mib: u64, mig: Option<&MigGeometry>, replicas_per_gpu: u32) -> u64 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Whole { count } => u64::from(*count) * u64::from(GPU_MILLI),
            GpuDemand::Fraction { count, milli, memory_mib } => {
                let by_memory = (memory_mib * u64::from(GPU_MILLI)).checked_div(gpu_memory_mib).unwrap_or(0);
                u64::from(*count) * u64::from(*milli).max(by_memory).min(u64::from(GPU_MILLI))
            }
            GpuDemand::Mig { profile, count } => {
                let per = mig
                    .and_then(|g| {
                        g.profile(profile)
                            .map(|p| u64::from(p.memory_slices) * 1000 / u64::from(g.memory_slices))
                    })
                    .unwrap_or(u64::from(GPU_MILLI));
                u64::from(*count) * per
            }
            GpuDemand::Shared { count } => {
                u64::from(*count) * u64::from(GPU_MILLI) / u64::from(replicas_per_gpu.max(1))
            }
        }
    }

    /// A short human form: `2 GPU`, `0.46 GPU`, `1x mig-3g.20gb`, `1 shared`.
    pub fn describe(&self) -> String {
        match self {
            GpuDemand::None => "no GPU".into(),
            GpuDemand::Whole { count } => format!("{count} GPU"),
            GpuDemand::Fraction { count, milli, memory_mib } => {
                let mut s = if *count > 1 { format!("{count}x ") } else { String::new() };
                if *milli > 0 {
                    s.push_str(&format!("{:.2} GPU", f64::from(*milli) / 1000.0));
                }
                if *memory_mib > 0 {
                    if *milli > 0 {
                        s.push_str(", ");
                    }
                    s.push_str(&format!("{memory_mib} MiB GPU memory"));
                }
                s
            }
            GpuDemand::Mig { profile, count } => format!("{count}x mig-{profile}"),
            GpuDemand::Shared { count } => format!("{count} shared GPU"),
        }
    }
}
