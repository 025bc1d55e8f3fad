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
//!   contiguous within a band. This measured faster than the zero-bordered grid below on W7
//!   and W6b (docs/structured-ops.md, Direct convolution kernel measurements).
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
//! skipping the padding columns, measured slower (same section).
//!
//! The parts, each using only those listed before it (and this module's block sizes):
//! - [`microkernel`]: the 8 × 48 block, its stores and what it applies in registers
//!   ([`split`]), the masked block of the same-width layout, and the one-tap column.
//! - [`tail`]: a last block of at most seven positions, with vectors over output channels.
//! - [`packing`]: the weights in the blocks' order, and columns copied into contiguous runs.
//! - [`compute`](mod@compute): the blocks over one group's output.
//! - [`tap_planes`]: the strided layout whose planes are exactly as wide as the output rows.
//! - [`copied`]: bands whose blocks store straight to the output rows, on same-width rows or
//!   tap planes.
//! - [`phase_planes`](mod@phase_planes): bands on phase planes, through a stage.
//! - [`broadcast`]: strided convolutions with positions broadcast, 7 × 32 blocks.
//! - [`pointwise`](mod@pointwise): 1×1 convolutions on a copy of each band, and the bands
//!   every one-tap projection runs in.
//! - [`fused`]: the depthwise-separable block and MobileNetV2's inverted residual.

mod broadcast;
mod compute;
mod copied;
mod fused;
mod microkernel;
mod packing;
mod phase_planes;
mod pointwise;
mod tail;
mod tap_planes;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::route::{self, Direct};
use super::shifted::Grid;
use super::{Geometry, Post};
use crate::dense::Out;
use crate::epilogue::epilogue_into;
use broadcast::broadcast_positions;
use copied::{conv_copied, conv_same_width, Copied};
use tap_planes::TapPlanes;

pub(super) use compute::compute;
pub(super) use fused::{inverted_residual, separable};
pub(super) use microkernel::{split, Dst, Residual};
pub(super) use phase_planes::{phase_grid_width, phase_planes, phase_row_bytes};
pub(super) use pointwise::pointwise;

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
