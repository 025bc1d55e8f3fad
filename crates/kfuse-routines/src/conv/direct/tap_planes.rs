//! Tap planes: the strided layout on which every tap reads a fixed offset of a grid exactly
//! as wide as the output rows.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::conv::Geometry;
use crate::dense::has_avx512;

/// A strided convolution's "tap planes": per band, each input channel is copied into one plane per
/// row phase `a` of the stride (those the filter rows read) and tap column `j`, `ow` wide, plane
/// `(a, j)` holding at `(R, x)` input pixel `(R·sh + a - pad_top, x·sw + j·dw - pad_left)`, zero
/// outside the image. Tap `(i, j)`, with `i·dh = u·sh + a`, reads output pixel `(r, x)`'s input at
/// `(r + u, x)` of plane `(a, j)`: a fixed offset on a grid exactly as wide as the output, every
/// lane inside it. So the blocks' positions are the output's own, they store straight to the output
/// rows, and a band's last few positions take the tail kernel, as in
/// [`conv_same_width`](super::copied::conv_same_width). The copy is `kw / sw` times the input's
/// pixels (those of the row phases read: 1.5 times at 3×3 and stride 2, a quarter at 1×1 and stride
/// 2).
pub(super) struct TapPlanes {
    /// The row phases the filter rows read, in order.
    phases: Vec<usize>,
    /// Per filter row: its phase's index in `phases` and the rows it reaches below the output
    /// row (`u`).
    rows: Vec<(usize, usize)>,
    /// Per tap column: the output columns whose input column lies in the row, and the first
    /// of those input columns.
    columns: Vec<(std::ops::Range<usize>, usize)>,
}

impl TapPlanes {
    pub(super) fn new(g: &Geometry) -> TapPlanes {
        let ([sh, sw], [dh, dw], pl) = (g.stride, g.dilation, g.pad[1]);
        let (in_w, ow) = (g.x[3], g.y[3]);
        let mut phases: Vec<usize> = (0..g.kh).map(|i| i * dh % sh).collect();
        phases.sort_unstable();
        phases.dedup();
        let rows = (0..g.kh)
            .map(|i| {
                let a = i * dh % sh;
                (
                    phases.iter().position(|&p| p == a).unwrap_or(0),
                    i * dh / sh,
                )
            })
            .collect();
        let columns = (0..g.kw)
            .map(|j| {
                let lo = pl.saturating_sub(j * dw).div_ceil(sw).min(ow);
                let hi = (in_w + pl)
                    .saturating_sub(j * dw)
                    .div_ceil(sw)
                    .clamp(lo, ow);
                (lo..hi, (lo * sw + j * dw).saturating_sub(pl))
            })
            .collect();
        TapPlanes {
            phases,
            rows,
            columns,
        }
    }

    /// Planes per channel.
    pub(super) fn planes(&self) -> usize {
        self.phases.len() * self.columns.len()
    }

    /// Rows each plane holds for a band of `rows` output rows.
    pub(super) fn height(&self, rows: usize) -> usize {
        rows + self.rows.iter().map(|r| r.1).max().unwrap_or(0)
    }

    /// Per tap, row-major: its offset into a channel's planes of `height` rows of `ow`.
    pub(super) fn offsets(&self, height: usize, ow: usize) -> Vec<isize> {
        let kw = self.columns.len();
        self.rows
            .iter()
            .flat_map(|&(p, u)| (0..kw).map(move |j| (((p * kw + j) * height + u) * ow) as isize))
            .collect()
    }

    /// Copies the planes of `group`'s channels of image `n` for output rows `r0..` into `xb`,
    /// `chan` apart, each plane `height` rows of `ow`: channel by channel, each channel's rows
    /// in order (one run of memory), the next channel's rows asked for meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fill(
        &self,
        g: &Geometry,
        xs: &[f32],
        n: usize,
        group: usize,
        r0: usize,
        height: usize,
        chan: usize,
        xb: &mut [f32],
    ) {
        let ([sh, sw], pt) = (g.stride, g.pad[0]);
        let [_, _, in_h, in_w] = g.x;
        let (ow, cg, kw) = (g.y[3], g.in_channels_per_group(), self.columns.len());
        let h_lo = (r0 * sh).saturating_sub(pt).min(in_h);
        let h_hi = ((r0 + height) * sh).saturating_sub(pt).min(in_h);
        #[cfg(target_arch = "x86_64")]
        if in_w <= 32 && ow <= 16 && has_avx512() {
            // SAFETY: the CPU has AVX-512; the rows are as narrow as `fill_narrow` needs.
            return unsafe { self.fill_narrow(g, xs, n, group, r0, height, chan, xb) };
        }
        for ci in 0..cg {
            if ci + 1 < cg && h_lo < h_hi {
                let next = g.x_offset(n, group * cg + ci + 1, h_lo, 0);
                crate::conv::shifted::prefetch(&xs[next..][..(h_hi - h_lo) * in_w]);
            }
            for rr in 0..height {
                for (pa, &a) in self.phases.iter().enumerate() {
                    let h = ((r0 + rr) * sh + a).checked_sub(pt).filter(|&h| h < in_h);
                    for (j, (cols, first)) in self.columns.iter().enumerate() {
                        let dst = &mut xb[ci * chan + ((pa * kw + j) * height + rr) * ow..][..ow];
                        match h {
                            Some(h) if !cols.is_empty() => {
                                dst[..cols.start].fill(0.0);
                                dst[cols.end..].fill(0.0);
                                let src = &xs[g.x_offset(n, group * cg + ci, h, *first)..];
                                crate::conv::shifted::every_nth(&mut dst[cols.clone()], src, sw);
                            }
                            _ => dst.fill(0.0),
                        }
                    }
                }
            }
        }
    }
}

impl TapPlanes {
    /// [`TapPlanes::fill`] for input rows of at most 32 pixels and output rows of at most 16
    /// (ResNet's strided 3×3 convolutions onto 14×14 and 7×7): each input row is loaded once,
    /// in two vectors, and each tap column's plane row is one permute of them, its lanes
    /// outside the image zeroed by the permute's mask, stored with one masked store. Copying
    /// each plane row apart, 7 or 14 pixels at a time, took about a tenth of those
    /// convolutions (measured in docs/structured-ops.md, Routines).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; the input rows at most 32 pixels and the output rows at
    /// most 16.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn fill_narrow(
        &self,
        g: &Geometry,
        xs: &[f32],
        n: usize,
        group: usize,
        r0: usize,
        height: usize,
        chan: usize,
        xb: &mut [f32],
    ) {
        let ([sh, sw], pt) = (g.stride, g.pad[0]);
        let [_, _, in_h, in_w] = g.x;
        let (ow, cg, kw) = (g.y[3], g.in_channels_per_group(), self.columns.len());
        assert!(in_w <= 32 && ow <= 16);
        let lanes = |k: usize| ((1u32 << k.min(16)) - 1) as u16;
        // Per tap column: the source lane of each output column in the row's two vectors, and
        // the lanes that read the image.
        let permutes: Vec<(__m512i, __mmask16)> = self
            .columns
            .iter()
            .map(|(cols, first)| {
                let index: [i32; 16] = std::array::from_fn(|x| {
                    if cols.contains(&x) {
                        (first + (x - cols.start) * sw) as i32
                    } else {
                        0
                    }
                });
                let mask = lanes(cols.end) & !lanes(cols.start);
                // SAFETY: 16 i32 values into 16 lanes.
                (unsafe { _mm512_loadu_si512(index.as_ptr().cast()) }, mask)
            })
            .collect();
        let h_lo = (r0 * sh).saturating_sub(pt).min(in_h);
        let h_hi = ((r0 + height) * sh).saturating_sub(pt).min(in_h);
        let out = lanes(ow);
        for ci in 0..cg {
            if ci + 1 < cg && h_lo < h_hi {
                let next = g.x_offset(n, group * cg + ci + 1, h_lo, 0);
                crate::conv::shifted::prefetch(&xs[next..][..(h_hi - h_lo) * in_w]);
            }
            let planes = &mut xb[ci * chan..][..self.planes() * height * ow];
            for rr in 0..height {
                for (pa, &a) in self.phases.iter().enumerate() {
                    let h = ((r0 + rr) * sh + a).checked_sub(pt).filter(|&h| h < in_h);
                    let (lo, hi) = match h {
                        Some(h) => {
                            let row = &xs[g.x_offset(n, group * cg + ci, h, 0)..][..in_w];
                            // SAFETY: the masks keep the loads within the row's `in_w` pixels.
                            unsafe {
                                (
                                    _mm512_maskz_loadu_ps(lanes(in_w), row.as_ptr()),
                                    _mm512_maskz_loadu_ps(
                                        lanes(in_w.saturating_sub(16)),
                                        row.as_ptr().wrapping_add(16),
                                    ),
                                )
                            }
                        }
                        None => (_mm512_setzero_ps(), _mm512_setzero_ps()),
                    };
                    for (j, &(index, mask)) in permutes.iter().enumerate() {
                        let dst = &mut planes[((pa * kw + j) * height + rr) * ow..][..ow];
                        let v = _mm512_maskz_permutex2var_ps(mask, lo, index, hi);
                        // SAFETY: the mask keeps the store within `dst`'s `ow` values.
                        unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), out, v) };
                    }
                }
            }
        }
    }
}
