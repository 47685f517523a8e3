/* Reading a target distribution on CPU: what a cycle's acceptance and a sampled plain step need from rows
 * of a 49k-token vocabulary, each in one pass over the row, without PyTorch's per-call dispatch, threads
 * and temporaries (under 1% of a sampled run: `python -m eagleviz bench --ab sample-ops`, entry 27):
 *
 *   argmax_rows   each row's largest value and the first index holding it (torch.argmax's rule)
 *   top_k         a row's k largest values, descending, and their indices (equal values: lower index first)
 *   draw_index    inverse-CDF sampling: the first i whose cumulative sum exceeds u01 * total, the sums in
 *                 double and in index order, so the index is bitwise the one torch.cumsum(w, dtype=float64)
 *                 and torch.searchsorted(cdf, u01 * cdf[-1], right=True) give; and, asked, the first index
 *                 of the largest weight (a resting cycle's trace shows it)
 *   prob_at       one probability of softmax(x / T), from one vectorised pass of exponentials (a root-alone
 *                 cycle's trace shows its argmax's probability; a softmax would write the whole row)
 *
 * Build: cc -O3 -march=native -shared -fPIC (kernels/sample_ops.py does it once per machine).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ERR_NOMEM -1
#define ERR_SHAPE -2

/* W-float vectors: 16 where the CPU has 512-bit registers, 8 with 256-bit ones (and on other architectures), 4
 * on an x86 with SSE alone (GCC compiles a comparison of vectors wider than the CPU's to one scalar compare a
 * lane: 16-float vectors on AVX2 were 25 times slower). Results never depend on W: the argmax and
 * the top k are exact, and prob_at keeps 16 sums whatever W is. */
#if defined(__AVX512F__)
#define W 16
#elif defined(__AVX__) || !(defined(__x86_64__) || defined(__i386__))
#define W 8
#else
#define W 4
#endif
typedef float vw __attribute__((vector_size(4 * W)));
typedef int32_t iw __attribute__((vector_size(4 * W)));

static inline vw loadw(const float *p) {
    vw v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline vw splat(float x) {
    vw v = {0};
    return v + x;
}

static inline __attribute__((always_inline)) int any_lane(iw m) {
    int32_t t[W];
    memcpy(t, &m, sizeof t);
    int32_t any = 0;
    for (int j = 0; j < W; j++) any |= t[j];
    return any != 0;
}

/* rows x n values (no NaN), row-major; out_index and out_value get one entry per row. Lane j keeps the
 * largest of values j, j + W, ... and the first index holding it; the lanes then agree on the largest
 * value and the lowest index among equals. */
int argmax_rows(const float *x, int rows, int n, int64_t *out_index, float *out_value) {
    if (rows < 0 || n <= 0) return ERR_SHAPE;
    iw step;
    for (int j = 0; j < W; j++) step[j] = j;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (long)r * n;
        float best = row[0];
        long at = 0;
        int i = 0;
        if (n >= W) {
            vw lane = loadw(row);
            iw idx = step;
            for (i = W; i + W <= n; i += W) {
                vw v = loadw(row + i);
                iw up = v > lane; /* all ones where v is larger: a blend of bits */
                lane = (vw)(((iw)v & up) | ((iw)lane & ~up));
                idx = ((step + i) & up) | (idx & ~up);
            }
            for (int j = 0; j < W; j++)
                if (lane[j] > best || (lane[j] == best && idx[j] < at)) {
                    best = lane[j];
                    at = idx[j];
                }
        }
        for (; i < n; i++)
            if (row[i] > best) {
                best = row[i];
                at = i;
            }
        out_index[r] = at;
        out_value[r] = best;
    }
    return 0;
}

/* The k largest of n values: a sorted list of k, kept while one pass skips every 16 values none of which
 * is above its smallest (almost all of a vocabulary once the list is full), so the pass costs little more
 * than reading the row. Values equal to the k-th keep the lower indices; NaNs are skipped. k <= n. */
int top_k(const float *x, int n, int k, int64_t *out_index, float *out_value) {
    if (n <= 0 || k <= 0 || k > n) return ERR_SHAPE;
    int filled = 0;
    float floor_value = 0.0f;
    for (int i = 0; i < n; i++) {
        if (filled == k && i % 16 == 0 && i + 16 <= n) {
            vw floor_w = splat(floor_value);
            iw above = loadw(x + i) > floor_w;
            for (int h = W; h < 16; h += W) above |= loadw(x + i + h) > floor_w;
            if (!any_lane(above)) {
                i += 15;
                continue;
            }
        }
        float v = x[i];
        if ((filled == k && !(v > floor_value)) || v != v) continue;
        int j = filled < k ? filled++ : k - 1;
        while (j > 0 && out_value[j - 1] < v) { /* strictly smaller moves down: equal values keep their order */
            out_value[j] = out_value[j - 1];
            out_index[j] = out_index[j - 1];
            j--;
        }
        out_value[j] = v;
        out_index[j] = i;
        if (filled == k) floor_value = out_value[k - 1];
    }
    for (int j = filled; j < k; j++) { /* fewer than k values were numbers */
        out_value[j] = 0.0f;
        out_index[j] = -1;
    }
    return 0;
}

/* w: n non-negative weights; u01 in [0, 1). Returns the drawn index, or -1 when every weight is 0.
 * cdf (n doubles, the caller's scratch) receives the cumulative sums; top (may be NULL) the first index of the
 * largest weight and top_value (may be NULL) that weight, from argmax_rows' vector pass while the row is in
 * cache (a compare inside the sum's scalar loop, a chain of its own, made the draw 1.8 times slower). */
long draw_index(const float *w, int n, double u01, double *cdf, int64_t *top, float *top_value) {
    if (n <= 0) return ERR_SHAPE;
    float best;
    if (top) {
        argmax_rows(w, 1, n, top, &best);
        if (top_value) *top_value = best;
    }
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += (double)w[i];
        cdf[i] = acc;
    }
    double u = u01 * acc;
    /* the first i with cdf[i] > u (cdf ascends: a binary search) */
    long lo = 0, hi = n;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (cdf[mid] > u) hi = mid;
        else lo = mid + 1;
    }
    if (lo < n) return lo;
    for (long i = n - 1; i >= 0; i--) /* u rounded up to the total: the last index with weight */
        if (w[i] != 0.0f) return i;
    return -1;
}

/* exp(y) for y <= 0 in W lanes (Cephes' expf: y = m ln 2 + r, |r| <= ln 2 / 2, a degree-7 polynomial in r,
 * times 2^m from the exponent bits; relative error about 1e-7); y below -87 gives 0. The scalar exp_one is
 * the same arithmetic for one value. */
#define EXP_LOW -87.0f
#define EXP_POLY(r, z) \
    ((((((1.9875691500e-4f * (r) + 1.3981999507e-3f) * (r) + 8.3334519073e-3f) * (r) + 4.1665795894e-2f) * (r) \
       + 1.6666665459e-1f) * (r) + 5.0000001201e-1f) * (z) + (r) + 1.0f)

static inline vw expw(vw y) {
    vw low = splat(EXP_LOW);
    iw under = y < low;
    y = (vw)(((iw)low & under) | ((iw)y & ~under));
    vw f = y * 1.44269504088896341f + splat(0.5f);
    iw m = __builtin_convertvector(f, iw);
    m += (iw)(__builtin_convertvector(m, vw) > f); /* truncation towards zero, then floor: -1 where above */
    vw mf = __builtin_convertvector(m, vw);
    vw r = y - mf * 0.693359375f + mf * 2.12194440e-4f;
    vw z = r * r;
    vw p = EXP_POLY(r, z);
    iw scale = (m + 127) << 23;
    vw out = p * (vw)scale;
    return (vw)((iw)out & ~under);
}

static inline float exp_one(float y) {
    if (y < EXP_LOW) return 0.0f;
    float f = y * 1.44269504088896341f + 0.5f;
    int32_t m = (int32_t)f;
    if ((float)m > f) m -= 1;
    float r = y - (float)m * 0.693359375f + (float)m * 2.12194440e-4f;
    float z = r * r;
    int32_t bits = (m + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return EXP_POLY(r, z) * scale;
}

/* softmax(x * inv_t)[index] for one row of n values whose largest is top (argmax_rows' value): one pass of
 * exponentials into 16 float sums (value i to sum i % 16, whatever W is) over blocks of 256 values, the blocks'
 * sums added in double (relative error under 1e-6). Returns -1 for a bad shape. */
double prob_at(const float *x, int n, long index, float top, float inv_t) {
    if (n <= 0 || index < 0 || index >= n) return -1.0;
    vw t = splat(top);
    double total = 0.0;
    int i = 0;
    while (i + 16 <= n) {
        vw sum[16 / W];
        for (int h = 0; h < 16 / W; h++) sum[h] = splat(0.0f);
        for (int b = 0; b < 16 && i + 16 <= n; b++, i += 16)
            for (int h = 0; h < 16 / W; h++) sum[h] += expw((loadw(x + i + h * W) - t) * inv_t);
        for (int h = 0; h < 16 / W; h++)
            for (int j = 0; j < W; j++) total += (double)sum[h][j];
    }
    for (; i < n; i++) total += (double)exp_one((x[i] - top) * inv_t);
    return (double)exp_one((x[index] - top) * inv_t) / total;
}
