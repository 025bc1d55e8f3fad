//! Movement ops as index maps: every output element names the input element it copies (or a
//! fill value). No arithmetic touches the data, so 16-bit floats are moved as they are.

use kfuse_ir::{bf16, f16, Array, Element, PadMode, Shape, Storage, TensorType};

/// Visits every multi-index of `shape` in row-major order.
fn for_each_index(shape: &Shape, mut f: impl FnMut(&[usize])) {
    if shape.n_elems() == 0 {
        return;
    }
    let mut index = vec![0usize; shape.rank()];
    loop {
        f(&index);
        let mut axis = shape.rank();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < shape.dims()[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// Builds an array of shape `out` whose element at each multi-index is `x[source(index)]`, or
/// `fill` (converted to the dtype) where `source` gives `None`. Indices are visited in row-major
/// order.
pub fn take(
    x: &Array,
    out: &Shape,
    fill: f64,
    mut source: impl FnMut(&[usize]) -> Option<usize>,
) -> Array {
    fn pick<T: Copy>(
        v: &[T],
        out: &Shape,
        fill: T,
        source: &mut dyn FnMut(&[usize]) -> Option<usize>,
    ) -> Vec<T> {
        let mut result = Vec::with_capacity(out.n_elems());
        for_each_index(out, |idx| result.push(source(idx).map_or(fill, |i| v[i])));
        result
    }
    let s = &mut source;
    let data = match x.storage() {
        Storage::F32(v) => Storage::F32(pick(v, out, fill as f32, s)),
        Storage::F64(v) => Storage::F64(pick(v, out, fill, s)),
        Storage::F16(v) => Storage::F16(pick(v, out, f16::from_f64(fill), s)),
        Storage::BF16(v) => Storage::BF16(pick(v, out, bf16::from_f64(fill), s)),
        Storage::I32(v) => Storage::I32(pick(v, out, fill as i32, s)),
        Storage::I64(v) => Storage::I64(pick(v, out, fill as i64, s)),
        Storage::U8(v) => Storage::U8(pick(v, out, fill as u8, s)),
        Storage::Bool(v) => Storage::Bool(pick(v, out, fill != 0.0, s)),
    };
    Array::new(out.clone(), data).expect("one source per output element")
}

fn dot(index: &[usize], strides: &[usize]) -> usize {
    index.iter().zip(strides).map(|(i, s)| i * s).sum()
}

pub fn permute(x: &Array, perm: &[usize], out: &Shape) -> Array {
    let strides = x.shape().strides();
    let permuted: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    take(x, out, 0.0, |idx| Some(dot(idx, &permuted)))
}

pub fn broadcast(x: &Array, out: &Shape) -> Array {
    let strides = crate::strided::broadcast_strides(x.shape(), out);
    take(x, out, 0.0, |idx| Some(dot(idx, &strides)))
}

pub fn slice(x: &Array, start: &[usize], step: &[usize], out: &Shape) -> Array {
    let strides = x.shape().strides();
    take(x, out, 0.0, |idx| {
        Some(
            idx.iter()
                .enumerate()
                .map(|(k, &i)| (start[k] + i * step[k]) * strides[k])
                .sum(),
        )
    })
}

pub fn flip(x: &Array, axes: &[usize]) -> Array {
    let strides = x.shape().strides();
    let dims = x.shape().dims().to_vec();
    take(x, x.shape(), 0.0, |idx| {
        Some(
            idx.iter()
                .enumerate()
                .map(|(k, &i)| if axes.contains(&k) { dims[k] - 1 - i } else { i } * strides[k])
                .sum(),
        )
    })
}

/// numpy `pad` in `constant`, `edge` and `reflect` (mirror without repeating the edge) modes.
pub fn pad(x: &Array, low: &[usize], mode: PadMode, value: f64, out: &Shape) -> Array {
    let strides = x.shape().strides();
    let dims = x.shape().dims().to_vec();
    take(x, out, value, |idx| {
        let mut offset = 0;
        for (k, &i) in idx.iter().enumerate() {
            let pos = i as isize - low[k] as isize;
            let n = dims[k] as isize;
            let src = if (0..n).contains(&pos) {
                pos
            } else {
                match mode {
                    PadMode::Constant => return None,
                    PadMode::Edge => pos.clamp(0, n - 1),
                    // Inference limits reflect padding to below the dim, so one mirror suffices.
                    PadMode::Reflect => {
                        if pos < 0 {
                            -pos
                        } else {
                            2 * (n - 1) - pos
                        }
                    }
                }
            };
            offset += src as usize * strides[k];
        }
        Some(offset)
    })
}

/// Concatenation along `axis`.
pub fn concat(parts: &[&Array], axis: usize, out: &Shape) -> Array {
    if out.n_elems() == 0 {
        // The block counts below may overflow for an empty result, whose other dims can be as
        // large as `usize` allows.
        return Array::zeros(&TensorType {
            dtype: parts[0].dtype(),
            shape: out.clone(),
        });
    }
    let outer: usize = out.dims()[..axis].iter().product();
    let inner: usize = out.dims()[axis + 1..].iter().product();
    fn join<T: Element>(
        parts: &[&Array],
        outer: usize,
        inner: usize,
        axis: usize,
        n: usize,
    ) -> Storage {
        let mut v: Vec<T> = Vec::with_capacity(n);
        for o in 0..outer {
            for p in parts {
                let block = p.shape().dims()[axis] * inner;
                let s = p.as_slice::<T>().expect("concat operands share a dtype");
                v.extend_from_slice(&s[o * block..(o + 1) * block]);
            }
        }
        T::wrap(v)
    }
    let n = out.n_elems();
    let data = match parts[0].storage() {
        Storage::F32(_) => join::<f32>(parts, outer, inner, axis, n),
        Storage::F64(_) => join::<f64>(parts, outer, inner, axis, n),
        Storage::F16(_) => join::<f16>(parts, outer, inner, axis, n),
        Storage::BF16(_) => join::<bf16>(parts, outer, inner, axis, n),
        Storage::I32(_) => join::<i32>(parts, outer, inner, axis, n),
        Storage::I64(_) => join::<i64>(parts, outer, inner, axis, n),
        Storage::U8(_) => join::<u8>(parts, outer, inner, axis, n),
        Storage::Bool(_) => join::<bool>(parts, outer, inner, axis, n),
    };
    Array::new(out.clone(), data).expect("concat fills its output")
}
