//! 3×3 stride-1 convolutions for f32 NCHW on AVX-512 by Winograd's minimal filtering,
//! F(2×2, 3×3): 16 multiplications per 2×2 block of outputs, input channel and output channel,
//! where the direct convolution takes 36.
//!
//! The output is cut into 2×2 tiles, each reading a 4×4 tile of input. Per band of tile rows
//! (one task):
//! 1. **Input transform.** Each input tile `d` becomes `V = Bᵀ d B` (sums and differences
//!    only), stored as 16 planes `V[ξ][c][t]`, one per element `ξ` of the 4×4 result, with the
//!    band's tiles `t` contiguous. Sixteen horizontally adjacent tiles are one vector: their
//!    columns are the even and odd lanes of two loads.
//! 2. **Products.** For each `ξ`, `M[ξ] = U[ξ] · V[ξ]` over the input channels, where `U[ξ]`
//!    are the transformed weights `G g Gᵀ` (made once per call, or kept with the weights when
//!    they are a registered constant). These are 16 GEMMs of `c_out × c_in` by `c_in × tiles`
//!    (per group, for a grouped convolution, whose groups run one after the other on each
//!    band), run on the direct convolution's microkernel (8 output channels × 48 tiles in
//!    registers).
//! 3. **Output transform.** Each output tile is `Aᵀ M A` (sums and differences again), then the
//!    bias and ReLU or a clamp in registers, interleaved back into pixel columns and stored to
//!    the output rows. The rest of an epilogue (a residual, other activations) runs over the
//!    band's rows afterwards, as in the direct convolution.
//!
//! The band's `V` (640 KiB at most) stays in L2 while blocks of 32 output channels read
//! it, and each block's `M` is consumed by the output transform right after its products.
//!
//! **Numerics.** The sums are in another order than the direct convolution's, with the
//! transforms' additions on top; the results agree within a few units in the last place of the
//! sum of the products' magnitudes (fast numerics only, as every structured kernel). A
//! non-finite value would not: an infinite input reaches its tile's other outputs through the
//! transforms as `inf - inf`, which is NaN where the direct sum is finite or infinite. So every
//! result is checked before its epilogue, and if one is not finite (a NaN or infinity in the
//! input, or an overflow in a transform) the whole convolution is computed again by the direct
//! kernel, which gives the reference's non-finite values. Non-finite transformed weights go to
//! the direct kernel at once.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::direct::{self, Dst, Residual, OB};
use super::route::{self, Plan};
use super::{for_each_band_fitted, Geometry, Post};
use crate::constants;
use crate::dense::{with_scratch, with_shared_scratch, Out};
use crate::epilogue::epilogue;
use crate::prefetch::{ask_line, weights_ahead};
use crate::simd::InRegisters;

/// Output channels per block of products: their `M` planes are written and read while hot.
const CB: usize = 32;
/// The bytes of a band's transformed input `V` that bands are sized for (they stay in L2).
const V_BYTES: usize = 640 << 10;
/// How many input channels ahead the input transform prefetches.
const PREFETCH: usize = 2;

/// The convolution of `g` into `y`, with the epilogue, its tiles laid out as the route table's
/// plan says ([`route::winograd_plan`]). Call only where the table routes `g` here.
pub(super) fn conv(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
    match route::winograd_plan(g) {
        Plan::AllAtOnce => return conv_small(g, xs, ws, y, post),
        Plan::Tasks => return conv_tiles(g, xs, ws, y, post),
        Plan::Bands => {}
    }
    let [n_images, c_out, oh, ow] = g.y;
    // Per group: `c_in` channels in, `og` out.
    let (c_in, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    let Some(u) = finite_transformed(ws, g.groups, og, c_in) else {
        return direct::conv(g, xs, ws, y, post);
    };
    // The residual joins the bias and the activation in the output transform's registers.
    let (in_registers, rest) = direct::split(post, true);
    let residual = Residual::of(in_registers.residual, y);
    let act = InRegisters::of(in_registers.act);
    let tw = ow.div_ceil(2);
    // Blocks of output channels per group, and in all (each group's padded to whole blocks).
    let per_group = og.div_ceil(OB);
    let blocks = g.groups * per_group;
    let spoiled = AtomicBool::new(false);
    let out = Out(y.as_mut_ptr());
    let job = |n: usize, band: std::ops::Range<usize>| {
        if spoiled.load(Ordering::Relaxed) {
            return;
        }
        let (r0, r1) = (band.start, band.end);
        let tile_rows = (r1 - r0).div_ceil(2);
        let tiles = tile_rows * tw;
        let tp = tiles.div_ceil(16) * 16;
        let cb = og.min(CB);
        // The 16 planes of `V` and of `M` are a line more than their rows apart: at a
        // multiple of 4 KiB they would all fall in one set of L1, which holds 12 lines.
        let (vs, ms) = (c_in * tp + 16, cb * tp + 16);
        with_scratch(16 * vs + 16 * ms, |scratch: &mut [f32]| {
            let (v, m) = scratch.split_at_mut(16 * vs);
            let at = Band {
                n,
                r0,
                r1,
                tw,
                tp,
                vs,
                ms,
            };
            for group in 0..g.groups {
                // SAFETY: the route table took this kernel only on AVX-512; the band's reads stay inside image n (masked
                // by the input's rows and columns), its writes inside `v`.
                unsafe { input_transform(g, xs, &at, group * c_in, v) };
                for c0 in (0..og).step_by(cb) {
                    let cc = cb.min(og - c0);
                    let (b0, b1) = (
                        group * per_group + c0 / OB,
                        group * per_group + (c0 + cc).div_ceil(OB),
                    );
                    let c0 = group * og + c0;
                    // SAFETY: `m`'s planes hold `cc` rows of `tp`, this task's.
                    unsafe {
                        products(
                            (&u, blocks),
                            b0..b1,
                            c_in,
                            (v, vs),
                            (m, ms),
                            tp,
                            (cc, tiles),
                        )
                    };
                    // SAFETY: as above; the stores go to rows r0..r1 of channels c0..c0 + cc of
                    // image n, this task's alone.
                    let finite = unsafe {
                        output_transform(
                            g,
                            m,
                            cb,
                            &at,
                            c0..c0 + cc,
                            (in_registers.bias, residual, act),
                            out.ptr(),
                        )
                    };
                    if !finite {
                        spoiled.store(true, Ordering::Relaxed);
                        return;
                    }
                    if !rest.is_empty() {
                        for co in c0..c0 + cc {
                            let at = ((n * c_out + co) * oh + r0) * ow;
                            let len = (r1 - r0) * ow;
                            // SAFETY: rows r0..r1 of channel co of image n are this task's.
                            let rows =
                                unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), len) };
                            epilogue(rows, rest.channel(co, at, len));
                        }
                    }
                }
            }
        });
    };
    // Bands of whole tile rows whose `V` takes at most `V_BYTES`, as many as fill the
    // microkernel's blocks of 48 tiles best: W7's rows of 28 tiles go five at a time (140 of
    // 144), where four (112 = 48 + 48 + 16) left a block of one vector, at a third of the
    // speed.
    let v_per_tile_row = 16 * c_in * tw * std::mem::size_of::<f32>();
    let most = (V_BYTES / v_per_tile_row).clamp(1, oh.div_ceil(2));
    let filled = |k: usize| (k * tw) as f64 / ((k * tw).div_ceil(direct::QB) * direct::QB) as f64;
    let k = (1..=most)
        .rev()
        .max_by(|&a, &b| filled(a).total_cmp(&filled(b)))
        .unwrap_or(1);
    for_each_band_fitted(
        n_images,
        oh,
        v_per_tile_row / 2,
        |rows| (rows / 2 * 2).clamp(2, 2 * k),
        &job,
    );
    if spoiled.into_inner() {
        direct::conv(g, xs, ws, y, post);
    }
}

/// [`conv`] for images of at most 16 tiles (`route::winograd_small`): ResNet's last stage, 7×7.
/// Per image a row of tiles would fill a quarter of a vector, and its 16 tiles a third of a
/// block of the microkernel; so the tiles of all the images lie side by side, an image's 16 in
/// one vector, and the call runs in three passes over all the threads:
/// 1. each image's input transform, its 16 inputs of each tile gathered (16 tiles to a
///    vector, one lane each), into `V[ξ][c][n·T + t]` for image `n`'s tile `t` of `T`;
/// 2. the 16 products `M[ξ] = U[ξ] · V[ξ]`, a task per `ξ` and half of the output channels,
///    blocks of 64 output channels at a time (their transformed weights and `V[ξ]` in L2);
/// 3. each image's output transform, the bias and `act` in registers, its 2×2 results of each
///    tile scattered to the output, the rest of the epilogue after.
///
/// At batch 1 (16 tiles, a third of a block) the direct kernel keeps them; with smaller
/// weights or more images, tasks of tiles (`route::winograd_plan`). Larger images stay on the
/// band-wise path: their `V` and `M` would pass through L3, so ResNet-50 gained nothing, and
/// 28×28 and 56×56 ran slower. The measurements are in `docs/structured-ops.md` ("Routines":
/// Winograd, and "Measurements behind design choices") and `docs/benchmarks.md` ("Network
/// blocks and layouts").
fn conv_small(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
    let [n_images, c_out, oh, ow] = g.y;
    let c_in = g.x[1];
    let Some(u) = tile_weights(g, ws) else {
        return direct::conv(g, xs, ws, y, post);
    };
    let (in_registers, rest) = direct::split(post, false);
    let act = InRegisters::of(in_registers.act);
    let tiles = oh.div_ceil(2) * ow.div_ceil(2);
    let p = n_images * tiles;
    let pads = [g.pad[0] as isize, g.pad[1] as isize];
    let tp = p.div_ceil(16) * 16;
    let blocks = c_out.div_ceil(OB);
    // The 16 planes of `V` and of `M`, a line more than their rows apart (see `conv`).
    let (vs, ms) = (c_in * tp + 16, blocks * OB * tp + 16);
    let pool = crate::Pool::global();
    let spoiled = AtomicBool::new(false);
    let out = Out(y.as_mut_ptr());
    with_shared_scratch(16 * vs + 16 * ms, |scratch: &mut [f32]| {
        let (v, m) = scratch.split_at_mut(16 * vs);
        // Positions past the last tile are read by the last block's vectors (never stored).
        for xi in 0..16 {
            for c in 0..c_in {
                v[xi * vs + c * tp + p..][..tp - p].fill(0.0);
            }
        }
        let (vp, mp) = (Out(v.as_mut_ptr()), Out(m.as_mut_ptr()));
        pool.run(n_images, &|n| {
            let image = n * tiles..(n + 1) * tiles;
            let [_, c, h, w] = g.x;
            let lanes = tile_lanes(g, image, 0, pads, [h, w, c * h * w]);
            // SAFETY: the route table took this kernel only on AVX-512; the lanes index image n's pixels, and its
            // tiles' places in `v` are this task's.
            unsafe {
                let lanes = lanes.expect("checked");
                input_transform_tiles(g, xs, (&lanes, n..n + 1), vp.ptr(), vs, tp)
            };
        });
        // A task per ξ and half of the output channels (in whole blocks).
        let half = blocks.div_ceil(2);
        pool.run(32, &|task| {
            let (xi, b0) = (task / 2, task % 2 * half);
            let b1 = (b0 + half).min(blocks);
            // SAFETY: pass 1 is done; plane ξ of `v` is only read now.
            let vx = unsafe { std::slice::from_raw_parts(vp.ptr().add(xi * vs), c_in * tp) };
            for c0 in (b0..b1).step_by(8) {
                let c1 = (c0 + 8).min(b1);
                let cc = ((c1 - c0) * OB).min(c_out - c0 * OB);
                let mx = mp.ptr().wrapping_add(xi * ms + c0 * OB * tp);
                // SAFETY: `mx` addresses rows of plane ξ of `m` that are this task's.
                unsafe { product((&u, blocks), xi, c0..c1, c_in, vx, mx, tp, (cc, p)) };
            }
        });
        pool.run(n_images, &|n| {
            // SAFETY: pass 2 is done; `m` is only read now, and image n's output is this
            // task's.
            let m = unsafe { std::slice::from_raw_parts(mp.ptr(), 16 * ms) };
            let image = n * tiles..(n + 1) * tiles;
            let lanes = tile_lanes(g, image, 0, [0, 0], [oh, ow, c_out * oh * ow]);
            // SAFETY: as above; the lanes index image n's output pixels.
            let finite = unsafe {
                output_transform_tiles(
                    g,
                    m,
                    ms,
                    tp,
                    &lanes.expect("checked"),
                    0..c_out,
                    in_registers.bias,
                    act,
                    out.ptr(),
                )
            };
            if !finite {
                spoiled.store(true, Ordering::Relaxed);
                return;
            }
            if !rest.is_empty() {
                for co in 0..c_out {
                    let at = (n * c_out + co) * oh * ow;
                    // SAFETY: image n's output is this task's.
                    let plane =
                        unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), oh * ow) };
                    epilogue(plane, rest.channel(co, at, oh * ow));
                }
            }
        });
    });
    if spoiled.into_inner() {
        direct::conv(g, xs, ws, y, post);
    }
}

/// [`conv`] in tasks of [`direct::QB`] tiles numbered across the images (an image's tiles
/// row-major, `T` of them): each task transforms its tiles' input (gathered, 16 tiles to a
/// vector), runs the 16 products over them in blocks of [`CB`] output channels and
/// transforms those back (scattered to the output), as a band does in [`conv`], whose bands of
/// whole tile rows leave the microkernel's last block partly empty (14×14: 35 of 48 tiles and
/// 14 of 16). The rest of the epilogue runs over each image after all tasks. Taken for outputs
/// narrower than `route::WINOGRAD_MIN_WIDTH` of one group, small images included where the
/// plan is not false. At 28×28 and 56×56 the bands keep them: their rows of 14 and 28 tiles
/// fill the blocks. Measured in `docs/structured-ops.md` ("Routines": Winograd, and
/// "Measurements behind design choices").
fn conv_tiles(g: &Geometry, xs: &[f32], ws: &[f32], y: &mut [f32], post: Post<f32>) {
    let [n_images, c_out, oh, ow] = g.y;
    let [_, c_in, h, w] = g.x;
    let Some(u) = tile_weights(g, ws) else {
        return direct::conv(g, xs, ws, y, post);
    };
    let (in_registers, rest) = direct::split(post, false);
    let act = InRegisters::of(in_registers.act);
    let per_image = oh.div_ceil(2) * ow.div_ceil(2);
    let all = n_images * per_image;
    let blocks = c_out.div_ceil(OB);
    let tp = direct::QB;
    let cb = c_out.min(CB);
    let (vs, ms) = (c_in * tp + 16, cb * tp + 16);
    let pads = [g.pad[0] as isize, g.pad[1] as isize];
    let spoiled = AtomicBool::new(false);
    let out = Out(y.as_mut_ptr());
    let pool = crate::Pool::global();
    pool.run(all.div_ceil(tp), &|task| {
        if spoiled.load(Ordering::Relaxed) {
            return;
        }
        let tiles = task * tp..((task + 1) * tp).min(all);
        let (first, count) = (tiles.start, tiles.len());
        let inputs = tile_lanes(g, tiles.clone(), first, pads, [h, w, c_in * h * w]);
        let outputs = tile_lanes(g, tiles, first, [0, 0], [oh, ow, c_out * oh * ow]);
        let (Some(inputs), Some(outputs)) = (inputs, outputs) else {
            unreachable!("the indices were checked to fit")
        };
        with_scratch(16 * vs + 16 * ms, |scratch: &mut [f32]| {
            let (v, m) = scratch.split_at_mut(16 * vs);
            // Positions past the last tile are read by the last block's vectors (never
            // stored).
            for xi in 0..16 {
                for c in 0..c_in {
                    v[xi * vs + c * tp + count..][..tp - count].fill(0.0);
                }
            }
            // SAFETY: the route table took this kernel only on AVX-512; the lanes index the images' pixels, and `v`
            // is this task's.
            let images = first / per_image..(first + count - 1) / per_image + 1;
            unsafe { input_transform_tiles(g, xs, (&inputs, images), v.as_mut_ptr(), vs, tp) };
            for c0 in (0..c_out).step_by(cb) {
                let cc = cb.min(c_out - c0);
                let (b0, b1) = (c0 / OB, (c0 + cc).div_ceil(OB));
                // SAFETY: `m`'s planes hold `cc` rows of `tp`, this task's.
                unsafe {
                    products(
                        (&u, blocks),
                        b0..b1,
                        c_in,
                        (v, vs),
                        (m, ms),
                        tp,
                        (cc, count),
                    )
                };
                // SAFETY: the lanes index the tiles' output pixels, this task's alone.
                let finite = unsafe {
                    output_transform_tiles(
                        g,
                        m,
                        ms,
                        tp,
                        &outputs,
                        c0..c0 + cc,
                        in_registers.bias,
                        act,
                        out.ptr(),
                    )
                };
                if !finite {
                    spoiled.store(true, Ordering::Relaxed);
                    return;
                }
            }
        })
    });
    if spoiled.into_inner() {
        return direct::conv(g, xs, ws, y, post);
    }
    if !rest.is_empty() {
        pool.run(n_images, &|n| {
            for co in 0..c_out {
                let at = (n * c_out + co) * oh * ow;
                // SAFETY: image n's output is this task's.
                let plane = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), oh * ow) };
                epilogue(plane, rest.channel(co, at, oh * ow));
            }
        });
    }
}

/// `M[ξ] = U[ξ] · V[ξ]` for output channel blocks `blocks` (`cc` channels; `all` blocks per
/// `ξ` in `u`) over `valid` positions, on the direct microkernel: `v` is plane `ξ` of `V`
/// (`c_in` rows `tp` apart), `m` the blocks' first row in plane `ξ` of `M` (rows `tp` apart).
///
/// # Safety
/// `m` must address `cc` rows of `tp` that are this thread's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    (u, all): (&[f32], usize),
    xi: usize,
    blocks: std::ops::Range<usize>,
    c_in: usize,
    v: &[f32],
    m: *mut f32,
    tp: usize,
    (cc, valid): (usize, usize),
) {
    let dst = Dst {
        ptr: m,
        stride: tp,
        channels: cc,
        valid,
    };
    let w = &u[(xi * all + blocks.start) * c_in * OB..][..blocks.len() * c_in * OB];
    // SAFETY: forwarded from the caller.
    unsafe {
        direct::compute(
            &v[..c_in * tp],
            tp,
            &[0],
            // Asked for ahead where the whole transform streams from memory (ResNet-50's
            // 7×7 layers: 16 MB).
            (w, weights_ahead(u.len())),
            dst,
            None,
            None,
            None,
            false,
            &[],
        )
    };
}

/// [`product`] for every `ξ`: `V`'s planes `vs` apart in `v`, `M`'s `ms` apart in `m`.
///
/// # Safety
/// Each plane of `m` must hold `cc` rows of `tp` that are this thread's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn products(
    weights: (&[f32], usize),
    blocks: std::ops::Range<usize>,
    c_in: usize,
    (v, vs): (&[f32], usize),
    (m, ms): (&mut [f32], usize),
    tp: usize,
    sizes: (usize, usize),
) {
    for xi in 0..16 {
        let mx = m[xi * ms..].as_mut_ptr();
        // SAFETY: forwarded from the caller.
        unsafe {
            product(
                weights,
                xi,
                blocks.clone(),
                c_in,
                &v[xi * vs..],
                mx,
                tp,
                sizes,
            )
        };
    }
}

/// A vector of up to 16 consecutive tiles: its first tile's place in the transformed planes,
/// its lanes, and per element `(r, k)` of the tiles (`E × E` of them) each lane's pixel's
/// index (from its image's first plane, or the output's) with the lanes whose pixel lies in
/// the image.
#[cfg(target_arch = "x86_64")]
type TileLanes<const E: usize> = (usize, __mmask16, [[(__m512i, __mmask16); E]; E]);

/// The tiles `tiles` (numbered across the images, `T` to an image, row-major within it, `⌈ow /
/// 2⌉` to a row) in vectors of 16: for each vector, its first tile less `origin`, its lanes,
/// and per element `(r, k)` of an `E × E` tile (its pixel at `(2 tile_row + r - top, 2
/// tile_column + k - left)` in images of `h × w` pixels, `plane` elements apart) the pixel's
/// index from image 0, and the lanes inside the image. `None` where an index would not fit
/// in 32 bits.
fn tile_lanes<const E: usize>(
    g: &Geometry,
    tiles: std::ops::Range<usize>,
    origin: usize,
    [top, left]: [isize; 2],
    [h, w, plane]: [usize; 3],
) -> Option<Vec<TileLanes<E>>> {
    let tw = g.y[3].div_ceil(2);
    let per_image = g.y[2].div_ceil(2) * tw;
    if g.y[0] * plane > i32::MAX as usize {
        return None;
    }
    let vectors = tiles
        .clone()
        .step_by(16)
        .map(|t0| {
            let lanes = (tiles.end - t0).min(16);
            let indices = std::array::from_fn(|r| {
                std::array::from_fn(|k| {
                    let mut index = [0i32; 16];
                    let mut inside = 0u16;
                    for (l, at) in index.iter_mut().enumerate().take(lanes) {
                        let (n, t) = ((t0 + l) / per_image, (t0 + l) % per_image);
                        let row = 2 * (t / tw) as isize + r as isize - top;
                        let col = 2 * (t % tw) as isize + k as isize - left;
                        if (0..h as isize).contains(&row) && (0..w as isize).contains(&col) {
                            *at = (n * plane) as i32 + (row * w as isize + col) as i32;
                            inside |= 1 << l;
                        }
                    }
                    // SAFETY: 16 i32 values into 16 lanes.
                    (unsafe { _mm512_loadu_si512(index.as_ptr().cast()) }, inside)
                })
            });
            (t0 - origin, ((1u32 << lanes) - 1) as __mmask16, indices)
        })
        .collect();
    Some(vectors)
}

/// Transformed input tiles: `v[ξ·vs + c·tp + t - origin]` for each tile `t` of `vectors` (see
/// [`tile_lanes`], for the input's pixels and padding), which lie in `images` and every input channel `c`, `Bᵀ d B`
/// of the 4×4 input tile `d` at row `2·tile_row - pad_top`, column `2·tile_column - pad_left`
/// of its image (zero outside it), as [`input_transform`] computes it: 16 tiles to a vector,
/// their inputs gathered.
///
/// # Safety
/// The CPU must have AVX-512F; `vectors` must index pixels of `xs`'s images (`g.x`), and `v`
/// must hold the 16 planes, the tiles' places this thread's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn input_transform_tiles(
    g: &Geometry,
    xs: &[f32],
    (vectors, images): (&[TileLanes<4>], std::ops::Range<usize>),
    v: *mut f32,
    vs: usize,
    tp: usize,
) {
    let [n_images, c_in, h, w] = g.x;
    assert!(xs.len() >= n_images * c_in * h * w);
    for c in 0..c_in {
        let plane = xs[g.x_offset(0, c, 0, 0)..].as_ptr();
        // Each channel's planes of the tiles' images are asked for a few channels ahead (a
        // gather's lines, from L3, would each wait in turn).
        if c + PREFETCH < c_in {
            for n in images.clone() {
                let ahead = xs[g.x_offset(n, c + PREFETCH, 0, 0)..][..h * w].as_ptr();
                for line in (0..h * w).step_by(16) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                }
            }
        }
        for (at, keep, taps) in vectors {
            // Each input row transformed along the row (d B), then down the columns.
            let e: [[__m512; 4]; 4] = std::array::from_fn(|r| {
                let d: [__m512; 4] = std::array::from_fn(|k| {
                    let (index, inside) = taps[r][k];
                    // SAFETY: the mask lets through only indices of the images' pixels.
                    unsafe {
                        _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), inside, index, plane)
                    }
                });
                bt(d)
            });
            let columns: [[__m512; 4]; 4] =
                std::array::from_fn(|j| bt([e[0][j], e[1][j], e[2][j], e[3][j]]));
            for (j, column) in columns.iter().enumerate() {
                for (i, value) in column.iter().enumerate() {
                    let to = v.wrapping_add((4 * i + j) * vs + c * tp + at);
                    // SAFETY: the tiles' places in plane (ξ, c), as the caller vouches.
                    unsafe { _mm512_mask_storeu_ps(to, *keep, *value) };
                }
            }
        }
    }
}

/// Output channels `chans` from their products `m[ξ·ms + o·tp + t - origin]` (`o` from
/// `chans.start`) of the tiles of `vectors` (see [`tile_lanes`], for the output's pixels):
/// `Aᵀ M A` of each tile, then the bias and `act`, scattered to the tile's 2×2 output pixels
/// (those inside the image). Returns whether every result was finite (before the bias).
///
/// # Safety
/// The CPU must have AVX-512F and DQ; `vectors` must index pixels of the output at `y`
/// (`g.y`), and those of channels `chans` must be writable and this thread's alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn output_transform_tiles(
    g: &Geometry,
    m: &[f32],
    ms: usize,
    tp: usize,
    vectors: &[TileLanes<2>],
    chans: std::ops::Range<usize>,
    bias: Option<&[f32]>,
    act: Option<InRegisters>,
    y: *mut f32,
) -> bool {
    let [_, _, oh, ow] = g.y;
    let reach = vectors.iter().map(|v| v.0 + 16).max().unwrap_or(0);
    assert!(m.len() >= 15 * ms + chans.len().saturating_sub(1) * tp + reach.min(tp));
    let inf = _mm512_set1_ps(f32::INFINITY);
    let mp = m.as_ptr();
    for (o, co) in chans.enumerate() {
        let b = _mm512_set1_ps(bias.map_or(0.0, |b| b[co]));
        let plane = y.wrapping_add(co * oh * ow);
        for (at, keep, places) in vectors {
            // SAFETY: the tiles' lanes of plane (ξ, o), within `m` (asserted).
            let mm: [__m512; 16] = std::array::from_fn(|xi| unsafe {
                _mm512_maskz_loadu_ps(*keep, mp.add(xi * ms + o * tp + at))
            });
            for (a, places) in places.iter().enumerate() {
                let s: [__m512; 4] = std::array::from_fn(|j| {
                    let (m0, m1, m2, m3) = (mm[j], mm[4 + j], mm[8 + j], mm[12 + j]);
                    if a == 0 {
                        _mm512_add_ps(_mm512_add_ps(m0, m1), m2)
                    } else {
                        _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3)
                    }
                });
                let pair = [
                    _mm512_add_ps(_mm512_add_ps(s[0], s[1]), s[2]),
                    _mm512_sub_ps(_mm512_sub_ps(s[1], s[2]), s[3]),
                ];
                for (bcol, &value) in pair.iter().enumerate() {
                    let (index, inside) = places[bcol];
                    let finite =
                        _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(inside, _mm512_abs_ps(value), inf);
                    if finite != inside {
                        return false;
                    }
                    let mut value = _mm512_add_ps(value, b);
                    if let Some(act) = act {
                        // SAFETY: compiled for AVX-512F and DQ.
                        value = unsafe { act.apply(value) };
                    }
                    // SAFETY: the mask lets through only pixels of channel co of the tiles'
                    // images.
                    unsafe { _mm512_mask_i32scatter_ps::<4>(plane, inside, index, value) };
                }
            }
        }
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn input_transform_tiles(
    _: &Geometry,
    _: &[f32],
    _: &[TileLanes<4>],
    _: *mut f32,
    _: usize,
    _: usize,
) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn output_transform_tiles(
    _: &Geometry,
    _: &[f32],
    _: usize,
    _: usize,
    _: &[TileLanes<2>],
    _: std::ops::Range<usize>,
    _: (Option<&[f32]>, Option<Residual>, Option<InRegisters>),
    _: *mut f32,
) -> bool {
    unreachable!("the route table takes this kernel only on AVX-512")
}

/// The output rows one task computes: image `n`, rows `r0..r1` (`r0` even), as tile rows of
/// `tw` tiles, stored `tp` apart (whole vectors) in the transformed planes, which are `vs`
/// (`V`) and `ms` (`M`) apart.
struct Band {
    n: usize,
    r0: usize,
    r1: usize,
    tw: usize,
    tp: usize,
    vs: usize,
    ms: usize,
}

/// The transformed weights of `ws` ([`transformed_weights`]) where every one is finite, else
/// none (the direct kernel then runs the call). Checked once for constant weights, as their
/// transform is kept (16 MB for 512 → 512 channels would be read at every call).
fn finite_transformed(ws: &[f32], groups: usize, og: usize, cg: usize) -> Option<Arc<Vec<f32>>> {
    let u = transformed_weights(ws, groups, og, cg);
    constants::holds(ws, constants::FINITE_TRANSFORMED, || {
        u.iter().all(|v| v.is_finite())
    })
    .then_some(u)
}

/// [`finite_transformed`] for the tile paths ([`conv_small`], [`conv_tiles`]), of one group,
/// which also need the images' pixels (in and out) to index in 32 bits for their gathers and
/// scatters.
fn tile_weights(g: &Geometry, ws: &[f32]) -> Option<Arc<Vec<f32>>> {
    let ([n, c_in, h, w], [_, c_out, oh, ow]) = (g.x, g.y);
    let fits = (n * c_in * h * w).max(n * c_out * oh * ow) <= i32::MAX as usize;
    fits.then(|| finite_transformed(ws, 1, c_out, c_in))
        .flatten()
}

/// The transformed weights `U[ξ] = (G g Gᵀ)[ξ]` of the `groups·og × cg × 3 × 3` weights
/// `ws`, packed per `ξ` as the microkernel reads them: `[ξ][block of OB outputs][cg][OB]`, each
/// group's `og` outputs in whole blocks (zeros past its last output channel); kept with the
/// weights where they are a registered constant.
fn transformed_weights(ws: &[f32], groups: usize, og: usize, cg: usize) -> Arc<Vec<f32>> {
    constants::packed(ws, [2, groups, og, cg, 0], || {
        let per_group = og.div_ceil(OB);
        let blocks = groups * per_group;
        let mut u = vec![0.0f32; 16 * blocks * cg * OB];
        let shared = Out(u.as_mut_ptr());
        // Block `b` of output channels: its `cg * OB` values in each of the 16 planes.
        let block = |b: usize| {
            let (group, first) = (b / per_group, b % per_group * OB);
            for o in first..(first + OB).min(og) {
                let co = group * og + o;
                for ci in 0..cg {
                    let g = &ws[(co * cg + ci) * 9..][..9];
                    // G g: each filter column's 3 values to 4.
                    let gg: [[f32; 3]; 4] = std::array::from_fn(|i| {
                        std::array::from_fn(|j| spread(i, [g[j], g[3 + j], g[6 + j]]))
                    });
                    for (i, row) in gg.iter().enumerate() {
                        for j in 0..4 {
                            let at = (((4 * i + j) * blocks + b) * cg + ci) * OB + o % OB;
                            // SAFETY: block b's values are this task's alone, within `u`.
                            unsafe { *shared.ptr().add(at) = spread(j, *row) };
                        }
                    }
                }
            }
        };
        // Made by every thread, a share of the blocks each: weights that are not constants
        // are transformed at every call, and on one thread the others would wait for it.
        let pool = crate::Pool::global();
        let per_task = blocks.div_ceil(pool.threads());
        pool.run(pool.threads(), &|t| {
            for b in t * per_task..((t + 1) * per_task).min(blocks) {
                block(b);
            }
        });
        u
    })
}

/// Row `i` of `G [a, b, c]ᵀ`, `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]]`.
fn spread(i: usize, [a, b, c]: [f32; 3]) -> f32 {
    match i {
        0 => a,
        1 => (a + b + c) * 0.5,
        2 => (a - b + c) * 0.5,
        _ => c,
    }
}

/// The lanes `k` of a 16-wide vector whose column `col0 + k` lies in `0..width`.
fn columns(col0: isize, width: usize) -> u16 {
    let lo = (-col0).clamp(0, 16) as u32;
    let hi = (width as isize - col0).clamp(0, 16) as u32;
    if lo >= hi {
        0
    } else {
        (((1u32 << (hi - lo)) - 1) << lo) as u16
    }
}

/// Writes the band's transformed input tiles of one group's input channels (from
/// `first_channel`): `v[ξ][c][t]` for tile `t = row * tw + column` of the band, `Bᵀ d B` of
/// the 4×4 input tile `d` of channel `first_channel + c` at input row `2 * tile_row - pad_top`, column
/// `2 * column - pad_left` (zero outside the image), for `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0],
/// [0, -1, 1, 0], [0, 1, 0, -1]]`.
///
/// Each input row is loaded and transformed along the row (`d B`) once, for the two tile rows
/// that read it; the transform down the columns (`Bᵀ (d B)`) then takes four of those rows.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn input_transform(
    g: &Geometry,
    xs: &[f32],
    at: &Band,
    first_channel: usize,
    v: &mut [f32],
) {
    let [_, _, h, w] = g.x;
    let c_in = g.in_channels_per_group();
    let (pt, pl) = (g.pad[0] as isize, g.pad[1] as isize);
    let tile_rows = (at.r1 - at.r0).div_ceil(2);
    assert!(v.len() >= 15 * at.vs + c_in * at.tp && xs.len() >= (at.n + 1) * g.x[1] * h * w);
    assert!(first_channel + c_in <= g.x[1]);
    let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    let vp = v.as_mut_ptr();
    // Per vector of 16 tiles: the first column it reads, and the masks of its four loads
    // (columns col0.., col0 + 16.., col0 + 2.., col0 + 18..) and of its tiles.
    let groups: Vec<(isize, [__mmask16; 4], __mmask16)> = (0..at.tw)
        .step_by(16)
        .map(|t0| {
            let col0 = 2 * t0 as isize - pl;
            let masks = [0, 16, 2, 18].map(|d| columns(col0 + d, w));
            (
                col0,
                masks,
                ((1u32 << (at.tw - t0).min(16)) - 1) as __mmask16,
            )
        })
        .collect();
    // The input rows the band reads, clipped to the image: their lines are prefetched a few
    // channels ahead (each channel's rows are a short run, too short for the hardware
    // prefetcher to reach before the loads stall on memory).
    let top = at.r0 as isize - pt;
    let first = top.clamp(0, h as isize) as usize;
    let last = (top + 2 * tile_rows as isize + 2).clamp(0, h as isize) as usize;
    for c in 0..c_in {
        let plane = xs[g.x_offset(at.n, first_channel + c, 0, 0)..].as_ptr();
        if c + PREFETCH < c_in && first < last {
            let ahead = xs[g.x_offset(at.n, first_channel + c + PREFETCH, first, 0)..].as_ptr();
            for line in (0..(last - first) * w).step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
            }
        }
        for (tv, &(col0, masks, keep)) in groups.iter().enumerate() {
            // Input row `row` transformed along the row: (d B) of its columns col0 + 2 lane..
            let along = |row: isize| -> [__m512; 4] {
                if !(0..h as isize).contains(&row) {
                    return [_mm512_setzero_ps(); 4];
                }
                let base = plane.wrapping_offset(row * w as isize);
                // SAFETY: the masks keep the lanes whose column lies in the row.
                let load = |k: usize, d: isize| unsafe {
                    _mm512_maskz_loadu_ps(masks[k], base.wrapping_offset(col0 + d))
                };
                let (a0, a1, b0, b1) = (load(0, 0), load(1, 16), load(2, 2), load(3, 18));
                let d0 = _mm512_permutex2var_ps(a0, even, a1);
                let d1 = _mm512_permutex2var_ps(a0, odd, a1);
                let d2 = _mm512_permutex2var_ps(b0, even, b1);
                let d3 = _mm512_permutex2var_ps(b0, odd, b1);
                bt([d0, d1, d2, d3])
            };
            let (mut e0, mut e1) = (along(top), along(top + 1));
            for tr in 0..tile_rows {
                let row = top + 2 * tr as isize;
                let (e2, e3) = (along(row + 2), along(row + 3));
                for j in 0..4 {
                    let column = bt([e0[j], e1[j], e2[j], e3[j]]);
                    for (i, value) in column.iter().enumerate() {
                        let xi = 4 * i + j;
                        let to = vp.wrapping_add(xi * at.vs + c * at.tp + tr * at.tw + 16 * tv);
                        // SAFETY: tile tr * tw + 16 tv + lane < tiles <= tp of plane (ξ, c),
                        // for the lanes kept. (A whole vector's store is not masked: a masked
                        // store holds back later loads whose addresses might overlap it.)
                        unsafe {
                            if keep == u16::MAX {
                                _mm512_storeu_ps(to, *value)
                            } else {
                                _mm512_mask_storeu_ps(to, keep, *value)
                            }
                        };
                    }
                }
                (e0, e1) = (e2, e3);
            }
        }
    }
}

/// `Bᵀ x` for a column `x` of four vectors.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bt(x: [__m512; 4]) -> [__m512; 4] {
    // SAFETY: only called from functions compiled for AVX-512F.
    unsafe {
        [
            _mm512_sub_ps(x[0], x[2]),
            _mm512_add_ps(x[1], x[2]),
            _mm512_sub_ps(x[2], x[1]),
            _mm512_sub_ps(x[1], x[3]),
        ]
    }
}

/// Output channels `chans` of the band from their products `m[ξ][o][t]` (`o` from
/// `chans.start`): `Aᵀ M A` for `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`,
/// interleaved into the output rows, then the bias, the residual (laid out as the output)
/// and `act`. Returns whether every result was finite (before the bias); the stores are then
/// all made.
///
/// # Safety
/// The CPU must have AVX-512F and DQ; rows `r0..r1` of channels `chans` of image `n` of the
/// output at `y` must be writable and this thread's alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn output_transform(
    g: &Geometry,
    m: &[f32],
    cb: usize,
    at: &Band,
    chans: std::ops::Range<usize>,
    (bias, residual, act): (Option<&[f32]>, Option<Residual>, Option<InRegisters>),
    y: *mut f32,
) -> bool {
    let [_, c_out, oh, ow] = g.y;
    let tile_rows = (at.r1 - at.r0).div_ceil(2);
    assert!(m.len() >= 15 * at.ms + cb * at.tp && chans.len() <= cb);
    let lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    let hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    let inf = _mm512_set1_ps(f32::INFINITY);
    let mp = m.as_ptr();
    for (o, co) in chans.clone().enumerate() {
        let b = _mm512_set1_ps(bias.map_or(0.0, |b| b[co]));
        let plane = y.wrapping_add((at.n * c_out + co) * oh * ow);
        if let (Some(r), true) = (&residual, co + 1 < chans.end) {
            // The next channel's rows of the residual, a short run the hardware prefetchers
            // would pick up late, asked for while this channel's are computed.
            let next = r.at(plane.wrapping_add(oh * ow + at.r0 * ow));
            let bytes = (at.r1 - at.r0) * ow * std::mem::size_of::<f32>();
            let first = next as usize & !63;
            for line in (first..next as usize + bytes).step_by(64) {
                ask_line(line as *const f32);
            }
        }
        for tr in 0..tile_rows {
            for t0 in (0..at.tw).step_by(16) {
                let lanes = (at.tw - t0).min(16);
                let keep = ((1u32 << lanes) - 1) as __mmask16;
                // SAFETY: tile tr * tw + t0 + lane < tp of plane (ξ, o).
                let mm: [__m512; 16] = std::array::from_fn(|xi| unsafe {
                    _mm512_maskz_loadu_ps(keep, mp.add(xi * at.ms + o * at.tp + tr * at.tw + t0))
                });
                // Aᵀ M along each column, then along each row.
                let s: [[__m512; 4]; 2] = std::array::from_fn(|a| {
                    std::array::from_fn(|j| {
                        let (m0, m1, m2, m3) = (mm[j], mm[4 + j], mm[8 + j], mm[12 + j]);
                        if a == 0 {
                            _mm512_add_ps(_mm512_add_ps(m0, m1), m2)
                        } else {
                            _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3)
                        }
                    })
                });
                for (a, s) in s.iter().enumerate() {
                    // The second row of the last tile of an odd-height band is not output.
                    let r = at.r0 + 2 * tr + a;
                    if r >= at.r1 {
                        continue;
                    }
                    let y0 = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), s[2]);
                    let y1 = _mm512_sub_ps(_mm512_sub_ps(s[1], s[2]), s[3]);
                    let finite =
                        _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(keep, _mm512_abs_ps(y0), inf)
                            & _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(keep, _mm512_abs_ps(y1), inf);
                    if finite != keep {
                        return false;
                    }
                    // Columns 2 * t0.. of row r: the two results of each tile side by side.
                    let x0 = 2 * t0;
                    let n = (ow - x0).min(32);
                    let row = plane.wrapping_add(r * ow + x0);
                    let first = ((1u32 << n.min(16)) - 1) as __mmask16;
                    let second = ((1u32 << n.saturating_sub(16)) - 1) as __mmask16;
                    let finish = |v: __m512, at: *mut f32, mask: __mmask16| {
                        let mut v = _mm512_add_ps(v, b);
                        if let Some(r) = &residual {
                            // SAFETY: the residual's elements of this task's output pixels.
                            v = _mm512_add_ps(v, unsafe { _mm512_maskz_loadu_ps(mask, r.at(at)) });
                        }
                        match act {
                            // SAFETY: compiled for AVX-512F and DQ.
                            Some(act) => unsafe { act.apply(v) },
                            None => v,
                        }
                    };
                    let (p0, p1) = (
                        _mm512_permutex2var_ps(y0, lo, y1),
                        _mm512_permutex2var_ps(y0, hi, y1),
                    );
                    let at = row.wrapping_add(16);
                    // SAFETY: columns x0..x0 + n of row r < r1 of this channel.
                    unsafe {
                        _mm512_mask_storeu_ps(row, first, finish(p0, row, first));
                        if second != 0 {
                            _mm512_mask_storeu_ps(at, second, finish(p1, at, second));
                        }
                    }
                }
            }
        }
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn input_transform(_: &Geometry, _: &[f32], _: &Band, _: usize, _: &mut [f32]) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn output_transform(
    _: &Geometry,
    _: &[f32],
    _: usize,
    _: &Band,
    _: std::ops::Range<usize>,
    _: (Option<&[f32]>, Option<Residual>, Option<InRegisters>),
    _: *mut f32,
) -> bool {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::has_avx512;
    use crate::epilogue::Activation;
    use kfuse_ir::Conv2dAttrs;

    /// Whether the route table takes `g` to the Winograd kernel on this machine.
    fn applies(g: &Geometry) -> bool {
        route::winograd(g, true, route::Isa::host()).is_ok()
    }

    /// A convolution of these sizes: `(n, c_in, c_out, h, w, [top, bottom, left, right])`.
    type Case = (usize, usize, usize, usize, usize, [usize; 4]);

    fn geometry(case: &Case) -> Geometry {
        grouped(case, 1)
    }

    /// The convolution of `case` in `groups` groups.
    fn grouped(&(n, ci, co, h, w, pad): &Case, groups: usize) -> Geometry {
        let attrs = Conv2dAttrs {
            padding: pad,
            groups,
            ..Conv2dAttrs::default()
        };
        let (oh, ow) = (h + pad[0] + pad[1] - 2, w + pad[2] + pad[3] - 2);
        Geometry::new(
            &[n, ci, h, w],
            &[co, ci / groups, 3, 3],
            &attrs,
            &[n, co, oh, ow],
        )
    }

    /// Runs `g` on `xs` and `ws` bare and with each epilogue path (bias + ReLU, bias + clamp and,
    /// on the band-wise path, bias + residual + ReLU in registers; bias + residual + tanh, the
    /// tanh after the stores), checking every output against
    /// its sum of products (`residual_seed` draws the residual).
    fn check_epilogues(g: &Geometry, xs: &[f32], ws: &[f32], residual_seed: u64, what: &str) {
        check_routine(conv, g, xs, ws, residual_seed, what)
    }

    /// A convolution routine: geometry, input, weights, output, epilogue.
    type Routine = fn(&Geometry, &[f32], &[f32], &mut [f32], Post<f32>);

    /// [`check_epilogues`] for `routine` in place of [`conv`].
    fn check_routine(
        routine: Routine,
        g: &Geometry,
        xs: &[f32],
        ws: &[f32],
        residual_seed: u64,
        what: &str,
    ) {
        let [_, co, oh, ow] = g.y;
        let bias: Vec<f32> = (0..co).map(|o| o as f32 * 0.25 - 2.0).collect();
        let residual = input(g.y.iter().product(), residual_seed, 0, &[]);
        let want = reference(g, xs, ws);
        let with = |act, residual| Post {
            bias: Some(&bias[..]),
            residual,
            act: Some(act),
        };
        let plans = [
            (Post::none(), "bare"),
            (with(Activation::Relu, None), "bias + relu"),
            (
                with(Activation::Clamp(kfuse_ir::Bounds::new(-0.5, 1.5)), None),
                "bias + clamp",
            ),
            (
                with(Activation::Relu, Some(&residual[..])),
                "bias + residual + relu",
            ),
            (
                with(Activation::Tanh, Some(&residual[..])),
                "bias + residual + tanh",
            ),
        ];
        for (post, plan) in plans {
            let mut got = vec![f32::NAN; g.y.iter().product()];
            routine(g, xs, ws, &mut got, post);
            super::super::reference::assert_within(
                &got,
                &want,
                &post,
                (co, oh * ow),
                &format!("{what} {plan}"),
            );
        }
    }

    use super::super::reference::{sums as reference, values as input};

    fn run(g: &Geometry, xs: &[f32], ws: &[f32], post: Post<f32>) -> Vec<f32> {
        let mut y = vec![f32::NAN; g.y.iter().product()];
        conv(g, xs, ws, &mut y, post);
        y
    }

    fn direct_of(g: &Geometry, xs: &[f32], ws: &[f32], post: Post<f32>) -> Vec<f32> {
        let mut y = vec![f32::NAN; g.y.iter().product()];
        direct::conv(g, xs, ws, &mut y, post);
        y
    }

    const CASES: [Case; 7] = [
        (1, 16, 16, 2, 24, [1, 1, 1, 1]),
        (2, 17, 33, 5, 27, [1, 1, 1, 1]),
        (1, 16, 24, 9, 31, [1, 1, 1, 1]),
        (1, 32, 16, 8, 26, [0, 0, 0, 0]),
        (1, 16, 40, 6, 35, [0, 1, 1, 0]),
        (3, 20, 16, 13, 24, [2, 0, 0, 2]),
        (1, 24, 16, 4, 64, [1, 1, 1, 1]),
    ];

    /// Each output is the sum of its products within a few units of rounding of their
    /// magnitudes, then the epilogue: odd sizes, one tile, outputs of odd height and width,
    /// asymmetric and no padding, partial blocks of channels and tiles; every activation
    /// path (in registers, after a residual). Edge values (signed zeros, subnormals) are
    /// finite and stay on this path.
    #[test]
    fn each_output_is_its_sum_within_rounding() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "each_output_is_its_sum_within_rounding",
                kfuse_testkit::Prerequisite::Avx512,
                "the Winograd kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        let specials = [0.0, -0.0, 1e-40, -3e-39, f32::MIN_POSITIVE, 1e-30];
        for (case, edge) in CASES.iter().zip([0, 7, 0, 5, 3, 0, 11]) {
            let g = geometry(case);
            assert!(applies(&g), "{case:?} takes the Winograd kernel");
            let (ci, co) = (g.x[1], g.y[1]);
            let xs = input(g.x.iter().product(), 1, edge, &specials);
            let ws = input(co * ci * 9, 2, 0, &[]);
            check_epilogues(&g, &xs, &ws, 3, &format!("{case:?}"));
        }
    }

    /// Outputs narrower than `route::WINOGRAD_MIN_WIDTH` (taken with many channels and a large
    /// batch, see `route::WINOGRAD_MIN_NARROW_WIDTH`), in tasks of tiles across the images ([`conv_tiles`]): rows of 10
    /// to 23 outputs, odd ones, partial channel blocks, asymmetric padding, tasks of fewer
    /// tiles than a block, with every epilogue path; and an infinity in the input. Whether
    /// `applies` takes them depends on the threads (the batch per thread); the kernel is run on
    /// them either way.
    #[test]
    fn narrow_outputs_of_many_channels_match_their_sums() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "narrow_outputs_of_many_channels_match_their_sums",
                kfuse_testkit::Prerequisite::Avx512,
                "the Winograd kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        let cases: [Case; 4] = [
            (2, 128, 128, 10, 10, [1, 1, 1, 1]),
            (1, 128, 136, 7, 13, [1, 1, 1, 1]),
            (1, 130, 128, 9, 21, [0, 1, 2, 0]),
            (3, 128, 128, 5, 14, [1, 1, 1, 1]),
        ];
        for sizes in &cases {
            assert!(
                (route::WINOGRAD_MIN_NARROW_WIDTH..route::WINOGRAD_MIN_WIDTH)
                    .contains(&geometry(sizes).y[3])
            );
        }
        check_cases(conv, &cases, 60, "narrow", &[]);
        infinity_gives_the_direct_output(&geometry(&cases[0]), 70, None);
    }

    /// Each case through `routine` against its sums with every epilogue, its seeds from
    /// `seed`, its input holding `specials` every fifth value.
    fn check_cases(routine: Routine, cases: &[Case], seed: u64, what: &str, specials: &[f32]) {
        for (case, sizes) in cases.iter().enumerate() {
            let g = geometry(sizes);
            let seed = seed + 3 * case as u64;
            let edge = if specials.is_empty() { 0 } else { 5 };
            let xs = input(g.x.iter().product(), seed, edge, specials);
            let ws = input(g.y[1] * g.x[1] * 9, seed + 1, 0, &[]);
            check_routine(
                routine,
                &g,
                &xs,
                &ws,
                seed + 2,
                &format!("{what} case {case}"),
            );
        }
    }

    /// An infinity in the input of `g` (its seed `seed`), with ReLU and the bias if given:
    /// the output is the direct kernel's, bit for bit, and holds a non-finite value.
    fn infinity_gives_the_direct_output(g: &Geometry, seed: u64, bias: Option<&[f32]>) {
        let len = g.x.iter().product();
        let xs = input(len, seed, len, &[f32::INFINITY]);
        let ws = input(g.y[1] * g.x[1] * 9, seed + 1, 0, &[]);
        let post = Post {
            bias,
            residual: None,
            act: Some(Activation::Relu),
        };
        let (got, want) = (run(g, &xs, &ws, post), direct_of(g, &xs, &ws, post));
        assert!(want.iter().any(|v| !v.is_finite()));
        assert!(same_bits(&got, &want));
    }

    /// Whether two outputs agree bit for bit.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
    }

    /// Small images with their tiles side by side, all at once ([`conv_small`]) and in tasks of
    /// 48 tiles ([`conv_tiles`]): 7×7 and 8×8 outputs, odd ones (3×3 tiles, the last row and
    /// column half outside), no padding and asymmetric padding, partial blocks of output
    /// channels, exactly one block of 48 tiles and several, with every epilogue path; the
    /// choice between the two for ResNet's last stage; and an infinity in the input, which
    /// gives the direct kernel's output bit for bit either way.
    #[test]
    fn small_images_side_by_side_match_their_sums() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "small_images_side_by_side_match_their_sums",
                kfuse_testkit::Prerequisite::Avx512,
                "the Winograd kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        let cases: [Case; 5] = [
            (8, 128, 128, 7, 7, [1, 1, 1, 1]),
            (6, 136, 130, 5, 6, [1, 1, 1, 1]),
            (3, 128, 144, 8, 8, [1, 1, 1, 1]),
            (12, 128, 128, 6, 9, [0, 0, 0, 0]),
            (5, 129, 128, 7, 7, [2, 0, 0, 2]),
        ];
        for (case, sizes) in cases.iter().enumerate() {
            let g = geometry(sizes);
            assert!(
                applies(&g) && route::winograd_small(&g),
                "small case {case}"
            );
        }
        let specials = [0.0, -0.0, 1e-40, -3e-39];
        check_cases(conv_small, &cases, 80, "all at once", &specials);
        check_cases(conv_tiles, &cases, 80, "in tasks", &specials);
        // ResNet's last stage at batch 8 runs all at once, at batch 16 in tasks.
        assert_eq!(
            route::winograd_plan(&geometry(&(8, 512, 512, 7, 7, [1, 1, 1, 1]))),
            Plan::AllAtOnce
        );
        assert_ne!(
            route::winograd_plan(&geometry(&(16, 512, 512, 7, 7, [1, 1, 1, 1]))),
            Plan::AllAtOnce
        );
        let g = geometry(&(4, 512, 384, 7, 7, [1, 1, 1, 1]));
        assert_eq!(route::winograd_plan(&g), Plan::AllAtOnce);
        let bias: Vec<f32> = (0..g.y[1]).map(|o| o as f32 * 0.1).collect();
        infinity_gives_the_direct_output(&g, 9, Some(&bias));
        infinity_gives_the_direct_output(&geometry(&cases[0]), 19, None);
    }

    /// Grouped convolutions of 16 and more channels per group: each group's input transform,
    /// products and output channels apart, groups of odd output channel counts (blocks of
    /// output channels padded per group), with every epilogue path.
    #[test]
    fn grouped_convolutions_match_their_sums() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "grouped_convolutions_match_their_sums",
                kfuse_testkit::Prerequisite::Avx512,
                "the Winograd kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        let cases: [(Case, usize); 3] = [
            ((1, 32, 48, 5, 26, [1, 1, 1, 1]), 2),
            ((2, 48, 51, 7, 30, [1, 0, 2, 1]), 3),
            ((1, 64, 68, 4, 24, [1, 1, 1, 1]), 4),
        ];
        for (case, (sizes, groups)) in cases.iter().enumerate() {
            let g = grouped(sizes, *groups);
            assert!(applies(&g), "case {case} takes the Winograd kernel");
            let seed = 40 + 3 * case as u64;
            let xs = input(g.x.iter().product(), seed, 0, &[]);
            let ws = input(g.y[1] * g.in_channels_per_group() * 9, seed + 1, 0, &[]);
            check_epilogues(&g, &xs, &ws, seed + 2, &format!("grouped case {case}"));
        }
    }

    /// A NaN or infinity in the input, an input that overflows in the transforms, and
    /// non-finite weights: the output is the direct kernel's, bit for bit (its non-finite
    /// values are the reference's, where the transforms would turn an infinity into NaNs in its
    /// tile's other outputs).
    #[test]
    fn non_finite_values_give_the_direct_kernels_output() {
        if !has_avx512() {
            kfuse_testkit::skip(
                "non_finite_values_give_the_direct_kernels_output",
                kfuse_testkit::Prerequisite::Avx512,
                "the Winograd kernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        let case: Case = (2, 16, 20, 9, 30, [1, 1, 1, 1]);
        let g = geometry(&case);
        let (ci, co) = (g.x[1], g.y[1]);
        let len = g.x.iter().product();
        let bias: Vec<f32> = (0..co).map(|o| o as f32 - 8.0).collect();
        let post = Post {
            bias: Some(&bias),
            residual: None,
            act: Some(Activation::Relu),
        };
        let ws = input(co * ci * 9, 5, 0, &[]);
        let inputs = [
            ("one infinity", input(len, 4, len, &[f32::INFINITY])),
            (
                "NaN and -inf",
                input(len, 4, 97, &[f32::NAN, f32::NEG_INFINITY]),
            ),
            ("a value that overflows", input(len, 4, len, &[3e38])),
        ];
        for (what, xs) in &inputs {
            let want = direct_of(&g, xs, &ws, post);
            let got = run(&g, xs, &ws, post);
            assert!(
                want.iter().any(|v| !v.is_finite()),
                "{what}: the case reaches a non-finite output"
            );
            assert!(
                same_bits(&got, &want),
                "{what}: the output differs from the direct kernel's"
            );
        }
        let xs = input(len, 6, 0, &[]);
        let mut bad = ws.clone();
        bad[9 * ci + 4] = f32::INFINITY;
        let (got, want) = (run(&g, &xs, &bad, post), direct_of(&g, &xs, &bad, post));
        assert!(same_bits(&got, &want));
    }

    /// `U = G g Gᵀ`: a filter that picks one tap transforms to that tap's outer product of
    /// `G`'s columns, and its packing puts each value where the microkernel reads it.
    #[test]
    fn transformed_weights_are_g_g_gt_in_blocks() {
        let (co, ci) = (9, 2);
        let mut ws = vec![0.0f32; co * ci * 9];
        // Output channel o, input channel 1 picks tap o.
        for o in 0..co {
            ws[(o * ci + 1) * 9 + o] = 1.0;
        }
        let u = transformed_weights(&ws, 1, co, ci);
        let blocks = co.div_ceil(OB);
        let column = |t: usize| -> [f32; 4] {
            std::array::from_fn(|i| spread(i, [0, 1, 2].map(|k| (k == t) as u8 as f32)))
        };
        for o in 0..co {
            let (r, c) = (o / 3, o % 3);
            for xi in 0..16 {
                let at = |k: usize| u[((xi * blocks + o / OB) * ci + k) * OB + o % OB];
                assert_eq!(at(0), 0.0);
                assert_eq!(
                    at(1),
                    column(r)[xi / 4] * column(c)[xi % 4],
                    "o {o}, ξ {xi}"
                );
            }
        }
        // Past the last output channel: zeros.
        assert!((co..blocks * OB).all(|o| (0..16)
            .all(|xi| (0..ci).all(|k| u[((xi * blocks + o / OB) * ci + k) * OB + o % OB] == 0.0))));
    }
}
