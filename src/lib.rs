//! gpuscale: a Kubernetes GPU cluster autoscaler and placement scheduler.
//!
//! The crate is split by how much of the outside world a module touches:
//! [`model`] and [`scheduler`] are pure data and decisions over a cluster snapshot, fast to build and
//! test; [`trace`] reads trace files; [`sim`] replays traces through the scheduler. Cloud and
//! Kubernetes I/O live in adapters behind cargo features.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "agent")]
pub mod agent;
pub mod config;
pub mod controller;
#[cfg(feature = "k8s")]
pub mod k8s;
pub mod limits;
pub mod model;
pub mod planner;
pub mod providers;
pub mod scheduler;
pub mod shown;
pub mod sim;
pub mod tenancy;
pub mod textfile;
#[cfg(any(feature = "controller", feature = "agent"))]
pub mod tls;
pub mod trace;
