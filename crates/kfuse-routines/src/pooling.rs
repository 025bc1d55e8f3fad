//! Max and average pooling on the kernel pool. Window sums run in the reference interpreter's
//! order (row by row, left to right) and averages divide in f64 as it does, so the results are
//! bit-identical to it: pooling needs no fast-numerics licence.
//!
//! f32 on AVX-512 runs sixteen outputs at a time (`avx512`): NCHW along each output row (a
//! stride-2 window's columns are the even lanes of two loads), NHWC along the channels. A max
//! is separable: each input row's horizontal maxima are computed once and shared by the output
//! rows whose windows cover it, an order of magnitude faster than the scalar loop below on
//! ResNet's stem pool (`docs/structured-ops.md`, "Routines": `pooling::pool2d`). A max reads
//! NaNs through `vrangeps`, which passes over them, so a plane or row with a NaN among its
//! inputs is redone on the scalar loop, which keeps the reference's NaN. Elsewhere, and for
//! f64, every output runs the scalar window loop.

use kfuse_ir::{DType, Layout, Pool2dAttrs, PoolKind, Storage};

use crate::dense::{Out, Real, View};
use crate::Pool;

/// Whether [`pool2d`] handles this dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN (the first one), and `+0` above `-0`.
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

#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::max_plane_strided;

/// One plane of `h × w` values in `x` pooled into `y` (`oh × ow`) as `attrs` says (its layout
/// aside), on the calling thread: bit-identical to [`pool2d`] of that plane (NaNs included).
pub(crate) fn pool_plane(
    attrs: &Pool2dAttrs,
    [h, w]: [usize; 2],
    x: &[f32],
    [oh, ow]: [usize; 2],
    y: &mut [f32],
) {
    let g = Geometry {
        attrs,
        x: [1, 1, h, w],
        y: [1, 1, oh, ow],
    };
    assert!(x.len() >= h * w && y.len() >= oh * ow);
    #[cfg(target_arch = "x86_64")]
    if crate::dense::has_avx512() {
        return avx512::ROWS.with(|rows| {
            let mut rows = rows.borrow_mut();
            rows.resize(h * ow, 0.0);
            avx512::plane(&g, x, &mut rows, y)
        });
    }
    g.plane_by_windows(x, y);
}

fn nchw(dims: &[usize], layout: Layout) -> [usize; 4] {
    match layout {
        Layout::Nchw => [dims[0], dims[1], dims[2], dims[3]],
        Layout::Nhwc => [dims[0], dims[3], dims[1], dims[2]],
    }
}

/// A pooling's shapes, logical NCHW whatever the layout.
#[derive(Clone, Copy)]
struct Geometry<'a> {
    attrs: &'a Pool2dAttrs,
    /// `[n, c, h, w]` of the input.
    x: [usize; 4],
    /// `[n, c, oh, ow]` of the output.
    y: [usize; 4],
}

impl Geometry<'_> {
    /// The input row (`axis` 0) or column (1) that output position `o`'s tap `t` reads, if it is
    /// inside the input.
    fn tap(&self, o: usize, t: usize, axis: usize) -> Option<usize> {
        let a = self.attrs;
        let pad = a.padding[2 * axis];
        let pos = (o * a.stride[axis] + t * a.dilation[axis]).checked_sub(pad)?;
        (pos < self.x[2 + axis]).then_some(pos)
    }

    fn at(&self, d: [usize; 4], n: usize, ch: usize, h: usize, w: usize) -> usize {
        match self.attrs.layout {
            Layout::Nchw => ((n * d[1] + ch) * d[2] + h) * d[3] + w,
            Layout::Nhwc => ((n * d[2] + h) * d[3] + w) * d[1] + ch,
        }
    }

    /// Every output of a one-plane geometry (`[1, 1, h, w]`) from `x` into `y`, by the
    /// reference's window loop: the path that keeps the reference's NaN.
    fn plane_by_windows(&self, x: &[f32], y: &mut [f32]) {
        let [_, _, oh, ow] = self.y;
        for r in 0..oh {
            for o in 0..ow {
                y[r * ow + o] = self.window(x, 0, 0, r, o);
            }
        }
    }

    /// Output `(n, ch, r, o)` as the reference computes it.
    fn window<T: Real>(&self, xs: &[T], n: usize, ch: usize, r: usize, o: usize) -> T {
        let a = self.attrs;
        let [kh, kw] = a.window;
        let (mut acc, mut count) = match a.kind {
            PoolKind::Max => (T::NEG_INFINITY, 0usize),
            PoolKind::Avg => (T::ZERO, 0usize),
        };
        for i in 0..kh {
            let Some(hh) = self.tap(r, i, 0) else {
                continue;
            };
            for j in 0..kw {
                let Some(ww) = self.tap(o, j, 1) else {
                    continue;
                };
                let v = xs[self.at(self.x, n, ch, hh, ww)];
                acc = match a.kind {
                    PoolKind::Max => ieee_max(acc, v),
                    PoolKind::Avg => acc.add(v),
                };
                count += 1;
            }
        }
        match a.kind {
            PoolKind::Max => acc,
            PoolKind::Avg => {
                let divisor = if a.count_include_pad { kh * kw } else { count };
                T::from_f64(acc.to_f64() / divisor as f64)
            }
        }
    }
}

fn run<T: Real>(
    xs: &[T],
    x_dims: &[usize],
    attrs: &Pool2dAttrs,
    out_dims: &[usize],
    ys: &mut [T],
) -> Result<(), String> {
    let g = Geometry {
        attrs,
        x: nchw(x_dims, attrs.layout),
        y: nchw(out_dims, attrs.layout),
    };
    let [n, c, oh, ow] = g.y;
    if ys.len() != n * c * oh * ow {
        return Err(format!("the output holds {} elements", ys.len()));
    }
    if xs.len() != g.x.iter().product::<usize>() {
        return Err(format!("the input holds {} elements", xs.len()));
    }
    if ys.is_empty() {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if crate::dense::has_avx512() {
        if let (Some(xs), Some(ys)) = (T::f32s(xs), T::f32s_mut(ys)) {
            avx512::run(&g, xs, ys);
            return Ok(());
        }
    }
    let dst = Out(ys.as_mut_ptr());
    // One task per image and output row: disjoint outputs in either layout.
    Pool::global().run(n * oh, &|task| {
        let (img, r) = (task / oh, task % oh);
        for ch in 0..c {
            for o in 0..ow {
                let value = g.window(xs, img, ch, r, o);
                // SAFETY: output row r of image img belongs to this task alone.
                unsafe { *dst.ptr().add(g.at(g.y, img, ch, r, o)) = value };
            }
        }
    });
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values with every kind of special among them: NaNs with distinct payloads
    /// (so that which NaN wins shows), signed zeros, infinities and subnormals.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match state % 41 {
                    0 => f32::from_bits(0x7fc0_0000 | (state >> 40) as u32 & 0xffff),
                    1 => -0.0,
                    2 => 0.0,
                    3 => f32::INFINITY,
                    4 => f32::NEG_INFINITY,
                    5 => f32::from_bits(1 + (state >> 50) as u32),
                    6 => -f32::from_bits(1 + (state >> 50) as u32),
                    _ => ((state >> 11) % 2001) as f32 * 0.01 - 10.0,
                }
            })
            .collect()
    }

    /// `(n, c, h, w, window, stride, dilation, padding [t, b, l, r])`.
    type Shape = (
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 4],
    );

    /// Every output of the AVX-512 kernels has the bits of the scalar window loop (the
    /// reference's order and rounding), NaNs included, over both kinds and layouts, windows
    /// from 1×1 to 4×4 and a whole plane, strides 1 to 3 (the even-lane and gather loads),
    /// dilation, asymmetric padding, both divisors, rows shorter and longer than two vectors,
    /// one-pixel and one-row inputs, and channel counts that leave partial vectors; each input
    /// with its NaNs (whose planes the window loop redoes) and without them.
    #[test]
    fn the_vector_kernels_match_the_window_loop_bit_for_bit() {
        if !crate::dense::has_avx512() {
            kfuse_testkit::skip(
                "the_vector_kernels_match_the_window_loop_bit_for_bit",
                kfuse_testkit::Prerequisite::Avx512,
                "this CPU has no AVX-512, so only the scalar loop runs",
            );
            return;
        }
        let shapes: &[Shape] = &[
            (2, 3, 17, 45, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 5, 9, 70, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (1, 2, 12, 100, [2, 2], [2, 2], [1, 1], [0, 0, 0, 0]),
            (1, 17, 8, 33, [3, 2], [1, 2], [2, 1], [1, 0, 1, 1]),
            (2, 4, 11, 40, [4, 4], [3, 3], [1, 1], [2, 1, 2, 2]),
            (1, 3, 7, 9, [7, 9], [1, 1], [1, 1], [0, 0, 0, 0]),
            (1, 20, 1, 1, [1, 1], [1, 1], [1, 1], [0, 0, 0, 0]),
            (1, 3, 1, 64, [1, 3], [1, 3], [1, 1], [0, 0, 1, 1]),
            (3, 1, 5, 31, [3, 3], [2, 2], [2, 2], [2, 2, 2, 2]),
            (1, 33, 6, 6, [2, 3], [2, 1], [1, 1], [1, 1, 1, 1]),
            // ResNet's stem pool (3×3, stride 2, padding 1) on even and odd widths around the
            // vector's and the two vectors' widths, without right padding too.
            (1, 2, 9, 112, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 2, 5, 64, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 2, 5, 65, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 2, 5, 33, [3, 3], [2, 2], [1, 1], [1, 1, 1, 0]),
            (1, 2, 5, 34, [3, 3], [2, 2], [1, 1], [1, 1, 1, 0]),
            (1, 2, 3, 2, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
            (1, 2, 3, 1, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        ];
        let mut checked = 0;
        for (k, &(n, c, h, w, window, stride, dilation, padding)) in shapes.iter().enumerate() {
            for kind in [PoolKind::Max, PoolKind::Avg] {
                for layout in [Layout::Nchw, Layout::Nhwc] {
                    for count_include_pad in [false, true] {
                        let attrs = Pool2dAttrs {
                            kind,
                            layout,
                            window,
                            stride,
                            padding,
                            dilation,
                            count_include_pad,
                        };
                        let extent = |axis: usize| {
                            let size = [h, w][axis] + padding[2 * axis] + padding[2 * axis + 1];
                            (size - (window[axis] - 1) * dilation[axis] - 1) / stride[axis] + 1
                        };
                        let (oh, ow) = (extent(0), extent(1));
                        let g = Geometry {
                            attrs: &attrs,
                            x: [n, c, h, w],
                            y: [n, c, oh, ow],
                        };
                        let with_nans = values(n * c * h * w, k as u64 * 8 + checked);
                        // A plane holding a NaN is redone on the window loop, so the vector
                        // paths are checked on the values without their NaNs too.
                        let finite: Vec<f32> = with_nans
                            .iter()
                            .map(|&v| if v.is_nan() { 0.5 } else { v })
                            .collect();
                        for xs in [&with_nans, &finite] {
                            let mut got = vec![0.0f32; n * c * oh * ow];
                            avx512::run(&g, xs, &mut got);
                            for img in 0..n {
                                for ch in 0..c {
                                    for r in 0..oh {
                                        for o in 0..ow {
                                            let want = g.window(xs, img, ch, r, o);
                                            let at = g.at(g.y, img, ch, r, o);
                                            // A max picks one of its values, NaN payload and
                                            // all; a sum's NaN payload is not fixed by the
                                            // language (the compiler may swap an addition's
                                            // operands), so any NaN matches a NaN there.
                                            let same = got[at].to_bits() == want.to_bits()
                                                || kind == PoolKind::Avg
                                                    && got[at].is_nan()
                                                    && want.is_nan();
                                            assert!(
                                            same,
                                            "shape {k} {kind:?} {layout:?} include {count_include_pad}: \
                                             ({img}, {ch}, {r}, {o}) got {} want {want}",
                                            got[at]
                                        );
                                        }
                                    }
                                }
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, shapes.len() as u64 * 8);
    }
}
