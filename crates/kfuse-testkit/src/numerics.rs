//! What "bit-identical" means in strict numerics, as one comparison every test uses, and the
//! values where narrowing casts are hardest to get right.

use kfuse_ir::{bf16, f16, Array};

use crate::Rng;

/// Where two arrays differ under strict numerics' bit-identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Difference {
    /// The dtypes or shapes differ.
    Type,
    /// The first element that differs.
    Element(usize),
}

/// Compares `got` with `want` as strict numerics promise (`docs/numerics.md`, "What
/// bit-identical excludes"): every element bit for bit, the sign of a zero included, except that
/// two NaNs are the same whatever their signs and payloads. A NaN against a number differs.
pub fn strict_difference(got: &Array, want: &Array) -> Option<Difference> {
    if got.ty() != want.ty() {
        return Some(Difference::Type);
    }
    (0..got.n_elems())
        .find(|&i| {
            let both_nan = got.get_f64(i).is_nan() && want.get_f64(i).is_nan();
            !both_nan && got.get_bits(i) != want.get_bits(i)
        })
        .map(Difference::Element)
}

/// `n` f64 values at and around the rounding ties of f16 and bf16 (the midpoints between
/// neighbouring values, where rounding twice goes wrong), in every binade of both formats, the
/// subnormals and the overflow threshold included; with either sign, and some zeros,
/// infinities and NaNs.
pub fn narrowing_values(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            if rng.chance(0.02) {
                return rng.pick(&[0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN]);
            }
            // A finite positive pattern and the value above it (past the largest finite value,
            // the infinity's pattern decodes as the next power of two would).
            let (lo, hi) = if rng.chance(0.5) {
                let p = finite_pattern(rng, 0x7c00, 0x0400);
                let hi = if p == 0x7bff {
                    65536.0
                } else {
                    f16::from_bits(p + 1).to_f64()
                };
                (f16::from_bits(p).to_f64(), hi)
            } else {
                let p = finite_pattern(rng, 0x7f80, 0x0080);
                let hi = if p == 0x7f7f {
                    2f64.powi(128)
                } else {
                    bf16::from_bits(p + 1).to_f64()
                };
                (bf16::from_bits(p).to_f64(), hi)
            };
            let mid = (lo + hi) / 2.0;
            let v = match rng.below(6) {
                0 => mid,
                1 => f64::from_bits(mid.to_bits() + 1),
                2 => f64::from_bits(mid.to_bits() - 1),
                // A relative nudge too small for f32 to keep: f32 rounds it back onto the tie.
                3 => mid * (1.0 + 2f64.powi(-(26 + rng.below(27) as i32))),
                4 => mid * (1.0 - 2f64.powi(-(26 + rng.below(27) as i32))),
                _ => lo + (hi - lo) * rng.below(1 << 20) as f64 / (1u64 << 20) as f64,
            };
            if rng.chance(0.5) {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// A positive finite bit pattern below `infinity`: the largest one and the subnormals (below
/// `normal`) a tenth of the time each, which a uniform draw would rarely reach.
fn finite_pattern(rng: &mut Rng, infinity: u16, normal: u16) -> u16 {
    match rng.below(10) {
        0 => infinity - 1,
        1 => rng.below(normal as usize) as u16,
        _ => rng.below(infinity as usize) as u16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_array(values: &[f32]) -> Array {
        Array::from_vec(vec![values.len()], values.to_vec()).unwrap()
    }

    #[test]
    fn nans_match_whatever_their_sign_and_payload() {
        let quiet = f32::from_bits(0x7fc0_0000);
        let negative = f32::from_bits(0xffc0_0000);
        let payload = f32::from_bits(0x7f80_0001);
        let a = f32_array(&[quiet, negative, payload, 1.0]);
        let b = f32_array(&[negative, payload, quiet, 1.0]);
        assert_eq!(strict_difference(&a, &b), None);
        let halves = |bits: &[u16]| {
            let v: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
            Array::from_vec(vec![v.len()], v).unwrap()
        };
        assert_eq!(
            strict_difference(&halves(&[0x7e00, 0x7c01]), &halves(&[0xfe00, 0xfd00])),
            None
        );
    }

    #[test]
    fn everything_else_must_match_bit_for_bit() {
        let a = f32_array(&[1.0, 0.0, f32::NAN]);
        // The sign of zero counts.
        let b = f32_array(&[1.0, -0.0, f32::NAN]);
        assert_eq!(strict_difference(&a, &b), Some(Difference::Element(1)));
        // A NaN against a number or an infinity differs.
        let c = f32_array(&[1.0, 0.0, f32::INFINITY]);
        assert_eq!(strict_difference(&a, &c), Some(Difference::Element(2)));
        assert_eq!(strict_difference(&c, &a), Some(Difference::Element(2)));
        // One unit in the last place differs.
        let d = f32_array(&[f32::from_bits(0x3f80_0001), 0.0, f32::NAN]);
        assert_eq!(strict_difference(&d, &a), Some(Difference::Element(0)));
        // Another dtype differs, even with equal values.
        let e = Array::from_vec(vec![3], vec![1.0f64, 0.0, f64::NAN]).unwrap();
        assert_eq!(strict_difference(&e, &a), Some(Difference::Type));
        let ints = |v: Vec<i32>| Array::from_vec(vec![v.len()], v).unwrap();
        assert_eq!(
            strict_difference(&ints(vec![0, -1]), &ints(vec![0, 1])),
            Some(Difference::Element(1))
        );
    }

    #[test]
    fn narrowing_values_sit_on_and_beside_the_ties() {
        let mut rng = Rng::new(1);
        let values = narrowing_values(&mut rng, 4000);
        // Every kind shows up: exact ties, and values f32 cannot tell from a tie.
        let on_tie = values
            .iter()
            .filter(|v| v.is_finite() && (**v as f32) as f64 == **v)
            .count();
        let off_tie = values
            .iter()
            .filter(|v| v.is_finite() && (**v as f32) as f64 != **v)
            .count();
        assert!(on_tie > 500 && off_tie > 500, "{on_tie} {off_tie}");
        assert!(values.iter().any(|v| v.is_nan()));
        assert!(values
            .iter()
            .any(|v| v.abs() > 65504.0 && v.abs() < 65536.0));
        assert!(values.iter().any(|v| *v != 0.0 && v.abs() < 2f64.powi(-14)));
    }
}
