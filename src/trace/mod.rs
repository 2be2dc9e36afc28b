//! Reading workload traces.

pub mod openb;
