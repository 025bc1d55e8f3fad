//! kfuse: a tensor compiler and runtime.
//!
//! Programs come in through the lazy [`Tensor`] API or as `.kf` text ([`parse`]), and run on the
//! reference interpreter. Later backends compile the same graphs into fused kernels.
//!
//! ```
//! use kfuse::{Context, DType};
//!
//! let cx = Context::new();
//! let x = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
//! let y = (x.exp() + 1.0).log();          // softplus, written out
//! let s = y.sum(&[1], false);             // row sums
//! let values: Vec<f32> = s.to_vec().unwrap();
//! assert_eq!(values.len(), 2);
//! assert!((values[0] - (2.0f32.exp().ln_1p() + 1.0f32.exp().ln_1p())).abs() < 1e-5);
//!
//! // Named inputs are bound when the program runs.
//! let a = cx.input("a", DType::F32, &[3]);
//! let b = a.softmax(-1);
//! let out = cx.run(&[("b", &b)], &[("a", kfuse::Array::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap())]).unwrap();
//! let probs: &[f32] = out[0].as_slice().unwrap();
//! assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! ```

mod nn;
mod tensor;

pub use kfuse_cpu::Numerics;
pub use kfuse_fusion::{CostModel, FixedCostModel, FusePolicy};
pub use kfuse_interp::{CustomOps, InterpError, RunStats};
pub use kfuse_ir::text::{parse_graph, print_graph, ParseError};
pub use kfuse_ir::{
    bf16, f16, Array, BinaryOp, CompareOp, Conv2dAttrs, DType, Element, Graph, Ieee64, IrError,
    Layout, NodeId, Op, PadMode, Pool2dAttrs, PoolKind, ReduceOp, RngDist, Shape, Storage,
    TensorType, UnaryOp, Value,
};
pub use kfuse_npy as npy;
pub use kfuse_runtime::{Backend, CacheAligned, Executable, Options, Tier};
pub use tensor::{cat, where_, Context, Tensor};
pub use {
    kfuse_cpu as cpu, kfuse_fusion as fusion, kfuse_kernel as kernel, kfuse_opt as opt,
    kfuse_routines as routines, kfuse_runtime as runtime,
};

/// Errors of the kfuse API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation was given operands it cannot take. `location` is the caller's source
    /// position.
    #[error("{location}: {message}")]
    Build { location: String, message: String },
    #[error(transparent)]
    Ir(#[from] IrError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Run(#[from] InterpError),
    #[error(transparent)]
    Npy(#[from] kfuse_npy::NpyError),
    #[error(transparent)]
    Compiled(#[from] kfuse_runtime::RunError),
}

/// Compiles a graph: partition with `options.policy`, lower, and compile kernels (C where
/// possible, the tile interpreter elsewhere).
pub fn compile(
    graph: &Graph,
    options: &Options,
    cost: &dyn CostModel,
) -> Result<Executable, Error> {
    Ok(kfuse_runtime::compile_with(graph, options, cost)?)
}

/// Parses `.kf` program text.
pub fn parse(text: &str) -> Result<Graph, Error> {
    Ok(parse_graph(text)?)
}

/// Runs a graph on the reference interpreter with named inputs; returns the named outputs.
pub fn run_graph(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<Vec<(String, Array)>, Error> {
    Ok(kfuse_interp::run(graph, inputs, custom)?)
}

/// As [`run_graph`], also returning the interpreter's [`RunStats`].
pub fn run_graph_with_stats(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<(Vec<(String, Array)>, RunStats), Error> {
    Ok(kfuse_interp::run_with_stats(graph, inputs, custom)?)
}

#[cfg(test)]
mod literal_inference {
    #[test]
    fn float_and_integer_literals_infer() {
        let cx = crate::Context::new();
        let x = cx.tensor(&[1i32, 2, 3], &[3]);
        let y = (&x + 1) * 2 - 1.0;
        assert_eq!(y.to_vec::<i32>().unwrap(), vec![3, 5, 7]);
    }
}
