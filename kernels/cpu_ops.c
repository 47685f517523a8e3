/* The small operations of one decoder layer, fused for CPU decoding (few rows: a token or a draft tree).
 *
 * A SmolLM2 decode step runs ~2,000 PyTorch operations besides its matrix products, each a few
 * microseconds of dispatch for a few hundred bytes of work; together they are a third of the step. These
 * loops do the same work in 4 calls per layer, single-threaded but for attention (the products keep their own threads):
 *
 *   rms_norm        y = w * round(x * rsqrt(mean(x^2) + eps))                (optionally h += delta first)
 *   rope_to_cache   rotate q and k of a fused q|k|v row, q to fp32, k and v into the fp32 KV cache
 *   attention       softmax(q K^T * scale) V over the cache, tree mask on the last keys, GQA
 *   silu_mul        round(silu(gate)) * up
 *
 * Batch invariance (`ordered` = 1): a row's results do not depend on the other rows, nor on where its visible
 * keys sit. Every sum runs in one fixed order whatever the CPU's vector width (`FixedSum`; keys scored in
 * zero-padded tiles of 16; the softmax denominator over the row's visible keys only, in order), so a tree
 * node's attention is bitwise the plain decoding step's for the same path, on AVX2, AVX-512 and NEON alike,
 * and every multiply-add that is fused is written so (`fma1`, `fma16`), so a CPU without FMA (plain x86-64)
 * computes the same bits, if slowly, and so do compilers without vector shuffles (`sum_lanes16`).
 * With `ordered` = 0 the sums are the compiler's vector reductions and the last keys go one by one: the
 * order the bf16 and fp32 dense path has always used (its recorded runs and quoted figures depend on it).
 * Hidden states are bf16 (`bf` = 1) or fp32 (`bf` = 0). In bf16 every intermediate is rounded where
 * PyTorch's eager code rounds it (round to nearest even), so the results match the eager path's up to the
 * order of a sum and the last bits of exp. Keys, values and queries are fp32.
 * Build: cc -O3 -march=native -fopenmp -ffp-contract=off -shared -fPIC (kernels/cpu_ops.py, once per machine).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

typedef uint16_t bf16_t;
typedef float v16 __attribute__((vector_size(64))); /* 16 fp32 lanes: AVX-512, 2 x AVX2, 4 x NEON */
typedef float v8 __attribute__((vector_size(32)));  /* 8 fp32 lanes: half of a v16 */
#define MAX_CHUNKS 16 /* head_dim <= 256 */
#ifndef TILE_BYTES
#define TILE_BYTES 16384
#endif
/* Every entry returns 0, or one of these (the Python wrappers raise on them; they check shapes first). */
#define ERR_NOMEM -1
#define ERR_SHAPE -2

static inline float bf16_to_f32(bf16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float round_bf16(float f) { /* f rounded to the nearest bf16 (ties to even), kept as a float */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f; /* NaN */
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static inline void load_row(const void *src, long offset, int n, int bf, float *dst) {
    if (bf) {
        const bf16_t *s = (const bf16_t *)src + offset;
        for (int i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        memcpy(dst, (const float *)src + offset, (size_t)n * sizeof(float));
    }
}

static inline void store_row(void *dst, long offset, int n, int bf, const float *src) { /* src already rounded */
    if (bf) {
        bf16_t *d = (bf16_t *)dst + offset;
        for (int i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &src[i], 4);
            d[i] = (bf16_t)(u >> 16);
        }
    } else {
        memcpy((float *)dst + offset, src, (size_t)n * sizeof(float));
    }
}

/* a * b + c rounded once, on every CPU: an FMA instruction where the CPU has one, libm's exact fmaf
 * elsewhere. The file is compiled with -ffp-contract=off, so these are the only fused operations: a CPU
 * without FMA then computes the same bits as one with it (slowly), and no compiler fuses by its own choice. */
static inline float fma1(float a, float b, float c) { return fmaf(a, b, c); }

static inline v16 fma16(v16 a, v16 b, v16 c) { /* 16 lanes of fma1, in the CPU's own vector instructions */
#if defined(__AVX512F__)
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    v16 r;
    for (int h = 0; h < 2; h++) {
        __m256 x, y, z;
        memcpy(&x, (float *)&a + 8 * h, 32);
        memcpy(&y, (float *)&b + 8 * h, 32);
        memcpy(&z, (float *)&c + 8 * h, 32);
        z = _mm256_fmadd_ps(x, y, z);
        memcpy((float *)&r + 8 * h, &z, 32);
    }
    return r;
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
    v16 r;
    for (int h = 0; h < 4; h++) {
        float32x4_t x = vld1q_f32((float *)&a + 4 * h), y = vld1q_f32((float *)&b + 4 * h);
        vst1q_f32((float *)&r + 4 * h, vfmaq_f32(vld1q_f32((float *)&c + 4 * h), x, y));
    }
    return r;
#else
    v16 r;
    for (int i = 0; i < 16; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

/* e^x for x <= 0 in fp32 (Cephes' expf: range reduction by ln 2, a degree-6 polynomial), branch-free so
 * that loops over it vectorize; 0 below -87. */
static inline float exp_neg(float x) {
    const float lo = -87.0f;
    float xc = x < lo ? lo : x;
    float n = fma1(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = fma1(n, 2.12194440e-4f, fma1(-n, 0.693359375f, xc));
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = fma1(p, r, 1.3981999507e-3f);
    p = fma1(p, r, 8.3334519073e-3f);
    p = fma1(p, r, 4.1665795894e-2f);
    p = fma1(p, r, 1.6666665459e-1f);
    p = fma1(p, r, 5.0000001201e-1f);
    p = fma1(p, z, r) + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return x < lo ? 0.0f : p * scale;
}

#if defined(__FMA__) && !defined(__AVX512F__)
/* `exp_neg` in 8 lanes, operation for operation (the same bits): GCC leaves the scalar one scalar in a loop on AVX2. */
static inline __m256 exp_neg8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), shift = _mm256_set1_ps(12582912.0f);
    __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_blendv_ps(x, lo, below);
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), shift), shift);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), /* fnmadd: -(n c) + xc, fma1(-n, c, xc) */
                               _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc));
    __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_blendv_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_setzero_ps(), below);
}
#endif

/* Sums in one fixed order, whatever the CPU's vector width: value i goes to partial sum i % 16 (in order),
 * then the 16 partial sums are added by halves (8, 4, 2, 1). `FixedSum` carries the partial sums across
 * calls, so values can be added in pieces (a contiguous run, then single values). */
typedef struct {
    v16 lanes;
    long count;
} FixedSum;

static inline void fixed_add_run(FixedSum *acc, const float *x, int n) { /* n contiguous values */
    int i = 0;
    while (i < n && (acc->count & 15)) acc->lanes[acc->count++ & 15] += x[i++];
    /* the run's sums as two halves of 8 lanes in registers: GCC keeps a 16-lane sum that lives in a struct on
     * the stack and moves it through 64-bit pieces on every add where vectors are 8 wide */
    v8 lo, hi;
    memcpy(&lo, &acc->lanes, sizeof lo);
    memcpy(&hi, (const char *)&acc->lanes + sizeof lo, sizeof hi);
    for (; i + 16 <= n; i += 16, acc->count += 16) {
        v8 a, b;
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, x + i + 8, sizeof b);
        lo += a;
        hi += b;
    }
    memcpy(&acc->lanes, &lo, sizeof lo);
    memcpy((char *)&acc->lanes + sizeof lo, &hi, sizeof hi);
    for (; i < n; i++) acc->lanes[acc->count++ & 15] += x[i];
}

static inline float halves_total(v16 lanes) { /* lanes 0-7 plus 8-15, then 0-3 plus 4-7, 0-1 plus 2-3, 0 plus 1 */
    float t[16];
    memcpy(t, &lanes, sizeof t);
    for (int w = 8; w > 0; w >>= 1)
        for (int i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}

static inline float fixed_total(const FixedSum *acc) { return halves_total(acc->lanes); }

/* out = w * round(x * rsqrt(mean(x^2) + eps)) per row of `dim`; with delta, first h = round(h + delta)
 * (h updated in place). In bf16 the product with w is rounded too, as `weight * x.to(bf16)` is. */
int rms_norm(void *h, const void *delta, const void *w, void *out, int rows, int dim, float eps, int bf, int ordered) {
    float *x = malloc(sizeof(float) * (size_t)dim * 3);
    if (!x) return ERR_NOMEM;
    float *d = x + dim, *wf = x + 2 * dim;
    load_row(w, 0, dim, bf, wf);
    for (int t = 0; t < rows; t++) {
        long off = (long)t * dim;
        load_row(h, off, dim, bf, x);
        if (delta) {
            load_row(delta, off, dim, bf, d);
            for (int i = 0; i < dim; i++) x[i] = bf ? round_bf16(x[i] + d[i]) : x[i] + d[i];
            store_row(h, off, dim, bf, x);
        }
        float ss = 0.0f;
        if (ordered) { /* the mean of squares in one order on every CPU */
            FixedSum sq = {{0}, 0};
            for (int i = 0; i < dim; i++) d[i] = x[i] * x[i];
            fixed_add_run(&sq, d, dim);
            ss = fixed_total(&sq);
        } else {
#pragma omp simd reduction(+ : ss)
            for (int i = 0; i < dim; i++) ss = fma1(x[i], x[i], ss);
        }
        float r = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) x[i] = bf ? round_bf16(wf[i] * round_bf16(x[i] * r)) : wf[i] * (x[i] * r);
        store_row(out, off, dim, bf, x);
    }
    free(x);
    return 0;
}

/* qkv: (rows, (hq + 2 hkv) d) the fused projection's output; cos, sin: (rows, d). Rotates q and k
 * (rotate-half: x * cos + [-x2, x1] * sin, each product and the sum rounded in bf16), writes q to
 * q_out (rows, hq, d) fp32 and k, v to slots [start, start + rows) of kc, vc: (hkv, cap, d) fp32. */
int rope_to_cache(const void *qkv, const void *cos_, const void *sin_, float *q_out, float *kc, float *vc,
                  int rows, int hq, int hkv, int d, int cap, int start, int bf) {
    int width = (hq + 2 * hkv) * d, half = d / 2;
    if (d % 2 || start < 0 || start + rows > cap) return ERR_SHAPE;
    float *x = malloc(sizeof(float) * (size_t)(width + 3 * d));
    if (!x) return ERR_NOMEM;
    float *c = x + width, *s = c + d, *y = s + d;
    for (int t = 0; t < rows; t++) {
        load_row(qkv, (long)t * width, width, bf, x);
        load_row(cos_, (long)t * d, d, bf, c);
        load_row(sin_, (long)t * d, d, bf, s);
        for (int head = 0; head < hq + hkv; head++) {
            const float *xh = x + head * d;
            for (int i = 0; i < half; i++) /* rotate-half: [x1, x2] -> [-x2, x1] */
                y[i] = bf ? round_bf16(round_bf16(xh[i] * c[i]) + round_bf16(-xh[i + half] * s[i]))
                          : fma1(xh[i], c[i], -(xh[i + half] * s[i]));
            for (int i = half; i < d; i++)
                y[i] = bf ? round_bf16(round_bf16(xh[i] * c[i]) + round_bf16(xh[i - half] * s[i]))
                          : fma1(xh[i], c[i], xh[i - half] * s[i]);
            float *dst = head < hq ? q_out + ((long)t * hq + head) * d
                                   : kc + ((long)(head - hq) * cap + start + t) * d;
            memcpy(dst, y, sizeof(float) * (size_t)d);
        }
        for (int head = 0; head < hkv; head++)
            memcpy(vc + ((long)head * cap + start + t) * d, x + (hq + hkv + head) * d, sizeof(float) * (size_t)d);
    }
    free(x);
    return 0;
}

#if !defined(CPU_OPS_NO_SHUFFLE) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
#define SHUFFLE __builtin_shufflevector
/* Lane l of the result = the sum of p[l]'s 16 lanes in `halves_total`'s order: four rounds that each add the
 * halves of pairs of vectors (16 -> 8 -> 4 -> 2 -> 1 vectors), leaving the sums in bit-reversed lane order,
 * then one shuffle. */
static inline v16 sum_lanes16(const v16 *p) {
    v16 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = SHUFFLE(p[2 * i], p[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUFFLE(p[2 * i], p[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        b[i] = SHUFFLE(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               SHUFFLE(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        c[i] = SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    v16 d = SHUFFLE(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
            SHUFFLE(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    return SHUFFLE(d, d, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
}
#else /* compilers without __builtin_shufflevector (GCC < 12), or CPU_OPS_NO_SHUFFLE: the same sums in the same order */
static inline v16 sum_lanes16(const v16 *p) {
    v16 out;
    for (int l = 0; l < 16; l++) out[l] = halves_total(p[l]);
    return out;
}
#endif

#if !defined(__FMA__) || defined(__AVX512F__)
/* Scores of `rows` queries (rows, d) against keys [0, n) of k (n, d): s (rows, n) = scale * q k^T. Keys go
 * 16 at a time: each query's 16 partial products (one vector of d/16-chunk sums per key) are summed across
 * lanes together (`sum_lanes16`), and a key tile is read from memory once for all the rows of a KV head. */
static inline __attribute__((always_inline)) void score_tiles(const float *q, const float *k, float *s, long stride,
                                                               int rows, int n, int d, float scale) {
    int chunks = d / 16; /* n: a multiple of 16 keys; row r's scores go to s + r * stride */
    for (int j = 0; j < n; j += 16) {
        for (int r = 0; r < rows; r += 2) { /* two rows at a time share each key's loads */
            int second = r + 1 < rows ? r + 1 : r;
            v16 qa[MAX_CHUNKS], qb[MAX_CHUNKS], pa[16], pb[16];
            for (int c = 0; c < chunks; c++) {
                memcpy(&qa[c], q + (long)r * d + 16 * c, sizeof(v16));
                memcpy(&qb[c], q + (long)second * d + 16 * c, sizeof(v16));
            }
            for (int l = 0; l < 16; l++) {
                const float *kj = k + (long)(j + l) * d;
                v16 a = {0}, b = {0}, kc;
                for (int c = 0; c < chunks; c++) {
                    memcpy(&kc, kj + 16 * c, sizeof(v16));
                    a = fma16(qa[c], kc, a);
                    b = fma16(qb[c], kc, b);
                }
                pa[l] = a;
                pb[l] = b;
            }
            v16 dots = sum_lanes16(pa) * scale;
            memcpy(s + (long)r * stride + j, &dots, sizeof(v16));
            dots = sum_lanes16(pb) * scale;
            memcpy(s + (long)second * stride + j, &dots, sizeof(v16));
        }
    }
}

#else
/* AVX2: the same scores in 8-float registers. The 16-key tile of the other builds keeps 2 x d/16 query vectors
 * and 32 partial products of 16 floats live, ~80 of AVX2's 16 registers, and ran from the stack. Here each key's
 * 16 lanes are two 8-float chains over the chunks (lanes 0-7, 8-15), added at once (`halves_total`'s first round),
 * and 8 keys' remaining rounds (0-3 plus 4-7, 0-1 plus 2-3, 0 plus 1) run across registers as keys come: every
 * lane adds the same products in the same order, so each score has the tile's bits. */
static inline __attribute__((always_inline)) void key_halves(const float *q, int d, int nr, const float *kj,
                                                              int chunks, __m256 *h) {
    __m256 lo[2], hi[2];
    for (int e = 0; e < nr; e++) lo[e] = hi[e] = _mm256_setzero_ps();
    for (int c = 0; c < chunks; c++) {
        __m256 k0 = _mm256_loadu_ps(kj + 16 * c), k1 = _mm256_loadu_ps(kj + 16 * c + 8);
        for (int e = 0; e < nr; e++) {
            lo[e] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (long)e * d + 16 * c), k0, lo[e]);
            hi[e] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (long)e * d + 16 * c + 8), k1, hi[e]);
        }
    }
    for (int e = 0; e < nr; e++) h[e] = _mm256_add_ps(lo[e], hi[e]);
}

static inline __m256 add_fours(__m256 h0, __m256 h1) { /* lanes 0-3: h0's 0-3 plus 4-7; lanes 4-7: h1's */
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

static inline __m256 add_twos(__m256 t0, __m256 t1) { /* add_fours of keys 0|1 and 2|3: 0-1 plus 2-3 of each */
    return _mm256_add_ps(_mm256_shuffle_ps(t0, t1, 0x44), _mm256_shuffle_ps(t0, t1, 0xEE));
}

static inline __m256 add_ones(__m256 u0, __m256 u1, float scale) { /* add_twos of keys 0-3, 4-7: 8 scores */
    __m256 d = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, 0x88), _mm256_shuffle_ps(u0, u1, 0xDD));
    d = _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* keys 0 2 4 6 1 3 5 7 in order */
    return _mm256_mul_ps(d, _mm256_set1_ps(scale));
}

/* nr (1 or 2) query rows against keys [0, n): each key's loads serve both rows (three rows a group held more
 * than AVX2's 16 registers and ran slower) */
static inline __attribute__((always_inline)) void score_group(const float *q, const float *k, float *s, long stride,
                                                               int nr, int n, int d, float scale) {
    int chunks = d / 16;
    for (int j = 0; j < n; j += 8) {
        const float *kj = k + (long)j * d;
        __m256 u[2][2];
        for (int half = 0; half < 2; half++) {
            __m256 t[2][2];
            for (int pair = 0; pair < 2; pair++) {
                __m256 h0[2], h1[2];
                const float *kp = kj + (long)(4 * half + 2 * pair) * d;
                key_halves(q, d, nr, kp, chunks, h0);
                key_halves(q, d, nr, kp + d, chunks, h1);
                for (int e = 0; e < nr; e++) t[pair][e] = add_fours(h0[e], h1[e]);
            }
            for (int e = 0; e < nr; e++) u[half][e] = add_twos(t[0][e], t[1][e]);
        }
        for (int e = 0; e < nr; e++) _mm256_storeu_ps(s + (long)e * stride + j, add_ones(u[0][e], u[1][e], scale));
    }
}

static inline __attribute__((always_inline)) void score_tiles(const float *q, const float *k, float *s, long stride,
                                                               int rows, int n, int d, float scale) {
    /* keys in tiles of TILE_BYTES that stay in L1 over the rows' pairs; an odd row alone, not paired with
     * itself as it was (a plain step's 3 query rows a KV head did 4 rows' work) */
    int span = (TILE_BYTES / (int)sizeof(float) / d) & ~7;
    span = span < 8 ? 8 : span;
    for (int j0 = 0; j0 < n; j0 += span) {
        const float *kt = k + (long)j0 * d;
        float *st = s + j0;
        int m = n - j0 < span ? n - j0 : span, r = 0;
        for (; r + 2 <= rows; r += 2) score_group(q + (long)r * d, kt, st + (long)r * stride, stride, 2, m, d, scale);
        if (r < rows) score_group(q + (long)r * d, kt, st + (long)r * stride, stride, 1, m, d, scale);
    }
}
#endif

/* `score_tiles` over any n: the last n % 16 keys go through the same tile code, copied into `tile` (16 * d
 * floats) and zero-padded, their scores through `spill` (16 * rows floats). A key's score is thus computed
 * the same way wherever it falls, and does not change when the number of keys grows past a tile. */
static inline __attribute__((always_inline)) void scores(const float *q, const float *k, float *s, int rows, int n,
                                                         int d, float scale, float *tile, float *spill, int ordered) {
    int full = n - n % 16;
    score_tiles(q, k, s, n, rows, full, d, scale);
    if (full == n) return;
    if (!ordered) { /* the remainder key by key: a key's score then depends on where the last tile ends */
        for (int r = 0; r < rows; r++)
            for (int j = full; j < n; j++) {
                const float *kj = k + (long)j * d, *qr = q + (long)r * d;
                float dot = 0.0f;
                for (int i = 0; i < d; i++) dot += qr[i] * kj[i];
                s[(long)r * n + j] = dot * scale;
            }
        return;
    }
    memset(tile, 0, sizeof(float) * 16 * (size_t)d);
    memcpy(tile, k + (long)full * d, sizeof(float) * (size_t)(n - full) * d);
    score_tiles(q, tile, spill, 16, rows, 16, d, scale);
    for (int r = 0; r < rows; r++) memcpy(s + (long)r * n + full, spill + 16L * r, sizeof(float) * (n - full));
}

/* Query rows [lo, hi) of KV head g (row r is query head g * group + r % group of token r / group): their
 * softmax(scale * q K^T) V into out, scored against each key tile once and accumulated over each value row
 * once. A row's arithmetic does not depend on the other rows of its slice. */
static inline __attribute__((always_inline)) int kv_head_rows(
        const float *q, const float *kc, const float *vc, const uint8_t *mask, void *out, int hq, int group, int g,
        int lo, int hi, int d, int cap, int n_keys, int prefix, float scale, int bf, int ordered) {
    int tree = n_keys - prefix, r_count = hi - lo, chunks = d / 16;
    float *qg = malloc(sizeof(float) * ((size_t)r_count * ((size_t)n_keys + 2 * d + 1 + 16) + 16 * (size_t)d));
    if (!qg) return ERR_NOMEM;
    float *s = qg + (long)r_count * d, *acc = s + (long)r_count * n_keys, *inv_sum = acc + (long)r_count * d;
    float *spill = inv_sum + r_count, *tile = spill + 16L * r_count;
    for (int r = lo; r < hi; r++)
        memcpy(qg + (long)(r - lo) * d, q + ((long)(r / group) * hq + g * group + r % group) * d, sizeof(float) * (size_t)d);
    scores(qg, kc + (long)g * cap * d, s, r_count, n_keys, d, scale, tile, spill, ordered);
    for (int r = 0; r < r_count; r++) {
        float *sr = s + (long)r * n_keys, m = -INFINITY, sum = 0.0f;
        const uint8_t *row_mask = mask ? mask + (long)((lo + r) / group) * tree : NULL;
        if (row_mask)
            for (int j = 0; j < tree; j++) sr[prefix + j] = row_mask[j] ? sr[prefix + j] : -INFINITY;
#pragma omp simd reduction(max : m)
        for (int j = 0; j < n_keys; j++) m = sr[j] > m ? sr[j] : m;
        int j = 0;
#if defined(__FMA__) && !defined(__AVX512F__)
        for (; j + 8 <= n_keys; j += 8)
            _mm256_storeu_ps(sr + j, exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), _mm256_set1_ps(m))));
#endif
#pragma omp simd
        for (int i = j; i < n_keys; i++) sr[i] = exp_neg(sr[i] - m);
        /* The denominator sums the keys this row sees, in order, as `FixedSum` does: a tree node's
         * ancestors then count as the tokens before it do in plain decoding (masked keys are skipped, not
         * added as zeros, which would shift the later keys' partial sums). */
        if (ordered) {
            FixedSum total = {{0}, 0};
            fixed_add_run(&total, sr, prefix);
            for (int j = 0; j < tree; j++)
                if (!row_mask || row_mask[j]) fixed_add_run(&total, sr + prefix + j, 1);
            sum = fixed_total(&total);
        } else {
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < n_keys; j++) sum += sr[j];
        }
        inv_sum[r] = 1.0f / sum; /* applied to the output row */
    }
    const float *v = vc + (long)g * cap * d;
#if defined(__FMA__) && !defined(__AVX512F__)
    /* AVX2: a row at a time in 8-float registers (the 4-row tile below holds 4 x d/16 16-float vectors, 32 of
     * AVX2's 16 registers for d = 64, and spilled every FMA's operands); each lane adds the same products in the
     * same order, so the bits are the tile's. Values in tiles of TILE_BYTES, each read from L1 by every row (the
     * sums wait in `acc` between tiles: the same adds in the same order) */
    int span = TILE_BYTES / (int)sizeof(float) / d;
    for (int j0 = 0; j0 < n_keys; j0 += span) {
        int j1 = n_keys - j0 < span ? n_keys : j0 + span;
        for (int r = 0; r < r_count; r++) {
            __m256 a[2 * MAX_CHUNKS];
            const float *sr = s + (long)r * n_keys;
            float *ar = acc + (long)r * d;
            for (int c = 0; c < 2 * chunks; c++) a[c] = j0 ? _mm256_loadu_ps(ar + 8 * c) : _mm256_setzero_ps();
            for (int j = j0; j < j1; j++) {
                __m256 w = _mm256_set1_ps(sr[j]);
                const float *vj = v + (long)j * d;
                for (int c = 0; c < 2 * chunks; c++) a[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * c), a[c]);
            }
            for (int c = 0; c < 2 * chunks; c++) _mm256_storeu_ps(ar + 8 * c, a[c]);
        }
    }
#else
    for (int r0 = 0; r0 < r_count; r0 += 4) { /* 4 rows' accumulators stay in registers over the values */
        int nr = r_count - r0 < 4 ? r_count - r0 : 4;
        v16 a[4][MAX_CHUNKS] = {{{0}}};
        for (int j = 0; j < n_keys; j++) {
            v16 w[4]; /* each row's weight of value j, in every lane */
            for (int e = 0; e < nr; e++) w[e] = (v16){0} + s[(long)(r0 + e) * n_keys + j];
            for (int c = 0; c < chunks; c++) {
                v16 vj;
                memcpy(&vj, v + (long)j * d + 16 * c, sizeof(v16));
                for (int e = 0; e < nr; e++) a[e][c] = fma16(w[e], vj, a[e][c]);
            }
        }
        for (int e = 0; e < nr; e++) memcpy(acc + (long)(r0 + e) * d, a[e], sizeof(float) * (size_t)d);
    }
#endif
    for (int r = 0; r < r_count; r++) {
        float *ar = acc + (long)r * d;
        for (int i = 0; i < d; i++) ar[i] *= inv_sum[r];
        if (bf)
            for (int i = 0; i < d; i++) ar[i] = round_bf16(ar[i]);
        int t = (lo + r) / group, h = g * group + (lo + r) % group;
        store_row(out, ((long)t * hq + h) * d, d, bf, ar);
    }
    free(qg);
    return 0;
}

/* out (rows, hq * d) = softmax(scale * q K^T) V for each query row and head, over keys [0, n_keys) of
 * kc, vc: (hkv, cap, d) fp32. Keys [0, prefix) are visible to every row; key prefix + j is visible to row
 * t when mask[t * (n_keys - prefix) + j] (mask NULL: all visible). Query head h reads KV head h / (hq / hkv).
 * The rows * group queries of each KV head are cut into slices, at least two per thread in all, which
 * `threads` threads share (`kv_head_rows`: a row's result is the same in any slice, so the thread count
 * changes no bit). d must be a multiple of 16, at most 16 * MAX_CHUNKS. */
static inline __attribute__((always_inline)) int attention_d(
        const float *q, const float *kc, const float *vc, const uint8_t *mask, void *out, int rows, int hq, int hkv,
        int d, int cap, int n_keys, int prefix, float scale, int bf, int ordered, int threads) {
    int group = hq / hkv, r_count = rows * group;
    int slices = threads > 1 ? (2 * threads + hkv - 1) / hkv : 1;
    slices = slices < r_count ? slices : r_count;
    int items = hkv * slices, err = 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && items > 1) reduction(min : err)
    for (int it = 0; it < items; it++) {
        int g = it / slices, p = it % slices, lo = (int)((long)r_count * p / slices);
        int hi = (int)((long)r_count * (p + 1) / slices), code;
        /* common head sizes get a copy of the loops compiled for their size, here inside the parallel loop's
         * body (OpenMP outlines that body once, before inlining: copies made by the caller all ran the generic
         * loops); a query or value row then stays in registers */
        if (d == 64)
            code = kv_head_rows(q, kc, vc, mask, out, hq, group, g, lo, hi, 64, cap, n_keys, prefix, scale, bf,
                                ordered);
        else if (d == 128)
            code = kv_head_rows(q, kc, vc, mask, out, hq, group, g, lo, hi, 128, cap, n_keys, prefix, scale, bf,
                                ordered);
        else
            code = kv_head_rows(q, kc, vc, mask, out, hq, group, g, lo, hi, d, cap, n_keys, prefix, scale, bf,
                                ordered);
        err = code < err ? code : err;
    }
    return err;
}

/* The entry: checks the shapes. */
int attention(const float *q, const float *kc, const float *vc, const uint8_t *mask, void *out, int rows,
              int hq, int hkv, int d, int cap, int n_keys, int prefix, float scale, int bf, int ordered, int threads) {
    /* the register tiles hold MAX_CHUNKS vectors of 16: refuse what they cannot hold */
    if (d <= 0 || d % 16 || d > 16 * MAX_CHUNKS || hkv <= 0 || hq % hkv || n_keys > cap || prefix < 0 ||
        prefix > n_keys || threads < 1)
        return ERR_SHAPE;
    return attention_d(q, kc, vc, mask, out, rows, hq, hkv, d, cap, n_keys, prefix, scale, bf, ordered, threads);
}

/* gu: (rows, 2 * inter) = [gate | up] -> out (rows, inter) = round(round(silu(gate)) * up). */
int silu_mul(const void *gu, void *out, int rows, int inter, int bf) {
    float *g = malloc(sizeof(float) * (size_t)inter * 2);
    if (!g) return ERR_NOMEM;
    float *u = g + inter;
    for (int t = 0; t < rows; t++) {
        load_row(gu, (long)t * 2 * inter, inter, bf, g);
        load_row(gu, (long)t * 2 * inter + inter, inter, bf, u);
        int i = 0;
#if defined(__FMA__) && !defined(__AVX512F__)
        /* AVX2: the loop below in 8 lanes (GCC leaves `exp_neg` scalar there), operation for operation */
        const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= inter; i += 8) {
            __m256 x = _mm256_loadu_ps(g + i), e = exp_neg8(_mm256_or_ps(x, sign)); /* e^-|x| */
            __m256 num = _mm256_blendv_ps(_mm256_mul_ps(x, e), x, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
            _mm256_storeu_ps(g + i, _mm256_div_ps(num, _mm256_add_ps(one, e)));
        }
#endif
#pragma omp simd
        for (int j = i; j < inter; j++) {
            float e = exp_neg(-fabsf(g[j])); /* silu(x) = x / (1 + e^-x); for x < 0 = x e^x / (1 + e^x) */
            g[j] = (g[j] >= 0.0f ? g[j] : g[j] * e) / (1.0f + e);
        }
        if (bf)
            for (int i = 0; i < inter; i++) g[i] = round_bf16(round_bf16(g[i]) * u[i]);
        else
            for (int i = 0; i < inter; i++) g[i] *= u[i];
        store_row(out, (long)t * inter, inter, bf, g);
    }
    free(g);
    return 0;
}
