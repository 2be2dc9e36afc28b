//! Trace replays through the scheduler.

pub mod autoscale;
pub mod inflation;
pub mod kubectl_list;
pub mod synthetic;
pub mod tenants;
