//! The kfuse fusion partitioner.
//!
//! [`partition`] cuts a graph into kernels: which values are stored to memory (each with the
//! reason) and which nodes each kernel recomputes from registers. Profitability questions go to
//! a [`CostModel`] passed in.

pub mod cost;
mod partition;
pub mod structured;

pub use cost::{CostModel, FixedCostModel, KernelLimits};
pub use kfuse_ir::{Activation, Bounds};
pub use partition::{
    partition, print_partition, row_axes, splits_rows, FusePolicy, FusionDecision, Kernel,
    KernelKind, Partition, MIN_ROW,
};
pub use structured::{ActivationNode, Chain, StructuredGroup};
