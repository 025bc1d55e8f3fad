//! Direct stride-1 convolutions for f32 on AVX-512: an implicit-GEMM microkernel that reads
//! its input straight from a zero-bordered copy of the band, with no packing and no im2col.
//!
//! As in [`super::shifted`], each task copies the input rows of its band into one
//! zero-bordered plane per channel, `pw` wide, on which output pixel `(r, x)` sits at
//! `q = r * pw + x` and its tap `(i, j)` reads `q + i * dh * pw + j * dw`. The microkernel keeps
//! an 8 output channel × 48 position block of sums in 24 vector registers. For each input
//! channel and tap it loads the three 16-wide input vectors once, and multiplies them by each
//! of the 8 weights, broadcast. All taps and channels are summed before the block is stored.
//! The shifted-GEMM path instead stores and reloads the output once per tap, and the `gemm`
//! crate repacks the shifted input for each tap. Weights are packed once per call,
//! `[block][channel][tap][8]`, with zeros for a last partial block.
//!
//! The bias and ReLU are applied in registers and the block is stored to a staging tile over
//! the padded grid, whose valid pixels are copied out row by row (applying any other
//! activation, such as GELU, on the way). Storing each vector straight to the output with
//! masked stores, skipping the padding columns, measured slower in alternating runs: W6b
//! 39.1 against 36.8 ms, W7 5.17 against 4.94 ms.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use kfuse_ir::Layout;

use super::{for_each_band, Geometry};
use crate::dense::{epilogue_into, has_avx512, with_scratch, Activation, Out, RowBias};

/// Output channels per microkernel block.
const OB: usize = 8;
/// 16-wide vectors of positions per microkernel block.
const NV: usize = 3;
/// Positions per microkernel block.
const QB: usize = 16 * NV;

/// Whether `g` runs here: NCHW, stride 1, a kernel larger than 1×1, on a CPU with AVX-512.
pub(super) fn applies(g: &Geometry) -> bool {
    g.layout == Layout::Nchw && g.stride == [1, 1] && g.kh * g.kw > 1 && has_avx512()
}

/// The convolution of `g` into `y`, with the epilogue. Call only where [`applies`] holds.
pub(super) fn conv(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    bias: Option<&[f32]>,
    act: Option<Activation>,
) {
    let [n_images, c_out, oh, ow] = g.y;
    let [_, _, in_h, in_w] = g.x;
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    let (kh, kw) = (g.kh, g.kw);
    let [dh, dw] = g.dilation;
    let taps = kh * kw;
    let pw = ow + (kw - 1) * dw;
    let (pt, pl) = (g.pad[0], g.pad[1]);
    let cols = in_w.min(pw - pl.min(pw));
    let blocks = og.div_ceil(OB);
    // Weights per group as [block][channel][tap][OB], zero past the last output channel.
    let mut packed = vec![0.0f32; g.groups * blocks * cg * taps * OB];
    for group in 0..g.groups {
        for o in 0..og {
            let (b, lane) = (o / OB, o % OB);
            for ci in 0..cg {
                for t in 0..taps {
                    packed[(((group * blocks + b) * cg + ci) * taps + t) * OB + lane] =
                        ws[((group * og + o) * cg + ci) * taps + t];
                }
            }
        }
    }
    let offsets: Vec<usize> = (0..kh)
        .flat_map(|i| (0..kw).map(move |j| i * dh * pw + j * dw))
        .collect();
    let out = Out(y.as_mut_ptr());
    let job = |n: usize, band: std::ops::Range<usize>| {
        let (r0, rows) = (band.start, band.len());
        let ph = rows + (kh - 1) * dh;
        // Positions computed: whole blocks covering the band's last valid pixel. Reads reach
        // `q_blocks - 1 + offsets.last()`, at most `ph * pw + QB - 1`, hence the plane's tail.
        let q = (rows - 1) * pw + ow;
        let q_blocks = q.div_ceil(QB) * QB;
        let plane = ph * pw + QB;
        let stage_rows = blocks * OB;
        with_scratch(
            cg * plane + stage_rows * q_blocks,
            |scratch: &mut [f32]| {
                let (xpad, stage) = scratch.split_at_mut(cg * plane);
                xpad.fill(0.0);
                for group in 0..g.groups {
                    for t in 0..ph {
                        let Some(h) = (r0 + t).checked_sub(pt).filter(|&h| h < in_h) else {
                            continue;
                        };
                        for ci in 0..cg {
                            let src = &xs[g.x_offset(n, group * cg + ci, h, 0)..][..cols];
                            xpad[ci * plane + t * pw + pl..][..cols].copy_from_slice(src);
                        }
                    }
                    let w_group =
                        &packed[group * blocks * cg * taps * OB..][..blocks * cg * taps * OB];
                    for qb in (0..q_blocks).step_by(QB) {
                        for b in 0..blocks {
                            let w = &w_group[b * cg * taps * OB..][..cg * taps * OB];
                            let first = group * og + b * OB;
                            let finish = Finish {
                                bias: bias.map(|bias| {
                                    std::array::from_fn(|o| {
                                        if b * OB + o < og {
                                            bias[first + o]
                                        } else {
                                            0.0
                                        }
                                    })
                                }),
                                relu: act == Some(Activation::Relu),
                            };
                            let dst = &mut stage[b * OB * q_blocks + qb..];
                            // SAFETY: `applies` checked the CPU's features; the reads stay in the
                            // scratch (see `plane`), the writes in the stage's OB rows.
                            unsafe {
                                block(&xpad[qb..], plane, &offsets, w, cg, dst, q_blocks, &finish)
                            };
                        }
                    }
                    // The bias and ReLU were applied in registers; another activation is applied
                    // as each row is copied out.
                    let rest = act.filter(|&a| a != Activation::Relu);
                    for co in 0..og {
                        let channel = group * og + co;
                        for r in 0..rows {
                            let src = &stage[co * q_blocks + r * pw..][..ow];
                            // SAFETY: row r0 + r of this channel of image n is this task's.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    out.ptr().add(((n * c_out + channel) * oh + r0 + r) * ow),
                                    ow,
                                )
                            };
                            epilogue_into(dst, src, RowBias::None, rest);
                        }
                    }
                }
            },
        )
    };
    for_each_band(
        n_images,
        oh,
        (cg + og) * pw * std::mem::size_of::<f32>(),
        &job,
    );
}

/// What a block applies to its sums in registers before storing them.
struct Finish {
    /// One value per output channel of the block, added.
    bias: Option<[f32; OB]>,
    /// Then ReLU (`x < 0 ? 0 : x`, so NaN and -0 pass, as in the IR's `relu`).
    relu: bool,
}

/// One block: `dst[o][p] = finish(sum over channels c and taps t of w[c][t][o] * x[c * plane
/// + offsets[t] + p])`, for `o < OB` (rows `dst_stride` apart) and `p < QB`.
///
/// # Safety
/// The CPU must have AVX-512F. `x`, `w` and `dst` are checked to hold `(cg - 1) * plane +
/// max(offsets) + QB`, `cg * taps * OB` and `(OB - 1) * dst_stride + QB` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    x: &[f32],
    plane: usize,
    offsets: &[usize],
    w: &[f32],
    cg: usize,
    dst: &mut [f32],
    dst_stride: usize,
    finish: &Finish,
) {
    let taps = offsets.len();
    let reach = offsets.iter().max().copied().unwrap_or(0) + QB;
    assert!(x.len() >= (cg - 1) * plane + reach && w.len() >= cg * taps * OB);
    assert!(dst.len() >= (OB - 1) * dst_stride + QB);
    let mut acc = [[_mm512_setzero_ps(); NV]; OB];
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    for c in 0..cg {
        for (t, &off) in offsets.iter().enumerate() {
            // SAFETY: in bounds by the assertions above.
            unsafe {
                let at = xp.add(c * plane + off);
                let xv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(at.add(16 * v)));
                let wt = wp.add((c * taps + t) * OB);
                for (o, row) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wt.add(o));
                    for (a, xv) in row.iter_mut().zip(&xv) {
                        *a = _mm512_fmadd_ps(wv, *xv, *a);
                    }
                }
            }
        }
    }
    let zero = _mm512_setzero_ps();
    for (o, row) in acc.iter().enumerate() {
        for (v, a) in row.iter().enumerate() {
            let mut value = *a;
            if let Some(bias) = &finish.bias {
                value = _mm512_add_ps(value, _mm512_set1_ps(bias[o]));
            }
            if finish.relu {
                let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(value, zero);
                value = _mm512_mask_mov_ps(value, negative, zero);
            }
            // SAFETY: in bounds by the assertion above.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(o * dst_stride + 16 * v), value) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    _: &[f32],
    _: usize,
    _: &[usize],
    _: &[f32],
    _: usize,
    _: &mut [f32],
    _: usize,
    _: &Finish,
) {
    unreachable!("`applies` is false without AVX-512")
}
