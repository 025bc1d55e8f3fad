/* kfuse vector math for generated kernels.
 *
 * Every function computes exactly the operation sequence of its twin in crates/kfuse-math, so a
 * kernel compiled in strict mode (-ffp-contract=off, no fast-math) matches the reference
 * interpreter bit for bit; crates/kfuse-runtime/tests/compiled.rs checks that on sweeps of the
 * float range (every_unary_op_is_bit_exact_in_strict_mode and its neighbours).
 * Special cases are selects on the result rather than early returns, so loops vectorize. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#define KF_INLINE static inline __attribute__((always_inline))

/* A prefetch of element i of base, which may lie past the array (the next row, tile or block of
 * the last one): the address is formed as an integer, so C sees no out-of-bounds pointer. rw: 0
 * to read, 1 to write; loc: locality, 0 to 3. */
#define KF_PREFETCH(base, i, rw, loc)                                                          \
    __builtin_prefetch((const void *)((uintptr_t)(base) + (uintptr_t)(int64_t)(i) * sizeof(*(base))), \
                       rw, loc)

KF_INLINE float kf_f32_from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
KF_INLINE uint32_t kf_f32_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
KF_INLINE double kf_f64_from_bits(uint64_t b) { double f; memcpy(&f, &b, 8); return f; }

/* ---- exp / log (exp_log.rs) ---- */
#define KF_LOG2_E 1.44269504088896340736f
#define KF_LN2_HI 0.6933594f
#define KF_LN2_LO (-2.1219444e-4f)
#define KF_EXP_MAX 88.72284f
#define KF_EXP_MIN (-103.97208f)

/* x - k ln2_hi, the first step of Cody-Waite's reduction, as one fused multiply-add. The step
 * is exact (k ln2_hi has at most 17 significant bits, and the difference is a multiple of x's
 * unit smaller than 0.5), so the fused form gives the bits of exp_log.rs's separate product and
 * difference. Unlike them, it cannot be reordered after the inexact second step, which fast
 * numerics did: (x - k ln2_lo) - k ln2_hi rounds x first, and exp(-87.5) came out 22 units off. */
KF_INLINE float kf_reduce_hi(float x, float k) { return __builtin_fmaf(-k, KF_LN2_HI, x); }

KF_INLINE float kf_pow2i(int32_t n) { return kf_f32_from_bits(((uint32_t)(n + 127)) << 23); }

/* y 2^k for the reduced exponential y (in [0.7, 1.42]) and k in [-160, 129], as scale() in
 * exp_log.rs computes y * 2^k1 * 2^(k - k1), k1 = k >> 1. Its first product is exact, as y 2^k1
 * stays normal, so here it is an integer addition to y's exponent field, which gives the same
 * bits; the second multiplication rounds once in both. Not two float multiplications: fast
 * numerics reassociate them into y * 2^k, and 2^128 overflows where exp(88.5) does not. */
KF_INLINE float kf_scale(float y, int32_t k) {
    int32_t k1 = k >> 1;
    float t = kf_f32_from_bits(kf_f32_bits(y) + ((uint32_t)k1 << 23));
    return t * kf_pow2i(k - k1);
}

/* Polynomials shared by the scalar and 16-lane forms (the same expression on float and on
 * kf_f32x16, so the two cannot drift apart). */
#define KF_EXP_POLY(r) \
    (((((1.9875691e-4f * (r) + 1.3981999e-3f) * (r) + 8.333452e-3f) * (r) + 4.1665796e-2f) * (r) \
      + 1.6666665e-1f) * (r) + 5.0000001e-1f)
/* Horner from the highest-order coefficient down. */
#define KF_LOG_POLY(f)                                                                        \
    ((((((((7.0376836e-2f * (f) + -1.151461e-1f) * (f) + 1.1676999e-1f) * (f) + -1.2420141e-1f) \
          * (f) + 1.4249323e-1f) * (f) + -1.6668058e-1f) * (f) + 2.0000714e-1f) * (f)          \
       + -2.4999994e-1f) * (f) + 3.3333331e-1f)
#define KF_TANH_POLY(z) \
    ((((-5.7049887e-3f * (z) + 2.0639089e-2f) * (z) - 5.3739716e-2f) * (z) + 1.3331442e-1f) * (z) - 3.3333282e-1f)

KF_INLINE float kf_exp_poly(float r) { return KF_EXP_POLY(r); }

KF_INLINE float kf_exp_reduced(float r) { return r * r * kf_exp_poly(r) + r + 1.0f; }

/* k as an integer for finite, in-range x; clamped so that other inputs never convert out of range
 * (their results are replaced by the special-case selects). */
KF_INLINE int32_t kf_round_i32(float k, float lo, float hi) {
    float c = k > hi ? hi : (k < lo ? lo : k);
    return (int32_t)(c == c ? c : 0.0f);
}

/* exp and exp2 clamp the argument instead of selecting the special results: beyond the clamps
 * the scaled result already rounds to 0 or overflows to inf, and a NaN argument becomes a finite
 * one, so the integer conversion is in range. Three selects fewer than the direct form of
 * exp_log.rs, and bit-identical to it on all 2^32 inputs (checked exhaustively by
 * tools/exhaustive_exp.c; the strict tests of compiled.rs keep checking sweeps). */
KF_INLINE float kf_exp(float x) {
    float xc = x > -110.0f ? x : -110.0f;
    xc = xc < 89.0f ? xc : 89.0f;
    float k = rintf(xc * KF_LOG2_E);
    float r = kf_reduce_hi(xc, k) - k * KF_LN2_LO;
    float v = kf_scale(kf_exp_reduced(r), (int32_t)k);
    return x != x ? x : v;
}

KF_INLINE float kf_exp2(float x) {
    float xc = x > -160.0f ? x : -160.0f;
    xc = xc < 129.0f ? xc : 129.0f;
    float k = rintf(xc);
    float f = xc - k;
    float r = f * KF_LN2_HI + f * KF_LN2_LO;
    float v = kf_scale(kf_exp_reduced(r), (int32_t)k);
    return x != x ? x : v;
}

KF_INLINE float kf_expm1(float x) {
    float ax = fabsf(x);
    float p = ((((((1.0f / 40320.0f * x + 1.0f / 5040.0f) * x + 1.0f / 720.0f) * x + 1.0f / 120.0f) * x
                 + 1.0f / 24.0f) * x + 1.0f / 6.0f) * x + 0.5f) * (x * x);
    float small = x + p;
    float k = rintf(x * KF_LOG2_E);
    float r = kf_reduce_hi(x, k) - k * KF_LN2_LO;
    float t = kf_pow2i(kf_round_i32(k, -126.0f, 127.0f));
    float em1 = r + r * r * kf_exp_poly(r);
    float v = (t - 1.0f) + t * em1;
    v = x < -17.5f ? -1.0f : v;
    v = x > 87.0f ? kf_exp(x) : v;
    v = ax < 0.3465736f ? small : v;
    v = ax < 2.98e-8f ? x : v;
    return x != x ? x : v;
}

#define KF_SQRT_HALF 0.707106781186547524400844362104849039f

KF_INLINE float kf_log_tail(float f) { return f * (f * f) * KF_LOG_POLY(f); }

/* x = (1 + f) 2^e with sqrt(1/2) <= 1 + f < sqrt(2), for positive finite x. */
KF_INLINE void kf_split_log(float x, float *e_out, float *f_out) {
    uint32_t bits = kf_f32_bits(x);
    int32_t e = -127;
    uint32_t scaled = kf_f32_bits(x * 8388608.0f);
    int sub = bits < 0x00800000u;
    bits = sub ? scaled : bits;
    e = sub ? e - 23 : e;
    e += (int32_t)(bits >> 23);
    float m = kf_f32_from_bits((bits & 0x007fffffu) | 0x3f800000u);
    int big = m > 2.0f * KF_SQRT_HALF;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    *e_out = (float)e;
    *f_out = m - 1.0f;
}

KF_INLINE float kf_log_special(float x, float v) {
    v = x == INFINITY ? x : v;
    v = x == 0.0f ? -INFINITY : v;
    return (x != x || x < 0.0f) ? NAN : v;
}

KF_INLINE float kf_log(float x) {
    float e, f;
    kf_split_log(x, &e, &f);
    float z = f * f;
    float y = kf_log_tail(f) + e * KF_LN2_LO - 0.5f * z;
    return kf_log_special(x, f + y + e * KF_LN2_HI);
}

KF_INLINE float kf_log2(float x) {
    float e, f;
    kf_split_log(x, &e, &f);
    float ln_m = f + (kf_log_tail(f) - 0.5f * f * f);
    return kf_log_special(x, e + ln_m * KF_LOG2_E);
}

/* u - 1 for u = 1 + x: where log's split of u has exponent 0 (u in [sqrt(1/2), sqrt(2))), its
 * f is u - 1, the same subtraction of the same bits; elsewhere u - 1 itself. The split hides
 * from the compiler that f came from 1 + x, so fast numerics cannot cancel (1 + x) - 1 into x,
 * which drops the correction for the rounding of 1 + x (log1p(1e-7) came out 1.19e-7). Where
 * the split's exponent is not 0, |x| > 0.29, and dropping the correction there moves the result
 * by at most about two units in its last place, within fast numerics' bound. */
KF_INLINE float kf_log1p_u_minus_1(float u, float e, float f) { return e == 0.0f ? f : u - 1.0f; }

KF_INLINE float kf_log1p(float x) {
    float u = 1.0f + x;
    float e, f;
    kf_split_log(u, &e, &f);
    float v = kf_log(u) * (x / kf_log1p_u_minus_1(u, e, f));
    v = u <= 0.0f ? (u == 0.0f ? -INFINITY : NAN) : v;
    v = u == 1.0f ? x : v;
    v = x == INFINITY ? x : v;
    return x != x ? x : v;
}

/* ---- sin / cos (trig.rs) ---- */
static const uint64_t KF_TWO_OVER_PI[5] = {
    0xA2F9836E4E441529ull, 0xFC2757D1F534DDC0ull, 0xDB6295993C439041ull,
    0xFE5163ABDEBBC561ull, 0xB7246E3A424DD2E0ull,
};
#define KF_INV_PIO2 0x1.45f306dc9c883p-1
#define KF_PIO2_1 1.57079631090164184570e+00
#define KF_PIO2_1T 1.58932547735281966916e-08
#define KF_PI_2 0x1.921fb54442d18p+0

KF_INLINE double kf_sin_kernel(double x) {
    const double S1 = -0.166666666416265235595, S2 = 0.0083333293858894631756,
                 S3 = -0.000198393348360966317347, S4 = 0.0000027183114939898219064;
    double z = x * x, w = z * z, r = S3 + z * S4, s = z * x;
    return (x + s * (S1 + z * S2)) + s * w * r;
}

KF_INLINE double kf_cos_kernel(double x) {
    const double C0 = -0.499999997251031003120, C1 = 0.0416666233237390631894,
                 C2 = -0.00138867637746099294692, C3 = 0.0000243904487962774090654;
    double z = x * x, w = z * z, r = C2 + z * C3;
    return ((1.0 + z * C0) + w * C1) + (w * z) * r;
}

/* Payne-Hanek for |x| >= 2e8 (rare; kept out of line). */
static __attribute__((noinline)) double kf_reduce_large(float x, uint32_t *n_out) {
    uint32_t bits = kf_f32_bits(x);
    unsigned __int128 m = (bits & 0x007fffffu) | 0x00800000u;
    unsigned e = (bits >> 23) - 150;
    unsigned start = e - 2;
    unsigned __int128 window = 0;
    for (unsigned i = start; i < start + 96; i++)
        window = (window << 1) | ((KF_TWO_OVER_PI[i / 64] >> (63 - i % 64)) & 1);
    unsigned __int128 product = m * window;
    uint32_t n = (uint32_t)((product >> 94) & 3);
    unsigned __int128 mask = ((unsigned __int128)1 << 94) - 1;
    double frac = (double)(product & mask) / (double)((unsigned __int128)1 << 94);
    if (frac >= 0.5) {
        frac -= 1.0;
        n = (n + 1) & 3;
    }
    *n_out = n;
    return frac * KF_PI_2;
}

/* Cody-Waite reduction of 0 <= ax < 2e8. Its first step is exact (n < 2^27 and KF_PIO2_1 has
 * 25 significant bits), so, as in kf_reduce_hi, one fused multiply-add gives trig.rs's bits and
 * keeps fast numerics from rounding xd - n pio2_1t first (sin(3.585e7) came out 40 units off). */
KF_INLINE double kf_reduce_small(float ax, uint32_t *n_out) {
    double xd = (double)ax;
    double n = rint(xd * KF_INV_PIO2);
    *n_out = (uint32_t)((int64_t)n & 3);
    return __builtin_fma(-n, KF_PIO2_1, xd) - n * KF_PIO2_1T;
}

KF_INLINE double kf_reduce(float ax, uint32_t *n_out) {
    if (ax >= 2.0e8f) return kf_reduce_large(ax, n_out);
    return kf_reduce_small(ax, n_out);
}

/* sin and cos from a reduced argument: r = |x| - n pi/2 (n mod 4), |x| = ax. */
KF_INLINE float kf_sin_reduced(float x, float ax, double r, uint32_t n) {
    double sk = kf_sin_kernel(r), ck = kf_cos_kernel(r);
    double s = n == 0 ? sk : (n == 1 ? ck : (n == 2 ? -sk : -ck));
    float v = (float)s;
    v = x < 0.0f ? -v : v;
    v = ax < 2.44e-4f ? x : v;
    return (x != x || ax == INFINITY) ? NAN : v;
}
KF_INLINE float kf_cos_reduced(float x, float ax, double r, uint32_t n) {
    double sk = kf_sin_kernel(r), ck = kf_cos_kernel(r);
    double c = n == 0 ? ck : (n == 1 ? -sk : (n == 2 ? -ck : sk));
    return (x != x || ax == INFINITY) ? NAN : (float)c;
}

KF_INLINE float kf_sin(float x) {
    float ax = fabsf(x);
    uint32_t n;
    double r = kf_reduce(ax == ax && ax != INFINITY ? ax : 0.0f, &n);
    return kf_sin_reduced(x, ax, r, n);
}

KF_INLINE float kf_cos(float x) {
    float ax = fabsf(x);
    uint32_t n;
    double r = kf_reduce(ax == ax && ax != INFINITY ? ax : 0.0f, &n);
    return kf_cos_reduced(x, ax, r, n);
}

/* ---- tanh, sigmoid, softplus, GELU, rsqrt (lib.rs) ---- */
KF_INLINE float kf_tanh(float x) {
    float ax = fabsf(x);
    float z = x * x;
    float small = x + x * z * KF_TANH_POLY(z);
    float t = ax > 9.0f ? 1.0f : 1.0f - 2.0f / (kf_exp(2.0f * ax) + 1.0f);
    float v = copysignf(t, x);
    v = ax < 0.625f ? small : v;
    v = ax < 2.44e-4f ? x : v;
    return ax != ax ? x : v;
}

KF_INLINE float kf_sigmoid(float x) {
    int pos = x >= 0.0f;
    float e = kf_exp(pos ? -x : x);
    return (pos ? 1.0f : e) / (1.0f + e);
}

KF_INLINE double kf_sigmoid_f64(double x) {
    double pos = 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return x >= 0.0 ? pos : e / (1.0 + e);
}

KF_INLINE float kf_softplus(float x) {
    /* A select, not fmaxf (which GCC does not vectorize here): they differ only in the sign of
     * a zero, which the added log1p(1) absorbs, and for NaN, which is selected below. */
    float v = (x > 0.0f ? x : 0.0f) + kf_log1p(kf_exp(-fabsf(x)));
    return x != x ? x : v;
}

KF_INLINE double kf_softplus_f64(double x) {
    double v = fmax(x, 0.0) + log1p(exp(-fabs(x)));
    return x != x ? x : v;
}

KF_INLINE double kf_gelu_tanh_f64(double x) {
    double u = 0x1.9884533d43651p-1 * (x + 0.044715 * x * x * x);
    double v = x * kf_sigmoid_f64(2.0 * u);
    return isinf(x) ? (x > 0.0 ? x : -0.0) : v;
}

/* e^t for t <= 0 to f32 accuracy, in double: reduction in double, the float polynomial, exact
 * scaling in double (exp_f32_of_f64 in exp_log.rs). */
KF_INLINE double kf_exp_f32_of_f64(double t) {
    int dead = t < -746.0; /* e^t rounds to 0; computed from 0 so that nothing underflows */
    double tc = dead ? 0.0 : t;
    double k = rint(tc * 0x1.71547652b82fep+0);
    float r = (float)(tc - k * 0x1.62e42fefa39efp-1);
    double y = (double)kf_exp_reduced(r);
    int64_t ki = (int64_t)k;
    int64_t k1 = ki >> 1;
    double v = y * kf_f64_from_bits((uint64_t)(k1 + 1023) << 52) * kf_f64_from_bits((uint64_t)(ki - k1 + 1023) << 52);
    v = dead ? 0.0 : v;
    return t != t ? t : v;
}

KF_INLINE float kf_gelu_tanh(float x) {
    double xd = (double)x;
    double u2 = 2.0 * 0x1.9884533d43651p-1 * (xd + 0.044715 * xd * xd * xd);
    double e = kf_exp_f32_of_f64(-fabs(u2));
    double s = (u2 >= 0.0 ? 1.0 : e) / (1.0 + e);
    float v = (float)(xd * s);
    return x == -INFINITY ? -0.0f : v;
}

KF_INLINE float kf_rsqrt(float x) { return (float)(1.0 / sqrt((double)x)); }

/* ---- erf and GELU, erf form (erf.rs) ---- */
static const double KF_ERF_SMALL[10] = {
    1.1283791670954912, -0.3761263890276841, 0.11283791657499177, -0.026866168944683452,
    0.005223966656513368, -0.0008547918406326636, 0.00012046003753913706,
    -1.4792506796106039e-05, 1.5293011238724599e-06, -1.0439616349364695e-07,
};
static const double KF_ERFC_TAIL[17] = {
    -0.5723653326848518, 2.009371029967584e-05, -0.5004544023717076, 0.005905416053492059,
    0.5769017026868812, 0.24456018951153377, -2.185373689148906, -0.5422190789281313,
    17.85687132634169, -52.73044127690035, 90.18829216033456, -105.06262729210803,
    86.61201198077916, -50.14778084295121, 19.4986210267468, -4.585240074225506,
    0.49371258323113243,
};

KF_INLINE double kf_horner(const double *c, int n, double u) {
    double acc = 0.0;
    /* Unrolled whole, so that loops calling it vectorize. */
    _Pragma("GCC unroll 24") for (int i = n - 1; i >= 0; i--) acc = acc * u + c[i];
    return acc;
}

KF_INLINE double kf_erf_small(double y) { return y * kf_horner(KF_ERF_SMALL, 10, y * y); }

/* e^t for -110 <= t <= 0 (exp_tail in erf.rs): Cody-Waite with fdlibm's split of ln 2, the
 * Taylor series to degree 11, an exact scaling; no libm call, so erf and GELU vectorize. */
static const double KF_EXP_TAYLOR[12] = {
    1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0,
    1.0 / 40320.0, 1.0 / 362880.0, 1.0 / 3628800.0, 1.0 / 39916800.0,
};
KF_INLINE double kf_exp_tail(double t) {
    t = t > -110.0 ? t : -110.0;
    double k = rint(t * 1.4426950408889634);
    double r = t - k * 6.9314718036912382e-01 - k * 1.9082149292705877e-10;
    double p = kf_horner(KF_EXP_TAYLOR, 12, r);
    return p * kf_f64_from_bits((uint64_t)((int64_t)k + 1023) << 52);
}

KF_INLINE double kf_erfc_tail(double y) {
    double v = kf_exp_tail(-(y * y) + kf_horner(KF_ERFC_TAIL, 17, 1.0 / y)) / y;
    return y > 10.1 ? 0.0 : v;
}

/* The tail is computed once, at |y| (what either branch of erf.rs's erfc evaluates), so a loop
 * of GELUs holds one copy of it and vectorizes. */
KF_INLINE double kf_erfc(double y) {
    double tail = kf_erfc_tail(fabs(y));
    return y >= 1.0 ? tail : (y > -1.0 ? 1.0 - kf_erf_small(y) : 2.0 - tail);
}

KF_INLINE float kf_erf(float x) {
    double y = (double)x, ay = fabs(y);
    double r = ay < 1.0 ? kf_erf_small(y) : (ay > 4.0 ? copysign(1.0, y) : copysign(1.0 - kf_erfc_tail(ay), y));
    return x != x ? x : (float)r;
}

KF_INLINE float kf_gelu(float x) {
    double y = (double)x;
    float v = (float)(0.5 * y * kf_erfc(-y * 0x1.6a09e667f3bcdp-1));
    v = x == INFINITY ? x : v;
    v = x == -INFINITY ? -0.0f : v;
    return x != x ? x : v;
}

/* ---- scalar semantics (scalar.rs) ---- */
/* NaN-propagating max/min with -0 < +0. Written with bitwise operators, not || and &&: in fast
 * mode GCC turns the short-circuit form into branches and the reduction loops stay scalar. */
KF_INLINE float kf_maximum(float a, float b) {
    int take_a = (a > b) | ((a == b) & (int)(kf_f32_bits(b) >> 31));
    float m = take_a ? a : b;
    return ((a != a) | (b != b)) ? NAN : m;
}
KF_INLINE float kf_minimum(float a, float b) {
    int take_a = (a < b) | ((a == b) & (int)(kf_f32_bits(a) >> 31));
    float m = take_a ? a : b;
    return ((a != a) | (b != b)) ? NAN : m;
}
KF_INLINE uint64_t kf_f64_bits(double f) { uint64_t b; memcpy(&b, &f, 8); return b; }
KF_INLINE double kf_maximum_f64(double a, double b) {
    int take_a = (a > b) | ((a == b) & (int)(kf_f64_bits(b) >> 63));
    double m = take_a ? a : b;
    return ((a != a) | (b != b)) ? NAN : m;
}
KF_INLINE double kf_minimum_f64(double a, double b) {
    int take_a = (a < b) | ((a == b) & (int)(kf_f64_bits(a) >> 63));
    double m = take_a ? a : b;
    return ((a != a) | (b != b)) ? NAN : m;
}

KF_INLINE float kf_rem(float x, float y) {
    float m = fmodf(x, y);
    return (m != 0.0f && ((y < 0.0f) != (m < 0.0f))) ? m + y : (m == 0.0f ? copysignf(0.0f, y) : m);
}
KF_INLINE double kf_rem_f64(double x, double y) {
    double m = fmod(x, y);
    return (m != 0.0 && ((y < 0.0) != (m < 0.0))) ? m + y : (m == 0.0 ? copysign(0.0, y) : m);
}

KF_INLINE int64_t kf_floor_div(int64_t x, int64_t y) {
    if (y == 0) return 0;
    if (y == -1) return (int64_t)(0 - (uint64_t)x);
    int64_t q = x / y;
    return ((x % y != 0) && ((x < 0) != (y < 0))) ? q - 1 : q;
}
KF_INLINE int64_t kf_rem_i64(int64_t x, int64_t y) {
    if (y == 0 || y == -1) return 0;
    int64_t m = x % y;
    return (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
}
KF_INLINE int64_t kf_int_pow(int64_t base, int64_t e) {
    if (e < 0) return base == 1 ? 1 : (base == -1 ? ((e % 2 == 0) ? 1 : -1) : 0);
    uint64_t result = 1, b = (uint64_t)base, k = (uint64_t)e;
    while (k > 0) {
        if (k & 1) result *= b;
        b *= b;
        k >>= 1;
    }
    return (int64_t)result;
}

KF_INLINE float kf_sign(float x) { return (x != x || x == 0.0f) ? x : (x > 0.0f ? 1.0f : -1.0f); }
KF_INLINE double kf_sign_f64(double x) { return (x != x || x == 0.0) ? x : (x > 0.0 ? 1.0 : -1.0); }

/* Saturating float-to-integer conversions with NaN -> 0 (Rust `as`). */
KF_INLINE int32_t kf_f2i32(double x) { return x != x ? 0 : (x >= 2147483647.0 ? INT32_MAX : (x <= -2147483648.0 ? INT32_MIN : (int32_t)x)); }
KF_INLINE int64_t kf_f2i64(double x) { return x != x ? 0 : (x >= 9223372036854775807.0 ? INT64_MAX : (x <= -9223372036854775808.0 ? INT64_MIN : (int64_t)x)); }
KF_INLINE uint8_t kf_f2u8(double x) { return x != x ? 0 : (x >= 255.0 ? 255 : (x <= 0.0 ? 0 : (uint8_t)x)); }

/* Integer to float, with the sign taken from the integer. Under -fno-trapping-math GCC folds a
 * float -> integer -> float pair into one trunc, which keeps the sign of x in (-1, 0): -0, where
 * the integer 0 converts to +0. Every integer converts to a float of its own sign, so setting
 * the sign bit from the integer changes no result, and no fold sees through it. */
KF_INLINE float kf_i64_to_f32(int64_t v) {
    uint32_t sign = (uint32_t)((uint64_t)v >> 63) << 31;
    return kf_f32_from_bits((kf_f32_bits((float)v) & 0x7fffffffu) | sign);
}
KF_INLINE double kf_i64_to_f64(int64_t v) {
    uint64_t sign = ((uint64_t)v >> 63) << 63;
    return kf_f64_from_bits((kf_f64_bits((double)v) & 0x7fffffffffffffffull) | sign);
}

/* bfloat16 as raw bits, rounded to nearest even like the `half` crate. */
KF_INLINE float kf_bf16_to_f32(uint16_t b) { return kf_f32_from_bits((uint32_t)b << 16); }
KF_INLINE uint16_t kf_f32_to_bf16(float v) {
    uint32_t x = kf_f32_bits(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    uint32_t round_bit = 0x00008000u;
    return ((x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0) ? (uint16_t)((x >> 16) + 1) : (uint16_t)(x >> 16);
}

/* f32 narrowed to binary16 bits, rounded to nearest even (what vcvtps2ph and the `half` crate
 * give; all 2^32 inputs checked once, NaN payloads included), in integer steps. Not a C cast:
 * GCC 12 targeting AVX512-FP16 drops a float -> _Float16 -> float round trip inside a loop,
 * with or without -fexcess-precision=standard, so f16 results would keep f32 precision. */
KF_INLINE uint16_t kf_f32_to_f16_bits(float v) {
    uint32_t x = kf_f32_bits(v);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    /* Normal results: rebias the exponent and round the 13 dropped bits to nearest even; a
     * carry moves into the exponent, and everything from 65520 up becomes infinity. */
    uint32_t normal = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
    normal = normal < 0x7c00u ? normal : 0x7c00u;
    /* Results below 2^-14 count units of 2^-24: the significand, implicit bit included, shifted
     * right by 126 - e and rounded to nearest even (31 places and more leave less than half a
     * unit; the shift is clamped so that it stays defined for lanes that take the other arm). */
    int32_t shift = 126 - (int32_t)(a >> 23);
    shift = shift > 14 ? (shift < 31 ? shift : 31) : 14;
    uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    uint32_t q = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    uint32_t subnormal = q + ((rest > half) | ((rest == half) & q & 1u));
    uint32_t r = a < 0x38800000u ? subnormal : normal;
    r = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : r;
    return (uint16_t)(sign | r);
}
KF_INLINE _Float16 kf_f32_to_f16(float v) {
    uint16_t b = kf_f32_to_f16_bits(v);
    _Float16 h;
    memcpy(&h, &b, 2);
    return h;
}

/* f64 narrowed to f16 or bf16 with one rounding (narrow_f64 in narrow.rs, the same integer
 * steps): a C conversion from double to _Float16 may go through float, and there is none to
 * bf16. exp_bits and man_bits describe the target format. */
KF_INLINE uint16_t kf_narrow_f64(double x, int exp_bits, int man_bits) {
    uint64_t bits = kf_f64_bits(x);
    uint64_t sign = (bits >> 63) << (exp_bits + man_bits);
    uint64_t abs = bits & 0x7fffffffffffffffull;
    uint64_t infinity = ((1ull << exp_bits) - 1) << man_bits;
    int biased = (int)(abs >> 52);
    uint64_t fraction = abs & ((1ull << 52) - 1);
    uint64_t significand = biased == 0 ? fraction : fraction | (1ull << 52);
    int low_exp = biased == 0 ? -1074 : biased - 1075;
    int exponent = low_exp + 63 - __builtin_clzll(significand | 1);
    int min_exponent = 2 - (1 << (exp_bits - 1));
    int e = exponent > min_exponent ? exponent : min_exponent;
    int drop = e - man_bits - low_exp;
    drop = drop < 63 ? drop : 63;
    uint64_t quotient = significand >> drop;
    uint64_t rest = significand & ((1ull << drop) - 1);
    uint64_t half = 1ull << (drop - 1);
    uint64_t round_up = (rest > half) | ((rest == half) & (quotient & 1));
    uint64_t magnitude = ((uint64_t)(e - min_exponent) << man_bits) + quotient + round_up;
    magnitude = magnitude < infinity ? magnitude : infinity;
    uint64_t nan = infinity | (1ull << (man_bits - 1)) | ((abs >> (52 - man_bits)) & ((1ull << man_bits) - 1));
    magnitude = abs > 0x7ff0000000000000ull ? nan : magnitude;
    return (uint16_t)(sign | magnitude);
}
KF_INLINE _Float16 kf_f64_to_f16(double x) {
    uint16_t b = kf_narrow_f64(x, 5, 10);
    _Float16 h;
    memcpy(&h, &b, 2);
    return h;
}
KF_INLINE uint16_t kf_f64_to_bf16(double x) { return kf_narrow_f64(x, 8, 7); }

/* ---- streaming stores (no Rust twin: they move bytes, they compute nothing) ----
 * Large outputs are written with non-temporal stores: the line is not read for ownership first
 * and does not evict the inputs from the cache. Inline assembly instead of <immintrin.h>, which
 * would add ~0.15 s to every compilation. kf_stream_fence() must run before the kernel returns,
 * so that the stores are visible to whoever waits on the kernel. */
#if defined(__x86_64__) && defined(__AVX512F__)
#define KF_STREAM_LINE 64
typedef long long kf_line __attribute__((vector_size(64)));
KF_INLINE void kf_stream_line(char *d, const char *s) {
    kf_line x;
    memcpy(&x, s, 64);
    __asm__ volatile("vmovntdq %1, %0" : "=m"(*(kf_line *)d) : "v"(x));
}
#elif defined(__x86_64__) && defined(__AVX__)
#define KF_STREAM_LINE 32
typedef long long kf_line __attribute__((vector_size(32)));
KF_INLINE void kf_stream_line(char *d, const char *s) {
    kf_line x;
    memcpy(&x, s, 32);
    __asm__ volatile("vmovntdq %1, %0" : "=m"(*(kf_line *)d) : "x"(x));
}
#endif

KF_INLINE void kf_stream(void *dst, const void *src, int64_t n) {
#ifdef KF_STREAM_LINE
    char *d = (char *)dst;
    const char *s = (const char *)src;
    int64_t head = (int64_t)((KF_STREAM_LINE - ((uintptr_t)d & (KF_STREAM_LINE - 1))) & (KF_STREAM_LINE - 1));
    if (head > n) head = n;
    memcpy(d, s, (size_t)head);
    d += head; s += head; n -= head;
    for (; n >= KF_STREAM_LINE; n -= KF_STREAM_LINE, d += KF_STREAM_LINE, s += KF_STREAM_LINE)
        kf_stream_line(d, s);
    memcpy(d, s, (size_t)n);
#else
    memcpy(dst, src, (size_t)n);
#endif
}

KF_INLINE void kf_stream_fence(void) {
#ifdef KF_STREAM_LINE
    __asm__ volatile("sfence" ::: "memory");
#endif
}

/* ---- 16-lane reduction accumulators ----
 * A reduction keeps its 16 partial results (lane l takes the terms j = l mod 16) in one vector
 * value rather than an array, so they stay in registers across the loop; an array is stored
 * and reloaded every 16 terms. Each lane combines exactly as the scalar kf_maximum etc. do. */
typedef float kf_f32x16 __attribute__((vector_size(64)));
typedef int32_t kf_i32x16 __attribute__((vector_size(64)));
typedef double kf_f64x16 __attribute__((vector_size(128)));
typedef int64_t kf_i64x16 __attribute__((vector_size(128)));

KF_INLINE kf_f32x16 kf_vsum_f32(kf_f32x16 a, kf_f32x16 b) { return a + b; }
KF_INLINE kf_f32x16 kf_vprod_f32(kf_f32x16 a, kf_f32x16 b) { return a * b; }
KF_INLINE kf_f32x16 kf_vpick_f32(kf_f32x16 a, kf_f32x16 b, kf_i32x16 take_a) {
    kf_i32x16 nan = (a != a) | (b != b);
    kf_i32x16 r = ((kf_i32x16)a & take_a) | ((kf_i32x16)b & ~take_a);
    return (kf_f32x16)((r & ~nan) | (nan & (int32_t)0x7fc00000));
}
KF_INLINE kf_f32x16 kf_vmax_f32(kf_f32x16 a, kf_f32x16 b) {
    return kf_vpick_f32(a, b, (a > b) | ((a == b) & ((kf_i32x16)b >> 31)));
}
KF_INLINE kf_f32x16 kf_vmin_f32(kf_f32x16 a, kf_f32x16 b) {
    return kf_vpick_f32(a, b, (a < b) | ((a == b) & ((kf_i32x16)a >> 31)));
}

KF_INLINE kf_f64x16 kf_vsum_f64(kf_f64x16 a, kf_f64x16 b) { return a + b; }
KF_INLINE kf_f64x16 kf_vprod_f64(kf_f64x16 a, kf_f64x16 b) { return a * b; }
KF_INLINE kf_f64x16 kf_vpick_f64(kf_f64x16 a, kf_f64x16 b, kf_i64x16 take_a) {
    kf_i64x16 nan = (a != a) | (b != b);
    kf_i64x16 r = ((kf_i64x16)a & take_a) | ((kf_i64x16)b & ~take_a);
    return (kf_f64x16)((r & ~nan) | (nan & (int64_t)0x7ff8000000000000ll));
}
KF_INLINE kf_f64x16 kf_vmax_f64(kf_f64x16 a, kf_f64x16 b) {
    return kf_vpick_f64(a, b, (a > b) | ((a == b) & ((kf_i64x16)b >> 63)));
}
KF_INLINE kf_f64x16 kf_vmin_f64(kf_f64x16 a, kf_f64x16 b) {
    return kf_vpick_f64(a, b, (a < b) | ((a == b) & ((kf_i64x16)a >> 63)));
}

/* dst[o * dn + j] = src[j * sn + o] for o, j < 16: a 16 x 16 block of floats transposed in
 * registers (tiled kernels pack a transposed operand's tile this way, c.rs). Four levels of
 * block swaps: at level k, in every 2^(k+1)-square block, the upper-right and lower-left
 * 2^k-square blocks trade places; 16 two-input shuffles per level. */
#define KF_T_LO_1(k, l) (l) + (((l) >> (k)) & 1 ? 16 - (1 << (k)) : 0)
#define KF_T_HI_1(k, l) (l) + (((l) >> (k)) & 1 ? 16 : (1 << (k)))
#define KF_T_16(f, k)                                                                          \
    f(k, 0), f(k, 1), f(k, 2), f(k, 3), f(k, 4), f(k, 5), f(k, 6), f(k, 7), f(k, 8), f(k, 9),   \
        f(k, 10), f(k, 11), f(k, 12), f(k, 13), f(k, 14), f(k, 15)
/* Two-input shuffles with constant indices: __builtin_shufflevector where the compiler has it
 * (clang, GCC 12 and later), GCC's __builtin_shuffle with a mask vector before that. */
#if defined(__clang__) || __GNUC__ >= 12
#define KF_T_SHUFFLE(a, b, f, k) __builtin_shufflevector(a, b, KF_T_16(f, k))
#else
#define KF_T_SHUFFLE(a, b, f, k) __builtin_shuffle(a, b, (kf_i32x16){KF_T_16(f, k)})
#endif
#define KF_T_LEVEL(k)                                                                          \
    do {                                                                                       \
        for (int i = 0; i < 16; i++)                                                           \
            if (!((i >> (k)) & 1)) {                                                           \
                kf_f32x16 a = r[i], b = r[i + (1 << (k))];                                     \
                r[i] = KF_T_SHUFFLE(a, b, KF_T_LO_1, k);                                       \
                r[i + (1 << (k))] = KF_T_SHUFFLE(a, b, KF_T_HI_1, k);                          \
            }                                                                                  \
    } while (0)
KF_INLINE void kf_transpose16(const float *src, int64_t sn, float *dst, int64_t dn) {
    kf_f32x16 r[16];
    for (int i = 0; i < 16; i++) memcpy(&r[i], src + i * sn, 64);
    KF_T_LEVEL(3);
    KF_T_LEVEL(2);
    KF_T_LEVEL(1);
    KF_T_LEVEL(0);
    for (int i = 0; i < 16; i++) memcpy(dst + i * dn, &r[i], 64);
}

/* ---- 16-lane elementwise math ----
 * Inner loops whose loads and stores are contiguous run on 16-lane values (c.rs, "vector
 * bodies"). Each kf_v* function computes, lane by lane, exactly what its scalar twin above
 * computes, so strict kernels stay bit-identical to the reference interpreter whichever form
 * runs (crates/kfuse-cpu/tests/vector_math.rs sweeps them against the scalar forms). With
 * AVX-512, single instructions take over multi-instruction steps:
 *  - vscalefps multiplies by 2^k with one rounding, which is what kf_scale's exact first
 *    product and rounding second product give;
 *  - vgetexpps / vgetmantps split a float into exponent and [1, 2) mantissa, subnormals
 *    included, as kf_split_log does;
 *  - vfixupimmps puts log's special results (0 -> -inf, +inf -> +inf, negative or NaN -> NaN)
 *    in place in one step;
 *  - exp's clamps are vmaxps / vminps, which return their second operand when either is NaN,
 *    so a NaN argument flows through to a NaN result without a select.
 * NaN results may carry another payload than the scalar form's; kfuse compares NaNs as NaN.
 * Without AVX-512 every function applies its scalar twin lane by lane. */
KF_INLINE kf_f32x16 kf_vsplat(float x) {
    kf_f32x16 v = {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
    return v;
}
/* m: lanes all ones (take a) or all zeros (take b), as vector comparisons give. */
KF_INLINE kf_f32x16 kf_vsel(kf_i32x16 m, kf_f32x16 a, kf_f32x16 b) {
    return (kf_f32x16)(((kf_i32x16)a & m) | ((kf_i32x16)b & ~m));
}
KF_INLINE kf_f32x16 kf_vabs(kf_f32x16 x) { return (kf_f32x16)((kf_i32x16)x & 0x7fffffff); }
KF_INLINE kf_f32x16 kf_vcopysign(kf_f32x16 m, kf_f32x16 s) {
    return (kf_f32x16)(((kf_i32x16)m & 0x7fffffff) | ((kf_i32x16)s & (int32_t)0x80000000));
}
KF_INLINE kf_f32x16 kf_vexp_reduced(kf_f32x16 r) { return r * r * KF_EXP_POLY(r) + r + 1.0f; }
KF_INLINE kf_f32x16 kf_vlog_tail(kf_f32x16 f) { return f * (f * f) * KF_LOG_POLY(f); }

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define KF_VECTOR_ISA "avx512"
typedef unsigned short kf_m16;
/* The AVX-512 instructions the 16-lane forms use, one macro each: GCC's builtins (no
 * <immintrin.h>, which costs GCC compile time), or clang's intrinsics, whose builtins have
 * other names and signatures. */
#if defined(__clang__)
#include <immintrin.h>
#define KF_ROUNDSCALE(x, imm) ((kf_f32x16)_mm512_roundscale_ps((__m512)(x), imm))
#define KF_SQRT(x) ((kf_f32x16)_mm512_sqrt_ps((__m512)(x)))
#define KF_MAX(a, b) ((kf_f32x16)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define KF_MIN(a, b) ((kf_f32x16)_mm512_min_ps((__m512)(a), (__m512)(b)))
#define KF_CMP(a, b, pred) ((kf_m16)_mm512_cmp_ps_mask((__m512)(a), (__m512)(b), pred))
#define KF_MASK_ADD(src, m, a, b) \
    ((kf_f32x16)_mm512_mask_add_ps((__m512)(src), m, (__m512)(a), (__m512)(b)))
#define KF_MASK_MUL(src, m, a, b) \
    ((kf_f32x16)_mm512_mask_mul_ps((__m512)(src), m, (__m512)(a), (__m512)(b)))
#define KF_RANGE(a, b, imm) ((kf_f32x16)_mm512_range_ps((__m512)(a), (__m512)(b), imm))
#define KF_SCALEF(a, b) ((kf_f32x16)_mm512_scalef_ps((__m512)(a), (__m512)(b)))
#define KF_GETEXP(x) ((kf_f32x16)_mm512_getexp_ps((__m512)(x)))
#define KF_GETMANT(x) ((kf_f32x16)_mm512_getmant_ps((__m512)(x), _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src))
#define KF_FIXUPIMM(a, b, table) \
    ((kf_f32x16)_mm512_fixupimm_ps((__m512)(a), (__m512)(b), (__m512i)(table), 0))
#define KF_STREAM_PS(d, v) _mm512_stream_ps(d, (__m512)(v))
#define KF_FMADD(a, b, c) ((kf_f32x16)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#else
#define KF_ALL ((kf_m16)-1)
#define KF_CUR 4 /* _MM_FROUND_CUR_DIRECTION */
#define KF_ROUNDSCALE(x, imm) __builtin_ia32_rndscaleps_mask(x, imm, x, KF_ALL, KF_CUR)
#define KF_SQRT(x) __builtin_ia32_sqrtps512_mask(x, x, KF_ALL, KF_CUR)
#define KF_MAX(a, b) __builtin_ia32_maxps512_mask(a, b, a, KF_ALL, KF_CUR)
#define KF_MIN(a, b) __builtin_ia32_minps512_mask(a, b, a, KF_ALL, KF_CUR)
#define KF_CMP(a, b, pred) __builtin_ia32_cmpps512_mask(a, b, pred, KF_ALL, KF_CUR)
#define KF_MASK_ADD(src, m, a, b) __builtin_ia32_addps512_mask(a, b, src, m, KF_CUR)
#define KF_MASK_MUL(src, m, a, b) __builtin_ia32_mulps512_mask(a, b, src, m, KF_CUR)
#define KF_RANGE(a, b, imm) __builtin_ia32_rangeps512_mask(a, b, imm, a, KF_ALL, KF_CUR)
#define KF_SCALEF(a, b) __builtin_ia32_scalefps512_mask(a, b, a, KF_ALL, KF_CUR)
#define KF_GETEXP(x) __builtin_ia32_getexpps512_mask(x, x, KF_ALL, KF_CUR)
#define KF_GETMANT(x) __builtin_ia32_getmantps512_mask(x, 0, x, KF_ALL, KF_CUR)
#define KF_FIXUPIMM(a, b, table) __builtin_ia32_fixupimmps512_mask(a, b, table, 0, KF_ALL, KF_CUR)
#define KF_STREAM_PS(d, v) __builtin_ia32_movntps512(d, v)
#define KF_FMADD(a, b, c) __builtin_ia32_vfmaddps512_mask(a, b, c, KF_ALL, KF_CUR)
#endif
KF_INLINE kf_f32x16 kf_vrint(kf_f32x16 x) { return KF_ROUNDSCALE(x, 0x08); }
KF_INLINE kf_f32x16 kf_vfloor(kf_f32x16 x) { return KF_ROUNDSCALE(x, 0x09); }
KF_INLINE kf_f32x16 kf_vceil(kf_f32x16 x) { return KF_ROUNDSCALE(x, 0x0a); }
KF_INLINE kf_f32x16 kf_vsqrt(kf_f32x16 x) { return KF_SQRT(x); }
/* max(a, b) of vmaxps: b when either is NaN. */
KF_INLINE kf_f32x16 kf_vmaxps(kf_f32x16 a, kf_f32x16 b) { return KF_MAX(a, b); }
KF_INLINE kf_f32x16 kf_vminps(kf_f32x16 a, kf_f32x16 b) { return KF_MIN(a, b); }
/* kf_maximum / kf_minimum: vrangeps orders -0 below +0; where either operand is NaN (which
 * vrangeps would pass over), a + b puts a NaN in place. */
KF_INLINE kf_f32x16 kf_vnan_either(kf_f32x16 a, kf_f32x16 b, kf_f32x16 r) {
    kf_m16 nan = KF_CMP(a, b, 0x3);
    return KF_MASK_ADD(r, nan, a, b);
}
KF_INLINE kf_f32x16 kf_vmaximum(kf_f32x16 a, kf_f32x16 b) {
    return kf_vnan_either(a, b, KF_RANGE(a, b, 0x5));
}
KF_INLINE kf_f32x16 kf_vminimum(kf_f32x16 a, kf_f32x16 b) {
    return kf_vnan_either(a, b, KF_RANGE(a, b, 0x4));
}
/* kf_maximum(x, 0.0f): vmaxps gives x where x is NaN (its second operand), 0 where x < 0, and
 * x (with its sign) where x is a zero; adding +0 turns -0 into +0 and changes nothing else. One
 * instruction fewer than kf_vmaximum, two where the compiler may drop the addition (fast
 * numerics, -fno-signed-zeros). */
KF_INLINE kf_f32x16 kf_vrelu(kf_f32x16 x) { return kf_vmaxps(kf_vsplat(0.0f), x) + 0.0f; }
KF_INLINE kf_f32x16 kf_vexp(kf_f32x16 x) {
    kf_f32x16 xc = kf_vminps(kf_vsplat(89.0f), kf_vmaxps(kf_vsplat(-110.0f), x));
    kf_f32x16 k = kf_vrint(xc * KF_LOG2_E);
    kf_f32x16 r = KF_FMADD(-k, kf_vsplat(KF_LN2_HI), xc) - k * KF_LN2_LO; /* kf_reduce_hi */
    return KF_SCALEF(kf_vexp_reduced(r), k);
}
KF_INLINE kf_f32x16 kf_vexp2(kf_f32x16 x) {
    kf_f32x16 xc = kf_vminps(kf_vsplat(129.0f), kf_vmaxps(kf_vsplat(-160.0f), x));
    kf_f32x16 k = kf_vrint(xc);
    kf_f32x16 f = xc - k;
    kf_f32x16 r = f * KF_LN2_HI + f * KF_LN2_LO;
    return KF_SCALEF(kf_vexp_reduced(r), k);
}
/* x = (1 + f) 2^e as kf_split_log; then the special results of kf_log_special. */
KF_INLINE void kf_vsplit_log(kf_f32x16 x, kf_f32x16 *e_out, kf_f32x16 *f_out) {
    kf_f32x16 e = KF_GETEXP(x);
    kf_f32x16 m = KF_GETMANT(x);
    kf_m16 big = KF_CMP(m, kf_vsplat(2.0f * KF_SQRT_HALF), 0x1e);
    *f_out = KF_MASK_MUL(m, big, m, kf_vsplat(0.5f)) - 1.0f;
    *e_out = KF_MASK_ADD(e, big, e, kf_vsplat(1.0f));
}
KF_INLINE kf_f32x16 kf_vlog_special(kf_f32x16 x, kf_f32x16 v) {
    /* Per input class, 4 bits: QNaN, SNaN -> QNaN(x); 0 -> -inf; 1 -> v; -inf -> NaN;
     * +inf -> +inf; negative -> NaN; positive -> v. */
    return KF_FIXUPIMM(v, x, (kf_i32x16){} + (int32_t)0x03530422);
}
/* A non-temporal store of 16 lanes where d is line-aligned (the whole line is written at once,
 * so no partial write-combining flush), an ordinary store elsewhere. */
KF_INLINE void kf_vstore_nt(float *d, kf_f32x16 v) {
    if (((uintptr_t)d & 63) == 0)
        KF_STREAM_PS(d, v);
    else
        memcpy(d, &v, 64);
}
#else
#define KF_VECTOR_ISA "lanewise"
KF_INLINE void kf_vstore_nt(float *d, kf_f32x16 v) { memcpy(d, &v, 64); }
#define KF_LANEWISE(name, scalar)                                            \
    KF_INLINE kf_f32x16 name(kf_f32x16 x) {                                  \
        kf_f32x16 r;                                                         \
        for (int l = 0; l < 16; l++) r[l] = scalar(x[l]);                    \
        return r;                                                            \
    }
KF_LANEWISE(kf_vrint, rintf)
KF_LANEWISE(kf_vfloor, floorf)
KF_LANEWISE(kf_vceil, ceilf)
KF_LANEWISE(kf_vsqrt, sqrtf)
KF_LANEWISE(kf_vexp, kf_exp)
KF_LANEWISE(kf_vexp2, kf_exp2)
KF_INLINE kf_f32x16 kf_vmaximum(kf_f32x16 a, kf_f32x16 b) { return kf_vmax_f32(a, b); }
KF_INLINE kf_f32x16 kf_vrelu(kf_f32x16 x) { return kf_vmax_f32(x, kf_vsplat(0.0f)); }
KF_INLINE kf_f32x16 kf_vminimum(kf_f32x16 a, kf_f32x16 b) { return kf_vmin_f32(a, b); }
KF_INLINE void kf_vsplit_log(kf_f32x16 x, kf_f32x16 *e_out, kf_f32x16 *f_out) {
    for (int l = 0; l < 16; l++) {
        float e, f;
        kf_split_log(x[l], &e, &f);
        (*e_out)[l] = e;
        (*f_out)[l] = f;
    }
}
KF_INLINE kf_f32x16 kf_vlog_special(kf_f32x16 x, kf_f32x16 v) {
    for (int l = 0; l < 16; l++) v[l] = kf_log_special(x[l], v[l]);
    return v;
}
#endif

KF_INLINE kf_f32x16 kf_vlog(kf_f32x16 x) {
    kf_f32x16 e, f;
    kf_vsplit_log(x, &e, &f);
    kf_f32x16 z = f * f;
    kf_f32x16 y = kf_vlog_tail(f) + e * KF_LN2_LO - 0.5f * z;
    return kf_vlog_special(x, f + y + e * KF_LN2_HI);
}
KF_INLINE kf_f32x16 kf_vlog2(kf_f32x16 x) {
    kf_f32x16 e, f;
    kf_vsplit_log(x, &e, &f);
    kf_f32x16 ln_m = f + (kf_vlog_tail(f) - 0.5f * f * f);
    return kf_vlog_special(x, e + ln_m * KF_LOG2_E);
}
KF_INLINE kf_f32x16 kf_vlog1p(kf_f32x16 x) {
    kf_f32x16 u = 1.0f + x;
    kf_f32x16 e, f;
    kf_vsplit_log(u, &e, &f);
    /* kf_log1p_u_minus_1 on 16 lanes. */
    kf_f32x16 v = kf_vlog(u) * (x / kf_vsel(e == 0.0f, f, u - 1.0f));
    v = kf_vsel(u <= 0.0f, kf_vsel(u == 0.0f, kf_vsplat(-INFINITY), kf_vsplat(NAN)), v);
    v = kf_vsel(u == 1.0f, x, v);
    v = kf_vsel(x == INFINITY, x, v);
    return kf_vsel(x != x, x, v);
}
KF_INLINE kf_f32x16 kf_vtanh(kf_f32x16 x) {
    kf_f32x16 ax = kf_vabs(x);
    kf_f32x16 z = x * x;
    kf_f32x16 small = x + x * z * KF_TANH_POLY(z);
    kf_f32x16 t = kf_vsel(ax > 9.0f, kf_vsplat(1.0f), 1.0f - 2.0f / (kf_vexp(2.0f * ax) + 1.0f));
    /* Two selects of the scalar form fold away: below 2.44e-4, `small` rounds to x but for the
     * sign of a zero, which the copysign puts back (small has x's sign everywhere else below
     * 0.625); a NaN flows through every step to a NaN. */
    return kf_vcopysign(kf_vsel(ax < 0.625f, small, t), x);
}
KF_INLINE kf_f32x16 kf_vsigmoid(kf_f32x16 x) {
    kf_i32x16 pos = x >= 0.0f;
    kf_f32x16 e = kf_vexp(kf_vsel(pos, -x, x));
    return kf_vsel(pos, kf_vsplat(1.0f), e) / (1.0f + e);
}
/* sin and cos on 16 lanes: every lane takes the Cody-Waite reduction, which vectorizes (a
 * lane at or above 2e8 reduces 0 instead); where some lane is that large (finite), those lanes
 * are recomputed by the scalar form, whose Payne-Hanek reduction does not vectorize. Each lane
 * computes exactly what kf_sin / kf_cos computes. */
#define KF_VTRIG(name, reduced, scalar)                                                     \
    KF_INLINE kf_f32x16 name(kf_f32x16 x) {                                                 \
        kf_f32x16 v;                                                                        \
        int large = 0;                                                                      \
        for (int l = 0; l < 16; l++) {                                                      \
            float ax = fabsf(x[l]);                                                         \
            large |= ax >= 2.0e8f && ax != INFINITY;                                        \
            uint32_t n;                                                                     \
            double r = kf_reduce_small(ax == ax && ax < 2.0e8f ? ax : 0.0f, &n);            \
            v[l] = reduced(x[l], ax, r, n);                                                 \
        }                                                                                   \
        if (__builtin_expect(large, 0))                                                     \
            for (int l = 0; l < 16; l++)                                                    \
                if (fabsf(x[l]) >= 2.0e8f) v[l] = scalar(x[l]);                             \
        return v;                                                                           \
    }
KF_VTRIG(kf_vsin, kf_sin_reduced, kf_sin)
KF_VTRIG(kf_vcos, kf_cos_reduced, kf_cos)

KF_INLINE kf_f32x16 kf_vsoftplus(kf_f32x16 x) {
    kf_f32x16 v = kf_vsel(x > 0.0f, x, kf_vsplat(0.0f)) + kf_vlog1p(kf_vexp(-kf_vabs(x)));
    return kf_vsel(x != x, x, v);
}
