//! The kfuse graph IR: dtypes, static shapes, the op set, the graph arena, per-op shape and dtype
//! inference, the verifier, and the `.kf` text form.
//!
//! This crate knows nothing about devices, buffers or execution.

mod activation;
mod array;
mod dtype;
mod error;
mod graph;
pub mod infer;
mod memory;
mod op;
pub mod shape;
pub mod text;

pub use activation::{Activation, Bounds};
pub use array::{Array, ArrayShapeError, Element, Storage};
pub use dtype::DType;
pub use error::{IrError, TypeError};
pub use graph::{Graph, Node, NodeId, Output, Value};
pub use half::{bf16, f16};
pub use memory::{readable_bytes, AllocError, MemoryLimit};
pub use op::{
    BinaryOp, CompareOp, Conv2dAttrs, Ieee64, Layout, Op, PadMode, Pool2dAttrs, PoolKind, ReduceOp,
    RngDist, UnaryOp,
};
pub use shape::{Shape, TensorType};
