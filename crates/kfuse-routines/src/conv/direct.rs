//! Direct convolutions for f32 NCHW on AVX-512: an implicit-GEMM microkernel that reads its
//! input from a copy of the band's input rows, with no packing and no im2col. A strided
//! convolution runs on the copy split into phase planes (see `shifted::Grid`), where each tap
//! is again a fixed offset.
//!
//! The microkernel keeps an 8 output channel × 48 position block of sums in 24 vector
//! registers. For each input channel and tap it loads the three 16-wide input vectors once,
//! and multiplies them by each of the 8 weights, broadcast. All taps and channels are summed
//! before the block is stored. (The shifted-GEMM path instead stores and reloads the output
//! once per tap, and the `gemm` crate repacks the shifted input for each tap.) Weights are
//! packed once per call, with zeros for a last partial block.
//!
//! Two layouts of positions:
//! - **Same width** (output rows as wide as input rows, the usual "same" padding):
//!   positions are the output pixels of a band, `q = r * ow + x`, and tap `(i, j)` reads the
//!   band's copy of its input rows (copied whole, channel by channel) at
//!   `q + i * dh * ow + j * dw - pad_left`. Lanes whose tap falls outside the image (the
//!   padding, or the neighbouring row at either end of a row) are masked off their load, so
//!   no padding column is computed and the sums go straight to the output rows, which are
//!   contiguous within a band. Against the zero-bordered grid below, W7 measured 4.54–4.68 ms
//!   against 4.95–5.22 in alternating runs, W6b about 3% faster.
//! - **Otherwise**, as in [`super::shifted`], each task copies the input rows of its band
//!   into one zero-bordered plane per channel, `pw` wide, on which output pixel `(r, x)`
//!   sits at `q = r * pw + x` and its tap `(i, j)` reads `q + i * dh * pw + j * dw`; the
//!   block is stored to a staging tile over the padded grid whose valid pixels are copied
//!   out row by row.
//!
//! The bias (and ReLU, unless a residual comes before it) is applied in registers; the rest
//! of the epilogue (the residual, then the activation) runs over the stored rows. The
//! depthwise-separable block and its one-tap pointwise half use the same microkernel.
//! Storing each vector of the padded grid straight to the output with masked stores,
//! skipping the padding columns, measured slower in alternating runs: W6b 39.1 against
//! 36.8 ms, W7 5.17 against 4.94 ms.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::route::{self, Direct};
use super::shifted::Grid;
use super::{for_each_band_fitted, Geometry, Post};
use crate::constants;
use crate::dense::{has_avx512, with_scratch, with_shared_scratch, Out};
use crate::epilogue::{epilogue, epilogue_into};
use crate::prefetch::{ask_line, weights_ahead};
use crate::simd::InRegisters;
use std::sync::Arc;

/// Output channels per microkernel block.
pub(super) const OB: usize = 8;
/// 16-wide vectors of positions per microkernel block.
const NV: usize = 3;
/// Positions per microkernel block.
pub(super) const QB: usize = 16 * NV;
const _: () = assert!(
    QB == route::MICROKERNEL_POSITIONS,
    "the route table counts the microkernel's positions"
);

/// The convolution of `g` into `y`, with the epilogue, on the input layout the route table
/// picks ([`route::direct_layout`]). Call only where the table routes `g` to the direct kernel.
pub(super) fn conv(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
    match route::direct_layout(g) {
        Direct::NarrowPointwise | Direct::SameWidth => return conv_same_width(g, xs, ws, y, post),
        Direct::BroadcastPositions => return broadcast_positions(g, xs, ws, y, post),
        Direct::TapPlanes => {
            return conv_copied(g, xs, ws, y, post, &Copied::TapPlanes(TapPlanes::new(g)))
        }
        Direct::PhasePlanes | Direct::Bordered => {}
    }
    let [n_images, c_out, oh, ow] = g.y;
    let (in_registers, rest) = split(post, false);
    // An output too large to stay in the last-level cache is copied out of the stage with
    // non-temporal stores, which skip reading each line before overwriting it, where no part of
    // the epilogue is left for the copy.
    let stream = rest.is_empty() && std::mem::size_of_val(y) >= crate::STREAM_MIN_BYTES;
    let out = Out(y.as_mut_ptr());
    let og = g.out_channels_per_group();
    let band_rows = super::band_rows(n_images, oh, phase_row_bytes(g));
    let bands = oh.div_ceil(band_rows);
    let task = |t: usize| {
        let b = t % bands;
        (t / bands, b * band_rows..((b + 1) * band_rows).min(oh))
    };
    let pw = Grid::new(g).pw;
    // The rest of the epilogue is applied as each row is copied out.
    let sink =
        |_: usize, n: usize, band: &std::ops::Range<usize>, group, stage: &[f32], q_blocks| {
            for co in 0..og {
                let channel = group * og + co;
                for (r, row) in band.clone().enumerate() {
                    let src = &stage[co * q_blocks + r * pw..][..ow];
                    let at = ((n * c_out + channel) * oh + row) * ow;
                    // SAFETY: the rows of `band` of image n are this task's.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), ow) };
                    if stream {
                        // SAFETY: `stream` is set only on AVX-512.
                        unsafe { stream_copy(dst, src) };
                    } else {
                        epilogue_into(dst, src, rest.channel(channel, at, ow));
                    }
                }
            }
            if stream {
                // SAFETY: SSE is baseline on x86-64. Orders the streamed stores before the task
                // is reported done.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    _mm_sfence()
                };
            }
        };
    phase_planes(g, xs, ws, in_registers, n_images * bands, &task, &sink);
}

/// Output positions a block of [`broadcast_positions`] computes: seven along an output row.
const BP: usize = 7;

/// Output rows per task of [`broadcast_positions`].
const BP_ROWS: usize = 4;

/// A strided convolution ([`route::broadcasts_positions`]) with positions broadcast and output
/// channels in vectors: a block holds 7 output positions along a row × 32 output channels in
/// 14 registers, and for each input channel and tap loads two vectors of 32 weights and
/// broadcasts the 7 inputs its positions read (every second pixel of a row of a zero-padded
/// copy of the band's input rows), so that no phase planes are built, no position of a
/// padding column is computed, and no stage is copied out: each block's 7 × 32 results are
/// scattered straight to the output. The sums run over the channels and taps in the phase
/// planes' order, so the results are theirs bit for bit. `EPI=1 conv_shapes`, three
/// alternating runs: 8×128×56×56 → 128 at stride 2 5.22–5.35 → 4.50–4.52 ms, 8×64×56×56 → 128
/// 2.58–2.60 → 2.18–2.24; in ResNet-50's trace its 128 → 128 layer 5.83–5.97 → 4.75–4.86 ms.
/// (Twelve positions × 32 channels, 24 sums, took 5.41–5.61; fourteen × 32 and seven × 64, 28
/// sums, left too few registers and ran at half speed.)
fn broadcast_positions(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
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

/// The width of `g`'s phase planes: output row `r` of a band's stage starts `r` times this
/// into each channel's run (see [`Sink`]).
pub(super) fn phase_grid_width(g: &Geometry) -> usize {
    Grid::new(g).pw
}

/// Bytes of a band's copy and stage per output row on phase planes.
pub(super) fn phase_row_bytes(g: &Geometry) -> usize {
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    (cg + og) * Grid::new(g).pw * std::mem::size_of::<f32>()
}

/// Where a phase-plane band's output goes: `sink(t, n, rows, group, stage, q_blocks)` gets, for
/// task `t`, rows `rows` of image `n` for the output channels of `group`: the group's channel
/// `co`, row `r` of the band at `stage[co * q_blocks + r * pw..][..ow]` (`pw` the grid's
/// width), with the bias and ReLU (or a clamp) applied.
pub(super) type Sink<'a> =
    dyn Fn(usize, usize, &std::ops::Range<usize>, usize, &[f32], usize) + Sync + 'a;

/// The phase-plane path of [`conv`]: task `t` computes output rows `task(t).1` of image
/// `task(t).0` on a copy of the input rows they read, split into phase planes, into a stage,
/// one group at a time, and hands each group's stage to `sink`. `in_registers` is the part of
/// the epilogue the blocks apply (see [`split`]).
pub(super) fn phase_planes(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    in_registers: Post<f32>,
    tasks: usize,
    task: &(dyn Fn(usize) -> (usize, std::ops::Range<usize>) + Sync),
    sink: &Sink,
) {
    let ow = g.y[3];
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    let grid = Grid::new(g);
    let pw = grid.pw;
    let packed = pack(ws, g.groups, og, cg * grid.offsets.len());
    let per_group = packed.len() / g.groups;
    let threads = crate::Pool::global().threads();
    let [_, c_in, _, in_w] = g.x;
    crate::Pool::global().run(tasks, &|t| {
        let (n, band) = task(t);
        let rows = band.len();
        let ph = grid.rows(rows);
        // The band this thread is likely to take next (the threads claim tasks in turn): its
        // input rows are asked for into L2 as the blocks run, so that the next fill reads less
        // from memory. One thread, alternating runs: 8×128×56×56 → 128 at stride 2
        // 10.88–10.93 → 10.14–10.32 ms, the 7×7 stem 9.89–10.07 → 9.37–9.59.
        let ahead: Vec<&[f32]> = if t + threads < tasks {
            let (n2, band2) = task(t + threads);
            let (lo, hi) = g.rows_read(&band2);
            (0..c_in)
                .filter(|_| lo < hi)
                .map(|ch| &xs[g.x_offset(n2, ch, lo, 0)..][..(hi - lo) * in_w])
                .collect()
        } else {
            Vec::new()
        };
        // Positions computed: whole blocks covering the band's last valid pixel. Reads reach
        // `q_blocks - 1` past a tap's offset, at most `ph * pw + QB - 1` into its phase plane,
        // hence the plane's tail.
        let q = (rows - 1) * pw + ow;
        let q_blocks = q.div_ceil(QB) * QB;
        let plane = grid.phases() * ph * pw + QB;
        let offsets = &grid.tap_offsets(ph);
        let stage_rows = og.div_ceil(OB) * OB;
        with_scratch(
            cg * plane + stage_rows * q_blocks,
            |scratch: &mut [f32]| {
                let (xpad, stage) = scratch.split_at_mut(cg * plane);
                xpad.fill(0.0);
                for group in 0..g.groups {
                    grid.fill(g, xs, n, group, band.start, ph, plane, xpad);
                    let dst = Dst {
                        ptr: stage.as_mut_ptr(),
                        stride: q_blocks,
                        channels: og,
                        valid: q_blocks,
                    };
                    // SAFETY: the stage holds og rows of q_blocks and is this task's.
                    unsafe {
                        compute(
                            xpad,
                            plane,
                            offsets,
                            (
                                &packed[group * per_group..][..per_group],
                                weights_ahead(per_group),
                            ),
                            dst,
                            in_registers.bias.map(|b| &b[group * og..][..og]),
                            None,
                            InRegisters::of(in_registers.act),
                            false,
                            if group == 0 { &ahead } else { &[] },
                        )
                    };
                    sink(t, n, &band, group, stage, q_blocks);
                }
            },
        )
    });
}

/// The convolution of `g` into `y` where output rows are as wide as input rows: the module's
/// "same width" layout. A masked-off lane is not read at all, so rows of the band's copy
/// outside the image are never written or read. Reading `xs` directly instead of a copy (the
/// masks allow it) measured no faster than the zero-bordered grid on W7, 4.8–5.6 ms: the
/// microkernel then reads 64 channel planes 12.5 KB apart, from memory, where the copy puts
/// the band's planes next to each other in L2.
fn conv_same_width(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
    conv_copied(g, xs, ws, y, post, &Copied::Rows)
}

/// How [`conv_copied`] lays out a band's copy of its input.
enum Copied {
    /// Output rows as wide as input rows: the band's input rows, whole, one plane per channel
    /// ([`conv_same_width`]).
    Rows,
    /// A strided convolution on tap planes ([`TapPlanes`]).
    TapPlanes(TapPlanes),
}

/// A strided convolution's "tap planes": per band, each input channel is copied into one
/// plane per row phase `a` of the stride (those the filter rows read) and tap column `j`,
/// `ow` wide, plane `(a, j)` holding at `(R, x)` input pixel
/// `(R·sh + a - pad_top, x·sw + j·dw - pad_left)`, zero outside the image. Tap `(i, j)`, with `i·dh = u·sh + a`, reads output
/// pixel `(r, x)`'s input at `(r + u, x)` of plane `(a, j)`: a fixed offset on a grid exactly as
/// wide as the output, every lane inside it. So the blocks' positions are the output's own,
/// they store straight to the output rows, and a band's last few positions take the tail
/// kernel, as in [`conv_same_width`]. The copy is `kw / sw` times the input's pixels (those
/// of the row phases read: 1.5 times at 3×3 and stride 2, a quarter at 1×1 and stride 2).
struct TapPlanes {
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
    fn new(g: &Geometry) -> TapPlanes {
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
    fn planes(&self) -> usize {
        self.phases.len() * self.columns.len()
    }

    /// Rows each plane holds for a band of `rows` output rows.
    fn height(&self, rows: usize) -> usize {
        rows + self.rows.iter().map(|r| r.1).max().unwrap_or(0)
    }

    /// Per tap, row-major: its offset into a channel's planes of `height` rows of `ow`.
    fn offsets(&self, height: usize, ow: usize) -> Vec<isize> {
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
    fn fill(
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
                super::shifted::prefetch(&xs[next..][..(h_hi - h_lo) * in_w]);
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
                                super::shifted::every_nth(&mut dst[cols.clone()], src, sw);
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
    /// convolutions.
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
                super::shifted::prefetch(&xs[next..][..(h_hi - h_lo) * in_w]);
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

/// The convolution of `g` into `y` on a band's copy of its input laid out as `copied` says:
/// the blocks' positions are the band's output pixels, `q = r * ow + x`, stored straight to
/// the output rows.
fn conv_copied(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    post: Post<f32>,
    copied: &Copied,
) {
    let [n_images, c_out, oh, ow] = g.y;
    let [_, c_in, in_h, in_w] = g.x;
    assert!(xs.len() >= n_images * c_in * in_h * in_w);
    assert!(matches!(copied, Copied::TapPlanes(_)) || in_w == ow);
    let (in_registers, rest) = split(post, true);
    let residual = Residual::of(in_registers.residual, y);
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    let [dh, dw] = g.dilation;
    let [pt, pl] = g.pad;
    // (di, dj) per tap, row-major as the weights.
    let shifts: Vec<(isize, isize)> = (0..g.kh)
        .flat_map(|i| {
            (0..g.kw).map(move |j| {
                (
                    (i * dh) as isize - pt as isize,
                    (j * dw) as isize - pl as isize,
                )
            })
        })
        .collect();
    // Offsets into a band's copy, whose row 0 is input row `r0 - pad_top`.
    let offsets: Vec<isize> = shifts
        .iter()
        .map(|&(di, dj)| (di + pt as isize) * in_w as isize + dj)
        .collect();
    let packed = pack_tap_major(ws, g.groups, og, cg, shifts.len());
    let per_group = packed.len() / g.groups;
    // The weights asked for ahead where they stream from memory (`crate::prefetch`).
    let ahead = weights_ahead(per_group);
    let out = Out(y.as_mut_ptr());
    let all_blocks = og.div_ceil(OB);
    // Weights larger than this are read a block of output channels at a time, that block
    // running over every block of positions of the band: position blocks outside would read
    // every weight from L3 once per block of positions (8×512×7×7 → 512: 9.9 → see below).
    let weights_first = per_group * std::mem::size_of::<f32>() > BIG_WEIGHTS;
    // Output channel blocks `chans` of image `n`'s rows `band`.
    let job = |n: usize, band: std::ops::Range<usize>, chans: std::ops::Range<usize>| {
        let (r0, rows) = (band.start, band.len());
        let valid = rows * ow;
        // The input rows the band reads, `ph` from `r0 - pad_top`, one plane per channel. Rows
        // outside the image are left as they are: no lane reads them.
        let (ph, plane, offsets) = match copied {
            Copied::Rows => {
                let ph = rows + (g.kh - 1) * dh;
                (ph, ph * in_w + 16, offsets.clone())
            }
            Copied::TapPlanes(tp) => {
                let ph = tp.height(rows);
                (ph, tp.planes() * ph * ow + QB, tp.offsets(ph, ow))
            }
        };
        let (lo, hi) = (
            r0.saturating_sub(pt),
            (r0 + ph).saturating_sub(pt).min(in_h),
        );
        // Per block of QB positions and tap: which lanes of the block's vectors the tap may
        // read (the same for every group and channel).
        // Set a row's run of lanes at a time: a tap reads output row `rr`'s positions whose
        // column lands in the image, if its input row does. Testing each lane's row and column
        // (divided out of its position) took about 5% of W7's time.
        let blocks = valid.div_ceil(QB);
        let every = matches!(copied, Copied::TapPlanes(_));
        // On tap planes every lane reads a pixel of the copy.
        let mut masks = vec![[if every { u16::MAX } else { 0 }; NV]; blocks * shifts.len()];
        for (t, &(di, dj)) in shifts.iter().enumerate().filter(|_| !every) {
            let lo = (-dj).max(0) as usize;
            let hi = (in_w as isize - dj).clamp(0, ow as isize) as usize;
            for rr in 0..rows {
                if lo >= hi || !(0..in_h as isize).contains(&((r0 + rr) as isize + di)) {
                    continue;
                }
                let (mut q, end) = (rr * ow + lo, rr * ow + hi);
                while q < end {
                    // To the end of the run or of this vector of 16 lanes (QB is whole
                    // vectors), whichever comes first.
                    let stop = end.min((q / 16 + 1) * 16);
                    let bits = ((1u32 << (stop - q)) - 1) << (q % 16);
                    masks[q / QB * shifts.len() + t][q % QB / 16] |= bits as u16;
                    q = stop;
                }
            }
        }
        with_scratch(cg * plane, |xb: &mut [f32]| {
            for group in 0..g.groups {
                match copied {
                    Copied::Rows if lo < hi => {
                        for ci in 0..cg {
                            let src =
                                &xs[g.x_offset(n, group * cg + ci, lo, 0)..][..(hi - lo) * in_w];
                            xb[ci * plane + (lo + pt - r0) * in_w..][..src.len()]
                                .copy_from_slice(src);
                        }
                    }
                    Copied::Rows => {}
                    Copied::TapPlanes(tp) => tp.fill(g, xs, n, group, r0, ph, plane, xb),
                }
                let dst = Dst {
                    ptr: out
                        .ptr()
                        .wrapping_add(((n * c_out + group * og) * oh + r0) * ow),
                    stride: oh * ow,
                    channels: og,
                    valid,
                };
                let w = &packed[group * per_group..][..per_group];
                let bias = in_registers.bias.map(|b| &b[group * og..][..og]);
                let act = InRegisters::of(in_registers.act);
                let position_blocks = (0..valid).step_by(QB);
                let order: Vec<(usize, usize)> = if weights_first {
                    chans
                        .clone()
                        .flat_map(|b| position_blocks.clone().map(move |qb| (qb, b)))
                        .collect()
                } else {
                    position_blocks
                        .flat_map(|qb| chans.clone().map(move |b| (qb, b)))
                        .collect()
                };
                // The last block's input, gathered once for every block of output channels,
                // where it has few enough positions for the tail kernel.
                let last = (valid - 1) / QB * QB;
                let tail = (valid - last <= TAIL).then(|| {
                    let taps = Taps {
                        x: xb.as_ptr().wrapping_add(last),
                        plane,
                        offsets: &offsets,
                        masks: &masks[last / QB * shifts.len()..][..shifts.len()],
                    };
                    gather_tail(&taps, cg, valid - last)
                });
                // The band's columns (all but a tail block's), copied into contiguous runs where
                // one is larger than [`PACK_COLUMN`] and all of them fit in [`PACK_BAND`]: the
                // blocks of output channels then read them as one-tap blocks. 8×512×7×7 → 512
                // with bias and ReLU, the copy against none alternating in one process, median
                // paired time ratio over 31 rounds 0.90; 8×512×14×14 → 512 at stride 2 (tap
                // planes) 0.94; 8×256×28×28 → 256 at stride 2 0.97 (its 14×14 output's four
                // blocks of columns, 1.8 MB, now stay in place).
                let terms = shifts.len() * cg;
                let full = if tail.is_some() { last } else { valid };
                let column_bytes = terms * QB * std::mem::size_of::<f32>();
                let pack = chans.len() > 1
                    && column_bytes > PACK_COLUMN
                    && full.div_ceil(QB) * column_bytes <= PACK_BAND;
                let mut column = COLUMN.with(|c| std::mem::take(&mut *c.borrow_mut()));
                if pack {
                    let need = full.div_ceil(QB) * terms * NV;
                    if column.len() < need {
                        column.resize(need, Line([0.0; 16]));
                    }
                    for qb in (0..full).step_by(QB) {
                        let taps = Taps {
                            x: xb.as_ptr().wrapping_add(qb),
                            plane,
                            offsets: &offsets,
                            masks: &masks[qb / QB * shifts.len()..][..shifts.len()],
                        };
                        let at = qb / QB * terms * NV;
                        let vectors = (valid - qb).div_ceil(16).min(NV);
                        // SAFETY: the route table took this kernel only on AVX-512; the masks let through only lanes
                        // that read a pixel of the copy (see `masked_block` below).
                        unsafe {
                            gather_column(&taps, cg, vectors, &mut column[at..][..terms * NV])
                        };
                    }
                }
                for (qb, b) in order {
                    let finish = Finish {
                        bias: bias.map(|bias| {
                            std::array::from_fn(|o| bias.get(b * OB + o).copied().unwrap_or(0.0))
                        }),
                        residual,
                        act,
                        stream: false,
                    };
                    let part = Dst {
                        ptr: dst.ptr.wrapping_add(b * OB * dst.stride + qb),
                        stride: dst.stride,
                        channels: (og - b * OB).min(OB),
                        valid: valid - qb,
                    };
                    if let Some(r) = &residual {
                        r.prefetch(&part);
                    }
                    let per_block = terms * OB;
                    if pack && qb < full {
                        // SAFETY: the block's column, `terms * NV` lines of 16 floats, gathered
                        // above.
                        let col = unsafe {
                            std::slice::from_raw_parts(
                                column.as_ptr().add(qb / QB * terms * NV).cast::<f32>(),
                                terms * QB,
                            )
                        };
                        let w = &w[b * per_block..][..per_block];
                        // SAFETY: the route table took this kernel only on AVX-512; `block` checks its reads of the
                        // column and the weights (tap-major, as the column's terms), and its
                        // stores go to this task's rows, as `masked_block`'s below.
                        unsafe {
                            match (valid - qb).div_ceil(16) {
                                1 => block::<1>(col, QB, &[0], (w, ahead), terms, part, &finish),
                                2 => block::<2>(col, QB, &[0], (w, ahead), terms, part, &finish),
                                _ => block::<NV>(col, QB, &[0], (w, ahead), terms, part, &finish),
                            }
                        };
                        continue;
                    }
                    let taps = Taps {
                        x: xb.as_ptr().wrapping_add(qb),
                        plane,
                        offsets: &offsets,
                        masks: &masks[qb / QB * shifts.len()..][..shifts.len()],
                    };
                    // SAFETY: the route table took this kernel only on AVX-512. Every lane a mask lets through reads
                    // a pixel of this image's channels of the group (the masks test the row
                    // and column against the input's), so within `xs`; the stores go to rows
                    // r0.. of this group's output channels of image n, this task's alone.
                    unsafe {
                        let w = &w[b * per_block..][..per_block];
                        // A last partial block computes only the vectors its positions
                        // reach: a 7×7 image's 49 positions take 64, not 96; and up to
                        // [`TAIL`] positions take vectors of output channels.
                        if let (Some(xt), true) = (&tail, qb == last) {
                            match valid - qb {
                                1 => tail_block::<1, 8>(xt, w, part, &finish),
                                2 => tail_block::<2, 4>(xt, w, part, &finish),
                                3 => tail_block::<3, 3>(xt, w, part, &finish),
                                4 => tail_block::<4, 2>(xt, w, part, &finish),
                                5 => tail_block::<5, 1>(xt, w, part, &finish),
                                6 => tail_block::<6, 1>(xt, w, part, &finish),
                                _ => tail_block::<7, 1>(xt, w, part, &finish),
                            }
                            continue;
                        }
                        match (valid - qb).div_ceil(16) {
                            1 => masked_block::<1>(&taps, (w, ahead), cg, part, &finish),
                            2 => masked_block::<2>(&taps, (w, ahead), cg, part, &finish),
                            _ => masked_block::<NV>(&taps, (w, ahead), cg, part, &finish),
                        }
                    };
                }
                COLUMN.with(|c| *c.borrow_mut() = column);
                if !rest.is_empty() {
                    for co in chans.start * OB..(chans.end * OB).min(og) {
                        let channel = group * og + co;
                        let at = ((n * c_out + channel) * oh + r0) * ow;
                        // SAFETY: as above.
                        let rows =
                            unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), valid) };
                        epilogue(rows, rest.channel(channel, at, valid));
                    }
                }
            }
        });
    };
    // A band's copy of its input rows stays in L2 while each block of output channels reads it. Bands are trimmed to whole blocks of positions where a few rows
    // less get there (56-wide rows: 6 rows are 7 blocks).
    let pool = crate::Pool::global();
    if oh * ow <= SMALL_IMAGE && n_images < 4 * pool.threads() && all_blocks > 1 {
        // Small images, too few for the threads: each task takes a whole image and a share of
        // its output channels (1×512×7×7 → 512 in 7 bands of one row took 6.1 ms; each band
        // read every weight for 7 positions).
        let splits = (4 * pool.threads()).div_ceil(n_images).min(all_blocks);
        let per = all_blocks.div_ceil(splits);
        pool.run(n_images * splits, &|t| {
            let (n, part) = (t / splits, t % splits);
            let chans = part * per..((part + 1) * per).min(all_blocks);
            if !chans.is_empty() {
                job(n, 0..oh, chans);
            }
        });
        return;
    }
    let row_bytes = match copied {
        Copied::Rows => cg * in_w,
        Copied::TapPlanes(tp) => cg * tp.planes() * ow,
    } * std::mem::size_of::<f32>();
    for_each_band_fitted(
        n_images,
        oh,
        row_bytes,
        |rows| fit_rows(rows, ow, oh),
        &|n, band| job(n, band, 0..all_blocks),
    );
}

/// Bytes of a group's packed weights above which [`conv_same_width`] runs each block of output
/// channels over all of a band's positions (see there).
const BIG_WEIGHTS: usize = 512 << 10;

/// The most output pixels of an image that [`conv_same_width`] treats as small: whole images,
/// output channels split between tasks.
const SMALL_IMAGE: usize = 16 * 16;

/// The band height, at most `rows` rows (and more than half of them), whose bands of an
/// image of `oh` rows of `ow` cost the least in all, the last band being what is left: whole
/// blocks of [`QB`] positions take 24 fused multiply-adds per tap, channel and block of output
/// channels, a last partial block 8 per vector it reaches, or `P + 1` for the `P` positions of
/// a [`tail_block`] (its loads bound it). The largest height wins a tie.
///
/// - 7×7 images: 7 rows (48 positions and a tail of one) where 6 rows (42 positions in a
///   block of 48) and a band of one row were taken before the tail kernel (8×512×7×7 → 512,
///   its weights packed at each call: 7.2–7.7 → 5.8–6.2 ms; at batch 1 2.1–2.6 → 1.9–2.2 ms).
/// - 14×14 images: 14 rows (4 blocks and a tail of four) where the cost of the first band
///   alone picked 10 (and a band of 4 rows, 56 positions, to follow): ResNet-18's third
///   stage, 8×256×14×14 → 256 with bias and ReLU, per-step medians in the whole network over
///   three alternating runs, 4.54–4.75 → 4.30–4.49 ms.
fn fit_rows(rows: usize, ow: usize, oh: usize) -> usize {
    let band = |r: usize| {
        let p = r * ow;
        let rest = p % QB;
        let last = match rest {
            0 => 0,
            1..=TAIL => rest + 1,
            _ => rest.div_ceil(16) * 8,
        };
        p / QB * 24 + last
    };
    let image = |r: usize| oh / r * band(r) + band(oh % r);
    (rows.div_ceil(2).max(1)..=rows)
        .rev()
        .min_by_key(|&r| image(r))
        .unwrap_or(rows)
}

/// The input a [`masked_block`] reads: for tap `t`, input channel `c` and position `p` of the
/// block, `x + c * plane + offsets[t] + p`, in the lanes `masks[t]` lets through.
struct Taps<'a> {
    x: *const f32,
    plane: usize,
    offsets: &'a [isize],
    masks: &'a [[u16; NV]],
}

/// Weights `[group][out][channel][tap]` packed per group as `[block][tap][channel][OB]`, with
/// zeros past a group's last output channel: the order [`masked_block`] reads them in.
fn pack_tap_major(ws: &[f32], groups: usize, og: usize, cg: usize, taps: usize) -> Arc<Vec<f32>> {
    constants::packed(ws, [1, groups, og, cg, taps], || {
        pack_tap_major_afresh(ws, groups, og, cg, taps)
    })
}

/// [`pack_tap_major`], packed now.
fn pack_tap_major_afresh(ws: &[f32], groups: usize, og: usize, cg: usize, taps: usize) -> Vec<f32> {
    let blocks = og.div_ceil(OB);
    let k = cg * taps;
    let mut packed = vec![0.0f32; groups * blocks * k * OB];
    // Block `gb` (group gb / blocks): its output channels' weights, tap-major.
    let pack_block = |gb: usize, out: &mut [f32]| {
        let (group, b) = (gb / blocks, gb % blocks);
        for lane in 0..(og - b * OB).min(OB) {
            let o = b * OB + lane;
            for c in 0..cg {
                let row = &ws[((group * og + o) * cg + c) * taps..][..taps];
                for (t, &v) in row.iter().enumerate() {
                    out[(t * cg + c) * OB + lane] = v;
                }
            }
        }
    };
    // 512 → 512 channels' 3×3 weights took 1.2 ms on one thread while the other waited.
    pack_blocks(&mut packed, k * OB, &pack_block);
    packed
}

/// Weights `[group][out][k]` (`k` = channel × tap) packed per group as `[block][k][OB]`, with
/// zeros past a group's last output channel; kept for the next call where `ws` is a registered
/// constant ([`constants`]).
pub(super) fn pack(ws: &[f32], groups: usize, og: usize, k: usize) -> Arc<Vec<f32>> {
    constants::packed(ws, [0, groups, og, k, 0], || pack_afresh(ws, groups, og, k))
}

/// [`pack`], packed now.
fn pack_afresh(ws: &[f32], groups: usize, og: usize, k: usize) -> Vec<f32> {
    let blocks = og.div_ceil(OB);
    let mut packed = vec![0.0f32; groups * blocks * k * OB];
    let pack_block = |gb: usize, out: &mut [f32]| {
        let (group, b) = (gb / blocks, gb % blocks);
        for lane in 0..(og - b * OB).min(OB) {
            let row = &ws[(group * og + b * OB + lane) * k..][..k];
            for (kk, &v) in row.iter().enumerate() {
                out[kk * OB + lane] = v;
            }
        }
    };
    // The 960 × 160 weights of MobileNetV2's last stage took 44 µs a call on one thread,
    // while the other waited.
    pack_blocks(&mut packed, k * OB, &pack_block);
    packed
}

/// Fills `packed`, blocks of `len` elements, with `pack_block(b, block)`: large weights on
/// every thread, a share of the blocks each, fewer than [`PACK_ALONE`] elements on the calling
/// thread alone.
fn pack_blocks(packed: &mut [f32], len: usize, pack_block: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let pool = crate::Pool::global();
    if packed.len() < PACK_ALONE || pool.threads() == 1 {
        for (b, out) in packed.chunks_exact_mut(len).enumerate() {
            pack_block(b, out);
        }
        return;
    }
    let blocks = packed.len() / len;
    let per_task = blocks.div_ceil(pool.threads());
    let shared = Out(packed.as_mut_ptr());
    pool.run(pool.threads(), &|t| {
        for b in t * per_task..((t + 1) * per_task).min(blocks) {
            // SAFETY: block b's `len` elements are this task's alone.
            let out = unsafe { std::slice::from_raw_parts_mut(shared.ptr().add(b * len), len) };
            pack_block(b, out);
        }
    });
}

/// Packed weights of fewer elements than this are packed by the calling thread alone.
const PACK_ALONE: usize = 64 << 10;

/// One group's output: channel `o < dst.channels` at position `q < dst.valid` gets the sum over
/// input channels `c` and taps `t` of its packed weight times `x[c * plane + offsets[t] + q]`,
/// plus the bias, then the residual's element, then `act`; stored non-temporally where
/// `stream` (the caller then
/// fences). `block` checks that `x` holds what this reads (whole blocks of [`QB`] positions).
/// The cache lines of `ahead` (the input of a band to come) are asked for a few at a time as
/// the blocks run.
///
/// With several taps and a column (a block of positions' inputs over every channel and tap)
/// larger than [`PACK_COLUMN`], each block of positions' column is first copied into one
/// contiguous run, which every block of output channels then reads as a one-tap block: read in
/// place, the column is `channels × taps` short runs a plane apart, which the hardware
/// prefetchers do not follow from L2 (see [`PACK_COLUMN`]).
///
/// # Safety
/// The elements `dst` addresses must be writable and this thread's alone.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn compute(
    x: &[f32],
    plane: usize,
    offsets: &[usize],
    (packed, w_ahead): (&[f32], usize),
    dst: Dst,
    bias: Option<&[f32]>,
    residual: Option<Residual>,
    act: Option<InRegisters>,
    stream: bool,
    ahead: &[&[f32]],
) {
    let blocks = dst.channels.div_ceil(OB);
    let per_block = packed.len() / blocks;
    let taps = offsets.len();
    let channels = per_block / (taps * OB);
    let lines = std::cell::RefCell::new(Lines::new(ahead));
    let calls = dst.valid.div_ceil(QB) * blocks;
    let per_call = lines.borrow().total().div_ceil(calls.max(1));
    assert!(has_avx512());
    // Block b of output channels at positions qb.., reading `sums` terms of `x` laid out as
    // `plane` and `offsets` say.
    let run_to = |qb: usize,
                  end: usize,
                  b: usize,
                  x: &[f32],
                  plane: usize,
                  offsets: &[usize],
                  sums: usize| {
        lines.borrow_mut().ask(per_call);
        let w = &packed[b * per_block..][..per_block];
        let finish = Finish {
            bias: bias
                .map(|bias| std::array::from_fn(|o| bias.get(b * OB + o).copied().unwrap_or(0.0))),
            residual,
            act,
            stream,
        };
        let part = Dst {
            ptr: dst.ptr.wrapping_add(b * OB * dst.stride + qb),
            stride: dst.stride,
            channels: (dst.channels - b * OB).min(OB),
            valid: end - qb,
        };
        if let Some(r) = &residual {
            r.prefetch(&part);
        }
        // SAFETY: the CPU has AVX-512 (asserted); `block` checks its reads, and its writes
        // are among those the caller vouches for. A last partial block computes only the
        // vectors its positions reach: a 7×7 image's 49 positions take 64, not 96.
        unsafe {
            match (end - qb).div_ceil(16) {
                1 => block::<1>(x, plane, offsets, (w, w_ahead), sums, part, &finish),
                2 => block::<2>(x, plane, offsets, (w, w_ahead), sums, part, &finish),
                _ => block::<NV>(x, plane, offsets, (w, w_ahead), sums, part, &finish),
            }
        };
    };
    let run = |qb: usize, b: usize, x: &[f32], plane: usize, offsets: &[usize], sums: usize| {
        run_to(qb, dst.valid, b, x, plane, offsets, sums)
    };
    // An output to be streamed that starts off a cache line (a buffer from an allocator
    // that does not align it: glibc puts large ones 16 bytes past a page) takes the
    // positions up to the next line first, as a partial block stored ordinarily, so that
    // the columns after it start on lines and stream. Only whole lines of the output's
    // own positions are then streamed: a line it shares with another task's positions
    // gets ordinary stores from both.
    //
    // The head shifts the blocks after it, so that the last one may read up to 15 positions
    // past those of the whole blocks of `QB` from position 0; it is taken only where the input
    // holds them (`pointwise_bands` leaves room past its tiles).
    let off_line = (dst.ptr as usize) % 64;
    let shifted_reach = |head: usize| {
        let last = offsets.iter().max().copied().unwrap_or(0);
        channels.saturating_sub(1) * plane + last + head + (dst.valid - head).div_ceil(16) * 16
    };
    let head = match ((64 - off_line) % 64 / 4).min(dst.valid) {
        head if stream
            && off_line.is_multiple_of(4)
            && dst.stride.is_multiple_of(16)
            && shifted_reach(head) <= x.len() =>
        {
            head
        }
        _ => 0,
    };
    if head > 0 {
        for b in 0..blocks {
            run_to(0, head, b, x, plane, offsets, channels);
        }
    }
    // A one-tap (pointwise) column: its whole blocks of channels in one call, without the
    // per-block setup of `run`.
    if taps == 1 {
        let whole = dst.channels / OB;
        let column = Column {
            plane,
            channels,
            weights: packed.as_ptr(),
            blocks: whole,
            stride: dst.stride,
            bias: bias.map(<[f32]>::as_ptr),
            residual,
            act,
            stream: stream
                && (dst.ptr.wrapping_add(head) as usize).is_multiple_of(64)
                && dst.stride.is_multiple_of(16),
            per_block: per_call,
            ahead: w_ahead,
        };
        assert!(packed.len() >= whole * per_block);
        assert!(bias.is_none_or(|b| b.len() >= whole * OB));
        for qb in (head..dst.valid).step_by(QB) {
            let mut first = 0;
            if dst.valid - qb >= QB && whole > 0 {
                let at = offsets[0] + qb;
                assert!(x.len() >= channels.saturating_sub(1) * plane + at + QB);
                // SAFETY: the CPU has AVX-512 (asserted); the column's reads are in bounds
                // by the assertions above, and its writes among those the caller vouches
                // for.
                unsafe {
                    pointwise_column(
                        &column,
                        x.as_ptr().add(at),
                        dst.ptr.wrapping_add(qb),
                        &mut lines.borrow_mut(),
                    )
                };
                first = whole;
            }
            for b in first..blocks {
                run(qb, b, &x[qb..], plane, offsets, channels);
            }
        }
        return;
    }
    // Several taps: a column that fits in L1 (or read by one block) is read in place.
    if blocks == 1 || channels * taps * QB * std::mem::size_of::<f32>() <= PACK_COLUMN {
        for qb in (head..dst.valid).step_by(QB) {
            for b in 0..blocks {
                run(qb, b, &x[qb..], plane, offsets, channels);
            }
        }
        return;
    }
    COLUMN.with(|column| {
        let mut column = column.borrow_mut();
        let lines_needed = channels * taps * QB / 16;
        if column.len() < lines_needed {
            column.resize(lines_needed, Line([0.0; 16]));
        }
        // SAFETY: `Line` is 16 f32 values, so the buffer holds `lines_needed * 16` of them.
        let col = unsafe {
            std::slice::from_raw_parts_mut(column.as_mut_ptr().cast::<f32>(), lines_needed * 16)
        };
        for qb in (head..dst.valid).step_by(QB) {
            // The vectors the blocks read: whole ones up to the last valid position.
            let lanes = (dst.valid - qb).div_ceil(16).min(NV) * 16;
            // Term `c * taps + t`, as the weights are packed ([c][t][o]), at `col[term * QB]`.
            for c in 0..channels {
                for (t, &off) in offsets.iter().enumerate() {
                    let at = c * plane + off + qb;
                    col[(c * taps + t) * QB..][..lanes].copy_from_slice(&x[at..at + lanes]);
                }
            }
            for b in 0..blocks {
                run(qb, b, col, QB, &[0], channels * taps);
            }
        }
    })
}

/// Columns of more bytes than this (a block of positions over every channel and tap) are
/// copied into one contiguous run before the blocks of output channels read them
/// ([`compute`]); smaller ones stay in L1 between those blocks. `conv::conv2d` alone with bias
/// and ReLU, 3×3 at stride 2 on phase planes, the copy against none alternating in one
/// process, median paired time ratio over 31 rounds: 8×128×56×56 → 128 (a column of 221 KB)
/// 0.87–0.89, 8×64×56×56 → 128 0.89; the stem, 8×3×224×224 → 64 at 7×7 (28 KB), 1.03–1.04
/// slower.
const PACK_COLUMN: usize = 32 << 10;

/// The most bytes of a band's columns [`conv_copied`] copies into contiguous runs at once.
const PACK_BAND: usize = 1 << 20;

thread_local! {
    /// Each thread's contiguous copy of a column for [`compute`].
    static COLUMN: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether a pointwise projection asks for the next band's input as it runs (see
/// `pointwise_bands`): everywhere but on Intel CPUs. On the Intel reference host (Emerald
/// Rapids), W6a's fused block with and without the prefetches alternating in one process, 30
/// rounds, median paired ratio without over with: 0.957, 0.964 and 0.991, and 0.958–0.983 in
/// an earlier session; with the order swapped, with over without: 1.033, 1.033, 1.043.
/// Sampled, the prefetches moved about 5% of the block's time out of the depthwise fill and
/// into the projection, whose streamed stores they compete with for the core's line fill
/// buffers; spread four or eight times thinner (every fourth or eighth line, for the L2
/// streamer to follow), they still cost 2–6%.
fn prefetches_ahead() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        !*INTEL.get_or_init(|| {
            let id = std::arch::x86_64::__cpuid(0);
            [id.ebx, id.edx, id.ecx]
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .eq(*b"GenuineIntel")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    true
}

/// A cache line of floats, so that a buffer of them is aligned to lines.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([f32; 16]);

/// The cache lines of some slices, asked for (into L2) a few at a time.
struct Lines<'a> {
    ranges: &'a [&'a [f32]],
    range: usize,
    at: usize,
}

impl<'a> Lines<'a> {
    fn new(ranges: &'a [&'a [f32]]) -> Self {
        let at = ranges.first().map_or(0, |r| r.as_ptr() as usize & !63);
        Lines {
            ranges,
            range: 0,
            at,
        }
    }

    /// Lines in all (at most).
    fn total(&self) -> usize {
        self.ranges
            .iter()
            .map(|r| std::mem::size_of_val(*r) / 64 + 2)
            .sum()
    }

    /// Asks for the next `count` lines.
    #[inline(always)]
    fn ask(&mut self, mut count: usize) {
        while count > 0 && self.range < self.ranges.len() {
            let r = self.ranges[self.range];
            if self.at >= r.as_ptr() as usize + std::mem::size_of_val(r) {
                self.range += 1;
                if let Some(next) = self.ranges.get(self.range) {
                    self.at = next.as_ptr() as usize & !63;
                }
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch reads nothing architecturally.
            unsafe {
                _mm_prefetch::<_MM_HINT_T1>(self.at as *const i8)
            };
            self.at += 64;
            count -= 1;
        }
    }
}

/// `dst = src`, the whole 64-byte lines of `dst` stored non-temporally.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_copy(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    // Elements before the first 64-byte boundary of `dst`.
    let head = ((64 - (dst.as_ptr() as usize) % 64) % 64 / 4).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let mut i = head;
    while i + 16 <= n {
        // SAFETY: 16 elements of each from i; dst + i is 64-byte aligned.
        unsafe {
            _mm512_stream_ps(
                dst.as_mut_ptr().add(i),
                _mm512_loadu_ps(src.as_ptr().add(i)),
            )
        };
        i += 16;
    }
    dst[i..n].copy_from_slice(&src[i..n]);
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    dst[..n].copy_from_slice(&src[..n]);
}

/// What a block applies to its sums in registers before storing them.
struct Finish {
    /// One value per output channel of the block, added.
    bias: Option<[f32; OB]>,
    /// Then the residual's element at each stored position.
    residual: Option<Residual>,
    /// Then this activation.
    act: Option<InRegisters>,
    /// Whole 64-byte-aligned vectors are stored non-temporally.
    stream: bool,
}

/// A residual added in registers: it has the output's shape, so the element for the output
/// element at `p` has the same index from `base` as `p` from the output's start, `out`.
#[derive(Clone, Copy)]
pub(super) struct Residual {
    base: *const f32,
    out: usize,
}

impl Residual {
    /// The residual `residual` of the output `y`, if any.
    pub(super) fn of(residual: Option<&[f32]>, y: &[f32]) -> Option<Residual> {
        residual.map(|r| {
            assert!(r.len() >= y.len(), "a residual has the output's shape");
            Residual {
                base: r.as_ptr(),
                out: y.as_ptr() as usize,
            }
        })
    }

    /// The residual's element for the output element at `p`.
    pub(super) fn at(&self, p: *const f32) -> *const f32 {
        self.base
            .wrapping_add((p as usize - self.out) / std::mem::size_of::<f32>())
    }

    /// Asks for the residual's elements of the block `dst` addresses (into L1), before the
    /// block's sums are computed: its store reads them one channel's run at a time, which the
    /// hardware prefetchers do not follow.
    #[inline(always)]
    fn prefetch(&self, dst: &Dst) {
        let start = self.at(dst.ptr);
        let len = dst.valid.min(QB);
        for o in 0..dst.channels.min(OB) {
            let row = start.wrapping_add(o * dst.stride) as usize;
            for line in (row & !63..row + len * std::mem::size_of::<f32>()).step_by(64) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch reads nothing architecturally.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(line as *const i8)
                };
            }
        }
    }
}

// SAFETY: a residual is only read, at the elements of outputs the tasks are given, while the
// call that made it runs.
unsafe impl Send for Residual {}
// SAFETY: as above.
unsafe impl Sync for Residual {}

/// Splits an epilogue into what the microkernel applies in registers and the rest, applied
/// to the stored rows: the bias, the residual where `residual_in_registers` (the blocks
/// store straight to the output) and, when nothing is left between, ReLU, a clamp or
/// hard-swish. The residual added in registers saves a second pass over each band's output,
/// and lets an output of 16 MiB and more go out with non-temporal stores. ResNet-50's 1×1
/// convolutions with their shortcut, per-step medians in the whole network, alternating
/// builds: 8×64×56×56 → 256 (25.7 MB, now streamed) 2.82–2.89 → 2.38–2.46 ms, 8×128×28×28 →
/// 512 2.37–2.45 → 2.05–2.10, 8×256×14×14 → 1024 2.31–2.42 → 2.27–2.32, 8×512×7×7 → 2048
/// alike. Each block asks for its residual before computing its sums
/// ([`Residual::prefetch`]): without that, the stores waited on the residual's loads, and
/// the 28×28 step took 2.81–2.89 ms.
pub(super) fn split(post: Post<f32>, residual_in_registers: bool) -> (Post<f32>, Post<f32>) {
    let residual_here = residual_in_registers || post.residual.is_none();
    let act_in_registers = InRegisters::of(post.act).is_some() && residual_here;
    let in_registers = Post {
        bias: post.bias,
        residual: post.residual.filter(|_| residual_in_registers),
        act: if act_in_registers { post.act } else { None },
    };
    let rest = Post {
        bias: None,
        residual: post.residual.filter(|_| !residual_in_registers),
        act: if act_in_registers { None } else { post.act },
    };
    (in_registers, rest)
}

/// Where sums go: output channel `o`, position `q` is `ptr + o * stride + q`, stored for `o <
/// channels` and `q < valid`.
#[derive(Clone, Copy)]
pub(super) struct Dst {
    pub ptr: *mut f32,
    pub stride: usize,
    pub channels: usize,
    pub valid: usize,
}

/// One block of `V` vectors: output channel `o`, position `p` gets `finish(sum over channels c
/// and taps t of w[c][t][o] * x[c * plane + offsets[t] + p])`, for `p < 16 V`, stored as `dst`
/// says (its `channels` at most `OB`).
///
/// # Safety
/// The CPU must have AVX-512F and DQ, and the elements `dst` addresses must be writable and this
/// thread's alone. `x` and `w` are checked to hold `(cg - 1) * plane + max(offsets) + 16 V`
/// and `cg * taps * OB` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const V: usize>(
    x: &[f32],
    plane: usize,
    offsets: &[usize],
    (w, ahead): (&[f32], usize),
    cg: usize,
    dst: Dst,
    finish: &Finish,
) {
    let taps = offsets.len();
    let reach = offsets.iter().max().copied().unwrap_or(0) + 16 * V;
    assert!(x.len() >= (cg - 1) * plane + reach && w.len() >= cg * taps * OB);
    let mut acc = [[_mm512_setzero_ps(); V]; OB];
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    if let [off] = *offsets {
        // One tap (a pointwise convolution): the channel loop alone, on running pointers
        // (the general loop's tap loop and offset multiply cost W6a's block 3–5%).
        // SAFETY: in bounds by the assertions above.
        unsafe {
            let (mut at, mut wt) = (xp.add(off), wp);
            for _ in 0..cg {
                step(&mut acc, at, wt, ahead);
                at = at.add(plane);
                wt = wt.add(OB);
            }
            return store(acc, dst, finish);
        }
    }
    for c in 0..cg {
        for (t, &off) in offsets.iter().enumerate() {
            // SAFETY: in bounds by the assertions above.
            unsafe {
                step(
                    &mut acc,
                    xp.add(c * plane + off),
                    wp.add((c * taps + t) * OB),
                    ahead,
                );
            }
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { store(acc, dst, finish) }
}

/// What every block of a pointwise column shares ([`pointwise_column`]).
struct Column {
    /// Elements between one input channel's positions and the next one's.
    plane: usize,
    /// Input channels.
    channels: usize,
    /// The packed weights of the blocks, `channels * OB` each (`[c][o]`).
    weights: *const f32,
    /// Whole blocks of `OB` output channels.
    blocks: usize,
    /// Elements between one output channel's positions and the next one's.
    stride: usize,
    /// One value per output channel, added.
    bias: Option<*const f32>,
    residual: Option<Residual>,
    act: Option<InRegisters>,
    /// Non-temporal stores (the output then 64-byte aligned, `stride` a multiple of 16).
    stream: bool,
    /// Lines of the next band's input asked for per block.
    per_block: usize,
    /// How far ahead the weights are asked for ([`weights_ahead`]).
    ahead: usize,
}

/// The whole blocks of output channels of one column of [`QB`] positions of a pointwise
/// convolution (its input at `x`, output channel `o` position `q` at `dst + o * stride + q`),
/// one block after another in one loop: the bias, residual and activation are chosen once
/// for the column, each block's sums stay in registers and go out through [`store_each`].
/// Calling [`block`] per block, with its `Finish` and `Dst` built and its checks run each
/// time, took 6–7% more of W6a's fused block (paired in one process: new over old 0.932,
/// 0.937, 0.942).
///
/// # Safety
/// The CPU must have AVX-512F and DQ; `x` must be readable for `(channels - 1) * plane + QB`
/// elements, the weights (and bias) for `blocks` blocks, and the output (and residual)
/// elements of the blocks must be writable (readable) and this thread's alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn pointwise_column(col: &Column, x: *const f32, dst: *mut f32, lines: &mut Lines) {
    // One arm per epilogue shape, so that each loop is compiled for it.
    macro_rules! acts {
        ($bias:literal, $res:literal) => {
            match col.act {
                None => pointwise_blocks::<$bias, $res>(col, x, dst, lines, |v| v),
                Some(InRegisters::Relu) => {
                    pointwise_blocks::<$bias, $res>(col, x, dst, lines, |v| {
                        InRegisters::Relu.apply(v)
                    })
                }
                Some(InRegisters::Clamp { lo, hi }) => {
                    pointwise_blocks::<$bias, $res>(col, x, dst, lines, |v| {
                        InRegisters::Clamp { lo, hi }.apply(v)
                    })
                }
                Some(InRegisters::HardSwish { divide_last }) => {
                    pointwise_blocks::<$bias, $res>(col, x, dst, lines, |v| {
                        InRegisters::HardSwish { divide_last }.apply(v)
                    })
                }
            }
        };
    }
    // SAFETY (all arms): forwarded from the caller, whose features `apply` runs with.
    unsafe {
        match (col.bias.is_some(), col.residual.is_some()) {
            (false, false) => acts!(false, false),
            (true, false) => acts!(true, false),
            (false, true) => acts!(false, true),
            (true, true) => acts!(true, true),
        }
    }
}

/// [`pointwise_column`] with its bias and residual known at compile time.
///
/// # Safety
/// As for [`pointwise_column`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pointwise_blocks<const BIAS: bool, const RES: bool>(
    col: &Column,
    x: *const f32,
    dst: *mut f32,
    lines: &mut Lines,
    act: impl Fn(__m512) -> __m512,
) {
    let cg = col.channels;
    for b in 0..col.blocks {
        lines.ask(col.per_block);
        let part = Dst {
            ptr: dst.wrapping_add(b * OB * col.stride),
            stride: col.stride,
            channels: OB,
            valid: QB,
        };
        let residual = match col.residual {
            Some(r) if RES => {
                r.prefetch(&part);
                r.at(part.ptr)
            }
            _ => std::ptr::null(),
        };
        let mut acc = [[_mm512_setzero_ps(); NV]; OB];
        // SAFETY: in bounds as the caller vouches.
        unsafe {
            let (mut at, mut wt) = (x, col.weights.add(b * cg * OB));
            for _ in 0..cg {
                step(&mut acc, at, wt, col.ahead);
                at = at.add(col.plane);
                wt = wt.add(OB);
            }
            let bias: [f32; OB] = match col.bias {
                Some(bias) if BIAS => std::array::from_fn(|o| *bias.add(b * OB + o)),
                _ => [0.0; OB],
            };
            store_each::<NV, BIAS, RES>(acc, part, col.stream, &bias, residual, &act);
        }
    }
}

/// One term of a block's sums: `V` vectors of positions from `x`, each times the `OB` weights
/// at `w` (one broadcast each), added to the sums in registers. Always inlined into the
/// (AVX-512) blocks, whose features it takes, as [`store_each`] is.
///
/// # Safety
/// The CPU must have AVX-512F; `x` must be readable for `16 V` elements and `w` for `OB`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step<const V: usize>(
    acc: &mut [[__m512; V]; OB],
    x: *const f32,
    w: *const f32,
    ahead: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        // The weights `ahead` on, on their way from memory (see `crate::prefetch`); with
        // `ahead` 0, the line about to be read, at the cost of the hint alone.
        ask_line(w.wrapping_add(ahead));
        let xv: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(x.add(16 * v)));
        for (o, row) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(*w.add(o));
            for (a, xv) in row.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(wv, *xv, *a);
            }
        }
    }
}

/// A block's sums, finished (bias, activation) and stored as `dst` says.
///
/// Always inlined into the (AVX-512) blocks, so that their sums stay in registers: a call
/// would pass the 24 of them through memory (a `#[target_feature]` function cannot be
/// `#[inline(always)]`, so this one has no features of its own and takes its callers'). A whole
/// block is stored by straight-line code, one form per bias and activation chosen before any
/// sum is touched; a partial one (a band's last positions, a last block of channels) goes out
/// of line. The loop this replaced tested the bias and activation at each vector, kept the sums
/// in memory, and took a tenth of the time of a 64-channel pointwise block; with the one-tap
/// loop in [`block`], `kfuse bench W6a` went from 4.52–4.57 to 4.15–4.21 ms and W6b from
/// 19.9–20.8 to 19.2–19.5 ms, alternating builds.
///
/// # Safety
/// The CPU must have AVX-512F and DQ; the elements `dst` addresses must be writable and this
/// thread's alone.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store<const V: usize>(acc: [[__m512; V]; OB], dst: Dst, finish: &Finish) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if dst.channels == OB && dst.valid >= 16 * V {
            let zeros = [0.0; OB];
            match (&finish.bias, finish.residual.is_some()) {
                (Some(bias), false) => store_whole::<true, false, V>(acc, dst, bias, finish),
                (None, false) => store_whole::<false, false, V>(acc, dst, &zeros, finish),
                (Some(bias), true) => store_whole::<true, true, V>(acc, dst, bias, finish),
                (None, true) => store_whole::<false, true, V>(acc, dst, &zeros, finish),
            }
        } else {
            store_partial::<V>(&acc, dst, finish)
        }
    }
}

/// [`store`] for a whole block: `bias` added where `BIAS`, then the residual where `RES`,
/// then the activation.
///
/// # Safety
/// As for [`store`], and where `RES` the residual's elements for the block must be readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_whole<const BIAS: bool, const RES: bool, const V: usize>(
    acc: [[__m512; V]; OB],
    dst: Dst,
    bias: &[f32; OB],
    finish: &Finish,
) {
    // The residual's elements of the block (a null pointer, never read, where not `RES`).
    let residual = finish.residual.map_or(std::ptr::null(), |r| r.at(dst.ptr));
    // Streamed only when every vector is 64-byte aligned, so that the stores are straight-line.
    let stream =
        finish.stream && (dst.ptr as usize).is_multiple_of(64) && dst.stride.is_multiple_of(16);
    // Each arm names its activation's variant, so that its match folds away.
    // SAFETY (all arms): forwarded from the caller, whose features `apply` runs with.
    unsafe {
        match finish.act {
            None => store_each::<V, BIAS, RES>(acc, dst, stream, bias, residual, |v| v),
            Some(InRegisters::Relu) => {
                store_each::<V, BIAS, RES>(acc, dst, stream, bias, residual, |v| {
                    InRegisters::Relu.apply(v)
                })
            }
            Some(InRegisters::Clamp { lo, hi }) => {
                store_each::<V, BIAS, RES>(acc, dst, stream, bias, residual, |v| {
                    InRegisters::Clamp { lo, hi }.apply(v)
                })
            }
            Some(InRegisters::HardSwish { divide_last }) => {
                store_each::<V, BIAS, RES>(acc, dst, stream, bias, residual, |v| {
                    InRegisters::HardSwish { divide_last }.apply(v)
                })
            }
        }
    }
}

/// Stores `act(sum + bias + residual)` of every sum of a whole block, the bias added where
/// `BIAS`, the residual's element (from `residual`, laid out as the block) where `RES`;
/// non-temporally where `stream` (every vector then 64-byte aligned). The adds are written
/// here, not in a closure: a closure that loads may not be inlined, and then runs without
/// the block's target features (every intrinsic a call: ResNet-50's 1×1 convolutions with
/// their shortcut took three times as long).
///
/// # Safety
/// As for [`store`], with the whole block's elements writable, and where `RES` the
/// residual's elements of the block readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_each<const V: usize, const BIAS: bool, const RES: bool>(
    acc: [[__m512; V]; OB],
    dst: Dst,
    stream: bool,
    bias: &[f32; OB],
    residual: *const f32,
    act: impl Fn(__m512) -> __m512,
) {
    // Written out for each output channel: a loop over them kept the sums in memory.
    macro_rules! channel {
        ($($o:literal)*) => {$(
            for v in 0..V {
                let mut value = acc[$o][v];
                if BIAS {
                    value = _mm512_add_ps(value, _mm512_set1_ps(bias[$o]));
                }
                if RES {
                    let r = residual.wrapping_add($o * dst.stride + 16 * v);
                    // SAFETY: the caller vouches for the residual's elements of the block.
                    value = _mm512_add_ps(value, unsafe { _mm512_loadu_ps(r) });
                }
                let value = act(value);
                let at = dst.ptr.wrapping_add($o * dst.stride + 16 * v);
                // SAFETY: the caller vouches for these positions of these channels, and for
                // their alignment where `stream`.
                unsafe {
                    if stream {
                        _mm512_stream_ps(at, value);
                    } else {
                        _mm512_storeu_ps(at, value);
                    }
                }
            }
        )*};
    }
    const _: () = assert!(OB == 8);
    channel!(0 1 2 3 4 5 6 7);
}

/// [`store`] for a partial block: the channels below `dst.channels`, the positions below
/// `dst.valid`.
///
/// # Safety
/// As for [`store`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
#[inline(never)]
unsafe fn store_partial<const V: usize>(acc: &[[__m512; V]; OB], dst: Dst, finish: &Finish) {
    for (o, row) in acc.iter().enumerate().take(dst.channels) {
        for (v, a) in row.iter().enumerate() {
            let lanes = dst.valid.saturating_sub(16 * v).min(16);
            let mut value = *a;
            if let Some(bias) = &finish.bias {
                value = _mm512_add_ps(value, _mm512_set1_ps(bias[o]));
            }
            if let Some(r) = finish.residual {
                let at = r.at(dst.ptr).wrapping_add(o * dst.stride + 16 * v);
                let mask = ((1u32 << lanes) - 1) as __mmask16;
                // SAFETY: the caller vouches for the residual's elements of the positions
                // below `valid`, the lanes the mask keeps.
                value = _mm512_add_ps(value, unsafe { _mm512_maskz_loadu_ps(mask, at) });
            }
            if let Some(act) = finish.act {
                // SAFETY: compiled for AVX-512F and DQ.
                value = unsafe { act.apply(value) };
            }
            // SAFETY: the caller vouches for positions below `valid` of these channels.
            unsafe {
                let at = dst.ptr.wrapping_add(o * dst.stride + 16 * v);
                if lanes == 16 && finish.stream && (at as usize).is_multiple_of(64) {
                    _mm512_stream_ps(at, value);
                } else if lanes == 16 {
                    _mm512_storeu_ps(at, value);
                } else if lanes > 0 {
                    _mm512_mask_storeu_ps(at, ((1u32 << lanes) - 1) as __mmask16, value);
                }
            }
        }
    }
}

/// One block of the same-width convolution: output channel `o`, position `p` gets
/// `finish(sum over taps t and channels c of w[t][c][o] * x[c][offsets[t] + p])`, the input
/// read through the taps' masks (lanes masked off count as zero and are not read), stored as
/// `dst` says. Taps outside, channels inside: a tap's three masks stay in mask registers while
/// the channels run.
///
/// # Safety
/// The CPU must have AVX-512F and DQ; every lane the masks let through must be readable; the
/// elements `dst` addresses must be writable and this thread's alone. `w` is checked to hold
/// `taps * cg * OB` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn masked_block<const V: usize>(
    taps: &Taps,
    (w, ahead): (&[f32], usize),
    cg: usize,
    dst: Dst,
    finish: &Finish,
) {
    assert!(w.len() >= taps.offsets.len() * cg * OB && taps.masks.len() == taps.offsets.len());
    let mut acc = [[_mm512_setzero_ps(); V]; OB];
    let wp = w.as_ptr();
    for (t, (&off, masks)) in taps.offsets.iter().zip(taps.masks).enumerate() {
        let base = taps.x.wrapping_offset(off);
        for c in 0..cg {
            let at = base.wrapping_add(c * taps.plane);
            // SAFETY: the caller vouches for the lanes the masks let through; `w` holds
            // `taps * cg * OB` weights (asserted).
            unsafe {
                let xv: [__m512; V] = std::array::from_fn(|v| {
                    _mm512_maskz_loadu_ps(masks[v], at.wrapping_add(16 * v))
                });
                let wt = wp.add((t * cg + c) * OB);
                ask_line(wt.wrapping_add(ahead));
                for (o, row) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wt.add(o));
                    for (a, xv) in row.iter_mut().zip(&xv) {
                        *a = _mm512_fmadd_ps(wv, *xv, *a);
                    }
                }
            }
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { store(acc, dst, finish) }
}

/// What [`masked_block`] reads of `vectors` vectors from `taps`' block, term `t * cg + c` at
/// `out[term * QB..]` (zero where a tap's mask keeps a lane off).
///
/// # Safety
/// The CPU must have AVX-512F; the lanes the masks let through must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_column(taps: &Taps, cg: usize, vectors: usize, out: &mut [Line]) {
    let n = taps.offsets.len();
    assert!(out.len() >= n * cg * NV && vectors <= NV);
    for (t, (&off, masks)) in taps.offsets.iter().zip(taps.masks).enumerate() {
        let base = taps.x.wrapping_offset(off);
        for c in 0..cg {
            let at = base.wrapping_add(c * taps.plane);
            for (v, &mask) in masks.iter().enumerate().take(vectors) {
                // SAFETY: the caller vouches for the lanes the mask lets through; `out` holds
                // the term's lines (asserted).
                unsafe {
                    let value = _mm512_maskz_loadu_ps(mask, at.wrapping_add(16 * v));
                    _mm512_store_ps(out.as_mut_ptr().add((t * cg + c) * NV + v).cast(), value);
                }
            }
        }
    }
}

/// The most positions a last partial block computes with [`tail_block`] instead of a
/// one-vector [`masked_block`].
const TAIL: usize = 7;

/// The input values of a last partial block of `positions` (at most [`TAIL`]) positions,
/// gathered for [`tail_block`], position by position: element `p * taps * cg + t * cg + c`
/// is what [`masked_block`] would read for tap `t`, channel `c`, position `p` (zero where the
/// tap's mask keeps the lane off).
fn gather_tail(taps: &Taps, cg: usize, positions: usize) -> Vec<f32> {
    let mut xt = vec![0.0f32; taps.offsets.len() * cg * positions];
    for (t, (&off, masks)) in taps.offsets.iter().zip(taps.masks).enumerate() {
        let base = taps.x.wrapping_offset(off);
        for p in (0..positions).filter(|&p| masks[0] & (1 << p) != 0) {
            for c in 0..cg {
                // SAFETY: a lane the mask lets through is readable (the caller of the block
                // vouches for it).
                xt[p * taps.offsets.len() * cg + t * cg + c] =
                    unsafe { *base.wrapping_add(c * taps.plane + p) };
            }
        }
    }
    xt
}

/// A last partial block of `P` positions (at most [`TAIL`]) with vectors over its 8 output
/// channels instead of positions, two terms (taps and channels) to a vector: per pair of
/// terms, one load of their 16 weights and, per position, its two values spread over the
/// vector's halves (one 8-byte load and a permute), where a one-vector [`masked_block`]
/// broadcasts 8 weights to fill 16 lanes for `P` positions. The halves are added at the end
/// (an odd last term goes to the first half alone). Each position's sum runs as `S`
/// interleaved partial sums (pairs `j` with `j % S == s`), added in order at the end, so that
/// `P * S` chains of fused multiply-adds hide their latency (one chain for one position was as
/// slow as the one-vector block). With bands fitted to it (see [`fit_rows`]), the 49th
/// position of 8×512×7×7 → 512 took 6% of the convolution with a vector of 8 channels per
/// term. In pairs, `conv_shapes` with bias and ReLU, three alternating runs: 8×256×28×28 →
/// 256 at stride 2 (four positions) 4.31–4.35 → 4.10–4.23 ms, 8×512×7×7 → 2048 1×1
/// 1.82–1.84 → 1.76–1.78, 8×2048×7×7 → 512 1.84–1.87 → 1.78–1.81. Fast numerics only: the
/// order differs from the other blocks'.
///
/// # Safety
/// The CPU must have AVX-512F and DQ; the elements `dst` addresses (its `channels` for the `P`
/// positions) must be writable and this thread's alone. `xt` comes from [`gather_tail`] for
/// `P` positions and `w` holds the block's `taps * cg * OB` weights (both asserted).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn tail_block<const P: usize, const S: usize>(
    xt: &[f32],
    w: &[f32],
    dst: Dst,
    finish: &Finish,
) {
    let k = xt.len() / P;
    assert!(xt.len() == k * P && w.len() >= k * OB);
    let mut acc = [[_mm512_setzero_ps(); P]; S];
    let (xp, wp) = (xt.as_ptr(), w.as_ptr());
    // Lanes 0-7 take a pair's first value, 8-15 its second.
    let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    // Terms 2j and 2j + 1: their 16 weights (contiguous), and each position's two values.
    let pair = |acc: &mut [__m512; P], j: usize| {
        // SAFETY: in bounds by the assertion (2j + 1 < k).
        unsafe {
            let wv = _mm512_loadu_ps(wp.add(2 * j * OB));
            for (p, a) in acc.iter_mut().enumerate() {
                let two = _mm_castpd_ps(_mm_load_sd(xp.add(p * k + 2 * j).cast::<f64>()));
                let xv = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two));
                *a = _mm512_fmadd_ps(wv, xv, *a);
            }
        }
    };
    let pairs = k / 2;
    let whole = pairs / S * S;
    for j in (0..whole).step_by(S) {
        for (s, partial) in acc.iter_mut().enumerate() {
            pair(partial, j + s);
        }
    }
    for (s, j) in (whole..pairs).enumerate() {
        pair(&mut acc[s], j);
    }
    if k % 2 == 1 {
        // The last term alone, in the first 8 lanes.
        // SAFETY: in bounds by the assertion.
        unsafe {
            let wv = _mm512_castps256_ps512(_mm256_loadu_ps(wp.add((k - 1) * OB)));
            for (p, a) in acc[0].iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*xp.add(p * k + k - 1));
                *a = _mm512_mask3_fmadd_ps(wv, xv, *a, 0x00ff);
            }
        }
    }
    let sums: [__m256; P] = std::array::from_fn(|p| {
        let total = acc
            .iter()
            .skip(1)
            .fold(acc[0][p], |total, partial| _mm512_add_ps(total, partial[p]));
        _mm256_add_ps(
            _mm512_castps512_ps256(total),
            _mm512_extractf32x8_ps::<1>(total),
        )
    });
    let bias = finish.bias.map(|b| _mm256_loadu_ps(b.as_ptr()));
    for (p, a) in sums.iter().enumerate() {
        let mut value = *a;
        if let Some(bias) = bias {
            value = _mm256_add_ps(value, bias);
        }
        if let Some(r) = finish.residual {
            let at = r.at(dst.ptr.wrapping_add(p));
            let mut lanes = [0.0f32; OB];
            for (o, lane) in lanes.iter_mut().enumerate().take(dst.channels) {
                // SAFETY: the caller vouches for the residual's elements of these channels
                // at position p.
                *lane = unsafe { *at.wrapping_add(o * dst.stride) };
            }
            // SAFETY: 8 floats into 8 lanes.
            value = _mm256_add_ps(value, unsafe { _mm256_loadu_ps(lanes.as_ptr()) });
        }
        if let Some(act) = finish.act {
            // SAFETY: AVX-512F and DQ are enabled here; the upper lanes are dropped.
            value = _mm512_castps512_ps256(unsafe { act.apply(_mm512_castps256_ps512(value)) });
        }
        let mut lanes = [0.0f32; OB];
        // SAFETY: 8 lanes into 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), value) };
        for (o, v) in lanes.iter().enumerate().take(dst.channels) {
            // SAFETY: the caller vouches for position p of these channels.
            unsafe { *dst.ptr.wrapping_add(o * dst.stride + p) = *v };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tail_block<const P: usize, const S: usize>(_: &[f32], _: &[f32], _: Dst, _: &Finish) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pointwise_column(_: &Column, _: *const f32, _: *mut f32, _: &mut Lines) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn gather_column(_: &Taps, _: usize, _: usize, _: &mut [Line]) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn masked_block<const V: usize>(_: &Taps, _: (&[f32], usize), _: usize, _: Dst, _: &Finish) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const V: usize>(
    _: &[f32],
    _: usize,
    _: &[usize],
    _: (&[f32], usize),
    _: usize,
    _: Dst,
    _: &Finish,
) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

/// The depthwise-separable block for f32 NCHW on AVX-512: per band, the depthwise output goes
/// into a cache-sized tile (one plane per channel, padded to whole blocks), and the pointwise
/// convolution runs on it as the microkernel with one tap, storing straight to the output
/// (the band's rows of a channel are contiguous, so there are no padding columns to skip). `g` is the depthwise convolution's geometry; `wp` the `c_out × c` pointwise
/// weights.
#[allow(clippy::too_many_arguments)]
pub(super) fn separable(
    g: &Geometry,
    xs: &[f32],
    wd: &[f32],
    middle: Post<f32>,
    wp: &[f32],
    c_out: usize,
    y: &mut [f32],
    post: Post<f32>,
) {
    // An output too large to stay in the last-level cache for its consumer goes out with
    // non-temporal stores, which skip reading each line before overwriting it (unless the rest
    // of the epilogue reads it back at once). On one thread, W6a's pointwise half took
    // 8.3-8.5 ms so against 9.0-9.1.
    let stream = std::mem::size_of_val(y) >= crate::STREAM_MIN_BYTES;
    separable_stored(g, xs, wd, middle, wp, c_out, y, post, stream)
}

/// [`separable`], its output stored non-temporally where `stream` (and no part of the
/// epilogue is left to run over the stored rows).
#[allow(clippy::too_many_arguments)]
fn separable_stored(
    g: &Geometry,
    xs: &[f32],
    wd: &[f32],
    middle: Post<f32>,
    wp: &[f32],
    c_out: usize,
    y: &mut [f32],
    post: Post<f32>,
    stream: bool,
) {
    let fill = |n: usize,
                band: std::ops::Range<usize>,
                chans: std::ops::Range<usize>,
                tile: &mut [f32],
                plane: usize,
                _: &mut [f32]| {
        let (sub, xs, wd, middle) = g.depthwise_channels(n, chans, xs, wd, middle);
        // SAFETY: the tile holds the channels' planes of `plane` elements, and is this task's.
        // The depthwise half's own bias and activation are applied as its rows are computed.
        unsafe {
            super::depthwise::band(&sub, xs, wd, 0, band, Out(tile.as_mut_ptr()), plane, middle)
        };
    };
    let row_bytes = g.y[1] * g.y[3] * std::mem::size_of::<f32>();
    let [_, c, _, in_w] = g.x;
    // The input rows a band of depthwise output rows reads, every channel's.
    let input_of = |n: usize, band: &std::ops::Range<usize>| {
        let (lo, hi) = g.rows_read(band);
        (0..c)
            .filter(|_| lo < hi)
            .map(|ch| &xs[g.x_offset(n, ch, lo, 0)..][..(hi - lo) * in_w])
            .collect()
    };
    pointwise_bands(
        g.y,
        wp,
        c_out,
        y,
        post,
        stream,
        row_bytes,
        &|_, _| 0,
        &fill,
        &input_of,
    );
}

/// A 1×1 convolution (`g`: no padding, one group, any stride, its output rows
/// `(h - 1) / stride + 1` of the input's) of f32 NCHW on AVX-512 as the separable block's
/// pointwise half, on a copy of each band's input rows: at a stride, of the pixels it reads.
pub(super) fn pointwise(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
    let [_, c, _, w] = g.x;
    let ow = g.y[3];
    let [sh, sw] = g.stride;
    let fill = |n: usize,
                band: std::ops::Range<usize>,
                chans: std::ops::Range<usize>,
                tile: &mut [f32],
                plane: usize,
                _: &mut [f32]| {
        let p = band.len() * ow;
        for (k, ch) in chans.enumerate() {
            if sh == 1 && sw == 1 {
                let rows = &xs[g.x_offset(n, ch, band.start, 0)..][..p];
                tile[k * plane..][..p].copy_from_slice(rows);
                continue;
            }
            for (i, r) in band.clone().enumerate() {
                let row = &xs[g.x_offset(n, ch, r * sh, 0)..][..w];
                let dst = &mut tile[k * plane + i * ow..][..ow];
                for (x, d) in dst.iter_mut().enumerate() {
                    *d = row[x * sw];
                }
            }
        }
    };
    let row_bytes = c * ow * std::mem::size_of::<f32>();
    let stream = std::mem::size_of_val(y) >= crate::STREAM_MIN_BYTES;
    let dims = [g.x[0], c, g.y[2], g.y[3]];
    // At stride 1 the next band's input rows are asked for into L2 as the blocks run.
    let direct = sh == 1 && sw == 1;
    let input_of = |n: usize, band: &std::ops::Range<usize>| {
        (0..c)
            .filter(|_| direct)
            .map(|ch| &xs[g.x_offset(n, ch, band.start, 0)..][..band.len() * w])
            .collect()
    };
    pointwise_bands(
        dims,
        ws,
        g.y[1],
        y,
        post,
        stream,
        row_bytes,
        &|_, _| 0,
        &fill,
        &input_of,
    );
}

/// MobileNetV2's inverted residual for f32 NCHW on AVX-512: a 1×1 expansion (`ge`, weights
/// `we`, its own bias and activation `expand`), the depthwise convolution `gd` of its result
/// (`wd`, `middle`), and the pointwise projection `wp`, per band of output rows. Each band
/// copies the input rows its depthwise rows read (the band's rows and the filter's halo) into
/// a tile, expands them into a second tile with the microkernel, runs the depthwise kernel on
/// that tile and the projection on the result: the expanded tensor, several times the input,
/// is never stored, at the cost of recomputing the halo rows' expansion.
#[allow(clippy::too_many_arguments)]
pub(super) fn inverted_residual(
    ge: &Geometry,
    xs: &[f32],
    we: &[f32],
    expand: Post<f32>,
    gd: &Geometry,
    wd: &[f32],
    middle: Post<f32>,
    wp: &[f32],
    c_out: usize,
    y: &mut [f32],
    post: Post<f32>,
) {
    let [_, c_in, _, w] = ge.x;
    let c_exp = ge.y[1];
    let ([sh, _], pt) = (gd.stride, gd.pad[0]);
    let packed = pack(we, 1, c_exp, c_in);
    let (expand_in_registers, expand_rest) = split(expand, false);
    // The input rows depthwise output rows `band` read, inside the image.
    let input_rows = |band: &std::ops::Range<usize>| gd.rows_read(band);
    // Per band: the input rows' copy (whole blocks of positions) and the expansion of its
    // `chans` channels.
    let extra = |band: &std::ops::Range<usize>, chans: usize| {
        let (lo, hi) = input_rows(band);
        let p = (hi - lo) * w;
        c_in * p.div_ceil(QB) * QB + chans * p
    };
    let per_block = c_in * OB;
    let taps = gd.kh * gd.kw;
    let fill = |n: usize,
                band: std::ops::Range<usize>,
                chans: std::ops::Range<usize>,
                tile: &mut [f32],
                plane: usize,
                scratch: &mut [f32]| {
        let (lo, hi) = input_rows(&band);
        let p = (hi - lo) * w;
        let q = p.div_ceil(QB) * QB;
        let cc = chans.len();
        let (copy, expanded) = scratch.split_at_mut(c_in * q);
        for ch in 0..c_in {
            let src = &xs[ge.x_offset(n, ch, lo, 0)..][..p];
            copy[ch * q..][..p].copy_from_slice(src);
            copy[ch * q + p..(ch + 1) * q].fill(0.0);
        }
        let expanded = &mut expanded[..cc * p];
        if p > 0 {
            let dst = Dst {
                ptr: expanded.as_mut_ptr(),
                stride: p,
                channels: cc,
                valid: p,
            };
            // The channels start on a block of the packed weights (`pointwise_bands` splits
            // them so).
            debug_assert!(chans.start.is_multiple_of(OB));
            let blocks = chans.start / OB..chans.end.div_ceil(OB);
            // SAFETY: `expanded` holds the channels' planes of p, and is this task's.
            unsafe {
                compute(
                    copy,
                    q,
                    &[0],
                    (
                        &packed[blocks.start * per_block..blocks.end * per_block],
                        weights_ahead(packed.len()),
                    ),
                    dst,
                    expand_in_registers.bias.map(|b| &b[chans.clone()]),
                    None,
                    InRegisters::of(expand_in_registers.act),
                    false,
                    &[],
                )
            };
            if !expand_rest.is_empty() {
                // An activation without a form in registers (no bias or residual is left for
                // this pass).
                epilogue(expanded, expand_rest.channel(0, 0, cc * p));
            }
        }
        // The depthwise convolution of the expanded rows: output row r0 + rr of the band reads
        // expanded row `rr * sh + i - top` of the tile, rows outside it being padding.
        let top = pt + lo - band.start * sh;
        let local = Geometry {
            x: [1, cc, hi - lo, w],
            y: [1, cc, band.len(), gd.y[3]],
            pad: [top, gd.pad[1]],
            groups: cc,
            ..*gd
        };
        let middle = Post {
            bias: middle.bias.map(|b| &b[chans.clone()]),
            ..middle
        };
        // SAFETY: the tile holds the channels' planes of `plane` elements, and is this task's.
        unsafe {
            super::depthwise::band(
                &local,
                expanded,
                &wd[chans.start * taps..][..cc * taps],
                0,
                0..band.len(),
                Out(tile.as_mut_ptr()),
                plane,
                middle,
            )
        };
    };
    let row_bytes = (c_exp * (gd.y[3] + sh * w) + c_in * sh * w) * std::mem::size_of::<f32>();
    let stream = std::mem::size_of_val(y) >= crate::STREAM_MIN_BYTES;
    pointwise_bands(
        gd.y,
        wp,
        c_out,
        y,
        post,
        stream,
        row_bytes,
        &extra,
        &fill,
        &|_, _| Vec::new(),
    );
}

/// A band's depthwise output written into a tile: `fill(n, rows, chans, tile, plane, scratch)`
/// writes channel `chans.start + k`'s rows at `tile[k * plane..]` (`rows.len() * ow` elements),
/// given `scratch` of `extra(rows, chans.len())` elements of its own. `chans` starts on a
/// multiple of [`OB`].
type Fill<'a> = dyn Fn(usize, std::ops::Range<usize>, std::ops::Range<usize>, &mut [f32], usize, &mut [f32])
    + Sync
    + 'a;

/// The scratch a band's fill needs of its own, `extra(rows, channels)` elements, for that many
/// of the tile's channels.
type Extra<'a> = dyn Fn(&std::ops::Range<usize>, usize) -> usize + Sync + 'a;

/// The input a band's fill reads: `(n, rows)` to the slices (one per channel) to ask for
/// ahead of it.
type InputOf<'a, 'b> = dyn Fn(usize, &std::ops::Range<usize>) -> Vec<&'b [f32]> + Sync + 'a;

/// Positions past a tile's last plane for the direct kernel to read: where [`compute`]'s
/// head shifts its blocks of positions onto the output's lines, its last block may read up to
/// 15 positions past the whole blocks of [`QB`] that a plane holds (their values reach only
/// lanes that are not stored).
const SLACK: usize = 16;

/// The pointwise product by `wp` (`c_out × c`) of the `c` planes of `[n, c, oh, ow]` that
/// `fill` writes for each band of rows, into `y` (`[n, c_out, oh, ow]`) with the epilogue;
/// stored non-temporally where `stream` (and no part of the epilogue is left to run over the
/// stored rows). Bands are sized for `row_bytes` of tiles per row.
///
/// Each band is one task where there are more bands than threads. Otherwise (a small image at
/// batch 1) each band runs in two phases over all the threads: the tile's channels split
/// between them, then the output channels. Small whole images at a batch of at least twice the
/// threads run several to a task (as many as the tiles hold, at most four blocks of positions
/// and the batch's share per thread), their positions side by side in one tile, the projection
/// staged and copied out image by image: MobileNetV2's 7×7 block (160 channels expanded to
/// 960) at batch 8, 872–882 → 825–834 µs, at batch 32 3565–3577 → 3308–3364 µs.
#[allow(clippy::too_many_arguments)]
fn pointwise_bands(
    [n_images, c, oh, ow]: [usize; 4],
    wp: &[f32],
    c_out: usize,
    y: &mut [f32],
    post: Post<f32>,
    stream: bool,
    row_bytes: usize,
    extra: &Extra,
    fill: &Fill,
    input_of: &InputOf,
) {
    // The bands store straight to the output and add the residual in registers; the small
    // images' groups store to a stage and add it as they copy out.
    let (in_registers, rest) = split(post, true);
    let (staged_in_registers, staged_rest) = split(post, false);
    let residual = Residual::of(in_registers.residual, y);
    let packed = pack(wp, 1, c_out, c);
    let per_block = c * OB;
    let stream = stream && rest.is_empty();
    let out = Out(y.as_mut_ptr());
    // Output channels `chans` (starting on a block of the packed weights) of rows `band` of
    // image n, from the tile.
    let project = |n: usize,
                   band: &std::ops::Range<usize>,
                   tile: &[f32],
                   plane: usize,
                   chans: std::ops::Range<usize>,
                   ahead: &[&[f32]]| {
        let (r0, p) = (band.start, band.len() * ow);
        // Rows r0.. of the output channels of image n: p contiguous positions each.
        let dst = Dst {
            ptr: out
                .ptr()
                .wrapping_add(((n * c_out + chans.start) * oh + r0) * ow),
            stride: oh * ow,
            channels: chans.len(),
            valid: p,
        };
        let blocks = chans.start / OB..chans.end.div_ceil(OB);
        // SAFETY: those rows are this task's.
        unsafe {
            compute(
                tile,
                plane,
                &[0],
                (
                    &packed[blocks.start * per_block..blocks.end * per_block],
                    weights_ahead(packed.len()),
                ),
                dst,
                in_registers.bias.map(|b| &b[chans.clone()]),
                residual,
                InRegisters::of(in_registers.act),
                stream,
                ahead,
            )
        };
        if stream {
            // SAFETY: SSE is baseline on x86-64. Orders the streamed stores before the task
            // is reported done.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                _mm_sfence()
            };
        }
        if !rest.is_empty() {
            for co in chans {
                let at = (n * c_out + co) * oh * ow + r0 * ow;
                // SAFETY: as above.
                let rows = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), p) };
                epilogue(rows, rest.channel(co, at, p));
            }
        }
    };
    // All output channels of `count` whole images from `first`, from a tile holding their
    // positions side by side (`q_blocks` per channel), through `staged` (`c_out × q_blocks`).
    let project_group =
        |first: usize, count: usize, tile: &[f32], q_blocks: usize, staged: &mut [f32]| {
            let per_image = oh * ow;
            let p = count * per_image;
            let dst = Dst {
                ptr: staged.as_mut_ptr(),
                stride: q_blocks,
                channels: c_out,
                valid: p,
            };
            // SAFETY: `staged` holds `c_out` rows of `q_blocks`, and is this task's.
            unsafe {
                compute(
                    tile,
                    q_blocks,
                    &[0],
                    (&packed, weights_ahead(packed.len())),
                    dst,
                    staged_in_registers.bias,
                    None,
                    InRegisters::of(staged_in_registers.act),
                    false,
                    &[],
                )
            };
            for i in 0..count {
                let n = first + i;
                for co in 0..c_out {
                    let at = (n * c_out + co) * per_image;
                    // SAFETY: image n's rows are this task's.
                    let row =
                        unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), per_image) };
                    row.copy_from_slice(&staged[co * q_blocks + i * per_image..][..per_image]);
                    if !staged_rest.is_empty() {
                        epilogue(row, staged_rest.channel(co, at, per_image));
                    }
                }
            }
        };
    // The tile's planes, whole blocks of positions, zero past the band's.
    let zero_tails = |tile: &mut [f32], p: usize, q_blocks: usize| {
        for plane in tile.chunks_mut(q_blocks) {
            plane[p..].fill(0.0);
        }
    };
    // Bands of at least two blocks of positions: the microkernel computes whole blocks of
    // [`QB`], so a band of one 7-pixel row (MobileNetV2's last stage at batch 1, where bands
    // sized for balance would be one row) computed 48 positions for 7. Inverted residual, 7×7,
    // 160 channels expanded to 960, batch 1: 672 → 363 µs, against 475 unfused; at 14×14
    // with 96 and 576: 366 → 216, against 395. (Four blocks: 385 and 314.)
    let least = (2 * QB).div_ceil(ow.max(1));
    let pool = crate::Pool::global();
    let rows = super::band_rows(n_images, oh, row_bytes)
        .max(least)
        .min(oh.max(1));
    let bands = oh.div_ceil(rows);
    let job = |n: usize, band: std::ops::Range<usize>| {
        let p = band.len() * ow;
        let q_blocks = p.div_ceil(QB) * QB;
        // The band this thread is likely to take next (the threads claim tasks in turn), whose
        // input the projection asks for into L2 as it runs, so that the next depthwise half
        // reads less of it from memory. W6a on the AMD host, alternating in one process:
        // 1.5–3.5% faster (4.88 → 4.81, 4.88 → 4.70 ms); the same with bands half as high,
        // which keep the tile and the next input in L2 together. A wrong guess costs only the
        // bandwidth. On the Intel host the prefetches slow the projection by more than they
        // save the fill (see [`prefetches_ahead`]).
        let next = n * bands + band.start / rows + pool.threads();
        let ahead = if next < n_images * bands && prefetches_ahead() {
            let (n2, b2) = (next / bands, next % bands);
            input_of(n2, &(b2 * rows..((b2 + 1) * rows).min(oh)))
        } else {
            Vec::new()
        };
        with_scratch(
            c * q_blocks + SLACK + extra(&band, c),
            |scratch: &mut [f32]| {
                let (tile, rest_of_scratch) = scratch.split_at_mut(c * q_blocks + SLACK);
                let planes = &mut tile[..c * q_blocks];
                zero_tails(planes, p, q_blocks);
                fill(n, band.clone(), 0..c, planes, q_blocks, rest_of_scratch);
                project(n, &band, tile, q_blocks, 0..c_out, &ahead);
            },
        )
    };
    // Small whole images, several per task: their positions side by side in one tile, so that
    // the microkernel's blocks of positions run across images instead of ending partly empty
    // at every image's end (a 7×7 image's 49 positions took 64).
    let per_image = oh * ow;
    let group = (super::TILE_BYTES / (oh * row_bytes).max(1))
        .min(n_images / pool.threads())
        .min(4 * QB / per_image.max(1));
    if bands == 1 && group > 1 && !per_image.is_multiple_of(16) {
        let groups = n_images.div_ceil(group);
        let q_blocks = (group * per_image).div_ceil(QB) * QB;
        let extra_len = extra(&(0..oh), c);
        return pool.run(groups, &|t| {
            let images = t * group..((t + 1) * group).min(n_images);
            let p = images.len() * per_image;
            with_scratch(
                c * q_blocks + c_out * q_blocks + extra_len,
                |scratch: &mut [f32]| {
                    let (tile, rest_of_scratch) = scratch.split_at_mut(c * q_blocks);
                    let (staged, extra_scratch) = rest_of_scratch.split_at_mut(c_out * q_blocks);
                    zero_tails(tile, p, q_blocks);
                    for (i, n) in images.clone().enumerate() {
                        let at = &mut tile[i * per_image..];
                        fill(n, 0..oh, 0..c, at, q_blocks, extra_scratch);
                    }
                    project_group(images.start, images.len(), tile, q_blocks, staged);
                },
            )
        });
    }
    if n_images * bands > pool.threads() {
        return super::for_each_band_fitted(n_images, oh, row_bytes, |rows| rows.max(least), &job);
    }
    // No more bands than threads: the whole image as one band where its tiles fit, so that no
    // halo rows are recomputed and the positions fill more of the blocks (14×14, 96 channels
    // expanded to 576, batch 1: 218–230 µs in two bands of one task each, 191–195 so).
    let (rows, bands) = if oh * row_bytes <= super::TILE_BYTES {
        (oh.max(1), 1)
    } else {
        (rows, bands)
    };
    // Channels in runs of whole blocks, one run per thread.
    let runs = |channels: usize| {
        let run = channels.div_ceil(pool.threads()).div_ceil(OB) * OB;
        move |k: usize| k * run..((k + 1) * run).min(channels)
    };
    let (fills, projections) = (runs(c), runs(c_out));
    for n in 0..n_images {
        for b in 0..bands {
            let band = b * rows..((b + 1) * rows).min(oh);
            let p = band.len() * ow;
            let q_blocks = p.div_ceil(QB) * QB;
            // The tile from this thread's second scratch (a fresh allocation of this size
            // would fault its pages in at every call: 1×1 576 → 96 at 7×7 took 219 µs so,
            // against 67 on `gemm`), shared with the tasks, which take their own scratch
            // from the first.
            with_shared_scratch(c * q_blocks + SLACK, |tile: &mut [f32]| {
                zero_tails(&mut tile[..c * q_blocks], p, q_blocks);
                let shared = Out(tile.as_mut_ptr());
                pool.run(pool.threads(), &|k| {
                    let chans = fills(k);
                    if chans.is_empty() {
                        return;
                    }
                    // SAFETY: each task writes the planes of its own channels.
                    let part = unsafe {
                        std::slice::from_raw_parts_mut(
                            shared.ptr().add(chans.start * q_blocks),
                            chans.len() * q_blocks,
                        )
                    };
                    with_scratch(extra(&band, chans.len()), |scratch: &mut [f32]| {
                        fill(n, band.clone(), chans, part, q_blocks, scratch)
                    });
                });
                let tile: &[f32] = tile;
                pool.run(pool.threads(), &|k| {
                    let chans = projections(k);
                    if !chans.is_empty() {
                        project(n, &band, tile, q_blocks, chans, &[]);
                    }
                });
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epilogue::Activation;
    use kfuse_ir::{Conv2dAttrs, Layout};

    /// Strided convolutions on the phase planes: each output within rounding of its sum, then
    /// the epilogue, over strides 2 and 3 (and different per axis), kernels from 2×2 to 7×7
    /// (the stem's 7×7 at stride 2 with 3 channels), dilation with a stride, groups, odd and
    /// asymmetric padding, odd sizes, an output of one pixel, an output large enough to be
    /// streamed, and subnormals and signed zeros in the input. Columns of more than
    /// [`PACK_COLUMN`] bytes (32 channels × 9 taps, 16 × 25) are copied before their blocks
    /// run, the last block of positions partial.
    #[test]
    fn strided_convolutions_match_their_sums() {
        check_against_sums(&[
            (1, 32, 24, 6, 57, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (2, 16, 16, 9, 61, 5, 5, [2, 2], [1, 1], 1, [2, 2, 2, 2]),
            (2, 8, 16, 13, 15, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 3, 12, 23, 21, 7, 7, [2, 2], [1, 1], 1, [3, 3, 3, 3]),
            (1, 5, 9, 10, 11, 3, 3, [3, 3], [1, 1], 1, [1, 0, 2, 1]),
            (1, 4, 8, 9, 17, 3, 3, [1, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 4, 8, 17, 9, 3, 3, [2, 1], [1, 1], 1, [0, 0, 0, 0]),
            (1, 6, 10, 15, 15, 3, 3, [2, 2], [2, 2], 1, [2, 2, 2, 2]),
            (2, 8, 12, 12, 12, 3, 3, [2, 2], [1, 1], 2, [1, 1, 1, 1]),
            (1, 4, 6, 8, 8, 2, 2, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
            (1, 7, 9, 3, 3, 3, 3, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
            // 16.8 MB of output: copied out of the stage with streaming stores.
            (1, 1, 64, 512, 512, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        ]);
    }

    /// Strided convolutions with positions broadcast ([`broadcast_positions`]): rows of 28
    /// and more outputs in blocks of seven (a last partial block), 3×3 and 5×5 filters, a row
    /// stride of 1 and of 2, asymmetric padding, several blocks of 32 output channels and bands
    /// of rows with a partial last one, each output within rounding of its sum, then the
    /// epilogue (the residual after the band's rows).
    #[test]
    fn broadcast_positions_match_their_sums() {
        let cases = [
            (2, 16, 32, 57, 61, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 24, 64, 56, 56, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 16, 32, 60, 62, 5, 5, [2, 2], [1, 1], 1, [2, 2, 2, 2]),
            (1, 16, 32, 30, 60, 3, 3, [1, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 20, 32, 31, 63, 3, 3, [2, 2], [1, 1], 1, [1, 0, 2, 1]),
        ];
        for case in cases.iter().filter(|_| has_avx512()) {
            assert!(route::broadcasts_positions(&geometry_of(case)), "{case:?}");
        }
        check_against_sums(&cases);
    }

    /// Strided convolutions onto rows of at least `route::TAP_PLANES_BELOW` run on phase planes,
    /// narrower ones on tap planes: both sides of that line, odd sizes, a 5×5 filter with
    /// uneven padding, dilation, stride 3 and unequal strides, groups, strided 1×1
    /// convolutions with and without padding, last blocks of a few positions (the tail
    /// kernel), and small images at batch 1 (whose tasks split the output channels).
    #[test]
    fn strided_convolutions_on_either_planes_match_their_sums() {
        let cases = [
            (1, 4, 8, 61, 59, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 3, 10, 40, 63, 5, 5, [2, 2], [1, 1], 1, [2, 1, 2, 0]),
            (1, 4, 8, 64, 60, 3, 3, [2, 2], [2, 2], 1, [2, 2, 2, 2]),
            (2, 6, 12, 29, 55, 3, 3, [2, 2], [1, 1], 2, [1, 1, 1, 1]),
            (2, 6, 12, 29, 53, 3, 3, [2, 2], [1, 1], 2, [1, 1, 1, 1]),
            (2, 5, 9, 21, 33, 5, 5, [3, 3], [1, 1], 1, [2, 2, 1, 1]),
            (1, 4, 8, 17, 40, 3, 3, [1, 2], [1, 1], 1, [1, 1, 1, 1]),
            (1, 4, 8, 40, 17, 3, 3, [2, 1], [1, 1], 1, [0, 1, 2, 0]),
            (1, 16, 40, 14, 14, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (3, 16, 24, 13, 13, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (2, 8, 16, 31, 31, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (2, 64, 72, 13, 15, 1, 1, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
            (1, 64, 64, 14, 14, 1, 1, [2, 2], [1, 1], 1, [1, 0, 1, 0]),
            (1, 64, 80, 11, 9, 1, 1, [3, 2], [1, 1], 1, [0, 0, 0, 0]),
            // Columns copied into contiguous runs (`PACK_COLUMN`), a tail block of one
            // position left in place.
            (1, 24, 16, 33, 33, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            // Tail blocks of one and of four positions over an odd number of terms (channels
            // times taps), which the tail kernel takes in pairs but for the last.
            (1, 5, 12, 14, 14, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
            (2, 3, 10, 28, 28, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        ];
        let (mut phase, mut tap) = (0, 0);
        for case in &cases {
            if route::on_tap_planes(&geometry_of(case)) {
                tap += 1;
            } else {
                phase += 1;
            }
        }
        assert!(
            phase >= 4 && tap >= 8,
            "{phase} on phase planes, {tap} on tap planes"
        );
        check_against_sums(&cases);
    }

    /// Same-width convolutions of small images, whose tasks each take a whole image and a
    /// share of its output channels (batch 1 to 3; the residual's part of the epilogue runs
    /// over each task's channels only), and weights large enough to be read a block of output
    /// channels at a time (128 → 136 channels, 3×3: 627 KB), with last position blocks of one
    /// and two vectors; columns copied into contiguous runs in both orders (`PACK_COLUMN`).
    #[test]
    fn small_images_and_large_weights_match_their_sums() {
        check_against_sums(&[
            (1, 16, 40, 7, 7, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (3, 8, 24, 5, 9, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (2, 12, 20, 1, 1, 3, 3, [1, 1], [1, 1], 2, [1, 1, 1, 1]),
            (1, 128, 136, 6, 6, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (2, 128, 136, 20, 20, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (1, 8, 16, 15, 15, 5, 5, [1, 1], [2, 2], 1, [4, 4, 4, 4]),
            // Columns copied into contiguous runs through the taps' masks (`PACK_COLUMN`),
            // with dilation, positions outside the image, and a last partial block.
            (1, 24, 16, 9, 9, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (2, 24, 24, 10, 11, 3, 3, [1, 1], [2, 2], 1, [2, 2, 2, 2]),
        ]);
    }

    /// 1×1 convolutions of 256+ channels onto small images (`route::narrow_pointwise`): a last
    /// block of one position (7×7), of 35 (three vectors, masked), output channels short of a
    /// block, and batch 1 (tasks splitting the output channels).
    #[test]
    fn narrow_pointwise_convolutions_match_their_sums() {
        let cases = [
            (3, 256, 256, 7, 7, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
            (2, 264, 270, 5, 7, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
            (1, 256, 300, 6, 9, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
        ];
        for case in &cases {
            assert!(route::narrow_pointwise(&geometry_of(case)), "{case:?}");
        }
        check_against_sums(&cases);
    }

    /// 1×1 convolutions on [`pointwise`] (a copy of each band's input rows, projected by the
    /// microkernel one column of positions at a time): at stride 1 and 2, several bands and
    /// columns, a last partial column, output channels short of a block, and each epilogue,
    /// the residual among them added in registers.
    #[test]
    fn pointwise_convolutions_on_a_copy_match_their_sums() {
        check_run_against_sums(
            &[
                (2, 64, 72, 29, 29, 1, 1, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
                (3, 64, 70, 28, 30, 1, 1, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
                (1, 40, 24, 9, 9, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
                (2, 16, 20, 30, 30, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
                (1, 7, 9, 1, 1, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
            ],
            pointwise,
        );
    }

    /// Same-width convolutions whose last block of positions holds 1 to 7 of them, which the
    /// tail kernel computes with vectors over output channels: every tail size, groups,
    /// dilation, output channels short of a block, and a single position.
    #[test]
    fn last_blocks_of_few_positions_match_their_sums() {
        check_against_sums(&[
            (2, 9, 13, 5, 10, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (1, 16, 24, 3, 17, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (2, 12, 20, 14, 14, 3, 3, [1, 1], [1, 1], 2, [1, 1, 1, 1]),
            (1, 8, 5, 1, 53, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (1, 10, 17, 6, 17, 3, 3, [1, 1], [2, 2], 1, [2, 2, 2, 2]),
            (3, 20, 8, 5, 11, 5, 5, [1, 1], [1, 1], 1, [2, 2, 2, 2]),
            (1, 512, 24, 7, 7, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
            (2, 6, 9, 1, 1, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        ]);
    }

    /// (n, c_in, c_out, h, w, kh, kw, stride, dilation, groups, [top, bottom, left, right])
    type Case = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
        [usize; 2],
        usize,
        [usize; 4],
    );

    /// Runs [`conv`] on each case (normal inputs with subnormals and signed zeros, three
    /// epilogues) and checks each output within rounding of its sum of products; skips, saying
    /// so, without AVX-512.
    /// The geometry of `case`, its output as large as its input, filter, stride, dilation
    /// and padding make it.
    fn geometry_of(&(n, ci, co, h, w, kh, kw, stride, dilation, groups, pad): &Case) -> Geometry {
        let attrs = Conv2dAttrs {
            layout: Layout::Nchw,
            stride,
            padding: pad,
            dilation,
            groups,
        };
        let out = |len: usize, p: usize, k: usize, d: usize, s: usize| {
            (len + p - d * (k - 1) - 1) / s + 1
        };
        let (oh, ow) = (
            out(h, pad[0] + pad[1], kh, dilation[0], stride[0]),
            out(w, pad[2] + pad[3], kw, dilation[1], stride[1]),
        );
        Geometry::new(
            &[n, ci, h, w],
            &[co, ci / groups, kh, kw],
            &attrs,
            &[n, co, oh, ow],
        )
    }

    fn check_against_sums(cases: &[Case]) {
        for case in cases {
            let isa = route::Isa::host();
            assert!(
                route::direct_takes(&geometry_of(case), true, isa).is_ok(),
                "{case:?}"
            );
        }
        check_run_against_sums(cases, conv);
    }

    /// A convolution routine: geometry, input, weights, output, epilogue.
    type Routine = fn(&Geometry, &[f32], &[f32], &mut [f32], Post<f32>);

    /// [`check_against_sums`] for `run` in place of [`conv`].
    fn check_run_against_sums(cases: &[Case], run: Routine) {
        if !has_avx512() {
            eprintln!("SKIPPED: the direct kernel needs AVX-512, which this CPU lacks");
            return;
        }
        use super::super::reference::{sums, values};
        let specials = [0.0, -0.0, 1e-40, -3e-39];
        for (case, &(n, ci, co, h, w, kh, kw, _, _, groups, _)) in cases.iter().enumerate() {
            let g = geometry_of(&cases[case]);
            let [oh, ow] = [g.y[2], g.y[3]];
            let xs = values(n * ci * h * w, 7 + case as u64, 5, &specials);
            let ws = values(co * ci / groups * kh * kw, 8, 0, &[]);
            let bias: Vec<f32> = (0..co).map(|o| o as f32 * 0.3 - 1.0).collect();
            let residual = values(n * co * oh * ow, 9, 0, &[]);
            let want = sums(&g, &xs, &ws);
            let posts = [
                Post {
                    bias: None,
                    residual: None,
                    act: None,
                },
                Post {
                    bias: Some(&bias[..]),
                    residual: None,
                    act: Some(Activation::Relu),
                },
                Post {
                    bias: Some(&bias[..]),
                    residual: Some(&residual[..]),
                    act: Some(Activation::Tanh),
                },
                // A residual with ReLU, and with a clamp and no bias: both in registers where
                // the blocks store straight to the output.
                Post {
                    bias: Some(&bias[..]),
                    residual: Some(&residual[..]),
                    act: Some(Activation::Relu),
                },
                Post {
                    bias: None,
                    residual: Some(&residual[..]),
                    act: Some(Activation::Clamp(kfuse_ir::Bounds::new(-0.5, 6.0))),
                },
            ];
            for post in posts {
                let mut y = vec![f32::NAN; n * co * oh * ow];
                run(&g, &xs, &ws, &mut y, post);
                super::super::reference::assert_within(
                    &y,
                    &want,
                    &post,
                    (co, oh * ow),
                    &format!("case {case}"),
                );
            }
        }
    }

    /// Packing, on one thread or shared between the pool's, puts weight `(group, o, kk)` at
    /// `((group * blocks + o / OB) * k + kk) * OB + o % OB` and zeros past each group's last
    /// output channel.
    #[test]
    fn packing_puts_each_weight_in_its_block() {
        for (groups, og, k) in [(1, 960, 160), (3, 21, 1100), (2, 5, 3)] {
            let ws: Vec<f32> = (0..groups * og * k).map(|i| i as f32).collect();
            let packed = pack(&ws, groups, og, k);
            let blocks = og.div_ceil(OB);
            assert_eq!(packed.len(), groups * blocks * k * OB);
            for (i, &v) in packed.iter().enumerate() {
                let (gb, kk, lane) = (i / (k * OB), i / OB % k, i % OB);
                let (group, o) = (gb / blocks, gb % blocks * OB + lane);
                let want = if o < og {
                    ws[(group * og + o) * k + kk]
                } else {
                    0.0
                };
                assert_eq!(v, want, "groups {groups}, og {og}, k {k}: element {i}");
            }
        }
    }

    /// Whether two runs of values are the same bit for bit.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn streamed_stores_off_a_line_write_what_ordinary_stores_write() {
        if !has_avx512() {
            eprintln!("SKIPPED: the direct kernel needs AVX-512, which this CPU lacks");
            return;
        }
        let value = |i: usize| ((i * 7919) % 997) as f32 / 997.0 - 0.5;
        // Input channels, the taps' offsets, output channels (a partial last block), positions
        // per channel (whole vectors, so that the head applies), and input past them: one tap
        // (the column loop), four read in place, and four over a copied column; last, an
        // input with no room for the shifted blocks' reads, so that no head is taken.
        let cases: [(usize, &[usize], usize, usize, usize); 4] = [
            (5, &[0], 19, 160, QB + 32),
            (3, &[0, 1, 17, 18], 11, 144, QB + 32),
            (48, &[0, 1, 17, 18], 11, 160, QB + 32),
            (5, &[0], 19, 144, 0),
        ];
        for (channels, offsets, c_out, positions, room) in cases {
            let taps = offsets.len();
            let plane = positions + room;
            let x: Vec<f32> = (0..channels * plane).map(value).collect();
            let ws: Vec<f32> = (0..c_out * channels * taps).map(|i| value(i + 5)).collect();
            let packed = pack_afresh(&ws, 1, c_out, channels * taps);
            let bias: Vec<f32> = (0..c_out).map(|i| value(i + 7)).collect();
            let len = c_out * positions;
            let run = |y: &mut [f32], stream: bool| {
                let dst = Dst {
                    ptr: y.as_mut_ptr(),
                    stride: positions,
                    channels: c_out,
                    valid: positions,
                };
                let relu = Some(InRegisters::Relu);
                // SAFETY: `y` holds the output's channels and is this thread's; the fence
                // orders the streamed stores before they are read.
                unsafe {
                    compute(
                        &x,
                        plane,
                        offsets,
                        (&packed, weights_ahead(packed.len())),
                        dst,
                        Some(&bias),
                        None,
                        relu,
                        stream,
                        &[],
                    );
                    #[cfg(target_arch = "x86_64")]
                    _mm_sfence();
                }
            };
            let mut plain = vec![f32::NAN; len];
            run(&mut plain, false);
            assert!(plain.iter().all(|v| v.is_finite()));
            let sentinel = f32::from_bits(0x7fc0_1234);
            for shift in [0, 1, 4, 12, 15] {
                // The output `shift` floats past a line, with sentinels on both sides, which
                // a streamed store of a whole line that the output only shares would overwrite.
                let mut buffer = vec![sentinel; len + 64];
                let start = buffer.as_ptr().align_offset(64) + 16 + shift;
                run(&mut buffer[start..][..len], true);
                let (before, rest) = buffer.split_at(start);
                let (y, after) = rest.split_at(len);
                assert!(
                    same_bits(y, &plain),
                    "{taps} taps, shift {shift}: streamed stores differ from ordinary ones"
                );
                let untouched = |s: &[f32]| s.iter().all(|v| v.to_bits() == sentinel.to_bits());
                assert!(
                    untouched(before) && untouched(after),
                    "{taps} taps, shift {shift}: a store reached past the output"
                );
            }
        }
    }

    /// Streamed and ordinary stores write the same bits, into an output 64-byte aligned or
    /// not, with partial blocks of channels and positions.
    #[test]
    fn streamed_stores_write_what_ordinary_stores_write() {
        if !has_avx512() {
            eprintln!("SKIPPED: the separable kernel needs AVX-512, which this CPU lacks");
            return;
        }
        // Planes of 207 positions (never on lines but the first), and of 240 in three images
        // (a task per image), each plane as far off a line as the output's start.
        for (n, c, c_out, h, w) in [(2, 5, 11, 9, 23), (3, 5, 11, 12, 20)] {
            let attrs = Conv2dAttrs {
                layout: Layout::Nchw,
                stride: [1, 1],
                padding: [1; 4],
                dilation: [1, 1],
                groups: c,
            };
            let g = Geometry::new(&[n, c, h, w], &[c, 1, 3, 3], &attrs, &[n, c, h, w]);
            let value = |i: usize| ((i * 7919) % 997) as f32 / 997.0 - 0.5;
            let xs: Vec<f32> = (0..n * c * h * w).map(value).collect();
            let wd: Vec<f32> = (0..c * 9).map(|i| value(i + 11)).collect();
            let wp: Vec<f32> = (0..c_out * c).map(|i| value(i + 23)).collect();
            let len = n * c_out * h * w;
            let none = Post {
                bias: None,
                residual: None,
                act: None,
            };
            let bias: Vec<f32> = (0..c_out).map(|i| value(i + 31)).collect();
            let residual: Vec<f32> = (0..len).map(|i| value(i + 41)).collect();
            // The residual added in registers, as the stores stream.
            let shortcut = Post {
                bias: Some(&bias[..]),
                residual: Some(&residual[..]),
                act: Some(Activation::Relu),
            };
            for post in [none, shortcut] {
                let mut plain = vec![f32::NAN; len];
                separable_stored(&g, &xs, &wd, none, &wp, c_out, &mut plain, post, false);
                assert!(plain.iter().all(|v| v.is_finite()));
                for shift in [0, 1, 6] {
                    // A buffer with room to start the output on a line boundary, then a float and
                    // six past.
                    let mut buffer = vec![f32::NAN; len + 32];
                    let aligned = buffer.as_ptr().align_offset(64);
                    let y = &mut buffer[aligned + shift..][..len];
                    separable_stored(&g, &xs, &wd, none, &wp, c_out, y, post, true);
                    assert!(
                        same_bits(y, &plain),
                        "{h}×{w}: streamed stores (shift {shift}) differ from ordinary ones"
                    );
                }
            }
        }
    }
}
