use std::arch::x86_64::*;

/// `exp_reduced` (`r * r * exp_poly(r) + r + 1`), sixteen f32 lanes, in the scalar order.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp_reduced(r: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    let [c0, rest @ ..] = kfuse_math::EXP_POLY_F32;
    let mut p = c(c0);
    for k in rest {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), c(k));
    }
    let rr = _mm512_mul_ps(r, r);
    _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(rr, p), r), c(1.0))
}

/// `exp_f32` of sixteen lanes, in its order: the argument clamped to [-110, 89] by
/// comparisons (a NaN becomes -110 and is put back at the end), `k = round(x log2 e)`
/// (ties to even), `r = x - k ln2_hi - k ln2_lo`, the reduced exponential scaled by `2^k`
/// (`vscalefps`: the scalar form's two scalings, exact but for the last, round once).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    exp16_as::<false>(x)
}

/// [`exp16`], its reduction and polynomial contracted into fused multiply-adds where
/// `FUSED`: a few ULPs from the definition instead of its bits, in fewer instructions, which
/// makes SiLU faster (`docs/structured-ops.md`, "Measurements behind design choices").
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16_as<const FUSED: bool>(x: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    let above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, c(-110.0));
    let xc = _mm512_mask_mov_ps(c(-110.0), above, x);
    let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(xc, c(89.0));
    let xc = _mm512_mask_mov_ps(c(89.0), below, xc);
    let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(xc, c(kfuse_math::LOG2_E_F32)),
    );
    let (hi, lo) = (c(kfuse_math::LN2_HI_F32), c(kfuse_math::LN2_LO_F32));
    let e = if FUSED {
        let r = _mm512_fnmadd_ps(k, lo, _mm512_fnmadd_ps(k, hi, xc));
        let [c0, rest @ ..] = kfuse_math::EXP_POLY_F32;
        let mut p = c(c0);
        for k in rest {
            p = _mm512_fmadd_ps(p, r, c(k));
        }
        _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r), c(1.0))
    } else {
        let r = _mm512_sub_ps(
            _mm512_sub_ps(xc, _mm512_mul_ps(k, hi)),
            _mm512_mul_ps(k, lo),
        );
        exp_reduced(r)
    };
    let v = _mm512_scalef_ps(e, k);
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_mov_ps(v, nan, x)
}

/// `sigmoid_f32` of sixteen lanes: `e = exp(x >= 0 ? -x : x)`, then
/// `(x >= 0 ? 1 : e) / (1 + e)`; the exponential contracted where `FUSED`
/// ([`exp16_as`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn sigmoid16_as<const FUSED: bool>(x: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    let positive = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_setzero_ps());
    let e = exp16_as::<FUSED>(_mm512_mask_sub_ps(x, positive, _mm512_setzero_ps(), x));
    let numerator = _mm512_mask_mov_ps(e, positive, c(1.0));
    _mm512_div_ps(numerator, _mm512_add_ps(c(1.0), e))
}

/// [`sigmoid16_as`] in the definition's order.
#[inline]
#[target_feature(enable = "avx512f")]
fn sigmoid16(x: __m512) -> __m512 {
    sigmoid16_as::<false>(x)
}

/// `tanh_f32` of sixteen lanes, every branch computed and the lanes selected: `x` below
/// 2.44e-4 in magnitude; `x + x z p(z)` (`z = x^2`) below 0.625; else
/// `1 - 2 / (exp(2|x|) + 1)` (1 past 9) with `x`'s sign. A NaN fails every comparison and
/// takes the last branch, which keeps it NaN.
#[inline]
#[target_feature(enable = "avx512f")]
fn tanh16(x: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    let ax = _mm512_abs_ps(x);
    let z = _mm512_mul_ps(x, x);
    let [c0, rest @ ..] = kfuse_math::TANH_POLY_F32;
    let mut p = c(c0);
    for k in rest {
        p = _mm512_add_ps(_mm512_mul_ps(p, z), c(k));
    }
    let small = _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(x, z), p));
    let e = exp16(_mm512_mul_ps(c(2.0), ax));
    let t = _mm512_sub_ps(c(1.0), _mm512_div_ps(c(2.0), _mm512_add_ps(e, c(1.0))));
    let saturated = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(ax, c(9.0));
    let t = _mm512_mask_mov_ps(t, saturated, c(1.0));
    // copysign(t, x): x's bit where the sign mask is set, t's elsewhere (0xD8 is the
    // truth table of `c ? b : a` for operands a, b, c).
    let sign = _mm512_set1_epi32(i32::MIN);
    let large = _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xD8>(
        _mm512_castps_si512(t),
        _mm512_castps_si512(x),
        sign,
    ));
    let mid = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, c(0.625));
    let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, c(2.44e-4));
    let v = _mm512_mask_mov_ps(large, mid, small);
    _mm512_mask_mov_ps(v, tiny, x)
}

/// `f` over `values`, sixteen lanes at a time, the last partial block through a buffer.
#[inline]
#[target_feature(enable = "avx512f")]
fn each16(values: &mut [f32], f: impl Fn(__m512) -> __m512) {
    let mut blocks = values.chunks_exact_mut(16);
    for block in &mut blocks {
        // SAFETY: the block holds sixteen f32; unaligned loads and stores.
        unsafe {
            let x = _mm512_loadu_ps(block.as_ptr());
            _mm512_storeu_ps(block.as_mut_ptr(), f(x));
        }
    }
    let rest = blocks.into_remainder();
    if !rest.is_empty() {
        let mut lanes = [0.0f32; 16];
        lanes[..rest.len()].copy_from_slice(rest);
        // SAFETY: `lanes` holds sixteen f32.
        unsafe {
            let x = _mm512_loadu_ps(lanes.as_ptr());
            _mm512_storeu_ps(lanes.as_mut_ptr(), f(x));
        }
        rest.copy_from_slice(&lanes[..rest.len()]);
    }
}

/// `p(u)` for the coefficients `coeffs` (lowest first), on `N` vectors, as
/// `E(u^2) + u O(u^2)` with `E` and `O` (the even and odd coefficients) by Horner's rule:
/// two independent chains of half the length.
#[inline]
#[target_feature(enable = "avx512f")]
fn horner_split_pd<const N: usize>(coeffs: &[f64], u: [__m512d; N]) -> [__m512d; N] {
    let strided = |first: usize, u2: [__m512d; N]| {
        let last = first + 2 * ((coeffs.len() - 1 - first) / 2);
        let mut p = [_mm512_set1_pd(coeffs[last]); N];
        for i in (first..last).step_by(2).rev() {
            for (p, u2) in p.iter_mut().zip(u2) {
                *p = _mm512_fmadd_pd(*p, u2, _mm512_set1_pd(coeffs[i]));
            }
        }
        p
    };
    let u2 = u.map(|u| _mm512_mul_pd(u, u));
    let (even, odd) = (strided(0, u2), strided(1, u2));
    std::array::from_fn(|v| _mm512_fmadd_pd(odd[v], u[v], even[v]))
}

/// `gelu_f32` of `N` vectors of eight lanes widened to f64 (finite ones; the others are
/// replaced by the caller), side by side so that their long chains of dependent steps
/// overlap: `z = -y / sqrt 2`, both forms of `erfc(z)` computed and the one the scalar
/// branch takes kept (`1 - z P(z^2)` inside (-1, 1); outside, the tail at `|z|`, or 2
/// minus it for negative `z`, 0 past 10.1), then `0.5 y erfc(z)`. The tail's exponential
/// is `kfuse-math`'s: its argument clamped at -110 (a NaN too), `k = round(t log2 e)`
/// (ties to even), `r = t - k ln2_hi - k ln2_lo`, the Taylor series, times `2^k`
/// (`vscalefpd`, exact as the scalar product: the result is far from subnormal). The tail
/// is computed at `max(|z|, 1)` so that the lanes that do not take it stay finite.
///
/// Unlike the other forms here, this one is not the scalar operations in order: the
/// polynomials run as two interleaved Horner chains with fused multiply-adds, the steps
/// around them are fused too, and the tail multiplies by the `1 / |z|` it already has
/// instead of dividing again. One rounding in f64 more or less moves the result rounded
/// to f32 only where the f64 value lies next to an f32 rounding boundary: one input of all
/// 2^32 (checked once) comes out one ULP off the scalar definition. In order, the
/// definition's chain of some eighty dependent steps and two divisions per vector was slower
/// than the separate compiled-C kernel it replaces, whose compiler contracts it in fast
/// numerics (`docs/structured-ops.md`, "Routines": activations).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn gelu_pd<const N: usize>(y: [__m512d; N]) -> [__m512d; N] {
    let cd = _mm512_set1_pd;
    let one = cd(1.0);
    let z = y.map(|y| {
        _mm512_mul_pd(
            _mm512_xor_pd(y, cd(-0.0)),
            cd(std::f64::consts::FRAC_1_SQRT_2),
        )
    });
    let p = horner_split_pd(&kfuse_math::ERF_SMALL, z.map(|z| _mm512_mul_pd(z, z)));
    let a = z.map(|z| _mm512_max_pd(_mm512_abs_pd(z), one));
    let inv = a.map(|a| _mm512_div_pd(one, a));
    let h = horner_split_pd(&kfuse_math::ERFC_TAIL, inv);
    let mut k = [one; N];
    let mut r = [one; N];
    for i in 0..N {
        let t = _mm512_fnmadd_pd(a[i], a[i], h[i]);
        let above = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(t, cd(-110.0));
        let t = _mm512_mask_mov_pd(cd(-110.0), above, t);
        k[i] = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_pd(t, cd(std::f64::consts::LOG2_E)),
        );
        r[i] = _mm512_fnmadd_pd(
            k[i],
            cd(kfuse_math::ERF_LN2_LO),
            _mm512_fnmadd_pd(k[i], cd(kfuse_math::ERF_LN2_HI), t),
        );
    }
    let e = horner_split_pd(&kfuse_math::ERF_EXP_TAYLOR, r);
    std::array::from_fn(|i| {
        let small = _mm512_fnmadd_pd(z[i], p[i], one);
        let tail = _mm512_mul_pd(_mm512_scalef_pd(e[i], k[i]), inv[i]);
        let gone = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(a[i], cd(10.1));
        let tail = _mm512_mask_mov_pd(tail, gone, _mm512_setzero_pd());
        let below = _mm512_cmp_pd_mask::<_CMP_GT_OQ>(z[i], cd(-1.0));
        let upper = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(z[i], one);
        let erfc = _mm512_mask_mov_pd(_mm512_sub_pd(cd(2.0), tail), below, small);
        let erfc = _mm512_mask_mov_pd(erfc, upper, tail);
        _mm512_mul_pd(_mm512_mul_pd(cd(0.5), y[i]), erfc)
    })
}

/// `gelu_f32` of `B` blocks of sixteen lanes: each half in f64, rounded once to f32;
/// `gelu(-inf)` is -0, and NaN and +inf are their own results. `H` is `2 B`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn gelu_blocks<const B: usize, const H: usize>(x: [__m512; B]) -> [__m512; B] {
    let halves: [__m512d; H] = std::array::from_fn(|h| {
        let v = x[h / 2];
        _mm512_cvtps_pd(if h % 2 == 0 {
            _mm512_castps512_ps256(v)
        } else {
            _mm512_extractf32x8_ps::<1>(v)
        })
    });
    let g = gelu_pd(halves);
    std::array::from_fn(|b| {
        let (lo, hi) = (_mm512_cvtpd_ps(g[2 * b]), _mm512_cvtpd_ps(g[2 * b + 1]));
        let v = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
        let x = x[b];
        let finite =
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(x), _mm512_set1_ps(f32::INFINITY));
        let minus_inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY));
        let special = _mm512_mask_mov_ps(x, minus_inf, _mm512_set1_ps(-0.0));
        _mm512_mask_mov_ps(special, finite, v)
    })
}

/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn gelu_f32_slice(values: &mut [f32]) {
    // Blocks side by side: one at a time is bound by its chain of some eighty dependent
    // steps.
    const B: usize = GELU_BLOCKS;
    let mut runs = values.chunks_exact_mut(16 * B);
    for run in &mut runs {
        let p = run.as_mut_ptr();
        // SAFETY: the run holds B blocks of sixteen f32; unaligned loads and stores.
        unsafe {
            let x: [__m512; B] = std::array::from_fn(|b| _mm512_loadu_ps(p.add(16 * b)));
            let g = gelu_blocks::<B, { 2 * GELU_BLOCKS }>(x);
            for (b, g) in g.iter().enumerate() {
                _mm512_storeu_ps(p.add(16 * b), *g);
            }
        }
    }
    each16(runs.into_remainder(), |x| gelu_blocks::<1, 2>([x])[0])
}

/// Blocks of sixteen that [`gelu_f32_slice`] computes side by side.
const GELU_BLOCKS: usize = 2;

/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn sigmoid_f32_slice(values: &mut [f32]) {
    each16(values, |x| sigmoid16(x))
}

/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn silu_f32_slice(values: &mut [f32]) {
    each16(values, |x| _mm512_mul_ps(x, sigmoid16_as::<true>(x)))
}

/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn tanh_f32_slice(values: &mut [f32]) {
    each16(values, |x| tanh16(x))
}

/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn hardswish_f32_slice(values: &mut [f32], divide_last: bool) {
    let act = super::InRegisters::HardSwish { divide_last };
    // SAFETY: the CPU has AVX-512 F and DQ, as the caller vouches.
    each16(values, |x| unsafe { act.apply(x) })
}

/// The whole blocks of sixteen of [`super::f32_from_f16_slice`]; returns how many
/// elements it widened.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn f32_from_f16_slice(src: &[kfuse_ir::f16], dst: &mut [f32]) -> usize {
    let blocks = src.len().min(dst.len()) / 16;
    for b in 0..blocks {
        // SAFETY: block b's sixteen elements lie in both slices; f16 is two bytes.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(16 * b).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(16 * b), _mm512_cvtph_ps(h));
        }
    }
    16 * blocks
}

/// The whole blocks of sixteen of [`super::round_to_half_f32_slice`]; returns how many
/// elements it rounded.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn round_to_half_f32_slice(values: &mut [f32], bf16: bool) -> usize {
    let c = _mm512_set1_epi32;
    let blocks = values.len() / 16;
    for b in 0..blocks {
        // SAFETY: block b's sixteen elements lie in the slice.
        unsafe {
            let at = values.as_mut_ptr().add(16 * b);
            let rounded = if bf16 {
                // As `bf16_from_f32_slice`, the 16 bits kept in the upper half.
                let x = _mm512_loadu_si512(at.cast());
                let magnitude = _mm512_and_si512(x, c(0x7fff_ffff));
                let nan = _mm512_cmpgt_epu32_mask(magnitude, c(0x7f80_0000));
                let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(x), c(1));
                let up = _mm512_add_epi32(_mm512_add_epi32(x, c(0x7fff)), odd);
                let quiet = _mm512_or_si512(x, c(0x40 << 16));
                let bits = _mm512_mask_blend_epi32(nan, up, quiet);
                _mm512_castsi512_ps(_mm512_and_si512(bits, c(0xffff_0000_u32 as i32)))
            } else {
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_loadu_ps(at),
                );
                _mm512_cvtph_ps(h)
            };
            _mm512_storeu_ps(at, rounded);
        }
    }
    16 * blocks
}

/// The whole blocks of sixteen of [`super::bf16_from_f32_slice`]; returns how many
/// elements it converted.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn bf16_from_f32_slice(src: &[f32], dst: &mut [kfuse_ir::bf16]) -> usize {
    let c = _mm512_set1_epi32;
    let blocks = src.len().min(dst.len()) / 16;
    for b in 0..blocks {
        // SAFETY: block b's sixteen elements lie in both slices; bf16 is two bytes.
        unsafe {
            let x = _mm512_loadu_si512(src.as_ptr().add(16 * b).cast());
            let magnitude = _mm512_and_si512(x, c(0x7fff_ffff));
            let nan = _mm512_cmpgt_epu32_mask(magnitude, c(0x7f80_0000));
            // Ties to even: add 0x7fff and the lowest kept bit, then drop 16 bits (a carry
            // into the exponent rounds up to the next binade, or to infinity).
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(x), c(1));
            let rounded =
                _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(x, c(0x7fff)), odd));
            // A NaN keeps its sign and upper payload, made quiet.
            let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), c(0x40));
            let bits = _mm512_mask_blend_epi32(nan, rounded, quiet);
            _mm256_storeu_si256(
                dst.as_mut_ptr().add(16 * b).cast(),
                _mm512_cvtepi32_epi16(bits),
            );
        }
    }
    16 * blocks
}

/// The whole blocks of sixteen of [`super::f16_from_f32_slice`]; returns how many elements
/// it converted.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn f16_from_f32_slice(src: &[f32], dst: &mut [kfuse_ir::f16]) -> usize {
    let blocks = src.len().min(dst.len()) / 16;
    for b in 0..blocks {
        // SAFETY: block b's sixteen elements lie in both slices; f16 is two bytes.
        unsafe {
            let x = _mm512_loadu_ps(src.as_ptr().add(16 * b));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            _mm256_storeu_si256(dst.as_mut_ptr().add(16 * b).cast(), h);
        }
    }
    16 * blocks
}

/// `B` vectors, the `i`-th `f(i)`.
#[inline(always)]
fn each<const B: usize>(f: impl FnMut(usize) -> __m512) -> [__m512; B] {
    std::array::from_fn(f)
}

/// `gelu_tanh_f32` of `B` blocks of sixteen lanes, in f32 throughout, within 2 ULPs of the
/// definition (which evaluates in f64; see [`super::gelu_tanh_f32_slice`]).
///
/// The definition is `x s` with `s = sigmoid(u2)`, `u2 = 2 sqrt(2/pi) (x + 0.044715 x^3)`.
/// Here:
/// - `t = -|u2| = c1 z + c3 z^3` at `z = -|x|` (`u2` is odd in `x`), as a pair of f32
///   `th + tl` (products split exactly with fused multiply-adds, the constants split in
///   two, the sum by Fast2Sum, the larger term first). Where `x < 0` the result is about
///   `x e^t`, whose relative error is the absolute error of `t`: up to `|t| = 110`, a
///   single f32 `t` would be off by tens of ULPs.
/// - `e^t = 2^k y`: `k = round(th log2 e)`, `r = th - k ln2_hi - k ln2_lo + tl`, `y` the
///   exponential's polynomial on `r` (fused).
/// - `x >= 0` (and `-0`): `x / (1 + e^t)`. `x < 0`: `2^k (x y / (1 + e^t))`, scaled last so
///   that no step before it is subnormal; only a subnormal result rounds twice (or
///   flushes, under the epilogue's flush-to-zero). `1 + e^t` and `x y` are pairs of f32,
///   and the quotient takes one correction by the remainder of the whole fraction
///   (without it, 4 ULPs off below zero).
/// - `t` at or below -110 (`x` below about -11.1, `-inf` included, and every `x` whose
///   cube overflows; `x` NaN too): -0 below zero, where the definition's result rounds to
///   it, and `x` itself above (and for NaN).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn gelu_tanh_blocks<const B: usize>(x: [__m512; B]) -> [__m512; B] {
    let c = _mm512_set1_ps;
    const C1: f64 = 2.0 * kfuse_math::SQRT_2_OVER_PI;
    const C3: f64 = C1 * 0.044_715;
    let (c1h, c3h) = (C1 as f32, C3 as f32);
    let (c1l, c3l) = ((C1 - c1h as f64) as f32, (C3 - c3h as f64) as f32);
    let z = x.map(|x| _mm512_or_ps(x, c(-0.0)));
    // z^2 and z^3 as high and low parts.
    let sh = z.map(|z| _mm512_mul_ps(z, z));
    let sl = each::<B>(|i| _mm512_fmsub_ps(z[i], z[i], sh[i]));
    let ch = each::<B>(|i| _mm512_mul_ps(sh[i], z[i]));
    let cl = each::<B>(|i| _mm512_fmadd_ps(sl[i], z[i], _mm512_fmsub_ps(sh[i], z[i], ch[i])));
    // The two terms c1 z and c3 z^3, each as high and low parts.
    let ah = z.map(|z| _mm512_mul_ps(c(c1h), z));
    let al = each::<B>(|i| _mm512_fmadd_ps(c(c1l), z[i], _mm512_fmsub_ps(c(c1h), z[i], ah[i])));
    let bh = ch.map(|v| _mm512_mul_ps(c(c3h), v));
    let bl = each::<B>(|i| {
        let low = _mm512_fmsub_ps(c(c3h), ch[i], bh[i]);
        let low = _mm512_fmadd_ps(c(c3h), cl[i], low);
        _mm512_fmadd_ps(c(c3l), ch[i], low)
    });
    // Both terms are at most 0: the smaller is the larger in magnitude.
    let t = each::<B>(|i| _mm512_add_ps(ah[i], bh[i]));
    let live: [__mmask16; B] =
        std::array::from_fn(|i| _mm512_cmp_ps_mask::<_CMP_GT_OQ>(t[i], c(-110.0)));
    let tl = each::<B>(|i| {
        let (big, small) = (_mm512_min_ps(ah[i], bh[i]), _mm512_max_ps(ah[i], bh[i]));
        let low = _mm512_add_ps(_mm512_sub_ps(big, t[i]), small);
        _mm512_add_ps(low, _mm512_add_ps(al[i], bl[i]))
    });
    let k = t.map(|t| {
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            t,
            c(kfuse_math::LOG2_E_F32),
        ))
    });
    let r = each::<B>(|i| {
        let r = _mm512_fnmadd_ps(k[i], c(kfuse_math::LN2_HI_F32), t[i]);
        let r = _mm512_fnmadd_ps(k[i], c(kfuse_math::LN2_LO_F32), r);
        _mm512_add_ps(r, tl[i])
    });
    let [c0, rest @ ..] = kfuse_math::EXP_POLY_F32;
    let mut p = [c(c0); B];
    for coeff in rest {
        p = each::<B>(|i| _mm512_fmadd_ps(p[i], r[i], c(coeff)));
    }
    each::<B>(|i| {
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(_mm512_mul_ps(r[i], r[i]), p[i], r[i]),
            c(1.0),
        );
        let e = _mm512_scalef_ps(y, k[i]);
        let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[i], c(0.0));
        // 1 + e as dh + dl (Fast2Sum: e <= 1), and the numerator x or x y as nh + nl.
        let dh = _mm512_add_ps(c(1.0), e);
        let dl = _mm512_add_ps(_mm512_sub_ps(c(1.0), dh), e);
        let nh = _mm512_mask_mul_ps(x[i], negative, x[i], y);
        let nl = _mm512_maskz_fmsub_ps(negative, x[i], y, nh);
        // The quotient, then one correction by the remainder of the whole fraction.
        let q = _mm512_div_ps(nh, dh);
        let rem = _mm512_add_ps(_mm512_fnmadd_ps(q, dh, nh), nl);
        let rem = _mm512_fnmadd_ps(q, dl, rem);
        let q = _mm512_fmadd_ps(rem, _mm512_rcp14_ps(dh), q);
        let v = _mm512_mask_scalef_ps(q, negative, q, k[i]);
        // Past the clamp: -0 below zero, `x` itself above (and NaN).
        let dead = _mm512_mask_mov_ps(x[i], negative, c(-0.0));
        _mm512_mask_mov_ps(dead, live[i], v)
    })
}

/// # Safety
/// The CPU must have AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn gelu_tanh_f32_slice(values: &mut [f32]) {
    // Two blocks side by side: the chain of one block's dependent steps is some forty
    // instructions long. Four and eight blocks measured no faster.
    const B: usize = 2;
    let mut tiles = values.chunks_exact_mut(16 * B);
    for tile in &mut tiles {
        let p = tile.as_mut_ptr();
        // SAFETY: the tile holds B blocks of sixteen f32; unaligned loads and stores.
        unsafe {
            let x: [__m512; B] = std::array::from_fn(|j| _mm512_loadu_ps(p.add(16 * j)));
            for (j, v) in gelu_tanh_blocks(x).into_iter().enumerate() {
                _mm512_storeu_ps(p.add(16 * j), v);
            }
        }
    }
    each16(tiles.into_remainder(), |x| gelu_tanh_blocks([x])[0])
}
