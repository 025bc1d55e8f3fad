//! Exponentials and logarithms for f32.
//!
//! Range reduction follows Cephes: `x = k ln2 + r` with a two-constant Cody-Waite split of `ln2`
//! (the high part has few bits, so `k * LN2_HI` is exact), a minimax polynomial on
//! `|r| <= ln2 / 2`, and scaling by `2^k` through the exponent bits in at most two exact steps so
//! that subnormal results round once.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4; // 355/512, exact in 9 bits.
const LN2_LO: f32 = -2.121_944_4e-4;
/// `exp`'s reduction constants, for vectorized forms of it (kfuse-cpu's): `log2 e`, and `ln 2`
/// split in a high part of few bits (so that `k * LN2_HI_F32` is exact) and the rest.
pub const LOG2_E_F32: f32 = LOG2_E;
pub const LN2_HI_F32: f32 = LN2_HI;
pub const LN2_LO_F32: f32 = LN2_LO;
/// Above this, `exp` overflows to infinity.
#[cfg(test)]
const EXP_MAX: f32 = 88.722_84;
/// Below this, `exp` underflows to zero.
#[cfg(test)]
const EXP_MIN: f32 = -103.972_08;

/// `2^n` for `-126 <= n <= 127`.
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `y * 2^k` for `-160 <= k <= 160` and `y` near 1: exact unless the result is subnormal, then
/// rounded once. Split as `2^(k >> 1) * 2^(k - (k >> 1))` so that both factors are normal and the
/// first product is exact; this form needs no branches, so it vectorizes.
#[inline]
fn scale(y: f32, k: i32) -> f32 {
    let k1 = k >> 1;
    y * pow2i(k1) * pow2i(k - k1)
}

/// The coefficients of [`exp_poly`], highest degree first: vectorized forms of the
/// exponential (kfuse-cpu's) take them from here.
/// (Cephes's digits, kept as published; the last rounds to 0.5 in f32.)
pub const EXP_POLY_F32: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5.000_000_1e-1,
];

/// `e^r - 1 - r` divided by `r^2` on `|r| <= ln2/2` (Cephes `expf`), in Horner's order.
#[inline]
fn exp_poly(r: f32) -> f32 {
    let c = EXP_POLY_F32;
    ((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]
}

/// `e^r` on `|r| <= ln2/2`.
#[inline]
fn exp_reduced(r: f32) -> f32 {
    r * r * exp_poly(r) + r + 1.0
}

/// `k` (an integer value below 2^22 in magnitude) as an `i32`: adding 1.5 * 2^23 puts it in the
/// low mantissa bits. Exact, and unlike the saturating `as i32`, it vectorizes.
#[inline]
fn small_int(k: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (k + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// Splits `x` into `k` and `r = x - k ln2`.
#[inline]
fn reduce_ln2(x: f32) -> (i32, f32) {
    let k = (x * LOG2_E).round_ties_even();
    let r = x - k * LN2_HI - k * LN2_LO;
    (small_int(k), r)
}

/// `e^x` for f32. Max error 1 ulp over all inputs (see `docs/numerics.md`).
///
/// Branch-free, so that loops calling it vectorize: the argument is clamped to
/// `[-110, 89]`, beyond which the scaled result already rounds to 0 or overflows to infinity
/// (bit-identical to returning those results for `x < EXP_MIN` and `x > EXP_MAX`, checked
/// on all 2^32 inputs), and a NaN argument is selected back at the end.
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    // Comparisons, not `max`/`min`: a NaN becomes -110 (any finite value would do, it is
    // selected away below), so each clamp is one vector max or min with no NaN fix-up.
    let xc = if x > -110.0 { x } else { -110.0 };
    let xc = if xc < 89.0 { xc } else { 89.0 };
    let (k, r) = reduce_ln2(xc);
    let v = scale(exp_reduced(r), k);
    if x.is_nan() {
        x
    } else {
        v
    }
}

/// The definition [`exp_f32`] is checked against: special results returned first.
#[cfg(test)]
pub(crate) fn exp_f32_direct(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    let (k, r) = reduce_ln2(x);
    scale(exp_reduced(r), k)
}

/// `e^t` for `t <= 0` to f32 accuracy (within 1 ULP of an f32 result), returned in f64: the
/// reduction `t = k ln2 + r` runs in f64, the f32 polynomial evaluates `e^r`, and the scaling by
/// `2^k` is exact in f64. For arguments known to f64 precision whose exponential only needs f32
/// precision; it needs no libm call, so it vectorizes.
#[inline]
pub fn exp_f32_of_f64(t: f64) -> f64 {
    if t.is_nan() {
        return t;
    }
    // Below -746, `e^t` rounds to zero in f64. Those arguments compute from 0 instead and are
    // replaced at the end, so that no step underflows: results that underflow to subnormals
    // or zero take a slow microcode path on some CPUs (see `docs/numerics.md` on subnormal
    // results).
    let dead = t < -746.0;
    let tc = if dead { 0.0 } else { t };
    let k = (tc * std::f64::consts::LOG2_E).round_ties_even();
    let r = (tc - k * std::f64::consts::LN_2) as f32;
    let y = exp_reduced(r) as f64;
    // `k` is an integer in [-1077, 0] for -746 <= t <= 0 (and exact far beyond): adding
    // 1.5 * 2^52 puts it in the low mantissa bits, which reads it out without the saturating
    // float-to-int conversion, which does not vectorize.
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    let ki = (k + MAGIC).to_bits() as i64 - MAGIC.to_bits() as i64;
    let k1 = ki >> 1;
    let v = y
        * f64::from_bits(((k1 + 1023) as u64) << 52)
        * f64::from_bits(((ki - k1 + 1023) as u64) << 52);
    if dead {
        0.0
    } else {
        v
    }
}

/// `2^x` for f32.
pub fn exp2_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x >= 128.0 {
        return f32::INFINITY;
    }
    if x < -151.0 {
        return 0.0;
    }
    let k = x.round_ties_even();
    // `x - k` is exact; its product with ln2 is reduced further like `exp`.
    let f = x - k;
    let r = f * LN2_HI + f * LN2_LO;
    scale(exp_reduced(r), small_int(k))
}

/// `e^x - 1` for f32, accurate near 0.
pub fn expm1_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    if ax < 2.98e-8 {
        // e^x - 1 = x (1 + x/2 + ...) rounds to x; this also keeps the sign of zero.
        return x;
    }
    if ax < 0.346_573_6 {
        // Taylor series to degree 8; the remainder is below 2^-30 relative.
        let p = ((((((1.0 / 40320.0 * x + 1.0 / 5040.0) * x + 1.0 / 720.0) * x + 1.0 / 120.0)
            * x
            + 1.0 / 24.0)
            * x
            + 1.0 / 6.0)
            * x
            + 0.5)
            * (x * x);
        return x + p;
    }
    if x > 87.0 {
        return exp_f32(x);
    }
    if x < -17.5 {
        return -1.0;
    }
    let (k, r) = reduce_ln2(x);
    let t = pow2i(k);
    let em1 = r + r * r * exp_poly(r);
    (t - 1.0) + t * em1
}

const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;

/// Splits a positive finite `x` into `e` and `f = m - 1` with `x = (1 + f) 2^e`,
/// `sqrt(1/2) <= 1 + f < sqrt(2)`.
fn split_log(x: f32) -> (f32, f32) {
    let (mut bits, mut e) = (x.to_bits(), -127i32);
    if bits < 0x0080_0000 {
        // Subnormal: scale by 2^23 first.
        bits = (x * 8_388_608.0).to_bits();
        e -= 23;
    }
    e += (bits >> 23) as i32;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > 2.0 * SQRT_HALF {
        m *= 0.5;
        e += 1;
    }
    (e as f32, m - 1.0)
}

/// `log(1 + f) - f + f^2/2` for `f` in `[sqrt(1/2) - 1, sqrt(2) - 1]` (Cephes `logf`).
fn log_tail(f: f32) -> f32 {
    let z = f * f;
    const P: [f32; 9] = [
        7.037_683_6e-2,
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333_1e-1,
    ];
    // Horner from the highest-order coefficient down.
    let p = P[1..].iter().fold(P[0], |acc, &c| acc * f + c);
    f * z * p
}

/// Handles NaN, negatives, zero and infinity; `None` for ordinary positive inputs.
fn log_special(x: f32) -> Option<f32> {
    if x.is_nan() || x < 0.0 {
        Some(f32::NAN)
    } else if x == 0.0 {
        Some(f32::NEG_INFINITY)
    } else if x == f32::INFINITY {
        Some(x)
    } else {
        None
    }
}

/// Natural logarithm for f32.
pub fn log_f32(x: f32) -> f32 {
    if let Some(s) = log_special(x) {
        return s;
    }
    let (e, f) = split_log(x);
    let z = f * f;
    let y = log_tail(f) + e * LN2_LO - 0.5 * z;
    f + y + e * LN2_HI
}

/// Base-2 logarithm for f32: `e + log(1 + f) / ln 2`.
pub fn log2_f32(x: f32) -> f32 {
    if let Some(s) = log_special(x) {
        return s;
    }
    let (e, f) = split_log(x);
    let ln_m = f + (log_tail(f) - 0.5 * f * f);
    e + ln_m * LOG2_E
}

/// `log(1 + x)` for f32, accurate near 0 (Goldberg: `log(u) * x / (u - 1)` with `u = 1 + x`).
pub fn log1p_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x == f32::INFINITY {
        return x;
    }
    let u = 1.0 + x;
    if u == 1.0 {
        return x;
    }
    if u <= 0.0 {
        return if u == 0.0 {
            f32::NEG_INFINITY
        } else {
            f32::NAN
        };
    }
    // u - 1, exactly: where the split's exponent is 0, its f is that same subtraction of the
    // same bits. The C port takes it from there so that fast numerics, which would cancel
    // (1 + x) - 1 into x, cannot see where it came from.
    let (e, f) = split_log(u);
    let u_minus_1 = if e == 0.0 { f } else { u - 1.0 };
    log_f32(u) * (x / u_minus_1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// The branch-free `exp_f32` against the direct definition: every 61st bit pattern (a
    /// prime stride, so every exponent and many mantissas), and every pattern around the clamps
    /// and the overflow and underflow thresholds. (All 2^32 inputs agree too; that run takes a
    /// minute, so it is not part of the suite.)
    #[test]
    fn exp_clamped_form_matches_the_direct_definition() {
        const STRIDE: u32 = 61;
        let mut bits = 0u32;
        loop {
            let x = f32::from_bits(bits);
            assert!(same(exp_f32(x), exp_f32_direct(x)), "exp({x:e})");
            match bits.checked_add(STRIDE) {
                Some(b) => bits = b,
                None => break,
            }
        }
        for edge in [EXP_MAX, EXP_MIN, 89.0, -110.0, 0.0, -0.0, f32::INFINITY] {
            for sign in [1.0f32, -1.0] {
                let centre = (edge * sign).to_bits();
                for b in centre.saturating_sub(1 << 16)..=centre.saturating_add(1 << 16) {
                    let x = f32::from_bits(b);
                    assert!(same(exp_f32(x), exp_f32_direct(x)), "exp({x:e})");
                }
            }
        }
    }
}
