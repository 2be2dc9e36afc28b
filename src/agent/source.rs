//! Where GPU readings come from: NVML on a real node, a scripted in-memory source in tests.

use crate::model::NodeTelemetry;
use std::collections::VecDeque;
use thiserror::Error;

/// Why a sample could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceError {
    /// No usable driver: the NVML library is missing or the driver is not loaded. Expected on
    /// nodes without GPUs; the agent keeps serving and retries rarely.
    #[error("NVML unavailable: {reason}")]
    Unavailable {
        /// The loader's or driver's message.
        reason: String,
    },
    /// The driver is there but a reading failed.
    #[error("reading GPU {gpu} {what} failed: {reason}")]
    Read {
        /// GPU index.
        gpu: u32,
        /// What was being read (`count`, `handle`, `uuid`, `memory`).
        what: &'static str,
        /// NVML's message.
        reason: String,
    },
}

/// A source of GPU readings. `now` (Unix seconds) stamps the sample; sources never read the clock
/// themselves so that tests control time.
pub trait TelemetrySource: Send {
    /// Reads every GPU of the node.
    fn sample(&mut self, now: u64) -> Result<NodeTelemetry, SourceError>;
}

/// A scripted source: returns the queued samples in order (stamped with `now`), then repeats the
/// last one. With nothing queued it behaves like a node without a driver.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    queue: VecDeque<NodeTelemetry>,
    last: Option<NodeTelemetry>,
}

impl MemorySource {
    /// A source that plays `samples` in order.
    pub fn new(samples: impl IntoIterator<Item = NodeTelemetry>) -> Self {
        Self { queue: samples.into_iter().collect(), last: None }
    }
}

impl TelemetrySource for MemorySource {
    fn sample(&mut self, now: u64) -> Result<NodeTelemetry, SourceError> {
        if let Some(next) = self.queue.pop_front() {
            self.last = Some(next);
        }
        match &self.last {
            Some(t) => Ok(NodeTelemetry { sampled_at: now, ..t.clone() }),
            None => Err(SourceError::Unavailable { reason: "in-memory source without samples".into() }),
        }
    }
}
