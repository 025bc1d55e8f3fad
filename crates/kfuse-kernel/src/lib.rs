//! The kfuse kernel IR and its lowering from fusion partitions.

pub mod ir;
mod lower;
mod program;
pub mod text;

pub use ir::{Access, Arg, IndexOp, Inst, InstId, InstKind, Kernel, Level};
pub use kfuse_fusion::{Activation, Bounds};
pub use lower::{lower, LowerError};
pub use program::{
    Anchor, BufId, Buffer, BufferKind, Depthwise, Expand, Pooled, Program, Step, StructuredCall,
};
