//! Agent telemetry fixtures shared by the agent tests.

use gpuscale::model::GpuSample;

/// A healthy, non-MIG L4 as the agent reports it: 1 GiB of 24 GiB in use.
pub fn l4_sample(index: u8, utilization_pct: u8, idle_since: Option<u64>) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index:04}"),
        model: "L4".into(),
        utilization_pct: Some(utilization_pct),
        memory_used_bytes: 1 << 30,
        memory_total_bytes: 24 << 30,
        ecc_errors: 0,
        healthy: true,
        mig: vec![],
        idle_since,
    }
}
