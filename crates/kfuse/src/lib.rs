//! kfuse: a tensor compiler and runtime.
//!
//! Programs come in through the lazy [`Tensor`] API or as `.kf` text ([`parse`]). They run
//! compiled: partitioned into fused kernels, each compiled to C (cached on disk) or run on the
//! tile interpreter where no C compiler is found. The reference interpreter runs the same graphs
//! op by op ([`Context::run_reference`], [`run_graph`]); it is what the compiled code is tested
//! against.
//!
//! ```
//! use kfuse::{Array, Context, DType};
//!
//! let cx = Context::new();
//! let x = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
//! let y = (x.exp() + 1.0).log();          // softplus, written out
//! let s = y.sum(&[1], false);             // row sums
//! let values: Vec<f32> = s.to_vec().unwrap();
//! assert_eq!(values.len(), 2);
//! assert!((values[0] - (2.0f32.exp().ln_1p() + 1.0f32.exp().ln_1p())).abs() < 1e-5);
//!
//! // Named inputs are bound when the program runs. `compile` gives a program to run again and
//! // again with new inputs; `cx.run(outputs, inputs)` compiles and runs once.
//! let a = cx.input("a", DType::F32, &[3]);
//! let b = a.softmax(-1);
//! let f = cx.compile(&[("b", &b)]).unwrap();
//! assert_eq!(f.kernel_count(), 1);
//! let out = f.run([("a", Array::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap())]).unwrap();
//! let probs: &[f32] = out[0].as_slice().unwrap();
//! assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! let again = f.run([("a", Array::from_vec(vec![3], vec![0.0f32; 3]).unwrap())]).unwrap();
//! assert!((again[0].as_slice::<f32>().unwrap()[0] - 1.0 / 3.0).abs() < 1e-6);
//! ```

mod compiled;
mod composite;
mod einsum;
mod nn;
mod tensor;

pub use compiled::{Compiled, CompiledRunner, IntoInput};
pub use composite::stack;
pub use einsum::einsum;
pub use kfuse_autodiff as autodiff;
pub use kfuse_cpu::Numerics;
pub use kfuse_fusion::{CostModel, FixedCostModel, FusePolicy};
pub use kfuse_interp::{CustomOps, InterpError, RunStats};
pub use kfuse_ir::text::{parse_graph, print_graph, ParseError};
pub use kfuse_ir::{
    bf16, f16, AllocError, Array, BinaryOp, CompareOp, Conv2dAttrs, DType, Element, Graph, Ieee64,
    IrError, Layout, MemoryLimit, NodeId, Op, PadMode, Pool2dAttrs, PoolKind, ReduceOp, RngDist,
    Shape, Storage, TensorType, UnaryOp, Value,
};
pub use kfuse_npy as npy;
pub use kfuse_runtime::{Backend, CacheAligned, Executable, Options, Tier};
pub use nn::ConvTranspose2dAttrs;
pub use tensor::{cat, where_, Context, Operand, Tensor};
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
    /// Evaluating a tensor failed while running its program. `location` is the source position
    /// of the [`Tensor::to_vec`] or [`Tensor::to_array`] call.
    #[error("{location}: {source}")]
    Evaluate {
        location: String,
        source: Box<Error>,
    },
}

/// Compiles a graph: the graph passes, partitioning with `options.policy`, lowering, and
/// kernels compiled to C where a compiler is found (cached in `options.cache_dir`), the tile
/// interpreter elsewhere.
///
/// Fusion decisions use the fixed cost model, the reference machine's coefficients: partitions
/// are then the same on every machine and no calibration runs behind the caller's back (it
/// times kernels for about a second, and timings taken while other work runs would be cached
/// for good). [`compile_with_cost_model`] takes another model, such as the one
/// [`runtime::calibrated_cost_model`] measures for this machine (what `kfuse run` uses).
///
/// ```
/// let graph = kfuse::parse("%x = input() name=\"x\" : f32[8]\n%y = exp(%x)\noutput \"y\" = %y\n").unwrap();
/// let exe = kfuse::compile(&graph, &kfuse::Options::default()).unwrap();
/// assert_eq!(exe.program.steps.len(), 1);
/// ```
pub fn compile(graph: &Graph, options: &Options) -> Result<Executable, Error> {
    compile_with_cost_model(graph, options, &FixedCostModel::default())
}

/// As [`compile`], with the cost model that decides what to fuse given explicitly.
pub fn compile_with_cost_model(
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

/// Runs a graph on the reference interpreter with named inputs; returns the named outputs. A
/// result larger than the memory the machine has available is an error naming its node.
pub fn run_graph(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<Vec<(String, Array)>, Error> {
    run_graph_with_stats(graph, inputs, custom).map(|(outputs, _)| outputs)
}

/// As [`run_graph`], also returning the interpreter's [`RunStats`].
pub fn run_graph_with_stats(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<(Vec<(String, Array)>, RunStats), Error> {
    let limit = kfuse_runtime::available_memory();
    Ok(kfuse_interp::run_with_limit(graph, inputs, custom, limit)?)
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
