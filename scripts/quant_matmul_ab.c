/* Versions of kernels/quant_ops.c's int8 product side by side, interleaved, in C alone: the harness behind
 * docs/performance.md entry 53.
 *
 *   git show REV:kernels/quant_ops.c > old.c
 *   cc -O3 -march=native -fopenmp -ffp-contract=fast -shared -fPIC old.c -o old.so -lm
 *   cc -O3 -march=native -fopenmp -ffp-contract=fast -shared -fPIC kernels/quant_ops.c -o new.so -lm
 *   cc -O2 scripts/quant_matmul_ab.c -o ab -ldl && ./ab ROWS FMT ROUNDS ./old.so ./new.so
 *
 * FMT 0 is Q4_1 (the embedded model's linears), 1 Q8_0 (its embedding, the LM head). A random N x K weight
 * (1536 x 576 unless N= or K= is set: the MLP's up product), ROWS random rows, T= threads (1). Each round times
 * every library in turn (the best of REPS= calls, 20); prints each one's median over the rounds in microseconds,
 * and stops with MISMATCH if any library's output differs from the first's in a single bit.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*product)(int, const float *, const uint8_t *, const uint16_t *, const uint16_t *, const float *,
                       float *, int, int, int, int);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int setting(const char *name, int fallback) { return getenv(name) ? atoi(getenv(name)) : fallback; }

int main(int argc, char **argv) {
    if (argc < 5 || argc > 20) {
        fprintf(stderr, "usage: %s ROWS FMT ROUNDS LIB.so [LIB.so ...]\n", argv[0]);
        return 2;
    }
    int rows = atoi(argv[1]), fmt = atoi(argv[2]), rounds = atoi(argv[3]), libs = argc - 4;
    int n = setting("N", 1536), k = setting("K", 576), threads = setting("T", 1), reps = setting("REPS", 20);
    product f[16];
    for (int v = 0; v < libs; v++) {
        void *h = dlopen(argv[4 + v], RTLD_NOW | RTLD_LOCAL);
        if (!h || !(f[v] = (product)dlsym(h, "quant_matmul_i8"))) {
            fprintf(stderr, "%s: %s\n", argv[4 + v], dlerror());
            return 2;
        }
    }
    uint8_t *q = malloc((size_t)n * k);
    uint16_t *d = malloc(2 * (size_t)n * k / 32), *m = malloc(2 * (size_t)n * k / 32);
    float *x = malloc(4 * (size_t)rows * k), *y = malloc(4 * (size_t)rows * n), *first = malloc(4 * (size_t)rows * n);
    double *best = calloc((size_t)libs * rounds, sizeof(double));
    srand(1);
    for (long i = 0; i < (long)n * k; i++) q[i] = (uint8_t)rand();
    for (long i = 0; i < (long)n * k / 32; i++) d[i] = 0x211F, m[i] = 0xA51F; /* fp16 0.01, -0.02 */
    for (long i = 0; i < (long)rows * k; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < libs; v++) {
            double b = 1e9;
            for (int it = 0; it < reps; it++) {
                double t = now();
                f[v](fmt, x, q, d, m, NULL, y, rows, k, n, threads);
                t = now() - t;
                b = t < b ? t : b;
            }
            best[v * rounds + r] = b;
            if (r == 0 && v == 0) memcpy(first, y, 4 * (size_t)rows * n);
            else if (memcmp(first, y, 4 * (size_t)rows * n)) {
                printf("MISMATCH: %s differs from %s\n", argv[4 + v], argv[4]);
                return 1;
            }
        }
    printf("rows %d fmt %d %dx%d threads %d:", rows, fmt, n, k, threads);
    for (int v = 0; v < libs; v++) {
        qsort(best + v * rounds, rounds, sizeof(double), by_value);
        printf("  %s %.1f", argv[4 + v], best[v * rounds + rounds / 2] * 1e6);
    }
    printf("  (us: median of %d rounds' best of %d; the same bits)\n", rounds, reps);
    return 0;
}
