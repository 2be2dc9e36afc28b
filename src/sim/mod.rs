//! Trace replays through the scheduler.

pub mod inflation;
pub mod synthetic;
pub mod autoscale;
