//! NVML readings through `nvml-wrapper`, which loads `libnvidia-ml.so` at run time: the agent
//! builds and starts on machines without a driver, and `Nvml::init` then fails with a loader
//! error instead of crashing.

use super::source::{SourceError, TelemetrySource};
use crate::model::{GpuCatalog, GpuModelSpec, GpuSample, MigSample, NodeTelemetry};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsString;

/// Reads the node's GPUs through NVML. Initialises NVML lazily and, after a failure, retries only
/// every `retry_secs`.
pub struct NvmlSource {
    nvml: Option<Nvml>,
    library: Option<OsString>,
    retry_secs: u64,
    last_attempt: Option<u64>,
    last_error: String,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("initialised", &self.nvml.is_some())
            .field("library", &self.library)
            .field("retry_secs", &self.retry_secs)
            .finish()
    }
}

impl NvmlSource {
    /// A source using the default library (`libnvidia-ml.so`), or `library` when given.
    pub fn new(library: Option<OsString>, retry_secs: u64) -> Self {
        Self { nvml: None, library, retry_secs, last_attempt: None, last_error: String::new() }
    }

    fn init(&self) -> Result<Nvml, NvmlError> {
        match &self.library {
            Some(path) => Nvml::builder().lib_path(path).init(),
            None => Nvml::init(),
        }
    }
}

impl TelemetrySource for NvmlSource {
    fn sample(&mut self, now: u64) -> Result<NodeTelemetry, SourceError> {
        if self.nvml.is_none() {
            let due = self.last_attempt.is_none_or(|t| now.saturating_sub(t) >= self.retry_secs);
            if !due {
                return Err(SourceError::Unavailable { reason: self.last_error.clone() });
            }
            self.last_attempt = Some(now);
            match self.init() {
                Ok(nvml) => self.nvml = Some(nvml),
                Err(e) => {
                    self.last_error = e.to_string();
                    return Err(SourceError::Unavailable { reason: self.last_error.clone() });
                }
            }
        }
        let nvml = self.nvml.as_ref().expect("initialised above");
        let result = read_all(nvml, now);
        if let Err(SourceError::Unavailable { reason }) = &result {
            // The driver went away (unloaded, upgraded): start over.
            self.last_error = reason.clone();
            self.nvml = None;
        }
        result
    }
}

fn read_all(nvml: &Nvml, now: u64) -> Result<NodeTelemetry, SourceError> {
    let count = nvml.device_count().map_err(|e| match e {
        NvmlError::Uninitialized | NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => {
            SourceError::Unavailable { reason: e.to_string() }
        }
        e => SourceError::Read { gpu: 0, what: "count", reason: e.to_string() },
    })?;
    let mut gpus = Vec::with_capacity(count as usize);
    for i in 0..count {
        let device = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                // A GPU that fell off the bus is reported unhealthy rather than hiding the node.
                tracing::warn!(gpu = i, error = %e, "cannot open GPU");
                gpus.push(lost_gpu(i, &e));
                continue;
            }
        };
        gpus.push(read_gpu(&device, i)?);
    }
    Ok(NodeTelemetry { sampled_at: now, gpus })
}

fn lost_gpu(index: u32, e: &NvmlError) -> GpuSample {
    GpuSample {
        index: index as u8,
        uuid: format!("unknown-{index}"),
        model: format!("unreadable ({e})"),
        utilization_pct: None,
        memory_used_bytes: 0,
        memory_total_bytes: 0,
        ecc_errors: 0,
        healthy: false,
        mig: vec![],
        idle_since: None,
    }
}

fn read_gpu(device: &Device<'_>, index: u32) -> Result<GpuSample, SourceError> {
    let read =
        |what: &'static str, e: NvmlError| SourceError::Read { gpu: index, what, reason: e.to_string() };
    let uuid = device.uuid().map_err(|e| read("uuid", e))?;
    let name = device.name().map_err(|e| read("name", e))?;
    let spec = GpuCatalog.resolve(&name);
    let model = spec.map_or_else(|| name.clone(), |s| s.name.to_string());
    let memory = device.memory_info();
    let (memory_used_bytes, memory_total_bytes) = memory.as_ref().map_or((0, 0), |m| (m.used, m.total));
    let utilization_pct = device.utilization_rates().ok().map(|u| u.gpu.min(100) as u8);
    let ecc_errors = device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap_or(0);
    let pages_pending = device.are_pages_pending_retired().unwrap_or(false);
    let healthy = memory.is_ok() && ecc_errors == 0 && !pages_pending;
    let mut mig = Vec::new();
    if device.mig_mode().is_ok_and(|m| m.current == 1) {
        let slots = device.mig_device_count().unwrap_or(0);
        for j in 0..slots {
            // Slots without an instance answer NotFound.
            let Ok(instance) = device.mig_device_by_index(j) else { continue };
            let Ok(attrs) = instance.attributes() else { continue };
            mig.push(MigSample {
                profile: mig_profile_name(spec, attrs.gpu_instance_slice_count, attrs.memory_size_mb),
                start: None,
                utilization_pct: instance.utilization_rates().ok().map(|u| u.gpu.min(100) as u8),
            });
        }
    }
    Ok(GpuSample {
        index: index as u8,
        uuid,
        model,
        utilization_pct,
        memory_used_bytes,
        memory_total_bytes,
        ecc_errors,
        healthy,
        mig,
        idle_since: None,
    })
}

/// The MIG profile name (`3g.40gb`) of an instance with `slices` compute slices and `memory_mb`
/// MB of memory on a GPU of model `spec`: the catalog profile with that many compute slices whose
/// nominal memory is closest (NVML reports a little less than the name says). Without a catalog
/// entry, the name is built the way NVIDIA builds it.
pub fn mig_profile_name(spec: Option<&GpuModelSpec>, slices: u32, memory_mb: u64) -> String {
    let gib = memory_mb as f64 / 1024.0;
    let nominal = |name: &str| {
        name.split_once('.').and_then(|(_, m)| m.strip_suffix("gb")).and_then(|m| m.parse::<f64>().ok())
    };
    spec.and_then(|s| s.mig)
        .and_then(|g| {
            g.profiles
                .iter()
                .filter(|p| !p.media_extensions && u32::from(p.compute_slices) == slices)
                .filter_map(|p| nominal(p.name).map(|n| (p.name, (n - gib).abs())))
                .min_by(|a, b| a.1.total_cmp(&b.1))
        })
        .map_or_else(|| format!("{slices}g.{}gb", gib.round() as u64), |(name, _)| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_from_nvml_attributes() {
        let a100 = GpuCatalog.resolve("NVIDIA A100-SXM4-80GB");
        assert_eq!(a100.map(|s| s.name), Some("A100-80GB"));
        // NVML reports slightly less memory than the profile name.
        assert_eq!(mig_profile_name(a100, 1, 9856), "1g.10gb");
        assert_eq!(mig_profile_name(a100, 1, 19968), "1g.20gb");
        assert_eq!(mig_profile_name(a100, 3, 40192), "3g.40gb");
        assert_eq!(mig_profile_name(a100, 7, 80994), "7g.80gb");
        let a30 = GpuCatalog.resolve("NVIDIA A30");
        assert_eq!(mig_profile_name(a30, 2, 11968), "2g.12gb");
        assert_eq!(mig_profile_name(None, 2, 11968), "2g.12gb");
    }

    #[test]
    fn without_a_driver_init_fails_and_is_retried_rarely() {
        let mut source = NvmlSource::new(Some("/nonexistent/libnvidia-ml.so.1".into()), 600);
        let e = source.sample(1000).unwrap_err();
        assert!(matches!(e, SourceError::Unavailable { .. }), "{e}");
        // Within the retry period the cached reason comes back without a new attempt.
        assert_eq!(source.sample(1015).unwrap_err(), e);
        assert_eq!(source.last_attempt, Some(1000));
        let _ = source.sample(1600);
        assert_eq!(source.last_attempt, Some(1600));
    }
}
