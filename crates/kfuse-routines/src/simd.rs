//! Slice forms of activations for the Rust epilogues of GEMMs and convolutions (both GELUs,
//! sigmoid, SiLU, tanh, hard-swish), sixteen lanes at a time where the CPU has AVX-512. Passing
//! the scalar definitions to the epilogue loops as closures left them to the compiler's
//! inlining: the sigmoid ended up called out of line, compiled for the baseline ISA, at about
//! twice the time (`docs/structured-ops.md`, "Measurements behind design choices").
//!
//! The sigmoid, tanh and hard-swish forms repeat the scalar operations in the same order, with
//! no contraction, and differ only where one instruction gives the same result as several
//! scalar steps (`vscalefps` for exact scaling products, `vrndscaleps` for ties-to-even
//! rounding): they give the scalar definitions' bits. The others run in fast numerics' bounds:
//! - GELU's tanh form (`gelu_tanh_f32_slice`) evaluates in f32 what the definition evaluates
//!   in f64, its argument as a pair of f32: within 1 ULP for `x >= 0`, 2 ULPs below. The f64
//!   form's two divisions per sixteen lanes made it the slower (`docs/structured-ops.md`,
//!   "Routines": activations).
//! - GELU's erf form contracts its f64 steps (see `gelu_pd`): one input of the 2^32 is one
//!   ULP off the definition.
//! - SiLU contracts its exponential: within 3 ULPs.
//!
//! All 2^32 inputs were checked once against each scalar definition; `tests` checks the special
//! values, the branch points and millions of patterns. The structured kernels run these forms
//! in fast numerics only (strict numerics evaluates a structured step op by op on the reference
//! interpreter).

/// `values[i] = gelu_tanh_f32(values[i])` for every element, within 1 ULP for `x >= 0` and 2
/// ULPs below with AVX-512 (a subnormal result within 2 of its units), exactly otherwise.
pub(crate) fn gelu_tanh_f32_slice(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_dq() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { avx512::gelu_tanh_f32_slice(values) };
    }
    for v in values {
        *v = kfuse_math::gelu_tanh_f32(*v);
    }
}

/// `values[i] = gelu_f32(values[i])` (the erf form) for every element.
pub(crate) fn gelu_f32_slice(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_dq() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { avx512::gelu_f32_slice(values) };
    }
    for v in values {
        *v = kfuse_math::gelu_f32(*v);
    }
}

/// `values[i] = sigmoid_f32(values[i])` for every element.
pub(crate) fn sigmoid_f32_slice(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_dq() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { avx512::sigmoid_f32_slice(values) };
    }
    for v in values {
        *v = kfuse_math::sigmoid_f32(*v);
    }
}

/// `values[i] = values[i] * sigmoid(values[i])` (SiLU) for every element: on AVX-512 the
/// sigmoid's exponential is contracted into fused multiply-adds (within 3 ULPs of the IR's two
/// ops where the sigmoid is normal; see the test), elsewhere the IR's ops exactly.
pub(crate) fn silu_f32_slice(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_dq() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { avx512::silu_f32_slice(values) };
    }
    for v in values {
        *v *= kfuse_math::sigmoid_f32(*v);
    }
}

/// How many leading elements `avx512::$f(..)`, an AVX-512 form over whole blocks of sixteen that
/// returns that count, handled: all its blocks where the CPU has AVX-512, none elsewhere (the
/// caller's scalar loop then does the rest).
macro_rules! whole_blocks {
    ($f:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        let whole = if has_avx512_dq() {
            // SAFETY: the CPU has the features the function is compiled for.
            unsafe { avx512::$f($($arg),*) }
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let whole = 0;
        whole
    }};
}

/// `dst[i] = bf16::from_f32(src[i])` (round to nearest, ties to even; NaN stays NaN, quiet):
/// the IR's cast to bf16, sixteen lanes at a time in integer arithmetic on AVX-512.
pub(crate) fn bf16_from_f32_slice(src: &[f32], dst: &mut [kfuse_ir::bf16]) {
    assert_eq!(src.len(), dst.len(), "one value for each");
    let whole = whole_blocks!(bf16_from_f32_slice(src, dst));
    for (d, &v) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = kfuse_ir::bf16::from_f32(v);
    }
}

/// `dst[i] = f16::from_f32(src[i])` (round to nearest, ties to even): the IR's cast to f16,
/// sixteen lanes at a time through AVX-512's conversion, the instruction behind F16C's, which
/// `f16::from_f32` uses where the CPU has it.
pub(crate) fn f16_from_f32_slice(src: &[f32], dst: &mut [kfuse_ir::f16]) {
    assert_eq!(src.len(), dst.len(), "one value for each");
    let whole = whole_blocks!(f16_from_f32_slice(src, dst));
    for (d, &v) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = kfuse_ir::f16::from_f32(v);
    }
}

/// `dst[i] = src[i]` widened to f32 (exact): sixteen lanes at a time on AVX-512, where a
/// per-element `to_f32` tests the CPU's features once per value.
pub(crate) fn f32_from_f16_slice(src: &[kfuse_ir::f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "one value for each");
    let whole = whole_blocks!(f32_from_f16_slice(src, dst));
    for (d, s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = s.to_f32();
    }
}

/// `dst[i] = src[i]` widened to f32 as `bf16::to_f32` widens it: the bf16 bits are the f32's
/// upper half, and a NaN is made quiet. A plain loop, which the compiler vectorizes.
pub(crate) fn f32_from_bf16_slice(src: &[kfuse_ir::bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "one value for each");
    for (d, s) in dst.iter_mut().zip(src) {
        let bits = s.to_bits();
        let quiet = if bits & 0x7fff > 0x7f80 { 0x0040 } else { 0 };
        *d = f32::from_bits(u32::from(bits | quiet) << 16);
    }
}

/// Rounds every value to the nearest bf16 (`bf16` true) or f16 and back to f32, as the IR
/// rounds each op's result in those dtypes: sixteen lanes at a time on AVX-512.
pub(crate) fn round_to_half_f32_slice(values: &mut [f32], bf16: bool) {
    let whole = whole_blocks!(round_to_half_f32_slice(values, bf16));
    for v in &mut values[whole..] {
        *v = if bf16 {
            kfuse_ir::bf16::from_f32(*v).to_f32()
        } else {
            kfuse_ir::f16::from_f32(*v).to_f32()
        };
    }
}

/// `values[i] = tanh_f32(values[i])` for every element.
pub(crate) fn tanh_f32_slice(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_dq() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { avx512::tanh_f32_slice(values) };
    }
    for v in values {
        *v = kfuse_math::tanh_f32(*v);
    }
}

/// Whether the CPU runs the AVX-512 (F and DQ) forms.
/// An activation the structured kernels apply to their sums in registers, before storing
/// them, as the IR computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum InRegisters {
    /// `x < 0 ? 0 : x` (NaN and -0 pass).
    Relu,
    /// `minimum(maximum(x, lo), hi)` (IEEE 754-2019: NaN propagates, `+0` above `-0`), for
    /// bounds that are not NaN.
    Clamp { lo: f32, hi: f32 },
    /// Hard-swish, `x * clamp(x + 3, 0, 6) / 6`: the product divided (`divide_last`) or `x`
    /// times the clamp divided by 6, each step rounded as the IR's ops round it.
    HardSwish { divide_last: bool },
}

impl InRegisters {
    /// The form in registers of `act` on f32 values, if it has one: ReLU, and clamps whose
    /// bounds (rounded to f32, as the epilogue rounds them) are not NaN.
    pub(crate) fn of(act: Option<kfuse_ir::Activation>) -> Option<InRegisters> {
        use kfuse_ir::Activation;
        match act? {
            Activation::Relu => Some(InRegisters::Relu),
            Activation::Clamp(b) => {
                let (lo, hi) = (b.lo() as f32, b.hi() as f32);
                (!lo.is_nan() && !hi.is_nan()).then_some(InRegisters::Clamp { lo, hi })
            }
            Activation::HardSwish { divide_last } => Some(InRegisters::HardSwish { divide_last }),
            _ => None,
        }
    }

    /// The activation of sixteen lanes. Always inlined, with no features of its own: its
    /// callers are compiled for AVX-512F and DQ.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512DQ.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn apply(self, v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        match self {
            InRegisters::Relu => {
                let zero = _mm512_setzero_ps();
                _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, zero), zero)
            }
            // SAFETY: as the caller vouches.
            InRegisters::Clamp { lo, hi } => unsafe { clamp16(v, lo, hi) },
            InRegisters::HardSwish { divide_last } => {
                let six = _mm512_set1_ps(6.0);
                // SAFETY: as the caller vouches.
                let c = unsafe { clamp16(_mm512_add_ps(v, _mm512_set1_ps(3.0)), 0.0, 6.0) };
                if divide_last {
                    _mm512_div_ps(_mm512_mul_ps(v, c), six)
                } else {
                    _mm512_mul_ps(v, _mm512_div_ps(c, six))
                }
            }
        }
    }
}

/// The IR's `clamp(v, lo, hi)` of sixteen lanes, for bounds that are not NaN. Not a call to
/// [`InRegisters::apply`] from within it: a recursive function is not inlined, and out of line
/// it runs without its callers' AVX-512 features, its intrinsics as calls, several times slower
/// (`docs/structured-ops.md`, "Measurements behind design choices").
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512DQ.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn clamp16(v: std::arch::x86_64::__m512, lo: f32, hi: f32) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: as the caller vouches.
    unsafe {
        // `vrangeps` orders -0 below +0 (maximum 0x5, minimum 0x4, as `kfuse_math.h` uses
        // them) but passes over a NaN operand: where `v` is NaN the result is the default NaN,
        // as in the epilogue's scalar form.
        let m = _mm512_range_ps::<0x5>(v, _mm512_set1_ps(lo));
        let r = _mm512_range_ps::<0x4>(m, _mm512_set1_ps(hi));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_mask_mov_ps(r, nan, _mm512_set1_ps(f32::NAN))
    }
}

/// `values[i] = hardswish(values[i])` for every element, in the IR's steps (see
/// [`InRegisters::HardSwish`]): the form in registers, sixteen lanes at a time on AVX-512.
pub(crate) fn hardswish_f32_slice(values: &mut [f32], divide_last: bool) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_dq() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { avx512::hardswish_f32_slice(values, divide_last) };
    }
    for v in values {
        *v = hardswish_f32(*v, divide_last);
    }
}

/// Hard-swish of one value, op by op as the IR's nodes compute it.
pub(crate) fn hardswish_f32(v: f32, divide_last: bool) -> f32 {
    // The IR's clamp, `minimum(maximum(v, lo), hi)`.
    let c = kfuse_math::minimum_f32(kfuse_math::maximum_f32(v + 3.0, 0.0), 6.0);
    if divide_last {
        v * c / 6.0
    } else {
        v * (c / 6.0)
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512_dq() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every lane's bits against the scalar definition; NaN results agree when both are NaN
    /// (kfuse does not promise NaN payloads).
    fn check(inputs: &[f32], slice: fn(&mut [f32]), scalar: fn(f32) -> f32, name: &str) {
        let mut got = inputs.to_vec();
        slice(&mut got);
        for (&x, &g) in inputs.iter().zip(&got) {
            let want = scalar(x);
            if want.is_nan() {
                assert!(g.is_nan(), "{name}({x:e}): {g:e} against NaN");
                continue;
            }
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{name}({x:e} = {:#010x}): {g:e} against the scalar {want:e}",
                x.to_bits()
            );
        }
    }

    /// The distance between two f32 in units in the last place (0 between `-0` and `+0`).
    fn ulps(a: f32, b: f32) -> u64 {
        let key = |x: f32| {
            let bits = i64::from(x.to_bits());
            if bits < 0x8000_0000 {
                bits
            } else {
                0x8000_0000 - bits
            }
        };
        (key(a) - key(b)).unsigned_abs()
    }

    /// The special values (zeros, infinities, NaNs, the smallest normal and subnormal values,
    /// the largest), then 64 ULPs either side of each of `centres`.
    fn specials_around(centres: &[f32]) -> Vec<f32> {
        let mut specials = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fa0_0001),
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::MAX,
            f32::MIN,
        ];
        for centre in centres {
            let bits = centre.to_bits();
            for d in 0..64 {
                specials.push(f32::from_bits(bits.wrapping_add(d)));
                specials.push(f32::from_bits(bits.wrapping_sub(d)));
            }
        }
        specials
    }

    /// [`check`] on the special values, 64 ULPs either side of each of `centres` (the branch
    /// points), every length up to 40 (the remainder paths), and a stride through all bit
    /// patterns (every sign and exponent, many mantissas).
    fn sweep(slice: fn(&mut [f32]), scalar: fn(f32) -> f32, name: &str, centres: &[f32]) {
        let specials = specials_around(centres);
        check(&specials, slice, scalar, name);
        for len in 0..40 {
            check(&specials[..len], slice, scalar, name);
        }
        let patterns: Vec<f32> = (0..(1u64 << 22))
            .map(|i| f32::from_bits((i * 1021) as u32))
            .collect();
        check(&patterns, slice, scalar, name);
    }

    /// Hard-swish's form in registers gives the scalar steps' bits, in both forms.
    #[test]
    fn hardswish_slice_matches_the_scalar_bits() {
        let centres = [-3.0, 0.0, 3.0, -6.0, 6.0];
        sweep(
            |v| hardswish_f32_slice(v, true),
            |v| hardswish_f32(v, true),
            "hardswish",
            &centres,
        );
        sweep(
            |v| hardswish_f32_slice(v, false),
            |v| hardswish_f32(v, false),
            "hardsigmoid_mul",
            &centres,
        );
    }

    /// The cast forms give `bf16::from_f32` and `f16::from_f32` bit for bit (checked once
    /// over all 2^32 inputs): here every length up to 40, the special values, the rounding
    /// ties and overflow edges of both types, and a stride through all bit patterns.
    #[test]
    fn half_casts_match_the_scalar_bits() {
        let mut values: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fa0_0001),
            f32::from_bits(0xff80_0001),
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::MAX,
            f32::MIN,
            65504.0,
            65519.996,
            65520.0,
            -65520.0,
            2.980_232_2e-8,
            5.960_464_5e-8,
        ];
        // bf16 ties (the dropped half exactly 0x8000) above odd and even kept bits, and their
        // neighbours; bf16's overflow edge.
        for base in [
            0x3f80_0000u32,
            0x3f81_0000,
            0x7f7f_0000,
            0x7f7e_0000,
            0x0001_0000,
        ] {
            for low in [0x7fff, 0x8000, 0x8001] {
                values.push(f32::from_bits(base | low));
                values.push(-f32::from_bits(base | low));
            }
        }
        let patterns = (0..(1u64 << 22)).map(|i| f32::from_bits((i * 1021) as u32));
        values.extend(patterns);
        let check = |src: &[f32]| {
            let mut b = vec![kfuse_ir::bf16::ZERO; src.len()];
            bf16_from_f32_slice(src, &mut b);
            let mut h = vec![kfuse_ir::f16::ZERO; src.len()];
            f16_from_f32_slice(src, &mut h);
            for (i, &v) in src.iter().enumerate() {
                let (want_b, want_h) = (kfuse_ir::bf16::from_f32(v), kfuse_ir::f16::from_f32(v));
                assert_eq!(
                    b[i].to_bits(),
                    want_b.to_bits(),
                    "bf16 of {v:e} ({:#x})",
                    v.to_bits()
                );
                assert_eq!(
                    h[i].to_bits(),
                    want_h.to_bits(),
                    "f16 of {v:e} ({:#x})",
                    v.to_bits()
                );
            }
        };
        for len in 0..40 {
            check(&values[..len]);
        }
        check(&values);
        // Widening gives each half value's f32 exactly (every f16 and bf16 bit pattern).
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let h: Vec<kfuse_ir::f16> = halves
            .iter()
            .map(|&b| kfuse_ir::f16::from_bits(b))
            .collect();
        let b: Vec<kfuse_ir::bf16> = halves
            .iter()
            .map(|&b| kfuse_ir::bf16::from_bits(b))
            .collect();
        let mut wide = vec![0.0f32; halves.len()];
        f32_from_f16_slice(&h, &mut wide);
        for (v, w) in h.iter().zip(&wide) {
            let want = v.to_f32();
            assert!(
                w.to_bits() == want.to_bits(),
                "f16 {:#x}: {w:e}",
                v.to_bits()
            );
        }
        f32_from_bf16_slice(&b, &mut wide);
        for (v, w) in b.iter().zip(&wide) {
            let want = v.to_f32();
            assert!(
                w.to_bits() == want.to_bits(),
                "bf16 {:#x}: {w:e}",
                v.to_bits()
            );
        }
        // Rounding in place gives the conversion's value back in f32.
        for bf16 in [true, false] {
            let mut rounded = values.clone();
            round_to_half_f32_slice(&mut rounded, bf16);
            for (&v, r) in values.iter().zip(rounded) {
                let want = if bf16 {
                    kfuse_ir::bf16::from_f32(v).to_f32()
                } else {
                    kfuse_ir::f16::from_f32(v).to_f32()
                };
                assert_eq!(r.to_bits(), want.to_bits(), "{v:e} rounded (bf16: {bf16})");
            }
        }
    }

    /// GELU's tanh form runs in f32 (the definition evaluates in f64): within 1 ULP of the
    /// definition for `x >= 0` and 2 ULPs below (all 2^32 inputs checked once: 1,840,979 off
    /// by 1 and 145,919 by 2 below zero, 341,107 by 1 above); a subnormal result within 2 of
    /// its units; NaN where the definition is NaN. Checked here on the special values, 64
    /// ULPs around the branch points, every length up to 40 (the remainder paths), a dense
    /// sweep of the working range and a stride through all bit patterns.
    #[test]
    fn gelu_tanh_slice_stays_within_two_ulps() {
        let close = |x: f32, got: f32| {
            let want = kfuse_math::gelu_tanh_f32(x);
            if want.is_nan() || want.is_infinite() {
                return got.to_bits() == want.to_bits() || want.is_nan() && got.is_nan();
            }
            if !want.is_normal() || !got.is_normal() {
                return (f64::from(want) - f64::from(got)).abs()
                    <= 2.0 * f64::from(f32::from_bits(1));
            }
            ulps(want, got) <= if x >= 0.0 { 1 } else { 2 }
        };
        // Where the result turns subnormal and then zero (about -10.1 and -10.7), where the
        // exponent's argument reaches its clamp (-11.1), where the cube overflows (2^42.7),
        // and the middle of the range.
        let centres = [
            -12.0, -11.1, -10.7, -10.5, -10.1, -5.0, -1.8, -0.32, 0.0, 0.03, 1.0, 5.0, 11.1,
            -7.0e12, 7.0e12,
        ];
        let mut inputs = specials_around(&centres);
        let specials = inputs.len();
        inputs.extend(
            (0..(1 << 21)).map(|i| (i as f32 - (1 << 20) as f32) * (16.0 / (1 << 20) as f32)),
        );
        inputs.extend((0..(1u64 << 22)).map(|i| f32::from_bits((i * 1021) as u32)));
        let check = |inputs: &[f32]| {
            let mut got = inputs.to_vec();
            gelu_tanh_f32_slice(&mut got);
            for (&x, &g) in inputs.iter().zip(&got) {
                assert!(
                    close(x, g),
                    "gelu_tanh({x:e} = {:#010x}): {g:e} against {:e}",
                    x.to_bits(),
                    kfuse_math::gelu_tanh_f32(x)
                );
            }
            got
        };
        for len in 0..40 {
            check(&inputs[..len]);
            check(&inputs[specials..specials + len]);
        }
        let got = check(&inputs);
        // The f32 form is there: some result differs from the definition's bits.
        assert!(inputs
            .iter()
            .zip(&got)
            .any(|(&x, &g)| kfuse_math::gelu_tanh_f32(x).to_bits() != g.to_bits()));
    }

    /// GELU's erf form is the scalar definition's bits but for one input of all 2^32
    /// (checked once), where its polynomials' fused steps land the f64 value on the other side
    /// of an f32 rounding boundary: the sweeps hold it to the scalar bits, that input to one
    /// ULP.
    #[test]
    fn gelu_slice_matches_the_scalar_bits() {
        // Where erfc's argument `-x / sqrt 2` crosses -1, 1 (both forms' borders), 10.1 (the
        // tail's end), and where the exponential's argument reaches its clamp.
        let s = std::f32::consts::SQRT_2;
        let centres = [
            -10.1 * s,
            -s,
            0.0,
            s,
            10.1 * s,
            -14.9,
            -15.0,
            -20.0,
            4.0,
            -4.0,
        ];
        sweep(gelu_f32_slice, kfuse_math::gelu_f32, "gelu", &centres);
        // Dense coverage of the working range.
        let dense: Vec<f32> = (0..(1 << 21))
            .map(|i| (i as f32 - (1 << 20) as f32) * (20.0 / (1 << 20) as f32))
            .collect();
        check(&dense, gelu_f32_slice, kfuse_math::gelu_f32, "gelu");
        let odd_one = f32::from_bits(0xbfc5_8575);
        let mut got = [odd_one];
        gelu_f32_slice(&mut got);
        assert_eq!(
            ulps(got[0], kfuse_math::gelu_f32(odd_one)),
            1,
            "gelu({odd_one:e})"
        );
    }

    #[test]
    fn sigmoid_slice_matches_the_scalar_bits() {
        // The exponential's clamps (its argument is -|x|) and the sign switch.
        let centres = [
            -110.0, -104.0, -89.0, -88.7, -20.0, -1.0, 0.0, 1.0, 20.0, 89.0, 110.0,
        ];
        sweep(
            sigmoid_f32_slice,
            kfuse_math::sigmoid_f32,
            "sigmoid",
            &centres,
        );
    }

    /// SiLU runs on the contracted exponential: within 3 ULPs of `x * sigmoid_f32(x)` where
    /// the sigmoid is normal, and where it is subnormal (`x` below about -87.3) within two of
    /// its units times `|x|` (all 2^32 inputs checked once: 908,625 differ, 1,000 of them by 3
    /// ULPs); NaN where the definition is NaN. Checked here on the special values, the
    /// exponential's clamps, every remainder length and a stride through all bit patterns.
    #[test]
    fn silu_slice_stays_within_three_ulps() {
        let close = |x: f32, got: f32| {
            let sigmoid = kfuse_math::sigmoid_f32(x);
            let want = x * sigmoid;
            if want.is_nan() {
                return got.is_nan();
            }
            if sigmoid < f32::MIN_POSITIVE {
                return (want - got).abs() <= x.abs() * 2.0 * f32::from_bits(1);
            }
            ulps(want, got) <= 3
        };
        let mut inputs: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::MAX,
            f32::MIN,
        ];
        for centre in [
            -110.0f32, -104.0, -89.0, -87.3, -20.0, -1.0, 0.0, 1.0, 20.0, 89.0,
        ] {
            for d in 0..64 {
                inputs.push(f32::from_bits(centre.to_bits().wrapping_add(d)));
                inputs.push(f32::from_bits(centre.to_bits().wrapping_sub(d)));
            }
        }
        inputs.extend((0..(1u64 << 22)).map(|i| f32::from_bits((i * 1021) as u32)));
        for len in [inputs.len(), 0, 1, 15, 16, 17, 63, 64, 65, 100] {
            let mut got = inputs[..len].to_vec();
            silu_f32_slice(&mut got);
            for (&x, &g) in inputs.iter().zip(&got) {
                assert!(close(x, g), "silu({x:e} = {:#010x}): {g:e}", x.to_bits());
            }
        }
        // The contraction is there: some result differs from the definition's bits.
        let mut got = inputs.clone();
        silu_f32_slice(&mut got);
        assert!(inputs
            .iter()
            .zip(&got)
            .any(|(&x, &g)| (x * kfuse_math::sigmoid_f32(x)).to_bits() != g.to_bits()));
    }

    #[test]
    fn tanh_slice_matches_the_scalar_bits() {
        // Every branch point, both signs.
        let centres = [2.44e-4, 0.625, 9.0, 44.0, 1.0e-30];
        let both: Vec<f32> = centres.iter().flat_map(|&c| [c, -c]).collect();
        sweep(tanh_f32_slice, kfuse_math::tanh_f32, "tanh", &both);
    }
}
