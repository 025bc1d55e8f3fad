//! Measuring the f32 functions against f64 references, in units in the last place (ULP).

/// An f32 function and the f64 reference it approximates.
pub struct Accuracy {
    pub name: &'static str,
    pub f32: fn(f32) -> f32,
    pub reference: fn(f64) -> f64,
    /// The documented bound in ULP, which tests enforce.
    pub bound_ulp: f64,
}

/// Every single-argument f32 function of this crate with its reference and bound.
pub fn functions() -> Vec<Accuracy> {
    use crate::*;
    vec![
        Accuracy {
            name: "exp",
            f32: exp_f32,
            reference: f64::exp,
            bound_ulp: 1.0,
        },
        Accuracy {
            name: "exp2",
            f32: exp2_f32,
            reference: f64::exp2,
            bound_ulp: 1.5,
        },
        Accuracy {
            name: "expm1",
            f32: expm1_f32,
            reference: f64::exp_m1,
            bound_ulp: 2.0,
        },
        Accuracy {
            name: "log",
            f32: log_f32,
            reference: f64::ln,
            bound_ulp: 1.0,
        },
        Accuracy {
            name: "log2",
            f32: log2_f32,
            reference: f64::log2,
            bound_ulp: 2.0,
        },
        Accuracy {
            name: "log1p",
            f32: log1p_f32,
            reference: f64::ln_1p,
            bound_ulp: 2.5,
        },
        Accuracy {
            name: "sin",
            f32: sin_f32,
            reference: f64::sin,
            bound_ulp: 1.0,
        },
        Accuracy {
            name: "cos",
            f32: cos_f32,
            reference: f64::cos,
            bound_ulp: 1.0,
        },
        Accuracy {
            name: "tanh",
            f32: tanh_f32,
            reference: f64::tanh,
            bound_ulp: 2.0,
        },
        Accuracy {
            name: "sigmoid",
            f32: sigmoid_f32,
            reference: sigmoid_f64,
            bound_ulp: 2.5,
        },
        Accuracy {
            name: "softplus",
            f32: softplus_f32,
            reference: softplus_f64,
            bound_ulp: 3.0,
        },
        Accuracy {
            name: "erf",
            f32: erf_f32,
            reference: libm::erf,
            bound_ulp: 1.0,
        },
        Accuracy {
            name: "gelu",
            f32: gelu_f32,
            reference: gelu_f64,
            bound_ulp: 1.5,
        },
        Accuracy {
            name: "gelu_tanh",
            f32: gelu_tanh_f32,
            reference: gelu_tanh_f64,
            bound_ulp: 2.0,
        },
        Accuracy {
            name: "rsqrt",
            f32: rsqrt_f32,
            reference: |x| 1.0 / x.sqrt(),
            bound_ulp: 1.0,
        },
    ]
}

/// The error of `got` against the exact value `want`, in ULP of `want` rounded to f32
/// (subnormal spacing below the normal range). Matching NaNs and infinities count as 0; any
/// other mismatch in class counts as infinity.
pub fn ulp_error(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let rounded = want as f32;
    if rounded.is_infinite() || got.is_infinite() {
        // Beyond f32::MAX the correctly rounded answer is infinity; allow the largest finite
        // value only if the exact value lies within one ULP of it.
        if got as f64 == want || (got.is_infinite() && rounded.is_infinite() && got == rounded) {
            return 0.0;
        }
        let top_ulp = 2f64.powi(104);
        return ((got as f64) - want).abs().min(f64::MAX) / top_ulp;
    }
    let exponent = if rounded == 0.0 || rounded.is_subnormal() {
        -126
    } else {
        ((rounded.abs().to_bits() >> 23) as i32) - 127
    };
    let ulp = 2f64.powi(exponent - 23);
    ((got as f64) - want).abs() / ulp
}

/// The worst error and its argument over every `step`-th f32 bit pattern (offset `offset`),
/// split over the available cores.
pub fn max_ulp_error(function: &Accuracy, step: u64, offset: u64) -> (f64, f32) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let total = 1u64 << 32;
    let chunk = total.div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut worst = (0.0f64, 0.0f32);
                    let first = t * chunk;
                    let last = ((t + 1) * chunk).min(total);
                    let mut bits = first + (offset + step - first % step) % step;
                    while bits < last {
                        let x = f32::from_bits(bits as u32);
                        let err = ulp_error((function.f32)(x), (function.reference)(x as f64));
                        if err > worst.0 || err.is_nan() {
                            worst = (err, x);
                        }
                        bits += step;
                    }
                    worst
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("sweep thread panicked"))
            .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
    })
}
