/* Checks that the clamped kf_exp / kf_exp2 of crates/kfuse-cpu/src/c/kfuse_math.h equal the
 * direct form of crates/kfuse-math/src/exp_log.rs (special results by selects) bit for bit on
 * all 2^32 f32 inputs. Strict-mode flags, as kfuse compiles strict kernels:
 *
 *   gcc -O3 -march=native -ffp-contract=off -fno-math-errno -fwrapv tools/exhaustive_exp.c -lm \
 *       -o /tmp/exhaustive_exp && /tmp/exhaustive_exp
 *
 * (about a minute on one core). Prints the first mismatches and their count; exits 1 on any. */
#include "../crates/kfuse-cpu/src/c/kfuse_math.h"
#include <stdio.h>

/* exp_log.rs: NaN -> x, x > EXP_MAX -> inf, x < EXP_MIN -> 0, else scale(exp_reduced(r), k). */
static float direct_exp(float x) {
    float k = rintf(x * KF_LOG2_E);
    float r = x - k * KF_LN2_HI - k * KF_LN2_LO;
    float v = kf_scale(kf_exp_reduced(r), kf_round_i32(k, -160.0f, 160.0f));
    v = x < KF_EXP_MIN ? 0.0f : v;
    v = x > KF_EXP_MAX ? INFINITY : v;
    return x != x ? x : v;
}

static float direct_exp2(float x) {
    float k = rintf(x);
    float f = x - k;
    float r = f * KF_LN2_HI + f * KF_LN2_LO;
    float v = kf_scale(kf_exp_reduced(r), kf_round_i32(k, -160.0f, 160.0f));
    v = x < -151.0f ? 0.0f : v;
    v = x >= 128.0f ? INFINITY : v;
    return x != x ? x : v;
}

#define N (1 << 16)
static float in[N], a[N], b[N];

static uint64_t check(const char *name, float (*direct)(float), int which) {
    uint64_t bad = 0;
    for (uint64_t hi = 0; hi < (1u << 16); hi++) {
        for (uint32_t lo = 0; lo < N; lo++) in[lo] = kf_f32_from_bits((uint32_t)(hi << 16) | lo);
        for (int i = 0; i < N; i++) a[i] = direct(in[i]);
        if (which == 0)
            for (int i = 0; i < N; i++) b[i] = kf_exp(in[i]);
        else
            for (int i = 0; i < N; i++) b[i] = kf_exp2(in[i]);
        for (int i = 0; i < N; i++)
            if (kf_f32_bits(a[i]) != kf_f32_bits(b[i])) {
                if (bad < 10) printf("%s(%a): direct %a, kfuse_math.h %a\n", name, in[i], a[i], b[i]);
                bad++;
            }
    }
    printf("%s: %llu mismatches over 2^32 inputs\n", name, (unsigned long long)bad);
    return bad;
}

int main(void) {
    uint64_t bad = check("exp", direct_exp, 0) + check("exp2", direct_exp2, 1);
    return bad != 0;
}
