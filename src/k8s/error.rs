//! Errors of snapshot loading, each naming where the bad input is.

use super::quantity::QuantityError;
use std::path::PathBuf;
use thiserror::Error;

/// Why a snapshot could not be read or converted. Every variant names the file (or in-memory
/// origin), and the object and field where that applies, so a user can fix the input.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The file or directory could not be read.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// The input is not text within the limits (binary, too large, nested too deep).
    #[error("{origin}: {reason}")]
    Text {
        /// File, folder entry or `<stdin>`.
        origin: String,
        /// What is wrong with it.
        reason: crate::textfile::TextError,
    },
    /// Malformed JSON.
    #[error("{}:{line}:{column}: invalid JSON: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// Malformed YAML.
    #[error("{}:{line}:{column}: invalid YAML: {message}", path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 when the parser gave none).
        line: usize,
        /// 1-based column (0 when the parser gave none).
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// An object does not have the shape of its kind.
    #[error("{origin}: {object}: {field}: {message}")]
    Decode {
        /// File (and document or list item) the object came from.
        origin: String,
        /// `Kind namespace/name`.
        object: String,
        /// Path of the offending field.
        field: String,
        /// The deserializer's message.
        message: String,
    },
    /// A resource quantity that does not parse or does not fit its resource.
    #[error("{origin}: {object}: {field}: invalid quantity {value:?}: {reason}")]
    Quantity {
        /// File (and document or list item) the object came from.
        origin: String,
        /// `Kind namespace/name`.
        object: String,
        /// Field path, e.g. `status.allocatable.cpu`.
        field: String,
        /// The offending value.
        value: String,
        /// What is wrong with it.
        reason: QuantityError,
    },
    /// The input is not Kubernetes objects at all: empty, `null`, an empty array, an object
    /// without `kind`, a List whose `items` is not an array of objects, an empty folder.
    #[error("{origin}: {reason}")]
    NotObjects {
        /// File (and document or list item), or folder.
        origin: String,
        /// What is there instead.
        reason: String,
    },
    /// A file with no objects at all: empty, only comments, `null` or `[]`.
    #[error(
        "{origin}: no Kubernetes objects (empty, null or []); an empty cluster is a List with items: []"
    )]
    Empty {
        /// The file.
        origin: String,
    },
    /// A field whose value the model cannot represent or that contradicts another field.
    #[error("{origin}: {object}: {field}: {value:?}: {reason}")]
    Invalid {
        /// File (and document or list item) the object came from.
        origin: String,
        /// `Kind namespace/name`.
        object: String,
        /// Field path, e.g. `metadata.labels[nvidia.com/gpu.replicas]`.
        field: String,
        /// The offending value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where an object came from and what it is called, to build errors and warnings.
#[derive(Debug, Clone)]
pub(crate) struct ObjCtx<'a> {
    pub origin: &'a str,
    pub object: String,
}

impl ObjCtx<'_> {
    pub fn invalid(
        &self,
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> SnapshotError {
        SnapshotError::Invalid {
            origin: self.origin.to_string(),
            object: self.object.clone(),
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    pub fn quantity(&self, field: impl Into<String>, value: &str, reason: QuantityError) -> SnapshotError {
        SnapshotError::Quantity {
            origin: self.origin.to_string(),
            object: self.object.clone(),
            field: field.into(),
            value: value.to_string(),
            reason,
        }
    }

    pub fn warning(&self, message: impl std::fmt::Display) -> String {
        format!("{}: {}: {message}", self.origin, self.object)
    }
}
