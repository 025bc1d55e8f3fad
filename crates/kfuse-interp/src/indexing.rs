//! Data-dependent indexing: gather, scatter-add, sort and top-k.

use kfuse_ir::{Array, DType, Element, Shape, Storage, TensorType};

use crate::elem::{narrow, widen, with_compute, Elem};
use crate::movement::take;

fn index_values(index: &Array) -> Vec<i64> {
    match index.storage() {
        Storage::I32(v) => v.iter().map(|&i| i as i64).collect(),
        Storage::I64(v) => v.clone(),
        _ => unreachable!("inference admits only i32 and i64 indices"),
    }
}

/// For every element of `index` (row-major), the offset into `target` it addresses along `axis`.
/// Negative indices count from the end, as in numpy.
fn addressed_offsets(target: &Shape, index: &Array, axis: usize) -> Result<Vec<usize>, String> {
    let values = index_values(index);
    let tstrides = target.strides();
    let ishape = index.shape();
    let istrides = ishape.strides();
    let dim = target.dims()[axis] as i64;
    values
        .iter()
        .enumerate()
        .map(|(flat, &raw)| {
            let i = if raw < 0 { raw + dim } else { raw };
            if !(0..dim).contains(&i) {
                return Err(format!(
                    "index {raw} is out of range for axis {axis} of size {dim}"
                ));
            }
            let mut offset = 0;
            for d in 0..ishape.rank() {
                let coord = if d == axis {
                    i as usize
                } else {
                    (flat / istrides[d]) % ishape.dims()[d]
                };
                offset += coord * tstrides[d];
            }
            Ok(offset)
        })
        .collect()
}

/// `out[p] = x[p with p[axis] = index[p]]`.
pub fn gather(x: &Array, index: &Array, axis: usize) -> Result<Array, String> {
    let offsets = addressed_offsets(x.shape(), index, axis)?;
    let mut next = offsets.into_iter();
    Ok(take(x, index.shape(), 0.0, |_| next.next()))
}

/// `out = x; out[p with p[axis] = index[p]] += src[p]`, in row-major order of `src`.
pub fn scatter_add(x: &Array, index: &Array, src: &Array, axis: usize) -> Result<Array, String> {
    let offsets = addressed_offsets(x.shape(), index, axis)?;
    let (wx, ws) = (widen(x), widen(src));
    let sstore = ws.storage();
    let result = with_compute!(wx.storage(), v: T => {
        let s = <T as Element>::slice(sstore).expect("scatter operands share a dtype");
        let mut out = v.clone();
        for (&o, &value) in offsets.iter().zip(s) {
            out[o] = out[o].add(value);
        }
        Array::new(x.shape().clone(), T::wrap(out)).expect("same shape")
    });
    Ok(narrow(result, x.dtype()))
}

/// Stable sort of every lane along `axis` (NaN above every number), keeping the first `k`
/// positions. Returns the values and their i64 source indices.
pub fn sort_lanes(x: &Array, axis: usize, descending: bool, k: usize) -> (Array, Array) {
    let dims = x.shape().dims();
    if x.n_elems() == 0 {
        // Nothing to sort, and the lane counts below may overflow: an empty array's other dims
        // can be as large as `usize` allows.
        let mut out_dims = dims.to_vec();
        out_dims[axis] = k;
        let out = TensorType::new(x.dtype(), out_dims);
        let indices = TensorType::new(DType::I64, out.shape.dims());
        return (Array::zeros(&out), Array::zeros(&indices));
    }
    let outer: usize = dims[..axis].iter().product();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let mut out_dims = dims.to_vec();
    out_dims[axis] = k;
    let out_shape = Shape::new(out_dims);
    let mut sources = vec![0usize; out_shape.n_elems()];
    let mut indices = vec![0i64; out_shape.n_elems()];
    let wide = widen(x);
    with_compute!(wide.storage(), v: T => {
        let mut order: Vec<usize> = Vec::with_capacity(len);
        for o in 0..outer {
            for i in 0..inner {
                let base = o * len * inner + i;
                order.clear();
                order.extend(0..len);
                let at = |j: usize| -> T { v[base + j * inner] };
                if descending {
                    order.sort_by(|&p, &q| at(q).sort_cmp(at(p)));
                } else {
                    order.sort_by(|&p, &q| at(p).sort_cmp(at(q)));
                }
                for (j, &src) in order.iter().take(k).enumerate() {
                    let flat = (o * k + j) * inner + i;
                    sources[flat] = base + src * inner;
                    indices[flat] = src as i64;
                }
            }
        }
    });
    let mut next = sources.into_iter();
    let values = take(x, &out_shape, 0.0, |_| next.next());
    let indices = Array::new(out_shape, Storage::I64(indices)).expect("one index per value");
    (values, indices)
}
