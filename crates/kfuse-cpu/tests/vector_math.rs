//! The 16-lane functions of `kfuse_math.h` against their scalar twins, bit for bit, in strict
//! mode: a sweep of f32 bit patterns (every 509th, so every exponent and many mantissas), every
//! pattern near the thresholds where the functions change form, and all pairs of special values
//! for max and min. The scalar forms are checked against the reference interpreter elsewhere
//! (`kfuse-runtime/tests/compiled.rs`), so vector kernels are bit-exact wherever both agree.
//! NaN results agree when both are NaN: kfuse does not promise NaN payloads.

use kfuse_cpu::{c::MATH_HEADER, Compiler, Numerics};

/// Vector function, scalar expression of `x`.
const UNARY: &[(&str, &str, &str)] = &[
    ("exp", "kf_vexp(x)", "kf_exp(x)"),
    ("exp2", "kf_vexp2(x)", "kf_exp2(x)"),
    ("log", "kf_vlog(x)", "kf_log(x)"),
    ("log2", "kf_vlog2(x)", "kf_log2(x)"),
    ("log1p", "kf_vlog1p(x)", "kf_log1p(x)"),
    ("tanh", "kf_vtanh(x)", "kf_tanh(x)"),
    ("sigmoid", "kf_vsigmoid(x)", "kf_sigmoid(x)"),
    ("softplus", "kf_vsoftplus(x)", "kf_softplus(x)"),
    ("sin", "kf_vsin(x)", "kf_sin(x)"),
    ("cos", "kf_vcos(x)", "kf_cos(x)"),
    ("relu", "kf_vrelu(x)", "kf_maximum(x, 0.0f)"),
    (
        "maximum with 0",
        "kf_vmaximum(x, kf_vsplat(0.0f))",
        "kf_maximum(x, 0.0f)",
    ),
    ("abs", "kf_vabs(x)", "fabsf(x)"),
    ("sqrt", "kf_vsqrt(x)", "sqrtf(x)"),
    ("floor", "kf_vfloor(x)", "floorf(x)"),
    ("ceil", "kf_vceil(x)", "ceilf(x)"),
    ("round", "kf_vrint(x)", "rintf(x)"),
];

/// A kernel-shaped function: `args[0]` holds `j_hi` inputs, `args[1]` one mismatch count per
/// function, `args[2]` one offending input per function.
fn source() -> String {
    let mut s = String::from(MATH_HEADER);
    s.push_str(
        "\nstatic int kf_differ(float a, float b) { return !(kf_f32_bits(a) == kf_f32_bits(b) || (a != a && b != b)); }\n\
         void kfuse_kernel(void **args, int64_t o_lo, int64_t o_hi, int64_t j_lo, int64_t j_hi) {\n\
         const float *in = (const float *)args[0];\n\
         int64_t *bad = (int64_t *)args[1];\n\
         float *example = (float *)args[2];\n\
         (void)o_lo; (void)o_hi;\n\
         for (int64_t j = j_lo; j + 16 <= j_hi; j += 16) {\n\
         kf_f32x16 xv, yv;\n\
         memcpy(&xv, in + j, 64);\n",
    );
    for (i, (_, vector, scalar)) in UNARY.iter().enumerate() {
        s.push_str(&format!(
            "{{ kf_f32x16 x = xv; yv = {vector};\n\
             for (int l = 0; l < 16; l++) {{ float x = xv[l]; if (kf_differ(yv[l], {scalar})) {{ bad[{i}]++; example[{i}] = x; }} }} }}\n"
        ));
    }
    // max and min of each input against the next block's lanes (pairs of all kinds of values).
    let n = UNARY.len();
    s.push_str(&format!(
        "if (j + 32 <= j_hi) {{\n\
         kf_f32x16 bv; memcpy(&bv, in + j + 16, 64);\n\
         kf_f32x16 mx = kf_vmaximum(xv, bv), mn = kf_vminimum(xv, bv);\n\
         for (int l = 0; l < 16; l++) {{\n\
         if (kf_differ(mx[l], kf_maximum(xv[l], bv[l]))) {{ bad[{n}]++; example[{n}] = xv[l]; }}\n\
         if (kf_differ(mn[l], kf_minimum(xv[l], bv[l]))) {{ bad[{}]++; example[{}] = xv[l]; }}\n\
         }} }}\n}}\n}}\n",
        n + 1,
        n + 1
    ));
    s
}

fn inputs() -> Vec<f32> {
    let mut v: Vec<f32> = (0..u32::MAX).step_by(509).map(f32::from_bits).collect();
    // Every pattern near the thresholds of exp, exp2, tanh, log's splits and sin's and cos's
    // reductions, both signs.
    for center in [
        2.0e8f32,
        88.72,
        89.0,
        103.97,
        110.0,
        128.0,
        129.0,
        151.0,
        160.0,
        9.0,
        0.625,
        2.44e-4,
        17.5,
        0.346_573_6,
        1.0,
        std::f32::consts::SQRT_2,
        0.5,
        2.98e-8,
    ] {
        for sign in [1.0f32, -1.0] {
            let b = (center * sign).to_bits();
            v.extend((b - 4096..b + 4096).map(f32::from_bits));
        }
    }
    // Special values, and each of them against every other one (for max and min).
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        2.5,
        -2.5,
        1e-40,
    ];
    for &a in &specials {
        v.extend(std::iter::repeat_n(a, 16));
        v.extend(specials);
    }
    v.resize(v.len().div_ceil(32) * 32, 0.0);
    v
}

#[test]
fn vector_math_matches_the_scalar_forms_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("kfuse-vector-math-{}", std::process::id()));
    let compiler = Compiler::detect(dir.clone()).expect("a C compiler");
    let (kernel, _) = compiler
        .compile(&source(), Numerics::Strict)
        .expect("the check compiles");
    let x = inputs();
    let names: Vec<&str> = UNARY
        .iter()
        .map(|u| u.0)
        .chain(["maximum", "minimum"])
        .collect();
    let mut bad = vec![0i64; names.len()];
    let mut example = vec![0f32; names.len()];
    let args = [
        x.as_ptr() as *mut std::ffi::c_void,
        bad.as_mut_ptr().cast(),
        example.as_mut_ptr().cast(),
    ];
    // SAFETY: the function reads `x.len()` floats from args[0] and writes one slot per
    // function of args[1] and args[2], which hold that many.
    unsafe { (kernel.function())(args.as_ptr(), 0, 1, 0, x.len() as i64) };
    let _ = std::fs::remove_dir_all(&dir);
    let failures: Vec<String> = names
        .iter()
        .zip(bad.iter().zip(&example))
        .filter(|(_, (&b, _))| b > 0)
        .map(|(name, (b, e))| format!("{name}: {b} mismatches, e.g. at {e:e}"))
        .collect();
    assert!(
        failures.is_empty(),
        "over {} inputs:\n{}",
        x.len(),
        failures.join("\n")
    );
}
