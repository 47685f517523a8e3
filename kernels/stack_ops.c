/* A decoder stack from weight blocks in one call: the sequence of a forward's C operations, run by C (and an
 * EAGLE-3 draft head's layer the same way: `draft_midlayer`).
 *
 * From blocks, each layer of a decode step is nine calls into compiled code (the q|k|v, output, gate|up and
 * down products of kernels/quant_ops.c; two norms, RoPE with the cache write, attention and SiLU of
 * kernels/cpu_ops.c), reached through eight Python wrappers that check their tensors and allocate their
 * outputs. In one call our plain loop ran 1.37x faster (`python -m eagleviz bench --ab stack`,
 * docs/performance.md entry 27). This file holds no arithmetic: it calls the
 * very same functions (their addresses handed over by kernels/stack_ops.py), in the same order, on the same
 * values, into buffers it allocates once per call. So its results are bitwise those of the Python sequence
 * (`TargetModel._forward_fused`), and as batch invariant.
 *
 * Build: cc -O3 -shared -fPIC (kernels/stack_ops.py does it once per machine).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ERR_NOMEM -1
#define ERR_SHAPE -2

typedef int (*matmul_fn)(int fmt, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m,
                         const float *bias, float *y, int rows, int k, int n_out, int threads);
typedef int (*rms_norm_fn)(void *h, const void *delta, const void *w, void *out, int rows, int dim, float eps,
                           int bf, int ordered);
typedef int (*rope_fn)(const void *qkv, const void *cos_, const void *sin_, float *q_out, float *kc, float *vc,
                       int rows, int hq, int hkv, int d, int cap, int start, int bf);
typedef int (*attention_fn)(const float *q, const float *kc, const float *vc, const uint8_t *mask, void *out,
                            int rows, int hq, int hkv, int d, int cap, int n_keys, int prefix, float scale, int bf,
                            int ordered, int threads);
typedef int (*silu_mul_fn)(const void *gu, void *out, int rows, int inter, int bf);

typedef struct { /* the compiled operations, from their libraries */
    matmul_fn matmul;
    rms_norm_fn rms_norm;
    rope_fn rope_to_cache;
    attention_fn attention;
    silu_mul_fn silu_mul;
} Ops;

typedef struct { /* one product from blocks: y = x w^T (+ bias), w (n_out, k) in format fmt */
    int fmt, k, n_out;
    const uint8_t *q;
    const uint16_t *d, *m; /* fp16 */
    const float *bias;
} Product;

typedef struct {
    Product qkv, o, gate_up, down;
    const float *post_norm; /* post-attention norm weight */
    const float *next_norm; /* the norm after the MLP: the next layer's input norm, the final norm after the last */
} Layer;

typedef struct { /* the model's shapes */
    int layers, hidden, hq, hkv, d, inter, ordered;
    float eps, scale;
} Shape;

static int product(const Ops *ops, const Product *p, const float *x, float *y, int rows, int threads) {
    return ops->matmul(p->fmt, x, p->q, p->d, p->m, p->bias, y, rows, p->k, p->n_out, threads);
}

/* h (rows, hidden) fp32, the embedded tokens: updated in place as the residual stream. x (rows, hidden) gets the
 * final normed rows. first_norm: layer 0's input norm. Keys and values go to slots [start, start + rows) of
 * kc, vc (layers, hkv, cap, d), layer_stride floats apart; the last `tree` keys are seen through mask
 * (rows, tree) (NULL, tree = 0: all). capture[i] (rows, hidden) or NULL: where layer i's input h is copied
 * (EAGLE-3's features). threads: the products' and attention's threads. */
int decoder_stack(const Ops *ops, const Layer *layer, const Shape *s, const float *first_norm, float *h, float *x,
                  const float *cos_, const float *sin_, float *kc, float *vc, int cap, long layer_stride,
                  int rows, int start, const uint8_t *mask, int tree, float **capture, int threads) {
    if (rows <= 0 || start < 0 || start + rows > cap || tree < 0 || tree > start + rows || threads < 1)
        return ERR_SHAPE;
    long qkv_w = (long)(s->hq + 2 * s->hkv) * s->d, attn_w = (long)s->hq * s->d;
    long per_row = qkv_w + 2 * attn_w + 2 * (long)s->hidden + 3 * (long)s->inter;
    float *buf = malloc(sizeof(float) * (size_t)rows * (size_t)per_row);
    if (!buf) return ERR_NOMEM;
    float *qkv = buf, *q = qkv + rows * qkv_w, *attn = q + rows * attn_w, *delta = attn + rows * attn_w;
    float *gu = delta + rows * (long)s->hidden, *act = gu + rows * 2 * (long)s->inter;
    int n_keys = start + rows, code = ops->rms_norm(h, NULL, first_norm, x, rows, s->hidden, s->eps, 0, s->ordered);
    for (int i = 0; i < s->layers && !code; i++) {
        const Layer *L = layer + i;
        float *k_layer = kc + i * layer_stride, *v_layer = vc + i * layer_stride;
        if (capture && capture[i]) memcpy(capture[i], h, sizeof(float) * (size_t)rows * (size_t)s->hidden);
        if ((code = product(ops, &L->qkv, x, qkv, rows, threads))) break;
        if ((code = ops->rope_to_cache(qkv, cos_, sin_, q, k_layer, v_layer, rows, s->hq, s->hkv, s->d, cap,
                                       start, 0)))
            break;
        if ((code = ops->attention(q, k_layer, v_layer, mask, attn, rows, s->hq, s->hkv, s->d, cap, n_keys,
                                   n_keys - tree, s->scale, 0, s->ordered, threads)))
            break;
        if ((code = product(ops, &L->o, attn, delta, rows, threads))) break;
        if ((code = ops->rms_norm(h, delta, L->post_norm, x, rows, s->hidden, s->eps, 0, s->ordered))) break;
        if ((code = product(ops, &L->gate_up, x, gu, rows, threads))) break;
        if ((code = ops->silu_mul(gu, act, rows, s->inter, 0))) break;
        if ((code = product(ops, &L->down, act, delta, rows, threads))) break;
        code = ops->rms_norm(h, delta, L->next_norm, x, rows, s->hidden, s->eps, 0, s->ordered);
    }
    free(buf);
    return code;
}

typedef struct { /* an EAGLE-3 head's midlayer (eagleviz/models/draft.py, `DraftHead._forward_fused`) */
    Product fc, qkv, o, gate_up, down;
    const float *hidden_norm, *input_norm, *post_norm;
    int norm_before_residual;
} Midlayer;

/* An EAGLE-3 head of one layer over `rows` positions, the calls and order of `DraftHead._forward_fused`:
 * g = fc(features) (use_fc 0: g = features, the head's own outputs); normed = norm(g);
 * x = [norm(emb) | normed]; h = normed or g; h += o(attention(qkv(x))); y = norm(h); h += down(silu(gate_up(y))).
 * features (rows, fc.k), emb (rows, hidden) fp32; h (rows, hidden) gets the output. Keys and values go to slots
 * [start, start + rows) of the head's cache (1, hkv, cap, d); the last `tree` keys are seen through mask
 * (rows, tree) (NULL, tree = 0: all). The head's norms and attention run in their unordered sums, as its Python
 * sequence does. */
int draft_midlayer(const Ops *ops, const Midlayer *L, const Shape *s, const float *features, const float *emb,
                   float *h, const float *cos_, const float *sin_, float *kc, float *vc, int cap, int rows, int start,
                   const uint8_t *mask, int tree, int use_fc, int threads) {
    if (rows <= 0 || start < 0 || start + rows > cap || tree < 0 || tree > start + rows || threads < 1)
        return ERR_SHAPE;
    long H = s->hidden, qkv_w = (long)(s->hq + 2 * s->hkv) * s->d, attn_w = (long)s->hq * s->d;
    long per_row = 3 * H + 2 * H + qkv_w + 2 * attn_w + H + 2 * (long)s->inter + s->inter;
    float *buf = malloc(sizeof(float) * (size_t)rows * (size_t)per_row);
    if (!buf) return ERR_NOMEM;
    float *g = buf, *normed = g + rows * H, *e = normed + rows * H, *x = e + rows * H, *qkv = x + rows * 2 * H;
    float *q = qkv + rows * qkv_w, *attn = q + rows * attn_w, *delta = attn + rows * attn_w, *gu = delta + rows * H;
    float *act = gu + rows * 2 * (long)s->inter;
    int code = 0;
    if (use_fc)
        code = product(ops, &L->fc, features, g, rows, threads);
    else /* a tree's expansion: the features are the head's own outputs, hidden wide */
        memcpy(g, features, sizeof(float) * (size_t)rows * (size_t)H);
    if (!code) code = ops->rms_norm(g, NULL, L->hidden_norm, normed, rows, (int)H, s->eps, 0, 0);
    if (!code) code = ops->rms_norm((void *)emb, NULL, L->input_norm, e, rows, (int)H, s->eps, 0, 0);
    if (!code) {
        for (int r = 0; r < rows; r++) {
            memcpy(x + r * 2 * H, e + r * H, sizeof(float) * (size_t)H);
            memcpy(x + r * 2 * H + H, normed + r * H, sizeof(float) * (size_t)H);
        }
        memcpy(h, L->norm_before_residual ? normed : g, sizeof(float) * (size_t)rows * (size_t)H);
        code = product(ops, &L->qkv, x, qkv, rows, threads);
    }
    int n_keys = start + rows;
    if (!code) code = ops->rope_to_cache(qkv, cos_, sin_, q, kc, vc, rows, s->hq, s->hkv, s->d, cap, start, 0);
    if (!code) code = ops->attention(q, kc, vc, mask, attn, rows, s->hq, s->hkv, s->d, cap, n_keys, n_keys - tree,
                                     s->scale, 0, 0, threads);
    if (!code) code = product(ops, &L->o, attn, delta, rows, threads);
    if (!code) code = ops->rms_norm(h, delta, L->post_norm, e, rows, (int)H, s->eps, 0, 0); /* e: y now */
    if (!code) code = product(ops, &L->gate_up, e, gu, rows, threads);
    if (!code) code = ops->silu_mul(gu, act, rows, s->inter, 0);
    if (!code) code = product(ops, &L->down, act, delta, rows, threads);
    if (!code)
        for (long i = 0; i < rows * H; i++) h[i] += delta[i];
    free(buf);
    return code;
}
