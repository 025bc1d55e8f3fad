//! Casts from f64 to f16 and bf16 round once, straight from f64 (`docs/numerics.md`, "cast"):
//! values numpy gives, and a sweep around every rounding tie checked against a rounding worked
//! out here from the formats' values alone.

use kfuse_interp::elementwise::cast;
use kfuse_ir::{bf16, f16, Array, DType};
use kfuse_testkit::{narrowing_values, Rng};

/// The bits of one element of `x` cast from f64 to `to`.
fn cast_bits(x: f64, to: DType) -> u64 {
    let a = Array::from_vec(vec![1], vec![x]).unwrap();
    cast(&a, to).get_bits(0)
}

#[test]
fn f64_to_half_precision_gives_numpy_values() {
    // numpy: np.float16(2049.0000001) == 2050.0; through f32 it would tie and go to 2048.
    assert_eq!(cast_bits(2049.0000001, DType::F16), 0x6801);
    assert_eq!(f16::from_bits(0x6801).to_f64(), 2050.0);
    // 1 + 2^-8 is the tie between the bf16 values 1 and 1 + 2^-7; a hair above it rounds up.
    let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
    assert_eq!(cast_bits(x, DType::BF16), 0x3f81);
    assert_eq!(bf16::from_bits(0x3f81).to_f64(), 1.0078125);
}

/// `|x|` rounded to nearest, ties to even, among the positive values `value(0..=last)` (in
/// increasing order; `value(last)` stands for the infinity, one unit past the largest finite
/// value). A binary search for the pattern below `|x|`, then the nearer of it and the next one,
/// decided against their midpoint (exact in f64, which has more than twice their bits).
fn round_by_search(x: f64, last: u16, value: impl Fn(u16) -> f64) -> u16 {
    let ax = x.abs();
    let (mut lo, mut hi) = (0u16, last);
    if ax >= value(last) {
        return last;
    }
    // value(lo) <= ax < value(hi).
    while hi - lo > 1 {
        let m = lo + (hi - lo) / 2;
        if value(m) <= ax {
            lo = m;
        } else {
            hi = m;
        }
    }
    let mid = (value(lo) + value(hi)) / 2.0;
    if ax < mid || (ax == mid && lo % 2 == 0) {
        lo
    } else {
        hi
    }
}

#[test]
fn f64_to_half_precision_rounds_once_around_every_tie() {
    let f16_value = |p: u16| {
        if p == 0x7c00 {
            65536.0
        } else {
            f16::from_bits(p).to_f64()
        }
    };
    let bf16_value = |p: u16| {
        if p == 0x7f80 {
            2f64.powi(128)
        } else {
            bf16::from_bits(p).to_f64()
        }
    };
    let mut rng = Rng::new(2049);
    let values = narrowing_values(&mut rng, 200_000);
    let input = Array::from_vec(vec![values.len()], values.clone()).unwrap();
    let (halves, brains) = (cast(&input, DType::F16), cast(&input, DType::BF16));
    let mut through_f32_wrong = 0;
    for (i, &x) in values.iter().enumerate() {
        let (h, b) = (halves.get_bits(i) as u16, brains.get_bits(i) as u16);
        if x.is_nan() {
            assert!(
                f16::from_bits(h).is_nan() && bf16::from_bits(b).is_nan(),
                "{x}"
            );
            continue;
        }
        let sign = |bit: u16| if x.is_sign_negative() { bit } else { 0 };
        let want_h = sign(0x8000) | round_by_search(x, 0x7c00, f16_value);
        let want_b = sign(0x8000) | round_by_search(x, 0x7f80, bf16_value);
        assert_eq!(h, want_h, "f16 of {x:e} ({:#x})", x.to_bits());
        assert_eq!(b, want_b, "bf16 of {x:e} ({:#x})", x.to_bits());
        through_f32_wrong += (f16::from_f32(x as f32).to_bits() != want_h) as usize;
    }
    // The sweep holds values where rounding twice goes wrong, so it can tell.
    assert!(through_f32_wrong > 1000, "{through_f32_wrong}");
}
