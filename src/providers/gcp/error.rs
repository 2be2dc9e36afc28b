//! Failures specific to the GCP adapter, carried as the source of a
//! [`crate::providers::ProviderError`] so that callers still match on the common classes.

use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// A GCP adapter failure that is not a plain API error.
#[derive(Debug, Error)]
pub enum GcpError {
    /// A required setting is missing or malformed.
    #[error("gcp settings for account {account}: field `{field}` {problem}")]
    Settings {
        /// Account name.
        account: String,
        /// Settings field.
        field: &'static str,
        /// What is wrong, with the bad value.
        problem: String,
    },
    /// The credentials file could not be read or parsed.
    #[error("gcp credentials file {path}: {problem}")]
    CredentialsFile {
        /// File path.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A size bound in a MIG description or template label is not a number.
    #[error("MIG {mig}: {field} `{key}` has the non-numeric value {value:?}")]
    BadBound {
        /// MIG name.
        mig: String,
        /// Where the bound was read (description or template label).
        field: &'static str,
        /// The key, `gpuscale-min` or `gpuscale-max`.
        key: String,
        /// The bad value.
        value: String,
    },
    /// `gpuscale-min` is larger than `gpuscale-max`.
    #[error("MIG {mig}: gpuscale-min {min} is larger than gpuscale-max {max}")]
    InvertedBounds {
        /// MIG name.
        mig: String,
        /// Minimum.
        min: u32,
        /// Maximum.
        max: u32,
    },
    /// The template names a GPU that [`crate::model::GpuCatalog`] does not know.
    #[error("instance template {template} (machine type {machine_type}): unknown accelerator type {accelerator:?}")]
    UnknownAccelerator {
        /// Template name.
        template: String,
        /// Machine type.
        machine_type: String,
        /// Accelerator type name.
        accelerator: String,
    },
    /// The template attaches more than one GPU type.
    #[error("instance template {template}: mixes accelerator types {types:?}")]
    MixedAccelerators {
        /// Template name.
        template: String,
        /// The types.
        types: Vec<String>,
    },
    /// A response lacks a field the adapter needs, or it has a value it cannot use.
    #[error("{object}: field `{field}` {problem}")]
    Response {
        /// The object, e.g. `MIG gpu-a100 in us-central1-a`.
        object: String,
        /// The field.
        field: &'static str,
        /// What is wrong, with the value.
        problem: String,
    },
    /// A zone operation finished with errors that have no more specific class.
    #[error("operation {operation} ({op_type} on {target}) failed: {errors}")]
    Operation {
        /// Operation name.
        operation: String,
        /// `operationType`, e.g. `compute.instanceGroupManagers.resize`.
        op_type: String,
        /// `targetLink`.
        target: String,
        /// `code: message` of each error.
        errors: String,
    },
    /// A zone operation did not finish in time.
    #[error("operation {operation} in zone {zone} still {status} after {waited:?}")]
    OperationTimeout {
        /// Operation name.
        operation: String,
        /// Zone.
        zone: String,
        /// Last status seen.
        status: String,
        /// How long we waited.
        waited: Duration,
    },
}
