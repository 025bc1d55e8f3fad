//! The kfuse CPU backend: kernel IR rendered to C, compiled with the system compiler into a cached
//! shared object and run on the routines' spin-then-park thread pool; and the tile interpreter,
//! which runs kernel IR directly where no compiler exists or a kernel cannot be rendered. The
//! hand-written routines (GEMM, convolutions, pooling) live in `kfuse-routines`.

pub mod c;
mod compile;
mod launch;
pub mod tile;

pub use compile::{
    default_cache_dir, CacheOutcome, CompiledKernel, Compiler, KernelFn, Numerics, VectorReport,
};
pub use kfuse_routines::Pool;
pub use launch::{launch, launch_on, storage_ptr, GRAIN};
