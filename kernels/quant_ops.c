/* Matrix products straight from a model file's weight blocks (GGUF's Q4_1 and Q8_0).
 *
 *   y[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n]),  w stored in blocks of 32 along k:
 *     q4_1   w = d * q + m, q in 0..15; d, m fp16 (as the file stores them)
 *     q8_0   w = d * q,     q in -128..127; d fp16
 *
 * A decode step reads every weight once: these blocks are a fifth of the bytes of fp32 weights.
 *
 * Layout: the output columns in groups of 16 (a weight with n not a multiple of 16 is padded with zero
 * columns), each vector lane one column. Per group g and block b, contiguously:
 *   q4_1   q: 256 bytes; byte 64 j + 4 c + t = byte 4 j + t of column 16 g + c's block (j < 4), where a
 *          block's byte i holds q[i] in its low nibble and q[i + 16] in its high one;
 *   q8_0   q: 512 bytes; byte 64 j + 4 c + t = q[4 j + t] of column 16 g + c's block (j < 8);
 *   d, m   16 fp16 each, lane c = column 16 g + c's: 20 bytes a Q4_1 block, 34 a Q8_0 one, as in the file;
 *          each is widened to fp32 exactly where it is used.
 * So four bytes of one column share a 32-bit lane: an integer dot product instruction (AVX-512 VNNI
 * `vpdpbusd`, AVX2 `vpmaddubsw`) multiplies them by four activation bytes broadcast to every lane and
 * adds them in that lane, sixteen columns at once, and a block's float work is one vector per row for
 * sixteen columns. The weights stream from memory in one run per thread.
 *
 * Batch invariance: y[r, n] is computed by one thread with one fixed sequence of fp32 operations that
 * depends only on x[r], w[n] and K (each product's comment gives it). Neither the number of rows, their
 * grouping, the thread count nor the vector unit changes it: a lane is a column on AVX-512, AVX2 and the
 * plain C path alike. So a token's product is bitwise the same in a plain step, in a tree's verification
 * and in a prefill, on every CPU with fused multiply-add (compiled with -ffp-contract=fast, which every
 * x86-64-v3 and AArch64 CPU honours with FMA instructions).
 * Build: cc -O3 -march=native -fopenmp -ffp-contract=fast -shared -fPIC (kernels/quant_ops.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#define GROUP 16 /* columns per group: the lanes */
#ifndef QUANT_PREFETCH
#define QUANT_PREFETCH 1 /* how many groups ahead the AVX2 products ask for weights (`prefetch_block`; 0: none, a
                          * measurement's override; docs/performance.md entry 70: 1, 2 and 3 measured alike) */
#endif
#define ERR_SHAPE -2
#define ERR_NOMEM -1
enum { Q4_1 = 0, Q8_0 = 1 };

static inline long block_bytes(int fmt) { return fmt == Q4_1 ? 256 : 512; } /* one block of a group's q */

/* An fp16 value widened to fp32 (exact): what F16C's `vcvtph2ps` does, for the plain C path. */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7F800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* n fp16 values widened to fp32 (F16C's conversion where the CPU has it: every AVX2 and AVX-512 CPU). */
static inline void widen_halves(const uint16_t *h, float *out, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) out[i] = half_to_float(h[i]);
}

/* Column c of group block gb: its 32 integer values q (Q4_1: 0..15, Q8_0: -128..127). */
static inline void column_values(int fmt, const uint8_t *q, long gb, int c, int *v) {
    const uint8_t *p = q + gb * block_bytes(fmt);
    for (int i = 0; i < 32; i++) {
        if (fmt == Q4_1) {
            uint8_t byte = p[64 * ((i % 16) / 4) + 4 * c + i % 4];
            v[i] = i < 16 ? byte & 0x0F : byte >> 4;
        } else {
            v[i] = (int8_t)p[64 * (i / 4) + 4 * c + i % 4];
        }
    }
}

/* ---- fp32 activations --------------------------------------------------------------------------------------
 *
 * Each block is widened to fp32 once (d * q + m is exact in fp32: d has 11 significant bits, q 4 or 8) for
 * up to FROWS rows. The order, for each element: two accumulators a0, a1 over k in order, a[k % 2] =
 * fma(x[k], w[k], a[k % 2]), then y = a0 + a1 (+ bias). */

/* W-float vectors: 16 where the CPU has 512-bit registers, 8 elsewhere (a 16-float type on AVX2 compiles to
 * scalar code in GCC 12); a group is GROUP / W of them. */
#if defined(__AVX512F__)
#define W 16
#else
#define W 8
#endif
typedef float vec __attribute__((vector_size(4 * W)));
typedef int32_t ints __attribute__((vector_size(4 * W)));
#define FROWS 4

/* Element i of a block for lanes [W h, W h + W) of group block gb, widened to fp32. */
static inline __attribute__((always_inline)) vec widen(int fmt, const uint8_t *q, vec dv, vec mv, long gb, int h,
                                                       int i) {
    ints raw, v;
    if (fmt == Q4_1) {
        memcpy(&raw, q + gb * 256 + 64 * ((i % 16) / 4) + 4 * W * h, sizeof raw);
        v = (raw >> (8 * (i % 4) + (i < 16 ? 0 : 4))) & 0x0F;
        return dv * __builtin_convertvector(v, vec) + mv;
    }
    memcpy(&raw, q + gb * 512 + 64 * (i / 4) + 4 * W * h, sizeof raw);
    v = (raw << (24 - 8 * (i % 4))) >> 24; /* the byte, sign-extended */
    return dv * __builtin_convertvector(v, vec);
}

/* Rows [r0, r0 + NR) of lanes [W h, W h + W) of group g. */
static inline __attribute__((always_inline)) void group_f32(int fmt, const int NR, const float *x, const uint8_t *q,
                                                            const uint16_t *d, const uint16_t *m, const float *bias,
                                                            float *y, int r0, int k, int g, int h, int n_out) {
    int blocks = k / 32;
    vec a[FROWS][2];
    for (int e = 0; e < NR; e++) a[e][0] = a[e][1] = (vec){0};
    for (int b = 0; b < blocks; b++) {
        long gb = (long)g * blocks + b;
        float df[W], mf[W] = {0};
        widen_halves(d + gb * GROUP + W * h, df, W);
        if (fmt == Q4_1) widen_halves(m + gb * GROUP + W * h, mf, W);
        vec dv, mv;
        memcpy(&dv, df, sizeof dv);
        memcpy(&mv, mf, sizeof mv);
        for (int half = 0; half < 2; half++) { /* 16 elements at a time, widened once for NR rows */
            vec w[16];
            for (int i = 0; i < 16; i++) w[i] = widen(fmt, q, dv, mv, gb, h, 16 * half + i);
            for (int e = 0; e < NR; e++) {
                const float *xr = x + (long)(r0 + e) * k + 32 * b + 16 * half;
                for (int i = 0; i < 16; i++) a[e][i % 2] += xr[i] * w[i];
            }
        }
    }
    int n0 = GROUP * g + W * h;
    for (int e = 0; e < NR; e++) {
        vec s = a[e][0] + a[e][1];
        float out[W];
        memcpy(out, &s, sizeof out);
        float *yr = y + (long)(r0 + e) * n_out;
        for (int c = 0; c < W && n0 + c < n_out; c++) yr[n0 + c] = bias ? out[c] + bias[n0 + c] : out[c];
    }
}

/* y (rows, n_out) = x (rows, k) w^T (+ bias), w (n_out, k) in `fmt` blocks laid out as above: q, d and m
 * (fp16 bits; m unused for Q8_0) hold ceil(n_out / 16) groups of k / 32 blocks. Groups are shared among `threads`. */
int quant_matmul(int fmt, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, const float *bias,
                 float *y, int rows, int k, int n_out, int threads) {
    if ((fmt != Q4_1 && fmt != Q8_0) || k <= 0 || k % 32 || rows < 0 || n_out < 0 || threads < 1) return ERR_SHAPE;
    if (fmt == Q4_1 && !m) return ERR_SHAPE;
    int parts = (n_out + GROUP - 1) / GROUP * (GROUP / W);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int p = 0; p < parts; p++) {
        int g = p / (GROUP / W), h = p % (GROUP / W), r0 = 0;
        for (; r0 + FROWS <= rows; r0 += FROWS) {
            if (fmt == Q4_1) group_f32(Q4_1, FROWS, x, q, d, m, bias, y, r0, k, g, h, n_out);
            else group_f32(Q8_0, FROWS, x, q, d, m, bias, y, r0, k, g, h, n_out);
        }
        switch (rows - r0) { /* the rest: fewer than FROWS rows */
#define REST(n)                                                                                                     \
    case n:                                                                                                         \
        if (fmt == Q4_1) group_f32(Q4_1, n, x, q, d, m, bias, y, r0, k, g, h, n_out);                               \
        else group_f32(Q8_0, n, x, q, d, m, bias, y, r0, k, g, h, n_out);                                           \
        break;
        REST(3) REST(2) REST(1)
#undef REST
        default: break;
        }
    }
    return 0;
}

/* ---- Activations in int8: exact integer dot products ------------------------------------------------------
 *
 * llama.cpp's scheme: each activation row is quantized per block of 32 to x = dx * qx (qx int8 in -127..127,
 * dx = max |x| / 127), so a weight block's dot product is integers: for Q4_1,
 *     sum_i (d q_i + m)(dx qx_i) = d dx * sum_i q_i qx_i  +  m * (dx * sum_i qx_i),
 * and for Q8_0 the first term alone. A block's integer sum is exact, whatever instructions compute it. The
 * floats are then added in one order, for each element: over the blocks b in order,
 *     a = fma(float(sum_i q_i qx_i), d_b * dx_b, a)      and, for Q4_1,  c = fma(m_b, dsx_b, c),
 * with dsx_b = dx_b * float(sum_i qx_i); then y = a + c (+ bias). So the result is bitwise the same on
 * AVX-512 VNNI, AVX2 and the plain C path, and a row's result does not depend on its batch. */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define I8_PATH 2
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define I8_PATH 1
#else
#define I8_PATH 0
#endif

typedef struct { /* rows quantized per block: qx (rows, k) int8; per row and block: sx = sum(qx), dx and
                  * dsx = dx * sum(qx) */
    int8_t *qx;
    int32_t *sx;
    float *dx, *dsx;
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
        float dx = amax / 127.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
        for (int j = 0; j < 4; j++) {
            __m256 v = _mm256_mul_ps(xs[j], _mm256_set1_ps(id));
            __m256 a = _mm256_min_ps(_mm256_add_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(0.5f)), _mm256_set1_ps(127.0f));
            __m256i qi = _mm256_cvttps_epi32(a), neg = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
            _mm256_store_si256((__m256i *)(q + 8 * j), _mm256_sub_epi32(_mm256_xor_si256(qi, neg), neg));
        }
#else
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        float dx = amax / 127.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = xb[i] * id, a = fminf(fabsf(v) + 0.5f, 127.0f);
            q[i] = v < 0.0f ? -(int)a : (int)a;
        }
#endif
        for (int i = 0; i < 32; i++) {
            r.qx[rb * 32 + i] = (int8_t)q[i];
            sum += q[i];
        }
        r.sx[rb] = sum;
        r.dx[rb] = dx;
        r.dsx[rb] = dx * (float)sum;
    }
}

/* The results of rows [r0, r0 + NR) for group g's lanes, a (and c for Q4_1) per row: y = a + c (+ bias),
 * stored for the columns that exist. */
#define STORE_GROUP(NR, A, C, fmt, bias, y, r0, g, n_out)                                                           \
    do {                                                                                                            \
        int n0_ = GROUP * (g), live_ = (n_out) - n0_ < GROUP ? (n_out) - n0_ : GROUP;                                \
        for (int e_ = 0; e_ < (NR); e_++) {                                                                         \
            float a_[GROUP], c_[GROUP];                                                                             \
            memcpy(a_, &(A)[e_], sizeof a_);                                                                        \
            memcpy(c_, &(C)[e_], sizeof c_);                                                                        \
            float *yr_ = (y) + (long)((r0) + e_) * (n_out) + n0_;                                                   \
            for (int c = 0; c < live_; c++) {                                                                       \
                float s_ = (fmt) == Q4_1 ? a_[c] + c_[c] : a_[c];                                                   \
                yr_[c] = (bias) ? s_ + (bias)[n0_ + c] : s_;                                                        \
            }                                                                                                       \
        }                                                                                                           \
    } while (0)

static inline int32_t chunk(const int8_t *p) { /* four activation bytes as one 32-bit lane */
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if I8_PATH == 2
#ifdef AVX512_TILE_ROWS /* a measurement's override (docs/performance.md entry 31: 8 spills and loses) */
#define TROWS AVX512_TILE_ROWS
#else
#define TROWS 6 /* rows per register tile: 8 weight vectors + 2 accumulators per row */
#endif

/* Rows [r0, r0 + NR) of group g: each block's 8 weight vectors (4 bytes of each of 16 columns) are loaded
 * once for NR rows; a row's block is 8 `vpdpbusd` with its activation bytes broadcast, in two chains. */
static inline __attribute__((always_inline)) void group_i8(int fmt, const int NR, Int8Rows in, const uint8_t *q,
                                                           const uint16_t *d, const uint16_t *m, const float *bias,
                                                           float *y, int r0, int k, int g, int n_out, int ahead) {
    (void)ahead; /* AVX2's prefetch (`prefetch_block`); this path leaves the stream to the hardware */
    int blocks = k / 32;
    __m512 a[TROWS], c[TROWS];
    for (int e = 0; e < NR; e++) a[e] = c[e] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < blocks; b++) {
        long gb = (long)g * blocks + b;
        __m512i w[8];
        if (fmt == Q4_1) {
            for (int j = 0; j < 4; j++) {
                __m512i raw = _mm512_loadu_si512(q + gb * 256 + 64 * j);
                w[j] = _mm512_and_si512(raw, low4);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
            }
        } else { /* s8 -> u8 (+ 128): vpdpbusd multiplies unsigned by signed bytes; - 128 sum(qx) below */
            for (int j = 0; j < 8; j++) w[j] = _mm512_xor_si512(_mm512_loadu_si512(q + gb * 512 + 64 * j), flip);
        }
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + gb * GROUP)));
        __m512 mv = fmt == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m + gb * GROUP))) : dv;
        for (int e = 0; e < NR; e++) {
            long rb = (long)(r0 + e) * blocks + b;
            const int8_t *xq = in.qx + rb * 32;
            __m512i s0 = fmt == Q8_0 ? _mm512_set1_epi32(-128 * in.sx[rb]) : _mm512_setzero_si512();
            __m512i s1 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(chunk(xq + 4 * j)));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(chunk(xq + 4 * j + 4)));
            }
            a[e] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                   _mm512_mul_ps(dv, _mm512_set1_ps(in.dx[rb])), a[e]);
            if (fmt == Q4_1)
                c[e] = _mm512_fmadd_ps(mv, _mm512_set1_ps(in.dsx[rb]), c[e]);
        }
    }
    STORE_GROUP(NR, a, c, fmt, bias, y, r0, g, n_out);
}

#elif I8_PATH == 1
#define TROWS 4
#define PIN(v) __asm__("" : "+x"(v)) /* keeps a running sum in a register: GCC otherwise gathers all of a block's
                                      * products before adding them, and spills them (docs/performance.md entry 53) */

typedef struct { __m256 v[2]; } pair256; /* a group's 16 lanes as two 8-float halves */

/* Block gb's bytes (its q, d and m) asked of memory ahead of their use: the first tile reading group g's block b asks
 * for group g + QUANT_PREFETCH's block b, so the next group's weights stream in from DRAM while this group's rows are
 * multiplied. A plain step's products (one row, the weights read once, ~96 MB a token) wait on DRAM: the products of
 * a forward in ~0.9x their time with it; a 16-row verification's are bound by the multiplies and take the same time
 * (`scripts/quant_matmul_ab.c` FORWARD=30). A prefetch changes no value. */
static inline __attribute__((always_inline)) void prefetch_block(int fmt, const uint8_t *q, const uint16_t *d,
                                                                 const uint16_t *m, long gb) {
    const char *p = (const char *)(q + gb * block_bytes(fmt));
    for (long at = 0; at < block_bytes(fmt); at += 64) _mm_prefetch(p + at, _MM_HINT_T0);
    _mm_prefetch((const char *)(d + gb * GROUP), _MM_HINT_T0);
    if (fmt == Q4_1) _mm_prefetch((const char *)(m + gb * GROUP), _MM_HINT_T0);
}

/* As the AVX-512 tile, a group as two halves of 8 columns, both halves in one pass: each chunk of four activation
 * bytes is broadcast once for the 16 columns, and each 32-byte load of weights is unpacked once and used at once by
 * every row of the tile, so the live registers are the rows' integer sums and one chunk's weights (a block's eight
 * weight vectors kept across rows spilled). Q4_1: `vpmaddubsw` of the 8 chunks summed in 16 bits (each pair at most
 * 2 * 15 * 127 in magnitude, 8 of them 30480: no saturation), widened once; Q8_0: |w| times x with w's sign per
 * chunk, widened per chunk (two pairs could exceed 16 bits). The integer sums are exact in any order; the floats
 * keep the order above, the m terms of Q4_1 in a second pass over the blocks. */
static inline __attribute__((always_inline)) void group_i8(int fmt, const int NR, Int8Rows in, const uint8_t *q,
                                                           const uint16_t *d, const uint16_t *m, const float *bias,
                                                           float *y, int r0, int k, int g, int n_out, int ahead) {
    int blocks = k / 32;
    pair256 a[TROWS], c[TROWS];
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int e = 0; e < NR; e++) a[e].v[0] = a[e].v[1] = c[e].v[0] = c[e].v[1] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        long gb = (long)g * blocks + b;
        if (QUANT_PREFETCH && ahead) prefetch_block(fmt, q, d, m, gb + QUANT_PREFETCH * blocks);
        const int8_t *xq[TROWS];
        __m256i s[TROWS][2];
        for (int e = 0; e < NR; e++) {
            xq[e] = in.qx + ((long)(r0 + e) * blocks + b) * 32;
            s[e][0] = s[e][1] = _mm256_setzero_si256();
        }
        if (fmt == Q4_1) {
            for (int j = 0; j < 4; j++) { /* bytes 4 j.. of both halves: their low nibbles are q[4 j..], high q[16 + 4 j..] */
                __m256i raw0 = _mm256_loadu_si256((const __m256i *)(q + gb * 256 + 64 * j));
                __m256i raw1 = _mm256_loadu_si256((const __m256i *)(q + gb * 256 + 64 * j + 32));
                __m256i lo0 = _mm256_and_si256(raw0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(raw0, 4), low4);
                __m256i lo1 = _mm256_and_si256(raw1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(raw1, 4), low4);
                for (int e = 0; e < NR; e++) {
                    __m256i xl = _mm256_set1_epi32(chunk(xq[e] + 4 * j)), xh = _mm256_set1_epi32(chunk(xq[e] + 16 + 4 * j));
                    s[e][0] = _mm256_add_epi16(s[e][0], _mm256_maddubs_epi16(lo0, xl));
                    s[e][1] = _mm256_add_epi16(s[e][1], _mm256_maddubs_epi16(lo1, xl));
                    s[e][0] = _mm256_add_epi16(s[e][0], _mm256_maddubs_epi16(hi0, xh));
                    s[e][1] = _mm256_add_epi16(s[e][1], _mm256_maddubs_epi16(hi1, xh));
                    PIN(s[e][0]);
                    PIN(s[e][1]);
                }
            }
            for (int e = 0; e < NR; e++) s[e][0] = _mm256_madd_epi16(s[e][0], ones), s[e][1] = _mm256_madd_epi16(s[e][1], ones);
        } else {
            for (int j = 0; j < 8; j++) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(q + gb * 512 + 64 * j)), a0 = _mm256_abs_epi8(w0);
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(q + gb * 512 + 64 * j + 32)), a1 = _mm256_abs_epi8(w1);
                for (int e = 0; e < NR; e++) {
                    __m256i xb = _mm256_set1_epi32(chunk(xq[e] + 4 * j));
                    s[e][0] = _mm256_add_epi32(s[e][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0)), ones));
                    s[e][1] = _mm256_add_epi32(s[e][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1)), ones));
                    PIN(s[e][0]);
                    PIN(s[e][1]);
                }
            }
        }
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + gb * GROUP)));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + gb * GROUP + 8)));
        for (int e = 0; e < NR; e++) {
            __m256 dx = _mm256_set1_ps(in.dx[(long)(r0 + e) * blocks + b]);
            a[e].v[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[e][0]), _mm256_mul_ps(d0, dx), a[e].v[0]);
            a[e].v[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[e][1]), _mm256_mul_ps(d1, dx), a[e].v[1]);
        }
    }
    if (fmt == Q4_1)
        for (int b = 0; b < blocks; b++) {
            long gb = (long)g * blocks + b;
            __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + gb * GROUP)));
            __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + gb * GROUP + 8)));
            for (int e = 0; e < NR; e++) {
                __m256 sx = _mm256_set1_ps(in.dsx[(long)(r0 + e) * blocks + b]);
                c[e].v[0] = _mm256_fmadd_ps(m0, sx, c[e].v[0]);
                c[e].v[1] = _mm256_fmadd_ps(m1, sx, c[e].v[1]);
            }
        }
    int n0 = GROUP * g;
    if (n_out - n0 < GROUP) { /* the last, part-filled group */
        STORE_GROUP(NR, a, c, fmt, bias, y, r0, g, n_out);
        return;
    }
    for (int e = 0; e < NR; e++) /* STORE_GROUP's operations, 8 lanes at a time */
        for (int h = 0; h < 2; h++) {
            __m256 v = fmt == Q4_1 ? _mm256_add_ps(a[e].v[h], c[e].v[h]) : a[e].v[h];
            if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0 + 8 * h));
            _mm256_storeu_ps(y + (long)(r0 + e) * n_out + n0 + 8 * h, v);
        }
}

#else
#define TROWS 4

typedef struct { float v[GROUP]; } lanes;

/* The same order in plain C: one block's integer sum per column, then the two fused multiply-adds. */
static inline __attribute__((always_inline)) void group_i8(int fmt, const int NR, Int8Rows in, const uint8_t *q,
                                                           const uint16_t *d, const uint16_t *m, const float *bias,
                                                           float *y, int r0, int k, int g, int n_out, int ahead) {
    (void)ahead; /* AVX2's prefetch (`prefetch_block`); this path leaves the stream to the hardware */
    int blocks = k / 32;
    lanes a[TROWS], c[TROWS];
    memset(a, 0, sizeof a);
    memset(c, 0, sizeof c);
    for (int b = 0; b < blocks; b++) {
        long gb = (long)g * blocks + b;
        for (int col = 0; col < GROUP; col++) {
            int v[32];
            column_values(fmt, q, gb, col, v);
            for (int e = 0; e < NR; e++) {
                long rb = (long)(r0 + e) * blocks + b;
                int dot = 0;
                for (int i = 0; i < 32; i++) dot += v[i] * in.qx[rb * 32 + i];
                a[e].v[col] = fmaf((float)dot, half_to_float(d[gb * GROUP + col]) * in.dx[rb], a[e].v[col]);
                if (fmt == Q4_1) c[e].v[col] = fmaf(half_to_float(m[gb * GROUP + col]), in.dsx[rb], c[e].v[col]);
            }
        }
    }
    STORE_GROUP(NR, a, c, fmt, bias, y, r0, g, n_out);
}
#endif

/* Every row of group g, TROWS at a time. */
static inline __attribute__((always_inline)) void rows_i8(int fmt, Int8Rows in, const uint8_t *q, const uint16_t *d,
                                                          const uint16_t *m, const float *bias, float *y, int rows,
                                                          int k, int g, int n_out) {
    /* The group's first tile asks for the next group's blocks as it goes (AVX2; `prefetch_block`). */
    int r0 = 0, next = GROUP * (g + QUANT_PREFETCH) < n_out;
    for (; r0 + TROWS <= rows; r0 += TROWS) group_i8(fmt, TROWS, in, q, d, m, bias, y, r0, k, g, n_out, next && !r0);
    switch (rows - r0) { /* the rest: fewer than TROWS rows */
#define REST(n) case n: if (TROWS > n) group_i8(fmt, n, in, q, d, m, bias, y, r0, k, g, n_out, next && !r0); break;
    REST(7) REST(6) REST(5) REST(4) REST(3) REST(2) REST(1)
#undef REST
    default: break;
    }
}

/* `quant_matmul` with the rows first quantized to int8 blocks: y (rows, n_out) fp32. */
int quant_matmul_i8(int fmt, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, const float *bias,
                    float *y, int rows, int k, int n_out, int threads) {
    if ((fmt != Q4_1 && fmt != Q8_0) || k <= 0 || k % 32 || rows < 0 || n_out < 0 || threads < 1) return ERR_SHAPE;
    if (fmt == Q4_1 && !m) return ERR_SHAPE;
    long row_blocks = (long)rows * (k / 32);
    int8_t *qx = malloc((size_t)(row_blocks + 1) * 32);
    float *f = malloc(sizeof(float) * (size_t)(row_blocks + 1) * 3);
    if (!qx || !f) {
        free(qx);
        free(f);
        return ERR_NOMEM;
    }
    Int8Rows in = {qx, (int32_t *)f, f + row_blocks + 1, f + 2 * (row_blocks + 1)};
    quantize_rows(x, row_blocks, in, threads);
    int groups = (n_out + GROUP - 1) / GROUP;
    if (fmt == Q4_1) { /* one copy of the loops per format, the format a constant in each */
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int g = 0; g < groups; g++) rows_i8(Q4_1, in, q, d, m, bias, y, rows, k, g, n_out);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int g = 0; g < groups; g++) rows_i8(Q8_0, in, q, d, m, bias, y, rows, k, g, n_out);
    }
    free(qx);
    free(f);
    return 0;
}
