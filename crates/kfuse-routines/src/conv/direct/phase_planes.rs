//! The phase-plane bands: each band's input rows split into one plane per phase of the
//! stride, the blocks stored to a stage that a sink copies out.

use super::compute::compute;
use super::microkernel::Dst;
use super::packing::pack;
use super::{OB, QB};
use crate::conv::shifted::Grid;
use crate::conv::{Geometry, Post};
use crate::dense::with_scratch;
use crate::prefetch::weights_ahead;
use crate::simd::InRegisters;

/// The width of `g`'s phase planes: output row `r` of a band's stage starts `r` times this
/// into each channel's run (see [`Sink`]).
pub(in crate::conv) fn phase_grid_width(g: &Geometry) -> usize {
    Grid::new(g).pw
}

/// Bytes of a band's copy and stage per output row on phase planes.
pub(in crate::conv) fn phase_row_bytes(g: &Geometry) -> usize {
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    (cg + og) * Grid::new(g).pw * std::mem::size_of::<f32>()
}

/// Where a phase-plane band's output goes: `sink(t, n, rows, group, stage, q_blocks)` gets, for
/// task `t`, rows `rows` of image `n` for the output channels of `group`: the group's channel
/// `co`, row `r` of the band at `stage[co * q_blocks + r * pw..][..ow]` (`pw` the grid's
/// width), with the bias and ReLU (or a clamp) applied.
pub(in crate::conv) type Sink<'a> =
    dyn Fn(usize, usize, &std::ops::Range<usize>, usize, &[f32], usize) + Sync + 'a;

/// The phase-plane path of [`conv`](super::conv): task `t` computes output rows `task(t).1` of
/// image `task(t).0` on a copy of the input rows they read, split into phase planes, into a stage,
/// one group at a time, and hands each group's stage to `sink`. `in_registers` is the part of the
/// epilogue the blocks apply (see [`split`](super::split)).
pub(in crate::conv) fn phase_planes(
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
        // from memory (measured in docs/structured-ops.md, Direct convolution kernel
        // measurements).
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
