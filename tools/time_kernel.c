/* Times one dumped kfuse kernel on one thread, outside kfuse: the harness behind the per-element
 * figures of docs/benchmarks.md for vector bodies.
 *
 *   kfuse explain --dump /tmp/k examples/softplus.kf
 *   gcc -O3 -march=native -mprefer-vector-width=512 -ffp-contract=fast -fassociative-math \
 *       -freciprocal-math -fno-signed-zeros -fno-trapping-math -fwrapv -fno-math-errno \
 *       -fschedule-insns tools/time_kernel.c /tmp/k/3-k0.c -o /tmp/time_kernel -lm
 *   /tmp/time_kernel 8192 200 100      # in cache: best of 200 rounds of 100 calls
 *   /tmp/time_kernel 16777216 8 1      # from memory: best of 8 single calls
 *
 * (the flags are those of fast numerics, `crates/kfuse-cpu/src/compile.rs`). The kernel must
 * read one f32 argument and write one, over an inner range (an elementwise kernel of one input
 * and one output); with ROWS=r it is called over r rows of N / r instead (a row kernel). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void kfuse_kernel(void **args, int64_t o_lo, int64_t o_hi, int64_t j_lo, int64_t j_hi);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s ELEMENTS ROUNDS CALLS_PER_ROUND\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]), rounds = atol(argv[2]), calls = atol(argv[3]);
    const char *rows_env = getenv("ROWS");
    long rows = rows_env ? atol(rows_env) : 1;
    if (n <= 0 || rounds <= 0 || calls <= 0 || rows <= 0 || n % rows != 0) {
        fprintf(stderr, "ELEMENTS, ROUNDS and CALLS must be positive, ELEMENTS a multiple of ROWS\n");
        return 2;
    }
    float *x = aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    float *y = aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    if (!x || !y) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    srand(1);
    for (long i = 0; i < n; i++) x[i] = (float)((rand() / (double)RAND_MAX) * 6.0 - 3.0);
    void *args[2] = {x, y};
    long cols = n / rows;
    double best = 1e30;
    for (long r = 0; r < rounds; r++) {
        double t0 = now();
        for (long c = 0; c < calls; c++) {
            if (rows == 1)
                kfuse_kernel(args, 0, 1, 0, n);
            else
                kfuse_kernel(args, 0, rows, 0, cols);
        }
        double t = (now() - t0) / calls / n * 1e9;
        if (t < best) best = t;
    }
    printf("%.4f ns per element (y[7] = %g)\n", best, y[n > 7 ? 7 : 0]);
    return 0;
}
