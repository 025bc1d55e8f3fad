//! Profitability: the cost model the partitioner consults.

use kfuse_ir::{BinaryOp, DType, Op, UnaryOp};

/// What fusion decisions are priced in. Implementations estimate seconds; the partitioner only
/// compares estimates, so consistent relative figures are what matter.
pub trait CostModel {
    /// Seconds to move `bytes` between DRAM and the core (read or write).
    fn memory_seconds(&self, bytes: f64) -> f64;
    /// Seconds to compute one element of `op` on `dtype`, in a vectorized kernel.
    fn element_seconds(&self, op: &Op, dtype: DType) -> f64;
    /// Fixed seconds per kernel launch (dispatch, thread wake-up).
    fn kernel_seconds(&self) -> f64;
    /// A short description for `kfuse explain`.
    fn describe(&self) -> String;
    /// The most one generated kernel may hold. The C compiler's time grows faster than linearly
    /// with the size of one function, so past these limits the partitioner stores a value and
    /// starts another kernel.
    fn kernel_limits(&self) -> KernelLimits {
        KernelLimits::default()
    }
}

/// How large one fused kernel may grow, counted as lowering emits it: every evaluation of a
/// node at each distinct index it is read at, so that a value recomputed under several shifted
/// views counts once per view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLimits {
    /// Kernel IR instructions: arithmetic, index arithmetic, loads and stores.
    pub instructions: usize,
    /// Evaluations of transcendental functions (see [`transcendental`]), each of which the C
    /// backend expands into a polynomial in every vector block.
    pub transcendentals: usize,
}

impl Default for KernelLimits {
    /// GCC compiles a kernel at these limits in seconds, and its time grows faster than the
    /// kernel beyond them (`docs/benchmarks.md`, "Compile time"). Splitting a chain here costs
    /// one store and one load per few hundred operations, which is lost in the compute.
    fn default() -> Self {
        KernelLimits {
            instructions: 512,
            transcendentals: 16,
        }
    }
}

/// Whether `op` is a transcendental function: one the backends evaluate as a polynomial of
/// some dozens of instructions rather than one machine instruction.
pub fn transcendental(op: &Op) -> bool {
    match op {
        Op::Unary(u) => matches!(
            u,
            UnaryOp::Exp
                | UnaryOp::Exp2
                | UnaryOp::Expm1
                | UnaryOp::Log
                | UnaryOp::Log2
                | UnaryOp::Log1p
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Softplus
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Erf
                | UnaryOp::Gelu
                | UnaryOp::GeluTanh
        ),
        Op::Binary(BinaryOp::Pow) => true,
        _ => false,
    }
}

/// Relative cost of one element of an op, in units of one vector add.
pub fn op_weight(op: &Op) -> f64 {
    match op {
        Op::Unary(u) => match u {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Not | UnaryOp::Sign => 1.0,
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => 1.0,
            UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal => 4.0,
            UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Expm1 => 12.0,
            UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Log1p => 14.0,
            UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Softplus => 20.0,
            UnaryOp::Sin | UnaryOp::Cos => 24.0,
            UnaryOp::Erf | UnaryOp::Gelu | UnaryOp::GeluTanh => 40.0,
        },
        Op::Binary(BinaryOp::Div) => 4.0,
        Op::Binary(BinaryOp::Pow) => 60.0,
        Op::Binary(BinaryOp::Rem) => 8.0,
        Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Clamp | Op::Cast { .. } => 1.0,
        Op::Reduce { .. } => 1.0,
        Op::Iota { .. } => 1.0,
        // Movement ops are index arithmetic: a few integer ops per element.
        Op::Reshape { .. } | Op::Permute { .. } | Op::Broadcast { .. } | Op::Slice { .. } => 0.5,
        Op::Pad { .. } | Op::Concat { .. } | Op::Flip { .. } => 1.0,
        _ => 0.0,
    }
}

/// A cost model with fixed coefficients: deterministic, for tests and reproducible partitions.
/// The defaults describe this project's reference machine (2 cores, AVX-512, about 20 GB/s).
#[derive(Clone, Debug, PartialEq)]
pub struct FixedCostModel {
    pub bytes_per_second: f64,
    /// Seconds per element of an op of weight 1 (one vector add).
    pub seconds_per_weight: f64,
    pub kernel_seconds: f64,
    pub limits: KernelLimits,
}

impl Default for FixedCostModel {
    fn default() -> Self {
        FixedCostModel {
            bytes_per_second: 20e9,
            seconds_per_weight: 0.1e-9,
            kernel_seconds: 5e-6,
            limits: KernelLimits::default(),
        }
    }
}

impl FixedCostModel {
    /// The same text as [`CostModel::describe`], without the trait in scope.
    pub fn describe_fixed(&self) -> String {
        CostModel::describe(self)
    }
}

impl CostModel for FixedCostModel {
    fn memory_seconds(&self, bytes: f64) -> f64 {
        bytes / self.bytes_per_second
    }

    fn element_seconds(&self, op: &Op, dtype: DType) -> f64 {
        let width = if dtype.size_bytes() == 8 { 2.0 } else { 1.0 };
        op_weight(op) * self.seconds_per_weight * width
    }

    fn kernel_seconds(&self) -> f64 {
        self.kernel_seconds
    }

    fn kernel_limits(&self) -> KernelLimits {
        self.limits
    }

    fn describe(&self) -> String {
        format!(
            "{:.1} GB/s, {:.3} ns per op-weight element, {:.1} us per kernel",
            self.bytes_per_second / 1e9,
            self.seconds_per_weight * 1e9,
            self.kernel_seconds * 1e6
        )
    }
}
