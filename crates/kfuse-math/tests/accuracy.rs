//! The f32 vector-math functions stay within their documented ULP bounds over the whole float
//! range (a strided sweep of bit patterns here; `examples/ulp_sweep.rs` checks all of them).

use kfuse_math::accuracy::{functions, max_ulp_error, ulp_error};
use kfuse_math::*;

#[test]
fn every_function_is_within_its_bound_over_the_float_range() {
    let mut failures = Vec::new();
    for f in functions() {
        // A prime stride visits ~2.1 million patterns spread over every exponent.
        let (err, x) = max_ulp_error(&f, 2053, 7);
        println!(
            "{:10} max {err:.3} ULP at {x:e} (bound {})",
            f.name, f.bound_ulp
        );
        // Written so that a NaN error fails too.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let over = !(err <= f.bound_ulp);
        if over {
            failures.push(format!(
                "{}: {err} ULP at {x:e} (bits {:#010x})",
                f.name,
                x.to_bits()
            ));
        }
    }
    assert!(failures.is_empty(), "over the bound: {failures:#?}");
}

#[test]
fn dense_sweep_near_zero_and_one() {
    // The regions where cancellation bites: every pattern of [-4, 4] at a finer stride.
    for f in functions() {
        let mut worst = 0.0f64;
        let mut x = -4.0f32;
        while x <= 4.0 {
            worst = worst.max(ulp_error((f.f32)(x), (f.reference)(x as f64)));
            x = if x == 0.0 {
                f32::from_bits(1)
            } else {
                f32::from_bits(x.to_bits().wrapping_add(if x > 0.0 {
                    4099
                } else {
                    u32::MAX - 4098
                }))
            };
            if x < 0.0 && x > -1e-30 {
                x = 0.0;
            }
        }
        assert!(worst <= f.bound_ulp, "{}: {worst} ULP", f.name);
    }
}

#[test]
fn special_values() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    for f in functions() {
        assert!((f.f32)(nan).is_nan(), "{}(nan)", f.name);
    }
    assert_eq!(exp_f32(inf), inf);
    assert_eq!(exp_f32(-inf), 0.0);
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp2_f32(-inf), 0.0);
    assert_eq!(exp2_f32(10.0), 1024.0);
    assert_eq!(expm1_f32(-inf), -1.0);
    assert_eq!(log_f32(0.0), -inf);
    assert_eq!(log_f32(-0.0), -inf);
    assert!(log_f32(-1.0).is_nan());
    assert_eq!(log_f32(inf), inf);
    assert_eq!(log_f32(1.0), 0.0);
    assert_eq!(log2_f32(8.0), 3.0);
    assert_eq!(log1p_f32(-1.0), -inf);
    assert!(log1p_f32(-2.0).is_nan());
    assert!(sin_f32(inf).is_nan() && cos_f32(-inf).is_nan());
    assert_eq!(tanh_f32(inf), 1.0);
    assert_eq!(tanh_f32(-inf), -1.0);
    assert_eq!(sigmoid_f32(-inf), 0.0);
    assert_eq!(sigmoid_f32(inf), 1.0);
    assert_eq!(erf_f32(inf), 1.0);
    assert_eq!(erf_f32(-inf), -1.0);
    assert_eq!(gelu_f32(inf), inf);
    assert_eq!(gelu_f32(-inf), 0.0);
    assert_eq!(gelu_tanh_f32(inf), inf);
    assert_eq!(softplus_f32(inf), inf);
    assert_eq!(softplus_f32(-inf), 0.0);
    // Odd functions keep the sign of zero.
    for f in [expm1_f32, log1p_f32, sin_f32, tanh_f32, erf_f32] {
        assert_eq!(f(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f(0.0).to_bits(), 0.0f32.to_bits());
    }
    // Subnormal inputs and outputs.
    let tiny = f32::from_bits(1);
    assert_eq!(log_f32(tiny), -103.278_93);
    assert!(exp_f32(-100.0).is_subnormal());
    assert_eq!(sin_f32(tiny), tiny);
}

#[test]
fn ieee_min_max_and_numpy_remainder() {
    assert!(maximum_f32(f32::NAN, 1.0).is_nan());
    assert!(minimum_f64(1.0, f64::NAN).is_nan());
    assert_eq!(maximum_f32(-0.0, 0.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(maximum_f32(0.0, -0.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(minimum_f32(0.0, -0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(rem_f32(5.0, -3.0), -1.0);
    assert_eq!(rem_f32(-5.0, 3.0), 1.0);
    assert_eq!(rem_f64(-6.0, 3.0).to_bits(), 0.0f64.to_bits());
    assert_eq!(rem_f64(6.0, -3.0).to_bits(), (-0.0f64).to_bits());
    assert!(rem_f32(1.0, 0.0).is_nan());
    assert_eq!(rem_i64(-7, 3), 2);
    assert_eq!(rem_i64(7, -3), -2);
    assert_eq!(rem_i64(7, 0), 0);
    assert_eq!(floor_div_i64(-7, 2), -4);
    assert_eq!(floor_div_i64(7, -2), -4);
    assert_eq!(floor_div_i64(7, 0), 0);
    assert_eq!(floor_div_i64(i64::MIN, -1), i64::MIN);
    assert_eq!(pow_f32(2.0, 10.0), 1024.0);
    assert_eq!(pow_f32(f32::NAN, 0.0), 1.0);
    assert!(pow_f32(-2.0, 0.5).is_nan());
}

#[test]
fn philox_matches_the_published_known_answers() {
    // Random123 known-answer tests for philox4x32-10.
    assert_eq!(
        philox4x32([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        philox4x32([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
    );
}

#[test]
fn rng_values_are_in_range_and_well_distributed() {
    let n = 200_000u64;
    let (mut sum, mut sum_sq) = (0.0f64, 0.0f64);
    for i in 0..n {
        let u = uniform_f32(42, i);
        assert!((0.0..1.0).contains(&u));
        let v = uniform_f64(42, i);
        assert!((0.0..1.0).contains(&v));
        let z = normal_f32(7, i) as f64;
        assert!(z.is_finite());
        sum += z;
        sum_sq += z * z;
    }
    let mean = sum / n as f64;
    let var = sum_sq / n as f64 - mean * mean;
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!((var - 1.0).abs() < 0.02, "variance {var}");
    assert_ne!(uniform_f32(1, 0), uniform_f32(2, 0));
    assert!(normal_f64(3, 5).is_finite());
}
