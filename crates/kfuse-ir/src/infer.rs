//! Shape and dtype inference: one function for every op.

use crate::shape::{broadcast_shapes, broadcasts_to, MAX_RANK};
use crate::{
    BinaryOp, Conv2dAttrs, DType, Op, PadMode, Pool2dAttrs, ReduceOp, Shape, TensorType, TypeError,
    UnaryOp,
};

type Result<T> = std::result::Result<T, TypeError>;

/// The result types of `op` applied to operands of the given types.
pub fn infer(op: &Op, operands: &[&TensorType]) -> Result<Vec<TensorType>> {
    let results = match op {
        Op::Input { ty, .. } => {
            arity(operands, 0)?;
            vec![ty.clone()]
        }
        Op::Constant { value } => {
            arity(operands, 0)?;
            vec![value.ty()]
        }
        Op::Iota { ty, axis } => {
            arity(operands, 0)?;
            if !ty.dtype.is_numeric() {
                return Err(TypeError::attr("a numeric dtype for iota", ty.dtype));
            }
            check_axis(*axis, ty.shape.rank())?;
            vec![ty.clone()]
        }
        Op::Rng { ty, .. } => {
            arity(operands, 0)?;
            if !ty.dtype.is_float() {
                return Err(TypeError::attr("a float dtype for rng", ty.dtype));
            }
            vec![ty.clone()]
        }
        Op::Unary(u) => {
            arity(operands, 1)?;
            let t = operands[0];
            let ok = match u {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu => t.dtype.is_numeric(),
                UnaryOp::Not => t.dtype == DType::Bool,
                _ => t.dtype.is_float(),
            };
            if !ok {
                let want = match u {
                    UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu => {
                        "a numeric dtype"
                    }
                    UnaryOp::Not => "bool",
                    _ => "a float dtype",
                };
                return Err(TypeError::operand(0, want, t));
            }
            vec![t.clone()]
        }
        Op::Binary(b) => {
            arity(operands, 2)?;
            let dtype = same_dtype(operands)?;
            let ok = match b {
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
                    dtype.is_int() || dtype == DType::Bool
                }
                _ => dtype.is_numeric(),
            };
            if !ok {
                let want = match b {
                    BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => "bool or an integer dtype",
                    _ => "a numeric dtype",
                };
                return Err(TypeError::operand(0, want, operands[0]));
            }
            vec![TensorType {
                dtype,
                shape: broadcast_all(operands)?,
            }]
        }
        Op::Compare(_) => {
            arity(operands, 2)?;
            same_dtype(operands)?;
            vec![TensorType {
                dtype: DType::Bool,
                shape: broadcast_all(operands)?,
            }]
        }
        Op::Select => {
            arity(operands, 3)?;
            if operands[0].dtype != DType::Bool {
                return Err(TypeError::operand(0, "a bool condition", operands[0]));
            }
            let dtype = same_dtype(&operands[1..]).map_err(|e| shift(e, 1))?;
            vec![TensorType {
                dtype,
                shape: broadcast_all(operands)?,
            }]
        }
        Op::Clamp => {
            arity(operands, 3)?;
            let dtype = same_dtype(operands)?;
            if !dtype.is_numeric() {
                return Err(TypeError::operand(0, "a numeric dtype", operands[0]));
            }
            vec![TensorType {
                dtype,
                shape: broadcast_all(operands)?,
            }]
        }
        Op::Cast { to } => {
            arity(operands, 1)?;
            vec![TensorType {
                dtype: *to,
                shape: operands[0].shape.clone(),
            }]
        }
        Op::Reduce { op, axes, keepdims } => {
            arity(operands, 1)?;
            infer_reduce(*op, axes, *keepdims, operands[0])?
        }
        Op::Reshape { shape } => {
            arity(operands, 1)?;
            let t = operands[0];
            if shape.checked_n_elems() != Some(t.shape.n_elems()) {
                let wanted = match shape.checked_n_elems() {
                    Some(n) => n.to_string(),
                    None => "at least 2^64".to_string(),
                };
                return Err(TypeError::operand(
                    0,
                    format!("{wanted} elements to reshape to {shape}"),
                    format!("{t} ({} elements)", t.shape.n_elems()),
                ));
            }
            vec![TensorType {
                dtype: t.dtype,
                shape: shape.clone(),
            }]
        }
        Op::Permute { perm } => {
            arity(operands, 1)?;
            let t = operands[0];
            if !is_permutation(perm, t.shape.rank()) {
                return Err(TypeError::attr(
                    format!("perm to be a permutation of 0..{}", t.shape.rank()),
                    format!("{perm:?}"),
                ));
            }
            let dims = perm.iter().map(|&p| t.shape.0[p]).collect::<Vec<_>>();
            vec![TensorType::new(t.dtype, dims)]
        }
        Op::Broadcast { shape } => {
            arity(operands, 1)?;
            let t = operands[0];
            if !broadcasts_to(&t.shape, shape) {
                return Err(TypeError::operand(
                    0,
                    format!("a shape that broadcasts to {shape}"),
                    t,
                ));
            }
            vec![TensorType {
                dtype: t.dtype,
                shape: shape.clone(),
            }]
        }
        Op::Slice { start, stop, step } => {
            arity(operands, 1)?;
            let t = operands[0];
            let rank = t.shape.rank();
            if start.len() != rank || stop.len() != rank || step.len() != rank {
                return Err(TypeError::attr(
                    format!("start, stop and step of length {rank} (the operand's rank)"),
                    format!("lengths {}, {}, {}", start.len(), stop.len(), step.len()),
                ));
            }
            let mut dims = Vec::with_capacity(rank);
            for axis in 0..rank {
                let dim = t.shape.0[axis];
                let (a, b, s) = (start[axis], stop[axis], step[axis]);
                if s == 0 || a > b || b > dim {
                    return Err(TypeError::attr(
                        format!("0 <= start <= stop <= {dim} and step >= 1 on axis {axis}"),
                        format!("start {a}, stop {b}, step {s}"),
                    ));
                }
                dims.push((b - a).div_ceil(s));
            }
            vec![TensorType::new(t.dtype, dims)]
        }
        Op::Pad {
            low, high, mode, ..
        } => {
            arity(operands, 1)?;
            let t = operands[0];
            let rank = t.shape.rank();
            if low.len() != rank || high.len() != rank {
                return Err(TypeError::attr(
                    format!("low and high of length {rank} (the operand's rank)"),
                    format!("lengths {} and {}", low.len(), high.len()),
                ));
            }
            let mut dims = Vec::with_capacity(rank);
            for axis in 0..rank {
                let dim = t.shape.0[axis];
                let (lo, hi) = (low[axis], high[axis]);
                match mode {
                    PadMode::Reflect if lo.max(hi) > 0 && lo.max(hi) >= dim => {
                        return Err(TypeError::attr(
                            format!("reflect padding below the dim ({dim}) on axis {axis}"),
                            format!("low {lo}, high {hi}"),
                        ))
                    }
                    PadMode::Edge if lo.max(hi) > 0 && dim == 0 => {
                        return Err(TypeError::attr(
                            format!("a non-empty axis {axis} to pad by edge"),
                            "size 0",
                        ))
                    }
                    _ => {}
                }
                dims.push(
                    dim.checked_add(lo)
                        .and_then(|d| d.checked_add(hi))
                        .ok_or_else(|| {
                            TypeError::attr("padding that fits in usize", format!("{lo} + {hi}"))
                        })?,
                );
            }
            vec![TensorType::new(t.dtype, dims)]
        }
        Op::Concat { axis } => {
            if operands.is_empty() {
                return Err(TypeError::attr("at least one operand", "none"));
            }
            let first = operands[0];
            check_axis(*axis, first.shape.rank())?;
            let mut total = 0usize;
            for (i, t) in operands.iter().enumerate() {
                let same_rest = t.shape.rank() == first.shape.rank()
                    && (0..first.shape.rank())
                        .all(|a| a == *axis || t.shape.0[a] == first.shape.0[a]);
                if t.dtype != first.dtype || !same_rest {
                    return Err(TypeError::operand(
                        i,
                        format!(
                            "{}{} with any size on axis {axis}",
                            first.dtype, first.shape
                        ),
                        t,
                    ));
                }
                total = total.checked_add(t.shape.0[*axis]).ok_or_else(|| {
                    TypeError::attr(
                        format!("a concatenated axis {axis} whose size fits in usize"),
                        format!("operands summing past {}", usize::MAX),
                    )
                })?;
            }
            let mut dims = first.shape.0.clone();
            dims[*axis] = total;
            vec![TensorType::new(first.dtype, dims)]
        }
        Op::Flip { axes } => {
            arity(operands, 1)?;
            check_axes(axes, operands[0].shape.rank())?;
            vec![operands[0].clone()]
        }
        Op::MatMul => {
            arity(operands, 2)?;
            vec![infer_matmul(operands[0], operands[1])?]
        }
        Op::Conv2d(attrs) => {
            arity(operands, 2)?;
            vec![infer_conv(attrs, operands[0], operands[1])?]
        }
        Op::Pool2d(attrs) => {
            arity(operands, 1)?;
            vec![infer_pool(attrs, operands[0])?]
        }
        Op::Gather { axis } => {
            arity(operands, 2)?;
            let (x, index) = (operands[0], operands[1]);
            check_index_operand(*axis, x, index, 1)?;
            vec![TensorType {
                dtype: x.dtype,
                shape: index.shape.clone(),
            }]
        }
        Op::ScatterAdd { axis } => {
            arity(operands, 3)?;
            let (x, index, src) = (operands[0], operands[1], operands[2]);
            if !x.dtype.is_numeric() {
                return Err(TypeError::operand(0, "a numeric dtype", x));
            }
            check_index_operand(*axis, x, index, 1)?;
            if src.dtype != x.dtype || src.shape != index.shape {
                return Err(TypeError::operand(
                    2,
                    format!(
                        "{}{} (operand 0's dtype, the index's shape)",
                        x.dtype, index.shape
                    ),
                    src,
                ));
            }
            vec![x.clone()]
        }
        Op::Sort { axis, .. } => {
            arity(operands, 1)?;
            let t = operands[0];
            numeric(t, 0)?;
            check_axis(*axis, t.shape.rank())?;
            vec![
                t.clone(),
                TensorType {
                    dtype: DType::I64,
                    shape: t.shape.clone(),
                },
            ]
        }
        Op::TopK { axis, k, .. } => {
            arity(operands, 1)?;
            let t = operands[0];
            numeric(t, 0)?;
            check_axis(*axis, t.shape.rank())?;
            if *k > t.shape.0[*axis] {
                return Err(TypeError::attr(
                    format!("k <= {} (the size of axis {axis})", t.shape.0[*axis]),
                    format!("k = {k}"),
                ));
            }
            let mut dims = t.shape.0.clone();
            dims[*axis] = *k;
            vec![
                TensorType::new(t.dtype, dims.clone()),
                TensorType::new(DType::I64, dims),
            ]
        }
        Op::Custom { outputs, .. } => {
            if outputs.is_empty() {
                return Err(TypeError::attr("at least one declared output", "none"));
            }
            outputs.clone()
        }
    };
    for t in &results {
        if t.shape.rank() > MAX_RANK {
            return Err(TypeError::attr(
                format!("a result of rank at most {MAX_RANK}"),
                t,
            ));
        }
        if t.shape
            .checked_n_elems()
            .and_then(|n| n.checked_mul(t.dtype.size_bytes()))
            .is_none()
        {
            return Err(TypeError::attr("a result whose size fits in memory", t));
        }
    }
    Ok(results)
}

fn arity(operands: &[&TensorType], n: usize) -> Result<()> {
    if operands.len() != n {
        let s = if n == 1 { "" } else { "s" };
        return Err(TypeError::attr(
            format!("{n} operand{s}"),
            format!("{}", operands.len()),
        ));
    }
    Ok(())
}

fn numeric(t: &TensorType, index: usize) -> Result<()> {
    if !t.dtype.is_numeric() {
        return Err(TypeError::operand(index, "a numeric dtype", t));
    }
    Ok(())
}

fn same_dtype(operands: &[&TensorType]) -> Result<DType> {
    let dtype = operands[0].dtype;
    for (i, t) in operands.iter().enumerate().skip(1) {
        if t.dtype != dtype {
            return Err(TypeError::operand(
                i,
                format!("dtype {dtype} (as operand 0)"),
                t,
            ));
        }
    }
    Ok(dtype)
}

fn shift(mut e: TypeError, by: usize) -> TypeError {
    e.operand = e.operand.map(|i| i + by);
    e
}

fn broadcast_all(operands: &[&TensorType]) -> Result<Shape> {
    let mut shape = operands[0].shape.clone();
    for (i, t) in operands.iter().enumerate().skip(1) {
        shape = broadcast_shapes(&shape, &t.shape).ok_or_else(|| {
            TypeError::operand(i, format!("a shape that broadcasts with {shape}"), t)
        })?;
    }
    Ok(shape)
}

fn check_axis(axis: usize, rank: usize) -> Result<()> {
    if axis >= rank {
        return Err(TypeError::attr(
            format!("an axis below rank {rank}"),
            format!("axis {axis}"),
        ));
    }
    Ok(())
}

/// Axes must be strictly increasing and below the rank.
fn check_axes(axes: &[usize], rank: usize) -> Result<()> {
    let increasing = axes.windows(2).all(|w| w[0] < w[1]);
    if !increasing || axes.iter().any(|&a| a >= rank) {
        return Err(TypeError::attr(
            format!("strictly increasing axes below rank {rank}"),
            format!("{axes:?}"),
        ));
    }
    Ok(())
}

fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

fn infer_reduce(
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
    t: &TensorType,
) -> Result<Vec<TensorType>> {
    check_axes(axes, t.shape.rank())?;
    match op {
        ReduceOp::Mean if !t.dtype.is_float() => {
            return Err(TypeError::operand(0, "a float dtype", t));
        }
        _ => numeric(t, 0)?,
    }
    let reduces_nothing = axes.iter().any(|&a| t.shape.0[a] == 0);
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && reduces_nothing {
        return Err(TypeError::operand(
            0,
            "non-empty reduced axes for an arg reduction",
            t,
        ));
    }
    let mut dims = Vec::new();
    for (axis, &d) in t.shape.0.iter().enumerate() {
        if !axes.contains(&axis) {
            dims.push(d);
        } else if keepdims {
            dims.push(1);
        }
    }
    let dtype = match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
        _ => t.dtype,
    };
    Ok(vec![TensorType::new(dtype, dims)])
}

fn infer_matmul(a: &TensorType, b: &TensorType) -> Result<TensorType> {
    numeric(a, 0)?;
    if b.dtype != a.dtype {
        return Err(TypeError::operand(
            1,
            format!("dtype {} (as operand 0)", a.dtype),
            b,
        ));
    }
    if a.shape.rank() < 2 {
        return Err(TypeError::operand(0, "rank >= 2 ([..., M, K])", a));
    }
    if b.shape.rank() < 2 {
        return Err(TypeError::operand(1, "rank >= 2 ([..., K, N])", b));
    }
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    let (m, k) = (a.shape.0[ra - 2], a.shape.0[ra - 1]);
    let (k2, n) = (b.shape.0[rb - 2], b.shape.0[rb - 1]);
    if k != k2 {
        return Err(TypeError::operand(
            1,
            format!("[..., {k}, N] to match operand 0's K"),
            b,
        ));
    }
    let batch_a = Shape::new(a.shape.0[..ra - 2].to_vec());
    let batch_b = Shape::new(b.shape.0[..rb - 2].to_vec());
    let batch = broadcast_shapes(&batch_a, &batch_b).ok_or_else(|| {
        TypeError::operand(1, format!("batch dims that broadcast with {batch_a}"), b)
    })?;
    let mut dims = batch.0;
    dims.extend([m, n]);
    Ok(TensorType::new(a.dtype, dims))
}

/// Output extent of a sliding window: `None` if the window does not fit.
pub fn window_out(
    size: usize,
    pad: usize,
    window: usize,
    stride: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation
        .checked_mul(window.checked_sub(1)?)?
        .checked_add(1)?;
    let padded = size.checked_add(pad)?;
    Some(padded.checked_sub(span)? / stride + 1)
}

/// `(N, C, H, W)` of a rank-4 activation in the given layout.
pub fn nchw_dims(shape: &Shape, layout: crate::Layout) -> [usize; 4] {
    let d = &shape.0;
    match layout {
        crate::Layout::Nchw => [d[0], d[1], d[2], d[3]],
        crate::Layout::Nhwc => [d[0], d[3], d[1], d[2]],
    }
}

fn layout_shape(layout: crate::Layout, n: usize, c: usize, h: usize, w: usize) -> Vec<usize> {
    match layout {
        crate::Layout::Nchw => vec![n, c, h, w],
        crate::Layout::Nhwc => vec![n, h, w, c],
    }
}

fn check_window(stride: [usize; 2], dilation: [usize; 2]) -> Result<()> {
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(TypeError::attr(
            "stride and dilation >= 1",
            format!("stride {stride:?}, dilation {dilation:?}"),
        ));
    }
    Ok(())
}

/// The padding along H and W (`top + bottom`, `left + right`) of `[top, bottom, left, right]`.
fn padding_sums(padding: [usize; 4]) -> Result<[usize; 2]> {
    let [pt, pb, pl, pr] = padding;
    match (pt.checked_add(pb), pl.checked_add(pr)) {
        (Some(h), Some(w)) => Ok([h, w]),
        _ => Err(TypeError::attr(
            "padding whose sums fit in usize",
            format!("padding {padding:?}"),
        )),
    }
}

fn infer_conv(attrs: &Conv2dAttrs, x: &TensorType, w: &TensorType) -> Result<TensorType> {
    numeric(x, 0)?;
    if x.shape.rank() != 4 {
        return Err(TypeError::operand(
            0,
            format!("a rank-4 {} activation", attrs.layout.name()),
            x,
        ));
    }
    if w.dtype != x.dtype || w.shape.rank() != 4 {
        return Err(TypeError::operand(
            1,
            format!("a rank-4 {} weight [C_out, C_in/groups, KH, KW]", x.dtype),
            w,
        ));
    }
    check_window(attrs.stride, attrs.dilation)?;
    let [n, c_in, h, wd] = nchw_dims(&x.shape, attrs.layout);
    let [c_out, c_per_group, kh, kw] = [w.shape.0[0], w.shape.0[1], w.shape.0[2], w.shape.0[3]];
    let g = attrs.groups;
    if g == 0 || c_in % g != 0 || c_out % g != 0 {
        return Err(TypeError::attr(
            format!("groups >= 1 dividing C_in ({c_in}) and C_out ({c_out})"),
            format!("groups = {g}"),
        ));
    }
    if c_per_group != c_in / g {
        return Err(TypeError::operand(
            1,
            format!("C_in/groups = {} in dim 1", c_in / g),
            w,
        ));
    }
    let [pad_h, pad_w] = padding_sums(attrs.padding)?;
    let oh = window_out(h, pad_h, kh, attrs.stride[0], attrs.dilation[0]);
    let ow = window_out(wd, pad_w, kw, attrs.stride[1], attrs.dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok(TensorType::new(
            x.dtype,
            layout_shape(attrs.layout, n, c_out, oh, ow),
        )),
        _ => Err(TypeError::operand(
            1,
            format!(
                "a dilated kernel no larger than the padded input ({}x{})",
                h.saturating_add(pad_h),
                wd.saturating_add(pad_w)
            ),
            w,
        )),
    }
}

fn infer_pool(attrs: &Pool2dAttrs, x: &TensorType) -> Result<TensorType> {
    numeric(x, 0)?;
    if x.shape.rank() != 4 {
        return Err(TypeError::operand(
            0,
            format!("a rank-4 {} activation", attrs.layout.name()),
            x,
        ));
    }
    check_window(attrs.stride, attrs.dilation)?;
    let [kh, kw] = attrs.window;
    let [pt, pb, pl, pr] = attrs.padding;
    if kh == 0 || kw == 0 || pt.max(pb) > kh / 2 || pl.max(pr) > kw / 2 {
        return Err(TypeError::attr(
            "a non-empty window and padding of at most half the window",
            format!("window {:?}, padding {:?}", attrs.window, attrs.padding),
        ));
    }
    let [n, c, h, w] = nchw_dims(&x.shape, attrs.layout);
    let [pad_h, pad_w] = padding_sums(attrs.padding)?;
    let oh = window_out(h, pad_h, kh, attrs.stride[0], attrs.dilation[0]);
    let ow = window_out(w, pad_w, kw, attrs.stride[1], attrs.dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok(TensorType::new(
            x.dtype,
            layout_shape(attrs.layout, n, c, oh, ow),
        )),
        _ => Err(TypeError::operand(
            0,
            format!(
                "an input no smaller than the dilated window {:?}",
                attrs.window
            ),
            x,
        )),
    }
}

fn check_index_operand(axis: usize, x: &TensorType, index: &TensorType, at: usize) -> Result<()> {
    check_axis(axis, x.shape.rank())?;
    let fits = index.shape.rank() == x.shape.rank()
        && (0..x.shape.rank()).all(|d| d == axis || index.shape.0[d] <= x.shape.0[d]);
    if !matches!(index.dtype, DType::I32 | DType::I64) || !fits {
        return Err(TypeError::operand(
            at,
            format!(
                "an i32 or i64 index of rank {} no larger than {} off axis {axis}",
                x.shape.rank(),
                x.shape
            ),
            index,
        ));
    }
    Ok(())
}
