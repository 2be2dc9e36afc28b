//! Cloud provider plugins: discover node groups, resize them, delete specific instances.
//!
//! The trait is deliberately small: everything the planner needs is data in
//! [`crate::model::NodeGroup`], and sizes are absolute targets so that a retried call can never
//! double a scale-up.

#[cfg(feature = "aws")]
pub mod aws;
pub mod catalog;
pub mod config;
pub mod gang;
#[cfg(feature = "gcp")]
pub mod gcp;
#[cfg(feature = "cloud")]
pub mod politeness;
pub mod simulated;

use crate::model::{ErrorClass, NodeGroup};
use std::future::Future;
use std::time::Duration;
use thiserror::Error;

/// Boxed error source from an SDK or transport.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A classified provider failure.
#[derive(Debug, Error)]
pub enum ProviderError {
    /// No such group in the account.
    #[error("node group {0} not found")]
    GroupNotFound(String),
    /// No such instance in the group.
    #[error("instance {instance} not found in node group {group}")]
    InstanceNotFound {
        /// Group id.
        group: String,
        /// Instance id.
        instance: String,
    },
    /// The requested size is outside the group's bounds.
    #[error("node group {group}: target size {target} is outside [{min}, {max}]")]
    SizeOutOfRange {
        /// Group id.
        group: String,
        /// Requested size.
        target: u32,
        /// Group minimum.
        min: u32,
        /// Group maximum.
        max: u32,
    },
    /// The cloud has no capacity for the group's instance type in its zones now.
    #[error("node group {group}: insufficient capacity: {message}")]
    InsufficientCapacity {
        /// Group id.
        group: String,
        /// Provider message.
        message: String,
    },
    /// An account quota is exhausted.
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// The cloud API throttled us.
    #[error("throttled by the cloud API{}", retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default())]
    Throttled {
        /// Server-suggested wait.
        retry_after: Option<Duration>,
    },
    /// Credentials missing or rejected.
    #[error("authentication failed for account {account}: {message}")]
    Auth {
        /// Account name.
        account: String,
        /// What went wrong.
        message: String,
    },
    /// The provider kind needs a cargo feature this build lacks.
    #[error("provider {provider:?} needs the cargo feature {feature:?}, which this build lacks")]
    NotCompiled {
        /// Provider kind.
        provider: &'static str,
        /// Feature name.
        feature: &'static str,
    },
    /// A write was not issued: the process may no longer write (a controller replica that lost
    /// leadership; see [`politeness::WriteGate`]).
    #[error("{op} not issued: this process may no longer write to the cloud (leadership lost)")]
    NotPermitted {
        /// The operation, e.g. `set_target_size`.
        op: &'static str,
    },
    /// Any other API failure.
    #[error("{op} failed: {cause}")]
    Api {
        /// The operation, e.g. `SetDesiredCapacity`.
        op: &'static str,
        /// Cause (in the message, so not also a `source()`).
        cause: BoxError,
        /// Whether retrying may help (5xx, timeouts).
        retryable: bool,
    },
}

impl ProviderError {
    /// Whether the same call may succeed if retried after a backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProviderError::Throttled { .. } | ProviderError::Api { retryable: true, .. })
    }

    /// Class for metrics, events and backoff decisions.
    pub fn class(&self) -> ErrorClass {
        match self {
            ProviderError::InsufficientCapacity { .. } => ErrorClass::OutOfCapacity,
            ProviderError::QuotaExceeded(_) => ErrorClass::Quota,
            ProviderError::Throttled { .. } => ErrorClass::Throttled,
            _ => ErrorClass::Other,
        }
    }
}

/// A cloud account's node groups.
pub trait CloudProvider: Send + Sync {
    /// Account name from the provider config; used in logs and metric labels.
    fn account(&self) -> &str;

    /// Read-only: the account's node groups with offerings, bounds, target sizes and the
    /// instances the cloud believes exist.
    fn refresh(&self) -> impl Future<Output = Result<Vec<NodeGroup>, ProviderError>> + Send;

    /// Sets a group's desired size. Idempotent: the same target twice is a no-op.
    fn set_target_size(
        &self,
        group: &str,
        target: u32,
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;

    /// Terminates specific (drained) instances and lowers the group's target by as many.
    fn delete_instances(
        &self,
        group: &str,
        instances: &[String],
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;

    /// The interruption notices waiting in the account's queue (AWS: the SQS interruption
    /// queue), each message to be acknowledged once acted on; none for accounts without one.
    fn receive_notices(&self) -> impl Future<Output = Result<Vec<Delivery>, ProviderError>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// Deletes handled messages of the interruption queue ([`Delivery::receipt`]).
    fn acknowledge_notices(
        &self,
        receipts: &[String],
    ) -> impl Future<Output = Result<(), ProviderError>> + Send {
        let _ = receipts;
        std::future::ready(Ok(()))
    }
}

/// One message of an account's interruption queue: its notices (none when it holds nothing to
/// act on) and the handle it is deleted with once they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The queue's handle for this receipt of the message.
    pub receipt: String,
    /// What the message announces.
    pub notices: Vec<crate::model::Notice>,
}
