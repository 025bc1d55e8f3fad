//! Packing: weights in the order the blocks read them, and columns of input copied into one
//! contiguous run where reading them in place would miss the hardware prefetchers.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::microkernel::Taps;
use super::{NV, OB};
use crate::constants;
use crate::dense::Out;
use std::sync::Arc;

/// Weights `[group][out][channel][tap]` packed per group as `[block][tap][channel][OB]`, with zeros
/// past a group's last output channel: the order [`masked_block`](super::microkernel::masked_block)
/// reads them in.
pub(super) fn pack_tap_major(
    ws: &[f32],
    groups: usize,
    og: usize,
    cg: usize,
    taps: usize,
) -> Arc<Vec<f32>> {
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
    // Packed over the threads: the weights of a wide layer are megabytes, too many for one
    // thread while the other waits.
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
pub(super) fn pack_afresh(ws: &[f32], groups: usize, og: usize, k: usize) -> Vec<f32> {
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

/// Columns of more bytes than this (a block of positions over every channel and tap) are copied
/// into one contiguous run before the blocks of output channels read them
/// ([`compute`](super::compute::compute)); smaller ones stay in L1 between those blocks. The copy
/// pays on columns of hundreds of KB and costs on the stem's column of 28 KB (measured in
/// docs/structured-ops.md, Routines: copied columns).
pub(super) const PACK_COLUMN: usize = 32 << 10;

/// The most bytes of a band's columns [`conv_copied`](super::copied::conv_copied) copies into
/// contiguous runs at once.
pub(super) const PACK_BAND: usize = 1 << 20;

thread_local! {
    /// Each thread's contiguous copy of a column for [`compute`](super::compute::compute).
    pub(super) static COLUMN: std::cell::RefCell<Vec<Line>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A cache line of floats, so that a buffer of them is aligned to lines.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Line(pub(super) [f32; 16]);

/// What [`masked_block`](super::microkernel::masked_block) reads of `vectors` vectors from `taps`'
/// block, term `t * cg + c` at `out[term * QB..]` (zero where a tap's mask keeps a lane off).
///
/// # Safety
/// The CPU must have AVX-512F; the lanes the masks let through must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gather_column(taps: &Taps, cg: usize, vectors: usize, out: &mut [Line]) {
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

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn gather_column(_: &Taps, _: usize, _: usize, _: &mut [Line]) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
