//! The lazy tensor API: every operation appends a node to its context's graph.
//!
//! Operations never panic on bad operands. A failed operation yields a tensor that carries the
//! error (with the caller's source position); operations on it pass the error along, and it is
//! reported by [`Context::run`], [`Context::compile`], [`Tensor::to_vec`] or [`Tensor::ty`].
//!
//! A program runs compiled by default ([`Context::run`], [`Context::compile`]): fused kernels,
//! compiled C where a compiler is found. [`Context::run_reference`] runs it op by op on the
//! reference interpreter instead, and [`Tensor::to_vec`] uses the interpreter too, since a
//! value inspected while writing a program should not wait for a C compiler.

use std::cell::RefCell;
use std::panic::Location;
use std::rc::Rc;

use kfuse_fusion::CostModel;
use kfuse_interp::CustomOps;
use kfuse_ir::{
    Array, BinaryOp, CompareOp, Conv2dAttrs, DType, Element, Graph, IrError, Layout, Op, PadMode,
    Pool2dAttrs, PoolKind, ReduceOp, RngDist, Shape, Storage, TensorType, UnaryOp, Value,
};

use crate::compiled::{collect_inputs, Compiled, InputCheck, IntoInput};
use crate::{Error, Options};

struct Builder {
    graph: Graph,
    next_seed: u64,
    custom: CustomOps,
}

/// A graph under construction, shared by the tensors built in it. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    inner: Rc<RefCell<Builder>>,
}

impl Default for Context {
    fn default() -> Self {
        Context::new()
    }
}

/// A deferred error: where the failing call was made and what went wrong.
#[derive(Debug, Clone)]
struct BuildError {
    location: String,
    message: String,
}

impl From<&BuildError> for Error {
    fn from(e: &BuildError) -> Error {
        Error::Build {
            location: e.location.clone(),
            message: e.message.clone(),
        }
    }
}

/// A lazy tensor: a value in its context's graph, or the error that prevented it.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) cx: Context,
    value: Result<Value, Rc<BuildError>>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Ok(v) => write!(
                f,
                "Tensor(%{}#{}: {})",
                v.node.0,
                v.result,
                self.cx.inner.borrow().graph.ty(*v)
            ),
            Err(e) => write!(f, "Tensor(error at {}: {})", e.location, e.message),
        }
    }
}

fn here(location: &Location) -> String {
    format!(
        "{}:{}:{}",
        location.file(),
        location.line(),
        location.column()
    )
}

/// A Rust scalar given where a tensor operand is expected. It becomes a constant of the other
/// operand's dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar {
    Float(f64),
    Int(i64),
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Float(v) => write!(f, "{v:?}"),
            Scalar::Int(v) => write!(f, "{v}"),
        }
    }
}

/// `scalar` as a rank-0 array of `dtype`. Float dtypes round to nearest; integer and bool dtypes
/// take only values they hold exactly, since truncating would silently change the program
/// (`x.lt(0.5)` on integers would become `x < 0`).
fn exact_scalar(scalar: Scalar, dtype: DType) -> Result<Array, String> {
    let inexact = || format!("the scalar {scalar} is not exactly representable as {dtype}");
    let integer = match scalar {
        Scalar::Int(v) => Some(v),
        // The bounds are exact in f64; values at or above 2^63 fail the second test.
        Scalar::Float(v) if v.fract() == 0.0 && v >= -(2f64.powi(63)) && v < 2f64.powi(63) => {
            Some(v as i64)
        }
        Scalar::Float(_) => None,
    };
    let storage = match (dtype, scalar) {
        (DType::F32, Scalar::Float(v)) => Storage::F32(vec![v as f32]),
        (DType::F32, Scalar::Int(v)) => Storage::F32(vec![v as f32]),
        (DType::F64, Scalar::Float(v)) => Storage::F64(vec![v]),
        (DType::F64, Scalar::Int(v)) => Storage::F64(vec![v as f64]),
        (DType::F16, Scalar::Float(v)) => Storage::F16(vec![kfuse_ir::f16::from_f64(v)]),
        (DType::F16, Scalar::Int(v)) => Storage::F16(vec![kfuse_ir::f16::from_f64(v as f64)]),
        (DType::BF16, Scalar::Float(v)) => Storage::BF16(vec![kfuse_ir::bf16::from_f64(v)]),
        (DType::BF16, Scalar::Int(v)) => Storage::BF16(vec![kfuse_ir::bf16::from_f64(v as f64)]),
        (DType::I32, _) => Storage::I32(vec![integer
            .and_then(|v| i32::try_from(v).ok())
            .ok_or_else(inexact)?]),
        (DType::I64, _) => Storage::I64(vec![integer.ok_or_else(inexact)?]),
        (DType::U8, _) => Storage::U8(vec![integer
            .and_then(|v| u8::try_from(v).ok())
            .ok_or_else(inexact)?]),
        (DType::Bool, _) => Storage::Bool(vec![match integer {
            Some(0) => false,
            Some(1) => true,
            _ => return Err(inexact()),
        }]),
    };
    Ok(Array::new(Shape::scalar(), storage).expect("one element"))
}

/// An `f64` value as a rank-0 array of `dtype` (truncating toward zero for integers).
fn scalar_array(value: f64, dtype: DType) -> Array {
    let storage = match dtype {
        DType::F32 => Storage::F32(vec![value as f32]),
        DType::F64 => Storage::F64(vec![value]),
        DType::F16 => Storage::F16(vec![kfuse_ir::f16::from_f64(value)]),
        DType::BF16 => Storage::BF16(vec![kfuse_ir::bf16::from_f64(value)]),
        DType::I32 => Storage::I32(vec![value as i32]),
        DType::I64 => Storage::I64(vec![value as i64]),
        DType::U8 => Storage::U8(vec![value as u8]),
        DType::Bool => Storage::Bool(vec![value != 0.0]),
    };
    Array::new(Shape::scalar(), storage).expect("one element")
}

impl Context {
    /// An empty context. Random ops draw seeds 0, 1, 2, ... unless [`Context::set_seed`] says
    /// otherwise.
    pub fn new() -> Context {
        Context {
            inner: Rc::new(RefCell::new(Builder {
                graph: Graph::new(),
                next_seed: 0,
                custom: CustomOps::new(),
            })),
        }
    }

    /// Makes the next random op use `seed` (and the ones after it `seed + 1`, ...).
    pub fn set_seed(&self, seed: u64) {
        self.inner.borrow_mut().next_seed = seed;
    }

    pub(crate) fn error(&self, location: &Location, message: impl Into<String>) -> Tensor {
        Tensor {
            cx: self.clone(),
            value: Err(Rc::new(BuildError {
                location: here(location),
                message: message.into(),
            })),
        }
    }

    /// Adds a node; returns one tensor per result (or the error, for each).
    fn node(&self, location: &Location, op: Op, operands: &[&Tensor]) -> Vec<Tensor> {
        let mut values = Vec::with_capacity(operands.len());
        for t in operands {
            if !Rc::ptr_eq(&t.cx.inner, &self.inner) {
                return vec![self.error(
                    location,
                    format!("{}: an operand belongs to another Context", op.name()),
                )];
            }
            match &t.value {
                Ok(v) => values.push(*v),
                Err(e) => {
                    return vec![Tensor {
                        cx: self.clone(),
                        value: Err(e.clone()),
                    }]
                }
            }
        }
        let name = op.name();
        let added = self.inner.borrow_mut().graph.add_node(op, values);
        match added {
            Ok(id) => {
                let n = self.inner.borrow().graph.node(id).types.len() as u32;
                (0..n)
                    .map(|result| Tensor {
                        cx: self.clone(),
                        value: Ok(Value { node: id, result }),
                    })
                    .collect()
            }
            Err(IrError::Type { error, .. }) => {
                vec![self.error(location, format!("{name}: {error}"))]
            }
            Err(other) => vec![self.error(location, format!("{name}: {other}"))],
        }
    }

    pub(crate) fn node1(&self, location: &Location, op: Op, operands: &[&Tensor]) -> Tensor {
        self.node(location, op, operands).swap_remove(0)
    }

    /// A named input of the given type, bound when the program runs.
    #[track_caller]
    pub fn input(&self, name: &str, dtype: DType, shape: &[usize]) -> Tensor {
        self.node1(
            Location::caller(),
            Op::Input {
                name: name.into(),
                ty: TensorType::new(dtype, shape),
            },
            &[],
        )
    }

    /// A constant holding `array`.
    #[track_caller]
    pub fn constant(&self, array: Array) -> Tensor {
        self.node1(Location::caller(), Op::Constant { value: array }, &[])
    }

    /// A constant from a slice, in row-major order.
    #[track_caller]
    pub fn tensor<T: Element>(&self, data: &[T], shape: &[usize]) -> Tensor {
        self.from_vec(data.to_vec(), shape)
    }

    /// A constant from a vector, in row-major order.
    #[track_caller]
    pub fn from_vec<T: Element>(&self, data: Vec<T>, shape: &[usize]) -> Tensor {
        match Array::from_vec(shape.to_vec(), data) {
            Ok(array) => self.constant(array),
            Err(e) => self.error(Location::caller(), format!("constant: {e}")),
        }
    }

    /// A rank-0 constant.
    #[track_caller]
    pub fn scalar<T: Element>(&self, value: T) -> Tensor {
        self.constant(Array::scalar(value))
    }

    /// A tensor of `shape` filled with `value` (a broadcast scalar constant).
    #[track_caller]
    pub fn full(&self, value: f64, dtype: DType, shape: &[usize]) -> Tensor {
        self.constant(scalar_array(value, dtype))
            .broadcast_to(shape)
    }

    #[track_caller]
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Tensor {
        self.full(0.0, dtype, shape)
    }

    #[track_caller]
    pub fn ones(&self, dtype: DType, shape: &[usize]) -> Tensor {
        self.full(1.0, dtype, shape)
    }

    /// `[0, 1, ..., n-1]`.
    #[track_caller]
    pub fn arange(&self, n: usize, dtype: DType) -> Tensor {
        self.iota(dtype, &[n], 0)
    }

    /// Each element holds its index along `axis`.
    #[track_caller]
    pub fn iota(&self, dtype: DType, shape: &[usize], axis: usize) -> Tensor {
        self.node1(
            Location::caller(),
            Op::Iota {
                ty: TensorType::new(dtype, shape),
                axis,
            },
            &[],
        )
    }

    fn rng(&self, location: &Location, dist: RngDist, dtype: DType, shape: &[usize]) -> Tensor {
        let seed = {
            let mut b = self.inner.borrow_mut();
            let s = b.next_seed;
            b.next_seed = s.wrapping_add(1);
            s
        };
        self.node1(
            location,
            Op::Rng {
                ty: TensorType::new(dtype, shape),
                dist,
                seed,
            },
            &[],
        )
    }

    /// Uniform random numbers on `[0, 1)`.
    #[track_caller]
    pub fn rand(&self, dtype: DType, shape: &[usize]) -> Tensor {
        self.rng(Location::caller(), RngDist::Uniform, dtype, shape)
    }

    /// Standard normal random numbers.
    #[track_caller]
    pub fn randn(&self, dtype: DType, shape: &[usize]) -> Tensor {
        self.rng(Location::caller(), RngDist::Normal, dtype, shape)
    }

    /// Registers the function behind `custom` ops named `name`.
    pub fn register_custom(
        &self,
        name: &str,
        f: impl Fn(&[Array]) -> Result<Vec<Array>, String> + Send + Sync + 'static,
    ) {
        self.inner.borrow_mut().custom.register(name, f);
    }

    /// Calls the registered function `name` on `inputs`; it must return arrays of `outputs`' types.
    ///
    /// ```
    /// use kfuse::{Array, DType, TensorType};
    /// let cx = kfuse::Context::new();
    /// cx.register_custom("count_nan", |args| {
    ///     let v = args[0].as_slice::<f32>().ok_or("expects f32")?;
    ///     Ok(vec![Array::scalar(v.iter().filter(|x| x.is_nan()).count() as i64)])
    /// });
    /// let x = cx.tensor(&[1.0f32, f32::NAN, f32::NAN], &[3]);
    /// let n = cx.custom("count_nan", &[&x], &[TensorType::new(DType::I64, [])]).remove(0);
    /// assert_eq!(n.to_vec::<i64>().unwrap(), vec![2]);
    /// ```
    #[track_caller]
    pub fn custom(&self, name: &str, inputs: &[&Tensor], outputs: &[TensorType]) -> Vec<Tensor> {
        let op = Op::Custom {
            name: name.into(),
            outputs: outputs.to_vec(),
        };
        self.node(Location::caller(), op, inputs)
    }

    /// The graph computing `outputs` (only the nodes they need).
    #[track_caller]
    pub fn graph<N: AsRef<str>>(&self, outputs: &[(N, &Tensor)]) -> Result<Graph, Error> {
        let mut named = Vec::with_capacity(outputs.len());
        for (name, t) in outputs {
            if !Rc::ptr_eq(&t.cx.inner, &self.inner) {
                return Err(Error::Build {
                    location: here(Location::caller()),
                    message: format!("output {:?} belongs to another Context", name.as_ref()),
                });
            }
            match &t.value {
                Ok(v) => named.push((name.as_ref().to_string(), *v)),
                Err(e) => return Err(e.as_ref().into()),
            }
        }
        Ok(self.inner.borrow().graph.extract(&named)?)
    }

    /// The gradients of the scalar float `loss` with respect to each of `wrt`, as tensors of this
    /// context (reverse mode; see [`kfuse_autodiff::grad`]). The backward nodes join this
    /// context's graph, so the gradients run, compile and take part in further math like any
    /// tensor.
    #[track_caller]
    pub fn grad(&self, loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>, Error> {
        let location = Location::caller();
        let mut values = Vec::with_capacity(wrt.len());
        for t in std::iter::once(loss).chain(wrt.iter().copied()) {
            if !Rc::ptr_eq(&t.cx.inner, &self.inner) {
                return Err(Error::Build {
                    location: here(location),
                    message: "grad: a tensor belongs to another Context".into(),
                });
            }
            values.push(t.value()?);
        }
        let mut builder = self.inner.borrow_mut();
        let joint = kfuse_autodiff::grad(&builder.graph, values[0], &values[1..]).map_err(|e| {
            Error::Build {
                location: here(location),
                message: format!("grad: {e}"),
            }
        })?;
        // The joint graph extends this context's arena, so its new nodes keep their ids here.
        let first_new = builder.graph.nodes().len();
        for node in &joint.nodes()[first_new..] {
            builder
                .graph
                .add_node(node.op.clone(), node.operands.clone())?;
        }
        let gradients = &joint.outputs()[joint.outputs().len() - wrt.len()..];
        Ok(gradients
            .iter()
            .map(|o| Tensor {
                cx: self.clone(),
                value: Ok(o.value),
            })
            .collect())
    }

    /// How runs of `graph` (extracted from this context) check their inputs.
    fn input_check(&self, graph: &Graph) -> InputCheck {
        let types = |g: &Graph| -> Vec<(String, TensorType)> {
            g.inputs()
                .map(|(_, name, ty)| (name.to_string(), ty.clone()))
                .collect()
        };
        InputCheck {
            needed: types(graph),
            known: types(&self.inner.borrow().graph),
        }
    }

    /// Compiles the program computing `outputs` into fused kernels, to run as many times as
    /// needed; see [`Compiled`]. Uses the default [`Options`] (fast numerics, the cost policy,
    /// compiled C with the on-disk kernel cache) and the fixed cost model.
    #[track_caller]
    pub fn compile<N: AsRef<str>>(&self, outputs: &[(N, &Tensor)]) -> Result<Compiled, Error> {
        self.compile_with(
            outputs,
            &Options::default(),
            &kfuse_fusion::FixedCostModel::default(),
        )
    }

    /// As [`Context::compile`], with explicit options and cost model (strict numerics for
    /// results bit-identical to [`Context::run_reference`], the tile interpreter, another cache
    /// directory, a calibrated cost model).
    #[track_caller]
    pub fn compile_with<N: AsRef<str>>(
        &self,
        outputs: &[(N, &Tensor)],
        options: &Options,
        cost: &dyn CostModel,
    ) -> Result<Compiled, Error> {
        let graph = self.graph(outputs)?;
        let executable = crate::compile_with_cost_model(&graph, options, cost)?;
        let custom = self.inner.borrow().custom.clone();
        Ok(Compiled::new(executable, custom, self.input_check(&graph)))
    }

    /// Compiles the program computing `outputs` and runs it once on named inputs; returns the
    /// outputs in the order given. Every name in `inputs` must be an input of this context;
    /// inputs the outputs do not need are ignored. To run a program more than once, compile it
    /// once with [`Context::compile`]: this compiles on every call (kernels come from the disk
    /// cache after the first, but partitioning and loading are repeated).
    ///
    /// Inputs are `("x", array)` pairs with `&str` or `String` names, given by value (the
    /// arrays move into the run) or by reference (they are copied).
    #[track_caller]
    pub fn run<N: AsRef<str>>(
        &self,
        outputs: &[(N, &Tensor)],
        inputs: impl IntoIterator<Item = impl IntoInput>,
    ) -> Result<Vec<Array>, Error> {
        self.compile(outputs)?.run(inputs)
    }

    /// As [`Context::run`], on the reference interpreter: op by op, no fusion, no compiler. Its
    /// results are the ones compiled programs are tested against.
    #[track_caller]
    pub fn run_reference<N: AsRef<str>>(
        &self,
        outputs: &[(N, &Tensor)],
        inputs: impl IntoIterator<Item = impl IntoInput>,
    ) -> Result<Vec<Array>, Error> {
        let graph = self.graph(outputs)?;
        let bound = self.input_check(&graph).bind(collect_inputs(inputs))?;
        let results = crate::run_graph(&graph, &bound, &self.inner.borrow().custom)?;
        Ok(results.into_iter().map(|(_, a)| a).collect())
    }
}

/// Normalizes a possibly negative axis against `rank`.
pub(crate) fn norm_axis(axis: isize, rank: usize) -> Result<usize, String> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

impl Tensor {
    /// The context this tensor lives in.
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// The dtype and shape, or the error that prevented this tensor.
    pub fn ty(&self) -> Result<TensorType, Error> {
        match &self.value {
            Ok(v) => Ok(self.cx.inner.borrow().graph.ty(*v).clone()),
            Err(e) => Err(e.as_ref().into()),
        }
    }

    /// The dims, or the error that prevented this tensor.
    pub fn shape(&self) -> Result<Vec<usize>, Error> {
        self.ty().map(|t| t.shape.0)
    }

    /// The IR value, or the error that prevented this tensor.
    pub fn value(&self) -> Result<Value, Error> {
        self.value.clone().map_err(|e| e.as_ref().into())
    }

    /// Evaluates this tensor (it must not depend on inputs) on the reference interpreter and
    /// returns its array. A failure to build the tensor names the failing operation's call site;
    /// a failure to evaluate it names this call's.
    #[track_caller]
    pub fn to_array(&self) -> Result<Array, Error> {
        self.evaluate(Location::caller())
    }

    fn evaluate(&self, location: &Location) -> Result<Array, Error> {
        let no_inputs = std::iter::empty::<(&str, Array)>();
        match self.cx.run_reference(&[("out", self)], no_inputs) {
            Ok(mut arrays) => Ok(arrays.swap_remove(0)),
            Err(e @ Error::Build { .. }) => Err(e),
            Err(e) => Err(Error::Evaluate {
                location: here(location),
                source: Box::new(e),
            }),
        }
    }

    /// Evaluates this tensor as [`Tensor::to_array`] does and returns its elements in
    /// row-major order; `T` must be its dtype's element type.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, Error> {
        let location = Location::caller();
        let array = self.evaluate(location)?;
        match array.as_slice::<T>() {
            Some(s) => Ok(s.to_vec()),
            None => Err(Error::Build {
                location: here(location),
                message: format!("to_vec: the tensor is {}, not {}", array.dtype(), T::DTYPE),
            }),
        }
    }

    /// Whether this tensor was built without error.
    pub(crate) fn is_ok(&self) -> bool {
        self.value.is_ok()
    }

    pub(crate) fn rank(&self) -> usize {
        self.ty().map_or(0, |t| t.shape.rank())
    }

    pub(crate) fn dims(&self) -> Vec<usize> {
        self.shape().unwrap_or_default()
    }

    pub(crate) fn dtype_or_f32(&self) -> DType {
        self.ty().map_or(DType::F32, |t| t.dtype)
    }

    pub(crate) fn op(&self, location: &Location, op: Op, others: &[&Tensor]) -> Tensor {
        let mut operands = vec![self];
        operands.extend_from_slice(others);
        self.cx.node1(location, op, &operands)
    }

    /// Runs `f` with a normalized axis, or yields the axis error naming the operation `name`.
    pub(crate) fn with_axis(
        &self,
        location: &Location,
        name: &str,
        axis: isize,
        f: impl FnOnce(usize) -> Tensor,
    ) -> Tensor {
        match norm_axis(axis, self.rank()) {
            Ok(a) if self.value.is_ok() => f(a),
            _ => self
                .axis_error(location, name, axis)
                .unwrap_or_else(|| self.clone()),
        }
    }

    /// The tensor to return instead of computing operation `name` along `axis`: this tensor's
    /// own error, or the error that `axis` is out of range. Composites check their axis first
    /// with it, so that the error names them rather than a primitive inside.
    pub(crate) fn axis_error(
        &self,
        location: &Location,
        name: &str,
        axis: isize,
    ) -> Option<Tensor> {
        if let Err(e) = &self.value {
            return Some(Tensor {
                cx: self.cx.clone(),
                value: Err(e.clone()),
            });
        }
        norm_axis(axis, self.rank())
            .err()
            .map(|m| self.cx.error(location, format!("{name}: {m}")))
    }

    /// Runs `f` with normalized, sorted axes, or yields the axis error naming the operation
    /// `name`.
    pub(crate) fn with_axes(
        &self,
        location: &Location,
        name: &str,
        axes: &[isize],
        f: impl FnOnce(Vec<usize>) -> Tensor,
    ) -> Tensor {
        if let Err(e) = &self.value {
            return Tensor {
                cx: self.cx.clone(),
                value: Err(e.clone()),
            };
        }
        let mut normalized = Vec::with_capacity(axes.len());
        for &a in axes {
            match norm_axis(a, self.rank()) {
                Ok(a) => normalized.push(a),
                Err(m) => return self.cx.error(location, format!("{name}: {m}")),
            }
        }
        normalized.sort_unstable();
        if normalized.windows(2).any(|w| w[0] == w[1]) {
            return self
                .cx
                .error(location, format!("{name}: axes {axes:?} repeat an axis"));
        }
        f(normalized)
    }

    /// `scalar` as a constant of this tensor's dtype, or the error (naming the operation
    /// `name`) when that dtype cannot hold it exactly.
    pub(crate) fn scalar_like(&self, location: &Location, name: &str, scalar: Scalar) -> Tensor {
        match exact_scalar(scalar, self.dtype_or_f32()) {
            Ok(value) => self.cx.node1(location, Op::Constant { value }, &[]),
            Err(m) => self.cx.error(location, format!("{name}: {m}")),
        }
    }

    /// A binary op with `other` as the second operand.
    fn binary(&self, location: &Location, name: &str, op: Op, other: impl Operand) -> Tensor {
        let other = other.into_operand(self, name, location);
        self.op(location, op, &[&other])
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Tensor {
                    self.op(Location::caller(), Op::Unary(UnaryOp::$op), &[])
                }
            )*
        }
    };
}
unary_methods! {
    abs => Abs, sign => Sign, exp => Exp, exp2 => Exp2, log => Log, log2 => Log2,
    log1p => Log1p, expm1 => Expm1, sqrt => Sqrt, rsqrt => Rsqrt, reciprocal => Reciprocal,
    sin => Sin, cos => Cos, tanh => Tanh, sigmoid => Sigmoid, relu => Relu,
    /// GELU, erf form.
    gelu => Gelu,
    /// GELU, tanh approximation.
    gelu_tanh => GeluTanh,
    erf => Erf, softplus => Softplus, floor => Floor, ceil => Ceil,
    /// Round half to even.
    round => Round,
    /// Logical not of a bool tensor (also `!x`).
    logical_not => Not,
}

/// The second operand of a binary operation: a tensor, or a Rust scalar (`f32`, `f64`, `i32`,
/// `i64`) that becomes a constant of the tensor's dtype, as numpy and PyTorch treat Python
/// scalars: `x.ge(0.05)` compares an f16 tensor with f16 0.05. An integer or bool tensor takes
/// only scalars it holds exactly (`x.lt(0.5)` on integers is an error, not `x < 0`).
///
/// ```
/// let cx = kfuse::Context::new();
/// let x = cx.tensor(&[1i32, 5, 9], &[3]);
/// assert_eq!(x.ge(5).to_vec::<bool>().unwrap(), vec![false, true, true]);
/// assert_eq!(x.maximum(4.0).to_vec::<i32>().unwrap(), vec![4, 5, 9]);
/// assert!(x.lt(0.5).ty().unwrap_err().to_string().contains("lt: the scalar 0.5 is not exactly representable as i32"));
/// ```
pub trait Operand: sealed::Sealed {
    /// This operand as a tensor in `like`'s context: itself, or a constant of `like`'s dtype.
    /// `name` and `location` are the operation's, for the error when the dtype cannot hold the
    /// scalar.
    fn into_operand(self, like: &Tensor, name: &str, location: &Location) -> Tensor;

    /// The tensor, if this operand is one.
    fn as_tensor(&self) -> Option<&Tensor>;
}

mod sealed {
    /// Keeps [`Operand`](super::Operand) implemented only here, for tensors and the scalar
    /// types whose conversion is defined.
    pub trait Sealed {}
}

impl sealed::Sealed for Tensor {}
impl sealed::Sealed for &Tensor {}

impl Operand for Tensor {
    fn into_operand(self, _: &Tensor, _: &str, _: &Location) -> Tensor {
        self
    }

    fn as_tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}

impl Operand for &Tensor {
    fn into_operand(self, _: &Tensor, _: &str, _: &Location) -> Tensor {
        self.clone()
    }

    fn as_tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}

macro_rules! scalar_operand {
    ($($t:ty => $variant:ident as $wide:ty),* $(,)?) => {
        $(
            impl sealed::Sealed for $t {}
            impl Operand for $t {
                fn into_operand(self, like: &Tensor, name: &str, location: &Location) -> Tensor {
                    like.scalar_like(location, name, Scalar::$variant(self as $wide))
                }

                fn as_tensor(&self) -> Option<&Tensor> {
                    None
                }
            }
        )*
    };
}
scalar_operand!(f32 => Float as f64, f64 => Float as f64, i32 => Int as i64, i64 => Int as i64);

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr),* $(,)?) => {
        // `add`, `sub`, ... mirror the operators for PyTorch-style method chains.
        #[allow(clippy::should_implement_trait)]
        impl Tensor {
            $(
                $(#[$doc])*
                #[doc = ""]
                #[doc = "`other` is a tensor or a scalar of any [`Operand`] type."]
                #[track_caller]
                pub fn $name(&self, other: impl Operand) -> Tensor {
                    self.binary(Location::caller(), stringify!($name), $op, other)
                }
            )*
        }
    };
}
binary_methods! {
    add => Op::Binary(BinaryOp::Add), sub => Op::Binary(BinaryOp::Sub),
    mul => Op::Binary(BinaryOp::Mul),
    /// True division for floats, floor division for integers.
    div => Op::Binary(BinaryOp::Div),
    /// numpy `remainder` (the sign of the divisor).
    rem => Op::Binary(BinaryOp::Rem),
    pow => Op::Binary(BinaryOp::Pow),
    /// Elementwise maximum (NaN propagates).
    maximum => Op::Binary(BinaryOp::Max),
    /// Elementwise minimum (NaN propagates).
    minimum => Op::Binary(BinaryOp::Min),
    logical_and => Op::Binary(BinaryOp::And), logical_or => Op::Binary(BinaryOp::Or),
    logical_xor => Op::Binary(BinaryOp::Xor),
    eq => Op::Compare(CompareOp::Eq), ne => Op::Compare(CompareOp::Ne),
    lt => Op::Compare(CompareOp::Lt), le => Op::Compare(CompareOp::Le),
    gt => Op::Compare(CompareOp::Gt), ge => Op::Compare(CompareOp::Ge),
}

impl Tensor {
    /// Matrix product of operands of rank 2 or more; see [`Tensor::matmul`] for 1-D operands.
    #[track_caller]
    pub fn bmm(&self, other: &Tensor) -> Tensor {
        self.op(Location::caller(), Op::MatMul, &[other])
    }
}

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident, $all:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, axes: &[isize], keepdims: bool) -> Tensor {
                    let loc = Location::caller();
                    self.with_axes(loc, stringify!($name), axes, |axes| self.op(loc, Op::Reduce { op: ReduceOp::$op, axes, keepdims }, &[]))
                }
                #[doc = concat!("`", stringify!($name), "` over every axis, to a scalar.")]
                #[track_caller]
                pub fn $all(&self) -> Tensor {
                    let axes: Vec<isize> = (0..self.rank() as isize).collect();
                    let loc = Location::caller();
                    self.with_axes(loc, stringify!($all), &axes, |axes| self.op(loc, Op::Reduce { op: ReduceOp::$op, axes, keepdims: false }, &[]))
                }
            )*
        }
    };
}
reduce_methods! {
    /// Sum over `axes` (negative axes count from the end), in kfuse's documented order.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.arange(6, kfuse::DType::F32).reshape(&[2, 3]);
    /// assert_eq!(x.sum(&[-1], false).to_vec::<f32>().unwrap(), vec![3.0, 12.0]);
    /// assert_eq!(x.sum(&[0], true).shape().unwrap(), vec![1, 3]);
    /// ```
    sum, sum_all => Sum,
    prod, prod_all => Prod,
    /// Maximum over `axes` (NaN propagates).
    max, max_all => Max,
    min, min_all => Min,
    /// Mean over `axes` (float dtypes).
    mean, mean_all => Mean,
}

impl Tensor {
    /// Index of the first maximum along `axis` (i64); NaN counts as the maximum.
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdims: bool) -> Tensor {
        self.arg_reduce(Location::caller(), ReduceOp::ArgMax, axis, keepdims)
    }

    /// Index of the first minimum along `axis` (i64).
    #[track_caller]
    pub fn argmin(&self, axis: isize, keepdims: bool) -> Tensor {
        self.arg_reduce(Location::caller(), ReduceOp::ArgMin, axis, keepdims)
    }

    fn arg_reduce(&self, loc: &Location, op: ReduceOp, axis: isize, keepdims: bool) -> Tensor {
        self.with_axis(loc, op.name(), axis, |a| {
            self.op(
                loc,
                Op::Reduce {
                    op,
                    axes: vec![a],
                    keepdims,
                },
                &[],
            )
        })
    }

    /// Conversion to `dtype` (floats to integers truncate toward zero and saturate; NaN to 0).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        self.op(Location::caller(), Op::Cast { to: dtype }, &[])
    }

    /// `min(max(self, lo), hi)` with scalar bounds.
    #[track_caller]
    pub fn clamp(&self, lo: f64, hi: f64) -> Tensor {
        let loc = Location::caller();
        let l = self.scalar_like(loc, "clamp", Scalar::Float(lo));
        let h = self.scalar_like(loc, "clamp", Scalar::Float(hi));
        self.op(loc, Op::Clamp, &[&l, &h])
    }

    /// `min(max(self, lo), hi)` with broadcast tensor bounds.
    #[track_caller]
    pub fn clamp_tensor(&self, lo: &Tensor, hi: &Tensor) -> Tensor {
        self.op(Location::caller(), Op::Clamp, &[lo, hi])
    }

    /// The same elements in a new shape; one dim may be -1 and is then inferred.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.arange(6, kfuse::DType::I32).reshape(&[-1, 3]).t();
    /// assert_eq!(x.shape().unwrap(), vec![3, 2]);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), vec![0, 3, 1, 4, 2, 5]);
    /// ```
    #[track_caller]
    pub fn reshape(&self, shape: &[isize]) -> Tensor {
        let loc = Location::caller();
        if let Err(e) = &self.value {
            return Tensor {
                cx: self.cx.clone(),
                value: Err(e.clone()),
            };
        }
        let n: usize = self.dims().iter().product();
        let known: usize = shape
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let holes = shape.iter().filter(|&&d| d == -1).count();
        if shape.iter().any(|&d| d < -1)
            || holes > 1
            || (holes == 1 && (known == 0 || !n.is_multiple_of(known)))
        {
            return self.cx.error(
                loc,
                format!("reshape: cannot reshape {:?} to {shape:?}", self.dims()),
            );
        }
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| {
                if d == -1 {
                    n / known.max(1)
                } else {
                    d as usize
                }
            })
            .collect();
        self.op(
            loc,
            Op::Reshape {
                shape: Shape::new(dims),
            },
            &[],
        )
    }

    /// Reorders axes: output axis `i` is input axis `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[isize]) -> Tensor {
        let loc = Location::caller();
        let rank = self.rank();
        let perm: Result<Vec<usize>, String> = perm.iter().map(|&a| norm_axis(a, rank)).collect();
        match perm {
            Ok(perm) if self.value.is_ok() => self.op(loc, Op::Permute { perm }, &[]),
            Ok(_) => self.clone(),
            Err(m) => self.cx.error(loc, format!("permute: {m}")),
        }
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn transpose(&self, a: isize, b: isize) -> Tensor {
        let loc = Location::caller();
        let rank = self.rank();
        match (norm_axis(a, rank), norm_axis(b, rank)) {
            _ if self.value.is_err() => self.clone(),
            (Ok(a), Ok(b)) => {
                let mut perm: Vec<isize> = (0..rank as isize).collect();
                perm.swap(a, b);
                self.permute(&perm)
            }
            (Err(m), _) | (_, Err(m)) => self.cx.error(loc, format!("transpose: {m}")),
        }
    }

    /// Swaps the last two axes (the matrix transpose).
    #[track_caller]
    pub fn t(&self) -> Tensor {
        self.transpose(-2, -1)
    }

    /// numpy `broadcast_to`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Tensor {
        self.op(
            Location::caller(),
            Op::Broadcast {
                shape: Shape::new(shape.to_vec()),
            },
            &[],
        )
    }

    /// Inserts an axis of size 1 at `axis` (which may be `rank`, or negative).
    #[track_caller]
    pub fn unsqueeze(&self, axis: isize) -> Tensor {
        let loc = Location::caller();
        let mut dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        match norm_axis(axis, dims.len() + 1) {
            Ok(a) => {
                dims.insert(a, 1);
                self.reshape(&dims)
            }
            Err(m) => self.cx.error(loc, format!("unsqueeze: {m}")),
        }
    }

    /// Removes the size-1 axis `axis`.
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Tensor {
        let loc = Location::caller();
        self.with_axis(loc, "squeeze", axis, |a| {
            let mut dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
            if dims[a] != 1 {
                return self.cx.error(
                    loc,
                    format!("squeeze: axis {a} has size {}, not 1", dims[a]),
                );
            }
            dims.remove(a);
            self.reshape(&dims)
        })
    }

    /// Elements `start, start + step, ...` below `stop` along `axis`, with Python's rules for
    /// negative and out-of-range bounds.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.arange(6, kfuse::DType::I64);
    /// assert_eq!(x.slice(0, -4, 100, 2).to_vec::<i64>().unwrap(), vec![2, 4]);
    /// ```
    #[track_caller]
    pub fn slice(&self, axis: isize, start: isize, stop: isize, step: usize) -> Tensor {
        let loc = Location::caller();
        self.with_axis(loc, "slice", axis, |a| {
            let dims = self.dims();
            let n = dims[a] as isize;
            let clamp = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) } as usize;
            let (s, e) = (clamp(start), clamp(stop));
            let mut starts = vec![0; dims.len()];
            let mut stops = dims.clone();
            let mut steps = vec![1; dims.len()];
            starts[a] = s;
            stops[a] = e.max(s);
            steps[a] = step;
            self.op(
                loc,
                Op::Slice {
                    start: starts,
                    stop: stops,
                    step: steps,
                },
                &[],
            )
        })
    }

    /// `len` elements from `start` along `axis`.
    #[track_caller]
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Tensor {
        let loc = Location::caller();
        self.with_axis(loc, "narrow", axis, |a| {
            let dims = self.dims();
            let mut starts = vec![0; dims.len()];
            let mut stops = dims.clone();
            starts[a] = start;
            stops[a] = start.saturating_add(len);
            self.op(
                loc,
                Op::Slice {
                    start: starts,
                    stop: stops,
                    step: vec![1; dims.len()],
                },
                &[],
            )
        })
    }

    /// numpy `pad`: `(before, after)` for every axis.
    #[track_caller]
    pub fn pad(&self, widths: &[(usize, usize)], mode: PadMode, value: f64) -> Tensor {
        let low = widths.iter().map(|w| w.0).collect();
        let high = widths.iter().map(|w| w.1).collect();
        self.op(
            Location::caller(),
            Op::Pad {
                low,
                high,
                mode,
                value: kfuse_ir::Ieee64::new(value),
            },
            &[],
        )
    }

    /// Reverses the order of elements along `axes`.
    #[track_caller]
    pub fn flip(&self, axes: &[isize]) -> Tensor {
        let loc = Location::caller();
        self.with_axes(loc, "flip", axes, |axes| {
            self.op(loc, Op::Flip { axes }, &[])
        })
    }

    /// Matrix product with numpy's rules: batch dims broadcast, and a 1-D operand is treated as a
    /// row (left) or column (right) vector whose axis is removed from the result.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let a = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let v = cx.tensor(&[1.0f32, -1.0], &[2]);
    /// assert_eq!(a.matmul(&v).to_vec::<f32>().unwrap(), vec![-1.0, -1.0]);
    /// let batch = cx.ones(kfuse::DType::F32, &[5, 3, 2]);
    /// assert_eq!(batch.matmul(&a).shape().unwrap(), vec![5, 3, 2]);
    /// ```
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        let loc = Location::caller();
        let (ra, rb) = (self.rank(), other.rank());
        let a = if ra == 1 {
            self.op(
                loc,
                Op::Reshape {
                    shape: Shape::new(vec![1, self.dims()[0]]),
                },
                &[],
            )
        } else {
            self.clone()
        };
        let b = if rb == 1 {
            other.op(
                loc,
                Op::Reshape {
                    shape: Shape::new(vec![other.dims()[0], 1]),
                },
                &[],
            )
        } else {
            other.clone()
        };
        let mut c = a.op(loc, Op::MatMul, &[&b]);
        if rb == 1 {
            c = c.squeeze(-1);
        }
        if ra == 1 {
            c = c.squeeze(if rb == 1 { -1 } else { -2 });
        }
        c
    }

    /// 2-D convolution with a `[C_out, C_in/groups, KH, KW]` weight.
    #[track_caller]
    pub fn conv2d(&self, weight: &Tensor, attrs: Conv2dAttrs) -> Tensor {
        self.op(Location::caller(), Op::Conv2d(attrs), &[weight])
    }

    /// 2-D pooling with full control of the attributes.
    #[track_caller]
    pub fn pool2d(&self, attrs: Pool2dAttrs) -> Tensor {
        self.op(Location::caller(), Op::Pool2d(attrs), &[])
    }

    /// NCHW max pooling with a square `window`, `stride` and symmetric `padding`.
    #[track_caller]
    pub fn max_pool2d(&self, window: usize, stride: usize, padding: usize) -> Tensor {
        self.pool2d(square_pool(PoolKind::Max, window, stride, padding))
    }

    /// NCHW average pooling (padding excluded from the count).
    #[track_caller]
    pub fn avg_pool2d(&self, window: usize, stride: usize, padding: usize) -> Tensor {
        self.pool2d(square_pool(PoolKind::Avg, window, stride, padding))
    }

    /// `out[p] = self[p with p[axis] = index[p]]` (numpy `take_along_axis`). Negative indices
    /// count from the end; an index out of range fails the run with the node named.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.tensor(&[10.0f32, 20.0, 30.0], &[3]);
    /// let i = cx.tensor(&[2i64, -3], &[2]);
    /// assert_eq!(x.gather(0, &i).to_vec::<f32>().unwrap(), vec![30.0, 10.0]);
    /// ```
    #[track_caller]
    pub fn gather(&self, axis: isize, index: &Tensor) -> Tensor {
        let loc = Location::caller();
        self.with_axis(loc, "gather", axis, |a| {
            self.op(loc, Op::Gather { axis: a }, &[index])
        })
    }

    /// `out = self; out[p with p[axis] = index[p]] += src[p]`.
    #[track_caller]
    pub fn scatter_add(&self, axis: isize, index: &Tensor, src: &Tensor) -> Tensor {
        let loc = Location::caller();
        self.with_axis(loc, "scatter_add", axis, |a| {
            self.op(loc, Op::ScatterAdd { axis: a }, &[index, src])
        })
    }

    /// Stable sort along `axis`: `(values, indices)`. NaN sorts above every number.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let (values, order) = cx.tensor(&[2.0f32, f32::NAN, -1.0], &[3]).sort(0, false);
    /// assert_eq!(order.to_vec::<i64>().unwrap(), vec![2, 0, 1]);
    /// ```
    #[track_caller]
    pub fn sort(&self, axis: isize, descending: bool) -> (Tensor, Tensor) {
        let loc = Location::caller();
        let mut results = vec![];
        let first = self.with_axis(loc, "sort", axis, |a| {
            results = self.cx.node(
                loc,
                Op::Sort {
                    axis: a,
                    descending,
                },
                &[self],
            );
            results[0].clone()
        });
        pair(first, results)
    }

    /// The indices that sort along `axis`.
    #[track_caller]
    pub fn argsort(&self, axis: isize, descending: bool) -> Tensor {
        self.sort(axis, descending).1
    }

    /// The `k` largest (or smallest) along `axis`, in order: `(values, indices)`.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let (v, i) = cx.tensor(&[1, 9, 4, 9], &[4]).topk(2, -1, true);
    /// assert_eq!((v.to_vec::<i32>().unwrap(), i.to_vec::<i64>().unwrap()), (vec![9, 9], vec![1, 3]));
    /// ```
    #[track_caller]
    pub fn topk(&self, k: usize, axis: isize, largest: bool) -> (Tensor, Tensor) {
        let loc = Location::caller();
        let mut results = vec![];
        let first = self.with_axis(loc, "topk", axis, |a| {
            results = self.cx.node(
                loc,
                Op::TopK {
                    axis: a,
                    k,
                    largest,
                },
                &[self],
            );
            results[0].clone()
        });
        pair(first, results)
    }
}

fn pair(first: Tensor, mut results: Vec<Tensor>) -> (Tensor, Tensor) {
    if results.len() == 2 {
        let second = results.pop().expect("two results");
        (results.pop().expect("two results"), second)
    } else {
        (first.clone(), first)
    }
}

fn square_pool(kind: PoolKind, window: usize, stride: usize, padding: usize) -> Pool2dAttrs {
    Pool2dAttrs {
        kind,
        layout: Layout::Nchw,
        window: [window, window],
        stride: [stride, stride],
        padding: [padding; 4],
        dilation: [1, 1],
        count_include_pad: false,
    }
}

/// `a` where `cond` holds, else `b` (numpy `where`), with broadcasting. One of `a` and `b` may
/// be a scalar, which takes the other's dtype.
///
/// ```
/// let cx = kfuse::Context::new();
/// let x = cx.tensor(&[-1.0f32, 2.0], &[2]);
/// let y = kfuse::where_(&x.lt(0.0), 0.0, &x);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
/// ```
#[track_caller]
pub fn where_(cond: &Tensor, a: impl Operand, b: impl Operand) -> Tensor {
    let loc = Location::caller();
    let like = match (a.as_tensor(), b.as_tensor()) {
        (Some(t), _) | (None, Some(t)) => t.clone(),
        (None, None) => {
            return cond.cx.error(
                loc,
                "where: a and b are both scalars; one must be a tensor to give the dtype",
            )
        }
    };
    let a = a.into_operand(&like, "where", loc);
    let b = b.into_operand(&like, "where", loc);
    cond.op(loc, Op::Select, &[&a, &b])
}

/// Concatenation along `axis`.
#[track_caller]
pub fn cat(parts: &[&Tensor], axis: isize) -> Tensor {
    let loc = Location::caller();
    match parts.first() {
        None => Context::new().error(loc, "cat: no tensors given"),
        Some(first) => first.with_axis(loc, "cat", axis, |a| {
            first.cx.node1(loc, Op::Concat { axis: a }, parts)
        }),
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:expr) => {
        // One impl per left-hand side covers every right-hand side, tensor or scalar: with one
        // impl the result type is known before an unsuffixed literal's type is, so that
        // `(x.exp() + 1.0).log()` needs no annotation.
        impl<O: Operand> std::ops::$trait<O> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: O) -> Tensor {
                let op = $op;
                self.binary(Location::caller(), op.name(), op, rhs)
            }
        }
        impl<O: Operand> std::ops::$trait<O> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: O) -> Tensor {
                let op = $op;
                self.binary(Location::caller(), op.name(), op, rhs)
            }
        }
        // A scalar on the left is an `f64` or an `i64` only: a second float (or integer) type
        // would leave `1.0 - &x` ambiguous until the literal's type falls back, too late for a
        // method called on the result.
        operator!(@scalar $trait, $method, $op, f64);
        operator!(@scalar $trait, $method, $op, i64);
    };
    (@scalar $trait:ident, $method:ident, $op:expr, $s:ty) => {
        impl std::ops::$trait<&Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                let (loc, op) = (Location::caller(), $op);
                let c = self.into_operand(rhs, op.name(), loc);
                c.op(loc, op, &[rhs])
            }
        }
        impl std::ops::$trait<Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                let (loc, op) = (Location::caller(), $op);
                let c = self.into_operand(&rhs, op.name(), loc);
                c.op(loc, op, &[&rhs])
            }
        }
    };
}
operator!(Add, add, Op::Binary(BinaryOp::Add));
operator!(Sub, sub, Op::Binary(BinaryOp::Sub));
operator!(Mul, mul, Op::Binary(BinaryOp::Mul));
operator!(Div, div, Op::Binary(BinaryOp::Div));
operator!(Rem, rem, Op::Binary(BinaryOp::Rem));
operator!(BitAnd, bitand, Op::Binary(BinaryOp::And));
operator!(BitOr, bitor, Op::Binary(BinaryOp::Or));
operator!(BitXor, bitxor, Op::Binary(BinaryOp::Xor));

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.op(Location::caller(), Op::Unary(UnaryOp::Neg), &[])
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.op(Location::caller(), Op::Unary(UnaryOp::Neg), &[])
    }
}

impl std::ops::Not for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        self.op(Location::caller(), Op::Unary(UnaryOp::Not), &[])
    }
}
