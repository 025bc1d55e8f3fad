//! Structured ops: batched matmul, 2-D convolution and pooling, by direct loops.
//!
//! Accumulation order: matmul sums `k = 0, 1, ..., K-1` into one accumulator starting at 0;
//! conv2d sums over `(c_in, kh, kw)` in row-major order; average pooling sums the window in
//! row-major order and divides by the count in f64, rounding once.

use kfuse_ir::infer::nchw_dims;
use kfuse_ir::{Array, Conv2dAttrs, Element, Layout, Pool2dAttrs, PoolKind, Shape, TensorType};

use crate::elem::{narrow, widen, with_compute, Elem};
use crate::strided::{broadcast_strides, for_each_offset};

fn wrap<T: Element>(shape: &Shape, v: Vec<T>) -> Array {
    Array::new(shape.clone(), T::wrap(v)).expect("result fills its shape")
}

/// `[..., M, K] @ [..., K, N]` with broadcast batch dims.
pub fn matmul(a: &Array, b: &Array, out: &TensorType) -> Array {
    if out.shape.n_elems() == 0 {
        // The operand offsets below may overflow when the result is empty: K, or a batch dim,
        // can then be as large as `usize` allows.
        return Array::zeros(out);
    }
    let (wa, wb) = (widen(a), widen(b));
    let (ra, rb) = (a.shape().rank(), b.shape().rank());
    let (m, k) = (a.shape().dims()[ra - 2], a.shape().dims()[ra - 1]);
    let n = b.shape().dims()[rb - 1];
    let rank = out.shape.rank();
    let batch = Shape::new(out.shape.dims()[..rank - 2].to_vec());
    let batch_a = broadcast_strides(&Shape::new(a.shape().dims()[..ra - 2].to_vec()), &batch);
    let batch_b = broadcast_strides(&Shape::new(b.shape().dims()[..rb - 2].to_vec()), &batch);
    let bstore = wb.storage();
    let result = with_compute!(wa.storage(), x: T => {
        let y = <T as Element>::slice(bstore).expect("matmul operands share a dtype");
        let mut c = vec![T::from_i64(0); out.shape.n_elems()];
        for_each_offset(&batch, [&batch_a, &batch_b], |bi, [oa, ob]| {
            let (a0, b0, c0) = (oa * m * k, ob * k * n, bi * m * n);
            for i in 0..m {
                let row = &mut c[c0 + i * n..c0 + (i + 1) * n];
                for kk in 0..k {
                    let av = x[a0 + i * k + kk];
                    let brow = &y[b0 + kk * n..b0 + (kk + 1) * n];
                    for (cv, &bv) in row.iter_mut().zip(brow) {
                        *cv = cv.add(av.mul(bv));
                    }
                }
            }
        });
        wrap(&out.shape, c)
    });
    narrow(result, a.dtype())
}

/// Offset of `(n, c, h, w)` in a rank-4 tensor of the given layout and NCHW dims.
fn offset(layout: Layout, dims: [usize; 4], n: usize, c: usize, h: usize, w: usize) -> usize {
    let [_, cs, hs, ws] = dims;
    match layout {
        Layout::Nchw => ((n * cs + c) * hs + h) * ws + w,
        Layout::Nhwc => ((n * hs + h) * ws + w) * cs + c,
    }
}

/// Input row (or column) read by output position `o` at kernel tap `t`, if inside the input.
fn tap(
    o: usize,
    t: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    size: usize,
) -> Option<usize> {
    let pos = (o * stride + t * dilation).checked_sub(pad)?;
    (pos < size).then_some(pos)
}

/// Grouped, strided, dilated, zero-padded 2-D convolution.
pub fn conv2d(x: &Array, w: &Array, attrs: &Conv2dAttrs, out: &TensorType) -> Array {
    let (wx, ww) = (widen(x), widen(w));
    let xd = nchw_dims(x.shape(), attrs.layout);
    let od = nchw_dims(&out.shape, attrs.layout);
    let [_, c_in_per_group, kh, kw] = [
        w.shape().dims()[0],
        w.shape().dims()[1],
        w.shape().dims()[2],
        w.shape().dims()[3],
    ];
    let c_out_per_group = od[1] / attrs.groups;
    let wstore = ww.storage();
    let result = with_compute!(wx.storage(), xv: T => {
        let wv = <T as Element>::slice(wstore).expect("conv operands share a dtype");
        let mut y = vec![T::from_i64(0); out.shape.n_elems()];
        for n in 0..od[0] {
            for oc in 0..od[1] {
                let g = oc / c_out_per_group;
                for oh in 0..od[2] {
                    for ow in 0..od[3] {
                        let mut acc = T::from_i64(0);
                        for ic in 0..c_in_per_group {
                            let c = g * c_in_per_group + ic;
                            for i in 0..kh {
                                let Some(h) = tap(oh, i, attrs.stride[0], attrs.dilation[0], attrs.padding[0], xd[2]) else { continue };
                                for j in 0..kw {
                                    let Some(wp) = tap(ow, j, attrs.stride[1], attrs.dilation[1], attrs.padding[2], xd[3]) else { continue };
                                    let xval = xv[offset(attrs.layout, xd, n, c, h, wp)];
                                    let wval = wv[((oc * c_in_per_group + ic) * kh + i) * kw + j];
                                    acc = acc.add(xval.mul(wval));
                                }
                            }
                        }
                        y[offset(attrs.layout, od, n, oc, oh, ow)] = acc;
                    }
                }
            }
        }
        wrap(&out.shape, y)
    });
    narrow(result, x.dtype())
}

/// Max or average pooling over 2-D windows.
pub fn pool2d(x: &Array, attrs: &Pool2dAttrs, out: &TensorType) -> Array {
    let wx = widen(x);
    let xd = nchw_dims(x.shape(), attrs.layout);
    let od = nchw_dims(&out.shape, attrs.layout);
    let [kh, kw] = attrs.window;
    let result = with_compute!(wx.storage(), xv: T => {
        let mut y = vec![T::from_i64(0); out.shape.n_elems()];
        for n in 0..od[0] {
            for c in 0..od[1] {
                for oh in 0..od[2] {
                    for ow in 0..od[3] {
                        let (mut acc, mut count) = (match attrs.kind { PoolKind::Max => T::lowest(), PoolKind::Avg => T::from_i64(0) }, 0usize);
                        for i in 0..kh {
                            let Some(h) = tap(oh, i, attrs.stride[0], attrs.dilation[0], attrs.padding[0], xd[2]) else { continue };
                            for j in 0..kw {
                                let Some(wp) = tap(ow, j, attrs.stride[1], attrs.dilation[1], attrs.padding[2], xd[3]) else { continue };
                                let v = xv[offset(attrs.layout, xd, n, c, h, wp)];
                                acc = match attrs.kind { PoolKind::Max => acc.ieee_max(v), PoolKind::Avg => acc.add(v) };
                                count += 1;
                            }
                        }
                        let value = match attrs.kind {
                            PoolKind::Max => acc,
                            PoolKind::Avg => {
                                let divisor = if attrs.count_include_pad { kh * kw } else { count };
                                T::from_f64(acc.to_f64() / divisor as f64)
                            }
                        };
                        y[offset(attrs.layout, od, n, c, oh, ow)] = value;
                    }
                }
            }
        }
        wrap(&out.shape, y)
    });
    narrow(result, x.dtype())
}
