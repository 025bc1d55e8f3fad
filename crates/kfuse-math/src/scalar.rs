//! Scalar semantics that every dtype and backend shares.

macro_rules! ieee_min_max {
    ($t:ty, $max:ident, $min:ident) => {
        /// IEEE 754-2019 `maximum`: NaN if either is NaN, and `+0` above `-0`.
        pub fn $max(a: $t, b: $t) -> $t {
            if a.is_nan() || b.is_nan() {
                <$t>::NAN
            } else if a > b || (a == b && b.is_sign_negative()) {
                a
            } else {
                b
            }
        }
        /// IEEE 754-2019 `minimum`: NaN if either is NaN, and `-0` below `+0`.
        pub fn $min(a: $t, b: $t) -> $t {
            if a.is_nan() || b.is_nan() {
                <$t>::NAN
            } else if a < b || (a == b && a.is_sign_negative()) {
                a
            } else {
                b
            }
        }
    };
}
ieee_min_max!(f32, maximum_f32, minimum_f32);
ieee_min_max!(f64, maximum_f64, minimum_f64);

macro_rules! float_rem {
    ($t:ty, $name:ident) => {
        /// numpy `remainder`: `x - floor(x / y) y`, with the sign of `y` (and `+-0` following `y`).
        pub fn $name(x: $t, y: $t) -> $t {
            let m = x % y;
            if m != 0.0 && ((y < 0.0) != (m < 0.0)) {
                m + y
            } else if m == 0.0 {
                (0.0 as $t).copysign(y)
            } else {
                m
            }
        }
    };
}
float_rem!(f32, rem_f32);
float_rem!(f64, rem_f64);

/// numpy floor division for integers: rounds toward negative infinity; `x // 0 = 0`; the one
/// overflowing case (`MIN // -1`) wraps.
pub fn floor_div_i64(x: i64, y: i64) -> i64 {
    if y == 0 {
        return 0;
    }
    let q = x.wrapping_div(y);
    if (x.wrapping_rem(y) != 0) && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    }
}

/// numpy remainder for integers: the sign of the divisor; `x % 0 = 0`.
pub fn rem_i64(x: i64, y: i64) -> i64 {
    if y == 0 {
        return 0;
    }
    let m = x.wrapping_rem(y);
    if m != 0 && ((m < 0) != (y < 0)) {
        m + y
    } else {
        m
    }
}

/// `x^y` for f32: the platform's `f64` `pow` (all IEEE special cases), rounded once to f32.
pub fn pow_f32(x: f32, y: f32) -> f32 {
    (x as f64).powf(y as f64) as f32
}
