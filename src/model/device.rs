//! One GPU of a node and what is allocated on it.

use super::mig::{MigGeometry, MigPlacement};
use super::resources::GPU_MILLI;
use serde::{Deserialize, Serialize};

/// Placement slots (memory slices) of the largest MIG geometry; used to express MIG capacity in
/// milli-GPU.
pub const MIG_SLOTS: u32 = 8;

/// How a GPU is offered to workloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum GpuMode {
    /// Offered whole, or in fractional shares of compute and memory.
    #[default]
    Standard,
    /// Partitioned into MIG instances. With `dynamic`, new instances may be created in free slots
    /// on demand (dynamic MIG); otherwise only the configured instances exist.
    Mig {
        /// The configured instances and whether each is in use.
        instances: Vec<MigInstance>,
        /// Whether instances can be created on demand.
        dynamic: bool,
    },
    /// Time-sliced into `replicas` replicas by the device plugin.
    TimeSliced {
        /// Replicas per GPU.
        replicas: u32,
    },
}

/// A configured MIG instance and whether a workload holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigInstance {
    /// Profile and position.
    #[serde(flatten)]
    pub placement: MigPlacement,
    /// Held by a workload.
    pub used: bool,
}

/// A GPU device and its current allocations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuDevice {
    /// Index on the node (the device plugin's minor number order).
    pub index: u8,
    /// Device memory in MiB (0 when unknown).
    pub memory_mib: u64,
    /// How the GPU is offered.
    pub mode: GpuMode,
    /// Allocated compute in milli-GPU (Standard mode).
    pub used_milli: u32,
    /// Allocated memory in MiB by fractional workloads (Standard mode).
    pub used_memory_mib: u64,
    /// Replicas in use (TimeSliced mode).
    pub used_replicas: u32,
}

impl GpuDevice {
    /// A free GPU offered whole or in shares.
    pub fn standard(index: u8, memory_mib: u64) -> Self {
        Self {
            index,
            memory_mib,
            mode: GpuMode::Standard,
            used_milli: 0,
            used_memory_mib: 0,
            used_replicas: 0,
        }
    }

    /// Free capacity in milli-GPU, the common currency of scoring policies: remaining share in
    /// Standard mode, free memory slices of MIG (configured-but-unused instances, plus empty slots
    /// when dynamic), free replicas when time-sliced.
    pub fn free_milli(&self, geometry: Option<&MigGeometry>) -> u32 {
        match &self.mode {
            GpuMode::Standard => GPU_MILLI - self.used_milli.min(GPU_MILLI),
            GpuMode::Mig { instances, dynamic } => {
                let Some(g) = geometry else { return 0 };
                let slice = |i: &MigInstance| memory_slices(g, i);
                let mut free: u32 = instances.iter().filter(|i| !i.used).map(slice).sum();
                if *dynamic {
                    let configured: u32 = instances.iter().map(slice).sum();
                    free += u32::from(g.memory_slices).saturating_sub(configured);
                }
                free * GPU_MILLI / u32::from(g.memory_slices)
            }
            GpuMode::TimeSliced { replicas } => {
                (replicas.saturating_sub(self.used_replicas)) * GPU_MILLI / (*replicas).max(1)
            }
        }
    }

    /// The allocated share of the GPU in milli-GPU, from what pods hold: a MIG GPU is measured
    /// against the instances it has (or all its slices when partitioned on demand), so an
    /// unused layout counts as free, not as the slices its geometry leaves over.
    pub fn allocated_milli(&self, geometry: Option<&MigGeometry>) -> u32 {
        match &self.mode {
            GpuMode::Standard => self.used_milli.min(GPU_MILLI),
            GpuMode::Mig { instances, dynamic } => {
                let Some(g) = geometry else { return 0 };
                let slices = |i: &MigInstance| memory_slices(g, i);
                let used: u32 = instances.iter().filter(|i| i.used).map(slices).sum();
                let whole =
                    if *dynamic { u32::from(g.memory_slices) } else { instances.iter().map(slices).sum() };
                (used * GPU_MILLI).checked_div(whole).unwrap_or(0)
            }
            GpuMode::TimeSliced { replicas } => {
                self.used_replicas.min(*replicas) * GPU_MILLI / (*replicas).max(1)
            }
        }
    }

    /// True when nothing is allocated on the GPU.
    pub fn is_idle(&self) -> bool {
        match &self.mode {
            GpuMode::Standard => self.used_milli == 0 && self.used_memory_mib == 0,
            GpuMode::Mig { instances, .. } => instances.iter().all(|i| !i.used),
            GpuMode::TimeSliced { .. } => self.used_replicas == 0,
        }
    }

    /// True when a fractional share fits on this GPU.
    pub fn fits_fraction(&self, milli: u32, memory_mib: u64) -> bool {
        matches!(self.mode, GpuMode::Standard)
            && self.used_milli + milli <= GPU_MILLI
            && (memory_mib == 0 || self.memory_mib == 0 || self.used_memory_mib + memory_mib <= self.memory_mib)
            // A memory-only share still needs a GPU that is not held whole.
            && self.used_milli < GPU_MILLI
    }
}

/// Memory slices a MIG instance occupies (0 for a profile the geometry does not have).
fn memory_slices(g: &MigGeometry, i: &MigInstance) -> u32 {
    g.profile(&i.placement.profile).map_or(0, |p| u32::from(p.memory_slices))
}

/// Which devices of a node a placed workload holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DeviceAssignment {
    /// No GPU.
    #[default]
    None,
    /// Whole GPUs by index.
    Whole {
        /// GPU indexes.
        gpus: Vec<u8>,
    },
    /// The same share on each listed GPU.
    Fraction {
        /// GPU indexes.
        gpus: Vec<u8>,
        /// Compute share per GPU.
        milli: u32,
        /// Memory per GPU, MiB.
        #[serde(rename = "memoryMib")]
        memory_mib: u64,
    },
    /// MIG instances as (GPU index, placement); in JSON and YAML, objects
    /// `{gpu, profile, start}`.
    Mig {
        /// The instances.
        #[serde(with = "mig_instances")]
        instances: Vec<(u8, MigPlacement)>,
    },
    /// Time-sliced replicas, one entry per replica.
    Replicas {
        /// GPU index of each replica.
        gpus: Vec<u8>,
    },
}

/// MIG instances of a [`DeviceAssignment`] as named fields: `{"gpu": 0, "profile": "1g.10gb",
/// "start": 2}`.
mod mig_instances {
    use super::MigPlacement;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Instance {
        /// GPU index on the node.
        gpu: u8,
        /// MIG profile, e.g. `1g.10gb`.
        profile: String,
        /// First memory slice.
        start: u8,
    }

    pub fn serialize<S: Serializer>(instances: &[(u8, MigPlacement)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(instances.iter().map(|(gpu, p)| Instance {
            gpu: *gpu,
            profile: p.profile.clone(),
            start: p.start,
        }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u8, MigPlacement)>, D::Error> {
        let list = Vec::<Instance>::deserialize(d)?;
        Ok(list.into_iter().map(|i| (i.gpu, MigPlacement { profile: i.profile, start: i.start })).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mig::{MigPlacement, A100_40GB};

    fn all_1g(used: usize) -> GpuDevice {
        let instances = (0..7)
            .map(|i| MigInstance {
                placement: MigPlacement { profile: "1g.5gb".into(), start: i as u8 },
                used: i < used,
            })
            .collect();
        GpuDevice { mode: GpuMode::Mig { instances, dynamic: false }, ..GpuDevice::standard(0, 40_960) }
    }

    #[test]
    fn mig_allocation_counts_the_instances_pods_hold() {
        // An A100 in seven 1g.5gb instances leaves one memory slice no profile uses: idle, it is
        // 0% allocated (not 12.5%), and full it is 100%.
        assert_eq!(all_1g(0).allocated_milli(Some(&A100_40GB)), 0);
        assert_eq!(all_1g(7).allocated_milli(Some(&A100_40GB)), GPU_MILLI);
        assert_eq!(all_1g(1).allocated_milli(Some(&A100_40GB)), GPU_MILLI / 7);
        let sliced = GpuDevice {
            mode: GpuMode::TimeSliced { replicas: 4 },
            used_replicas: 1,
            ..GpuDevice::standard(0, 0)
        };
        assert_eq!(sliced.allocated_milli(None), 250);
    }
}
