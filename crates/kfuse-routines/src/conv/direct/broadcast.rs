//! Strided convolutions at a column stride of 2 with output positions broadcast against
//! vectors of output channels: no phase planes, no padding column, no stage.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::microkernel::split;
use crate::constants;
use crate::conv::{Geometry, Post};
use crate::dense::{with_scratch, Out};
use crate::epilogue::epilogue;
use crate::simd::InRegisters;

/// Output positions a block of [`broadcast_positions`] computes: seven along an output row.
const BP: usize = 7;

/// Output rows per task of [`broadcast_positions`].
const BP_ROWS: usize = 4;

/// A strided convolution
/// ([`route::broadcasts_positions`](crate::conv::route::broadcasts_positions)) with positions
/// broadcast and output channels in vectors: a block holds 7 output positions along a row × 32
/// output channels in 14 registers, and for each input channel and tap loads two vectors of 32
/// weights and broadcasts the 7 inputs its positions read (every second pixel of a row of a
/// zero-padded copy of the band's input rows), so that no phase planes are built, no position of a
/// padding column is computed, and no stage is copied out: each block's 7 × 32 results are
/// scattered straight to the output. The sums run over the channels and taps in the phase planes'
/// order, so the results are theirs bit for bit. Of the block shapes tried, 7 × 32 ran fastest:
/// larger ones left too few registers (measured in docs/structured-ops.md, Direct convolution
/// kernel measurements).
pub(super) fn broadcast_positions(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    post: Post<f32>,
) {
    let [n_images, c_out, oh, ow] = g.y;
    let [_, cg, in_h, in_w] = g.x;
    let ([sh, sw], [pt, pl]) = (g.stride, g.pad);
    let taps = g.kh * g.kw;
    assert!(sw == 2 && c_out.is_multiple_of(32) && xs.len() >= n_images * cg * in_h * in_w);
    // Weights [block of 32 outputs][channel][tap][32], kept with constant weights.
    let wp = constants::packed(ws, [3, 1, c_out, cg, taps], || {
        let mut wp = vec![0.0f32; c_out * cg * taps];
        for (o, filter) in ws.chunks_exact(cg * taps).enumerate() {
            for (k, &w) in filter.iter().enumerate() {
                wp[(o / 32 * cg * taps + k) * 32 + o % 32] = w;
            }
        }
        wp
    });
    let bands = oh.div_ceil(BP_ROWS);
    // The copy's rows: every block of 7 reads up to (7 - 1)·2 + kw - 1 columns past its first,
    // so the last (partial) block's reach is padded too.
    let pw = (ow.div_ceil(BP) * BP * sw + g.kw).max(pl + in_w);
    let nrows = (BP_ROWS - 1) * sh + g.kh;
    let out = Out(y.as_mut_ptr());
    let (in_registers, rest) = split(post, false);
    let act = InRegisters::of(in_registers.act);
    crate::Pool::global().run(n_images * bands, &|task| {
        let (n, b) = (task / bands, task % bands);
        let band = b * BP_ROWS..((b + 1) * BP_ROWS).min(oh);
        with_scratch(cg * nrows * pw, |xp: &mut [f32]| {
            for c in 0..cg {
                for rr in 0..nrows {
                    let dst = &mut xp[(c * nrows + rr) * pw..][..pw];
                    let iy = (band.start * sh + rr).checked_sub(pt).filter(|&h| h < in_h);
                    let Some(iy) = iy else {
                        dst.fill(0.0);
                        continue;
                    };
                    dst[..pl].fill(0.0);
                    dst[pl + in_w..].fill(0.0);
                    dst[pl..pl + in_w].copy_from_slice(&xs[g.x_offset(n, c, iy, 0)..][..in_w]);
                }
            }
            let copy = Band {
                rows: nrows,
                width: pw,
            };
            // SAFETY: the route table sends only AVX-512 machines here; the copy holds the band's rows
            // as `copy` says, the weights are packed as `positions_rows` reads them, and image
            // n's rows `band` of the output are this task's.
            unsafe {
                positions_rows(
                    g,
                    xp,
                    &wp,
                    n,
                    band.clone(),
                    copy,
                    in_registers.bias,
                    act,
                    out.ptr(),
                )
            };
        });
        if !rest.is_empty() {
            for co in 0..c_out {
                let at = ((n * c_out + co) * oh + band.start) * ow;
                let len = band.len() * ow;
                // SAFETY: these rows are this task's.
                let rows = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), len) };
                epilogue(rows, rest.channel(co, at, len));
            }
        }
    });
}

/// A band's zero-padded copy of its input rows for [`broadcast_positions`]: `rows` rows of
/// `width` per input channel, channel after channel.
#[derive(Clone, Copy)]
struct Band {
    rows: usize,
    width: usize,
}

/// Image `n`'s output rows `band` of [`broadcast_positions`] from the band's copy `xp` and the
/// packed weights `wp`, with the bias and `act`.
///
/// # Safety
/// The CPU must have AVX-512F and DQ; `xp` must hold the copy `copy` describes (wide enough
/// for every block's reads, asserted), and image `n`'s rows `band` of the output at `y` must
/// be writable and this thread's alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn positions_rows(
    g: &Geometry,
    xp: &[f32],
    wp: &[f32],
    n: usize,
    band: std::ops::Range<usize>,
    copy: Band,
    bias: Option<&[f32]>,
    act: Option<InRegisters>,
    y: *mut f32,
) {
    const S: usize = 2;
    let [_, c_out, oh, ow] = g.y;
    let (cg, sh) = (g.x[1], g.stride[0]);
    let (kh, kw) = (g.kh, g.kw);
    let taps = kh * kw;
    assert!(g.stride[1] == S && wp.len() >= c_out * cg * taps);
    assert!(xp.len() >= cg * copy.rows * copy.width);
    assert!(ow.div_ceil(BP) * BP * S + kw <= copy.width);
    assert!((band.len().max(1) - 1) * sh + kh <= copy.rows);
    // Lane k of a vector of 16 output channels goes k planes on.
    let planes = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32((oh * ow) as i32),
    );
    for (r, oy) in band.enumerate() {
        for ob in 0..c_out / 32 {
            for x0 in (0..ow).step_by(BP) {
                let mut acc = [[_mm512_setzero_ps(); 2]; BP];
                // SAFETY: the reads stay within the copy and the weights (asserted).
                unsafe {
                    let mut wt = wp.as_ptr().add(ob * cg * taps * 32);
                    for c in 0..cg {
                        for i in 0..kh {
                            let row = (c * copy.rows + r * sh + i) * copy.width + x0 * S;
                            let row = xp.as_ptr().add(row);
                            for j in 0..kw {
                                let w = [_mm512_loadu_ps(wt), _mm512_loadu_ps(wt.add(16))];
                                wt = wt.add(32);
                                for (p, sums) in acc.iter_mut().enumerate() {
                                    let x = _mm512_set1_ps(*row.add(p * S + j));
                                    sums[0] = _mm512_fmadd_ps(w[0], x, sums[0]);
                                    sums[1] = _mm512_fmadd_ps(w[1], x, sums[1]);
                                }
                            }
                        }
                    }
                }
                for (p, sums) in acc.iter().enumerate().take(ow - x0) {
                    for (v, &sum) in sums.iter().enumerate() {
                        let o = ob * 32 + v * 16;
                        let mut value = sum;
                        if let Some(bias) = bias {
                            // SAFETY: 16 of the `c_out` biases.
                            value = _mm512_add_ps(value, unsafe {
                                _mm512_loadu_ps(bias[o..].as_ptr())
                            });
                        }
                        if let Some(act) = act {
                            // SAFETY: compiled for AVX-512F and DQ.
                            value = unsafe { act.apply(value) };
                        }
                        let at = y.wrapping_add(((n * c_out + o) * oh + oy) * ow + x0 + p);
                        // SAFETY: position x0 + p of row oy of output channels o..o + 16 of
                        // image n, this task's.
                        unsafe { _mm512_i32scatter_ps::<4>(at, planes, value) };
                    }
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn positions_rows(
    _: &Geometry,
    _: &[f32],
    _: &[f32],
    _: usize,
    _: std::ops::Range<usize>,
    _: Band,
    _: Option<&[f32]>,
    _: Option<InRegisters>,
    _: *mut f32,
) {
    unreachable!("the route table takes this kernel only on AVX-512")
}
