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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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
#define ERR_NOMEM -1
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

/* ---- Activations in int8: exact integer dot products ------------------------------------------------------
 *
 * llama.cpp's scheme: each activation row is quantized per block of 32 to x = dx * qx (qx int8 in -127..127,
 * dx = max |x| / 127), so a weight block's dot product is integers: for Q4_1,
 *     sum_i (d q_i + m)(dx qx_i) = d dx * sum_i q_i qx_i  +  m * (dx * sum_i qx_i),
 * and for Q8_0 the first term alone. The integer sums are exact, whatever instructions compute them. The
 * floats are then added in one order:
 *   - 16 lanes: lanes 0-7 take the even blocks, 8-15 the odd ones; lane l of block b adds the integer sum of
 *     its elements 4l..4l+3 times (d * dx) with one fused multiply-add, blocks in order;
 *   - 16 more (Q4_1): block b adds m * (dx * sum qx) to lane b % 16, blocks in order;
 *   - each set summed: lanes i and i + 8, then halves (4, 2, 1); the first sum plus the second.
 * So the result is bitwise the same on AVX-512 VNNI, AVX2 and the plain C path, and a row's result does not
 * depend on its batch. */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define I8_PATH 2
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define I8_PATH 1
#else
#define I8_PATH 0
#endif

typedef struct { /* rows quantized per block: qx (rows, k) int8; per row and block: dx, dx * sum(qx) and dx
                  * repeated 8 times (the vector paths' scale operand) */
    int8_t *qx;
    float *dx, *dsx, *dx8;
} Int8Rows;

/* qx = x / dx rounded half away from zero, as sign(v) * trunc(|v| + 0.5) in fp32 (branch-free, so it
 * vectorizes; `roundf` was a library call per value), at most 127 in magnitude. */
static void quantize_rows(const float *x, long row_blocks, Int8Rows r, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && row_blocks >= 256)
    for (long rb = 0; rb < row_blocks; rb++) {
        const float *xb = x + rb * 32;
        int q[32] __attribute__((aligned(32))), sum = 0;
#if I8_PATH >= 1
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 xs[4], top = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            xs[j] = _mm256_loadu_ps(xb + 8 * j);
            top = _mm256_max_ps(top, _mm256_andnot_ps(sign, xs[j]));
        }
        __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
        float amax = _mm_cvtss_f32(_mm_max_ss(t4, _mm_shuffle_ps(t4, t4, 1)));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 4; j++) {
            __m256 v = _mm256_mul_ps(xs[j], _mm256_set1_ps(id));
            __m256 a = _mm256_min_ps(_mm256_add_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(0.5f)), _mm256_set1_ps(127.0f));
            __m256i qi = _mm256_cvttps_epi32(a), neg = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
            _mm256_store_si256((__m256i *)(q + 8 * j), _mm256_sub_epi32(_mm256_xor_si256(qi, neg), neg));
        }
#else
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = xb[i] * id, a = fminf(fabsf(v) + 0.5f, 127.0f);
            q[i] = v < 0.0f ? -(int)a : (int)a;
        }
#endif
        for (int i = 0; i < 32; i++) {
            r.qx[rb * 32 + i] = (int8_t)q[i];
            sum += q[i];
        }
        r.dx[rb] = d;
        r.dsx[rb] = d * (float)sum;
        for (int i = 0; i < 8; i++) r.dx8[rb * 8 + i] = d;
    }
}

static inline float halves16(const float *t) { /* lanes i and i + 8, then halves */
    float u[8];
    for (int i = 0; i < 8; i++) u[i] = t[i] + t[i + 8];
    for (int w = 4; w > 0; w >>= 1)
        for (int i = 0; i < w; i++) u[i] += u[i + w];
    return u[0];
}

#if I8_PATH >= 1
static inline float halves8_256(__m256 t) { /* 8 lanes: i + i+4, then + 2, then + 1 (as `halves16`) */
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

static inline float halves16_256(__m256 lo, __m256 hi) { return halves8_256(_mm256_add_ps(lo, hi)); }
#endif
#if I8_PATH == 2
static inline float halves16_512(__m512 t) {
    return halves16_256(_mm512_castps512_ps256(t), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)));
}
#endif

/* The m terms of a Q4_1 column for one row: lane b % 16 += m[b] * dsx[b], then `halves16`. */
static inline float m_terms(const float *m, const float *dsx, int blocks) {
    float t[16] = {0};
    for (int b0 = 0; b0 < blocks; b0 += 16)
        for (int l = 0; l < 16 && b0 + l < blocks; l++) t[l] = fmaf(m[b0 + l], dsx[b0 + l], t[l]);
    return halves16(t);
}

#if I8_PATH == 2
#define COLS 4  /* output columns per register tile: COLS * TROWS accumulators, COLS weight vectors */
#define TROWS 4 /* rows per register tile */

/* Rows [r0, r0 + NR) of output columns [n0, n0 + NC) from int8 rows: each pair of weight blocks is unpacked
 * once for NR rows and each row's activations loaded once for NC columns. Every (row, column) element gets
 * the operations of the one-column loop in the same order, so the tile's shape changes no bit. */
static inline __attribute__((always_inline)) void tile_i8(int fmt, const int NC, const int NR, Int8Rows in,
                                                          const uint8_t *q, const float *d, const float *m,
                                                          const float *bias, float *y, int r0, int k, int n0,
                                                          int n_out) {
    int blocks = k / 32;
    __m512 acc[COLS][TROWS];
    for (int c = 0; c < NC; c++)
        for (int e = 0; e < NR; e++) acc[c][e] = _mm512_setzero_ps();
    const __m512i c128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int b = 0; b < blocks; b += 2) {
        int two = b + 1 < blocks; /* a last odd block runs alone in lanes 0-7, the others scaled by 0 */
        __m512i w[COLS];
        __m512 dw[COLS];
        for (int c = 0; c < NC; c++) {
            long wb = (long)(n0 + c) * blocks + b;
            if (fmt == Q4_1) {
                __m256i raw = two ? _mm256_loadu_si256((const __m256i *)(q + wb * 16))
                                  : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(q + wb * 16)));
                __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                w[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20)),
                                          two ? _mm256_permute2x128_si256(lo, hi, 0x31) : _mm256_setzero_si256(), 1);
            } else {
                w[c] = two ? _mm512_loadu_si512(q + wb * 32)
                           : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(q + wb * 32)));
                w[c] = _mm512_xor_si512(w[c], c128); /* s8 -> u8 (+ 128), corrected below */
            }
            dw[c] = _mm512_insertf32x8(_mm512_set1_ps(d[wb]), _mm256_set1_ps(two ? d[wb + 1] : 0.0f), 1);
        }
        for (int e = 0; e < NR; e++) {
            long rb = (long)(r0 + e) * blocks + b;
            __m512i xv = two ? _mm512_loadu_si512(in.qx + rb * 32)
                             : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(in.qx + rb * 32)));
            __m512 dxv = two ? _mm512_loadu_ps(in.dx8 + rb * 8) : _mm512_zextps256_ps512(_mm256_loadu_ps(in.dx8 + rb * 8));
            /* Q8_0: (w + 128) . x - 128 . x, the second term once per row (exact integers either way) */
            __m512i start = fmt == Q8_0 ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c128, xv)) : zero;
            for (int c = 0; c < NC; c++)
                acc[c][e] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w[c], xv)),
                                            _mm512_mul_ps(dw[c], dxv), acc[c][e]);
        }
    }
    for (int c = 0; c < NC; c++) {
        int n = n0 + c;
        long b0 = (long)n * blocks;
        for (int e = 0; e < NR; e++) {
            __m512 mt = _mm512_setzero_ps(); /* the m terms, lane b % 16 */
            if (fmt == Q4_1) {
                const float *dsx = in.dsx + (long)(r0 + e) * blocks;
                for (int b = 0; b < blocks; b += 16) {
                    __mmask16 live = blocks - b >= 16 ? 0xFFFF : (__mmask16)((1u << (blocks - b)) - 1);
                    mt = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(live, m + b0 + b),
                                               _mm512_maskz_loadu_ps(live, dsx + b), mt, live);
                }
            }
            float s = halves16_512(acc[c][e]) + halves16_512(mt);
            y[(long)(r0 + e) * n_out + n] = bias ? s + bias[n] : s;
        }
    }
}

#elif I8_PATH == 1
/* AVX2 has 16 vector registers, and its products (two instructions per block, a conversion, a multiply and
 * a multiply-add) leave several rows compute-bound whatever the tile: one row runs two columns at a time
 * (42 -> 34 us for a 1536 x 576 Q4_1 product on one thread, scripts/quant_matmul_bench.c), more rows one
 * column at a time, four rows per tile (2 x 2 tiles measured 4% slower for 16 rows). */
#define COLS 2
#define TROWS 4

/* As the AVX-512 tile, with 8-float halves: lanes 0-7 of an element take the even blocks, 8-15 the odd. */
static inline __attribute__((always_inline)) void tile_i8(int fmt, const int NC, const int NR, Int8Rows in,
                                                          const uint8_t *q, const float *d, const float *m,
                                                          const float *bias, float *y, int r0, int k, int n0,
                                                          int n_out) {
    int blocks = k / 32;
    __m256 acc[COLS][TROWS][2];
    for (int c = 0; c < NC; c++)
        for (int e = 0; e < NR; e++) acc[c][e][0] = acc[c][e][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < blocks; b++) {
        __m256i w[COLS];
        __m256 dw[COLS];
        for (int c = 0; c < NC; c++) {
            long wb = (long)(n0 + c) * blocks + b;
            if (fmt == Q4_1) {
                __m128i raw = _mm_loadu_si128((const __m128i *)(q + wb * 16));
                __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
                __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
                w[c] = _mm256_set_m128i(hi, lo);
            } else {
                w[c] = _mm256_loadu_si256((const __m256i *)(q + wb * 32));
            }
            dw[c] = _mm256_set1_ps(d[wb]);
        }
        for (int e = 0; e < NR; e++) {
            long rb = (long)(r0 + e) * blocks + b;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(in.qx + rb * 32));
            __m256 dxv = _mm256_loadu_ps(in.dx8 + rb * 8);
            for (int c = 0; c < NC; c++) {
                __m256i p16 = fmt == Q4_1 ? _mm256_maddubs_epi16(w[c], xv)
                                          /* |w| times x with w's sign: unsigned times signed, as maddubs needs */
                                          : _mm256_maddubs_epi16(_mm256_sign_epi8(w[c], w[c]), _mm256_sign_epi8(xv, w[c]));
                __m256i dot = _mm256_madd_epi16(p16, ones);
                acc[c][e][b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw[c], dxv), acc[c][e][b & 1]);
            }
        }
    }
    for (int c = 0; c < NC; c++) {
        int n = n0 + c;
        long b0 = (long)n * blocks;
        for (int e = 0; e < NR; e++) {
            __m256 mt0 = _mm256_setzero_ps(), mt1 = _mm256_setzero_ps(); /* the m terms, lane b % 16 */
            if (fmt == Q4_1) {
                const float *dsx = in.dsx + (long)(r0 + e) * blocks;
                int b = 0;
                for (; b + 16 <= blocks; b += 16) {
                    mt0 = _mm256_fmadd_ps(_mm256_loadu_ps(m + b0 + b), _mm256_loadu_ps(dsx + b), mt0);
                    mt1 = _mm256_fmadd_ps(_mm256_loadu_ps(m + b0 + b + 8), _mm256_loadu_ps(dsx + b + 8), mt1);
                }
                float t[16] __attribute__((aligned(32)));
                _mm256_store_ps(t, mt0);
                _mm256_store_ps(t + 8, mt1);
                for (int l = 0; b + l < blocks; l++) t[l] = fmaf(m[b0 + b + l], dsx[b + l], t[l]);
                mt0 = _mm256_load_ps(t);
                mt1 = _mm256_load_ps(t + 8);
            }
            float s = halves16_256(acc[c][e][0], acc[c][e][1]) + halves16_256(mt0, mt1);
            y[(long)(r0 + e) * n_out + n] = bias ? s + bias[n] : s;
        }
    }
}
#endif

#if I8_PATH >= 1
/* Every row of output columns [n0, n0 + NC), TROWS at a time. */
static inline __attribute__((always_inline)) void cols_i8(int fmt, const int NC, Int8Rows in, const uint8_t *q,
                                                          const float *d, const float *m, const float *bias, float *y,
                                                          int rows, int k, int n0, int n_out) {
    int r0 = 0;
    for (; r0 + TROWS <= rows; r0 += TROWS) tile_i8(fmt, NC, TROWS, in, q, d, m, bias, y, r0, k, n0, n_out);
    switch (rows - r0) {
    case 3: if (TROWS > 3) tile_i8(fmt, NC, 3, in, q, d, m, bias, y, r0, k, n0, n_out); break;
    case 2: tile_i8(fmt, NC, 2, in, q, d, m, bias, y, r0, k, n0, n_out); break;
    case 1: tile_i8(fmt, NC, 1, in, q, d, m, bias, y, r0, k, n0, n_out); break;
    default: break;
    }
}

/* The columns a tile takes. One row (a decode step) reads its weights from memory: two columns at a time stream
 * them fastest (a 300000 x 576 Q4_1 product, 97 MB, two threads, AVX-512: one column 2.52 ms, two 2.46, four
 * 3.10). Several rows: COLS on AVX-512, one column on AVX2 (above). */
static inline int tile_cols(int rows) { return rows == 1 ? 2 : I8_PATH == 1 ? 1 : COLS; }

/* Output columns [n0, n0 + tile_cols(rows)) (fewer at the end of the matrix). */
static inline __attribute__((always_inline)) void tile_cols_i8(int fmt, Int8Rows in, const uint8_t *q, const float *d,
                                                               const float *m, const float *bias, float *y, int rows,
                                                               int k, int n0, int n_out) {
    int cols = tile_cols(rows);
    switch (n_out - n0 >= cols ? cols : n_out - n0) {
    case 4: if (COLS >= 4) cols_i8(fmt, 4, in, q, d, m, bias, y, rows, k, n0, n_out); break;
    case 3: if (COLS >= 3) cols_i8(fmt, 3, in, q, d, m, bias, y, rows, k, n0, n_out); break;
    case 2: cols_i8(fmt, 2, in, q, d, m, bias, y, rows, k, n0, n_out); break;
    case 1: cols_i8(fmt, 1, in, q, d, m, bias, y, rows, k, n0, n_out); break;
    default: break;
    }
}
#else
/* Rows [r0, r0 + NR) of output column n from int8 rows. */
static inline __attribute__((always_inline)) void column_i8(int fmt, const int NR, Int8Rows in, const uint8_t *q,
                                                            const float *d, const float *m, const float *bias,
                                                            float *y, int r0, int k, int n, int n_out) {
    int blocks = k / 32;
    long b0 = (long)n * blocks;
    float lanes[ROWS][16] __attribute__((aligned(64)));
    for (int e = 0; e < NR; e++)
        for (int l = 0; l < 16; l++) lanes[e][l] = 0.0f;
    for (int b = 0; b < blocks; b++) {
        int w[32];
        if (fmt == Q4_1)
            for (int i = 0; i < 16; i++) {
                w[i] = q[(b0 + b) * 16 + i] & 0x0F;
                w[i + 16] = q[(b0 + b) * 16 + i] >> 4;
            }
        else
            for (int i = 0; i < 32; i++) w[i] = (int8_t)q[(b0 + b) * 32 + i];
        for (int e = 0; e < NR; e++) {
            long rb = (long)(r0 + e) * blocks + b;
            float scale = d[b0 + b] * in.dx[rb];
            for (int l = 0; l < 8; l++) {
                int dot = 0;
                for (int i = 4 * l; i < 4 * l + 4; i++) dot += w[i] * in.qx[rb * 32 + i];
                lanes[e][(b & 1) * 8 + l] = fmaf((float)dot, scale, lanes[e][(b & 1) * 8 + l]);
            }
        }
    }
    for (int e = 0; e < NR; e++) {
        float s = halves16(lanes[e]);
        if (fmt == Q4_1) s += m_terms(m + b0, in.dsx + (long)(r0 + e) * blocks, blocks);
        y[(long)(r0 + e) * n_out + n] = bias ? s + bias[n] : s;
    }
}

static inline __attribute__((always_inline)) void rows_of_i8(int fmt, Int8Rows in, const uint8_t *q, const float *d,
                                                             const float *m, const float *bias, float *y, int rows,
                                                             int k, int n, int n_out) {
    int r0 = 0;
    for (; r0 + ROWS <= rows; r0 += ROWS) column_i8(fmt, ROWS, in, q, d, m, bias, y, r0, k, n, n_out);
    switch (rows - r0) {
    case 3: column_i8(fmt, 3, in, q, d, m, bias, y, r0, k, n, n_out); break;
    case 2: column_i8(fmt, 2, in, q, d, m, bias, y, r0, k, n, n_out); break;
    case 1: column_i8(fmt, 1, in, q, d, m, bias, y, r0, k, n, n_out); break;
    default: break;
    }
}
#endif

/* `quant_matmul` with the rows first quantized to int8 blocks: y (rows, n_out) fp32. */
int quant_matmul_i8(int fmt, const float *x, const uint8_t *q, const float *d, const float *m, const float *bias,
                    float *y, int rows, int k, int n_out, int threads) {
    if ((fmt != Q4_1 && fmt != Q8_0) || k <= 0 || k % 32 || rows < 0 || n_out < 0 || threads < 1) return ERR_SHAPE;
    if (fmt == Q4_1 && !m) return ERR_SHAPE;
    long row_blocks = (long)rows * (k / 32);
    /* + 1 block of slack each: the vector paths read 64 bytes where a last odd block holds 32 */
    int8_t *qx = malloc((size_t)(row_blocks + 1) * 32);
    float *f = malloc(sizeof(float) * (size_t)(row_blocks + 1) * 10);
    if (!qx || !f) {
        free(qx);
        free(f);
        return ERR_NOMEM;
    }
    Int8Rows in = {qx, f, f + row_blocks + 1, f + 2 * (row_blocks + 1)};
    quantize_rows(x, row_blocks, in, threads);
#if I8_PATH >= 1
    if (fmt == Q4_1) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int n0 = 0; n0 < n_out; n0 += tile_cols(rows))
            tile_cols_i8(Q4_1, in, q, d, m, bias, y, rows, k, n0, n_out);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int n0 = 0; n0 < n_out; n0 += tile_cols(rows))
            tile_cols_i8(Q8_0, in, q, d, m, bias, y, rows, k, n0, n_out);
    }
#else
    if (fmt == Q4_1) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int n = 0; n < n_out; n++) rows_of_i8(Q4_1, in, q, d, m, bias, y, rows, k, n, n_out);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int n = 0; n < n_out; n++) rows_of_i8(Q8_0, in, q, d, m, bias, y, rows, k, n, n_out);
    }
#endif
    free(qx);
    free(f);
    return 0;
}
