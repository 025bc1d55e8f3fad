//! Direct depthwise kernels: one filter per channel, no GEMM.
//!
//! NCHW: each task copies the input rows its band needs, one channel at a time, into a
//! zero-bordered scratch (so no tap needs a bounds test), and computes every output element in
//! a register, summing its taps with FMA. The common kernel sizes at stride 1 (3×3, 5×5) are
//! unrolled at compile time, so that the loop along the output row vectorizes; other shapes run
//! one vectorized pass per tap. NHWC runs along the channels, which are contiguous.
//!
//! The bodies are compiled twice: for the baseline ISA and, where the CPU has them, for
//! AVX-512 with FMA, chosen at run time.

use super::Geometry;
use crate::dense::{has_avx512, Out, Real};

/// Depthwise output rows `rows` of image `n`: for NCHW, channel `ch`'s rows go to the
/// `rows.len() * ow` elements at `dst + ch * channel_stride`; for NHWC, all of them go to `dst`,
/// `[row][col][channel]`.
///
/// # Safety
/// Those elements must lie in one allocation, and no other thread may access them during the
/// call.
pub(super) unsafe fn band<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: Out<T>,
    channel_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { band_avx512(g, xs, ws, n, rows, dst, channel_stride) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { band_body(g, xs, ws, n, rows, dst, channel_stride) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,fma")]
unsafe fn band_avx512<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: Out<T>,
    channel_stride: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe { band_body(g, xs, ws, n, rows, dst, channel_stride) }
}

#[inline(always)]
unsafe fn band_body<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: Out<T>,
    channel_stride: usize,
) {
    let len = rows.len() * g.y[3];
    match g.layout {
        kfuse_ir::Layout::Nchw => nchw(g, xs, ws, n, rows, &mut |ch| {
            // SAFETY: the caller vouches for these elements; each slice is dropped before the
            // next is made.
            unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(ch * channel_stride), len) }
        }),
        kfuse_ir::Layout::Nhwc => {
            // SAFETY: as above.
            let all = unsafe { std::slice::from_raw_parts_mut(dst.ptr(), len * g.y[1]) };
            nhwc(g, xs, ws, n, rows, all)
        }
    }
}

#[inline(always)]
fn nchw<'a, T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst_of: &mut dyn FnMut(usize) -> &'a mut [T],
) {
    let [_, c, _, ow] = g.y;
    let [_, _, in_h, in_w] = g.x;
    let (kh, kw) = (g.kh, g.kw);
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let out_rows = rows.end - rows.start;
    if out_rows == 0 || ow == 0 {
        return;
    }
    // The scratch holds exactly the padded input the band reads: padded column `o * sw + j * dw`
    // for output column `o` and tap column `j`, padded row `rr * sh + i * dh` for band row `rr`.
    let pw = (ow - 1) * sw + (kw - 1) * dw + 1;
    let ph = (out_rows - 1) * sh + (kh - 1) * dh + 1;
    // Padding sits at the same places for every channel, so zeros written once stay.
    let mut padded = vec![T::ZERO; ph * pw];
    let first_row = (rows.start * sh) as isize - g.pad[0] as isize;
    let left = g.pad[1].min(pw);
    let cols = in_w.min(pw - left);
    let taps = kh * kw;
    for ch in 0..c {
        let plane = &xs[g.x_offset(n, ch, 0, 0)..][..in_h * in_w];
        for t in 0..ph {
            let h = first_row + t as isize;
            if h >= 0 && (h as usize) < in_h {
                let h = h as usize;
                padded[t * pw + left..][..cols].copy_from_slice(&plane[h * in_w..][..cols]);
            }
        }
        let wk = &ws[ch * taps..][..taps];
        let dst = dst_of(ch);
        for rr in 0..out_rows {
            let out = &mut dst[rr * ow..][..ow];
            let base = &padded[rr * sh * pw..];
            match (kh, kw, sw) {
                (3, 3, 1) => row_unrolled::<T, 3, 3>(out, base, pw, wk, dh, dw),
                (5, 5, 1) => row_unrolled::<T, 5, 5>(out, base, pw, wk, dh, dw),
                _ => row_by_tap(out, base, pw, wk, [kh, kw], [dh, dw], sw),
            }
        }
    }
}

/// Outputs computed together in registers: one AVX-512 vector of f32.
const LANES: usize = 16;

/// One output row at stride 1 for a `KH × KW` kernel: each element is summed in a register.
#[inline(always)]
fn row_unrolled<T: Real, const KH: usize, const KW: usize>(
    out: &mut [T],
    base: &[T],
    pw: usize,
    wk: &[T],
    dh: usize,
    dw: usize,
) {
    let ow = out.len();
    let w: [[T; KW]; KH] = std::array::from_fn(|i| std::array::from_fn(|j| wk[i * KW + j]));
    let taps: [[&[T]; KW]; KH] =
        std::array::from_fn(|i| std::array::from_fn(|j| &base[i * dh * pw + j * dw..][..ow]));
    // Blocks of LANES outputs, the last one overlapping its predecessor where LANES does not
    // divide the row (outputs are written, not accumulated, so computing some twice is
    // harmless); rows shorter than LANES go one element at a time.
    if ow < LANES {
        for (o, y) in out.iter_mut().enumerate() {
            let mut s = T::ZERO;
            for i in 0..KH {
                for j in 0..KW {
                    s = w[i][j].mul_add(taps[i][j][o], s);
                }
            }
            *y = s;
        }
        return;
    }
    let mut o0 = 0;
    loop {
        let mut s = [T::ZERO; LANES];
        for i in 0..KH {
            for j in 0..KW {
                let t: &[T; LANES] = taps[i][j][o0..o0 + LANES].try_into().unwrap();
                for l in 0..LANES {
                    s[l] = w[i][j].mul_add(t[l], s[l]);
                }
            }
        }
        out[o0..o0 + LANES].copy_from_slice(&s);
        if o0 + LANES == ow {
            break;
        }
        o0 = (o0 + LANES).min(ow - LANES);
    }
}

/// One output row for any kernel and stride: one pass along the row per tap.
#[inline(always)]
fn row_by_tap<T: Real>(
    out: &mut [T],
    base: &[T],
    pw: usize,
    wk: &[T],
    [kh, kw]: [usize; 2],
    [dh, dw]: [usize; 2],
    sw: usize,
) {
    out.fill(T::ZERO);
    for i in 0..kh {
        for j in 0..kw {
            let weight = wk[i * kw + j];
            let src = &base[i * dh * pw + j * dw..];
            if sw == 1 {
                for (y, x) in out.iter_mut().zip(src) {
                    *y = weight.mul_add(*x, *y);
                }
            } else {
                for (y, x) in out.iter_mut().zip(src.iter().step_by(sw)) {
                    *y = weight.mul_add(*x, *y);
                }
            }
        }
    }
}

/// NHWC: the taps of each output pixel, along the contiguous channels.
#[inline(always)]
fn nhwc<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: &mut [T],
) {
    let [_, c, _, ow] = g.y;
    let taps = g.kh * g.kw;
    // Weights as [tap][channel] so that the inner loop runs along channels.
    let mut wt = vec![T::ZERO; taps * c];
    for ch in 0..c {
        for t in 0..taps {
            wt[t * c + ch] = ws[ch * taps + t];
        }
    }
    for r in rows.clone() {
        for o in 0..ow {
            let acc = &mut dst[((r - rows.start) * ow + o) * c..][..c];
            acc.fill(T::ZERO);
            for i in 0..g.kh {
                let Some(h) = g.tap(0, r, i) else { continue };
                for j in 0..g.kw {
                    let Some(wp) = g.tap(1, o, j) else { continue };
                    let xv = &xs[g.x_offset(n, 0, h, wp)..][..c];
                    let wv = &wt[(i * g.kw + j) * c..][..c];
                    for ((a, x), w) in acc.iter_mut().zip(xv).zip(wv) {
                        *a = w.mul_add(*x, *a);
                    }
                }
            }
        }
    }
}
