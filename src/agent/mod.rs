//! The node telemetry agent (`gpuscale agent`): samples the node's GPUs through NVML, serves the
//! readings as Prometheus metrics and publishes them as a compact node annotation
//! ([`crate::model::telemetry`]) that the controller reads. On AWS and GCP it also watches the
//! instance metadata for interruption notices and taints its node for the controller ([`imds`],
//! [`gce_metadata`]).
//!
//! The agent must never be the reason a node misbehaves: without an NVIDIA driver it says so once,
//! reports `gpuscale_agent_nvml_available 0`, serves empty GPU metrics and retries the driver
//! rarely; API-server writes are rate-limited and only made when the readings changed materially
//! or the last write is getting old.

pub mod gce_metadata;
pub mod imds;
mod metrics;
mod nvml;
mod publish;
mod run;
mod source;

pub use metrics::AgentMetrics;
pub use nvml::{mig_profile_name, NvmlSource};
pub use publish::{NodeAnnotator, PublishPolicy, PublishState, INTERRUPTION_CONDITION};
pub use run::{run, AgentError, AgentOptions, InterruptionWatch, MetadataCloud};
pub use source::{MemorySource, SourceError, TelemetrySource};
