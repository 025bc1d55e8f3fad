//! The microkernel's blocks over one group's output, the entry point the other routines share.

use super::microkernel::{block, pointwise_column, Column, Dst, Finish, Lines, Residual};
use super::packing::{Line, COLUMN, PACK_COLUMN};
use super::{NV, OB, QB};
use crate::dense::has_avx512;
use crate::simd::InRegisters;

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
pub(in crate::conv) unsafe fn compute(
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
