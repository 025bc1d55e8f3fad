//! The f64 values where narrowing casts are hardest to get right.

use kfuse_ir::{bf16, f16};

use crate::Rng;

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
