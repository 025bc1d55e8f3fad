//! Reductions over a set of axes.
//!
//! The order is part of kfuse's numerics: for each output element, the reduced elements are
//! enumerated in row-major order over the reduced axes; element `j` is accumulated into partial
//! `j mod 16` (each partial in increasing `j`), and the 16 partials are combined by a pairwise tree
//! `((p0 + p1) + (p2 + p3)) + ...`. This order vectorizes (one 16-lane f32 register) and is what
//! strict-mode compiled kernels reproduce. `max`/`min` are order-independent; `mean` is the sum
//! divided by the count; integer sums and products wrap.

use kfuse_ir::{Array, Element, ReduceOp, Shape, TensorType};

use crate::elem::{narrow, widen, with_compute, Elem};

/// Number of partial accumulators in the documented reduction order.
pub const LANES: usize = 16;

/// Offsets of the kept (output) positions and of the reduced positions, both row-major.
///
/// An empty input may have dims whose product exceeds any list (`[0, 2^62]` reduced over axis 1,
/// `[2^40, 0, 5]` over axis 2). So a selection with an empty dim is empty at once, before the
/// dims ahead of it are listed, and with no kept position no reduced offset is listed: none
/// would be read.
fn split_offsets(shape: &Shape, axes: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let strides = shape.strides();
    let offsets_over = |selected: &dyn Fn(usize) -> bool| {
        let mut offsets = vec![0usize];
        if (0..shape.rank()).any(|axis| selected(axis) && shape.dims()[axis] == 0) {
            return Vec::new();
        }
        for (axis, (&dim, &stride)) in shape.dims().iter().zip(&strides).enumerate() {
            if !selected(axis) {
                continue;
            }
            offsets = offsets
                .iter()
                .flat_map(|&o| (0..dim).map(move |i| o + i * stride))
                .collect();
        }
        offsets
    };
    let kept = offsets_over(&|a| !axes.contains(&a));
    let reduced = if kept.is_empty() {
        Vec::new()
    } else {
        offsets_over(&|a| axes.contains(&a))
    };
    (kept, reduced)
}

/// Combines `values` in the documented order with `op` starting from `identity`.
pub fn ordered_fold<T: Copy>(
    values: impl Iterator<Item = T>,
    identity: T,
    op: impl Fn(T, T) -> T,
) -> T {
    let mut partials = [identity; LANES];
    for (j, v) in values.enumerate() {
        partials[j % LANES] = op(partials[j % LANES], v);
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            partials[i] = op(partials[2 * i], partials[2 * i + 1]);
        }
    }
    partials[0]
}

fn reduce_typed<T: Elem>(op: ReduceOp, v: &[T], kept: &[usize], reduced: &[usize]) -> Array {
    let gather = |o: usize| reduced.iter().map(move |&r| v[o + r]);
    let vec_of = |f: &dyn Fn(usize) -> T| -> Vec<T> { kept.iter().map(|&o| f(o)).collect() };
    let shape = Shape::new(vec![kept.len()]);
    match op {
        ReduceOp::Sum => wrap(
            shape,
            vec_of(&|o| ordered_fold(gather(o), T::from_i64(0), T::add)),
        ),
        ReduceOp::Prod => wrap(
            shape,
            vec_of(&|o| ordered_fold(gather(o), T::from_i64(1), T::mul)),
        ),
        ReduceOp::Max => wrap(shape, vec_of(&|o| gather(o).fold(T::lowest(), T::ieee_max))),
        ReduceOp::Min => wrap(
            shape,
            vec_of(&|o| gather(o).fold(T::highest(), T::ieee_min)),
        ),
        ReduceOp::Mean => {
            let n = reduced.len();
            wrap(
                shape,
                vec_of(&|o| {
                    let sum = ordered_fold(gather(o), T::from_i64(0), T::add);
                    T::from_f64(sum.to_f64() / n as f64)
                }),
            )
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            let want_max = op == ReduceOp::ArgMax;
            let indices: Vec<i64> = kept
                .iter()
                .map(|&o| {
                    let mut best = 0usize;
                    for (j, &r) in reduced.iter().enumerate().skip(1) {
                        let (cand, cur) = (v[o + r], v[o + reduced[best]]);
                        if cur.is_nan() {
                            break; // The first NaN wins.
                        }
                        let better =
                            cand.is_nan() || if want_max { cand > cur } else { cand < cur };
                        if better {
                            best = j;
                        }
                    }
                    best as i64
                })
                .collect();
            wrap(shape, indices)
        }
    }
}

fn wrap<T: Element>(shape: Shape, v: Vec<T>) -> Array {
    Array::new(shape, T::wrap(v)).expect("one value per output")
}

/// Reduces `x` over `axes`; `out` is the inferred result type.
pub fn reduce(op: ReduceOp, x: &Array, axes: &[usize], out: &TensorType) -> Array {
    let wide = widen(x);
    let (kept, reduced) = split_offsets(x.shape(), axes);
    let flat = with_compute!(wide.storage(), v: T => reduce_typed::<T>(op, v, &kept, &reduced));
    let result = flat
        .reshaped(out.shape.clone())
        .expect("reduction fills its output");
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        result
    } else {
        narrow(result, x.dtype())
    }
}
