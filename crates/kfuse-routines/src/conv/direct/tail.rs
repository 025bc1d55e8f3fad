//! The tail kernel: a last partial block of at most seven positions, with vectors over its
//! output channels instead of positions.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::microkernel::{Dst, Finish, Taps};
use super::OB;

/// The most positions a last partial block computes with [`tail_block`] instead of a
/// one-vector [`masked_block`](super::microkernel::masked_block).
pub(super) const TAIL: usize = 7;

/// The input values of a last partial block of `positions` (at most [`TAIL`]) positions, gathered
/// for [`tail_block`], position by position: element `p * taps * cg + t * cg + c` is what
/// [`masked_block`](super::microkernel::masked_block) would read for tap `t`, channel `c`, position
/// `p` (zero where the tap's mask keeps the lane off).
pub(super) fn gather_tail(taps: &Taps, cg: usize, positions: usize) -> Vec<f32> {
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

/// A last partial block of `P` positions (at most [`TAIL`]) with vectors over its 8 output channels
/// instead of positions, two terms (taps and channels) to a vector: per pair of terms, one load of
/// their 16 weights and, per position, its two values spread over the vector's halves (one 8-byte
/// load and a permute), where a one-vector [`masked_block`](super::microkernel::masked_block)
/// broadcasts 8 weights to fill 16 lanes for `P` positions. The halves are added at the end (an odd
/// last term goes to the first half alone). Each position's sum runs as `S` interleaved partial
/// sums (pairs `j` with `j % S == s`), added in order at the end, so that `P * S` chains of fused
/// multiply-adds hide their latency (one chain for one position was as slow as the one-vector
/// block). Bands are fitted to it (`copied::fit_rows`). Two terms to a vector measured faster than
/// a vector of 8 channels per term (docs/structured-ops.md: Routines, and Direct convolution kernel
/// measurements). Fast numerics only: the order differs from the other blocks'.
///
/// # Safety
/// The CPU must have AVX-512F and DQ; the elements `dst` addresses (its `channels` for the `P`
/// positions) must be writable and this thread's alone. `xt` comes from [`gather_tail`] for
/// `P` positions and `w` holds the block's `taps * cg * OB` weights (both asserted).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(super) unsafe fn tail_block<const P: usize, const S: usize>(
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
pub(super) unsafe fn tail_block<const P: usize, const S: usize>(
    _: &[f32],
    _: &[f32],
    _: Dst,
    _: &Finish,
) {
    unreachable!("the route table takes this kernel only on AVX-512")
}
