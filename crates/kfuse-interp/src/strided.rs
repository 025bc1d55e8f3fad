//! Index arithmetic over row-major arrays: broadcast strides and an odometer over output indices.

use kfuse_ir::Shape;

/// For each axis of `out`, the element stride of `input` along it: 0 where `input` is broadcast
/// (missing or of size 1), its row-major stride otherwise.
pub fn broadcast_strides(input: &Shape, out: &Shape) -> Vec<usize> {
    let strides = input.strides();
    let skip = out.rank() - input.rank();
    (0..out.rank())
        .map(|axis| {
            if axis < skip || input.dims()[axis - skip] == 1 {
                0
            } else {
                strides[axis - skip]
            }
        })
        .collect()
}

/// Calls `f(out_index, offsets)` for every element of `out` in row-major order, where
/// `offsets[k]` is the element offset of operand `k` given its per-axis `strides[k]`.
pub fn for_each_offset<const K: usize>(
    out: &Shape,
    strides: [&[usize]; K],
    mut f: impl FnMut(usize, [usize; K]),
) {
    let n = out.n_elems();
    if n == 0 {
        return;
    }
    let rank = out.rank();
    if rank == 0 {
        f(0, [0; K]);
        return;
    }
    let dims = out.dims();
    let inner = dims[rank - 1];
    let inner_strides: [usize; K] = std::array::from_fn(|k| strides[k][rank - 1]);
    let mut index = vec![0usize; rank];
    let mut base = [0usize; K];
    let mut out_index = 0;
    loop {
        let mut offsets = base;
        for _ in 0..inner {
            f(out_index, offsets);
            out_index += 1;
            for k in 0..K {
                offsets[k] += inner_strides[k];
            }
        }
        // Advance the odometer over the outer axes.
        let mut axis = rank - 1;
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            index[axis] += 1;
            for k in 0..K {
                base[k] += strides[k][axis];
            }
            if index[axis] < dims[axis] {
                break;
            }
            for k in 0..K {
                base[k] -= strides[k][axis] * dims[axis];
            }
            index[axis] = 0;
        }
    }
}

/// Elementwise map of `K` broadcast operands into a new vector of `out`'s size.
pub fn broadcast_map<T: Copy, U, const K: usize>(
    out: &Shape,
    operands: [(&[T], &Shape); K],
    f: impl Fn([T; K]) -> U,
) -> Vec<U> {
    let n = out.n_elems();
    let mut result = Vec::with_capacity(n);
    if operands.iter().all(|(_, s)| *s == out) {
        for i in 0..n {
            result.push(f(std::array::from_fn(|k| operands[k].0[i])));
        }
        return result;
    }
    let strides: [Vec<usize>; K] = std::array::from_fn(|k| broadcast_strides(operands[k].1, out));
    let stride_refs: [&[usize]; K] = std::array::from_fn(|k| strides[k].as_slice());
    for_each_offset(out, stride_refs, |_, offsets| {
        result.push(f(std::array::from_fn(|k| operands[k].0[offsets[k]])));
    });
    result
}
