/* One decode step of grouped-query attention for many rows, fused, for x86-64 CPUs with AVX-512 or AVX2 and FMA.

   Built and loaded by fused_attention.py (which documents the layouts and checks the arguments); the decoder calls
   it once per layer instead of ~12 PyTorch ops. For each row s and key/value head g it writes the row's new key
   and value into its cache, then, for the Q query heads that share g, computes scores against the prompt's keys
   (shared by the rows of a chunk) and the row's own generated keys, one softmax over both, and the weighted sum of
   the values. Keys are read once and values once: the step is bound by reading the cache from memory, so keys are
   stored in blocks of 16 positions, (blocks, D, 16), which a score loop reads front to back.

   Arithmetic: float32, sums in a fixed order (the same on every call, whatever the thread count); e^x by a
   degree-7 polynomial to ~1 ulp. Results equal PyTorch's batched products and softmax to float32 rounding.
   A row's result depends on its own query, prompt and generated columns only, not on the other rows, the chunk
   size or how much left padding its prompt has (the widest prompt of the batch sets it): scores and weighted sums
   run column by column in order, padding adding exact zeros; p columns of padding move each column p lanes along
   in the softmax's sum, which leaves each lane's sum as it was (only in another lane), and the lanes are summed
   by halves (lane k with lane k + width/2, and so on down), an order that a rotation of the lanes keeps. That is
   what lets a seeded request sample the same tokens whatever is batched beside it (sampler.py).
   The vector code comes twice: 16 lanes (AVX-512, up to 4 blocks of keys at a time) and 8 lanes (AVX2, one block
   at a time: 16 registers hold fewer accumulators); -march=native picks the one the CPU has. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector_exp.h"

#define MAX_Q 4 /* query heads per key/value head computed together (SmolLM2: 3, Llama 3: 4); more go in groups */
#define MAX_HEADS 16 /* query heads per key/value head this kernel handles (Qwen2.5: 6 or 7, Llama 3 70B: 8) */

#define INLINE static inline __attribute__((always_inline))

/* The next row's cache lines, prefetched a few at a time while this row computes. A row's keys and values are a
   few dozen KB in pages of their own: too short for the hardware prefetcher to ramp up, so without this each row
   would wait for memory on its own. */
typedef struct {
    const char *next[2], *end[2];
} Prefetch;

INLINE void prefetch_some(Prefetch *f, int lines) {
    for (int k = 0; k < lines; k++) {
        int r = f->next[0] < f->end[0] ? 0 : 1;
        if (f->next[r] >= f->end[r]) return;
        _mm_prefetch(f->next[r], _MM_HINT_T1);
        f->next[r] += 64;
    }
}

#if defined(__AVX512F__)

INLINE __mmask16 lanes(int left) { return left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1); }


/* out[i][j0 + j] = scale * (q[i] . key j0 + j) for j < len (at most 16 * NB), from NB blocks of keys at base.
   Q and NB are constants at each call (see the switches below), so the loops over i and b unroll and the
   accumulators stay in registers. */
INLINE void score_blocks(const int Q, const int NB, const float *q, int D, const float *base, int64_t block, int len,
                         float scale, float *out, int out_ld, Prefetch *f) {
    __mmask16 m[4];
    __m512 acc[MAX_Q][4];
    for (int b = 0; b < NB; b++) m[b] = lanes(len - 16 * b);
    for (int i = 0; i < Q; i++)
        for (int b = 0; b < NB; b++) acc[i][b] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m512 k[4];
        for (int b = 0; b < NB; b++) k[b] = _mm512_maskz_loadu_ps(m[b], base + b * block + d * 16);
        prefetch_some(f, 2);
        for (int i = 0; i < Q; i++) {
            __m512 qi = _mm512_set1_ps(q[i * D + d]);
            for (int b = 0; b < NB; b++) acc[i][b] = _mm512_fmadd_ps(qi, k[b], acc[i][b]);
        }
    }
    __m512 s = _mm512_set1_ps(scale);
    for (int i = 0; i < Q; i++)
        for (int b = 0; b < NB; b++) _mm512_mask_storeu_ps(out + (int64_t)i * out_ld + 16 * b, m[b], _mm512_mul_ps(acc[i][b], s));
}

/* out[i][j] = scale * (q[i] . key j) for j < len; keys in blocks of 16: (blocks, D, 16), up to 4 blocks at a time. */
INLINE void scores_q(const int Q, const float *q, int D, const float *keys, int len, float scale, float *out, int out_ld,
                     Prefetch *f) {
    const int64_t block = (int64_t)D * 16;
    for (int j0 = 0; j0 < len; j0 += 64) {
        const float *base = keys + (int64_t)(j0 / 16) * block;
        int left = len - j0, blocks = left >= 64 ? 4 : (left + 15) / 16;
        switch (blocks) {
            case 1: score_blocks(Q, 1, q, D, base, block, left, scale, out + j0, out_ld, f); break;
            case 2: score_blocks(Q, 2, q, D, base, block, left, scale, out + j0, out_ld, f); break;
            case 3: score_blocks(Q, 3, q, D, base, block, left, scale, out + j0, out_ld, f); break;
            default: score_blocks(Q, 4, q, D, base, block, left, scale, out + j0, out_ld, f); break;
        }
    }
}

/* Each of the Q rows of w (length len, stride w_ld) becomes its softmax. */
static void softmax(float *w, int Q, int len, int64_t w_ld) {
    for (int i = 0; i < Q; i++) {
        float *r = w + i * w_ld;
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < len; j += 16)
            top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), lanes(len - j), r + j));
        __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        __m512 total = _mm512_setzero_ps();
        for (int j = 0; j < len; j += 16) {
            __mmask16 k = lanes(len - j);
            __m512 e = _mm512_maskz_mov_ps(k, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, r + j), m)));
            _mm512_mask_storeu_ps(r + j, k, e);
            total = _mm512_add_ps(total, e);
        }
        __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total));
        for (int j = 0; j < len; j += 16) {
            __mmask16 k = lanes(len - j);
            _mm512_mask_storeu_ps(r + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, r + j), inv));
        }
    }
}

/* out[i] += sum_j w[i][j] values[j] for j < len; values (len, D), D a multiple of 8, 64 columns at a time. */
INLINE void weighted_sum_q(const int Q, const float *w, int64_t w_ld, int D, const float *values, int len, float *out,
                           Prefetch *f) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        __mmask16 m0 = lanes(D - d0), m1 = lanes(D - d0 - 16), m2 = lanes(D - d0 - 32), m3 = lanes(D - d0 - 48);
        __m512 acc[MAX_Q][4];
        for (int i = 0; i < Q; i++)
            for (int b = 0; b < 4; b++) acc[i][b] = _mm512_setzero_ps();
        for (int j = 0; j < len; j++) {
            const float *v = values + (int64_t)j * D + d0;
            prefetch_some(f, 2);
            __m512 v0 = _mm512_maskz_loadu_ps(m0, v), v1 = _mm512_maskz_loadu_ps(m1, v + 16);
            __m512 v2 = _mm512_maskz_loadu_ps(m2, v + 32), v3 = _mm512_maskz_loadu_ps(m3, v + 48);
            for (int i = 0; i < Q; i++) {
                __m512 wi = _mm512_set1_ps(w[i * w_ld + j]);
                acc[i][0] = _mm512_fmadd_ps(wi, v0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(wi, v1, acc[i][1]);
                acc[i][2] = _mm512_fmadd_ps(wi, v2, acc[i][2]);
                acc[i][3] = _mm512_fmadd_ps(wi, v3, acc[i][3]);
            }
        }
        for (int i = 0; i < Q; i++) {
            float *dst = out + i * D + d0;
            _mm512_mask_storeu_ps(dst, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, dst), acc[i][0]));
            _mm512_mask_storeu_ps(dst + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, dst + 16), acc[i][1]));
            _mm512_mask_storeu_ps(dst + 32, m2, _mm512_add_ps(_mm512_maskz_loadu_ps(m2, dst + 32), acc[i][2]));
            _mm512_mask_storeu_ps(dst + 48, m3, _mm512_add_ps(_mm512_maskz_loadu_ps(m3, dst + 48), acc[i][3]));
        }
    }
}

#elif defined(__AVX2__) && defined(__FMA__)

/* All-ones in the first `left` of 8 lanes. */
INLINE __m256i lanes8(int left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

INLINE float sum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

INLINE float max8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/* As the AVX-512 scores_q, one block of 16 keys (two registers per query head) at a time. */
INLINE void scores_q(const int Q, const float *q, int D, const float *keys, int len, float scale, float *out, int out_ld,
                     Prefetch *f) {
    const int64_t block = (int64_t)D * 16;
    __m256 s = _mm256_set1_ps(scale);
    for (int j0 = 0; j0 < len; j0 += 16) {
        const float *base = keys + (int64_t)(j0 / 16) * block;
        __m256i m0 = lanes8(len - j0), m1 = lanes8(len - j0 - 8);
        __m256 acc[MAX_Q][2];
        for (int i = 0; i < Q; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int d = 0; d < D; d++) {
            __m256 k0 = _mm256_maskload_ps(base + d * 16, m0), k1 = _mm256_maskload_ps(base + d * 16 + 8, m1);
            prefetch_some(f, 1);
            for (int i = 0; i < Q; i++) {
                __m256 qi = _mm256_broadcast_ss(q + i * D + d);
                acc[i][0] = _mm256_fmadd_ps(qi, k0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(qi, k1, acc[i][1]);
            }
        }
        for (int i = 0; i < Q; i++) {
            _mm256_maskstore_ps(out + (int64_t)i * out_ld + j0, m0, _mm256_mul_ps(acc[i][0], s));
            _mm256_maskstore_ps(out + (int64_t)i * out_ld + j0 + 8, m1, _mm256_mul_ps(acc[i][1], s));
        }
    }
}

static void softmax(float *w, int Q, int len, int64_t w_ld) {
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < Q; i++) {
        float *r = w + i * w_ld;
        __m256 top = minus_inf;
        for (int j = 0; j < len; j += 8) {
            __m256i k = lanes8(len - j);
            top = _mm256_max_ps(top, _mm256_blendv_ps(minus_inf, _mm256_maskload_ps(r + j, k), _mm256_castsi256_ps(k)));
        }
        __m256 m = _mm256_set1_ps(max8(top));
        __m256 total = _mm256_setzero_ps();
        for (int j = 0; j < len; j += 8) {
            __m256i k = lanes8(len - j);
            __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(r + j, k), m)),
                                     _mm256_castsi256_ps(k));
            _mm256_maskstore_ps(r + j, k, e);
            total = _mm256_add_ps(total, e);
        }
        __m256 inv = _mm256_set1_ps(1.f / sum8(total));
        for (int j = 0; j < len; j += 8) {
            __m256i k = lanes8(len - j);
            _mm256_maskstore_ps(r + j, k, _mm256_mul_ps(_mm256_maskload_ps(r + j, k), inv));
        }
    }
}

/* As the AVX-512 weighted_sum_q, 16 columns of D (two registers per query head) at a time; D a multiple of 8. */
INLINE void weighted_sum_q(const int Q, const float *w, int64_t w_ld, int D, const float *values, int len, float *out,
                           Prefetch *f) {
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256i m1 = lanes8(D - d0 - 8);  /* the second 8 columns, where D has them */
        __m256 acc[MAX_Q][2];
        for (int i = 0; i < Q; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        for (int j = 0; j < len; j++) {
            const float *v = values + (int64_t)j * D + d0;
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_maskload_ps(v + 8, m1);
            prefetch_some(f, 1);
            for (int i = 0; i < Q; i++) {
                __m256 wi = _mm256_broadcast_ss(w + i * w_ld + j);
                acc[i][0] = _mm256_fmadd_ps(wi, v0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(wi, v1, acc[i][1]);
            }
        }
        for (int i = 0; i < Q; i++) {
            float *dst = out + i * D + d0;
            _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), acc[i][0]));
            _mm256_maskstore_ps(dst + 8, m1, _mm256_add_ps(_mm256_maskload_ps(dst + 8, m1), acc[i][1]));
        }
    }
}
#else
#error "the fused attention kernel needs AVX-512, or AVX2 with FMA"
#endif

static void scores(int Q, const float *q, int D, const float *keys, int len, float scale, float *out, int out_ld,
                   Prefetch *f) {
    switch (Q) {
        case 1: scores_q(1, q, D, keys, len, scale, out, out_ld, f); break;
        case 2: scores_q(2, q, D, keys, len, scale, out, out_ld, f); break;
        case 3: scores_q(3, q, D, keys, len, scale, out, out_ld, f); break;
        default: scores_q(4, q, D, keys, len, scale, out, out_ld, f); break;
    }
}

static void weighted_sum(int Q, const float *w, int64_t w_ld, int D, const float *values, int len, float *out,
                         Prefetch *f) {
    switch (Q) {
        case 1: weighted_sum_q(1, w, w_ld, D, values, len, out, f); break;
        case 2: weighted_sum_q(2, w, w_ld, D, values, len, out, f); break;
        case 3: weighted_sum_q(3, w, w_ld, D, values, len, out, f); break;
        default: weighted_sum_q(4, w, w_ld, D, values, len, out, f); break;
    }
}

/* Returns 0, or 1 when Q or D is outside what this kernel handles (the caller checks first). Row strides (q_row,
   k_row, v_row) are in floats. Shapes: q (S, G*Q*D) rows; new_k, new_v (S, G*D) rows; prompt_keys
   (C, G, ceil(P/16), D, 16); prompt_values (C, G, P, D); bias (C, P) or NULL; keys (S, G, ceil(cap/16), D, 16);
   values (S, G, cap, D); scratch (S*G*Q*(P+n)); out (S, G*Q*D). Row s belongs to chunk s / chunk. n counts the
   generated columns including the one written now, at n - 1. */
int rlvr_decode_attention(const float *q, int64_t q_row, const float *new_k, int64_t k_row, const float *new_v,
                          int64_t v_row, const float *prompt_keys, const float *prompt_values, const float *bias,
                          float *keys, float *values, float *scratch, float *out, int S, int G, int Q, int D, int P,
                          int chunk, int cap, int n, float scale) {
    if (Q < 1 || Q > MAX_HEADS || D % 8 || n < 1 || n > cap) return 1;
    const int L = P + n, prompt_blocks = (P + 15) / 16, own_blocks = (cap + 15) / 16;
    #pragma omp parallel for schedule(static)
    for (int index = 0; index < S * G; index++) {
        const int s = index / G, g = index % G, c = s / chunk, col = n - 1;
        float *own_keys = keys + ((int64_t)s * G + g) * own_blocks * D * 16;
        float *own_values = values + ((int64_t)s * G + g) * cap * D;
        const float *k_new = new_k + s * k_row + g * D;
        for (int d = 0; d < D; d++) own_keys[((int64_t)(col / 16) * D + d) * 16 + col % 16] = k_new[d];
        memcpy(own_values + (int64_t)col * D, new_v + s * v_row + g * D, (size_t)D * sizeof(float));

        Prefetch f = {{0, 0}, {0, 0}};
        if (index + 1 < S * G) {  /* the next row's own keys and values: the prompt's are shared, mostly cached */
            const int t = index + 1;
            f.next[0] = (const char *)(keys + (int64_t)t * own_blocks * D * 16);
            f.end[0] = f.next[0] + (int64_t)((n + 15) / 16) * D * 16 * sizeof(float);
            f.next[1] = (const char *)(values + (int64_t)t * cap * D);
            f.end[1] = f.next[1] + (int64_t)n * D * sizeof(float);
        }
        const float *qs = q + s * q_row + (int64_t)g * Q * D;
        float *w = scratch + (int64_t)index * Q * L;
        const float *shared_keys = prompt_keys + ((int64_t)c * G + g) * prompt_blocks * D * 16;
        for (int h = 0; h < Q; h += MAX_Q) { /* query heads in groups of at most MAX_Q, each head's sums its own */
            const int heads = Q - h < MAX_Q ? Q - h : MAX_Q;
            scores(heads, qs + (int64_t)h * D, D, shared_keys, P, scale, w + (int64_t)h * L, L, &f);
            scores(heads, qs + (int64_t)h * D, D, own_keys, n, scale, w + (int64_t)h * L + P, L, &f);
        }
        if (bias)
            for (int i = 0; i < Q; i++)
                for (int j = 0; j < P; j++) w[i * L + j] += bias[(int64_t)c * P + j];
        softmax(w, Q, L, L);
        float *o = out + s * (int64_t)G * Q * D + (int64_t)g * Q * D;
        memset(o, 0, (size_t)Q * D * sizeof(float));
        for (int h = 0; h < Q; h += MAX_Q) {
            const int heads = Q - h < MAX_Q ? Q - h : MAX_Q;
            weighted_sum(heads, w + (int64_t)h * L, L, D, prompt_values + ((int64_t)c * G + g) * P * D, P,
                         o + (int64_t)h * D, &f);
            weighted_sum(heads, w + (int64_t)h * L + P, L, D, own_values, n, o + (int64_t)h * D, &f);
        }
    }
    return 0;
}
