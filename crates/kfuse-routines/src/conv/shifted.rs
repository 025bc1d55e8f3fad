//! Stride-1 convolutions as a sum of shifted GEMMs, with no im2col matrix.
//!
//! Each task copies the input rows its band of output rows reads, every channel of a group,
//! into a zero-bordered scratch `ph × pw` per channel, where `pw` is the padded row width. On
//! that grid, output pixel `(r, x)` sits at `q = r * pw + x`, and the pixel its tap `(i, j)` reads
//! sits at `q + i * dh * pw + j * dw`. So each tap is a GEMM of the tap's weights
//! (`out_channels × in_channels`, read in place through strides) by the scratch shifted by that
//! offset, accumulated into a staging tile over the padded grid. The two (`kw - 1`) columns per
//! row that fall in the padding are computed and dropped. The band's valid pixels are then
//! copied out with the bias and ReLU.
//!
//! Against im2col, this writes and reads back no `kh·kw`-times-larger column matrix, a cost
//! per input channel and pixel; in exchange each output element is read and written by
//! `kh·kw` GEMMs instead of one, a cost per output channel and pixel. In NCHW it pays when
//! output channels do not outnumber input channels (W7's shape, not W6b's, which keeps
//! im2col; f32 NCHW now takes the direct kernel, so this is the f64 rule). In NHWC the im2col
//! rows gather channel-strided patches, and shifted GEMMs win either way. The measurements are
//! in `docs/structured-ops.md` ("Routines": other stride-1 convolutions). Each tap's GEMM
//! reduces over one group's channels only, so with few channels (a network's first layer) the
//! GEMMs are too thin, and im2col, which reduces over channels × taps, stays.

use kfuse_ir::Layout;

use super::{for_each_band, Geometry, Post};
use crate::dense::{with_scratch, Out, Real};
use crate::epilogue::epilogue_into;
use crate::gemm::{gemm_into, Init};

/// The padded grid of a convolution: rows `pw` wide (the input row with its left and right
/// padding), on which output pixel `(r, x)` of a band sits at `r * pw + x` and its tap `(i, j)`
/// reads `offsets[i * kw + j] = i * dh * pw + j * dw` further on (stride 1; the shifted GEMMs
/// and the direct kernel).
///
/// With a stride `(sh, sw)` (NCHW, the direct kernel), the band's input is split into
/// `sh × sw` phase planes, phase `(a, b)` holding input pixels `(R·sh + a, X·sw + b)` at `(R,
/// X)`: tap `(i, j)`, with `i·dh = u·sh + a` and `j·dw = v·sw + b`, reads output pixel `(r,
/// x)`'s input at `(r + u, x + v)` of phase `(a, b)`, a fixed offset again, and the strided
/// convolution is the stride-1 microkernel over the phases with no gathered loads.
pub(super) struct Grid {
    pub pw: usize,
    /// Per tap: the offset within its phase plane (stride 1: the offset).
    pub offsets: Vec<usize>,
    /// Per tap: its phase, `a * sw + b` (0 at stride 1).
    phase_of: Vec<usize>,
    /// Rows a band's phase planes hold beyond its output rows.
    extra: usize,
    stride: [usize; 2],
}

impl Grid {
    pub(super) fn new(g: &Geometry) -> Grid {
        let [dh, dw] = g.dilation;
        let [sh, sw] = g.stride;
        // `ow = (in_w + pad_left + pad_right - (kw - 1) * dw - 1) / sw + 1`: the padded row, in
        // phase columns, is `ow` plus the reach of the last tap.
        let pw = g.y[3] + (g.kw - 1) * dw / sw;
        let taps: Vec<(usize, usize)> = (0..g.kh)
            .flat_map(|i| (0..g.kw).map(move |j| (i * dh, j * dw)))
            .collect();
        Grid {
            pw,
            offsets: taps
                .iter()
                .map(|&(di, dj)| di / sh * pw + dj / sw)
                .collect(),
            phase_of: taps
                .iter()
                .map(|&(di, dj)| di % sh * sw + dj % sw)
                .collect(),
            extra: (g.kh - 1) * dh / sh,
            stride: g.stride,
        }
    }

    /// Input rows (per phase) that a band of `rows` output rows reads.
    pub(super) fn rows(&self, rows: usize) -> usize {
        rows + self.extra
    }

    /// Phase planes per channel.
    pub(super) fn phases(&self) -> usize {
        self.stride[0] * self.stride[1]
    }

    /// The taps' offsets into a channel's phase planes of `ph` rows each, laid one after the
    /// other.
    pub(super) fn tap_offsets(&self, ph: usize) -> Vec<usize> {
        let size = ph * self.pw;
        self.offsets
            .iter()
            .zip(&self.phase_of)
            .map(|(&o, &phase)| phase * size + o)
            .collect()
    }

    /// Copies input rows `r0 - pad_top ..` (`ph` of them) of `group`'s channels of image `n`
    /// into `xpad`, on the grid: NCHW as one plane per channel (strided: its phase planes of
    /// `ph × pw`, the ones a tap reads), `plane` apart; NHWC (stride 1) as
    /// `[row][column][channel]`. Rows and columns outside the input are not written, so the
    /// zeros a caller put there stay (they are at the same places for every group).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fill<T: Real>(
        &self,
        g: &Geometry,
        xs: &[T],
        n: usize,
        group: usize,
        r0: usize,
        ph: usize,
        plane: usize,
        xpad: &mut [T],
    ) {
        let [_, _, in_h, in_w] = g.x;
        let cg = g.in_channels_per_group();
        let (pt, pl, pw) = (g.pad[0], g.pad[1], self.pw);
        if self.stride != [1, 1] {
            debug_assert!(g.layout == Layout::Nchw);
            let [sh, sw] = self.stride;
            // Channel by channel, each channel's rows in order (one run of memory), the next
            // channel's rows asked for meanwhile; each phase row a gather of every sw-th input
            // column (at stride 2 the even lanes of two loads). Phase by phase, each phase row
            // taken from every channel in turn, the copy read 128 channels' rows 12.5 KB apart
            // and was a quarter of the convolution's time (`docs/structured-ops.md`, "Routines":
            // strided convolutions).
            // Per phase a tap reads: (phase, its row phase, phase columns X whose input column
            // X * sw + b - pl lies in the row, and that first input column).
            let phases: Vec<(usize, usize, std::ops::Range<usize>, usize)> = (0..self.phases())
                .filter(|phase| self.phase_of.contains(phase))
                .filter_map(|phase| {
                    let (a, b) = (phase / sw, phase % sw);
                    let x_lo = pl.saturating_sub(b).div_ceil(sw);
                    let x_hi = (in_w + pl).saturating_sub(b).div_ceil(sw).min(pw);
                    (x_lo < x_hi).then(|| (phase, a, x_lo..x_hi, x_lo * sw + b - pl))
                })
                .collect();
            // The input rows the band reads, contiguous in each channel's plane.
            let h_lo = (r0 * sh).saturating_sub(pt).min(in_h);
            let h_hi = ((r0 + ph) * sh).saturating_sub(pt).min(in_h);
            for ci in 0..cg {
                if ci + 1 < cg && h_lo < h_hi {
                    // The next channel's rows, asked for while this one is copied.
                    let next = g.x_offset(n, group * cg + ci + 1, h_lo, 0);
                    prefetch(&xs[next..][..(h_hi - h_lo) * in_w]);
                }
                for t in 0..ph {
                    for (phase, a, cols, first) in &phases {
                        let Some(h) = ((r0 + t) * sh + a).checked_sub(pt).filter(|&h| h < in_h)
                        else {
                            continue;
                        };
                        let src = &xs[g.x_offset(n, group * cg + ci, h, *first)..];
                        let dst = &mut xpad[ci * plane + (phase * ph + t) * pw..][cols.clone()];
                        every_nth(dst, src, sw);
                    }
                }
            }
            return;
        }
        let cols = in_w.min(pw - pl.min(pw));
        for t in 0..ph {
            let Some(h) = (r0 + t).checked_sub(pt).filter(|&h| h < in_h) else {
                continue;
            };
            match g.layout {
                Layout::Nchw => {
                    for ci in 0..cg {
                        let src = &xs[g.x_offset(n, group * cg + ci, h, 0)..][..cols];
                        xpad[ci * plane + t * pw + pl..][..cols].copy_from_slice(src);
                    }
                }
                Layout::Nhwc => {
                    for x in 0..cols {
                        let src = &xs[g.x_offset(n, group * cg, h, x)..][..cg];
                        xpad[(t * pw + pl + x) * cg..][..cg].copy_from_slice(src);
                    }
                }
            }
        }
    }
}

/// Asks for every cache line of `data` (into L1).
#[inline(always)]
pub(super) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let (start, bytes) = (data.as_ptr() as usize, std::mem::size_of_val(data));
        for line in (start & !63..start + bytes).step_by(64) {
            // SAFETY: a prefetch reads nothing architecturally.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    line as *const i8,
                )
            };
        }
    }
}

/// `dst[k] = src[step * k]` for every `k` of `dst` (f32 at stride 2 on AVX-512 by permutes).
pub(super) fn every_nth<T: Real>(dst: &mut [T], src: &[T], step: usize) {
    #[cfg(target_arch = "x86_64")]
    if step == 2 && crate::dense::has_avx512() {
        if let (Some(dst), Some(src)) = (T::f32s_mut(dst), T::f32s(src)) {
            // SAFETY: the CPU has AVX-512.
            return unsafe { every_second(dst, src) };
        }
    }
    for (d, &v) in dst.iter_mut().zip(src.iter().step_by(step)) {
        *d = v;
    }
}

/// `dst[k] = src[2 * k]` for every `k` of `dst`, 16 at a time: the even lanes of two loads.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn every_second(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::*;
    let n = dst.len();
    assert!(n == 0 || src.len() > 2 * (n - 1));
    let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let lanes = |k: usize| ((1u32 << k.min(16)) - 1) as u16;
    let mut k = 0;
    while k < n {
        let m = (n - k).min(16);
        // The source elements this chunk reads: 2k up to 2(k + m - 1), or up to src's end.
        let count = (2 * m).min(src.len() - 2 * k);
        let at = src.as_ptr().add(2 * k);
        // SAFETY: the masks keep lanes below `count`, inside `src`; the store keeps `m` lanes
        // of `dst` from `k`.
        unsafe {
            let lo = _mm512_maskz_loadu_ps(lanes(count), at);
            let hi = _mm512_maskz_loadu_ps(lanes(count.saturating_sub(16)), at.add(16));
            let v = _mm512_permutex2var_ps(lo, even, hi);
            _mm512_mask_storeu_ps(dst.as_mut_ptr().add(k), lanes(m), v);
        }
        k += m;
    }
}

/// The convolution of `g` into `y`, with the epilogue.
pub(super) fn conv<T: Real>(g: &Geometry, xs: &[T], ws: &[T], y: &mut [T], post: Post<T>) {
    let [n_images, c_out, oh, ow] = g.y;
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    let (kh, kw) = (g.kh, g.kw);
    let taps = kh * kw;
    let grid = Grid::new(g);
    let pw = grid.pw;
    let out = Out(y.as_mut_ptr());
    let job = |n: usize, band: std::ops::Range<usize>| {
        let (r0, rows) = (band.start, band.len());
        let ph = grid.rows(rows);
        let plane = ph * pw;
        // GEMM columns: the band's pixels on the padded grid, up to its last valid one.
        let q = (rows - 1) * pw + ow;
        with_scratch(cg * plane + og * q, |scratch: &mut [T]| {
            let (xpad, stage) = scratch.split_at_mut(cg * plane);
            xpad.fill(T::ZERO);
            for group in 0..g.groups {
                grid.fill(g, xs, n, group, r0, ph, plane, xpad);
                let w_group = &ws[group * og * cg * taps..][..og * cg * taps];
                for i in 0..kh {
                    for j in 0..kw {
                        let shift = grid.offsets[i * kw + j];
                        // Weights of tap (i, j): og × cg, rows cg·taps apart, columns taps apart.
                        let lhs = w_group[i * kw + j..].as_ptr();
                        let init = if i == 0 && j == 0 {
                            Init::Zero
                        } else {
                            Init::Accumulate
                        };
                        // SAFETY: the scratch holds cg × plane elements and the shifted view's last
                        // element, `(q - 1 + shift)` for the last channel, is inside it: `q - 1 +
                        // (kh - 1) dh pw + (kw - 1) dw = ph pw - 1`. The weights' last element is
                        // `(og - 1) cg taps + (cg - 1) taps + i kw + j < og cg taps`. The stage is
                        // og × q, and this task's own.
                        unsafe {
                            match g.layout {
                                Layout::Nchw => gemm_into(
                                    og,
                                    q,
                                    cg,
                                    stage.as_mut_ptr(),
                                    q,
                                    1,
                                    lhs,
                                    cg * taps,
                                    taps,
                                    xpad[shift..].as_ptr(),
                                    plane,
                                    1,
                                    init,
                                ),
                                Layout::Nhwc => gemm_into(
                                    og,
                                    q,
                                    cg,
                                    stage.as_mut_ptr(),
                                    1,
                                    og,
                                    lhs,
                                    cg * taps,
                                    taps,
                                    xpad[shift * cg..].as_ptr(),
                                    1,
                                    cg,
                                    init,
                                ),
                            }
                        }
                    }
                }
                // The valid pixels, with the epilogue, to rows r0.. of image n.
                for r in 0..rows {
                    match g.layout {
                        Layout::Nchw => {
                            for co in 0..og {
                                let channel = group * og + co;
                                let src = &stage[co * q + r * pw..][..ow];
                                let at = ((n * c_out + channel) * oh + r0 + r) * ow;
                                // SAFETY: row r0 + r of this channel of image n is this task's.
                                let dst = unsafe {
                                    std::slice::from_raw_parts_mut(out.ptr().add(at), ow)
                                };
                                epilogue_into(dst, src, post.channel(channel, at, ow));
                            }
                        }
                        Layout::Nhwc => {
                            for x in 0..ow {
                                let src = &stage[(r * pw + x) * og..][..og];
                                let at = ((n * oh + r0 + r) * ow + x) * c_out + group * og;
                                // SAFETY: pixel (r0 + r, x) of image n is this task's.
                                let dst = unsafe {
                                    std::slice::from_raw_parts_mut(out.ptr().add(at), og)
                                };
                                let channels = group * og..(group + 1) * og;
                                epilogue_into(dst, src, post.pixel(channels, at));
                            }
                        }
                    }
                }
            }
        })
    };
    for_each_band(
        n_images,
        oh,
        (cg + og) * pw * std::mem::size_of::<T>(),
        &job,
    );
}
