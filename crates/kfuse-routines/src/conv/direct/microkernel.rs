//! The microkernel: a block of 8 output channels × up to 48 positions summed in registers,
//! its stores (with the bias, residual and activation applied on the way), the masked block
//! of the same-width layout, and the one-tap column that runs a pointwise column's whole
//! blocks in one loop.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{NV, OB, QB};
use crate::conv::Post;
use crate::prefetch::ask_line;
use crate::simd::InRegisters;

/// The input a [`masked_block`] reads: for tap `t`, input channel `c` and position `p` of the
/// block, `x + c * plane + offsets[t] + p`, in the lanes `masks[t]` lets through.
pub(super) struct Taps<'a> {
    pub(super) x: *const f32,
    pub(super) plane: usize,
    pub(super) offsets: &'a [isize],
    pub(super) masks: &'a [[u16; NV]],
}

/// What a block applies to its sums in registers before storing them.
pub(super) struct Finish {
    /// One value per output channel of the block, added.
    pub(super) bias: Option<[f32; OB]>,
    /// Then the residual's element at each stored position.
    pub(super) residual: Option<Residual>,
    /// Then this activation.
    pub(super) act: Option<InRegisters>,
    /// Whole 64-byte-aligned vectors are stored non-temporally.
    pub(super) stream: bool,
}

/// A residual added in registers: it has the output's shape, so the element for the output
/// element at `p` has the same index from `base` as `p` from the output's start, `out`.
#[derive(Clone, Copy)]
pub(in crate::conv) struct Residual {
    base: *const f32,
    out: usize,
}

impl Residual {
    /// The residual `residual` of the output `y`, if any.
    pub(in crate::conv) fn of(residual: Option<&[f32]>, y: &[f32]) -> Option<Residual> {
        residual.map(|r| {
            assert!(r.len() >= y.len(), "a residual has the output's shape");
            Residual {
                base: r.as_ptr(),
                out: y.as_ptr() as usize,
            }
        })
    }

    /// The residual's element for the output element at `p`.
    pub(in crate::conv) fn at(&self, p: *const f32) -> *const f32 {
        self.base
            .wrapping_add((p as usize - self.out) / std::mem::size_of::<f32>())
    }

    /// Asks for the residual's elements of the block `dst` addresses (into L1), before the
    /// block's sums are computed: its store reads them one channel's run at a time, which the
    /// hardware prefetchers do not follow.
    #[inline(always)]
    pub(super) fn prefetch(&self, dst: &Dst) {
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

/// Splits an epilogue into what the microkernel applies in registers and the rest, applied to the
/// stored rows: the bias, the residual where `residual_in_registers` (the blocks store straight to
/// the output) and, when nothing is left between, ReLU, a clamp or hard-swish. The residual added
/// in registers saves a second pass over each band's output, and lets an output of 16 MiB and more
/// go out with non-temporal stores. Each block asks for its residual before computing its sums
/// ([`Residual::prefetch`]): without that, the stores waited on the residual's loads (measured in
/// docs/structured-ops.md: Structured kernels, and Direct convolution kernel measurements).
pub(in crate::conv) fn split(
    post: Post<f32>,
    residual_in_registers: bool,
) -> (Post<f32>, Post<f32>) {
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
pub(in crate::conv) struct Dst {
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
pub(super) unsafe fn block<const V: usize>(
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
pub(super) struct Column {
    /// Elements between one input channel's positions and the next one's.
    pub(super) plane: usize,
    /// Input channels.
    pub(super) channels: usize,
    /// The packed weights of the blocks, `channels * OB` each (`[c][o]`).
    pub(super) weights: *const f32,
    /// Whole blocks of `OB` output channels.
    pub(super) blocks: usize,
    /// Elements between one output channel's positions and the next one's.
    pub(super) stride: usize,
    /// One value per output channel, added.
    pub(super) bias: Option<*const f32>,
    pub(super) residual: Option<Residual>,
    pub(super) act: Option<InRegisters>,
    /// Non-temporal stores (the output then 64-byte aligned, `stride` a multiple of 16).
    pub(super) stream: bool,
    /// Lines of the next band's input asked for per block.
    pub(super) per_block: usize,
    /// How far ahead the weights are asked for ([`weights_ahead`](crate::prefetch::weights_ahead)).
    pub(super) ahead: usize,
}

/// The whole blocks of output channels of one column of [`QB`] positions of a pointwise convolution
/// (its input at `x`, output channel `o` position `q` at `dst + o * stride + q`), one block after
/// another in one loop: the bias, residual and activation are chosen once for the column, each
/// block's sums stay in registers and go out through [`store_each`]. Calling [`block`] per block,
/// with its `Finish` and `Dst` built and its checks run each time, took 6–7% more of W6a's fused
/// block (measured in docs/structured-ops.md, Routines: `conv::separable`).
///
/// # Safety
/// The CPU must have AVX-512F and DQ; `x` must be readable for `(channels - 1) * plane + QB`
/// elements, the weights (and bias) for `blocks` blocks, and the output (and residual)
/// elements of the blocks must be writable (readable) and this thread's alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn pointwise_column(
    col: &Column,
    x: *const f32,
    dst: *mut f32,
    lines: &mut Lines,
) {
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
/// of line. The loop this replaced tested the bias and activation at each vector and kept the
/// sums in memory, which took a tenth of the time of a 64-channel pointwise block (measured
/// in docs/structured-ops.md, Direct convolution kernel measurements).
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
pub(super) unsafe fn masked_block<const V: usize>(
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

/// The cache lines of some slices, asked for (into L2) a few at a time.
pub(super) struct Lines<'a> {
    ranges: &'a [&'a [f32]],
    range: usize,
    at: usize,
}

impl<'a> Lines<'a> {
    pub(super) fn new(ranges: &'a [&'a [f32]]) -> Self {
        let at = ranges.first().map_or(0, |r| r.as_ptr() as usize & !63);
        Lines {
            ranges,
            range: 0,
            at,
        }
    }

    /// Lines in all (at most).
    pub(super) fn total(&self) -> usize {
        self.ranges
            .iter()
            .map(|r| std::mem::size_of_val(*r) / 64 + 2)
            .sum()
    }

    /// Asks for the next `count` lines.
    #[inline(always)]
    pub(super) fn ask(&mut self, mut count: usize) {
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

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn pointwise_column(_: &Column, _: *const f32, _: *mut f32, _: &mut Lines) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn masked_block<const V: usize>(
    _: &Taps,
    _: (&[f32], usize),
    _: usize,
    _: Dst,
    _: &Finish,
) {
    unreachable!("the route table takes this kernel only on AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn block<const V: usize>(
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
