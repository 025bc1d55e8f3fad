//! Rendering kernel IR to C.
//!
//! A kernel becomes one function `kfuse_kernel(args, o_lo, o_hi, j_lo, j_hi)`: a loop over the
//! outer range, inside it one pass over the inner space per reduction (unrolled by 16 so that the
//! 16 partial accumulators of kfuse's summation order map onto vector lanes and vectorize without
//! reassociation), then a final pass over `[j_lo, j_hi)` for inner-level stores. Elementwise math
//! calls the functions of `c/kfuse_math.h`, which compute exactly what `kfuse-math` computes.

use std::fmt::Write;

use kfuse_ir::{BinaryOp, CompareOp, DType, ReduceOp, UnaryOp};
use kfuse_kernel::{Access, IndexOp, InstId, InstKind, Kernel, Level};

mod vector;
use vector::{prefetches_ahead, NextRow, VectorPass, LANES};

/// The C vector-math library every kernel includes.
pub const MATH_HEADER: &str = include_str!("c/kfuse_math.h");

/// The reason a kernel cannot be rendered to C with bit-exact semantics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "_Float16",
        DType::BF16 => "uint16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::U8 | DType::Bool => "uint8_t",
    }
}

fn v(id: InstId) -> String {
    format!("v{}", id.0)
}

/// `x` (of dtype `d`) as a value C computes with: 16-bit floats widen to float.
fn wide(x: &str, d: DType) -> String {
    match d {
        DType::F16 => format!("((float){x})"),
        DType::BF16 => format!("kf_bf16_to_f32({x})"),
        _ => x.to_string(),
    }
}

/// A computed float `e` narrowed back to storage dtype `d`. Both 16-bit formats round in
/// integer steps of `kfuse_math.h`: a C cast to `_Float16` is not kept by every compiler (see
/// `kf_f32_to_f16_bits`).
fn narrow(e: String, d: DType) -> String {
    match d {
        DType::F16 => format!("kf_f32_to_f16({e})"),
        DType::BF16 => format!("kf_f32_to_bf16({e})"),
        _ => e,
    }
}

fn literal(bits: u64, d: DType) -> String {
    match d {
        DType::F32 => format!("kf_f32_from_bits(0x{:08x}u)", bits as u32),
        DType::F64 => format!("kf_f64_from_bits(0x{bits:016x}ull)"),
        DType::F16 => format!(
            "((_Float16)kf_f32_from_bits(0x{:08x}u))",
            kfuse_ir::f16::from_bits(bits as u16).to_f32().to_bits()
        ),
        DType::BF16 => format!("((uint16_t)0x{:04x}u)", bits as u16),
        DType::I32 => format!("((int32_t){})", bits as u32 as i32),
        DType::I64 => {
            let x = bits as i64;
            if x == i64::MIN {
                "INT64_MIN".into()
            } else {
                format!("((int64_t){x}ll)")
            }
        }
        DType::U8 => format!("((uint8_t){}u)", bits as u8),
        DType::Bool => format!("((uint8_t){})", (bits != 0) as u8),
    }
}

fn unary(u: UnaryOp, x: &str, d: DType) -> Result<String, Unsupported> {
    let f32_fn = |name: &str| Ok(narrow(format!("{name}({})", wide(x, d)), d));
    if d.is_float() && d != DType::F64 {
        return match u {
            UnaryOp::Neg => f32_fn("-"),
            UnaryOp::Abs => f32_fn("fabsf"),
            UnaryOp::Sign => f32_fn("kf_sign"),
            UnaryOp::Exp => f32_fn("kf_exp"),
            UnaryOp::Exp2 => f32_fn("kf_exp2"),
            UnaryOp::Log => f32_fn("kf_log"),
            UnaryOp::Log2 => f32_fn("kf_log2"),
            UnaryOp::Log1p => f32_fn("kf_log1p"),
            UnaryOp::Expm1 => f32_fn("kf_expm1"),
            UnaryOp::Sqrt => f32_fn("sqrtf"),
            UnaryOp::Rsqrt => f32_fn("kf_rsqrt"),
            UnaryOp::Reciprocal => Ok(narrow(format!("1.0f / {}", wide(x, d)), d)),
            UnaryOp::Sin => f32_fn("kf_sin"),
            UnaryOp::Cos => f32_fn("kf_cos"),
            UnaryOp::Tanh => f32_fn("kf_tanh"),
            UnaryOp::Sigmoid => f32_fn("kf_sigmoid"),
            UnaryOp::Relu => Ok(narrow(format!("kf_maximum({}, 0.0f)", wide(x, d)), d)),
            UnaryOp::Gelu => f32_fn("kf_gelu"),
            UnaryOp::GeluTanh => f32_fn("kf_gelu_tanh"),
            UnaryOp::Erf => f32_fn("kf_erf"),
            UnaryOp::Softplus => f32_fn("kf_softplus"),
            UnaryOp::Floor => f32_fn("floorf"),
            UnaryOp::Ceil => f32_fn("ceilf"),
            UnaryOp::Round => f32_fn("rintf"),
            UnaryOp::Not => Err(Unsupported("not on floats".into())),
        };
    }
    if d == DType::F64 {
        let f = |name: &str| Ok(format!("{name}({x})"));
        return match u {
            UnaryOp::Neg => Ok(format!("-{x}")),
            UnaryOp::Abs => f("fabs"),
            UnaryOp::Sign => f("kf_sign_f64"),
            UnaryOp::Exp => f("exp"),
            UnaryOp::Exp2 => f("exp2"),
            UnaryOp::Log => f("log"),
            UnaryOp::Log2 => f("log2"),
            UnaryOp::Log1p => f("log1p"),
            UnaryOp::Expm1 => f("expm1"),
            UnaryOp::Sqrt => f("sqrt"),
            UnaryOp::Rsqrt => Ok(format!("1.0 / sqrt({x})")),
            UnaryOp::Reciprocal => Ok(format!("1.0 / {x}")),
            UnaryOp::Sin => f("sin"),
            UnaryOp::Cos => f("cos"),
            UnaryOp::Tanh => f("tanh"),
            UnaryOp::Sigmoid => f("kf_sigmoid_f64"),
            UnaryOp::Relu => Ok(format!("kf_maximum_f64({x}, 0.0)")),
            UnaryOp::GeluTanh => f("kf_gelu_tanh_f64"),
            UnaryOp::Softplus => f("kf_softplus_f64"),
            UnaryOp::Floor => f("floor"),
            UnaryOp::Ceil => f("ceil"),
            UnaryOp::Round => f("rint"),
            UnaryOp::Erf | UnaryOp::Gelu => Err(Unsupported(format!(
                "f64 {} uses the libm crate's erf, which C does not have",
                u.name()
            ))),
            UnaryOp::Not => Err(Unsupported("not on floats".into())),
        };
    }
    let t = ctype(d);
    Ok(match (u, d) {
        (UnaryOp::Not, DType::Bool) => format!("(uint8_t)!{x}"),
        (UnaryOp::Neg, _) => format!("({t})(0 - {x})"),
        (UnaryOp::Abs, DType::U8) | (UnaryOp::Relu, DType::U8) => x.to_string(),
        (UnaryOp::Abs, _) => format!("({t})({x} < 0 ? 0 - {x} : {x})"),
        (UnaryOp::Sign, _) => format!("({t})(({x} > 0) - ({x} < 0))"),
        (UnaryOp::Relu, _) => format!("({t})({x} > 0 ? {x} : 0)"),
        (other, _) => return Err(Unsupported(format!("{} on {d}", other.name()))),
    })
}

fn binary(b: BinaryOp, x: &str, y: &str, d: DType) -> Result<String, Unsupported> {
    if d.is_float() {
        let (xw, yw) = (wide(x, d), wide(y, d));
        let f64_ = d == DType::F64;
        let e = match b {
            BinaryOp::Add => format!("{xw} + {yw}"),
            BinaryOp::Sub => format!("{xw} - {yw}"),
            BinaryOp::Mul => format!("{xw} * {yw}"),
            BinaryOp::Div => format!("{xw} / {yw}"),
            BinaryOp::Rem => format!("{}({xw}, {yw})", if f64_ { "kf_rem_f64" } else { "kf_rem" }),
            BinaryOp::Pow => {
                if f64_ {
                    format!("pow({xw}, {yw})")
                } else {
                    format!("(float)pow((double){xw}, (double){yw})")
                }
            }
            BinaryOp::Max => format!(
                "{}({xw}, {yw})",
                if f64_ { "kf_maximum_f64" } else { "kf_maximum" }
            ),
            BinaryOp::Min => format!(
                "{}({xw}, {yw})",
                if f64_ { "kf_minimum_f64" } else { "kf_minimum" }
            ),
            _ => return Err(Unsupported(format!("{} on floats", b.name()))),
        };
        return Ok(narrow(e, d));
    }
    let t = ctype(d);
    Ok(match b {
        BinaryOp::Add => format!("({t})({x} + {y})"),
        BinaryOp::Sub => format!("({t})({x} - {y})"),
        BinaryOp::Mul => format!("({t})((int64_t){x} * (int64_t){y})"),
        BinaryOp::Div => format!("({t})kf_floor_div((int64_t){x}, (int64_t){y})"),
        BinaryOp::Rem => format!("({t})kf_rem_i64((int64_t){x}, (int64_t){y})"),
        BinaryOp::Pow => format!("({t})kf_int_pow((int64_t){x}, (int64_t){y})"),
        BinaryOp::Max => format!("({x} > {y} ? {x} : {y})"),
        BinaryOp::Min => format!("({x} < {y} ? {x} : {y})"),
        BinaryOp::And => format!("({t})({x} & {y})"),
        BinaryOp::Or => format!("({t})({x} | {y})"),
        BinaryOp::Xor => format!("({t})({x} ^ {y})"),
    })
}

/// The C operator of a comparison.
fn compare_op(c: CompareOp) -> &'static str {
    match c {
        CompareOp::Eq => "==",
        CompareOp::Ne => "!=",
        CompareOp::Lt => "<",
        CompareOp::Le => "<=",
        CompareOp::Gt => ">",
        CompareOp::Ge => ">=",
    }
}

fn compare(c: CompareOp, x: &str, y: &str, d: DType) -> String {
    let (x, y) = (wide(x, d), wide(y, d));
    format!("(uint8_t)({x} {} {y})", compare_op(c))
}

/// Conversion with the reference interpreter's semantics.
fn cast(x: &str, from: DType, to: DType) -> Result<String, Unsupported> {
    if from == to {
        return Ok(x.to_string());
    }
    let xw = wide(x, from);
    if to == DType::Bool {
        return Ok(format!("(uint8_t)({xw} != 0)"));
    }
    if from.is_float() {
        return Ok(match to {
            DType::F32 => format!("(float){xw}"),
            DType::F64 => format!("(double){xw}"),
            // From f64 both round once, straight from the double (a C conversion to _Float16
            // may go through float); from f32 the one rounding is the narrowing itself.
            DType::F16 if from == DType::F64 => format!("kf_f64_to_f16({xw})"),
            DType::BF16 if from == DType::F64 => format!("kf_f64_to_bf16({xw})"),
            DType::F16 => narrow(format!("(float){xw}"), DType::F16),
            DType::BF16 => narrow(format!("(float){xw}"), DType::BF16),
            DType::I32 => format!("kf_f2i32((double){xw})"),
            DType::I64 => format!("kf_f2i64((double){xw})"),
            DType::U8 => format!("kf_f2u8((double){xw})"),
            DType::Bool => unreachable!("handled above"),
        });
    }
    // Integers and bool: through i64, wrapping to integer targets, rounding to float ones.
    let i = format!("(int64_t){x}");
    Ok(match to {
        DType::F32 => format!("kf_i64_to_f32({i})"),
        DType::F64 => format!("kf_i64_to_f64({i})"),
        DType::F16 | DType::BF16 => narrow(format!("kf_i64_to_f32({i})"), to),
        DType::I32 => format!("(int32_t){i}"),
        DType::I64 => i,
        DType::U8 => format!("(uint8_t){i}"),
        DType::Bool => unreachable!("handled above"),
    })
}

fn index_op(op: IndexOp, a: &str, b: &str) -> String {
    match op {
        IndexOp::Add => format!("{a} + {b}"),
        IndexOp::Sub => format!("{a} - {b}"),
        IndexOp::Mul => format!("{a} * {b}"),
        IndexOp::Div => format!("{a} / {b}"),
        IndexOp::Rem => format!("{a} % {b}"),
        IndexOp::Min => format!("({a} < {b} ? {a} : {b})"),
        IndexOp::Max => format!("({a} > {b} ? {a} : {b})"),
    }
}

pub use kfuse_routines::STREAM_MIN_BYTES;

/// Bytes a kernel writes, all outputs together.
fn written_bytes(kernel: &Kernel) -> usize {
    kernel
        .args
        .iter()
        .filter(|a| a.access == Access::Write)
        .map(|a| a.ty.size_bytes())
        .sum()
}

/// Elements per staging block of a streamed store (at most 8 KiB: L1-resident).
const STAGE: usize = 1024;

/// A final-pass store written through a staging block: its offset is `base + j`.
#[derive(Clone, Copy)]
struct Staged {
    /// The outer-level part of the offset, or none for offset `j`.
    base: Option<InstId>,
}

/// Which stores stream (indexed by instruction): in kernels writing at least
/// [`STREAM_MIN_BYTES`] whose final pass (`final_compute`) computes no transcendental, the
/// final-pass stores whose offset is the inner index plus an outer-level value, so each pass
/// writes one contiguous run. The staging array has the argument's type, so the stored bits are
/// those of a plain store.
fn staged_stores(
    kernel: &Kernel,
    levels: &[Level],
    stores: &[InstId],
    final_compute: &[bool],
) -> Vec<Option<Staged>> {
    let mut staged = vec![None; kernel.insts.len()];
    let written = written_bytes(kernel);
    // Streaming pays where memory bounds the pass that stores. Where that pass computes a
    // transcendental, stores trickle out slowly, partly filled write-combining buffers flush
    // early, and the staging copy is extra work, so `log(exp(x) + 1)` is slower streamed;
    // softmax, whose exponentials are computed in its sum pass and reloaded, gains. Figures in
    // `docs/structured-ops.md` ("Measurements behind design choices").
    let compute_bound = (0..kernel.insts.len()).any(|k| {
        final_compute[k] && levels[k] == Level::Inner && transcendental(kernel.insts[k].kind)
    });
    if written < STREAM_MIN_BYTES || compute_bound {
        return staged;
    }
    let is_j = |id: InstId| matches!(kernel.inst(id).kind, InstKind::InnerIndex);
    for &st in stores {
        let InstKind::Store { arg, offset, .. } = kernel.inst(st).kind else {
            continue;
        };
        let base = match kernel.inst(offset).kind {
            InstKind::InnerIndex => Some(None),
            InstKind::Index(IndexOp::Add, a, b) if is_j(b) && levels[a.index()] == Level::Outer => {
                Some(Some(a))
            }
            InstKind::Index(IndexOp::Add, a, b) if is_j(a) && levels[b.index()] == Level::Outer => {
                Some(Some(b))
            }
            _ => None,
        };
        // Two stores into one argument (never emitted today) would race through staging.
        let unique = stores
            .iter()
            .filter(|&&o| matches!(kernel.inst(o).kind, InstKind::Store { arg: a, .. } if a == arg))
            .count()
            == 1;
        if let (Some(base), true) = (base, unique) {
            staged[st.index()] = Some(Staged { base });
        }
    }
    staged
}

/// The C statement computing instruction `i` (declaring `v{i}`), or a store.
fn statement(kernel: &Kernel, i: usize) -> Result<String, Unsupported> {
    let inst = kernel.insts[i];
    let d = inst.dtype;
    let dt = |id: InstId| kernel.inst(id).dtype;
    let e = match inst.kind {
        InstKind::OuterIndex => "o".to_string(),
        InstKind::InnerIndex => "j".to_string(),
        InstKind::Const(bits) => literal(bits, d),
        InstKind::Index(op, a, b) => index_op(op, &v(a), &v(b)),
        InstKind::Unary(u, a) => unary(u, &v(a), d)?,
        InstKind::Binary(b, x, y) => binary(b, &v(x), &v(y), d)?,
        InstKind::Compare(c, x, y) => compare(c, &v(x), &v(y), dt(x)),
        InstKind::Select(c, x, y) => format!("({} ? {} : {})", v(c), v(x), v(y)),
        InstKind::Cast(a) => cast(&v(a), dt(a), d)?,
        InstKind::Load { arg, offset } => format!("a{arg}[{}]", v(offset)),
        InstKind::Store { arg, offset, value } => {
            return Ok(format!("a{arg}[{}] = {};", v(offset), v(value)))
        }
        InstKind::Reduce { .. } => unreachable!("reductions are rendered as passes"),
    };
    Ok(format!("{} v{i} = {e};", ctype(d)))
}

/// Whether an instruction is a transcendental function or a libm call (power, remainder).
fn transcendental(kind: InstKind) -> bool {
    match kind {
        InstKind::Unary(u, _) => !matches!(
            u,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Relu
                | UnaryOp::Not
                | UnaryOp::Sign
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
        ),
        InstKind::Binary(b, _, _) => matches!(b, BinaryOp::Pow | BinaryOp::Rem),
        _ => false,
    }
}

/// Whether recomputing an inner-level value costs more than reloading it from a row scratch
/// array: its computation includes a transcendental, a division or a power.
fn expensive(kernel: &Kernel, levels: &[Level], id: InstId, memo: &mut Vec<Option<bool>>) -> bool {
    if let Some(e) = memo[id.index()] {
        return e;
    }
    let inst = kernel.insts[id.index()];
    let own =
        transcendental(inst.kind) || matches!(inst.kind, InstKind::Binary(BinaryOp::Div, _, _));
    let e = own
        || inst
            .operands()
            .into_iter()
            .any(|o| levels[o.index()] == Level::Inner && expensive(kernel, levels, o, memo));
    memo[id.index()] = Some(e);
    e
}

/// The inner-level work of each pass over the inner space (one per reduction, in order, then
/// the final pass for inner-level stores): which instructions it computes, which it reloads
/// from a row scratch array, and which it saves there for later passes.
struct Passes {
    compute: Vec<Vec<bool>>,
    reload: Vec<Vec<bool>>,
    save: Vec<Vec<bool>>,
}

fn plan_passes(kernel: &Kernel, levels: &[Level], roots: &[Vec<InstId>]) -> Passes {
    let n = kernel.insts.len();
    let mut memo = vec![None; n];
    let mut first_pass: Vec<Option<usize>> = vec![None; n];
    let mut passes = Passes {
        compute: vec![vec![false; n]; roots.len()],
        reload: vec![vec![false; n]; roots.len()],
        save: vec![vec![false; n]; roots.len()],
    };
    for (p, pass_roots) in roots.iter().enumerate() {
        let mut stack = pass_roots.clone();
        while let Some(id) = stack.pop() {
            let i = id.index();
            if levels[i] != Level::Inner || passes.compute[p][i] || passes.reload[p][i] {
                continue;
            }
            if let Some(earlier) = first_pass[i] {
                if earlier < p && expensive(kernel, levels, id, &mut memo) {
                    passes.reload[p][i] = true;
                    passes.save[earlier][i] = true;
                    continue;
                }
            }
            passes.compute[p][i] = true;
            stack.extend(kernel.insts[i].operands());
        }
        for (i, first) in first_pass.iter_mut().enumerate() {
            if passes.compute[p][i] && first.is_none() {
                *first = Some(p);
            }
        }
    }
    passes
}

/// The statements of one pass's loop body.
fn pass_body(
    kernel: &Kernel,
    passes: &Passes,
    p: usize,
    staged: &[Option<Staged>],
    indent: &str,
) -> Result<String, Unsupported> {
    pass_body_packed(kernel, passes, p, staged, (&[], ""), indent)
}

/// [`pass_body`], with the loads `packed` (of a tiled kernel, see [`Packed`]) read from their
/// tile buffers, at the tile row `row` (a C expression).
fn pass_body_packed(
    kernel: &Kernel,
    passes: &Passes,
    p: usize,
    staged: &[Option<Staged>],
    (packed, row): (&[Packed], &str),
    indent: &str,
) -> Result<String, Unsupported> {
    let mut body = String::new();
    for (k, &inst) in kernel.insts.iter().enumerate() {
        if passes.compute[p][k] && packed.iter().any(|pk| pk.load == k) {
            writeln!(
                body,
                "{indent}float v{k} = tbuf{k}[{row} * {TILE_J} + (j - jt)];"
            )
            .unwrap();
            continue;
        }
        if passes.reload[p][k] {
            writeln!(body, "{indent}{} v{k} = scratch{k}[j];", ctype(inst.dtype)).unwrap();
        } else if passes.compute[p][k] {
            if let (Some(_), InstKind::Store { value, .. }) = (staged[k], inst.kind) {
                writeln!(body, "{indent}stage{k}[j - jb] = {};", v(value)).unwrap();
                continue;
            }
            writeln!(body, "{indent}{}", statement(kernel, k)?).unwrap();
            if passes.save[p][k] {
                writeln!(body, "{indent}scratch{k}[j] = v{k};").unwrap();
            }
        }
    }
    Ok(body)
}

/// The vector form of pass `p` (see [`VectorPass::new`]).
fn vector_pass<'a>(
    kernel: &'a Kernel,
    passes: &'a Passes,
    p: usize,
) -> Result<VectorPass<'a>, String> {
    VectorPass::new(
        kernel,
        &passes.compute[p],
        &passes.reload[p],
        &passes.save[p],
    )
}

/// Blocks per iteration, and accumulators (`vacc`, `vacc1`..`vacc3`), of a vector max or min
/// reduction: four independent accumulators hide the combine's latency.
const MINMAX_ACCUMULATORS: usize = 4;

/// Whether a reduction's terms can combine as 16-lane vectors: f32 terms into an f32 result, by
/// an op with a vector combine.
fn vector_reduction(op: ReduceOp, d: DType, vd: DType) -> bool {
    d == DType::F32 && vd == DType::F32 && vector_combine(op, d).is_some()
}

/// A loop over the inner indices `[lo, hi)`: blocks of 16 through the vector body where the pass
/// has one ([`VectorPass::blocks`] per iteration while they last), the rest through the scalar
/// body. Bodies are rendered at `indent` plus eight spaces, each block followed by `prefetch`'s
/// next-row prefetches where given; with `ahead` (a pass that reads its operands from memory),
/// bodies of four or more blocks prefetch their loads further on. With `align` (an address expression of
/// `j`), scalar iterations come first until that address is 64-byte aligned.
#[allow(clippy::too_many_arguments)]
fn inner_loop(
    vector: Option<&VectorPass>,
    prefetch: Option<(&Kernel, &NextRow)>,
    ahead: bool,
    align: Option<&str>,
    scalar_body: &str,
    lo: &str,
    hi: &str,
    indent: &str,
) -> String {
    let Some(vp) = vector else {
        return format!(
            "{indent}for (int64_t j = {lo}; j < {hi}; j++) {{\n{scalar_body}{indent}}}\n"
        );
    };
    let inner = format!("{indent}        ");
    let mut s = format!("{indent}{{\n{indent}    int64_t j = {lo};\n");
    if let Some(address) = align {
        write!(s, "{indent}    for (; j < {hi} && ((uintptr_t)({address}) & 63) != 0; j++) {{\n{scalar_body}{indent}    }}\n").unwrap();
    }
    for blocks in [vp.blocks(), 1] {
        let width = LANES * blocks;
        writeln!(
            s,
            "{indent}    for (; j + {width} <= {hi}; j += {width}) {{"
        )
        .unwrap();
        s.push_str(&vp.bodies(blocks, ahead && prefetches_ahead(blocks), &inner));
        if let Some((kernel, next)) = prefetch {
            for u in 0..blocks {
                s.push_str(&next.prefetches(kernel, u, &inner));
            }
        }
        writeln!(s, "{indent}    }}").unwrap();
    }
    write!(
        s,
        "{indent}    for (; j < {hi}; j++) {{\n{scalar_body}{indent}    }}\n{indent}}}\n"
    )
    .unwrap();
    s
}

/// The 16-lane vector type and combining function of `kfuse_math.h` for a reduction whose
/// lanes combine like [`combine`], where there is one.
fn vector_combine(op: ReduceOp, d: DType) -> Option<(&'static str, &'static str)> {
    Some(match (op, d) {
        (ReduceOp::Sum, DType::F32) => ("kf_f32x16", "kf_vsum_f32"),
        (ReduceOp::Prod, DType::F32) => ("kf_f32x16", "kf_vprod_f32"),
        (ReduceOp::Max, DType::F32) => ("kf_f32x16", "kf_vmaximum"),
        (ReduceOp::Min, DType::F32) => ("kf_f32x16", "kf_vminimum"),
        (ReduceOp::Sum, DType::F64) => ("kf_f64x16", "kf_vsum_f64"),
        (ReduceOp::Prod, DType::F64) => ("kf_f64x16", "kf_vprod_f64"),
        (ReduceOp::Max, DType::F64) => ("kf_f64x16", "kf_vmax_f64"),
        (ReduceOp::Min, DType::F64) => ("kf_f64x16", "kf_vmin_f64"),
        _ => return None,
    })
}

fn combine(op: ReduceOp, d: DType, a: &str, b: &str) -> String {
    match (op, d) {
        (ReduceOp::Sum, _) => {
            if d.is_float() {
                format!("{a} + {b}")
            } else {
                format!("({})({a} + {b})", ctype(d))
            }
        }
        (ReduceOp::Prod, _) => {
            if d.is_float() {
                format!("{a} * {b}")
            } else {
                format!("({})((int64_t){a} * (int64_t){b})", ctype(d))
            }
        }
        (ReduceOp::Max, DType::F32) => format!("kf_maximum({a}, {b})"),
        (ReduceOp::Max, DType::F64) => format!("kf_maximum_f64({a}, {b})"),
        (ReduceOp::Min, DType::F32) => format!("kf_minimum({a}, {b})"),
        (ReduceOp::Min, DType::F64) => format!("kf_minimum_f64({a}, {b})"),
        (ReduceOp::Max, _) => format!("({a} > {b} ? {a} : {b})"),
        _ => format!("({a} < {b} ? {a} : {b})"),
    }
}

fn identity(op: ReduceOp, d: DType) -> String {
    let bits = match (op, d) {
        (ReduceOp::Sum, DType::F32) => 0f32.to_bits() as u64,
        (ReduceOp::Sum, DType::F64) => 0f64.to_bits(),
        (ReduceOp::Prod, DType::F32) => 1f32.to_bits() as u64,
        (ReduceOp::Prod, DType::F64) => 1f64.to_bits(),
        (ReduceOp::Max, DType::F32) => f32::NEG_INFINITY.to_bits() as u64,
        (ReduceOp::Max, DType::F64) => f64::NEG_INFINITY.to_bits(),
        (ReduceOp::Min, DType::F32) => f32::INFINITY.to_bits() as u64,
        (ReduceOp::Min, DType::F64) => f64::INFINITY.to_bits(),
        (ReduceOp::Sum, _) => 0,
        (ReduceOp::Prod, _) => 1,
        (ReduceOp::Max, DType::I32) => i32::MIN as u32 as u64,
        (ReduceOp::Max, DType::I64) => i64::MIN as u64,
        (ReduceOp::Max, _) => 0,
        (ReduceOp::Min, DType::I32) => i32::MAX as u32 as u64,
        (ReduceOp::Min, DType::I64) => i64::MAX as u64,
        (ReduceOp::Min, _) => u8::MAX as u64,
        _ => 0,
    };
    literal(bits, d)
}

/// The roots of each pass over the inner space (each reduction's value, in order, then the
/// inner-level stores of the final pass), and those stores.
fn pass_roots(kernel: &Kernel, levels: &[Level]) -> (Vec<Vec<InstId>>, Vec<InstId>) {
    let inner_stores: Vec<InstId> = (0..kernel.insts.len())
        .filter(|&i| {
            matches!(kernel.insts[i].kind, InstKind::Store { .. }) && levels[i] == Level::Inner
        })
        .map(|i| InstId(i as u32))
        .collect();
    let mut roots: Vec<Vec<InstId>> = kernel
        .insts
        .iter()
        .filter_map(|inst| match inst.kind {
            InstKind::Reduce { value, .. } => Some(vec![value]),
            _ => None,
        })
        .collect();
    roots.push(inner_stores.clone());
    (roots, inner_stores)
}

/// Outer iterations per tile of a tiled kernel: one 64-byte line of f32 along the outer index.
const TILE_O: usize = 16;
/// Inner iterations per tile. Where the strided operand is f32 with the outer index as its
/// contiguous axis (a transpose: [`Packed`]), each tile of it is transposed in registers into
/// an L1 buffer, 16 × 16 floats at a time, and the next tile's lines are prefetched; tiles
/// are then 32 wide. Otherwise the tile's loop reads the strided lines directly, and they
/// must stay in L1 while the tile's outer iterations use them: where they lie a multiple of
/// 1 KiB apart they crowd into few sets of the 12-way L1 and only 8 fit
/// ([`TILE_J_ALIASED`]); elsewhere 32. The sizes were chosen on a transpose-add; the figures
/// are in `docs/structured-ops.md` ("Measurements behind design choices").
const TILE_J: usize = 32;
const TILE_J_ALIASED: usize = 8;

/// Whether `kernel` runs in tiles of [`TILE_O`] outer by [`TILE_J`] (or [`TILE_J_ALIASED`])
/// inner iterations rather than row by row, and the inner tile size if so: where it reads
/// some value across the inner index with a stride of a cache line or more (a transposed or
/// permuted operand). Row by row, every inner step of such a read touches a new line, used
/// once before it is evicted; in a tile, each line serves [`TILE_O`] outer iterations. Only
/// kernels without reductions and without outer-level stores, whose iterations are
/// independent, and whose final pass has no vector body (a strided load has none).
fn tiles(kernel: &Kernel, levels: &[Level], passes: usize, vector: bool) -> Option<usize> {
    if passes != 1 || vector || kernel.outer.is_empty() {
        return None;
    }
    let strides = vector::coefficients(kernel, true, levels);
    let (mut strided, mut aliased) = (false, false);
    for (i, inst) in kernel.insts.iter().enumerate() {
        match inst.kind {
            InstKind::Store { .. } if levels[i] == Level::Outer => return None,
            InstKind::Load { offset, .. } if levels[i] == Level::Inner => {
                let size = inst.dtype.size_bytes().max(1) as i64;
                if let Some(bytes) = strides[offset.index()]
                    .and_then(|c| c.checked_mul(size))
                    .map(i64::abs)
                    .filter(|&b| b >= 64)
                {
                    strided = true;
                    aliased |= bytes % 1024 == 0;
                }
            }
            _ => {}
        }
    }
    strided.then_some(if aliased { TILE_J_ALIASED } else { TILE_J })
}

/// Prefetches, for row `o` of a tiled kernel, of the next tile's lines (`jt + tj` on) of each
/// inner-level load and store that is contiguous along the inner index (stores for writing).
fn row_prefetches(kernel: &Kernel, levels: &[Level], tj: usize) -> String {
    let inner = vector::coefficients(kernel, true, levels);
    let mut s = String::new();
    for (k, inst) in kernel.insts.iter().enumerate() {
        let (arg, offset, write) = match inst.kind {
            InstKind::Load { arg, offset } => (arg, offset, 0),
            InstKind::Store { arg, offset, .. } => (arg, offset, 1),
            _ => continue,
        };
        if levels[k] != Level::Inner || inner[offset.index()] != Some(1) {
            continue;
        }
        let line = 64 / kernel.args[arg as usize].ty.dtype.size_bytes().max(1);
        for at in (tj..2 * tj).step_by(line) {
            if let Some(e) = vector::index_expr(kernel, offset, "o", &format!("(jt + {at})")) {
                writeln!(s, "        KF_PREFETCH(a{arg}, {e}, {write}, 3);").unwrap();
            }
        }
    }
    s
}

/// An index value as an exact affine function of the loop coordinates: `constant + Σ coef[k] ·
/// c[k]`, the coordinates being the outer axes' indices, then the inner axes'.
#[derive(Clone, Debug, PartialEq)]
struct Affine {
    constant: i64,
    coef: Vec<i64>,
}

impl Affine {
    fn constant(value: i64, coords: usize) -> Affine {
        Affine {
            constant: value,
            coef: vec![0; coords],
        }
    }

    fn is_constant(&self) -> bool {
        self.coef.iter().all(|&c| c == 0)
    }

    fn combine(&self, other: &Affine, f: impl Fn(i64, i64) -> Option<i64>) -> Option<Affine> {
        Some(Affine {
            constant: f(self.constant, other.constant)?,
            coef: (self.coef.iter().zip(&other.coef))
                .map(|(&a, &b)| f(a, b))
                .collect::<Option<_>>()?,
        })
    }

    fn scale(&self, k: i64) -> Option<Affine> {
        Some(Affine {
            constant: self.constant.checked_mul(k)?,
            coef: (self.coef.iter())
                .map(|&a| a.checked_mul(k))
                .collect::<Option<_>>()?,
        })
    }
}

/// Each index instruction of `kernel` as an exact affine function of the loop coordinates
/// ([`Affine`]), where it is one over their whole ranges: the outer and inner indices are the
/// flattened coordinates, and a division or remainder by a positive constant qualifies where
/// the value is never negative and the terms the divisor does not divide stay within
/// `[0, divisor)` (so the lowering's `(o / 112) % 64` is the coordinate it extracts). The first
/// outer axis (the batch) is unbounded above: its size is a run-time argument.
fn affine_forms(kernel: &Kernel) -> Vec<Option<Affine>> {
    let dims: Vec<usize> = kernel.outer.iter().chain(&kernel.inner).copied().collect();
    let n = dims.len();
    let outer = kernel.outer.len();
    let flat = |range: std::ops::Range<usize>| {
        let mut coef = vec![0i64; n];
        let mut step = 1i64;
        for k in range.rev() {
            coef[k] = step;
            step = step.checked_mul(dims[k] as i64)?;
        }
        Some(Affine { constant: 0, coef })
    };
    // The least and greatest value of a form; None where unbounded (or past i64).
    let bounds = |f: &Affine| -> (Option<i64>, Option<i64>) {
        let (mut lo, mut hi) = (Some(f.constant), Some(f.constant));
        for (k, &c) in f.coef.iter().enumerate() {
            if c == 0 {
                continue;
            }
            if k == 0 && outer > 0 {
                if c > 0 {
                    hi = None;
                } else {
                    lo = None;
                }
                continue;
            }
            let span = c.checked_mul(dims[k].saturating_sub(1) as i64);
            let (a, b) = match span {
                Some(t) => (t.min(0), t.max(0)),
                None => return (None, None),
            };
            lo = lo.and_then(|l| l.checked_add(a));
            hi = hi.and_then(|h| h.checked_add(b));
        }
        (lo, hi)
    };
    // x / q and x % q, where both are exactly affine.
    let divide = |x: &Affine, q: i64| -> Option<(Affine, Affine)> {
        if q <= 0 || bounds(x).0? < 0 {
            return None;
        }
        let mut quotient = Affine::constant(x.constant.div_euclid(q), n);
        let mut rest = Affine::constant(x.constant.rem_euclid(q), n);
        for (k, &c) in x.coef.iter().enumerate() {
            if c % q == 0 {
                quotient.coef[k] = c / q;
            } else {
                rest.coef[k] = c;
            }
        }
        let (lo, hi) = bounds(&rest);
        (lo? >= 0 && hi? < q).then_some((quotient, rest))
    };
    let mut forms: Vec<Option<Affine>> = Vec::with_capacity(kernel.insts.len());
    for inst in &kernel.insts {
        let form = match inst.kind {
            InstKind::OuterIndex => flat(0..outer),
            InstKind::InnerIndex => flat(outer..n),
            InstKind::Const(bits) if inst.dtype == DType::I64 => {
                Some(Affine::constant(bits as i64, n))
            }
            InstKind::Index(op, a, b) => match (&forms[a.index()], &forms[b.index()]) {
                (Some(x), Some(y)) => match op {
                    IndexOp::Add => x.combine(y, i64::checked_add),
                    IndexOp::Sub => x.combine(y, i64::checked_sub),
                    IndexOp::Mul if y.is_constant() => x.scale(y.constant),
                    IndexOp::Mul if x.is_constant() => y.scale(x.constant),
                    IndexOp::Div if y.is_constant() => divide(x, y.constant).map(|(q, _)| q),
                    IndexOp::Rem if y.is_constant() => divide(x, y.constant).map(|(_, r)| r),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        forms.push(form);
    }
    forms
}

/// The rows of a tiled kernel's tiles, where they step one outer axis `a` (not the first): a
/// tile is up to [`TILE_O`] indices of that axis at one index of the axes after it, `stride`
/// outer iterations apart, by [`TILE_J`] inner iterations.
///
/// Otherwise a tile is [`TILE_O`] consecutive outer iterations, which step the last outer axis.
/// A permuted operand read across the inner index may be contiguous along another one: NHWC
/// to NCHW, `y[n][c][h][w] = x[n][h][w][c]`, runs over outer `[n, c, h]` and inner `w`, and
/// `x` is contiguous along `c`; tiles of 16 consecutive `h` read each of their 512 lines for
/// one float. Tiles along `c` transpose 16 × 16 blocks of `x` in registers into tile buffers,
/// as [`Packed`] loads are.
struct RowAxis {
    /// Outer iterations between consecutive rows: the product of the outer axes after `a`.
    stride: usize,
    /// The size of axis `a`.
    rows: usize,
    /// The loads transposed into tile buffers (`base` at the tile's first row,
    /// `ob + rb * stride + lo`, and at `jt`).
    packed: Vec<Packed>,
}

/// The row axis of a tiled kernel (see [`RowAxis`]): the first outer axis after the batch axis
/// along which a strided f32 load's offset moves by exactly one element, for a kernel with one inner
/// axis whose strided loads' offsets are exactly affine ([`affine_forms`]). Only the loads that
/// move by one along it are transposed; others read their lines directly in the tile.
fn row_axis(kernel: &Kernel, levels: &[Level]) -> Option<RowAxis> {
    let outer = kernel.outer.len();
    if outer < 2 || kernel.inner.len() != 1 || kernel.outer.contains(&0) {
        return None;
    }
    let forms = affine_forms(kernel);
    let strided: Vec<(usize, u32, InstId, &Affine)> = kernel
        .insts
        .iter()
        .enumerate()
        .filter_map(|(k, inst)| match inst.kind {
            InstKind::Load { arg, offset }
                if levels[k] == Level::Inner && inst.dtype == DType::F32 =>
            {
                let f = forms[offset.index()].as_ref()?;
                (f.coef[outer] >= 16).then_some((k, arg, offset, f))
            }
            _ => None,
        })
        .collect();
    let a = (1..outer).find(|&a| strided.iter().any(|(_, _, _, f)| f.coef[a] == 1))?;
    let stride: usize = kernel.outer[a + 1..].iter().product();
    let first_row = format!("(ob + rb * {stride} + lo)");
    let packed = strided
        .iter()
        .filter(|(_, _, _, f)| f.coef[a] == 1)
        .map(|&(load, arg, offset, f)| {
            Some(Packed {
                load,
                arg,
                stride: f.coef[outer],
                base: vector::index_expr(kernel, offset, &first_row, "jt")?,
                at: vector::index_expr(kernel, offset, "oo", "jj")?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(RowAxis {
        stride,
        rows: kernel.outer[a],
        packed,
    })
}

/// A strided f32 load of a tiled kernel whose tiles are transposed into a buffer first
/// (`kf_transpose16`, 16 × 16 blocks in registers), so that the tile's rows read it along the
/// inner index like any other operand: its offset is `base + stride * j + o` (the outer index
/// with coefficient 1, so a tile row of the source is 16 consecutive floats).
struct Packed {
    load: usize,
    arg: u32,
    stride: i64,
    /// The offset at (ob, jt) and at (oo, jj), as C expressions.
    base: String,
    at: String,
}

fn packed_loads(kernel: &Kernel, levels: &[Level]) -> Vec<Packed> {
    let inner = vector::coefficients(kernel, true, levels);
    let outer = vector::coefficients(kernel, false, levels);
    (0..kernel.insts.len())
        .filter_map(|k| {
            let inst = kernel.insts[k];
            let InstKind::Load { arg, offset } = inst.kind else {
                return None;
            };
            let stride = inner[offset.index()]?;
            if levels[k] != Level::Inner
                || inst.dtype != DType::F32
                || stride < 16
                || outer[offset.index()] != Some(1)
            {
                return None;
            }
            Some(Packed {
                load: k,
                arg,
                stride,
                base: vector::index_expr(kernel, offset, "ob", "jt")?,
                at: vector::index_expr(kernel, offset, "oo", "jj")?,
            })
        })
        .collect()
}

/// The tile of outer × inner iterations `kernel`'s loops run in, if they run in tiles (see
/// `tiles`): for `kfuse explain`.
pub fn tile_shape(kernel: &Kernel) -> Option<[usize; 2]> {
    let levels = kernel.levels();
    let (roots, inner_stores) = pass_roots(kernel, &levels);
    let passes = plan_passes(kernel, &levels, &roots);
    let vector = !inner_stores.is_empty() && vector_pass(kernel, &passes, roots.len() - 1).is_ok();
    let tj = tiles(kernel, &levels, roots.len(), vector)?;
    if !packed_loads(kernel, &levels).is_empty() {
        return Some([TILE_O, TILE_J]);
    }
    Some([
        TILE_O,
        if row_axis(kernel, &levels).is_some() {
            TILE_J
        } else {
            tj
        },
    ])
}

/// Whether each pass of `kernel` over its inner space (its reductions in order, then the final
/// pass, where it stores at the inner level) runs as 16-lane vector bodies, with how many blocks
/// of 16 per loop iteration, or why it keeps the scalar loop: for `kfuse explain`.
pub fn vector_passes(kernel: &Kernel) -> Vec<Result<usize, String>> {
    let levels = kernel.levels();
    let (roots, inner_stores) = pass_roots(kernel, &levels);
    let passes = plan_passes(kernel, &levels, &roots);
    let reductions = kernel
        .insts
        .iter()
        .enumerate()
        .filter_map(|(i, inst)| match inst.kind {
            InstKind::Reduce { op, value } => Some((i, op, inst.dtype, kernel.inst(value).dtype)),
            _ => None,
        });
    let mut report: Vec<Result<usize, String>> = reductions
        .enumerate()
        .map(|(p, (i, op, d, vd))| {
            if !vector_reduction(op, d, vd) {
                return Err(format!("kernel IR %{i} is {} of {vd}", op.name()));
            }
            vector_pass(kernel, &passes, p).map(|vp| {
                if matches!(op, ReduceOp::Max | ReduceOp::Min) {
                    MINMAX_ACCUMULATORS
                } else {
                    vp.blocks()
                }
            })
        })
        .collect();
    if !inner_stores.is_empty() {
        let p = roots.len() - 1;
        report.push(vector_pass(kernel, &passes, p).map(|vp| vp.blocks()));
    }
    report
}

/// Renders `kernel` as a C translation unit defining `kfuse_kernel`.
pub fn render(kernel: &Kernel) -> Result<String, Unsupported> {
    // The source names no loop bounds of the parallel loops (the outer range, and the inner range
    // of kernels without reductions, are run-time arguments) and not the kernel's name, so the
    // same kernel at another batch size or program position renders to the same text and hits
    // the compile cache.
    let mut s = String::from("/* kfuse kernel */\n");
    s.push_str(MATH_HEADER);
    s.push_str(&render_function(kernel, "kfuse_kernel")?);
    Ok(s)
}

/// Renders `kernel` as one C function called `name`, for a translation unit that includes
/// [`MATH_HEADER`] once (several kernels may share one).
pub fn render_function(kernel: &Kernel, name: &str) -> Result<String, Unsupported> {
    let levels = kernel.levels();
    let n_inner = kernel.inner_len();
    let mut s = String::new();
    writeln!(
        s,
        "
void {name}(void **args, int64_t o_lo, int64_t o_hi, int64_t j_lo, int64_t j_hi) {{"
    )
    .unwrap();
    for (i, arg) in kernel.args.iter().enumerate() {
        let t = ctype(arg.ty.dtype);
        match arg.access {
            Access::Read => {
                writeln!(s, "    const {t} *restrict a{i} = (const {t} *)args[{i}];").unwrap()
            }
            Access::Write => writeln!(s, "    {t} *restrict a{i} = ({t} *)args[{i}];").unwrap(),
        }
    }
    let (roots, inner_stores) = pass_roots(kernel, &levels);
    let passes = plan_passes(kernel, &levels, &roots);
    let final_pass = roots.len() - 1;
    // Rows for the next outer iteration are prefetched during the second pass: a reduction
    // pass, or the final pass of a kernel with one reduction (rmsnorm, a row scaled by its norm).
    let next_row = if roots.len() >= 2 {
        NextRow::new(kernel, &passes.compute[0])
    } else {
        None
    };
    // Large outputs stream past the cache. A final pass with vector bodies stores each 64-byte
    // line non-temporally straight from registers, after a scalar head that aligns the first
    // output's lines. Staging and copying (what scalar passes do, `staged_stores`) measured
    // slower on W3, W4b and `tanh(0.5 x + 0.1)`, which computes too much to stage (figures in
    // `docs/structured-ops.md`, "Measurements behind design choices"). So a final pass is
    // staged only where it has no vector body.
    let final_vector = (!inner_stores.is_empty())
        .then(|| vector_pass(kernel, &passes, final_pass).ok())
        .flatten();
    let direct = final_vector.is_some() && written_bytes(kernel) >= STREAM_MIN_BYTES;
    let tiled = tiles(kernel, &levels, roots.len(), final_vector.is_some());
    // A tiled kernel's stores do not stream: each row of a tile writes two lines, and
    // streaming them measured slower (`docs/benchmarks.md`, "W1–W4: elementwise, softmax,
    // layernorm", tried, not kept).
    let staged = if direct || tiled.is_some() {
        vec![None; kernel.insts.len()]
    } else {
        staged_stores(kernel, &levels, &inner_stores, &passes.compute[final_pass])
    };
    let streams = staged.iter().any(Option::is_some);
    for (k, st) in staged.iter().enumerate() {
        if let (Some(_), InstKind::Store { arg, .. }) = (st, kernel.insts[k].kind) {
            let t = ctype(kernel.args[arg as usize].ty.dtype);
            writeln!(s, "    {t} stage{k}[{STAGE}] __attribute__((aligned(64)));").unwrap();
        }
    }
    // Row scratch arrays for values computed in one pass and reloaded in later ones.
    let scratch: Vec<usize> = (0..kernel.insts.len())
        .filter(|&k| passes.save.iter().any(|p| p[k]))
        .collect();
    for &k in &scratch {
        let t = ctype(kernel.insts[k].dtype);
        writeln!(
            s,
            "    {t} *restrict scratch{k} = ({t} *)malloc(sizeof({t}) * {});",
            n_inner.max(1)
        )
        .unwrap();
    }
    s.push_str("    (void)j_lo; (void)j_hi;\n");
    let packed = if tiled.is_some() {
        packed_loads(kernel, &levels)
    } else {
        vec![]
    };
    let tiled = if packed.is_empty() {
        tiled
    } else {
        tiled.map(|_| TILE_J)
    };
    // Tiles whose rows step another outer axis (none where a load is packed along the last).
    let row_axis = tiled
        .filter(|_| packed.is_empty())
        .and_then(|_| row_axis(kernel, &levels));
    let tiled = if row_axis.is_some() {
        Some(TILE_J)
    } else {
        tiled
    };
    // The loads read from tile buffers, whichever way the tiles run.
    let buffered: &[Packed] = row_axis.as_ref().map_or(&packed, |r| &r.packed);
    let (j_lo, j_hi) = if let Some(tj) = tiled {
        for pk in buffered {
            writeln!(
                s,
                "    float tbuf{}[{}] __attribute__((aligned(64)));",
                pk.load,
                TILE_O * TILE_J
            )
            .unwrap();
        }
        if let Some(RowAxis {
            stride,
            rows,
            packed: row_packed,
        }) = &row_axis
        {
            // Blocks of the axes before the row axis, each index of the axes after it, the
            // tiles of inner iterations, and blocks of rows in each; outer indices outside the
            // range are skipped.
            let block = stride * rows;
            writeln!(s, "    for (int64_t ob = o_lo - o_lo % {block}; ob < o_hi; ob += {block})\n    for (int64_t lo = 0; lo < {stride}; lo++)").unwrap();
            writeln!(s, "    for (int64_t jt = j_lo; jt < j_hi; jt += {tj}) {{\n    int64_t jte = jt + {tj} < j_hi ? jt + {tj} : j_hi;").unwrap();
            writeln!(s, "    for (int64_t rb = 0; rb < {rows}; rb += {TILE_O}) {{\n    int64_t re = rb + {TILE_O} < {rows} ? rb + {TILE_O} : {rows};").unwrap();
            // A row axis is one some load moves along by one, so there is a buffered load.
            writeln!(s, "    int whole = re - rb == {TILE_O} && (jte - jt) % 16 == 0 && ob + rb * {stride} + lo >= o_lo && ob + (re - 1) * {stride} + lo < o_hi;").unwrap();
            for pk in row_packed {
                let (k, arg, pstride) = (pk.load, pk.arg, pk.stride);
                writeln!(s, "    if (whole) {{\n        for (int64_t jb = 0; jb < jte - jt; jb += 16)\n            kf_transpose16(a{arg} + {} + jb * ((int64_t){pstride}ll), {pstride}, tbuf{k} + jb, {TILE_J});\n    }} else {{", pk.base).unwrap();
                writeln!(s, "        for (int64_t jj = jt; jj < jte; jj++)\n            for (int64_t rr = rb; rr < re; rr++) {{\n                int64_t oo = ob + rr * {stride} + lo;\n                if (oo >= o_lo && oo < o_hi) tbuf{k}[(rr - rb) * {TILE_J} + (jj - jt)] = a{arg}[{}];\n            }}\n    }}", pk.at).unwrap();
            }
            writeln!(s, "    for (int64_t r = rb; r < re; r++) {{\n        int64_t o = ob + r * {stride} + lo;\n        if (o < o_lo || o >= o_hi) continue;").unwrap();
        } else {
            writeln!(s, "    for (int64_t ob = o_lo; ob < o_hi; ob += {TILE_O}) {{\n    int64_t oe = ob + {TILE_O} < o_hi ? ob + {TILE_O} : o_hi;").unwrap();
            writeln!(s, "    for (int64_t jt = j_lo; jt < j_hi; jt += {tj}) {{\n    int64_t jte = jt + {tj} < j_hi ? jt + {tj} : j_hi;").unwrap();
            for pk in &packed {
                let (k, arg, stride) = (pk.load, pk.arg, pk.stride);
                // The next tile's lines of the strided operand are requested now: each is one line
                // of a different row, which no hardware prefetcher predicts.
                writeln!(s, "    if (oe - ob == {TILE_O} && jte - jt == {TILE_J}) {{\n        for (int64_t r = {TILE_J}; r < {}; r++)\n            KF_PREFETCH(a{arg}, {} + r * ((int64_t){stride}ll), 0, 3);\n        for (int64_t jb = 0; jb < {TILE_J}; jb += 16)\n            kf_transpose16(a{arg} + {} + jb * ((int64_t){stride}ll), {stride}, tbuf{k} + jb, {TILE_J});\n    }} else {{", 2 * TILE_J, pk.base, pk.base).unwrap();
                writeln!(s, "        for (int64_t jj = jt; jj < jte; jj++)\n            for (int64_t oo = ob; oo < oe; oo++)\n                tbuf{k}[(oo - ob) * {TILE_J} + (jj - jt)] = a{arg}[{}];\n    }}", pk.at).unwrap();
            }
            s.push_str("    for (int64_t o = ob; o < oe; o++) {\n");
        }
        ("jt", "jte")
    } else {
        s.push_str("    for (int64_t o = o_lo; o < o_hi; o++) {\n");
        ("j_lo", "j_hi")
    };
    let mut pass = 0;
    for (i, (&inst, &level)) in kernel.insts.iter().zip(&levels).enumerate() {
        if level == Level::Inner {
            continue;
        }
        if let InstKind::Reduce { op, value } = inst.kind {
            let body = pass_body(kernel, &passes, pass, &staged, "                ")?;
            let vp = vector_reduction(op, inst.dtype, kernel.inst(value).dtype)
                .then(|| vector_pass(kernel, &passes, pass).ok())
                .flatten();
            let this_pass = pass;
            pass += 1;
            let d = inst.dtype;
            let vd = kernel.inst(value).dtype;
            if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
                let better = if op == ReduceOp::ArgMax { ">" } else { "<" };
                let t = ctype(vd);
                writeln!(s, "        int64_t v{i} = 0;\n        {{\n            {t} best = 0; int best_nan = 0;").unwrap();
                writeln!(s, "            for (int64_t j = 0; j < {n_inner}; j++) {{\n{body}                {t} x = {};", v(value)).unwrap();
                writeln!(s, "                if (j == 0 || (!best_nan && (x != x || x {better} best))) {{ best = x; best_nan = x != x; v{i} = j; }}\n            }}\n        }}").unwrap();
                continue;
            }
            let t = ctype(d);
            let id = identity(op, d);
            let c = combine(op, d, "acc[l]", &v(value));
            writeln!(s, "        {t} v{i};\n        {{\n            {t} acc[16];\n            for (int l = 0; l < 16; l++) acc[l] = {id};").unwrap();
            if let (Some((vty, f)), Some(vp)) = (vector_combine(op, d).filter(|_| vd == d), &vp) {
                // Vector bodies: each block copy yields its 16 terms as one vector.
                writeln!(s, "            int64_t jb = 0;\n            {{\n                {vty} vacc;\n                memcpy(&vacc, acc, sizeof acc);").unwrap();
                let inner = "                    ";
                let loops: &[(usize, usize)] = if matches!(op, ReduceOp::Max | ReduceOp::Min) {
                    // Four accumulators, as below.
                    writeln!(
                        s,
                        "                {vty} vacc1 = vacc, vacc2 = vacc, vacc3 = vacc;"
                    )
                    .unwrap();
                    &[(MINMAX_ACCUMULATORS, MINMAX_ACCUMULATORS), (1, 1)]
                } else {
                    // One accumulator: the blocks' terms combine in order.
                    &[(vp.blocks(), 1), (1, 1)]
                };
                for &(blocks, accs) in loops {
                    let width = LANES * blocks;
                    writeln!(s, "                for (; jb + {width} <= {n_inner}; jb += {width}) {{\n{inner}int64_t j = jb;").unwrap();
                    let ahead = this_pass == 0 && prefetches_ahead(blocks) && accs == 1;
                    s.push_str(&vp.bodies(blocks, ahead, inner));
                    if let (1, Some(next)) = (this_pass, &next_row) {
                        for u in 0..blocks {
                            s.push_str(&next.prefetches(kernel, u, inner));
                        }
                    }
                    for u in 0..blocks {
                        let acc = match u % accs {
                            0 => "vacc".to_string(),
                            a => format!("vacc{a}"),
                        };
                        writeln!(s, "{inner}{acc} = {f}({acc}, {});", vp.vector(value, u)).unwrap();
                    }
                    writeln!(s, "                }}").unwrap();
                    if accs == MINMAX_ACCUMULATORS {
                        writeln!(
                            s,
                            "                vacc = {f}({f}(vacc, vacc1), {f}(vacc2, vacc3));"
                        )
                        .unwrap();
                    }
                }
                writeln!(
                    s,
                    "                memcpy(acc, &vacc, sizeof acc);\n            }}"
                )
                .unwrap();
            } else if let Some(vt) = vector_combine(op, d).filter(|_| vd == d) {
                // The 16 partial results live in one vector value (registers) over the blocks
                // of 16 terms; the tail and the pairwise tree use the array.
                let (vty, f) = vt;
                writeln!(s, "            int64_t jb = 0;\n            {{\n                {vty} vacc;\n                memcpy(&vacc, acc, sizeof acc);").unwrap();
                if matches!(op, ReduceOp::Max | ReduceOp::Min) {
                    // max and min give the same bits in any order (a total order on
                    // non-NaN values, and any NaN makes the canonical NaN), so four
                    // independent accumulators can take turns: the combine is a chain of
                    // several dependent instructions, which one accumulator would wait on.
                    writeln!(s, "                {vty} vacc1 = vacc, vacc2 = vacc, vacc3 = vacc;\n                for (; jb + 64 <= {n_inner}; jb += 64) {{").unwrap();
                    for u in 0..4 {
                        writeln!(s, "                    {vty} x{u};\n                    {{\n                        {t} val[16];\n                        for (int l = 0; l < 16; l++) {{\n                            int64_t j = jb + {} + l;", 16 * u).unwrap();
                        for line in body.lines() {
                            writeln!(s, "            {line}").unwrap();
                        }
                        writeln!(s, "                            val[l] = {};\n                        }}\n                        memcpy(&x{u}, val, sizeof val);\n                    }}", v(value)).unwrap();
                    }
                    writeln!(s, "                    vacc = {f}(vacc, x0);\n                    vacc1 = {f}(vacc1, x1);\n                    vacc2 = {f}(vacc2, x2);\n                    vacc3 = {f}(vacc3, x3);\n                }}\n                vacc = {f}({f}(vacc, vacc1), {f}(vacc2, vacc3));").unwrap();
                }
                writeln!(s, "                for (; jb + 16 <= {n_inner}; jb += 16) {{\n                    {t} val[16];\n                    for (int l = 0; l < 16; l++) {{\n                        int64_t j = jb + l;").unwrap();
                for line in body.lines() {
                    writeln!(s, "        {line}").unwrap();
                }
                writeln!(s, "                        val[l] = {};\n                    }}\n                    {vty} x;\n                    memcpy(&x, val, sizeof val);\n                    vacc = {f}(vacc, x);\n                }}\n                memcpy(acc, &vacc, sizeof acc);\n            }}", v(value)).unwrap();
            } else {
                writeln!(s, "            int64_t jb = 0;\n            for (; jb + 16 <= {n_inner}; jb += 16) {{\n                for (int l = 0; l < 16; l++) {{\n                    int64_t j = jb + l;").unwrap();
                for line in body.lines() {
                    writeln!(s, "    {line}").unwrap();
                }
                writeln!(
                    s,
                    "                    acc[l] = {c};\n                }}\n            }}"
                )
                .unwrap();
            }
            writeln!(s, "            for (int l = 0; jb + l < {n_inner}; l++) {{\n                int64_t j = jb + l;\n{body}                acc[l] = {c};\n            }}").unwrap();
            let tree = combine(op, d, "acc[2 * l]", "acc[2 * l + 1]");
            writeln!(s, "            for (int w = 8; w >= 1; w /= 2)\n                for (int l = 0; l < w; l++) acc[l] = {tree};\n            v{i} = acc[0];\n        }}").unwrap();
            continue;
        }
        writeln!(s, "        {}", statement(kernel, i)?).unwrap();
    }
    if !inner_stores.is_empty() {
        // Staged stores imply a final pass without vector body (one with streams directly).
        let vp = final_vector.map(|vp| vp.streaming(direct));
        // The address of the first output's element `j`, for the aligning head.
        let align = direct
            .then(|| match kernel.inst(inner_stores[0]).kind {
                InstKind::Store { arg, offset, .. } => {
                    vector::index_expr(kernel, offset, "o", "j").map(|e| format!("a{arg} + {e}"))
                }
                _ => None,
            })
            .flatten();
        let indent = if streams { "            " } else { "        " };
        // The kernel's first pass reads its operands from memory; later ones reread rows from
        // cache. Tiles prefetch their own next lines.
        let ahead = final_pass == 0 && tiled.is_none();
        // The scalar body sits one level deeper inside the vector form's block.
        let body_indent = format!("{indent}{}", if vp.is_some() { "        " } else { "    " });
        let row = if row_axis.is_some() {
            "(r - rb)"
        } else {
            "(o - ob)"
        };
        let body = pass_body_packed(
            kernel,
            &passes,
            final_pass,
            &staged,
            (buffered, row),
            &body_indent,
        )?;
        if let Some(tj) = tiled {
            // The next tile's lines of every contiguous operand and output of this row: 16
            // rows advancing a few lines per tile are more streams than the hardware
            // prefetcher follows.
            s.push_str(&row_prefetches(kernel, &levels, tj));
        }
        if !streams {
            let prefetch = next_row.as_ref().filter(|_| final_pass == 1);
            s.push_str(&inner_loop(
                vp.as_ref(),
                prefetch.map(|n| (kernel, n)),
                ahead,
                align.as_deref(),
                &body,
                j_lo,
                j_hi,
                indent,
            ));
        } else {
            // Blocks of STAGE elements: the pass fills L1-resident staging arrays, which are then
            // streamed to their outputs.
            writeln!(s, "        for (int64_t jb = j_lo; jb < j_hi; jb += {STAGE}) {{\n            int64_t je = jb + {STAGE} < j_hi ? jb + {STAGE} : j_hi;").unwrap();
            let prefetch = next_row.as_ref().filter(|_| final_pass == 1);
            s.push_str(&inner_loop(
                vp.as_ref(),
                prefetch.map(|n| (kernel, n)),
                ahead,
                None,
                &body,
                "jb",
                "je",
                indent,
            ));
            for (k, st) in staged.iter().enumerate() {
                let (Some(st), InstKind::Store { arg, .. }) = (st, kernel.insts[k].kind) else {
                    continue;
                };
                let base = st.base.map_or("0".to_string(), v);
                let t = ctype(kernel.args[arg as usize].ty.dtype);
                writeln!(s, "            kf_stream(a{arg} + {base} + jb, stage{k}, (int64_t)sizeof({t}) * (je - jb));").unwrap();
            }
            s.push_str("        }\n");
        }
    }
    s.push_str(if tiled.is_some() {
        "    }}}\n"
    } else {
        "    }\n"
    });
    if streams || direct {
        s.push_str("    kf_stream_fence();\n");
    }
    for &k in &scratch {
        writeln!(s, "    free(scratch{k});").unwrap();
    }
    s.push_str("}\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coefficients(text: &str) -> Vec<Option<Vec<i64>>> {
        let kernel = kfuse_kernel::text::parse_kernel(text).unwrap();
        affine_forms(&kernel)
            .into_iter()
            .map(|f| f.map(|f| [vec![f.constant], f.coef].concat()))
            .collect()
    }

    /// `affine_forms` recovers the coordinates the lowering's divisions and remainders extract
    /// (as `[constant, outer coefficients…, inner]`), and declines where a remainder wraps or a
    /// quotient's dropped terms reach the divisor: there the tiles would read the wrong rows.
    #[test]
    fn affine_forms_are_exact_or_absent() {
        let forms = coefficients(
            "kernel k0 outer=[4, 5] inner=[70]
arg 0 : f32[4, 5, 70] read
%0 = inner_index() : i64
%1 = outer_index() : i64
%2 = const() value=5 : i64
%3 = idiv(%1, %2) : i64
%4 = irem(%1, %2) : i64
%5 = const() value=3 : i64
%6 = irem(%1, %5) : i64
%7 = iadd(%4, %0) : i64
%8 = const() value=70 : i64
%9 = idiv(%7, %8) : i64
%10 = imul(%4, %8) : i64
%11 = iadd(%10, %0) : i64
%12 = idiv(%11, %8) : i64
%13 = irem(%11, %8) : i64
%14 = isub(%0, %8) : i64
%15 = idiv(%14, %8) : i64
%16 = imin(%0, %4) : i64
%17 = load(%0) arg=0 : f32
",
        );
        let some = |v: &[i64]| Some(v.to_vec());
        assert_eq!(forms[0], some(&[0, 0, 0, 1]));
        assert_eq!(forms[1], some(&[0, 5, 1, 0]));
        // o / 5 and o % 5: the two outer coordinates.
        assert_eq!(forms[3], some(&[0, 1, 0, 0]));
        assert_eq!(forms[4], some(&[0, 0, 1, 0]));
        // o % 3 wraps within a row of the first axis.
        assert_eq!(forms[6], None);
        // (c1 + j) / 70 reaches 1 at c1 + j = 70: not affine.
        assert_eq!(forms[9], None);
        // (70 c1 + j) / 70 and % 70 give back c1 and j.
        assert_eq!(forms[12], some(&[0, 0, 1, 0]));
        assert_eq!(forms[13], some(&[0, 0, 0, 1]));
        // A negative dividend truncates in C: declined.
        assert_eq!(forms[14], some(&[-70, 0, 0, 1]));
        assert_eq!(forms[15], None);
        assert_eq!(forms[16], None);
        assert_eq!(forms[17], None);
    }
}
