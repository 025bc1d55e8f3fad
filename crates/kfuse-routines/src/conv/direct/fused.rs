//! The fused blocks whose projection runs on the microkernel: the depthwise-separable block
//! and MobileNetV2's inverted residual.

use super::compute::compute;
use super::microkernel::{split, Dst};
use super::packing::pack;
use super::pointwise::pointwise_bands;
use super::{OB, QB};
use crate::conv::{Geometry, Post};
use crate::dense::Out;
use crate::epilogue::epilogue;
use crate::prefetch::weights_ahead;
use crate::simd::InRegisters;

/// The depthwise-separable block for f32 NCHW on AVX-512: per band, the depthwise output goes
/// into a cache-sized tile (one plane per channel, padded to whole blocks), and the pointwise
/// convolution runs on it as the microkernel with one tap, storing straight to the output
/// (the band's rows of a channel are contiguous, so there are no padding columns to skip). `g` is the depthwise convolution's geometry; `wp` the `c_out × c` pointwise
/// weights.
#[allow(clippy::too_many_arguments)]
pub(in crate::conv) fn separable(
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
    // of the epilogue reads it back at once).
    let stream = std::mem::size_of_val(y) >= crate::STREAM_MIN_BYTES;
    separable_stored(g, xs, wd, middle, wp, c_out, y, post, stream)
}

/// [`separable`], its output stored non-temporally where `stream` (and no part of the
/// epilogue is left to run over the stored rows).
#[allow(clippy::too_many_arguments)]
pub(super) fn separable_stored(
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
            crate::conv::depthwise::band(
                &sub,
                xs,
                wd,
                0,
                band,
                Out(tile.as_mut_ptr()),
                plane,
                middle,
            )
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

/// MobileNetV2's inverted residual for f32 NCHW on AVX-512: a 1×1 expansion (`ge`, weights
/// `we`, its own bias and activation `expand`), the depthwise convolution `gd` of its result
/// (`wd`, `middle`), and the pointwise projection `wp`, per band of output rows. Each band
/// copies the input rows its depthwise rows read (the band's rows and the filter's halo) into
/// a tile, expands them into a second tile with the microkernel, runs the depthwise kernel on
/// that tile and the projection on the result: the expanded tensor, several times the input,
/// is never stored, at the cost of recomputing the halo rows' expansion.
#[allow(clippy::too_many_arguments)]
pub(in crate::conv) fn inverted_residual(
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
            crate::conv::depthwise::band(
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
