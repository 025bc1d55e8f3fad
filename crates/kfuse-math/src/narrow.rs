//! `f64` narrowed to the 16-bit float formats with one rounding.
//!
//! Going through `f32` rounds twice, and the second rounding can go the wrong way: 2049.0000001
//! rounds to the f32 2049, a tie between the f16 values 2048 and 2050 that goes to the even 2048,
//! where the f64 lies above the tie and rounds to 2050. The `half` crate's `from_f64` does go
//! through `f32` where the CPU has F16C, and otherwise drops the low 32 bits of the significand
//! before rounding (1 + 2^-8 + 2^-30 becomes the bf16 tie 1 + 2^-8 and rounds down to 1). So
//! kfuse rounds from the bits itself; `kfuse_math.h` holds the C port, the same integer steps.

/// The bits of `x` rounded to nearest, ties to even, into a binary format with `exp_bits`
/// exponent bits and `man_bits` stored significand bits (at most 15 bits in all, plus the sign).
/// Overflow gives an infinity of `x`'s sign; a NaN stays a quiet NaN with `x`'s sign and the top
/// bits of its payload. Written as straight-line integer steps with the NaN selected at the end,
/// as the C port is.
fn narrow_f64(x: f64, exp_bits: u32, man_bits: u32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 63) as u16) << (exp_bits + man_bits);
    let abs = bits & !(1u64 << 63);
    let infinity = ((1u64 << exp_bits) - 1) << man_bits;
    // |x| = significand * 2^low_exp, the significand an integer below 2^53 (for an infinity,
    // 2^52 times a power of two past every format's range).
    let biased = (abs >> 52) as i32;
    let fraction = abs & ((1u64 << 52) - 1);
    let (significand, low_exp) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased - 1075)
    };
    // The exponent of |x|'s leading bit (of zero: low_exp, which leads to a zero result).
    let exponent = low_exp + 63 - (significand | 1).leading_zeros() as i32;
    // The target's unit in the last place at |x| is 2^(e - man_bits) for |x| in [2^e, 2^(e+1)),
    // with e no lower than the smallest normal exponent (subnormals share that unit).
    let min_exponent = 2 - (1i32 << (exp_bits - 1));
    let e = exponent.max(min_exponent);
    // At least one bit drops, as the f64 significand is longer than the target's. Past 63
    // bits every bit drops and what is left is less than half a unit, as it is with 63.
    let drop = (e - man_bits as i32 - low_exp).min(63);
    let quotient = significand >> drop;
    let rest = significand & ((1u64 << drop) - 1);
    let half = 1u64 << (drop - 1);
    let round_up = rest > half || (rest == half && quotient & 1 == 1);
    // The quotient counts units. A normal result's holds the implicit bit, which adds one to
    // the exponent field; a carry out of the significand moves to the next binade (or from the
    // largest subnormal to the smallest normal) by the same addition.
    let magnitude = (((e - min_exponent) as u64) << man_bits) + quotient + round_up as u64;
    let magnitude = magnitude.min(infinity);
    let nan =
        infinity | (1u64 << (man_bits - 1)) | ((abs >> (52 - man_bits)) & ((1u64 << man_bits) - 1));
    let magnitude = if abs > 0x7ff0_0000_0000_0000 {
        nan
    } else {
        magnitude
    };
    sign | magnitude as u16
}

/// The IEEE binary16 bits of `x`, rounded once to nearest, ties to even.
pub fn f16_bits_from_f64(x: f64) -> u16 {
    narrow_f64(x, 5, 10)
}

/// The bfloat16 bits of `x`, rounded once to nearest, ties to even.
pub fn bf16_bits_from_f64(x: f64) -> u16 {
    narrow_f64(x, 8, 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_numpy_gives() {
        // numpy gives np.float16(2049.0000001) == 2050: above the tie of 2048 and 2050.
        assert_eq!(f16_bits_from_f64(2049.0000001), 0x6801);
        assert_eq!(f16_bits_from_f64(2049.0), 0x6800);
        assert_eq!(f16_bits_from_f64(2051.0), 0x6802);
        assert_eq!(
            bf16_bits_from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-30)),
            0x3f81
        );
        assert_eq!(bf16_bits_from_f64(1.0 + 2f64.powi(-8)), 0x3f80);
    }

    #[test]
    fn edges_of_the_range() {
        // f16: largest finite 65504; 65520 is the tie with 65536 (inf) and goes up.
        assert_eq!(f16_bits_from_f64(65504.0), 0x7bff);
        assert_eq!(f16_bits_from_f64(65519.999), 0x7bff);
        assert_eq!(f16_bits_from_f64(65520.0), 0x7c00);
        assert_eq!(f16_bits_from_f64(-1e300), 0xfc00);
        // Subnormals: the smallest is 2^-24, half of it ties to 0, a hair more rounds up.
        assert_eq!(f16_bits_from_f64(2f64.powi(-24)), 0x0001);
        assert_eq!(f16_bits_from_f64(2f64.powi(-25)), 0x0000);
        assert_eq!(f16_bits_from_f64(-2f64.powi(-25) * 1.0000001), 0x8001);
        assert_eq!(f16_bits_from_f64(3.0 * 2f64.powi(-25)), 0x0002);
        // The largest subnormal carries into the smallest normal.
        assert_eq!(f16_bits_from_f64(2f64.powi(-14) - 2f64.powi(-26)), 0x0400);
        assert_eq!(f16_bits_from_f64(f64::from_bits(1)), 0x0000);
        assert_eq!(f16_bits_from_f64(-0.0), 0x8000);
        // bf16 keeps f32's exponent range.
        assert_eq!(bf16_bits_from_f64(f32::MAX as f64), 0x7f80);
        assert_eq!(bf16_bits_from_f64(3.3895313892515355e38), 0x7f7f);
        assert_eq!(bf16_bits_from_f64(2f64.powi(-133)), 0x0001);
        assert_eq!(bf16_bits_from_f64(2f64.powi(-134)), 0x0000);
        assert_eq!(bf16_bits_from_f64(f64::NEG_INFINITY), 0xff80);
    }

    #[test]
    fn nans_stay_quiet_nans_of_their_sign() {
        for (x, f16_bits, bf16_bits) in [
            (f64::NAN, 0x7e00, 0x7fc0),
            (-f64::NAN, 0xfe00, 0xffc0),
            (f64::from_bits(0x7ff0_0000_0000_0001), 0x7e00, 0x7fc0),
            (f64::from_bits(0x7ff4_0000_0000_0000), 0x7f00, 0x7fe0),
        ] {
            assert_eq!(f16_bits_from_f64(x), f16_bits, "{:#x}", x.to_bits());
            assert_eq!(bf16_bits_from_f64(x), bf16_bits, "{:#x}", x.to_bits());
        }
    }
}
