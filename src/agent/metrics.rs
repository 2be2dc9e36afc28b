//! The agent's Prometheus metrics (OpenMetrics text on `/metrics`).

use crate::model::NodeTelemetry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
    model: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigLabels {
    gpu: String,
    uuid: String,
    model: String,
    profile: String,
}

type Ratio = Gauge<f64, AtomicU64>;

/// The metric families, updated after each sample and read by the HTTP handler.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    nvml_available: Gauge,
    utilization: Family<GpuLabels, Ratio>,
    memory_used: Family<GpuLabels, Gauge>,
    memory_total: Family<GpuLabels, Gauge>,
    ecc_errors: Family<GpuLabels, Gauge>,
    healthy: Family<GpuLabels, Gauge>,
    idle_seconds: Family<GpuLabels, Gauge>,
    mig_instances: Family<MigLabels, Gauge>,
    samples: Counter,
    sample_errors: Counter,
    unavailable: Counter,
    annotation_writes: Counter,
    annotation_errors: Counter,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    /// Registers every family; GPU families stay empty until a sample arrives.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            registry: Registry::default(),
            nvml_available: Gauge::default(),
            utilization: Family::default(),
            memory_used: Family::default(),
            memory_total: Family::default(),
            ecc_errors: Family::default(),
            healthy: Family::default(),
            idle_seconds: Family::default(),
            mig_instances: Family::default(),
            samples: Counter::default(),
            sample_errors: Counter::default(),
            unavailable: Counter::default(),
            annotation_writes: Counter::default(),
            annotation_errors: Counter::default(),
        };
        registry.register(
            "gpuscale_agent_nvml_available",
            "1 when NVML (the NVIDIA driver) answers, 0 without a driver",
            m.nvml_available.clone(),
        );
        registry.register(
            "gpuscale_agent_gpu_utilization_ratio",
            "GPU compute utilisation over the driver's last sample period (0..1)",
            m.utilization.clone(),
        );
        registry.register("gpuscale_agent_gpu_memory_used_bytes", "GPU memory in use", m.memory_used.clone());
        registry.register("gpuscale_agent_gpu_memory_total_bytes", "GPU memory", m.memory_total.clone());
        registry.register(
            "gpuscale_agent_gpu_ecc_errors",
            "Volatile uncorrected ECC errors since the driver loaded",
            m.ecc_errors.clone(),
        );
        registry.register("gpuscale_agent_gpu_healthy", "1 when the GPU reports no fault", m.healthy.clone());
        registry.register(
            "gpuscale_agent_gpu_idle_seconds",
            "Seconds the GPU has been continuously below the idle threshold (absent when busy)",
            m.idle_seconds.clone(),
        );
        registry.register(
            "gpuscale_agent_gpu_mig_instances",
            "MIG instances per GPU and profile",
            m.mig_instances.clone(),
        );
        registry.register("gpuscale_agent_samples", "GPU samples taken", m.samples.clone());
        registry.register("gpuscale_agent_sample_errors", "GPU samples that failed", m.sample_errors.clone());
        registry.register(
            "gpuscale_agent_samples_unavailable",
            "Samples skipped because NVML (the driver) is unavailable",
            m.unavailable.clone(),
        );
        registry.register(
            "gpuscale_agent_annotation_writes",
            "Node annotation patches that succeeded",
            m.annotation_writes.clone(),
        );
        registry.register(
            "gpuscale_agent_annotation_errors",
            "Node annotation patches that failed",
            m.annotation_errors.clone(),
        );
        Self { registry, ..m }
    }

    /// Replaces the GPU series with a new sample (GPUs that left disappear).
    pub fn record(&self, t: &NodeTelemetry) {
        self.nvml_available.set(1);
        self.samples.inc();
        self.clear_gpus();
        for g in &t.gpus {
            let labels = GpuLabels { gpu: g.index.to_string(), uuid: g.uuid.clone(), model: g.model.clone() };
            if let Some(u) = g.utilization_pct {
                self.utilization.get_or_create(&labels).set(f64::from(u) / 100.0);
            }
            let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
            self.memory_used.get_or_create(&labels).set(bytes(g.memory_used_bytes));
            self.memory_total.get_or_create(&labels).set(bytes(g.memory_total_bytes));
            self.ecc_errors.get_or_create(&labels).set(bytes(g.ecc_errors));
            self.healthy.get_or_create(&labels).set(i64::from(g.healthy));
            if let Some(idle) = g.idle_for(t.sampled_at) {
                self.idle_seconds.get_or_create(&labels).set(bytes(idle));
            }
            for m in &g.mig {
                let l = MigLabels {
                    gpu: labels.gpu.clone(),
                    uuid: labels.uuid.clone(),
                    model: labels.model.clone(),
                    profile: m.profile.clone(),
                };
                self.mig_instances.get_or_create(&l).inc();
            }
        }
    }

    /// No driver (or it went away): `nvml_available 0` and no GPU series.
    pub fn record_unavailable(&self) {
        self.nvml_available.set(0);
        self.unavailable.inc();
        self.clear_gpus();
    }

    /// A sample that failed with the driver present.
    pub fn record_error(&self) {
        self.sample_errors.inc();
    }

    /// The outcome of a node annotation patch.
    pub fn record_annotation(&self, ok: bool) {
        if ok { &self.annotation_writes } else { &self.annotation_errors }.inc();
    }

    fn clear_gpus(&self) {
        self.utilization.clear();
        self.memory_used.clear();
        self.memory_total.clear();
        self.ecc_errors.clear();
        self.healthy.clear();
        self.idle_seconds.clear();
        self.mig_instances.clear();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuSample, MigSample};

    #[test]
    fn records_and_clears_gpu_series() {
        let m = AgentMetrics::new();
        m.record_unavailable();
        let text = m.encode();
        assert!(text.contains("gpuscale_agent_nvml_available 0\n"), "{text}");
        assert!(!text.contains("gpuscale_agent_gpu_utilization_ratio{"), "{text}");
        let t = NodeTelemetry {
            sampled_at: 200,
            gpus: vec![GpuSample {
                index: 0,
                uuid: "GPU-a".into(),
                model: "A100-80GB".into(),
                utilization_pct: Some(42),
                memory_used_bytes: 1 << 30,
                memory_total_bytes: 80 << 30,
                ecc_errors: 0,
                healthy: true,
                mig: vec![
                    MigSample { profile: "1g.10gb".into(), start: None, utilization_pct: None },
                    MigSample { profile: "1g.10gb".into(), start: None, utilization_pct: None },
                ],
                idle_since: Some(150),
            }],
        };
        m.record(&t);
        let text = m.encode();
        let labels = r#"{gpu="0",uuid="GPU-a",model="A100-80GB"}"#;
        for line in [
            "gpuscale_agent_nvml_available 1".to_string(),
            format!("gpuscale_agent_gpu_utilization_ratio{labels} 0.42"),
            format!("gpuscale_agent_gpu_memory_used_bytes{labels} 1073741824"),
            format!("gpuscale_agent_gpu_idle_seconds{labels} 50"),
            r#"gpuscale_agent_gpu_mig_instances{gpu="0",uuid="GPU-a",model="A100-80GB",profile="1g.10gb"} 2"#
                .to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        m.record_unavailable();
        assert!(!m.encode().contains("GPU-a"));
    }
}
