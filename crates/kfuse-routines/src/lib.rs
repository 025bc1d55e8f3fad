//! kfuse's hand-written CPU routines: an f32 GEMM for AVX-512 (the `gemm` crate elsewhere),
//! batched matmul, convolutions in both layouts with the route table that picks one per shape,
//! pooling, the bias/residual/activation epilogues they apply while an output block is in cache,
//! and the thread pool they share with compiled kernels.
//!
//! The crate knows nothing of the compiler: it takes dense buffers ([`kfuse_ir::Storage`]),
//! views and attributes, and IR vocabulary ([`kfuse_ir::Activation`]) only. The backend and the
//! runtime call it; it calls no one but `kfuse-ir`, `kfuse-math` and `gemm`.

pub mod constants;
pub mod conv;
pub mod dense;
pub mod epilogue;
pub mod fpmode;
mod gemm;
pub mod matmul;
mod pool;
pub mod pooling;
mod prefetch;
mod simd;

pub use pool::{threads_from_env, Pool};

/// Kernels writing at least this many bytes stream their contiguous stores: the output cannot
/// stay in the last-level cache for its consumer anyway, and non-temporal stores skip reading
/// each line for ownership before overwriting it (a third of the traffic of `y = f(x)`).
pub const STREAM_MIN_BYTES: usize = 16 << 20;
