//! The error function and the erf form of GELU for f32, evaluated in f64 and rounded once.
//!
//! Coefficients come from `tools/fit_erf.py` (least squares at Chebyshev nodes against mpmath):
//! `erf(x) = x P(x^2)` for `|x| < 1` and `erfc(y) = exp(-y^2 + Q(1/y)) / y` for `1 <= y <= 10.1`.

/// `erf(x) = x P(x^2)` for `|x| < 1`: `P`'s coefficients, lowest first.
pub const ERF_SMALL: [f64; 10] = [
    1.128_379_167_095_491_2,
    -0.376_126_389_027_684_1,
    0.112_837_916_574_991_77,
    -0.026_866_168_944_683_452,
    0.005_223_966_656_513_368,
    -0.000_854_791_840_632_663_6,
    0.000_120_460_037_539_137_06,
    -1.479_250_679_610_603_9e-5,
    1.529_301_123_872_459_9e-6,
    -1.043_961_634_936_469_5e-7,
];

/// `erfc(y) = exp(-y^2 + Q(1/y)) / y` for `1 <= y <= 10.1`: `Q`'s coefficients, lowest first.
pub const ERFC_TAIL: [f64; 17] = [
    -0.572_365_332_684_851_8,
    2.009_371_029_967_584e-5,
    -0.500_454_402_371_707_6,
    0.005_905_416_053_492_059,
    0.576_901_702_686_881_2,
    0.244_560_189_511_533_77,
    -2.185_373_689_148_906,
    -0.542_219_078_928_131_3,
    17.856_871_326_341_69,
    -52.730_441_276_900_35,
    90.188_292_160_334_56,
    -105.062_627_292_108_03,
    86.612_011_980_779_16,
    -50.147_780_842_951_21,
    19.498_621_026_746_8,
    -4.585_240_074_225_506,
    0.493_712_583_231_132_43,
];

fn horner(coeffs: &[f64], u: f64) -> f64 {
    coeffs.iter().rev().fold(0.0, |acc, &c| acc * u + c)
}

/// `erf(y)` for `|y| < 1`.
fn erf_small(y: f64) -> f64 {
    y * horner(&ERF_SMALL, y * y)
}

/// `e^t` for `-110 <= t <= 0`, to a few f64 ulps (relative error below 1e-14): Cody-Waite
/// reduction `t = k ln2 + r` with fdlibm's split of `ln 2`, the Taylor series of `e^r` to degree
/// 11 (`|r| <= ln2 / 2`, remainder below 7e-15), and an exact scaling by `2^k`. The tail of
/// `erfc` needs far less than f64 accuracy before its result rounds to f32; unlike libm's `exp`,
/// this is the same operation sequence in the C port, where it vectorizes, so kernels calling
/// `erf` and the erf form of GELU compile to vector code and stay bit-identical. Arguments below
/// -110 (where `erfc` is selected away) compute as -110, so nothing underflows.
#[inline]
fn exp_tail(t: f64) -> f64 {
    let t = if t > -110.0 { t } else { -110.0 };
    let k = (t * std::f64::consts::LOG2_E).round_ties_even();
    let r = t - k * ERF_LN2_HI - k * ERF_LN2_LO;
    horner(&ERF_EXP_TAYLOR, r) * f64::from_bits(((k as i64 + 1023) as u64) << 52)
}

/// `ln 2` split as fdlibm splits it: `k * ERF_LN2_HI` is exact for every `k` the exponential
/// of `erfc` reduces by.
pub const ERF_LN2_HI: f64 = 6.931_471_803_691_238_2e-1; // 0x3fe62e42fee00000
/// The rest of `ln 2` after [`ERF_LN2_HI`].
pub const ERF_LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// `1 / n!` for `n = 0..=11`: the Taylor series of `erfc`'s exponential.
pub const ERF_EXP_TAYLOR: [f64; 12] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362880.0,
    1.0 / 3628800.0,
    1.0 / 39916800.0,
];

/// `erfc(y)` for `y >= 1`; zero past 10.1, where it is below the smallest f32.
fn erfc_tail(y: f64) -> f64 {
    if y > 10.1 {
        return 0.0;
    }
    exp_tail(-(y * y) + horner(&ERFC_TAIL, 1.0 / y)) / y
}

/// `erfc(y)` for any finite `y`.
fn erfc(y: f64) -> f64 {
    if y >= 1.0 {
        erfc_tail(y)
    } else if y > -1.0 {
        1.0 - erf_small(y)
    } else {
        2.0 - erfc_tail(-y)
    }
}

/// The error function for f32.
pub fn erf_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let y = x as f64;
    let ay = y.abs();
    let r = if ay < 1.0 {
        erf_small(y)
    } else if ay > 4.0 {
        1.0f64.copysign(y)
    } else {
        (1.0 - erfc_tail(ay)).copysign(y)
    };
    r as f32
}

/// `erfc` of an f32 argument, in f64 (exposed for tests and for the GELU definition).
pub fn erfc_f64_of_f32(x: f32) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    erfc(x as f64)
}

/// GELU, erf form: `0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2)`; the erfc form keeps
/// its precision for negative `x`.
pub fn gelu_f32(x: f32) -> f32 {
    if !x.is_finite() {
        return if x == f32::NEG_INFINITY { -0.0 } else { x };
    }
    let y = x as f64;
    (0.5 * y * erfc(-y * std::f64::consts::FRAC_1_SQRT_2)) as f32
}

/// GELU, erf form, for f64.
pub fn gelu_f64(x: f64) -> f64 {
    if !x.is_finite() {
        return if x == f64::NEG_INFINITY { -0.0 } else { x };
    }
    0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// The error function for f64 (the `libm` crate's port of the FreeBSD/musl `erf`).
pub fn erf_f64(x: f64) -> f64 {
    libm::erf(x)
}
