//! 1×1 convolutions on a copy of each band's input rows, and the bands in which every
//! pointwise projection runs: a tile of input planes that a fill writes, projected by the
//! microkernel with one tap.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::compute::compute;
use super::microkernel::{split, Dst, Residual};
use super::packing::pack;
use super::{OB, QB};
use crate::conv::{Geometry, Post};
use crate::dense::{with_scratch, with_shared_scratch, Out};
use crate::epilogue::epilogue;
use crate::prefetch::weights_ahead;
use crate::simd::InRegisters;

/// A 1×1 convolution (`g`: no padding, one group, any stride, its output rows
/// `(h - 1) / stride + 1` of the input's) of f32 NCHW on AVX-512 as the separable block's
/// pointwise half, on a copy of each band's input rows: at a stride, of the pixels it reads.
pub(in crate::conv) fn pointwise(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    post: Post<f32>,
) {
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

/// A band's depthwise output written into a tile: `fill(n, rows, chans, tile, plane, scratch)`
/// writes channel `chans.start + k`'s rows at `tile[k * plane..]` (`rows.len() * ow` elements),
/// given `scratch` of `extra(rows, chans.len())` elements of its own. `chans` starts on a
/// multiple of [`OB`].
pub(super) type Fill<'a> = dyn Fn(usize, std::ops::Range<usize>, std::ops::Range<usize>, &mut [f32], usize, &mut [f32])
    + Sync
    + 'a;

/// The scratch a band's fill needs of its own, `extra(rows, channels)` elements, for that many
/// of the tile's channels.
pub(super) type Extra<'a> = dyn Fn(&std::ops::Range<usize>, usize) -> usize + Sync + 'a;

/// The input a band's fill reads: `(n, rows)` to the slices (one per channel) to ask for
/// ahead of it.
pub(super) type InputOf<'a, 'b> =
    dyn Fn(usize, &std::ops::Range<usize>) -> Vec<&'b [f32]> + Sync + 'a;

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
/// batch 1) each band runs in two phases over all the threads: the tile's channels split between
/// them, then the output channels. Small whole images at a batch of at least twice the threads run
/// several to a task (as many as the tiles hold, at most four blocks of positions and the batch's
/// share per thread), their positions side by side in one tile, the projection staged and copied
/// out image by image, so that the microkernel's blocks of positions do not end partly empty at
/// each image's end (measured in docs/structured-ops.md, Routines: `conv::separable`).
#[allow(clippy::too_many_arguments)]
pub(super) fn pointwise_bands(
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
    let rows = crate::conv::band_rows(n_images, oh, row_bytes)
        .max(least)
        .min(oh.max(1));
    let bands = oh.div_ceil(rows);
    let job = |n: usize, band: std::ops::Range<usize>| {
        let p = band.len() * ow;
        let q_blocks = p.div_ceil(QB) * QB;
        // The band this thread is likely to take next (the threads claim tasks in turn), whose
        // input the projection asks for into L2 as it runs, so that the next depthwise half
        // reads less of it from memory; bands are sized to keep the tile and the next input in
        // L2 together. A wrong guess costs only the bandwidth. Where the prefetches slow the
        // projection by more than they save the fill, they are off (see [`prefetches_ahead`]
        // and docs/structured-ops.md, Direct convolution kernel measurements).
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
    let group = (crate::conv::TILE_BYTES / (oh * row_bytes).max(1))
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
        return crate::conv::for_each_band_fitted(
            n_images,
            oh,
            row_bytes,
            |rows| rows.max(least),
            &job,
        );
    }
    // No more bands than threads: the whole image as one band where its tiles fit, so that no
    // halo rows are recomputed and the positions fill more of the blocks (14×14, 96 channels
    // expanded to 576, batch 1: 218–230 µs in two bands of one task each, 191–195 so).
    let (rows, bands) = if oh * row_bytes <= crate::conv::TILE_BYTES {
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

/// Whether a pointwise projection asks for the next band's input as it runs (see
/// `pointwise_bands`): everywhere but on Intel CPUs. There the prefetches compete with the
/// projection's streamed stores for the core's line fill buffers, and slow it by more than they
/// save the depthwise fill, even spread thinner (measured in docs/structured-ops.md, Direct
/// convolution kernel measurements).
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
