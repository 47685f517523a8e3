/* Matrix products straight from a model file's weight blocks (GGUF's Q4_1 and Q8_0), fp32 activations.
 *
 *   y[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]),  w stored in blocks of 32 along k:
 *     q4_1   w = d * q + m, q in 0..15: 16 bytes per block, byte i = q[i] | q[i + 16] << 4; d, m fp32
 *     q8_0   w = d * q,     q in -128..127: 32 bytes per block; d fp32
 *
 * A decode step reads every weight once: these blocks are a fifth of the bytes of fp32 weights. Each block
 * is widened to fp32 once (d * q + m is exact in fp32: d has 11 significant bits, q 4 or 8) and used for
 * up to ROWS rows held in registers.
 *
 * Batch invariance: y[r, n] is computed by one thread with one fixed sequence of fp32 operations that
 * depends only on x[r], w[n] and K: two 16-lane accumulators over the blocks in order (lane l of the
 * first takes k = 32 b + l, of the second k = 32 b + 16 + l, each a multiply-add), added together, then
 * the 16 lanes summed by halves (8, 4, 2, 1). Neither the number of rows, their grouping, the thread
 * count nor the vector unit changes it: a 16-lane vector is one AVX-512 register, two AVX2 or four NEON
 * registers computing the same lanes. So a token's product is bitwise the same in a plain step, in a
 * tree's verification and in a prefill, on every CPU with fused multiply-add (compiled with
 * -ffp-contract=fast, which every x86-64-v3 and AArch64 CPU honours with FMA instructions).
 * Build: cc -O3 -march=native -fopenmp -ffp-contract=fast -shared -fPIC (kernels/quant_ops.py).
 */
#include <stdint.h>
#include <string.h>

/* The lanes: 16-float vectors where the CPU has 512-bit registers, 8-float ones elsewhere (a 16-float type
 * on AVX2 compiles to scalar code in GCC 12). The arithmetic is the same lane for lane: VECS vectors per
 * block, vector j lane l holding k = 32 b + W j + l, and `finish` sums them in one order (below). */
#if defined(__AVX512F__)
#define W 16
#else
#define W 8
#endif
#define VECS (32 / W)
typedef float vec __attribute__((vector_size(4 * W)));
typedef uint8_t bytes __attribute__((vector_size(W)));
typedef int8_t sbytes __attribute__((vector_size(W)));
typedef int32_t ints __attribute__((vector_size(4 * W)));
#define ROWS 4 /* rows per register tile: ROWS * VECS accumulators + VECS weight vectors */
#define ERR_SHAPE -2
enum { Q4_1 = 0, Q8_0 = 1 };
/* bytes -> 32-bit integers -> floats: two steps, which compilers turn into one widening and one conversion
 * (a direct byte-to-float conversion became W scalar conversions in GCC 12) */
#define TO_FLOAT(b) __builtin_convertvector(__builtin_convertvector((b), ints), vec)

/* The fixed reduction of a row's accumulators a[0..31] (lane l of vector j = a[W j + l]): s[i] = (a[i] +
 * a[i + 16]) + (a[i + 8] + a[i + 24]) for i < 8, then s[i] + s[i + 4], + 2, + 1. */
static inline float finish(const vec *acc) {
    float a[32], s[8];
    memcpy(a, acc, sizeof a);
    for (int i = 0; i < 8; i++) s[i] = (a[i] + a[i + 16]) + (a[i + 8] + a[i + 24]);
    for (int w = 4; w > 0; w >>= 1)
        for (int i = 0; i < w; i++) s[i] += s[i + w];
    return s[0];
}

/* The VECS vectors of weight block b of a row, widened to fp32. */
static inline __attribute__((always_inline)) void widen(int fmt, const uint8_t *q, const float *d, const float *m,
                                                        long b, vec *w) {
    if (fmt == Q4_1) {
        for (int j = 0; j < VECS; j++) { /* values 0..15 are the low nibbles of the 16 bytes, 16..31 the high */
            bytes raw;
            memcpy(&raw, q + b * 16 + (W * j) % 16, W);
            raw = j < VECS / 2 ? raw & 0x0F : raw >> 4;
            w[j] = d[b] * TO_FLOAT(raw) + m[b];
        }
    } else {
        for (int j = 0; j < VECS; j++) {
            sbytes raw;
            memcpy(&raw, q + b * 32 + W * j, W);
            w[j] = d[b] * TO_FLOAT(raw);
        }
    }
}

/* Rows [r0, r0 + NR) of output column n: NR is a constant in each copy, so the accumulators live in
 * registers. */
static inline __attribute__((always_inline)) void column(int fmt, const int NR, const float *x, const uint8_t *q,
                                                         const float *d, const float *m, const float *bias, float *y,
                                                         int r0, int k, int n, int n_out) {
    int blocks = k / 32;
    long b0 = (long)n * blocks;
    vec acc[ROWS][VECS];
    for (int e = 0; e < NR; e++)
        for (int j = 0; j < VECS; j++) acc[e][j] = (vec){0};
    for (int b = 0; b < blocks; b++) {
        vec w[VECS];
        widen(fmt, q, d, m, b0 + b, w);
        for (int e = 0; e < NR; e++) {
            const float *xr = x + (long)(r0 + e) * k + 32 * b;
            for (int j = 0; j < VECS; j++) {
                vec xj;
                memcpy(&xj, xr + W * j, sizeof xj);
                acc[e][j] += xj * w[j];
            }
        }
    }
    for (int e = 0; e < NR; e++) {
        float s = finish(acc[e]);
        y[(long)(r0 + e) * n_out + n] = bias ? s + bias[n] : s;
    }
}

/* Every row of output column n, ROWS at a time. */
static inline __attribute__((always_inline)) void rows_of(int fmt, const float *x, const uint8_t *q, const float *d,
                                                          const float *m, const float *bias, float *y, int rows,
                                                          int k, int n, int n_out) {
    int r0 = 0;
    for (; r0 + ROWS <= rows; r0 += ROWS) column(fmt, ROWS, x, q, d, m, bias, y, r0, k, n, n_out);
    switch (rows - r0) {
    case 3: column(fmt, 3, x, q, d, m, bias, y, r0, k, n, n_out); break;
    case 2: column(fmt, 2, x, q, d, m, bias, y, r0, k, n, n_out); break;
    case 1: column(fmt, 1, x, q, d, m, bias, y, r0, k, n, n_out); break;
    default: break;
    }
}

/* y (rows, n_out) = x (rows, k) w^T (+ bias), w (n_out, k) in `fmt` blocks: q (n_out * k / 32 blocks of 16
 * or 32 bytes), d and m (fp32 per block; m unused for Q8_0). Columns are shared among `threads` threads. */
int quant_matmul(int fmt, const float *x, const uint8_t *q, const float *d, const float *m, const float *bias,
                 float *y, int rows, int k, int n_out, int threads) {
    if ((fmt != Q4_1 && fmt != Q8_0) || k <= 0 || k % 32 || rows < 0 || n_out < 0 || threads < 1) return ERR_SHAPE;
    if (fmt == Q4_1 && !m) return ERR_SHAPE;
    if (fmt == Q4_1) { /* one copy of the loops per format, the format a constant in each */
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int n = 0; n < n_out; n++) rows_of(Q4_1, x, q, d, m, bias, y, rows, k, n, n_out);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int n = 0; n < n_out; n++) rows_of(Q8_0, x, q, d, m, bias, y, rows, k, n, n_out);
    }
    return 0;
}
