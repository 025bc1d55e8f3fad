//! Vector-Jacobian products: for each op, the cotangents of its operands given the cotangent `g`
//! of its result, written with existing IR ops.
//!
//! Conventions, chosen once for the whole crate:
//! - `floor`, `ceil`, `round` and `sign` are constant almost everywhere, so they pass no
//!   gradient (as in JAX and PyTorch); `abs` and `relu` take derivative 0 at 0.
//! - Binary `max` and `min` give the whole gradient to the first operand on ties; `clamp`, being
//!   `min(max(x, lo), hi)`, follows from that rule.
//! - `reduce_max` and `reduce_min` split the gradient evenly among the elements that tie for the
//!   extreme.

use std::f64::consts::{LN_2, PI};

use kfuse_ir::{BinaryOp, CompareOp, Graph, NodeId, Op, PadMode, ReduceOp, Shape, UnaryOp, Value};

use crate::builder::Builder;
use crate::{keepdims_shape, AutodiffError};

/// The cotangent contributions of node `id` to its operands, `None` where an operand is not
/// `wanted` or receives no gradient. `out_cts` holds the cotangent of each result, if any.
pub fn vjp(
    b: &mut Builder,
    graph: &Graph,
    id: NodeId,
    out_cts: &[Option<Value>],
    wanted: &[bool],
) -> Result<Vec<Option<Value>>, AutodiffError> {
    let node = graph.node(id);
    let unsupported = |op: String| AutodiffError::Unsupported { node: id.0, op };
    // sort and topk: the values are x gathered at the indices (result 1), so their cotangent
    // goes back with scatter_add into zeros; the indices carry none.
    if let Op::Sort { axis, .. } | Op::TopK { axis, .. } = &node.op {
        let Some(g) = out_cts[0] else {
            return Ok(vec![None]);
        };
        let x_ty = graph.ty(node.operands[0]).clone();
        let zeros = b.full(&x_ty, 0.0)?;
        let indices = Value {
            node: id,
            result: 1,
        };
        let d = b.add(Op::ScatterAdd { axis: *axis }, vec![zeros, indices, g])?;
        return Ok(vec![Some(d)]);
    }
    if out_cts.len() != 1 {
        return Err(unsupported(node.op.name().to_string()));
    }
    let Some(g) = out_cts[0] else {
        return Ok(vec![None; node.operands.len()]);
    };
    let y = Value::of(id);
    let x = node.operands.first().copied();
    let mut grads: Vec<Option<Value>> = vec![None; node.operands.len()];
    match &node.op {
        Op::Unary(op) => grads[0] = unary(b, *op, x.unwrap(), y, g)?,
        Op::Binary(op) => {
            let (lhs, rhs) = (node.operands[0], node.operands[1]);
            let (dl, dr) = match binary(b, *op, lhs, rhs, y, g, wanted)? {
                Some(pair) => pair,
                None => return Err(unsupported(node.op.name().to_string())),
            };
            grads[0] = unbroadcast_opt(b, dl, graph, lhs)?;
            grads[1] = unbroadcast_opt(b, dr, graph, rhs)?;
        }
        // select(c, a, b): a receives g where c holds, b elsewhere; c carries no gradient.
        Op::Select => {
            let (c, on_true, on_false) = (node.operands[0], node.operands[1], node.operands[2]);
            if wanted[1] {
                let d = b.where_else_zero(c, g)?;
                grads[1] = Some(b.unbroadcast(d, &graph.ty(on_true).shape)?);
            }
            if wanted[2] {
                let d = b.zero_where(c, g)?;
                grads[2] = Some(b.unbroadcast(d, &graph.ty(on_false).shape)?);
            }
        }
        // clamp(x, lo, hi) = min(m, hi) with m = max(x, lo). With ties to the first operand:
        // dm = (m <= hi) ? g : 0, dhi = g - dm, dx = (x >= lo) ? dm : 0, dlo = dm - dx.
        Op::Clamp => {
            let (xv, lo, hi) = (node.operands[0], node.operands[1], node.operands[2]);
            let m = b.binary(BinaryOp::Max, xv, lo)?;
            let below_hi = b.compare(CompareOp::Le, m, hi)?;
            let dm = b.where_else_zero(below_hi, g)?;
            if wanted[2] {
                let d = b.zero_where(below_hi, g)?;
                grads[2] = Some(b.unbroadcast(d, &graph.ty(hi).shape)?);
            }
            if wanted[0] || wanted[1] {
                let m_shape = b.ty(m).shape.clone();
                let dm = b.unbroadcast(dm, &m_shape)?;
                let above_lo = b.compare(CompareOp::Ge, xv, lo)?;
                if wanted[0] {
                    let d = b.where_else_zero(above_lo, dm)?;
                    grads[0] = Some(b.unbroadcast(d, &graph.ty(xv).shape)?);
                }
                if wanted[1] {
                    let d = b.zero_where(above_lo, dm)?;
                    grads[1] = Some(b.unbroadcast(d, &graph.ty(lo).shape)?);
                }
            }
        }
        // A float-to-float cast passes g back, cast to the operand's dtype.
        Op::Cast { .. } => {
            let from = graph.ty(x.unwrap()).dtype;
            grads[0] = Some(b.add(Op::Cast { to: from }, vec![g])?);
        }
        Op::Reduce { op, axes, .. } => {
            grads[0] = reduce(b, graph, *op, axes, y, g)?;
            if grads[0].is_none() {
                return Err(unsupported(node.op.name().to_string()));
            }
        }
        // reshape: g reshaped back.
        Op::Reshape { .. } => {
            grads[0] = Some(b.reshape(g, &graph.ty(x.unwrap()).shape)?);
        }
        // permute(perm): g permuted by the inverse permutation.
        Op::Permute { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            grads[0] = Some(b.permute(g, inverse)?);
        }
        // broadcast: g summed over the broadcast axes.
        Op::Broadcast { .. } => {
            grads[0] = Some(b.unbroadcast(g, &graph.ty(x.unwrap()).shape)?);
        }
        Op::Slice { start, stop, step } => {
            grads[0] = Some(slice(b, &graph.ty(x.unwrap()).shape, start, stop, step, g)?);
        }
        // pad: g sliced back to the interior; in edge and reflect mode the border cells also
        // add into the cells they copied (see `pad_border`). A constant fill has no gradient.
        Op::Pad {
            low, high, mode, ..
        } => {
            let dims = graph.ty(x.unwrap()).shape.dims().to_vec();
            let mut cur = g;
            for axis in 0..dims.len() {
                cur = pad_border(b, cur, axis, low[axis], high[axis], dims[axis], *mode)?;
            }
            grads[0] = Some(cur);
        }
        // concat: each operand receives its own range of g along the axis.
        Op::Concat { axis } => {
            let out_dims = graph.ty(y).shape.dims().to_vec();
            let mut offset = 0;
            for (i, operand) in node.operands.iter().enumerate() {
                let size = graph.ty(*operand).shape.dims()[*axis];
                if wanted[i] {
                    let mut start = vec![0; out_dims.len()];
                    let mut stop = out_dims.clone();
                    start[*axis] = offset;
                    stop[*axis] = offset + size;
                    grads[i] = Some(b.add(
                        Op::Slice {
                            start,
                            stop,
                            step: vec![1; out_dims.len()],
                        },
                        vec![g],
                    )?);
                }
                offset += size;
            }
        }
        // flip: g flipped along the same axes.
        Op::Flip { axes } => {
            grads[0] = Some(b.add(Op::Flip { axes: axes.clone() }, vec![g])?);
        }
        // C = A @ B: dA = g @ B^T, dB = A^T @ g, each summed over broadcast batch axes.
        Op::MatMul => {
            let (lhs, rhs) = (node.operands[0], node.operands[1]);
            if wanted[0] {
                let bt = transpose_last(b, rhs)?;
                let d = b.add(Op::MatMul, vec![g, bt])?;
                grads[0] = Some(b.unbroadcast(d, &graph.ty(lhs).shape)?);
            }
            if wanted[1] {
                let at = transpose_last(b, lhs)?;
                let d = b.add(Op::MatMul, vec![at, g])?;
                grads[1] = Some(b.unbroadcast(d, &graph.ty(rhs).shape)?);
            }
        }
        // out[i][j] = x[index[i][j]][j]: each g element adds into the x element it was read from,
        // dx = scatter_add(zeros like x, index, g).
        Op::Gather { axis } => {
            let x_ty = graph.ty(node.operands[0]).clone();
            let zeros = b.full(&x_ty, 0.0)?;
            grads[0] = Some(b.add(
                Op::ScatterAdd { axis: *axis },
                vec![zeros, node.operands[1], g],
            )?);
        }
        // out = x; out[index[i][j]][j] += src[i][j]: dx = g, dsrc = gather(g, index).
        Op::ScatterAdd { axis } => {
            grads[0] = Some(g);
            if wanted[2] {
                grads[2] = Some(b.add(Op::Gather { axis: *axis }, vec![g, node.operands[1]])?);
            }
        }
        other => return Err(unsupported(other.name().to_string())),
    }
    for (i, w) in wanted.iter().enumerate() {
        if !w {
            grads[i] = None;
        }
    }
    Ok(grads)
}

fn unbroadcast_opt(
    b: &mut Builder,
    d: Option<Value>,
    graph: &Graph,
    operand: Value,
) -> Result<Option<Value>, AutodiffError> {
    match d {
        Some(d) => Ok(Some(b.unbroadcast(d, &graph.ty(operand).shape)?)),
        None => Ok(None),
    }
}

/// The last two axes of `x` swapped.
fn transpose_last(b: &mut Builder, x: Value) -> Result<Value, AutodiffError> {
    let rank = b.ty(x).shape.rank();
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    Ok(b.permute(x, perm)?)
}

/// The derivative of `y = op(x)` times `g`, computed from the forward output `y` where that is
/// cheaper than from `x`. `None` for the ops that are constant almost everywhere.
fn unary(
    b: &mut Builder,
    op: UnaryOp,
    x: Value,
    y: Value,
    g: Value,
) -> Result<Option<Value>, AutodiffError> {
    let d = match op {
        // d/dx -x = -1.
        UnaryOp::Neg => b.unary(UnaryOp::Neg, g)?,
        // d/dx |x| = sign(x), 0 at 0.
        UnaryOp::Abs => {
            let s = b.unary(UnaryOp::Sign, x)?;
            b.mul(g, s)?
        }
        // floor, ceil, round and sign are piecewise constant.
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => return Ok(None),
        // d/dx exp(x) = exp(x) = y.
        UnaryOp::Exp => b.mul(g, y)?,
        // d/dx 2^x = ln 2 * y.
        UnaryOp::Exp2 => {
            let gy = b.mul(g, y)?;
            b.scale(gy, LN_2)?
        }
        // d/dx ln x = 1 / x.
        UnaryOp::Log => b.div(g, x)?,
        // d/dx log2 x = 1 / (x ln 2).
        UnaryOp::Log2 => {
            let xl = b.scale(x, LN_2)?;
            b.div(g, xl)?
        }
        // d/dx ln(1 + x) = 1 / (1 + x).
        UnaryOp::Log1p => {
            let one_plus = b.offset(x, 1.0)?;
            b.div(g, one_plus)?
        }
        // d/dx (e^x - 1) = e^x = y + 1.
        UnaryOp::Expm1 => {
            let e = b.offset(y, 1.0)?;
            b.mul(g, e)?
        }
        // d/dx sqrt x = 1 / (2 y).
        UnaryOp::Sqrt => {
            let gy = b.div(g, y)?;
            b.scale(gy, 0.5)?
        }
        // d/dx x^(-1/2) = -1/2 x^(-3/2) = -y^3 / 2.
        UnaryOp::Rsqrt => {
            let y2 = b.mul(y, y)?;
            let y3 = b.mul(y2, y)?;
            let gy = b.mul(g, y3)?;
            b.scale(gy, -0.5)?
        }
        // d/dx 1/x = -1/x^2 = -y^2.
        UnaryOp::Reciprocal => {
            let y2 = b.mul(y, y)?;
            let gy = b.mul(g, y2)?;
            b.unary(UnaryOp::Neg, gy)?
        }
        // d/dx sin x = cos x.
        UnaryOp::Sin => {
            let c = b.unary(UnaryOp::Cos, x)?;
            b.mul(g, c)?
        }
        // d/dx cos x = -sin x.
        UnaryOp::Cos => {
            let s = b.unary(UnaryOp::Sin, x)?;
            let gs = b.mul(g, s)?;
            b.unary(UnaryOp::Neg, gs)?
        }
        // d/dx tanh x = 1 - y^2.
        UnaryOp::Tanh => {
            let y2 = b.mul(y, y)?;
            let one_minus = one_minus(b, y2)?;
            b.mul(g, one_minus)?
        }
        // d/dx sigmoid x = y (1 - y).
        UnaryOp::Sigmoid => {
            let one_minus = one_minus(b, y)?;
            let dy = b.mul(y, one_minus)?;
            b.mul(g, dy)?
        }
        // d/dx relu x = 1 where x > 0, else 0.
        UnaryOp::Relu => {
            let zero = b.scalar_like(x, 0.0)?;
            let positive = b.compare(CompareOp::Gt, x, zero)?;
            b.where_else_zero(positive, g)?
        }
        // d/dx x Phi(x) = Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2,
        // phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
        UnaryOp::Gelu => {
            let scaled = b.scale(x, std::f64::consts::FRAC_1_SQRT_2)?;
            let erf = b.unary(UnaryOp::Erf, scaled)?;
            let one_plus = b.offset(erf, 1.0)?;
            let cdf = b.scale(one_plus, 0.5)?;
            let x2 = b.mul(x, x)?;
            let half_x2 = b.scale(x2, -0.5)?;
            let e = b.unary(UnaryOp::Exp, half_x2)?;
            let pdf = b.scale(e, 1.0 / (2.0 * PI).sqrt())?;
            let x_pdf = b.mul(x, pdf)?;
            let dy = b.binary(BinaryOp::Add, cdf, x_pdf)?;
            b.mul(g, dy)?
        }
        // With u = c (x + k x^3), c = sqrt(2 / pi), k = 0.044715 and t = tanh u:
        // d/dx x (1 + t) / 2 = (1 + t) / 2 + x (1 - t^2) c (1 + 3 k x^2) / 2.
        UnaryOp::GeluTanh => {
            const K: f64 = 0.044715;
            let c = (2.0 / PI).sqrt();
            let x2 = b.mul(x, x)?;
            let x3 = b.mul(x2, x)?;
            let kx3 = b.scale(x3, K)?;
            let inner = b.binary(BinaryOp::Add, x, kx3)?;
            let u = b.scale(inner, c)?;
            let t = b.unary(UnaryOp::Tanh, u)?;
            let one_plus_t = b.offset(t, 1.0)?;
            let first = b.scale(one_plus_t, 0.5)?;
            let t2 = b.mul(t, t)?;
            let sech2 = one_minus(b, t2)?;
            let kx2 = b.scale(x2, 3.0 * K)?;
            let du = b.offset(kx2, 1.0)?;
            let du = b.scale(du, 0.5 * c)?;
            let x_sech2 = b.mul(x, sech2)?;
            let second = b.mul(x_sech2, du)?;
            let dy = b.binary(BinaryOp::Add, first, second)?;
            b.mul(g, dy)?
        }
        // d/dx erf x = 2 / sqrt(pi) exp(-x^2).
        UnaryOp::Erf => {
            let x2 = b.mul(x, x)?;
            let neg = b.unary(UnaryOp::Neg, x2)?;
            let e = b.unary(UnaryOp::Exp, neg)?;
            let dy = b.scale(e, 2.0 / PI.sqrt())?;
            b.mul(g, dy)?
        }
        // d/dx ln(1 + e^x) = sigmoid x.
        UnaryOp::Softplus => {
            let s = b.unary(UnaryOp::Sigmoid, x)?;
            b.mul(g, s)?
        }
        // Not is bool-valued, so the path check has already refused it.
        UnaryOp::Not => return Ok(None),
    };
    Ok(Some(d))
}

/// `1 - x`.
fn one_minus(b: &mut Builder, x: Value) -> Result<Value, AutodiffError> {
    let one = b.scalar_like(x, 1.0)?;
    Ok(b.binary(BinaryOp::Sub, one, x)?)
}

/// The cotangents of a binary op's two operands, `None` where one is not wanted.
type OperandPair = (Option<Value>, Option<Value>);

/// The cotangents of `y = op(lhs, rhs)` in the broadcast result shape, before they are summed
/// back to each operand's shape. `None` for an op without a rule.
fn binary(
    b: &mut Builder,
    op: BinaryOp,
    lhs: Value,
    rhs: Value,
    y: Value,
    g: Value,
    wanted: &[bool],
) -> Result<Option<OperandPair>, AutodiffError> {
    let (wl, wr) = (wanted[0], wanted[1]);
    let pair = match op {
        // d(a + b) = da + db.
        BinaryOp::Add => (Some(g), Some(g)),
        // d(a - b) = da - db.
        BinaryOp::Sub => (Some(g), wr.then(|| b.unary(UnaryOp::Neg, g)).transpose()?),
        // d(a b) = b da + a db.
        BinaryOp::Mul => (
            wl.then(|| b.mul(g, rhs)).transpose()?,
            wr.then(|| b.mul(g, lhs)).transpose()?,
        ),
        // d(a / b) = da / b - (y / b) db.
        BinaryOp::Div => {
            let dl = wl.then(|| b.div(g, rhs)).transpose()?;
            let dr = if wr {
                let gy = b.mul(g, y)?;
                let q = b.div(gy, rhs)?;
                Some(b.unary(UnaryOp::Neg, q)?)
            } else {
                None
            };
            (dl, dr)
        }
        // d(a^b) = b a^(b - 1) da + y ln(a) db; the second term is NaN for a <= 0, as the
        // derivative does not exist there.
        BinaryOp::Pow => {
            let dl = if wl {
                let bm1 = b.offset(rhs, -1.0)?;
                let p = b.binary(BinaryOp::Pow, lhs, bm1)?;
                let bp = b.mul(rhs, p)?;
                Some(b.mul(g, bp)?)
            } else {
                None
            };
            let dr = if wr {
                let ln = b.unary(UnaryOp::Log, lhs)?;
                let yl = b.mul(y, ln)?;
                Some(b.mul(g, yl)?)
            } else {
                None
            };
            (dl, dr)
        }
        // max(a, b): a gets g where a >= b (ties included), b gets the rest.
        // min(a, b): a gets g where a <= b (ties included), b gets the rest.
        BinaryOp::Max | BinaryOp::Min => {
            let cmp = if op == BinaryOp::Max {
                CompareOp::Ge
            } else {
                CompareOp::Le
            };
            let first = b.compare(cmp, lhs, rhs)?;
            (
                wl.then(|| b.where_else_zero(first, g)).transpose()?,
                wr.then(|| b.zero_where(first, g)).transpose()?,
            )
        }
        // rem(a, b) = a - floor(a / b) b, so d rem = da - floor(a / b) db away from the jumps.
        BinaryOp::Rem => {
            let dr = if wr {
                let q = b.div(lhs, rhs)?;
                let fq = b.unary(UnaryOp::Floor, q)?;
                let gq = b.mul(g, fq)?;
                Some(b.unary(UnaryOp::Neg, gq)?)
            } else {
                None
            };
            (Some(g), dr)
        }
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => return Ok(None),
    };
    Ok(Some(pair))
}

/// The cotangent of the operand of the reduction `y`. `g` is first given the keepdims shape and broadcast
/// back over the reduced axes:
/// - sum: that broadcast;
/// - mean: divided by the number of reduced elements;
/// - prod: times `y / x` (undefined where an element is 0);
/// - max and min: only where `x` equals the extreme, split evenly among ties.
fn reduce(
    b: &mut Builder,
    graph: &Graph,
    op: ReduceOp,
    axes: &[usize],
    y: Value,
    g: Value,
) -> Result<Option<Value>, AutodiffError> {
    let x = graph.node(y.node).operands[0];
    let x_shape = graph.ty(x).shape.clone();
    let kept: Shape = keepdims_shape(&x_shape, axes);
    let g_kept = b.reshape(g, &kept)?;
    let d = match op {
        ReduceOp::Sum => b.broadcast(g_kept, &x_shape)?,
        ReduceOp::Mean => {
            let g_full = b.broadcast(g_kept, &x_shape)?;
            let count: usize = axes.iter().map(|&a| x_shape.dims()[a]).product();
            b.scale(g_full, 1.0 / count.max(1) as f64)?
        }
        ReduceOp::Prod => {
            let y_kept = b.reshape(y, &kept)?;
            let q = b.div(y_kept, x)?;
            let g_full = b.broadcast(g_kept, &x_shape)?;
            b.mul(g_full, q)?
        }
        ReduceOp::Max | ReduceOp::Min => {
            let y_kept = b.reshape(y, &kept)?;
            let hit = b.compare(CompareOp::Eq, x, y_kept)?;
            let dtype = graph.ty(x).dtype;
            let hit_f = b.add(Op::Cast { to: dtype }, vec![hit])?;
            let ties = b.reduce_sum(hit_f, axes.to_vec(), true)?;
            let share = b.div(g_kept, ties)?;
            let share = b.broadcast(share, &x_shape)?;
            b.where_else_zero(hit, share)?
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => return Ok(None),
    };
    Ok(Some(d))
}

/// The cotangent of `x[start:stop:step]`: each `g` element goes back to its source position and
/// every other position gets 0.
///
/// ```text
/// g : [n]  --reshape-->  [n, 1]  --pad high (step - 1)-->  [n, step]  --reshape-->  [n step]
///          --slice to stop - start-->  --pad low start, high dim - stop-->  [dim]
/// ```
fn slice(
    b: &mut Builder,
    x_shape: &Shape,
    start: &[usize],
    stop: &[usize],
    step: &[usize],
    g: Value,
) -> Result<Value, AutodiffError> {
    let rank = x_shape.rank();
    let mut cur = g;
    for axis in 0..rank {
        let s = step[axis];
        if s == 1 {
            continue;
        }
        let dims = b.ty(cur).shape.dims().to_vec();
        let n = dims[axis];
        // Interleave s - 1 zeros after every element along `axis`.
        let mut split = dims.clone();
        split.insert(axis + 1, 1);
        let split_value = b.reshape(cur, &Shape::new(split.clone()))?;
        let mut high = vec![0; rank + 1];
        high[axis + 1] = s - 1;
        let spread = b.add(
            Op::Pad {
                low: vec![0; rank + 1],
                high,
                mode: PadMode::Constant,
                value: kfuse_ir::Ieee64::new(0.0),
            },
            vec![split_value],
        )?;
        let mut merged = dims.clone();
        merged[axis] = n * s;
        let merged_value = b.reshape(spread, &Shape::new(merged.clone()))?;
        // Drop the zeros past the last element, so the axis is stop - start long.
        let mut trim_stop = merged.clone();
        trim_stop[axis] = stop[axis] - start[axis];
        cur = if trim_stop[axis] == merged[axis] {
            merged_value
        } else {
            b.add(
                Op::Slice {
                    start: vec![0; rank],
                    stop: trim_stop,
                    step: vec![1; rank],
                },
                vec![merged_value],
            )?
        };
    }
    let high: Vec<usize> = (0..rank).map(|a| x_shape.dims()[a] - stop[a]).collect();
    if start.iter().chain(&high).all(|&p| p == 0) {
        return Ok(cur);
    }
    Ok(b.add(
        Op::Pad {
            low: start.to_vec(),
            high,
            mode: PadMode::Constant,
            value: kfuse_ir::Ieee64::new(0.0),
        },
        vec![cur],
    )?)
}

/// `g[start..stop]` along `axis`, everything along the other axes.
fn slice_axis(
    b: &mut Builder,
    g: Value,
    axis: usize,
    start: usize,
    stop: usize,
) -> Result<Value, AutodiffError> {
    let dims = b.ty(g).shape.dims().to_vec();
    let mut starts = vec![0; dims.len()];
    let mut stops = dims.clone();
    starts[axis] = start;
    stops[axis] = stop;
    Ok(b.add(
        Op::Slice {
            start: starts,
            stop: stops,
            step: vec![1; dims.len()],
        },
        vec![g],
    )?)
}

/// `x` grown by `low` zeros before and `high` zeros after along `axis`.
fn zero_pad_axis(
    b: &mut Builder,
    x: Value,
    axis: usize,
    low: usize,
    high: usize,
) -> Result<Value, AutodiffError> {
    let rank = b.ty(x).shape.rank();
    let (mut lows, mut highs) = (vec![0; rank], vec![0; rank]);
    lows[axis] = low;
    highs[axis] = high;
    Ok(b.add(
        Op::Pad {
            low: lows,
            high: highs,
            mode: PadMode::Constant,
            value: kfuse_ir::Ieee64::new(0.0),
        },
        vec![x],
    )?)
}

/// The cotangent of one axis of `pad`, from `g` whose `axis` is `low + dim + high` long to one
/// `dim` long:
///
/// ```text
/// constant: g[low .. low + dim]
/// edge:     that, plus sum(g[.. low]) into cell 0 and sum(g[low + dim ..]) into cell dim - 1
/// reflect:  that, plus flip(g[.. low]) into cells 1 ..= low and flip(g[low + dim ..]) into
///           cells dim - 1 - high .. dim - 1
/// ```
fn pad_border(
    b: &mut Builder,
    g: Value,
    axis: usize,
    low: usize,
    high: usize,
    dim: usize,
    mode: PadMode,
) -> Result<Value, AutodiffError> {
    if low == 0 && high == 0 {
        return Ok(g);
    }
    let mut total = slice_axis(b, g, axis, low, low + dim)?;
    if mode == PadMode::Constant {
        return Ok(total);
    }
    let borders = [(0, low, true), (low + dim, low + dim + high, false)];
    for (start, stop, before) in borders {
        if start == stop {
            continue;
        }
        let part = slice_axis(b, g, axis, start, stop)?;
        let (gathered, pad_low, pad_high) = match mode {
            PadMode::Edge => {
                let summed = b.reduce_sum(part, vec![axis], true)?;
                if before {
                    (summed, 0, dim - 1)
                } else {
                    (summed, dim - 1, 0)
                }
            }
            _ => {
                let flipped = b.add(Op::Flip { axes: vec![axis] }, vec![part])?;
                let n = stop - start;
                if before {
                    (flipped, 1, dim - 1 - n)
                } else {
                    (flipped, dim - 1 - n, 1)
                }
            }
        };
        let spread = zero_pad_axis(b, gathered, axis, pad_low, pad_high)?;
        total = b.binary(BinaryOp::Add, total, spread)?;
    }
    Ok(total)
}
