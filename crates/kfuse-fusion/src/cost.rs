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
}

impl Default for FixedCostModel {
    fn default() -> Self {
        FixedCostModel {
            bytes_per_second: 20e9,
            seconds_per_weight: 0.1e-9,
            kernel_seconds: 5e-6,
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

    fn describe(&self) -> String {
        format!(
            "{:.1} GB/s, {:.3} ns per op-weight element, {:.1} us per kernel",
            self.bytes_per_second / 1e9,
            self.seconds_per_weight * 1e9,
            self.kernel_seconds * 1e6
        )
    }
}
