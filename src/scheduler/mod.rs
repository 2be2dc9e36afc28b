//! The placement scheduler: which node and which GPUs a workload gets.
//!
//! Placement is split in three: [`fit`] decides where a workload may go and enumerates the device
//! choices on a node; a [`policy::Policy`] scores each choice; [`placer::Placer`] runs the loop over
//! a cluster, caching scores per node and workload shape so that a node is re-scored only when
//! its allocations change. Everything here is pure: no clock, no I/O, randomness from a seed.

pub mod fit;
pub mod interpod;
pub mod placer;
pub mod policy;
mod view;

pub use fit::Unfit;
pub use placer::{Placement, Placer};
pub use policy::{Policy, PolicyKind, TieBreak};
pub use view::FreeView;

/// Most GPUs one node may carry (the width of [`FreeView`]).
pub const MAX_GPUS_PER_NODE: usize = view::MAX_GPUS;
