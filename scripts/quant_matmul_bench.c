/* Time one Q4_1 product of kernels/quant_ops.c in isolation (no Python): the harness behind the kernel figures
 * of docs/performance.md entry 24.
 *
 *   cc -O3 -march=native -fopenmp -ffp-contract=fast scripts/quant_matmul_bench.c kernels/quant_ops.c -lm \
 *      -o /tmp/qbench && /tmp/qbench ROWS THREADS [int8] [N]
 *
 * (-march=haswell for the AVX2 build; -DAVX512_TILE_ROWS=N tries another row tile on AVX-512, 6 by default.) A random 1536 x 576 weight (N x 576 with N), ROWS random rows; prints
 * the best of 200 calls in microseconds, with fp32 activations or, given "int8", int8 ones.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int quant_matmul(int fmt, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, const float *bias,
                 float *y, int rows, int k, int n_out, int threads);
int quant_matmul_i8(int fmt, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, const float *bias,
                    float *y, int rows, int k, int n_out, int threads);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ROWS THREADS [int8] [N]\n", argv[0]);
        return 2;
    }
    int rows = atoi(argv[1]), threads = atoi(argv[2]), int8 = argc > 3 && !strcmp(argv[3], "int8");
    int k = 576, n = argc > 4 ? atoi(argv[4]) : 1536;
    uint8_t *q = malloc((size_t)n * k / 2);
    uint16_t *d = malloc(sizeof(uint16_t) * n * k / 32), *m = malloc(sizeof(uint16_t) * n * k / 32);
    float *x = malloc(sizeof(float) * rows * k), *y = malloc(sizeof(float) * rows * n);
    for (long i = 0; i < (long)n * k / 2; i++) q[i] = (uint8_t)rand();
    for (long i = 0; i < (long)n * k / 32; i++) d[i] = 0x211F, m[i] = 0xA51F; /* fp16 0.01, -0.02 */
    for (long i = 0; i < (long)rows * k; i++) x[i] = rand() / (float)RAND_MAX;
    double best = 1e9;
    for (int it = 0; it < 200; it++) {
        double t = now();
        if (int8)
            quant_matmul_i8(0, x, q, d, m, NULL, y, rows, k, n, threads);
        else
            quant_matmul(0, x, q, d, m, NULL, y, rows, k, n, threads);
        t = now() - t;
        best = t < best ? t : best;
    }
    printf("rows %d threads %d %s: %.1f us\n", rows, threads, int8 ? "int8" : "fp32", best * 1e6);
    free(q), free(d), free(m), free(x), free(y);
    return 0;
}
