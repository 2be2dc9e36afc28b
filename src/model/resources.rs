//! Scalar resources of a node or a workload.

use serde::{Deserialize, Serialize};

/// One whole GPU expressed in milli-GPU, the unit of fractional GPU shares.
pub const GPU_MILLI: u32 = 1000;

/// CPU and memory, in integer units so comparisons are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Resources {
    /// CPU in thousandths of a core.
    pub cpu_milli: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

impl Resources {
    /// Builds resources from milli-CPU and MiB, the units of most traces.
    pub const fn new(cpu_milli: u64, memory_mib: u64) -> Self {
        Self { cpu_milli, memory_bytes: memory_mib * 1024 * 1024 }
    }

    /// True when `self` fits inside `capacity` in every dimension.
    pub fn fits_in(&self, capacity: &Resources) -> bool {
        self.cpu_milli <= capacity.cpu_milli && self.memory_bytes <= capacity.memory_bytes
    }

    /// Component-wise difference; `None` when `other` does not fit.
    pub fn checked_sub(&self, other: &Resources) -> Option<Resources> {
        Some(Resources {
            cpu_milli: self.cpu_milli.checked_sub(other.cpu_milli)?,
            memory_bytes: self.memory_bytes.checked_sub(other.memory_bytes)?,
        })
    }

    /// Component-wise saturating sum.
    pub fn saturating_add(&self, other: &Resources) -> Resources {
        Resources {
            cpu_milli: self.cpu_milli.saturating_add(other.cpu_milli),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }

    /// Memory in MiB, rounded down.
    pub fn memory_mib(&self) -> u64 {
        self.memory_bytes / (1024 * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtraction_refuses_to_go_negative() {
        let cap = Resources::new(1000, 1024);
        assert_eq!(cap.checked_sub(&Resources::new(1001, 1)), None);
        assert_eq!(cap.checked_sub(&Resources::new(400, 24)), Some(Resources::new(600, 1000)));
        assert!(Resources::new(1000, 1024).fits_in(&cap));
        assert!(!Resources::new(1000, 1025).fits_in(&cap));
    }
}
