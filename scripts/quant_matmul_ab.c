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
 * and stops with MISMATCH if any library's output differs from the first's in a single bit. COPIES=C (1) keeps C
 * copies of the weight and multiplies by each in turn: with more bytes than the last-level cache, every call reads
 * its weight from DRAM, as a forward's products do.
 *
 * FORWARD=L: instead of one weight, the products of a forward of the embedded model (SmolLM2-135M) with L layers,
 * each with weights of its own, in a forward's order (q, k, v, o, gate, up, down in Q4_1 a layer; the 49152-row LM
 * head in Q8_0 last; FMT is not read): with L = 30, ~96 MB of blocks a call, read from DRAM as a decode step reads
 * them. A call times the whole sequence; every product's output is compared bit for bit.
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

typedef struct {
    int fmt, n, k;
    uint8_t *q;
    uint16_t *d, *m;
    float *y; /* rows x n: this product's output */
} Weight;

/* A random weight of n x k in `fmt`'s blocks (d = 0.01, m = -0.02 for every block) and its output (rows x n). */
static Weight weight(int fmt, int n, int k, int rows) {
    Weight w = {fmt, n, k, malloc((size_t)n * k), malloc((size_t)n * k / 16), malloc((size_t)n * k / 16),
                malloc(4 * (size_t)rows * n)};
    for (long i = 0; i < (long)n * k; i++) w.q[i] = (uint8_t)rand();
    for (long i = 0; i < (long)n * k / 32; i++) w.d[i] = 0x211F, w.m[i] = 0xA51F; /* fp16 0.01, -0.02 */
    return w;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 20) {
        fprintf(stderr, "usage: %s ROWS FMT ROUNDS LIB.so [LIB.so ...]\n", argv[0]);
        return 2;
    }
    int rows = atoi(argv[1]), fmt = atoi(argv[2]), rounds = atoi(argv[3]), libs = argc - 4;
    int n = setting("N", 1536), k = setting("K", 576), threads = setting("T", 1), reps = setting("REPS", 20);
    int copies = setting("COPIES", 1), layers = setting("FORWARD", 0);
    product f[16];
    for (int v = 0; v < libs; v++) {
        void *h = dlopen(argv[4 + v], RTLD_NOW | RTLD_LOCAL);
        if (!h || !(f[v] = (product)dlsym(h, "quant_matmul_i8"))) {
            fprintf(stderr, "%s: %s\n", argv[4 + v], dlerror());
            return 2;
        }
    }
    srand(1);
    int count = layers ? 7 * layers + 1 : copies, widest = layers ? 1536 : k;
    Weight *w = malloc(sizeof(Weight) * (size_t)count);
    if (layers) {
        static const int shape[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576},
                                        {576, 1536}}; /* n x k: q, k, v, o, gate, up, down */
        for (int l = 0; l < layers; l++)
            for (int p = 0; p < 7; p++) w[7 * l + p] = weight(0, shape[p][0], shape[p][1], rows);
        w[count - 1] = weight(1, 49152, 576, rows);
    } else {
        w[0] = weight(fmt, n, k, rows);
        for (int c = 1; c < copies; c++) { /* the same weight again: every copy gives the same bits */
            w[c] = weight(fmt, n, k, rows);
            memcpy(w[c].q, w[0].q, (size_t)n * k);
        }
    }
    size_t out = 0;
    for (int i = 0; i < count; i++) out += (size_t)rows * w[i].n;
    float *x = malloc(4 * (size_t)rows * widest), *first = malloc(4 * out);
    for (long i = 0; i < (long)rows * widest; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    double *best = calloc((size_t)libs * rounds, sizeof(double));
    long call = 0;
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < libs; v++) {
            double b = 1e9;
            for (int it = 0; it < reps; it++) {
                double t = now();
                if (layers)
                    for (int i = 0; i < count; i++)
                        f[v](w[i].fmt, x, w[i].q, w[i].d, w[i].m, NULL, w[i].y, rows, w[i].k, w[i].n, threads);
                else {
                    Weight *c = &w[call++ % copies];
                    f[v](c->fmt, x, c->q, c->d, c->m, NULL, w[0].y, rows, k, n, threads);
                }
                t = now() - t;
                b = t < b ? t : b;
            }
            best[v * rounds + r] = b;
            size_t at = 0;
            for (int i = 0; i < (layers ? count : 1); i++) {
                size_t size = 4 * (size_t)rows * w[i].n;
                if (r == 0 && v == 0) memcpy((char *)first + at, w[i].y, size);
                else if (memcmp((char *)first + at, w[i].y, size)) {
                    printf("MISMATCH: %s differs from %s\n", argv[4 + v], argv[4]);
                    return 1;
                }
                at += size;
            }
        }
    if (layers) printf("rows %d forward of %d layers threads %d:", rows, layers, threads);
    else printf("rows %d fmt %d %dx%d threads %d%s", rows, fmt, n, k, threads, copies > 1 ? "" : ":");
    if (!layers && copies > 1) printf(" copies %d:", copies);
    for (int v = 0; v < libs; v++) {
        qsort(best + v * rounds, rounds, sizeof(double), by_value);
        printf("  %s %.1f", argv[4 + v], best[v * rounds + rounds / 2] * 1e6);
    }
    printf("  (us: median of %d rounds' best of %d; the same bits)\n", rounds, reps);
    return 0;
}
