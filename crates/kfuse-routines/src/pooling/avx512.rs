use std::arch::x86_64::*;

use super::Geometry;
use crate::dense::Out;
use crate::Pool;
use kfuse_ir::{Layout, PoolKind};

/// Positions `lo..hi` of an output row (or column) whose taps are all inside the input
/// along `axis`; the others are edges.
fn interior(g: &Geometry, axis: usize) -> (usize, usize) {
    let a = g.attrs;
    let (pad, stride) = (a.padding[2 * axis], a.stride[axis]);
    let reach = (a.window[axis] - 1) * a.dilation[axis];
    let (size, out) = (g.x[2 + axis], g.y[2 + axis]);
    let lo = pad.div_ceil(stride).min(out);
    // The last position whose last tap, `o * stride + reach - pad`, is below `size`.
    let hi = if size + pad > reach {
        ((size + pad - reach - 1) / stride + 1).min(out)
    } else {
        0
    };
    (lo, hi.max(lo))
}

/// Lanes `0..lanes` set.
fn mask(lanes: usize) -> __mmask16 {
    ((1u32 << lanes) - 1) as __mmask16
}

/// IEEE `maximum` of every lane but for NaNs: `vrangeps` ranks `-0` below `+0`, and passes
/// over a quiet NaN as IEEE `maxNum` does. So the callers look for NaNs among the values
/// they read (`nans`) and redo a plane or row that holds one on the scalar path, which
/// keeps the reference's NaN.
#[inline(always)]
unsafe fn max16(a: __m512, b: __m512) -> __m512 {
    _mm512_range_ps::<0b0101>(a, b)
}

/// The lanes of `v` that are NaN.
#[inline(always)]
unsafe fn nans(v: __m512) -> __mmask16 {
    _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v)
}

/// Each lane's sum divided by `d` in f64 and rounded to f32, as the reference divides.
#[inline(always)]
unsafe fn average(sum: __m512, d: __m512d) -> __m512 {
    let low = _mm512_div_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(sum)), d);
    let high = _mm512_div_pd(
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(sum),
        ))),
        d,
    );
    _mm512_insertf32x8::<1>(
        _mm512_castps256_ps512(_mm512_cvtpd_ps(low)),
        _mm512_cvtpd_ps(high),
    )
}

/// Lanes `0..lanes` of `v` into `out[at..]`, a whole vector where there are sixteen (masked
/// stores, like masked loads, are slow).
#[inline(always)]
unsafe fn store(out: &mut [f32], at: usize, lanes: usize, v: __m512) {
    debug_assert!(at + lanes <= out.len());
    // SAFETY: lanes below `lanes` of `out[at..]`, inside it.
    unsafe {
        if lanes == 16 {
            _mm512_storeu_ps(out.as_mut_ptr().add(at), v)
        } else {
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask(lanes), v)
        }
    }
}

/// Elements `base + stride * l` of `row` for lanes `l < lanes` (zero elsewhere); every
/// one of them lies inside the row.
#[inline(always)]
unsafe fn strided(row: &[f32], base: usize, stride: usize, lanes: usize) -> __m512 {
    let p = row.as_ptr().wrapping_add(base);
    // Elements readable from `base` on.
    let left = row.len() - base;
    // SAFETY: every lane loaded is below `left` (masked), inside the row.
    unsafe {
        match stride {
            1 if left >= 16 => _mm512_maskz_mov_ps(mask(lanes), _mm512_loadu_ps(p)),
            1 => _mm512_maskz_loadu_ps(mask(lanes.min(left)), p),
            2 if left >= 32 => {
                let evens =
                    _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                _mm512_maskz_permutex2var_ps(
                    mask(lanes),
                    _mm512_loadu_ps(p),
                    evens,
                    _mm512_loadu_ps(p.add(16)),
                )
            }
            2 => {
                let first = _mm512_maskz_loadu_ps(mask(left.min(16)), p);
                let second = if left > 16 {
                    _mm512_maskz_loadu_ps(mask((left - 16).min(16)), p.add(16))
                } else {
                    _mm512_setzero_ps()
                };
                let evens =
                    _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                _mm512_maskz_permutex2var_ps(mask(lanes), first, evens, second)
            }
            _ => {
                let index = _mm512_mullo_epi32(
                    _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                    _mm512_set1_epi32(stride as i32),
                );
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask(lanes), index, p)
            }
        }
    }
}

/// Max pooling of one plane held as `h` rows of `w` values `pitch` apart in `x`, into
/// `out` (`oh × ow`), with `attrs`' window, stride, dilation and padding (its layout
/// aside), on AVX-512 (F and DQ; the caller checks). False where the plane holds a NaN:
/// `out` is then unspecified, and the caller pools the plane with
/// [`super::pool_plane`] on a dense copy, which keeps the reference's NaN.
pub(crate) fn max_plane_strided(
    attrs: &kfuse_ir::Pool2dAttrs,
    [h, w]: [usize; 2],
    x: &[f32],
    pitch: usize,
    [oh, ow]: [usize; 2],
    out: &mut [f32],
) -> bool {
    let g = Geometry {
        attrs,
        x: [1, 1, h, w],
        y: [1, 1, oh, ow],
    };
    debug_assert!(attrs.kind == kfuse_ir::PoolKind::Max && crate::dense::has_avx512());
    assert!(x.len() >= (h - 1) * pitch + w && out.len() >= oh * ow && pitch >= w);
    ROWS.with(|rows| {
        let mut rows = rows.borrow_mut();
        rows.resize(h * ow, 0.0);
        // SAFETY: the caller checked for AVX-512F and DQ.
        !unsafe { max_plane(&g, x, pitch, &mut rows, out) }
    })
}

thread_local! {
    /// Each thread's horizontal maxima for [`max_plane_strided`] and
    /// [`super::pool_plane`].
    pub(super) static ROWS: std::cell::RefCell<Vec<f32>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

pub(super) fn run(g: &Geometry, xs: &[f32], ys: &mut [f32]) {
    match g.attrs.layout {
        Layout::Nchw => nchw(g, xs, ys),
        Layout::Nhwc => nhwc(g, xs, ys),
    }
}

/// NCHW: tasks of whole planes.
fn nchw(g: &Geometry, xs: &[f32], ys: &mut [f32]) {
    let [n, c, h, w] = g.x;
    let [_, _, oh, ow] = g.y;
    let planes = n * c;
    let pool = Pool::global();
    let per_task = planes.div_ceil(8 * pool.threads()).max(1);
    let dst = Out(ys.as_mut_ptr());
    pool.run(planes.div_ceil(per_task), &|t| {
        // Horizontal maxima of every input row (max pooling).
        let mut rows = vec![
            0.0f32;
            if g.attrs.kind == PoolKind::Max {
                h * ow
            } else {
                0
            }
        ];
        let one = Geometry {
            x: [1, 1, h, w],
            y: [1, 1, oh, ow],
            ..*g
        };
        for plane in t * per_task..((t + 1) * per_task).min(planes) {
            let x = &xs[plane * h * w..][..h * w];
            // SAFETY: this task's planes are its own.
            let y =
                unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(plane * oh * ow), oh * ow) };
            super::avx512::plane(&one, x, &mut rows, y);
        }
    });
}

/// One NCHW plane `x` of `g` (`[1, 1, h, w]`) pooled into `y`, `rows` holding the
/// horizontal maxima (`h × ow`, for a max); a plane with a NaN is redone on the scalar
/// window loop, which keeps the reference's NaN (the window's first).
pub(super) fn plane(g: &Geometry, x: &[f32], rows: &mut [f32], y: &mut [f32]) {
    // SAFETY: the CPU has AVX-512F and DQ (the callers check).
    let nan = unsafe {
        match g.attrs.kind {
            PoolKind::Max => max_plane(g, x, g.x[3], rows, y),
            PoolKind::Avg => {
                avg_plane(g, x, y);
                false
            }
        }
    };
    if nan {
        g.plane_by_windows(x, y);
    }
}

/// Max pooling of one plane: each input row's maxima over the window's columns into
/// `rows` (`h × ow`), then each output row's over the window's rows.
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn max_plane(
    g: &Geometry,
    x: &[f32],
    pitch: usize,
    rows: &mut [f32],
    y: &mut [f32],
) -> bool {
    let h = g.x[2];
    let [_, _, oh, ow] = g.y;
    let a = g.attrs;
    let [kh, kw] = a.window;
    let (sw, dw, pl) = (a.stride[1], a.dilation[1], a.padding[2]);
    let (lo, hi) = interior(g, 1);
    // Lanes of the values read that are NaN.
    let mut nan: __mmask16 = 0;
    // ResNet's 3-wide window at stride 2 with one column of padding on the left (and at
    // most one on the right): each row's maxima from its even and odd columns, no tap
    // looked up.
    let three_by_two = kw == 3 && sw == 2 && dw == 1 && pl == 1 && 2 * ow <= g.x[3] + 1;
    for hh in 0..h {
        // The row and the rest of the plane: loads may reach past the row's end (the lanes
        // past it are dropped), so that only the plane's last row masks them.
        let row = &x[hh * pitch..];
        let out = &mut rows[hh * ow..][..ow];
        if three_by_two {
            // SAFETY: forwarded from the caller; the row holds `w` values.
            nan |= unsafe { row_max_3_by_2(&row[..g.x[3]], out) };
            continue;
        }
        for o in (0..lo).chain(hi..ow) {
            let mut acc = f32::NEG_INFINITY;
            for j in 0..kw {
                if let Some(ww) = g.tap(o, j, 1) {
                    acc = super::ieee_max(acc, row[ww]);
                }
            }
            nan |= acc.is_nan() as __mmask16;
            out[o] = acc;
        }
        for o in (lo..hi).step_by(16) {
            let lanes = (hi - o).min(16);
            // SAFETY: interior positions read inside the row.
            unsafe {
                let mut acc = strided(row, o * sw - pl, sw, lanes);
                nan |= nans(acc);
                for j in 1..kw {
                    let v = strided(row, o * sw + j * dw - pl, sw, lanes);
                    nan |= nans(v);
                    acc = max16(acc, v);
                }
                store(out, o, lanes, acc);
            }
        }
    }
    let mut taps = Vec::with_capacity(kh);
    for r in 0..oh {
        let out = &mut y[r * ow..][..ow];
        taps.clear();
        taps.extend((0..kh).filter_map(|i| g.tap(r, i, 0)));
        let Some((&first, rest)) = taps.split_first() else {
            out.fill(f32::NEG_INFINITY);
            continue;
        };
        for o in (0..ow).step_by(16) {
            let lanes = (ow - o).min(16);
            // Rows of horizontal maxima from `at` on: whole vectors but in the last row's
            // tail (masked loads are slow).
            let load = |at: usize| {
                // SAFETY: lanes below `ow` of a row of `rows`.
                unsafe {
                    if rows.len() - at >= 16 {
                        _mm512_loadu_ps(rows.as_ptr().add(at))
                    } else {
                        _mm512_maskz_loadu_ps(mask(lanes), rows.as_ptr().add(at))
                    }
                }
            };
            let mut acc = load(first * ow + o);
            for &hh in rest {
                // SAFETY: as above.
                acc = unsafe { max16(acc, load(hh * ow + o)) };
            }
            // SAFETY: lanes below `ow` of the output row.
            unsafe {
                if lanes == 16 {
                    _mm512_storeu_ps(out.as_mut_ptr().add(o), acc)
                } else {
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(o), mask(lanes), acc)
                }
            }
        }
    }
    nan != 0
}

/// The maxima of `row`'s windows of three columns at stride 2, the first window's left
/// column in the padding (as are any columns past the row's end): output `o` is the
/// largest of columns `2o - 1`, `2o` and `2o + 1`, that is of odd column `o - 1`, even
/// column `o` and odd column `o`. Each 32 columns are read as two whole vectors, split into
/// their even and odd lanes, and the odd ones shifted by a lane for `o - 1`: two loads, two
/// permutes, a shift and two maxima per 16 outputs, where the general path takes three
/// gathered loads and a scalar loop over the padded edge. The lanes of the values read
/// that are NaN are returned (the outputs are then unspecified).
///
/// It brings ResNet's stem pool to the memory's pace (`docs/benchmarks.md`, "ResNet's stem";
/// the general path's figures in `docs/structured-ops.md`, "Measurements behind design
/// choices").
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn row_max_3_by_2(row: &[f32], out: &mut [f32]) -> __mmask16 {
    let w = row.len();
    let evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    let pad = _mm512_set1_ps(f32::NEG_INFINITY);
    // Columns `at..at + 16`, the padding's -inf past the row's end.
    let load = |at: usize| {
        // SAFETY: only lanes inside the row are read.
        unsafe {
            if at + 16 <= w {
                _mm512_loadu_ps(row.as_ptr().add(at))
            } else if at < w {
                _mm512_mask_loadu_ps(pad, mask(w - at), row.as_ptr().add(at))
            } else {
                pad
            }
        }
    };
    let mut nan: __mmask16 = 0;
    // Odd column `o0 - 1` in lane 15, -inf (the left padding) before the first block.
    let mut previous = pad;
    for o0 in (0..out.len()).step_by(16) {
        let (a, b) = (load(2 * o0), load(2 * o0 + 16));
        nan |= nans(a) | nans(b);
        let even = _mm512_permutex2var_ps(a, evens, b);
        let odd = _mm512_permutex2var_ps(a, odds, b);
        let before = _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(
            _mm512_castps_si512(odd),
            _mm512_castps_si512(previous),
        ));
        let lanes = (out.len() - o0).min(16);
        // SAFETY: lanes below `lanes` of `out[o0..]`.
        unsafe { store(out, o0, lanes, max16(max16(before, even), odd)) };
        previous = odd;
    }
    nan
}

/// Average pooling of one plane: each interior output sums its window's taps in the
/// reference's order, sixteen outputs of a row at a time, and divides in f64.
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn avg_plane(g: &Geometry, x: &[f32], y: &mut [f32]) {
    let [_, _, _, w] = g.x;
    let [_, _, oh, ow] = g.y;
    let a = g.attrs;
    let [kh, kw] = a.window;
    let (sw, dw, pl) = (a.stride[1], a.dilation[1], a.padding[2]);
    let (lo, hi) = interior(g, 1);
    let mut taps = Vec::with_capacity(kh);
    for r in 0..oh {
        taps.clear();
        taps.extend((0..kh).filter_map(|i| g.tap(r, i, 0)));
        let divisor = if a.count_include_pad {
            kh * kw
        } else {
            taps.len() * kw
        };
        let out = &mut y[r * ow..][..ow];
        for o in (0..lo).chain(hi..ow) {
            out[o] = window_of(g, x, r, o);
        }
        let d = _mm512_set1_pd(divisor as f64);
        for o in (lo..hi).step_by(16) {
            let lanes = (hi - o).min(16);
            // SAFETY: interior positions read inside their rows.
            unsafe {
                let mut acc = _mm512_setzero_ps();
                for &hh in &taps {
                    let row = &x[hh * w..];
                    for j in 0..kw {
                        acc = _mm512_add_ps(acc, strided(row, o * sw + j * dw - pl, sw, lanes));
                    }
                }
                let value = average(acc, d);
                store(out, o, lanes, value);
            }
        }
    }
}

/// Output `(r, o)` of one NCHW plane `x`, as the reference computes it.
fn window_of(g: &Geometry, x: &[f32], r: usize, o: usize) -> f32 {
    let [_, _, h, w] = g.x;
    let one = Geometry {
        x: [1, 1, h, w],
        y: [1, 1, g.y[2], g.y[3]],
        ..*g
    };
    one.window(x, 0, 0, r, o)
}

/// NHWC: one task per image and output row, sixteen channels at a time.
fn nhwc(g: &Geometry, xs: &[f32], ys: &mut [f32]) {
    let [n, c, _, _] = g.x;
    let [_, _, oh, ow] = g.y;
    let dst = Out(ys.as_mut_ptr());
    Pool::global().run(n * oh, &|t| {
        let (img, r) = (t / oh, t % oh);
        // SAFETY: output row r of image img is this task's.
        let y = unsafe {
            std::slice::from_raw_parts_mut(dst.ptr().add(g.at(g.y, img, 0, r, 0)), ow * c)
        };
        // SAFETY: the CPU has AVX-512F and DQ (the caller checked).
        if unsafe { nhwc_row(g, xs, img, r, y) } {
            for o in 0..ow {
                for ch in 0..c {
                    y[o * c + ch] = g.window(xs, img, ch, r, o);
                }
            }
        }
    });
}

#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn nhwc_row(g: &Geometry, xs: &[f32], img: usize, r: usize, y: &mut [f32]) -> bool {
    let [_, c, _, _] = g.x;
    let [_, _, _, ow] = g.y;
    let a = g.attrs;
    let [kh, kw] = a.window;
    let rows: Vec<usize> = (0..kh).filter_map(|i| g.tap(r, i, 0)).collect();
    let mut taps = Vec::with_capacity(kh * kw);
    // Lanes of the values read that are NaN (max pooling).
    let mut nan: __mmask16 = 0;
    for o in 0..ow {
        taps.clear();
        for &hh in &rows {
            taps.extend(
                (0..kw)
                    .filter_map(|j| g.tap(o, j, 1))
                    .map(|ww| g.at(g.x, img, 0, hh, ww)),
            );
        }
        let out = &mut y[o * c..][..c];
        let divisor = if a.count_include_pad {
            kh * kw
        } else {
            taps.len()
        };
        let d = _mm512_set1_pd(divisor as f64);
        for ch in (0..c).step_by(16) {
            let lanes = (c - ch).min(16);
            let m = mask(lanes);
            // Channels `ch..` of the pixel at `at`: a whole vector but for the tail.
            let load = |at: usize| {
                // SAFETY: lanes below `c` of a pixel inside the input.
                unsafe {
                    if lanes == 16 {
                        _mm512_loadu_ps(xs.as_ptr().add(at + ch))
                    } else {
                        _mm512_maskz_loadu_ps(m, xs.as_ptr().add(at + ch))
                    }
                }
            };
            // SAFETY: lanes below `c` of pixels inside the input and of the output pixel.
            unsafe {
                let value = match a.kind {
                    PoolKind::Max => {
                        let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
                        for (k, &at) in taps.iter().enumerate() {
                            let v = load(at);
                            nan |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, v, v);
                            acc = if k == 0 { v } else { max16(acc, v) };
                        }
                        acc
                    }
                    PoolKind::Avg => {
                        let mut acc = _mm512_setzero_ps();
                        for &at in &taps {
                            acc = _mm512_add_ps(acc, load(at));
                        }
                        average(acc, d)
                    }
                };
                store(out, ch, lanes, value);
            }
        }
    }
    nan != 0
}
