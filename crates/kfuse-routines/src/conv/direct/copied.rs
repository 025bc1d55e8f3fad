//! Bands whose blocks store straight to the output rows: the same-width layout, whose taps
//! read the band's input rows through lane masks, and tap planes. Band heights are fitted to
//! the blocks ([`fit_rows`]), and a band's last few positions take the tail kernel.

use super::microkernel::{block, masked_block, split, Dst, Finish, Residual, Taps};
use super::packing::{gather_column, pack_tap_major, Line, COLUMN, PACK_BAND, PACK_COLUMN};
use super::tail::{gather_tail, tail_block, TAIL};
use super::tap_planes::TapPlanes;
use super::{NV, OB, QB};
use crate::conv::{for_each_band_fitted, Geometry, Post};
use crate::dense::{with_scratch, Out};
use crate::epilogue::epilogue;
use crate::prefetch::weights_ahead;
use crate::simd::InRegisters;

/// The convolution of `g` into `y` where output rows are as wide as input rows: the module's "same
/// width" layout. A masked-off lane is not read at all, so rows of the band's copy outside the
/// image are never written or read. Reading `xs` directly instead of a copy (the masks allow it)
/// measured no faster than the zero-bordered grid (docs/structured-ops.md, Direct convolution
/// kernel measurements): the microkernel then reads 64 channel planes 12.5 KB apart, from memory,
/// where the copy puts the band's planes next to each other in L2.
pub(super) fn conv_same_width(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    post: Post<f32>,
) {
    conv_copied(g, xs, ws, y, post, &Copied::Rows)
}

/// How [`conv_copied`] lays out a band's copy of its input.
pub(super) enum Copied {
    /// Output rows as wide as input rows: the band's input rows, whole, one plane per channel
    /// ([`conv_same_width`]).
    Rows,
    /// A strided convolution on tap planes ([`TapPlanes`]).
    TapPlanes(TapPlanes),
}

/// The convolution of `g` into `y` on a band's copy of its input laid out as `copied` says:
/// the blocks' positions are the band's output pixels, `q = r * ow + x`, stored straight to
/// the output rows.
pub(super) fn conv_copied(
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
    // A band's copy of its input rows stays in L2 while each block of output channels reads it.
    // Bands are trimmed to whole blocks of positions where a few rows less get there (56-wide
    // rows: 6 rows are 7 blocks).
    let pool = crate::Pool::global();
    if oh * ow <= SMALL_IMAGE && n_images < 4 * pool.threads() && all_blocks > 1 {
        // Small images, too few for the threads: each task takes a whole image and a share of
        // its output channels (bands of one row would each read every weight for a few
        // positions).
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
/// A 7×7 image runs as one band of 7 rows (48 positions and a tail of one), where 6 rows and a band
/// of one row were taken before the tail kernel; a 14×14 image as one band of 14 rows (4 blocks and
/// a tail of four), where the cost of the first band alone picked 10 rows and a band of 4 to
/// follow. Both measured faster (docs/structured-ops.md: Routines, and Direct convolution kernel
/// measurements).
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
