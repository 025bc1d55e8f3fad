//! The op set: typed payloads for every primitive and structured op.

use crate::{Array, DType, Shape, TensorType};

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),* }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            /// The op's name in the text form.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
            /// The variant whose text name is `name`.
            pub fn from_name(name: &str) -> Option<$name> {
                match name { $($text => Some($name::$variant),)* _ => None }
            }
        }
    };
}

named_enum! {
    /// Elementwise ops of one operand.
    UnaryOp {
        Neg = "neg", Abs = "abs", Sign = "sign",
        Exp = "exp", Exp2 = "exp2", Log = "log", Log2 = "log2", Log1p = "log1p", Expm1 = "expm1",
        Sqrt = "sqrt", Rsqrt = "rsqrt", Reciprocal = "reciprocal",
        Sin = "sin", Cos = "cos", Tanh = "tanh", Sigmoid = "sigmoid",
        Relu = "relu",
        /// `0.5 x (1 + erf(x / sqrt 2))`.
        Gelu = "gelu",
        /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
        GeluTanh = "gelu_tanh",
        Erf = "erf", Softplus = "softplus",
        Floor = "floor", Ceil = "ceil",
        /// Round half to even.
        Round = "round",
        /// Logical not of a bool.
        Not = "not",
    }
}

named_enum! {
    /// Elementwise ops of two operands of one dtype, with numpy broadcasting.
    BinaryOp {
        Add = "add", Sub = "sub", Mul = "mul",
        /// True division for floats; floor division for integers (numpy `//`), 0 when dividing by 0.
        Div = "div",
        /// numpy `remainder`: the result takes the sign of the divisor; 0 for integer `x % 0`.
        Rem = "rem",
        Pow = "pow",
        /// IEEE 754-2019 `maximum`: NaN propagates, `max(-0, +0) = +0`.
        Max = "max",
        /// IEEE 754-2019 `minimum`: NaN propagates, `min(-0, +0) = -0`.
        Min = "min",
        And = "and", Or = "or", Xor = "xor",
    }
}

named_enum! {
    /// Comparisons; the result is bool. Any comparison with NaN is false except `ne`.
    CompareOp { Eq = "eq", Ne = "ne", Lt = "lt", Le = "le", Gt = "gt", Ge = "ge" }
}

named_enum! {
    /// Reductions over a set of axes.
    ReduceOp {
        Sum = "reduce_sum", Prod = "reduce_prod", Max = "reduce_max", Min = "reduce_min",
        Mean = "reduce_mean",
        /// Index of the first maximum in row-major order over the reduced axes; NaN counts as the
        /// maximum. The result is i64.
        ArgMax = "argmax",
        /// Index of the first minimum, as `ArgMax`.
        ArgMin = "argmin",
    }
}

named_enum! {
    /// How `pad` fills the border.
    PadMode { Constant = "constant", Edge = "edge", Reflect = "reflect" }
}

named_enum! {
    /// Memory layout of conv and pool activations.
    Layout { Nchw = "nchw", Nhwc = "nhwc" }
}

named_enum! {
    /// Pooling flavour.
    PoolKind { Max = "max", Avg = "avg" }
}

named_enum! {
    /// Distribution of the counter-based random number op.
    RngDist {
        /// Uniform on `[0, 1)`.
        Uniform = "uniform",
        /// Standard normal (Box-Muller).
        Normal = "normal",
    }
}

/// An `f64` attribute stored as its bits, so that equality (and hashing) is bitwise and NaN
/// attributes compare equal to themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ieee64(u64);

impl Ieee64 {
    pub fn new(value: f64) -> Ieee64 {
        Ieee64(value.to_bits())
    }

    pub fn value(self) -> f64 {
        f64::from_bits(self.0)
    }
}

/// Attributes of `conv2d`. The weight is always `[C_out, C_in / groups, KH, KW]`; `layout` applies
/// to the input and output activations.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dAttrs {
    pub layout: Layout,
    /// Stride along H and W.
    pub stride: [usize; 2],
    /// Zero padding `[top, bottom, left, right]`.
    pub padding: [usize; 4],
    /// Dilation along H and W.
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for Conv2dAttrs {
    /// NCHW, stride 1, no padding, no dilation, one group.
    fn default() -> Self {
        Conv2dAttrs {
            layout: Layout::Nchw,
            stride: [1, 1],
            padding: [0; 4],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Attributes of `pool2d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dAttrs {
    pub kind: PoolKind,
    pub layout: Layout,
    /// Window size along H and W.
    pub window: [usize; 2],
    pub stride: [usize; 2],
    /// Padding `[top, bottom, left, right]`; padded cells never win a max.
    pub padding: [usize; 4],
    pub dilation: [usize; 2],
    /// For average pooling: divide by the full window size (true) or by the cells inside the input.
    pub count_include_pad: bool,
}

/// An op with its attributes. The operands live in the node.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A named graph input.
    Input {
        name: String,
        ty: TensorType,
    },
    /// A literal array.
    Constant {
        value: Array,
    },
    /// Each element holds its own index along `axis`.
    Iota {
        ty: TensorType,
        axis: usize,
    },
    /// Counter-based random numbers: element `i` (row-major) is a pure function of `seed` and `i`,
    /// so values never depend on how the program is partitioned or scheduled.
    Rng {
        ty: TensorType,
        dist: RngDist,
        seed: u64,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `select(cond, a, b)`: `a` where `cond` holds, else `b`; broadcasting.
    Select,
    /// `clamp(x, lo, hi) = min(max(x, lo), hi)`; broadcasting.
    Clamp,
    /// Conversion; float to integer truncates toward zero and saturates, NaN becomes 0.
    Cast {
        to: DType,
    },
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdims: bool,
    },
    Reshape {
        shape: Shape,
    },
    Permute {
        perm: Vec<usize>,
    },
    /// numpy `broadcast_to`.
    Broadcast {
        shape: Shape,
    },
    /// Per axis: elements `start, start + step, ...` below `stop`; `0 <= start <= stop <= dim`,
    /// `step >= 1`.
    Slice {
        start: Vec<usize>,
        stop: Vec<usize>,
        step: Vec<usize>,
    },
    /// Grows each axis by `low` before and `high` after. `value` fills in constant mode.
    Pad {
        low: Vec<usize>,
        high: Vec<usize>,
        mode: PadMode,
        value: Ieee64,
    },
    Concat {
        axis: usize,
    },
    Flip {
        axes: Vec<usize>,
    },
    /// `[..., M, K] @ [..., K, N]` with broadcast batch dims.
    MatMul,
    Conv2d(Conv2dAttrs),
    Pool2d(Pool2dAttrs),
    /// `out[i][j] = x[index[i][j]][j]` for axis 0 (numpy `take_along_axis`, torch `gather`).
    Gather {
        axis: usize,
    },
    /// `out = x; out[index[i][j]][j] += src[i][j]` for axis 0, in row-major order of `src`.
    ScatterAdd {
        axis: usize,
    },
    /// Stable sort along `axis`; NaN sorts above every number. Results: values, i64 indices.
    Sort {
        axis: usize,
        descending: bool,
    },
    /// The `k` largest (or smallest) along `axis` in order, ties by lower index. Results: values,
    /// i64 indices.
    TopK {
        axis: usize,
        k: usize,
        largest: bool,
    },
    /// An opaque call of a user-supplied function, with result types declared up front.
    Custom {
        name: String,
        outputs: Vec<TensorType>,
    },
}

impl Op {
    /// The op's name in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant { .. } => "constant",
            Op::Iota { .. } => "iota",
            Op::Rng { .. } => "rng",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Clamp => "clamp",
            Op::Cast { .. } => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Broadcast { .. } => "broadcast",
            Op::Slice { .. } => "slice",
            Op::Pad { .. } => "pad",
            Op::Concat { .. } => "concat",
            Op::Flip { .. } => "flip",
            Op::MatMul => "matmul",
            Op::Conv2d(_) => "conv2d",
            Op::Pool2d(_) => "pool2d",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Sort { .. } => "sort",
            Op::TopK { .. } => "topk",
            Op::Custom { .. } => "custom",
        }
    }

    /// Ops whose result types are declared in the op rather than inferred from operands.
    pub fn declared_types(&self) -> Option<Vec<TensorType>> {
        match self {
            Op::Input { ty, .. } | Op::Iota { ty, .. } | Op::Rng { ty, .. } => {
                Some(vec![ty.clone()])
            }
            Op::Constant { value } => Some(vec![value.ty()]),
            Op::Custom { outputs, .. } => Some(outputs.clone()),
            _ => None,
        }
    }
}
