//! Sine and cosine for f32 over the whole float range.
//!
//! The argument is reduced to `r = x - n pi/2` with `|r| <= pi/4` in f64: a two-constant
//! Cody-Waite step below 2^28 and an exact Payne-Hanek reduction with 2/pi bits above. The
//! reduced argument feeds f64 minimax kernels (FreeBSD's `__sindf`/`__cosdf`) and the result is
//! rounded to f32 once.

use std::f64::consts::FRAC_PI_2;

const INV_PIO2: f64 = std::f64::consts::FRAC_2_PI;
/// First 33 bits of pi/2, and the rest.
const PIO2_1: f64 = 1.570_796_310_901_641_845_7;
const PIO2_1T: f64 = 1.589_325_477_352_819_669_16e-8;

/// The first 320 fractional bits of 2/pi (computed with mpmath at 400 bits).
const TWO_OVER_PI_BITS: [u64; 5] = [
    0xA2F9_836E_4E44_1529,
    0xFC27_57D1_F534_DDC0,
    0xDB62_9599_3C43_9041,
    0xFE51_63AB_DEBB_C561,
    0xB724_6E3A_424D_D2E0,
];

fn sin_kernel(x: f64) -> f64 {
    const S1: f64 = -0.166_666_666_416_265_235_595;
    const S2: f64 = 0.008_333_329_385_889_463_175_6;
    const S3: f64 = -0.000_198_393_348_360_966_317_347;
    const S4: f64 = 0.000_002_718_311_493_989_821_906_4;
    let z = x * x;
    let w = z * z;
    let r = S3 + z * S4;
    let s = z * x;
    (x + s * (S1 + z * S2)) + s * w * r
}

fn cos_kernel(x: f64) -> f64 {
    const C0: f64 = -0.499_999_997_251_031_003_12;
    const C1: f64 = 0.041_666_623_323_739_063_189_4;
    const C2: f64 = -0.001_388_676_377_460_992_946_92;
    const C3: f64 = 0.000_024_390_448_796_277_409_065_4;
    let z = x * x;
    let w = z * z;
    let r = C2 + z * C3;
    ((1.0 + z * C0) + w * C1) + (w * z) * r
}

/// Bit `i` (0-based) of the fraction of 2/pi, for `i < 320`.
fn two_over_pi_bit(i: usize) -> u128 {
    ((TWO_OVER_PI_BITS[i / 64] >> (63 - i % 64)) & 1) as u128
}

/// Reduces a non-negative finite `x` to `(n mod 4, r)` with `x = n pi/2 + r`, `|r| <= pi/4`.
fn reduce(x: f32) -> (u32, f64) {
    let xd = x as f64;
    if x < 2.0e8 {
        let n = (xd * INV_PIO2).round_ties_even();
        let r = xd - n * PIO2_1 - n * PIO2_1T;
        return ((n as i64 & 3) as u32, r);
    }
    // Payne-Hanek: x = m 2^e with a 24-bit integer m. Fraction bits of 2/pi before index e - 2
    // contribute multiples of 4 to x 2/pi and drop out of n mod 4; the 96 bits after start from
    // there give the quadrant and 94 fraction bits.
    let bits = x.to_bits();
    let m = ((bits & 0x007f_ffff) | 0x0080_0000) as u128;
    let e = ((bits >> 23) as i32 - 150) as usize; // x >= 2^27 here, so e >= 4.
    let start = e - 2;
    let mut window: u128 = 0;
    for i in start..start + 96 {
        window = (window << 1) | two_over_pi_bit(i);
    }
    // x 2/pi mod 4 = m * window * 2^(e - start - 96) = product / 2^94 (mod 4).
    let product = m * window;
    let mut n = ((product >> 94) & 3) as u32;
    let mut frac = (product & ((1u128 << 94) - 1)) as f64 / (1u128 << 94) as f64;
    if frac >= 0.5 {
        frac -= 1.0;
        n = (n + 1) & 3;
    }
    (n, frac * FRAC_PI_2)
}

/// Sine for f32.
pub fn sin_f32(x: f32) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    if x.abs() < 2.44e-4 {
        // sin x = x (1 - x^2/6 + ...) rounds to x here; this keeps -0.0 and subnormals exact.
        return x;
    }
    let (n, r) = reduce(x.abs());
    let s = match n {
        0 => sin_kernel(r),
        1 => cos_kernel(r),
        2 => -sin_kernel(r),
        _ => -cos_kernel(r),
    };
    let v = s as f32;
    if x < 0.0 {
        -v
    } else {
        v
    }
}

/// Cosine for f32.
pub fn cos_f32(x: f32) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    let (n, r) = reduce(x.abs());
    let c = match n {
        0 => cos_kernel(r),
        1 => -sin_kernel(r),
        2 => -cos_kernel(r),
        _ => sin_kernel(r),
    };
    c as f32
}
