//! Vector bodies: one pass's inner-level work on blocks of 16 consecutive inner indices.
//!
//! GCC vectorizes the scalar loop bodies well, but it can only use the instructions its scalar
//! code implies. A vector body calls the 16-lane functions of `kfuse_math.h` instead, which use
//! single AVX-512 instructions for steps that take several in scalar form (scaling by `2^k`,
//! splitting a float into exponent and mantissa, log's special cases): `log(exp(x) + 1)` takes
//! about half the instructions. The lanes compute exactly what the scalar body computes, so the
//! two forms give the same bits in strict mode and either may run any element.
//!
//! A pass has a vector body when every inner-level value it computes is `f32` (or a mask from
//! comparing `f32` values), every load and store it does is contiguous in the inner index, and
//! its index arithmetic is inner index plus outer-level terms. Everything else renders as
//! before: a kernel loses nothing by not qualifying.
//!
//! Bodies are emitted several blocks per loop iteration, instruction by instruction across the
//! blocks, their stores last: transcendental chains are long and serial, and independent blocks
//! give GCC's scheduler (`-fschedule-insns`) and the out-of-order core work to overlap. A pass
//! runs eight blocks per iteration where its longest dependency path is [`LONG_CHAIN`] vector
//! instructions or more (`log(exp(x) + 1)`, `softplus`), four from [`MEDIUM_CHAIN`] (`tanh`,
//! `sigmoid`, softmax's `exp` pass), two otherwise; four and eight prefetch their loads ahead.
//! Fewer blocks leave a long chain's latency exposed and more spill registers; the counts per
//! chain length are measured in `docs/structured-ops.md` ("Measurements behind design choices")
//! and `docs/benchmarks.md` ("W1–W4: elementwise, softmax, layernorm").

use std::fmt::Write;

use kfuse_ir::{BinaryOp, DType, UnaryOp};
use kfuse_kernel::{IndexOp, InstId, InstKind, Kernel, Level};

use super::{binary, compare_op, index_op, unary, v};

/// Blocks of 16 per iteration of a vector loop.
pub(super) const UNROLL: usize = 2;

/// Blocks of 16 per iteration where a pass's arithmetic is a chain of [`MEDIUM_CHAIN`] to
/// [`LONG_CHAIN`] vector instructions per block (a `tanh`, a `sigmoid`)...
const MEDIUM_CHAIN_BLOCKS: usize = 4;

/// ...and where it is longer (`log(exp(x) + 1)`, `softplus`).
const LONG_CHAIN_BLOCKS: usize = 8;

/// The chain lengths, in vector instructions per block, from which a pass runs
/// [`MEDIUM_CHAIN_BLOCKS`] and [`LONG_CHAIN_BLOCKS`] blocks per iteration.
const MEDIUM_CHAIN: usize = 16;
const LONG_CHAIN: usize = 32;

/// How far ahead (in elements) the loads of a four- or eight-block pass prefetch.
const AHEAD: usize = 1024;

/// Lanes per vector value.
pub(super) const LANES: usize = 16;

/// The coefficient of the inner index in each index-valued instruction, where it is affine
/// with a known coefficient (outer-level values: 0).
fn inner_coefficients(kernel: &Kernel, levels: &[Level]) -> Vec<Option<i64>> {
    coefficients(kernel, true, levels)
}

/// The coefficient of a loop index (the inner one if `inner`, else the outer one) in each
/// index-valued instruction, where it is affine in that index with a known coefficient: the
/// index itself, sums, differences and products with constants of such, and any operation on
/// values that do not vary with it (the other loop index and constants; with `inner`, every
/// outer-level value). Other instructions: `None`.
pub(super) fn coefficients(kernel: &Kernel, inner: bool, levels: &[Level]) -> Vec<Option<i64>> {
    let mut coef: Vec<Option<i64>> = Vec::with_capacity(kernel.insts.len());
    let constant = |id: InstId| match kernel.inst(id).kind {
        InstKind::Const(bits) => Some(bits as i64),
        _ => None,
    };
    for (i, inst) in kernel.insts.iter().enumerate() {
        let c = match inst.kind {
            _ if inner && levels[i] == Level::Outer => Some(0),
            InstKind::InnerIndex => Some(i64::from(inner)),
            InstKind::OuterIndex => Some(i64::from(!inner)),
            InstKind::Const(_) => Some(0),
            InstKind::Index(op, a, b) => match (op, coef[a.index()], coef[b.index()]) {
                (IndexOp::Add, Some(x), Some(y)) => x.checked_add(y),
                (IndexOp::Sub, Some(x), Some(y)) => x.checked_sub(y),
                (_, Some(0), Some(0)) => Some(0),
                (IndexOp::Mul, Some(x), Some(0)) => constant(b).and_then(|k| x.checked_mul(k)),
                (IndexOp::Mul, Some(0), Some(y)) => constant(a).and_then(|k| y.checked_mul(k)),
                _ => None,
            },
            _ => None,
        };
        coef.push(c);
    }
    coef
}

/// The vector form of one pass, if it has one.
pub(super) struct VectorPass<'a> {
    kernel: &'a Kernel,
    levels: Vec<Level>,
    compute: &'a [bool],
    reload: &'a [bool],
    save: &'a [bool],
    /// Stores go out non-temporally where line-aligned.
    stream: bool,
}

fn is_index(kind: InstKind) -> bool {
    matches!(kind, InstKind::InnerIndex | InstKind::Index(..))
}

impl<'a> VectorPass<'a> {
    /// The vector form of the pass computing `compute`, reloading `reload` from row scratch
    /// arrays and saving `save` there; where some instruction has none, which one and why.
    pub(super) fn new(
        kernel: &'a Kernel,
        compute: &'a [bool],
        reload: &'a [bool],
        save: &'a [bool],
    ) -> Result<Self, String> {
        let levels = kernel.levels();
        let coef = inner_coefficients(kernel, &levels);
        let dt = |id: InstId| kernel.inst(id).dtype;
        let inner = |id: InstId| levels[id.index()] == Level::Inner;
        // An index value feeds only index arithmetic and addresses: no lane holds it.
        let no_index = |ids: &[InstId]| {
            ids.iter()
                .all(|&o| !(inner(o) && is_index(kernel.inst(o).kind)))
        };
        let contiguous = |offset: InstId| coef[offset.index()] == Some(1);
        for k in 0..kernel.insts.len() {
            let inst = kernel.insts[k];
            let d = inst.dtype;
            if reload[k] {
                if d != DType::F32 {
                    return Err(format!(
                        "kernel IR %{k} reloads {d} from a row scratch array"
                    ));
                }
                continue;
            }
            if !compute[k] {
                continue;
            }
            let why = match inst.kind {
                InstKind::InnerIndex | InstKind::Index(..) if coef[k].is_none() => {
                    Some("is index arithmetic other than the inner index plus outer terms".into())
                }
                InstKind::InnerIndex | InstKind::Index(..) => None,
                InstKind::Load { offset, .. } | InstKind::Store { offset, .. }
                    if !contiguous(offset) =>
                {
                    Some("addresses elements that are not consecutive in the inner index".into())
                }
                InstKind::Load { .. } | InstKind::Store { .. } if d != DType::F32 => {
                    Some(format!("moves {d}"))
                }
                InstKind::Load { .. } => None,
                InstKind::Store { value, .. } => {
                    (!no_index(&[value])).then(|| "stores an index".to_string())
                }
                InstKind::Unary(u, a) => (!(no_index(&[a])
                    && (d == DType::F32 || (d == DType::Bool && u == UnaryOp::Not))))
                    .then(|| format!("computes {} on {d}", u.name())),
                InstKind::Binary(b, x, y) => (!(no_index(&[x, y])
                    && (d == DType::F32
                        || (d == DType::Bool
                            && matches!(b, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)))))
                .then(|| format!("computes {} on {d}", b.name())),
                InstKind::Compare(_, x, y) if !no_index(&[x, y]) => {
                    Some("compares indices (padding, concatenation or another gather)".to_string())
                }
                InstKind::Compare(_, x, _) => {
                    (dt(x) != DType::F32).then(|| format!("compares {}", dt(x)))
                }
                InstKind::Select(c, x, y) => {
                    (!(no_index(&[c, x, y]) && d == DType::F32 && dt(c) == DType::Bool))
                        .then(|| format!("selects {d}"))
                }
                InstKind::Cast(a) => (!(no_index(&[a])
                    && matches!(
                        (dt(a), d),
                        (DType::Bool, DType::F32) | (DType::F32, DType::Bool)
                    )))
                .then(|| format!("casts {} to {d}", dt(a))),
                InstKind::OuterIndex | InstKind::Const(_) | InstKind::Reduce { .. } => {
                    Some("is not an inner-level instruction".into())
                }
            };
            if let Some(why) = why {
                return Err(format!("kernel IR %{k} {why}"));
            }
        }
        Ok(VectorPass {
            kernel,
            levels,
            compute,
            reload,
            save,
            stream: false,
        })
    }

    /// The same pass with its stores non-temporal where line-aligned: each store
    /// writes a whole 64-byte line, so the line is neither read for ownership nor left in a
    /// partly filled write-combining buffer. The kernel must end with `kf_stream_fence()`.
    pub(super) fn streaming(self, stream: bool) -> Self {
        VectorPass { stream, ..self }
    }

    fn inner(&self, id: InstId) -> bool {
        self.levels[id.index()] == Level::Inner
    }

    /// The value `id` in block copy `u`: a vector (or index) for inner-level values, the
    /// scalar for outer-level ones.
    fn name(&self, id: InstId, u: usize) -> String {
        if self.inner(id) {
            format!("v{}_{u}", id.0)
        } else {
            v(id)
        }
    }

    /// `id` as an `f32` vector.
    pub(super) fn vector(&self, id: InstId, u: usize) -> String {
        if self.inner(id) {
            self.name(id, u)
        } else {
            format!("kf_vsplat({})", v(id))
        }
    }

    /// `id` (a bool) as a lane mask.
    fn mask(&self, id: InstId, u: usize) -> String {
        if self.inner(id) {
            self.name(id, u)
        } else {
            format!("((kf_i32x16){{}} - (int32_t)({} != 0))", v(id))
        }
    }

    /// `id` in lane `l` of a lane-by-lane loop.
    fn lane(&self, id: InstId, u: usize) -> String {
        if self.inner(id) {
            format!("{}[l]", self.name(id, u))
        } else {
            v(id)
        }
    }

    /// Blocks per iteration of this pass's vector loop: more where its longest dependency path
    /// is longer, as through the transcendental functions ([`MEDIUM_CHAIN_BLOCKS`],
    /// [`LONG_CHAIN_BLOCKS`]), [`UNROLL`] otherwise. More blocks overlap more chains, and spill
    /// more registers: `tanh` kernels ran best at four, `log(exp(x) + 1)` at eight.
    pub(super) fn blocks(&self) -> usize {
        // The pass's longest dependency path, in vector instructions: a long path of few
        // instructions wants more blocks, many short independent ones do not.
        let mut depth = vec![0usize; self.kernel.insts.len()];
        for k in 0..self.kernel.insts.len() {
            if !self.compute[k] || self.reload[k] {
                continue;
            }
            let inst = self.kernel.insts[k];
            let weight = match inst.kind {
                InstKind::Unary(op, _) => chain_length(op),
                _ => 1,
            };
            let before = inst.operands().iter().map(|o| depth[o.index()]).max();
            depth[k] = weight + before.unwrap_or(0);
        }
        let chain = depth.into_iter().max().unwrap_or(0);
        if chain >= LONG_CHAIN {
            LONG_CHAIN_BLOCKS
        } else if chain >= MEDIUM_CHAIN {
            MEDIUM_CHAIN_BLOCKS
        } else {
            UNROLL
        }
    }

    /// The statements of block copies `0..copies`, the first inner index of copy `u` being
    /// `j + 16 u`, instruction by instruction (every copy's value of one instruction, then the
    /// next instruction's), the stores last. Loads and arithmetic of all copies come before
    /// their stores: GCC does not see that a store through one argument pointer leaves
    /// another's loads alone, and would not overlap the copies' arithmetic across a store (the
    /// kernel reads no buffer it writes). With `ahead`, each load is preceded by a prefetch
    /// [`AHEAD`] elements further on: an iteration of eight long chains is more instructions
    /// than the out-of-order window holds, so the core stops issuing the next iteration's loads
    /// early, and the hardware prefetcher alone falls behind (measured in
    /// `docs/structured-ops.md`, "Measurements behind design choices").
    pub(super) fn bodies(&self, copies: usize, ahead: bool, indent: &str) -> String {
        let mut s = String::new();
        let mut stores = String::new();
        for k in 0..self.kernel.insts.len() {
            for u in 0..copies {
                if ahead {
                    if let InstKind::Load { arg, offset } = self.kernel.insts[k].kind {
                        if self.compute[k] {
                            writeln!(
                                s,
                                "{indent}KF_PREFETCH(a{arg}, {} + {AHEAD}, 0, 3);",
                                self.name(offset, u)
                            )
                            .unwrap();
                        }
                    }
                }
                let (compute, store) = self.statement(k, u, indent);
                s.push_str(&compute);
                stores.push_str(&store);
            }
        }
        s + &stores
    }

    /// Block copy `u`'s statement for instruction `k`: its computing part, and its store (to an
    /// output or a row scratch array).
    fn statement(&self, k: usize, u: usize, indent: &str) -> (String, String) {
        let mut s = String::new();
        let mut stores = String::new();
        let at = if u == 0 {
            "j".to_string()
        } else {
            format!("(j + {})", LANES * u)
        };
        let id = InstId(k as u32);
        let name = self.name(id, u);
        if self.reload[k] {
            writeln!(
                s,
                "{indent}kf_f32x16 {name};\n{indent}memcpy(&{name}, scratch{k} + {at}, 64);"
            )
            .unwrap();
            return (s, stores);
        }
        if !self.compute[k] {
            return (s, stores);
        }
        let inst = self.kernel.insts[k];
        let vec = |x: InstId| self.vector(x, u);
        let mask = |x: InstId| self.mask(x, u);
        let line = match inst.kind {
            InstKind::InnerIndex => format!("int64_t {name} = {at};"),
            InstKind::Index(op, a, b) => format!(
                "int64_t {name} = {};",
                index_op(op, &self.name(a, u), &self.name(b, u))
            ),
            InstKind::Load { arg, offset } => format!(
                "kf_f32x16 {name};\n{indent}memcpy(&{name}, a{arg} + {}, 64);",
                self.name(offset, u)
            ),
            InstKind::Store { arg, offset, value } => {
                let dst = format!("a{arg} + {}", self.name(offset, u));
                if self.stream {
                    writeln!(stores, "{indent}kf_vstore_nt({dst}, {});", vec(value)).unwrap();
                } else {
                    writeln!(
                        stores,
                        "{indent}{{ kf_f32x16 st = {}; memcpy({dst}, &st, 64); }}",
                        vec(value)
                    )
                    .unwrap();
                }
                return (s, stores);
            }
            InstKind::Unary(op, a) => {
                if inst.dtype == DType::Bool {
                    format!("kf_i32x16 {name} = ~{};", mask(a))
                } else {
                    match vector_unary(op, &vec(a)) {
                        Some(e) => format!("kf_f32x16 {name} = {e};"),
                        None => lanewise(&name, unary(op, &self.lane(a, u), DType::F32), indent),
                    }
                }
            }
            InstKind::Binary(op, x, y) => {
                if inst.dtype == DType::Bool {
                    let o = match op {
                        BinaryOp::And => "&",
                        BinaryOp::Or => "|",
                        _ => "^",
                    };
                    format!("kf_i32x16 {name} = {} {o} {};", mask(x), mask(y))
                } else {
                    // max(v, +0) (either way round) is relu's exact operation.
                    let zero = |id: InstId| {
                        matches!(self.kernel.inst(id).kind, InstKind::Const(0))
                            && self.kernel.inst(id).dtype == DType::F32
                    };
                    let relu = match (op, zero(x), zero(y)) {
                        (BinaryOp::Max, _, true) => Some(x),
                        (BinaryOp::Max, true, false) => Some(y),
                        _ => None,
                    };
                    let e = match relu {
                        Some(v) => vector_unary(UnaryOp::Relu, &vec(v)),
                        None => vector_binary(op, &vec(x), &vec(y)),
                    };
                    match e {
                        Some(e) => format!("kf_f32x16 {name} = {e};"),
                        None => lanewise(
                            &name,
                            binary(op, &self.lane(x, u), &self.lane(y, u), DType::F32),
                            indent,
                        ),
                    }
                }
            }
            InstKind::Compare(c, x, y) => {
                format!(
                    "kf_i32x16 {name} = {} {} {};",
                    vec(x),
                    compare_op(c),
                    vec(y)
                )
            }
            InstKind::Select(c, x, y) => format!(
                "kf_f32x16 {name} = kf_vsel({}, {}, {});",
                mask(c),
                vec(x),
                vec(y)
            ),
            InstKind::Cast(a) => {
                if inst.dtype == DType::F32 {
                    format!(
                        "kf_f32x16 {name} = kf_vsel({}, kf_vsplat(1.0f), kf_vsplat(0.0f));",
                        mask(a)
                    )
                } else {
                    format!("kf_i32x16 {name} = {} != 0.0f;", vec(a))
                }
            }
            InstKind::OuterIndex | InstKind::Const(_) | InstKind::Reduce { .. } => {
                unreachable!("checked in VectorPass::new")
            }
        };
        writeln!(s, "{indent}{line}").unwrap();
        if self.save[k] {
            writeln!(stores, "{indent}memcpy(scratch{k} + {at}, &{name}, 64);").unwrap();
        }
        (s, stores)
    }
}

/// Roughly how many dependent vector instructions the 16-lane form of `op` takes, along its
/// longest path (1 for single instructions): `tanh`'s polynomial runs beside its exponential.
fn chain_length(op: UnaryOp) -> usize {
    match op {
        UnaryOp::Exp | UnaryOp::Exp2 => 14,
        UnaryOp::Sigmoid => 18,
        UnaryOp::Log | UnaryOp::Log2 => 20,
        UnaryOp::Tanh => 22,
        UnaryOp::Log1p => 28,
        UnaryOp::Softplus => 45,
        _ => 1,
    }
}

/// Whether a pass running `blocks` blocks per iteration prefetches its loads ahead (see
/// [`VectorPass::bodies`]).
pub(super) fn prefetches_ahead(blocks: usize) -> bool {
    blocks >= MEDIUM_CHAIN_BLOCKS
}

/// Index instruction `id` as a C expression of the outer and inner indices `o` and `j`, where
/// it is index arithmetic all the way down.
pub(super) fn index_expr(kernel: &Kernel, id: InstId, o: &str, j: &str) -> Option<String> {
    let inst = kernel.inst(id);
    Some(match inst.kind {
        InstKind::OuterIndex => o.to_string(),
        InstKind::InnerIndex => j.to_string(),
        InstKind::Const(bits) if inst.dtype == DType::I64 => {
            format!("((int64_t){}ll)", bits as i64)
        }
        InstKind::Index(op, a, b) => format!(
            "({})",
            index_op(
                op,
                &index_expr(kernel, a, o, j)?,
                &index_expr(kernel, b, o, j)?
            )
        ),
        _ => return None,
    })
}

/// Prefetches of the next outer iteration's rows, issued from a later pass of the current one.
///
/// A row kernel reads its rows from memory in its first pass and then computes from cache (the
/// exponentials of softmax, the second moment of layernorm) while memory sits idle; the hardware
/// prefetcher does not look past the row. Prefetching the next row during the second pass
/// overlaps the two, which brings softmax close to its speed with the rows in cache
/// (`docs/structured-ops.md`, "Measurements behind design choices").
pub(super) struct NextRow {
    /// `(argument, offset instruction)` of each contiguous load of the first pass.
    loads: Vec<(u32, InstId)>,
    /// `__builtin_prefetch` locality: 3 (L1) where the rows fit beside the current ones.
    locality: u32,
}

impl NextRow {
    /// The next-row prefetches for a kernel whose first pass computes `first`, if that pass
    /// loads rows contiguously and they fit in L2 (beyond, there is nothing to keep them in).
    pub(super) fn new(kernel: &Kernel, first: &[bool]) -> Option<NextRow> {
        let levels = kernel.levels();
        let coef = inner_coefficients(kernel, &levels);
        let mut loads = Vec::new();
        let mut bytes = 0;
        for (k, inst) in kernel.insts.iter().enumerate() {
            if let InstKind::Load { arg, offset } = inst.kind {
                if first[k]
                    && coef[offset.index()] == Some(1)
                    && index_expr(kernel, offset, "o", "j").is_some()
                {
                    loads.push((arg, offset));
                    bytes += kernel.inner_len() * inst.dtype.size_bytes();
                }
            }
        }
        const L1_SHARE: usize = 32 << 10;
        const L2_SHARE: usize = 512 << 10;
        let locality = match bytes {
            0 => return None,
            b if b <= L1_SHARE => 3,
            b if b <= L2_SHARE => 2,
            _ => return None,
        };
        Some(NextRow { loads, locality })
    }

    /// One prefetch per load for the 16 elements of block copy `u` of the next row.
    pub(super) fn prefetches(&self, kernel: &Kernel, u: usize, indent: &str) -> String {
        let at = if u == 0 {
            "j".to_string()
        } else {
            format!("(j + {})", LANES * u)
        };
        let mut s = String::new();
        for &(arg, offset) in &self.loads {
            let e = index_expr(kernel, offset, "(o + 1)", &at).expect("checked in NextRow::new");
            writeln!(s, "{indent}KF_PREFETCH(a{arg}, {e}, 0, {});", self.locality).unwrap();
        }
        s
    }
}

/// `name` computed lane by lane from a scalar expression, for ops without a 16-lane function
/// (GCC vectorizes the loop where the scalar form vectorizes).
fn lanewise(name: &str, scalar: Result<String, super::Unsupported>, indent: &str) -> String {
    let e = scalar.expect("every f32 unary and binary op has a scalar form");
    format!("kf_f32x16 {name};\n{indent}for (int l = 0; l < 16; l++) {name}[l] = {e};")
}

/// The 16-lane form of an `f32` unary op, where `kfuse_math.h` has one.
fn vector_unary(op: UnaryOp, x: &str) -> Option<String> {
    let f = |name: &str| Some(format!("{name}({x})"));
    match op {
        UnaryOp::Neg => Some(format!("-{x}")),
        UnaryOp::Abs => f("kf_vabs"),
        UnaryOp::Exp => f("kf_vexp"),
        UnaryOp::Exp2 => f("kf_vexp2"),
        UnaryOp::Log => f("kf_vlog"),
        UnaryOp::Log2 => f("kf_vlog2"),
        UnaryOp::Log1p => f("kf_vlog1p"),
        UnaryOp::Sqrt => f("kf_vsqrt"),
        UnaryOp::Reciprocal => Some(format!("1.0f / {x}")),
        UnaryOp::Tanh => f("kf_vtanh"),
        UnaryOp::Sigmoid => f("kf_vsigmoid"),
        UnaryOp::Softplus => f("kf_vsoftplus"),
        UnaryOp::Sin => f("kf_vsin"),
        UnaryOp::Cos => f("kf_vcos"),
        UnaryOp::Relu => f("kf_vrelu"),
        UnaryOp::Floor => f("kf_vfloor"),
        UnaryOp::Ceil => f("kf_vceil"),
        UnaryOp::Round => f("kf_vrint"),
        _ => None,
    }
}

/// The 16-lane form of an `f32` binary op, where there is one.
fn vector_binary(op: BinaryOp, x: &str, y: &str) -> Option<String> {
    match op {
        BinaryOp::Add => Some(format!("{x} + {y}")),
        BinaryOp::Sub => Some(format!("{x} - {y}")),
        BinaryOp::Mul => Some(format!("{x} * {y}")),
        BinaryOp::Div => Some(format!("{x} / {y}")),
        BinaryOp::Max => Some(format!("kf_vmaximum({x}, {y})")),
        BinaryOp::Min => Some(format!("kf_vminimum({x}, {y})")),
        _ => None,
    }
}
