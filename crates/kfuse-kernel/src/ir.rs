//! The kernel IR.
//!
//! A kernel loops over an *outer* index space and, inside it, an *inner* one (both row-major,
//! flattened to one loop variable each). Its body is one SSA list of scalar instructions:
//! loop indices, literals, integer index arithmetic, elementwise ops, loads and stores through
//! flat offsets, and reductions over the whole inner space.
//!
//! Each instruction has a *level*: `Inner` if it depends on the inner index (other than through a
//! reduction), `Outer` otherwise. A reduction consumes an inner-level value and produces an
//! outer-level one, accumulated in kfuse's documented order (partial `j mod 16`, pairwise
//! combination). Executing a kernel means, for every outer index: compute outer-level values as
//! soon as their operands exist, run one pass over the inner space per reduction, then one final
//! pass for inner-level stores. Kernels without reductions may split their inner space across
//! threads; kernels with reductions split only the outer one.

use kfuse_ir::{BinaryOp, CompareOp, DType, ReduceOp, TensorType, UnaryOp};

/// Index of an instruction in its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstId(pub u32);

impl InstId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Integer arithmetic on non-negative `i64` indices (C semantics, which agree with floor
/// semantics on non-negative operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Min,
    Max,
}

impl IndexOp {
    pub const ALL: [IndexOp; 7] = [
        IndexOp::Add,
        IndexOp::Sub,
        IndexOp::Mul,
        IndexOp::Div,
        IndexOp::Rem,
        IndexOp::Min,
        IndexOp::Max,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IndexOp::Add => "iadd",
            IndexOp::Sub => "isub",
            IndexOp::Mul => "imul",
            IndexOp::Div => "idiv",
            IndexOp::Rem => "irem",
            IndexOp::Min => "imin",
            IndexOp::Max => "imax",
        }
    }

    pub fn from_name(name: &str) -> Option<IndexOp> {
        IndexOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Applies the op; division and remainder by zero give 0 (never produced by lowering).
    pub fn apply(self, a: i64, b: i64) -> i64 {
        match self {
            IndexOp::Add => a.wrapping_add(b),
            IndexOp::Sub => a.wrapping_sub(b),
            IndexOp::Mul => a.wrapping_mul(b),
            IndexOp::Div => a.checked_div(b).unwrap_or(0),
            IndexOp::Rem => a.checked_rem(b).unwrap_or(0),
            IndexOp::Min => a.min(b),
            IndexOp::Max => a.max(b),
        }
    }
}

/// What an instruction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstKind {
    /// The flat outer loop index (`i64`).
    OuterIndex,
    /// The flat inner loop index (`i64`).
    InnerIndex,
    /// A literal of the instruction's dtype, as raw bits (zero-extended).
    Const(u64),
    Index(IndexOp, InstId, InstId),
    /// Elementwise ops with kfuse's semantics (`f16`/`bf16` compute in `f32` and round).
    Unary(UnaryOp, InstId),
    Binary(BinaryOp, InstId, InstId),
    Compare(CompareOp, InstId, InstId),
    Select(InstId, InstId, InstId),
    /// Conversion to the instruction's dtype.
    Cast(InstId),
    /// Element `offset` of argument `arg`.
    Load {
        arg: u32,
        offset: InstId,
    },
    /// Reduction of an inner-level value over the whole inner space, in the documented order.
    /// `ArgMax`/`ArgMin` give the flat inner index of the first extreme. Never `Mean`, and never
    /// on 16-bit floats (lowering widens to `f32` first).
    Reduce {
        op: ReduceOp,
        value: InstId,
    },
    /// Writes `value` to element `offset` of argument `arg`.
    Store {
        arg: u32,
        offset: InstId,
        value: InstId,
    },
}

/// One instruction: what it does and the dtype of its result (of the stored value, for stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Inst {
    pub kind: InstKind,
    pub dtype: DType,
}

impl Inst {
    /// The instructions this one reads.
    pub fn operands(&self) -> Vec<InstId> {
        match self.kind {
            InstKind::OuterIndex | InstKind::InnerIndex | InstKind::Const(_) => vec![],
            InstKind::Index(_, a, b) | InstKind::Binary(_, a, b) | InstKind::Compare(_, a, b) => {
                vec![a, b]
            }
            InstKind::Unary(_, a) | InstKind::Cast(a) => vec![a],
            InstKind::Select(c, a, b) => vec![c, a, b],
            InstKind::Load { offset, .. } => vec![offset],
            InstKind::Reduce { value, .. } => vec![value],
            InstKind::Store { offset, value, .. } => vec![offset, value],
        }
    }
}

/// Whether a kernel reads or writes an argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
}

/// A buffer argument of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Arg {
    pub ty: TensorType,
    pub access: Access,
}

/// A fused kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub name: String,
    /// Dims of the outer (parallel) loop nest, flattened to one index.
    pub outer: Vec<usize>,
    /// Dims of the inner loop nest: reduced by the kernel's reductions, or the vector loop.
    pub inner: Vec<usize>,
    pub args: Vec<Arg>,
    pub insts: Vec<Inst>,
}

/// Where an instruction is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Outer,
    Inner,
}

impl Kernel {
    pub fn outer_len(&self) -> usize {
        self.outer.iter().product()
    }

    pub fn inner_len(&self) -> usize {
        self.inner.iter().product()
    }

    pub fn inst(&self, id: InstId) -> &Inst {
        &self.insts[id.index()]
    }

    /// Whether the kernel contains reductions (and so must not split its inner space).
    pub fn has_reductions(&self) -> bool {
        self.insts
            .iter()
            .any(|i| matches!(i.kind, InstKind::Reduce { .. }))
    }

    /// The level of every instruction.
    pub fn levels(&self) -> Vec<Level> {
        let mut levels = Vec::with_capacity(self.insts.len());
        for inst in &self.insts {
            let level = match inst.kind {
                InstKind::InnerIndex => Level::Inner,
                InstKind::Reduce { .. } => Level::Outer,
                _ => {
                    if inst
                        .operands()
                        .iter()
                        .any(|o| levels[o.index()] == Level::Inner)
                    {
                        Level::Inner
                    } else {
                        Level::Outer
                    }
                }
            };
            levels.push(level);
        }
        levels
    }

    /// Checks the kernel's invariants: operands precede their users, stores and loads name
    /// arguments of the right access and dtype, and index arithmetic is on `i64`.
    pub fn verify(&self) -> Result<(), String> {
        for (i, inst) in self.insts.iter().enumerate() {
            let fail = |m: String| Err(format!("kernel {}: %{i}: {m}", self.name));
            for o in inst.operands() {
                if o.index() >= i {
                    return fail(format!("operand %{} is not defined before it", o.0));
                }
                if matches!(self.insts[o.index()].kind, InstKind::Store { .. }) {
                    return fail("reads a store".into());
                }
            }
            match inst.kind {
                InstKind::OuterIndex | InstKind::InnerIndex | InstKind::Index(..)
                    if inst.dtype != DType::I64 =>
                {
                    return fail("index values are i64".into())
                }
                InstKind::Index(_, a, b)
                    if self.inst(a).dtype != DType::I64 || self.inst(b).dtype != DType::I64 =>
                {
                    return fail("index arithmetic on non-i64 operands".into())
                }
                InstKind::Load { arg, offset } | InstKind::Store { arg, offset, .. } => {
                    let Some(a) = self.args.get(arg as usize) else {
                        return fail(format!("no argument {arg}"));
                    };
                    if a.ty.dtype != inst.dtype {
                        return fail(format!(
                            "argument {arg} holds {}, not {}",
                            a.ty.dtype, inst.dtype
                        ));
                    }
                    if self.inst(offset).dtype != DType::I64 {
                        return fail("offsets are i64".into());
                    }
                    let want = if matches!(inst.kind, InstKind::Load { .. }) {
                        Access::Read
                    } else {
                        Access::Write
                    };
                    if a.access != want {
                        return fail(format!("argument {arg} is not {want:?}"));
                    }
                }
                InstKind::Reduce { op, .. }
                    if op == ReduceOp::Mean || matches!(inst.dtype, DType::F16 | DType::BF16) =>
                {
                    return fail("reductions are never mean and never on 16-bit floats".into());
                }
                _ => {}
            }
        }
        Ok(())
    }
}
