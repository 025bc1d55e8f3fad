//! The activations a structured kernel (a GEMM or convolution routine) applies to its output
//! tiles. They are IR vocabulary shared by the partitioner, which recognises them in a graph, and
//! by the hand-written routines, which apply them, so that neither depends on the other.

use crate::{Op, UnaryOp};

/// The activations a structured kernel applies to its output tiles: elementwise, with a
/// vectorizable definition in `kfuse-math`, and of the value alone (a clamp's bounds are
/// constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    GeluTanh,
    /// GELU's erf form, `0.5 x (1 + erf(x / sqrt 2))`.
    Gelu,
    /// SiLU (swish), `mul(x, sigmoid(x))`: two nodes, the sigmoid rounded before the product.
    Silu,
    /// Hard-swish (MobileNetV3), `x * relu6(x + 3) / 6` as four nodes: `add(x, 3)`,
    /// `clamp(.., 0, 6)`, then either `div(mul(x, ..), 6)` (`divide_last`, the product
    /// first, as PyTorch's decomposition) or `mul(x, div(.., 6))` (the hard sigmoid first).
    HardSwish {
        divide_last: bool,
    },
    Sigmoid,
    Tanh,
    /// `clamp(x, lo, hi)` with constant bounds (ReLU6 is `clamp(x, 0, 6)`).
    Clamp(Bounds),
}

/// A clamp's constant bounds, kept as the bits of their f64 values (so that the activation
/// compares exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    lo: u64,
    hi: u64,
}

impl Bounds {
    pub fn new(lo: f64, hi: f64) -> Bounds {
        Bounds {
            lo: lo.to_bits(),
            hi: hi.to_bits(),
        }
    }

    pub fn lo(self) -> f64 {
        f64::from_bits(self.lo)
    }

    pub fn hi(self) -> f64 {
        f64::from_bits(self.hi)
    }
}

impl Activation {
    /// The activation a unary `op` computes, if it is one.
    pub fn of(op: &Op) -> Option<Activation> {
        match op {
            Op::Unary(UnaryOp::Relu) => Some(Activation::Relu),
            Op::Unary(UnaryOp::GeluTanh) => Some(Activation::GeluTanh),
            Op::Unary(UnaryOp::Gelu) => Some(Activation::Gelu),
            Op::Unary(UnaryOp::Sigmoid) => Some(Activation::Sigmoid),
            Op::Unary(UnaryOp::Tanh) => Some(Activation::Tanh),
            _ => None,
        }
    }

    /// The IR op's name, with a clamp's bounds: `relu`, `clamp to [0, 6]`.
    pub fn describe(self) -> String {
        match self {
            Activation::Clamp(b) => format!("clamp to [{}, {}]", b.lo(), b.hi()),
            other => other.name().to_string(),
        }
    }

    /// The IR op's name.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => UnaryOp::Relu.name(),
            Activation::GeluTanh => UnaryOp::GeluTanh.name(),
            Activation::Gelu => UnaryOp::Gelu.name(),
            Activation::Silu => "silu",
            Activation::HardSwish { .. } => "hardswish",
            Activation::Sigmoid => UnaryOp::Sigmoid.name(),
            Activation::Tanh => UnaryOp::Tanh.name(),
            Activation::Clamp(_) => Op::Clamp.name(),
        }
    }
}
