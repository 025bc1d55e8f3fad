//! kfuse numerics, defined once.
//!
//! Every backend computes elementwise math through the definitions in this crate: the reference
//! interpreter calls these functions, and compiled backends emit the same operation sequences,
//! so results can match bit for bit.
//!
//! * `f32` transcendentals ([`exp_f32`], [`log_f32`], [`tanh_f32`], ...) are kfuse's own
//!   branch-light polynomial code with fixed operation order and no fused multiply-add.
//!   [`erf_f32`], both GELU forms, [`rsqrt_f32`] and [`pow_f32`] evaluate in `f64` and round
//!   once (`pow` through the platform's `pow`; `erf` and GELU through kfuse's own exponentials,
//!   so they vectorize); every bound is in `docs/numerics.md` and checked by tests.
//! * `f64` transcendentals use the platform's `f64` libm (and the `libm` crate for `erf`).
//! * Scalar semantics shared by all dtypes: IEEE 754-2019 `maximum`/`minimum`, numpy remainder and
//!   floor division, saturating casts, and `f64` narrowed to `f16`/`bf16` with one rounding
//!   ([`f16_bits_from_f64`], [`bf16_bits_from_f64`]).
//! * [`philox4x32`]: the counter-based generator behind the `rng` op.

// Polynomial coefficients keep the digits they were published or fitted with.
#![allow(clippy::excessive_precision)]

pub mod accuracy;
mod erf;
mod exp_log;
mod narrow;
mod rng;
mod scalar;
mod trig;

pub use erf::{
    erf_f32, erf_f64, erfc_f64_of_f32, gelu_f32, gelu_f64, ERFC_TAIL, ERF_EXP_TAYLOR, ERF_LN2_HI,
    ERF_LN2_LO, ERF_SMALL,
};
pub use exp_log::{
    exp2_f32, exp_f32, exp_f32_of_f64, expm1_f32, log1p_f32, log2_f32, log_f32, EXP_POLY_F32,
    LN2_HI_F32, LN2_LO_F32, LOG2_E_F32,
};
pub use narrow::{bf16_bits_from_f64, f16_bits_from_f64};
pub use rng::{normal_f32, normal_f64, philox4x32, uniform_f32, uniform_f64};
pub use scalar::{
    floor_div_i64, maximum_f32, maximum_f64, minimum_f32, minimum_f64, pow_f32, rem_f32, rem_f64,
    rem_i64,
};
pub use trig::{cos_f32, sin_f32};

/// The coefficients of `tanh`'s odd polynomial below 0.625 (in `z = x^2`, highest degree
/// first; `tanh x = x + x z p(z)`): vectorized forms of [`tanh_f32`] take them from here.
pub const TANH_POLY_F32: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_908_9e-2,
    -5.373_971_6e-2,
    1.333_144_2e-1,
    -3.333_328_2e-1,
];

/// `tanh` for f32: odd polynomial below 0.625, `1 - 2 / (exp(2|x|) + 1)` above, ±1 past 9.
#[inline]
pub fn tanh_f32(x: f32) -> f32 {
    let ax = x.abs();
    if ax.is_nan() {
        return x;
    }
    if ax < 2.44e-4 {
        // tanh x = x (1 - x^2/3 + ...) rounds to x here, and the sign of zero is kept.
        return x;
    }
    if ax < 0.625 {
        let z = x * x;
        let [c0, c1, c2, c3, c4] = TANH_POLY_F32;
        let p = (((c0 * z + c1) * z + c2) * z + c3) * z + c4;
        return x + x * z * p;
    }
    let t = if ax > 9.0 {
        1.0
    } else {
        1.0 - 2.0 / (exp_f32(2.0 * ax) + 1.0)
    };
    t.copysign(x)
}

/// Logistic sigmoid for f32, `1 / (1 + exp(-x))`, written as `e / (1 + e)` with `e = exp(x)` for
/// negative `x` so that tiny results keep their precision.
///
/// One exponential and one division whichever the sign (the argument and the numerator are
/// selected), so that a vectorized loop evaluates neither twice and has no branch. Always
/// inlined: callers compiled for wider vectors (the AVX-512 epilogues) must get their own copy,
/// and a plain `#[inline]` body this large is not inlined.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    let positive = x >= 0.0;
    let e = exp_f32(if positive { -x } else { x });
    (if positive { 1.0 } else { e }) / (1.0 + e)
}

/// Logistic sigmoid for f64.
pub fn sigmoid_f64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `softplus(x) = log(1 + exp(x))`, as `max(x, 0) + log1p(exp(-|x|))`.
pub fn softplus_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    x.max(0.0) + log1p_f32(exp_f32(-x.abs()))
}

/// `softplus` for f64.
pub fn softplus_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// GELU, tanh form: `0.5 x (1 + tanh(u))` with `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as the
/// equal `x * sigmoid(2u)`, which keeps its precision for negative `x`. `u` and the sigmoid are
/// evaluated in f64 around an exponential of f32 accuracy ([`exp_f32_of_f64`]): in f32 the
/// rounding of `u` would be multiplied by `|2u|` in the tail (over 100 ULP at `x = -10`). Needs no
/// libm call, so it vectorizes.
#[inline]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return -0.0;
    }
    let xd = x as f64;
    let u2 = 2.0 * SQRT_2_OVER_PI * (xd + 0.044_715 * xd * xd * xd);
    let e = exp_f32_of_f64(-u2.abs());
    // One division whichever the sign: the numerator is chosen, so that a vectorized loop does
    // not evaluate both quotients.
    let s = if u2 >= 0.0 { 1.0 } else { e } / (1.0 + e);
    (xd * s) as f32
}

/// `sqrt(2 / pi)`, correctly rounded.
pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// GELU, tanh form, f64.
pub fn gelu_tanh_f64(x: f64) -> f64 {
    if x.is_infinite() {
        // The limits; the formula would give -inf * 0 = NaN below.
        return if x > 0.0 { x } else { -0.0 };
    }
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
    x * sigmoid_f64(2.0 * u)
}

/// `1 / sqrt(x)`, evaluated in f64 and rounded once (two f32 roundings would give 1.5 ULP).
pub fn rsqrt_f32(x: f32) -> f32 {
    (1.0 / (x as f64).sqrt()) as f32
}
