//! The in-cluster controller (`gpuscale run`): observability, status and RBAC pieces.

pub mod health;
pub mod metrics;
pub mod rbac;
pub mod status;
