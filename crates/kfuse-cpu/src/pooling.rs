//! Max, average and global-average pooling on the kernel pool. Window sums run in the reference
//! interpreter's order (row by row, left to right) and averages divide in f64 as it does, so the
//! results are bit-identical to it: pooling needs no fast-numerics licence.

use kfuse_ir::{DType, Layout, Pool2dAttrs, PoolKind, Storage};

use crate::dense::{Out, Real, View};
use crate::Pool;

/// Whether [`pool2d`] handles this dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and `+0` above `-0`.
fn ieee_max<T: Real>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a > b || (a == b && !a.is_negative_zero()) {
        a
    } else {
        b
    }
}

/// Pools `x` into `out` (dims `out_dims`, overwritten).
pub fn pool2d(
    x: View,
    attrs: &Pool2dAttrs,
    out_dims: &[usize],
    out: &mut Storage,
) -> Result<(), String> {
    match (x.storage, out) {
        (Storage::F32(xs), Storage::F32(ys)) => run(xs, x.dims, attrs, out_dims, ys),
        (Storage::F64(xs), Storage::F64(ys)) => run(xs, x.dims, attrs, out_dims, ys),
        _ => Err(format!(
            "fast pool2d supports f32 and f64, not {}",
            x.storage.dtype()
        )),
    }
}

fn nchw(dims: &[usize], layout: Layout) -> [usize; 4] {
    match layout {
        Layout::Nchw => [dims[0], dims[1], dims[2], dims[3]],
        Layout::Nhwc => [dims[0], dims[3], dims[1], dims[2]],
    }
}

fn run<T: Real>(
    xs: &[T],
    x_dims: &[usize],
    attrs: &Pool2dAttrs,
    out_dims: &[usize],
    ys: &mut [T],
) -> Result<(), String> {
    let [n, c, h, w] = nchw(x_dims, attrs.layout);
    let [_, _, oh, ow] = nchw(out_dims, attrs.layout);
    if ys.len() != n * c * oh * ow {
        return Err(format!("the output holds {} elements", ys.len()));
    }
    if ys.is_empty() {
        return Ok(());
    }
    let [kh, kw] = attrs.window;
    let tap = |o: usize, t: usize, axis: usize, size: usize| -> Option<usize> {
        let pad = attrs.padding[2 * axis];
        let pos = (o * attrs.stride[axis] + t * attrs.dilation[axis]).checked_sub(pad)?;
        (pos < size).then_some(pos)
    };
    let layout = attrs.layout;
    let at = move |n: usize, ch: usize, hh: usize, ww: usize, d: [usize; 4]| match layout {
        Layout::Nchw => ((n * d[1] + ch) * d[2] + hh) * d[3] + ww,
        Layout::Nhwc => ((n * d[2] + hh) * d[3] + ww) * d[1] + ch,
    };
    let (xd, yd) = ([n, c, h, w], [n, c, oh, ow]);
    let dst = Out(ys.as_mut_ptr());
    // One task per image and output row: disjoint outputs in either layout.
    Pool::global().run(n * oh, &|task| {
        let (img, r) = (task / oh, task % oh);
        for ch in 0..c {
            for o in 0..ow {
                let (mut acc, mut count) = match attrs.kind {
                    PoolKind::Max => (T::NEG_INFINITY, 0usize),
                    PoolKind::Avg => (T::ZERO, 0usize),
                };
                for i in 0..kh {
                    let Some(hh) = tap(r, i, 0, h) else { continue };
                    for j in 0..kw {
                        let Some(ww) = tap(o, j, 1, w) else { continue };
                        let v = xs[at(img, ch, hh, ww, xd)];
                        acc = match attrs.kind {
                            PoolKind::Max => ieee_max(acc, v),
                            PoolKind::Avg => acc.add(v),
                        };
                        count += 1;
                    }
                }
                let value = match attrs.kind {
                    PoolKind::Max => acc,
                    PoolKind::Avg => {
                        let divisor = if attrs.count_include_pad {
                            kh * kw
                        } else {
                            count
                        };
                        T::from_f64(acc.to_f64() / divisor as f64)
                    }
                };
                // SAFETY: output row r of image img belongs to this task alone.
                unsafe { *dst.ptr().add(at(img, ch, r, o, yd)) = value };
            }
        }
    });
    Ok(())
}
