/* Reading a target distribution on CPU: what a cycle's acceptance and a sampled plain step need from rows
 * of a 49k-token vocabulary, each in one pass over the row, without PyTorch's per-call dispatch, threads
 * and temporaries (under 1% of a sampled run: `python -m eagleviz bench --ab sample-ops`, entry 27):
 *
 *   argmax_rows   each row's largest value and the first index holding it (torch.argmax's rule)
 *   top_k         a row's k largest values, descending, and their indices (equal values: lower index first)
 *   draw_index    inverse-CDF sampling: the first i whose cumulative sum exceeds u01 * total, the sums in
 *                 double and in index order, so the index is bitwise the one torch.cumsum(w, dtype=float64)
 *                 and torch.searchsorted(cdf, u01 * cdf[-1], right=True) give
 *
 * Build: cc -O3 -march=native -shared -fPIC (kernels/sample_ops.py does it once per machine).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ERR_NOMEM -1
#define ERR_SHAPE -2

typedef float v16 __attribute__((vector_size(64)));  /* 16 fp32 lanes: AVX-512, 2 x AVX2, 4 x NEON */
typedef int32_t i16 __attribute__((vector_size(64)));

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) int any_lane(i16 m) {
    int32_t t[16];
    memcpy(t, &m, sizeof t);
    int32_t any = 0;
    for (int j = 0; j < 16; j++) any |= t[j];
    return any != 0;
}

/* rows x n values (no NaN), row-major; out_index and out_value get one entry per row. Lane j keeps the
 * largest of values j, j + 16, ... and the first index holding it; the lanes then agree on the largest
 * value and the lowest index among equals. */
int argmax_rows(const float *x, int rows, int n, int64_t *out_index, float *out_value) {
    if (rows < 0 || n <= 0) return ERR_SHAPE;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (long)r * n;
        float best = row[0];
        long at = 0;
        int i = 0;
        if (n >= 16) {
            v16 lane = load16(row);
            i16 idx, step = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
            idx = step;
            for (i = 16; i + 16 <= n; i += 16) {
                v16 v = load16(row + i);
                i16 up = v > lane; /* all ones where v is larger: a blend of bits */
                lane = (v16)(((i16)v & up) | ((i16)lane & ~up));
                idx = ((step + i) & up) | (idx & ~up);
            }
            for (int j = 0; j < 16; j++)
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
            v16 floor16 = {0};
            floor16 += floor_value;
            if (!any_lane(load16(x + i) > floor16)) {
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
 * cdf (n doubles, the caller's scratch) receives the cumulative sums. */
long draw_index(const float *w, int n, double u01, double *cdf) {
    if (n <= 0) return ERR_SHAPE;
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
