//! The kfuse CPU backend: kernel IR rendered to C, compiled with the system compiler into a cached
//! shared object and run on a spin-then-park thread pool; and the tile interpreter, which runs kernel IR directly where
//! no compiler exists or a kernel cannot be rendered.

pub mod c;
mod compile;
pub mod tile;

pub use compile::{
    default_cache_dir, CacheOutcome, CompiledKernel, Compiler, KernelFn, Numerics, VectorReport,
};
mod launch;
mod pool;
mod prefetch;
mod simd;
pub use launch::{launch, launch_on, storage_ptr, GRAIN};
pub use pool::Pool;
pub mod constants;
pub mod conv;
pub mod dense;
pub mod fpmode;
pub mod matmul;
pub mod pooling;
mod sgemm;
