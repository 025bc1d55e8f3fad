//! Direct depthwise kernels: one filter per channel, no GEMM.
//!
//! NCHW f32 with 3×3 or 5×5 filters at stride 1 or 2 without dilation (MobileNet's and
//! W6a's shapes), on AVX-512: the input is read in place through lane masks, four output rows
//! at a time, the next channel's rows prefetched (see `in_place`). From memory it runs about
//! twice as fast as the bordered copy below, and several times as fast at stride 2, where the
//! copy takes one pass per tap (`docs/structured-ops.md`, "Routines": depthwise convolutions).
//!
//! Other NCHW shapes: each task copies the input rows its band needs, one channel at a time,
//! into a zero-bordered scratch (so no tap needs a bounds test), and computes every output
//! element in a register, summing its taps with FMA. 3×3 and 5×5 at stride 1 are unrolled at
//! compile time, so that the loop along the output row vectorizes; other shapes run one
//! vectorized pass per tap. NHWC runs along the channels, which are contiguous: on AVX-512 in
//! explicit 16-channel vectors, four pixels at a time, the input two blocks ahead prefetched
//! (see `nhwc_avx512`); elsewhere in the portable loop it agrees with bit for bit.
//!
//! Both NCHW kernels sum each output's taps in the same order (row-major, from zero), so they
//! agree bit for bit. The copying bodies are compiled twice: for the baseline ISA and, where
//! the CPU has them, for AVX-512 with FMA, chosen at run time.

use super::{Geometry, Post};
use crate::dense::{has_avx512, Out, Real};
use crate::epilogue::epilogue;

/// Depthwise output rows `rows` of image `n`: for NCHW, channel `ch`'s rows go to the
/// `rows.len() * ow` elements at `dst + ch * channel_stride`; for NHWC, all of them go to `dst`,
/// `[row][col][channel]`. Then `post`'s per-channel bias and activation (it has no residual),
/// applied to each channel's rows as soon as they are computed (NCHW; in registers where the
/// in-place kernel runs and the activation is ReLU or a clamp), or to the band (NHWC).
///
/// # Safety
/// Those elements must lie in one allocation, and no other thread may access them during the
/// call.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn band<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: Out<T>,
    channel_stride: usize,
    post: Post<T>,
) {
    assert!(
        post.residual.is_none(),
        "a depthwise band takes no residual"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        if let (Some(xs), Some(ws), Some(post)) = (T::f32s(xs), T::f32s(ws), super::f32_post(post))
        {
            if in_place::applies(g) {
                // SAFETY: `T` is f32 (its slices convert), the CPU has AVX-512 and `in_place`
                // applies; the caller vouches for the destination.
                return unsafe {
                    in_place::band(g, xs, ws, n, rows, dst.ptr().cast(), channel_stride, post)
                };
            }
            if g.layout == kfuse_ir::Layout::Nhwc {
                // SAFETY: as above.
                return unsafe { nhwc_avx512::band(g, xs, ws, n, rows, dst.ptr().cast(), post) };
            }
        }
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { band_avx512(g, xs, ws, n, rows, dst, channel_stride, post) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { band_body(g, xs, ws, n, rows, dst, channel_stride, post) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn band_avx512<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: Out<T>,
    channel_stride: usize,
    post: Post<T>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { band_body(g, xs, ws, n, rows, dst, channel_stride, post) }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn band_body<T: Real>(
    g: &Geometry,
    xs: &[T],
    ws: &[T],
    n: usize,
    rows: std::ops::Range<usize>,
    dst: Out<T>,
    channel_stride: usize,
    post: Post<T>,
) {
    let len = rows.len() * g.y[3];
    match g.layout {
        kfuse_ir::Layout::Nchw => nchw(g, xs, ws, n, rows, post, &mut |ch| {
            // SAFETY: the caller vouches for these elements; each slice is dropped before the
            // next is made.
            unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(ch * channel_stride), len) }
        }),
        kfuse_ir::Layout::Nhwc => {
            // SAFETY: as above.
            let all = unsafe { std::slice::from_raw_parts_mut(dst.ptr(), len * g.y[1]) };
            nhwc(g, xs, ws, n, rows.clone(), all);
            if !post.is_empty() {
                let c = g.y[1];
                for pixel in all.chunks_mut(c) {
                    epilogue(pixel, post.pixel(0..c, 0));
                }
            }
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
    post: Post<T>,
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
        if !post.is_empty() {
            let len = dst.len();
            epilogue(dst, post.channel(ch, 0, len));
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

/// The f32 NCHW kernel for 3×3 and 5×5 filters at stride 1 or 2 (the same along both axes)
/// without dilation, on AVX-512: it reads the input in place, with no bordered copy. Each
/// 16-column block of output loads an input row's vector for a tap column once, through a
/// mask that keeps the lanes whose column is inside the image (the rest count as zero and are
/// not read), and adds it to the sums of every output row of the `ROWS` in flight that this
/// input row reaches. At stride 2 a tap's vector is the even lanes of two consecutive loads.
/// Blocks clear of both borders load without masks. Rows above and below the image read a row
/// of zeros. With "same" padding at stride 1 (left padding half the filter, the common case),
/// a block instead loads the three whole vectors around it from each input row and shifts
/// each tap's vector out of two of them in registers (`valignd`): the loads no longer cross
/// cache lines, the edge blocks mask three loads per row instead of one per tap, and the sums
/// are the same bits (the taps are summed in the same order).
///
/// Four rows at a time, because eight spill their row pointers and weights; the variants
/// tried are in `docs/benchmarks.md` ("W6a: the depthwise-separable block", tried, not kept)
/// and `docs/structured-ops.md` ("Measurements behind design choices"). Splitting each row's
/// sum into odd and even taps (twice the FMA chains) would be faster but changes the order of
/// the sums, so it is left out: the kernel keeps matching the bordered copy (and the
/// reference) bit for bit.
#[cfg(target_arch = "x86_64")]
mod in_place {
    use std::arch::x86_64::*;

    use super::super::shifted::prefetch;
    use super::{Geometry, Post};
    use crate::epilogue::{epilogue, RowBias, Tail};
    use crate::simd::InRegisters;

    /// Output rows summed together: their sums are independent FMA chains, and each input
    /// vector loaded feeds every one of them its row reaches.
    const ROWS: usize = 4;
    // `band_k` instantiates its steps for 1, 2 and 3 rows and for `ROWS`, and sends every
    // other count to the last: that is exact only while `ROWS` is 4 (a larger `ROWS` would run
    // a step of `ROWS` rows over fewer).
    const _: () = assert!(ROWS == 4, "band_k's steps cover 1 to 4 rows");
    /// The most input rows one step reads: `(ROWS - 1) * stride + KH`, for the largest
    /// filter at stride 2.
    const MAX_IN: usize = (ROWS - 1) * 2 + 5;

    /// Whether this kernel handles `g` (NCHW, 3×3 or 5×5, stride 1 or 2, no dilation).
    pub(super) fn applies(g: &Geometry) -> bool {
        g.layout == kfuse_ir::Layout::Nchw
            && matches!((g.kh, g.kw), (3, 3) | (5, 5))
            && matches!(g.stride, [1, 1] | [2, 2])
            && g.dilation == [1, 1]
    }

    /// One block of 16 output columns from `x0`: the lanes stored, and per tap column `j` the
    /// lanes of its (at stride 2, two) loads whose input column lies inside the row: lane `l`
    /// of load `h` reads column `S * x0 + j - pad_left + 16 * h + l`.
    struct Block<const KW: usize> {
        x0: usize,
        store: __mmask16,
        taps: [[__mmask16; 2]; KW],
        /// For a "same" row (stride 1, left padding `KW / 2`): the lanes of the vectors at
        /// columns `x0 - 16`, `x0` and `x0 + 16` that lie inside the row.
        vectors: [__mmask16; 3],
    }

    /// A row's blocks: those that need masks (at either end of the row), and the `x0` range of
    /// those in between, which read and store whole vectors (empty if none do).
    struct Blocks<const KW: usize> {
        edges: Vec<Block<KW>>,
        interior: std::ops::Range<usize>,
    }

    /// Splits a row's `blocks` (in order along it) into [`Blocks`].
    fn split_blocks<const KW: usize, const S: usize>(
        blocks: Vec<Block<KW>>,
        same: bool,
    ) -> Blocks<KW> {
        let all = u16::MAX;
        let whole = |b: &Block<KW>| {
            b.store == all
                && if same {
                    b.vectors == [all; 3]
                } else {
                    b.taps
                        .iter()
                        .all(|t| t[0] == all && (S == 1 || t[1] == all))
                }
        };
        let Some(first) = blocks.iter().position(whole) else {
            return Blocks {
                edges: blocks,
                interior: 0..0,
            };
        };
        let count = blocks[first..].iter().take_while(|b| whole(b)).count();
        let interior = blocks[first].x0..blocks[first + count - 1].x0 + 16;
        let mut edges = blocks;
        edges.drain(first..first + count);
        Blocks { edges, interior }
    }

    fn blocks<const KW: usize, const S: usize>(g: &Geometry) -> Vec<Block<KW>> {
        let (ow, in_w, pl) = (g.y[3], g.x[3] as isize, g.pad[1] as isize);
        (0..ow)
            .step_by(16)
            .map(|x0| {
                let lanes = (ow - x0).min(16);
                // The input columns a load must cover: those of the block's stored lanes.
                let needed = |j: usize, h: usize, l: usize| {
                    let k = 16 * h + l;
                    if S == 1 {
                        h == 0 && l < lanes
                    } else {
                        // Lanes 2l and 2l + 1 for output lane l (the odd one is loaded
                        // only to let a whole block load without a mask).
                        k / 2 < lanes
                    }
                    .then_some(((S * x0) as isize) + j as isize - pl + k as isize)
                };
                let inside = |from: isize| {
                    (0..16).fold(0u16, |m, l| {
                        m | (u16::from((0..in_w).contains(&(from + l as isize))) << l)
                    })
                };
                let x = x0 as isize;
                Block {
                    x0,
                    store: (0..lanes).fold(0u16, |m, l| m | (1 << l)),
                    vectors: [inside(x - 16), inside(x), inside(x + 16)],
                    taps: std::array::from_fn(|j| {
                        std::array::from_fn(|h| {
                            (0..16).fold(0u16, |m, l| {
                                let inside =
                                    needed(j, h, l).is_some_and(|c| (0..in_w).contains(&c));
                                m | (u16::from(inside) << l)
                            })
                        })
                    }),
                }
            })
            .collect()
    }

    /// Depthwise output rows `rows` of image `n`, channel `ch` to `dst + ch * channel_stride`,
    /// `rows.len() * ow` elements each, with `post`'s bias and activation.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and DQ, [`applies`] must hold, and the destination elements
    /// must lie in one allocation and be this thread's alone.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn band(
        g: &Geometry,
        xs: &[f32],
        ws: &[f32],
        n: usize,
        rows: std::ops::Range<usize>,
        dst: *mut f32,
        channel_stride: usize,
        post: Post<f32>,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match (g.kh, g.stride[0]) {
                (3, 1) => band_k::<3, 3, 1>(g, xs, ws, n, rows, dst, channel_stride, post),
                (3, _) => band_k::<3, 3, 2>(g, xs, ws, n, rows, dst, channel_stride, post),
                (_, 1) => band_k::<5, 5, 1>(g, xs, ws, n, rows, dst, channel_stride, post),
                _ => band_k::<5, 5, 2>(g, xs, ws, n, rows, dst, channel_stride, post),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn band_k<const KH: usize, const KW: usize, const S: usize>(
        g: &Geometry,
        xs: &[f32],
        ws: &[f32],
        n: usize,
        rows: std::ops::Range<usize>,
        dst: *mut f32,
        channel_stride: usize,
        post: Post<f32>,
    ) {
        let [_, c, _, ow] = g.y;
        let [_, _, in_h, in_w] = g.x;
        let (pt, pl) = (g.pad[0] as isize, g.pad[1]);
        assert!(xs.len() >= g.x.iter().product() && ws.len() >= c * KH * KW);
        let same = S == 1 && pl == KW / 2;
        let blocks = split_blocks::<KW, S>(blocks::<KW, S>(g), same);
        let act = InRegisters::of(post.act);
        // A zero row as wide as the widest load reaches: every lane a mask keeps lies in it.
        let zeros = vec![0.0f32; in_w];
        for ch in 0..c {
            let plane = &xs[g.x_offset(n, ch, 0, 0)..][..in_h * in_w];
            let w: [[__m512; KW]; KH] = std::array::from_fn(|i| {
                std::array::from_fn(|j| _mm512_set1_ps(ws[(ch * KH + i) * KW + j]))
            });
            let bias = post.bias.map(|b| b[ch]);
            let finish = Finish {
                bias: _mm512_set1_ps(bias.unwrap_or(0.0)),
                add: bias.is_some(),
                act,
            };
            // Input row `h`, shifted so that output column x, tap column j reads element
            // `S * x + j` of it (lanes outside the row are masked off, never read).
            let row = |h: isize| {
                let start = if (0..in_h as isize).contains(&h) {
                    plane[h as usize * in_w..].as_ptr()
                } else {
                    zeros.as_ptr()
                };
                start.wrapping_sub(pl)
            };
            let mut r = rows.start;
            while r < rows.end {
                let first = (r * S) as isize - pt;
                let out = dst.wrapping_add(ch * channel_stride + (r - rows.start) * ow);
                let left = rows.end - r;
                let together = left.min(ROWS);
                // The rows this step reads; the others are never looked at.
                let mut input = [std::ptr::null::<f32>(); MAX_IN];
                for (k, p) in input.iter_mut().enumerate().take((together - 1) * S + KH) {
                    *p = row(first + k as isize);
                }
                if ch + 1 < c {
                    // The next channel's rows that its own step here will first read,
                    // prefetched while this channel computes. A step reads its rows as short
                    // runs side by side, which the hardware prefetchers do not follow; without
                    // this W6a's depthwise half from memory takes twice as long
                    // (`docs/structured-ops.md`, "Routines": depthwise convolutions).
                    let reach = first + ((together - 1) * S + KH) as isize;
                    let from = if r == rows.start {
                        first
                    } else {
                        // Rows the previous step read are already there.
                        (first + KH as isize - S as isize).max(first)
                    };
                    let clamp = |h: isize| h.clamp(0, in_h as isize) as usize;
                    let (from, to) = (clamp(from), clamp(reach));
                    if from < to {
                        prefetch(&xs[g.x_offset(n, ch + 1, from, 0)..][..(to - from) * in_w]);
                    }
                }
                // SAFETY: every row pointer addresses a row of the plane or of zeros, shifted
                // by the left padding, and each load keeps only the lanes whose column is
                // inside it; the stores go to the caller's rows.
                unsafe {
                    match together {
                        1 => step::<KH, KW, S, 1>(&input, &w, &blocks, out, ow, &finish, same),
                        2 => step::<KH, KW, S, 2>(&input, &w, &blocks, out, ow, &finish, same),
                        3 => step::<KH, KW, S, 3>(&input, &w, &blocks, out, ow, &finish, same),
                        _ => step::<KH, KW, S, ROWS>(&input, &w, &blocks, out, ow, &finish, same),
                    }
                }
                r += together;
            }
            // An activation without a form in registers, on the channel's rows while they are
            // in cache.
            if let Some(act) = post.act.filter(|_| act.is_none()) {
                let len = rows.len() * ow;
                // SAFETY: the caller vouches for this channel's rows.
                let rows =
                    unsafe { std::slice::from_raw_parts_mut(dst.add(ch * channel_stride), len) };
                let tail = Tail {
                    bias: RowBias::None,
                    scale: RowBias::None,
                    residual: None,
                    activation: Some(act),
                };
                epilogue(rows, tail);
            }
        }
    }

    /// What a step applies to its sums before storing them: the channel's bias (where `add`),
    /// then the activation.
    struct Finish {
        bias: __m512,
        add: bool,
        act: Option<InRegisters>,
    }

    /// `R` output rows, the first at `out` (the next ones `ow` apart), from input rows
    /// `input[0..(R - 1) * S + KH]`: output row `r` sums `w[i][j] * input[r * S + i][S * x + j]`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; every lane a block's masks keep must be readable from the
    /// input rows, and `out` writable for `R` rows of `ow`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn step<const KH: usize, const KW: usize, const S: usize, const R: usize>(
        input: &[*const f32; MAX_IN],
        w: &[[__m512; KW]; KH],
        blocks: &Blocks<KW>,
        out: *mut f32,
        ow: usize,
        finish: &Finish,
        same: bool,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if S == 1 && same {
                step_finished::<KH, KW, S, R, true>(input, w, blocks, out, ow, finish)
            } else {
                step_finished::<KH, KW, S, R, false>(input, w, blocks, out, ow, finish)
            }
        }
    }

    /// [`step`], its blocks' taps shifted out of whole vectors where `SAME`.
    #[inline(always)]
    unsafe fn step_finished<
        const KH: usize,
        const KW: usize,
        const S: usize,
        const R: usize,
        const SAME: bool,
    >(
        input: &[*const f32; MAX_IN],
        w: &[[__m512; KW]; KH],
        blocks: &Blocks<KW>,
        out: *mut f32,
        ow: usize,
        finish: &Finish,
    ) {
        let (b, act) = (finish.bias, finish.act);
        // SAFETY: forwarded from the caller.
        unsafe {
            match (finish.add, act.is_some()) {
                (false, false) => {
                    step_as::<KH, KW, S, R, SAME, false, false>(input, w, blocks, out, ow, b, act)
                }
                (true, false) => {
                    step_as::<KH, KW, S, R, SAME, true, false>(input, w, blocks, out, ow, b, act)
                }
                (false, true) => {
                    step_as::<KH, KW, S, R, SAME, false, true>(input, w, blocks, out, ow, b, act)
                }
                (true, true) => {
                    step_as::<KH, KW, S, R, SAME, true, true>(input, w, blocks, out, ow, b, act)
                }
            }
        }
    }

    /// [`step`] with the shape of its finish known at compile time: `bias` added where `ADD`,
    /// then `act` where `ACT`. The blocks in between run in a loop with nothing in it but the
    /// block: looking up each block's masks and testing the finish per row, as one loop over
    /// all the blocks did, measured slower (`docs/structured-ops.md`, "Routines": depthwise
    /// convolutions).
    ///
    /// # Safety
    /// As for [`step`].
    #[inline(always)]
    unsafe fn step_as<
        const KH: usize,
        const KW: usize,
        const S: usize,
        const R: usize,
        const SAME: bool,
        const ADD: bool,
        const ACT: bool,
    >(
        input: &[*const f32; MAX_IN],
        w: &[[__m512; KW]; KH],
        blocks: &Blocks<KW>,
        out: *mut f32,
        ow: usize,
        bias: __m512,
        act: Option<InRegisters>,
    ) {
        let finish = |a: __m512| {
            let a = if ADD { _mm512_add_ps(a, bias) } else { a };
            match act {
                // SAFETY: the kernel is compiled for AVX-512F and DQ.
                Some(act) if ACT => unsafe { act.apply(a) },
                _ => a,
            }
        };
        for b in &blocks.edges {
            // SAFETY: forwarded from the caller.
            let acc =
                unsafe { block::<KH, KW, S, R, SAME, true>(input, w, b.x0, b.taps, b.vectors) };
            for (r, &a) in acc.iter().enumerate() {
                // SAFETY: as the caller vouches.
                unsafe {
                    _mm512_mask_storeu_ps(out.wrapping_add(r * ow + b.x0), b.store, finish(a))
                };
            }
        }
        let all = [[u16::MAX; 2]; KW];
        let whole = [u16::MAX; 3];
        let mut x0 = blocks.interior.start;
        while x0 < blocks.interior.end {
            // SAFETY: forwarded from the caller.
            let acc = unsafe { block::<KH, KW, S, R, SAME, false>(input, w, x0, all, whole) };
            for (r, &a) in acc.iter().enumerate() {
                // SAFETY: as the caller vouches.
                unsafe { _mm512_storeu_ps(out.wrapping_add(r * ow + x0), finish(a)) };
            }
            x0 += 16;
        }
    }

    /// The sums of one block of [`step`], the loads masked by `taps` (or where `SAME`,
    /// `vectors`) where `MASKED` (all lanes otherwise).
    ///
    /// Where `SAME` (stride 1, left padding `KW / 2`), each input row is read as the three
    /// whole vectors around the block, and each tap's vector is shifted out of two of them in
    /// registers: three loads that do not cross a cache line, where loading each tap's columns
    /// took `KW`, most of them across two lines.
    #[inline(always)]
    unsafe fn block<
        const KH: usize,
        const KW: usize,
        const S: usize,
        const R: usize,
        const SAME: bool,
        const MASKED: bool,
    >(
        input: &[*const f32; MAX_IN],
        w: &[[__m512; KW]; KH],
        x0: usize,
        taps: [[__mmask16; 2]; KW],
        vectors: [__mmask16; 3],
    ) -> [__m512; R] {
        let mut acc = [_mm512_setzero_ps(); R];
        if SAME {
            for k in 0..R - 1 + KH {
                // Column x0 of input row k.
                let at = input[k].wrapping_add(KW / 2 + x0);
                // SAFETY: the caller vouches for the lanes the masks keep (all of them where
                // not MASKED).
                let load = |m: usize| unsafe {
                    let at = at.wrapping_add(16 * m).wrapping_sub(16);
                    if MASKED {
                        _mm512_maskz_loadu_ps(vectors[m], at)
                    } else {
                        _mm512_loadu_ps(at)
                    }
                };
                let (a, b, c) = (load(0), load(1), load(2));
                // The tap column picks a weight from each output row's filter row.
                #[allow(clippy::needless_range_loop)]
                for j in 0..KW {
                    // SAFETY: the kernel is compiled for AVX-512F.
                    let v = unsafe { shifted(a, b, c, j as isize - (KW / 2) as isize) };
                    for (r, acc) in acc.iter_mut().enumerate() {
                        if k >= r && k - r < KH {
                            *acc = _mm512_fmadd_ps(w[k - r][j], v, *acc);
                        }
                    }
                }
            }
            return acc;
        }
        // The even lanes of two vectors: columns 0, 2, .., 30 of a 32-column run.
        let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        for k in 0..(R - 1) * S + KH {
            for j in 0..KW {
                let at = input[k].wrapping_add(S * x0 + j);
                // SAFETY: the caller vouches for the lanes the masks keep (all of them where
                // not MASKED).
                let load = |h: usize| unsafe {
                    if MASKED {
                        _mm512_maskz_loadu_ps(taps[j][h], at.wrapping_add(16 * h))
                    } else {
                        _mm512_loadu_ps(at.wrapping_add(16 * h))
                    }
                };
                let v = if S == 1 {
                    load(0)
                } else {
                    _mm512_permutex2var_ps(load(0), even, load(1))
                };
                for (r, a) in acc.iter_mut().enumerate() {
                    // Output row r reads input row k through filter row k - r * S.
                    if k >= r * S && k - r * S < KH {
                        *a = _mm512_fmadd_ps(w[k - r * S][j], v, *a);
                    }
                }
            }
        }
        acc
    }

    /// Columns `d..d + 16` of the 48 in `a`, `b` and `c` (starting at -16), for `d` in -2..=2.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    unsafe fn shifted(a: __m512, b: __m512, c: __m512, d: isize) -> __m512 {
        // SAFETY: as the caller vouches.
        unsafe {
            let (a, b, c) = (
                _mm512_castps_si512(a),
                _mm512_castps_si512(b),
                _mm512_castps_si512(c),
            );
            // `alignr::<k>(hi, lo)` is lanes k..k + 16 of `lo` followed by `hi`.
            _mm512_castsi512_ps(match d {
                -2 => _mm512_alignr_epi32::<14>(b, a),
                -1 => _mm512_alignr_epi32::<15>(b, a),
                0 => b,
                1 => _mm512_alignr_epi32::<1>(c, b),
                2 => _mm512_alignr_epi32::<2>(c, b),
                _ => unreachable!("filters are 3 or 5 columns wide"),
            })
        }
    }
}

/// The f32 NHWC kernel on AVX-512, for any filter, stride, dilation and padding: channels are
/// contiguous, so each output pixel's sums are vectors of 16 channels (the last one masked),
/// four pixels side by side so that each tap's weight vector, loaded once, feeds four FMA
/// chains. Taps outside the image are skipped, as the reference skips them, in the same
/// row-major order as the portable kernel, so the two agree bit for bit. The bias and ReLU or
/// a clamp are applied in registers, another activation over the band afterwards.
///
/// The input two blocks ahead is prefetched: each block reads its pixels a 16-channel chunk at
/// a time, a 256-byte stride on three rows, and without the prefetch its loads stall and the
/// kernel is slower than the portable one. Each row's filter rows and each pixel's offsets are
/// looked up once (`docs/structured-ops.md`, "Measurements behind design choices").
#[cfg(target_arch = "x86_64")]
mod nhwc_avx512 {
    use std::arch::x86_64::*;

    use super::{Geometry, Post};
    use crate::epilogue::{epilogue, RowBias, Tail};
    use crate::simd::InRegisters;

    /// Output pixels summed together.
    const PIXELS: usize = 4;

    /// Depthwise output rows `rows` of image `n`, all channels, to `dst` as
    /// `[row][col][channel]`, with `post`'s bias and activation.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and DQ; `g` must be NHWC; the `rows.len() * ow * c` elements at
    /// `dst` must lie in one allocation and be this thread's alone.
    pub(super) unsafe fn band(
        g: &Geometry,
        xs: &[f32],
        ws: &[f32],
        n: usize,
        rows: std::ops::Range<usize>,
        dst: *mut f32,
        post: Post<f32>,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { band_avx512(g, xs, ws, n, rows, dst, post) }
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn band_avx512(
        g: &Geometry,
        xs: &[f32],
        ws: &[f32],
        n: usize,
        rows: std::ops::Range<usize>,
        dst: *mut f32,
        post: Post<f32>,
    ) {
        let [_, c, _, ow] = g.y;
        let taps = g.kh * g.kw;
        assert!(xs.len() >= g.x.iter().product() && ws.len() >= c * taps);
        let len = rows.len() * ow * c;
        // SAFETY: the caller vouches for the band.
        let out = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        if len == 0 {
            return;
        }
        // Weights as [tap][channel], so that a tap's weights for 16 channels are one load.
        let mut wt = vec![0.0f32; taps * c];
        for ch in 0..c {
            for t in 0..taps {
                wt[t * c + ch] = ws[ch * taps + t];
            }
        }
        let act = InRegisters::of(post.act);
        let [_, _, in_h, in_w] = g.x;
        // Per output column and tap column, the input column read, or -1 where it lies in the
        // padding.
        // Per output column and tap column, where the input pixel starts in its row (its column
        // times the channels), or -1 where it lies in the padding.
        let cols: Vec<isize> = (0..ow)
            .flat_map(|o| (0..g.kw).map(move |j| g.tap(1, o, j).map_or(-1, |x| (x * c) as isize)))
            .collect();
        let image = &xs[g.x_offset(n, 0, 0, 0)..][..in_h * in_w * c];
        // The filter rows an output row reads inside the image, each with its input row.
        let mut taps_in = Vec::with_capacity(g.kh);
        for r in rows.clone() {
            let at_row = (r - rows.start) * ow * c;
            let out_row = &mut out[at_row..at_row + ow * c];
            taps_in.clear();
            taps_in.extend((0..g.kh).filter_map(|i| g.tap(0, r, i).map(|h| (i, h * in_w * c))));
            let pass = Pass {
                g,
                image,
                wt: &wt,
                cols: &cols,
                rows: &taps_in,
                bias: post.bias,
                act,
            };
            let mut o0 = 0;
            while o0 < ow {
                // SAFETY: the CPU has AVX-512F (this function's features).
                unsafe {
                    if ow - o0 >= PIXELS {
                        pass.pixels::<PIXELS>(o0, out_row);
                        o0 += PIXELS;
                    } else {
                        pass.pixels::<1>(o0, out_row);
                        o0 += 1;
                    }
                }
            }
        }
        if let Some(act) = post.act.filter(|_| act.is_none()) {
            let tail = Tail {
                bias: RowBias::None,
                scale: RowBias::None,
                residual: None,
                activation: Some(act),
            };
            epilogue(out, tail);
        }
    }

    /// One output row's work: what [`Pass::pixels`] reads.
    struct Pass<'a> {
        g: &'a Geometry,
        /// The image's input, `[h][w][c]`.
        image: &'a [f32],
        /// Weights `[tap][channel]`.
        wt: &'a [f32],
        /// Per output column and tap column, the input pixel's offset in its row, or -1 in the
        /// padding.
        cols: &'a [isize],
        /// The filter rows inside the image, each with its input row's offset.
        rows: &'a [(usize, usize)],
        bias: Option<&'a [f32]>,
        /// Applied after the bias.
        act: Option<InRegisters>,
    }

    impl Pass<'_> {
        /// Output pixels `o0..o0 + P` of the row, every channel, into `out` (`[col][channel]`).
        ///
        /// # Safety
        /// The CPU must have AVX-512F and DQ.
        #[inline(always)]
        unsafe fn pixels<const P: usize>(&self, o0: usize, out: &mut [f32]) {
            let g = self.g;
            let [_, c, _, _] = g.y;
            let [_, _, _, in_w] = g.x;
            let zero = _mm512_setzero_ps();
            // The input this row's pixels two blocks on will read, asked for now: each block
            // reads its pixels a channel chunk at a time, a stride the hardware prefetchers
            // follow poorly.
            let ahead = o0 + 2 * P;
            let (from, to) = (ahead * g.stride[1], (ahead + P) * g.stride[1] + g.kw);
            let (from, to) = (from.saturating_sub(g.pad[1]).min(in_w), to.min(in_w));
            if from < to {
                for &(_, at) in self.rows {
                    {
                        let run = &self.image[at + from * c..at + to * c];
                        let start = run.as_ptr() as usize;
                        for line in (start & !63..start + 4 * run.len()).step_by(64) {
                            // SAFETY: a prefetch reads nothing architecturally.
                            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
                        }
                    }
                }
            }
            for c0 in (0..c).step_by(16) {
                let lanes = (c - c0).min(16);
                let mask: __mmask16 = (((1u32 << lanes) - 1) & 0xffff) as u16;
                let mut acc = [zero; P];
                for &(i, at) in self.rows {
                    let row = &self.image[at..][..in_w * c];
                    for j in 0..g.kw {
                        let wt = &self.wt[(i * g.kw + j) * c + c0..][..lanes];
                        // SAFETY: the mask keeps the `lanes` elements of `wt`.
                        let wv = unsafe { _mm512_maskz_loadu_ps(mask, wt.as_ptr()) };
                        for (p, a) in acc.iter_mut().enumerate() {
                            let col = self.cols[(o0 + p) * g.kw + j];
                            if col < 0 {
                                continue;
                            }
                            // SAFETY: `col` is a pixel's start inside the row and
                            // `c0 + lanes <= c`, so the lanes the mask keeps lie in `row`.
                            let xv = unsafe {
                                _mm512_maskz_loadu_ps(mask, row.as_ptr().add(col as usize + c0))
                            };
                            *a = _mm512_fmadd_ps(wv, xv, *a);
                        }
                    }
                }
                let bias = self.bias.map(|b| {
                    let b = &b[c0..c0 + lanes];
                    // SAFETY: the mask keeps the `lanes` elements of `b`.
                    unsafe { _mm512_maskz_loadu_ps(mask, b.as_ptr()) }
                });
                for (p, a) in acc.iter().enumerate() {
                    let mut a = *a;
                    if let Some(b) = bias {
                        a = _mm512_add_ps(a, b);
                    }
                    if let Some(act) = self.act {
                        // SAFETY: compiled for AVX-512F and DQ.
                        a = unsafe { act.apply(a) };
                    }
                    let slot = &mut out[(o0 + p) * c + c0..][..lanes];
                    // SAFETY: `slot` holds the lanes the mask keeps.
                    unsafe { _mm512_mask_storeu_ps(slot.as_mut_ptr(), mask, a) };
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::epilogue::Activation;
    use kfuse_ir::{Conv2dAttrs, Layout};

    /// The epilogues the kernels are compared under: none, the bias with ReLU or ReLU6 (in
    /// registers), ReLU alone, and the bias with `other` (a pass over the computed rows).
    fn epilogues(bias: &[f32], other: Activation) -> [Post<'_, f32>; 5] {
        let none = Post::none();
        [
            none,
            Post {
                bias: Some(bias),
                act: Some(Activation::Clamp(kfuse_ir::Bounds::new(0.0, 6.0))),
                ..none
            },
            Post {
                bias: Some(bias),
                act: Some(Activation::Relu),
                ..none
            },
            Post {
                act: Some(Activation::Relu),
                ..none
            },
            Post {
                bias: Some(bias),
                act: Some(other),
                ..none
            },
        ]
    }

    /// Runs `run(post, image, rows, a, b)` for every epilogue, both images and every band of
    /// up to `most` of the `oh` output rows, `a` and `b` each `len(rows)` elements filled
    /// differently, and asserts that they come out the same bits. Returns the bands compared.
    fn same_bits_over_bands(
        posts: &[Post<f32>],
        oh: usize,
        most: usize,
        len: impl Fn(usize) -> usize,
        run: impl Fn(Post<f32>, usize, std::ops::Range<usize>, &mut [f32], &mut [f32]),
        what: impl Fn() -> String,
    ) -> usize {
        let mut compared = 0;
        for (e, &post) in posts.iter().enumerate() {
            for n in 0..2 {
                for r0 in 0..oh {
                    for r1 in r0 + 1..=(r0 + most).min(oh) {
                        let (mut a, mut b) =
                            (vec![1.5f32; len(r1 - r0)], vec![2.5f32; len(r1 - r0)]);
                        run(post, n, r0..r1, &mut a, &mut b);
                        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{}, epilogue {e}, image {n} rows {r0}..{r1}", what());
                        compared += 1;
                    }
                }
            }
        }
        compared
    }

    /// The in-place kernel against the bordered-copy one, which sums the same taps in the
    /// same order: the same bits for every band of 1 to 9 rows (each number of rows left for
    /// the last step), every width class (under one block, whole blocks, one lane past), no,
    /// uneven and oversized padding, and non-finite inputs.
    #[test]
    fn in_place_kernel_matches_the_bordered_copy_bit_for_bit() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "in_place_kernel_matches_the_bordered_copy_bit_for_bit",
                kfuse_testkit::Prerequisite::Avx512,
                "the in-place depthwise kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        // (kernel, stride, padding, input height and width)
        let shapes: [(usize, usize, [usize; 4], [usize; 2]); 17] = [
            (3, 1, [1, 1, 1, 1], [12, 1]),
            (3, 1, [1, 1, 1, 1], [11, 16]),
            // Three whole blocks between the two masked ones.
            (3, 1, [1, 1, 1, 1], [7, 80]),
            // Left padding of half the filter (taps shifted out of whole vectors) with less
            // or more padding on the right: rows one column short, and rows reaching past
            // the input by more than a filter's width.
            (3, 1, [1, 1, 1, 0], [6, 35]),
            (3, 1, [0, 2, 1, 3], [5, 47]),
            (5, 1, [2, 2, 2, 2], [8, 64]),
            (3, 1, [0, 0, 0, 0], [13, 17]),
            (3, 1, [3, 2, 3, 3], [4, 5]),
            (5, 1, [2, 2, 2, 2], [10, 33]),
            (5, 1, [1, 3, 0, 4], [9, 40]),
            (5, 1, [0, 1, 4, 1], [12, 7]),
            // Stride 2: output rows of 1, 16 and 17 blocks' lanes, odd and even widths, every
            // padding parity, a row ending exactly at a load's last lane.
            (3, 2, [1, 1, 1, 1], [13, 1]),
            (3, 2, [1, 1, 1, 1], [20, 32]),
            (3, 2, [0, 1, 0, 1], [17, 33]),
            (3, 2, [1, 0, 1, 0], [9, 34]),
            (5, 2, [2, 2, 2, 2], [15, 31]),
            (5, 2, [1, 3, 4, 0], [11, 70]),
        ];
        let mut compared = 0;
        for (k, s, padding, [h, w]) in shapes {
            let c = 3;
            let attrs = Conv2dAttrs {
                layout: Layout::Nchw,
                stride: [s, s],
                padding,
                dilation: [1, 1],
                groups: c,
            };
            let (oh, ow) = (
                (h + padding[0] + padding[1] - k) / s + 1,
                (w + padding[2] + padding[3] - k) / s + 1,
            );
            let g = Geometry::new(&[2, c, h, w], &[c, 1, k, k], &attrs, &[2, c, oh, ow]);
            assert!(in_place::applies(&g));
            let mut xs: Vec<f32> = (0..2 * c * h * w)
                .map(|i| ((i * 7919) % 997) as f32 / 499.0 - 1.0)
                .collect();
            let len = xs.len();
            xs[5 % len] = f32::NAN;
            xs[(h * w + 2) % len] = f32::INFINITY;
            xs[(2 * h * w + 1) % len] = -0.0;
            let ws: Vec<f32> = (0..c * k * k)
                .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
                .collect();
            let bias = [0.25f32, -0.5, 0.0];
            compared += same_bits_over_bands(
                &epilogues(&bias, Activation::Sigmoid),
                oh,
                9,
                |rows| c * rows * ow,
                |post, n, rows, a, b| {
                    let stride = rows.len() * ow;
                    let (pa, pb) = (a.as_mut_ptr(), Out(b.as_mut_ptr()));
                    // SAFETY: each buffer holds the c channels' rows; the CPU has AVX-512.
                    unsafe {
                        in_place::band(&g, &xs, &ws, n, rows.clone(), pa, stride, post);
                        band_body(&g, &xs, &ws, n, rows, pb, stride, post);
                    }
                },
                || format!("{k}x{k} stride {s} padding {padding:?} {h}x{w}"),
            );
        }
        assert!(compared > 2000);
    }

    /// The NHWC AVX-512 kernel against the portable one, which sums the same taps in the same
    /// order and skips the same padding taps: the same bits for channel counts under, at and
    /// past a vector (and a masked last chunk), strides, dilations, uneven padding, rows of
    /// fewer pixels than a block, and the epilogues.
    #[test]
    fn nhwc_kernel_matches_the_portable_one_bit_for_bit() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "nhwc_kernel_matches_the_portable_one_bit_for_bit",
                kfuse_testkit::Prerequisite::Avx512,
                "the NHWC depthwise kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        // (channels, kernel, stride, dilation, padding, input height and width)
        type Shape = (usize, [usize; 2], usize, usize, [usize; 4], [usize; 2]);
        let shapes: [Shape; 6] = [
            (16, [3, 3], 1, 1, [1, 1, 1, 1], [6, 9]),
            (17, [3, 3], 2, 1, [1, 1, 1, 1], [7, 11]),
            (5, [5, 3], 1, 2, [2, 0, 1, 3], [9, 6]),
            (33, [3, 3], 1, 1, [0, 0, 0, 0], [5, 3]),
            (1, [3, 3], 1, 1, [1, 1, 1, 1], [4, 2]),
            (40, [1, 1], 1, 1, [0, 0, 0, 0], [3, 7]),
        ];
        let mut compared = 0;
        for (c, [kh, kw], s, d, padding, [h, w]) in shapes {
            let attrs = Conv2dAttrs {
                layout: Layout::Nhwc,
                stride: [s, s],
                padding,
                dilation: [d, d],
                groups: c,
            };
            let oh = (h + padding[0] + padding[1] - d * (kh - 1) - 1) / s + 1;
            let ow = (w + padding[2] + padding[3] - d * (kw - 1) - 1) / s + 1;
            let g = Geometry::new(&[2, h, w, c], &[c, 1, kh, kw], &attrs, &[2, oh, ow, c]);
            let mut xs: Vec<f32> = (0..2 * c * h * w)
                .map(|i| ((i * 7919) % 997) as f32 / 499.0 - 1.0)
                .collect();
            let len = xs.len();
            xs[3 % len] = f32::NAN;
            xs[(c + 1) % len] = f32::NEG_INFINITY;
            xs[(2 * c + 2) % len] = -0.0;
            let ws: Vec<f32> = (0..c * kh * kw)
                .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
                .collect();
            let bias: Vec<f32> = (0..c).map(|i| i as f32 / 8.0 - 1.0).collect();
            compared += same_bits_over_bands(
                &epilogues(&bias, Activation::Tanh),
                oh,
                3,
                |rows| rows * ow * c,
                |post, n, rows, a, b| {
                    let (pa, pb) = (a.as_mut_ptr(), Out(b.as_mut_ptr()));
                    // SAFETY: each buffer holds the band; the CPU has AVX-512.
                    unsafe {
                        nhwc_avx512::band(&g, &xs, &ws, n, rows.clone(), pa, post);
                        band_body(&g, &xs, &ws, n, rows, pb, 0, post);
                    }
                },
                || format!("{c} channels {kh}x{kw} stride {s} dilation {d} padding {padding:?}"),
            );
        }
        assert!(compared > 200);
    }
}
