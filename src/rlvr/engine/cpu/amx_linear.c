/* Float32 products y = a W^T on AMX, as three bfloat16 products, for x86-64 CPUs with AMX-BF16 and AVX-512.

   Built and loaded by amx_linear.py (which documents the layout and checks the arguments). With a = ah + al and
   W = Wh + Wl split into bfloat16 high and low parts, y = ah Wh + ah Wl + al Wh, accumulated in float32 on the
   tiles; the dropped al Wl is 2^-16 of the product, so y has ~16 of float32's 24 bits (float32 products here
   differ from exact ones in ~22).

   The input a is x itself, or RMSNorm(x) (x scaled by 1 / sqrt(mean(x^2) + eps), times a weight), or SiLU of
   x's first half times its second (a gated MLP's gate and up): the pass that splits a into bfloat16 computes it,
   and can write it out in float32 (for LoRA adapters, which read the same input).

   With `products` 1 the kernel is a plain bfloat16 product instead, y = ah Wh accumulated in float32 and kept in
   float32 (a bfloat16 model's frozen products with RLVR_MATMUL=bf16x1, in the trainer's forward and the sampler
   alike), on packs of Wh alone.

   Weights come packed: per block of 16 output columns, per step of 32 inputs, a 1 KiB tile of Wh then one of Wl,
   each 16 rows of input pairs x 16 columns x 2 (AMX's bfloat16 B layout); a block's tiles are consecutive. The
   blocks come in pairs and each thread takes a run of pairs: for 32 rows of a at a time it multiplies a pair
   with four accumulator tiles (2 row tiles x 2 blocks), issuing each product type to all four in turn so that
   no product waits on the one before it. With 16 rows or fewer (a decode step of a few sequences) it multiplies
   one row tile with two accumulators, half the products, in the same order for each row, so a row's result does
   not depend on how many rows are beside it. A pair's weights are read from memory once per band of rows (a band's
   other rows find them in L2), and while a pair computes, the next one is prefetched into L2. Bands keep a trainer's
   thousands of rows from streaming through L2 once per pair: a band's bfloat16 inputs, 1 MiB (576 rows of 896
   inputs in the one-product form), stay there while a thread's run of weights passes them; at 2,048 rows of
   Qwen2.5-0.5B's products that made the kernel 1.2-1.8x faster. */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_exp.h"

#if !defined(__AMX_BF16__) || !defined(__AVX512BF16__)
#error "the AMX product kernel needs AMX-BF16 and AVX512-BF16"
#endif

#define ROWS 16    /* rows of a per tile */
#define COLUMNS 16 /* output columns per block */
#define STEP 32    /* inputs per step */
#define TILE 512   /* bfloat16 values per tile (1 KiB) */
#define BAND_BYTES (1 << 20) /* a band's bfloat16 inputs: rows of a at a time, held in L2 while the weights pass */

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

static void configure(void) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = ROWS;
        config.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&config);
}

static inline __mmask16 lanes(int left) { return left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1); }

/* g * sigmoid(g), sigmoid from e = e^-|g|: 1 / (1 + e) for g >= 0, e / (1 + e) below. */
static inline __m512 silu(__m512 g) {
    __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    __m512 numerator = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ), e,
                                            _mm512_set1_ps(1.f));
    return _mm512_mul_ps(g, _mm512_div_ps(numerator, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
}

/* Rows [first, last) of the input a, from x (k columns, or 2k when gated), into bfloat16 high and low parts
   (k_padded columns each, zero past k; no low part when `low` is NULL), and into `inputs` (float32) when given. */
static void split(const float *x, int64_t x_stride, const float *norm, float eps, int gated, float *inputs,
                  int64_t inputs_stride, int first, int last, int k, int k_padded, uint16_t *high, uint16_t *low) {
    for (int r = first; r < last; r++) {
        const float *row = x + r * x_stride;
        uint16_t *h = high + (int64_t)r * k_padded, *l = low ? low + (int64_t)r * k_padded : NULL;
        float scale = 1.f;
        if (norm) {
            __m512 squares = _mm512_setzero_ps();
            for (int i = 0; i < k; i += 16) {
                __m512 v = _mm512_maskz_loadu_ps(lanes(k - i), row + i);
                squares = _mm512_fmadd_ps(v, v, squares);
            }
            scale = 1.f / sqrtf(_mm512_reduce_add_ps(squares) / (float)k + eps);
        }
        for (int i = 0; i < k_padded; i += 16) {
            __mmask16 mask = lanes(k - i);
            __m512 v = _mm512_maskz_loadu_ps(mask, row + i);
            if (norm)
                v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, norm + i), _mm512_mul_ps(v, _mm512_set1_ps(scale)));
            else if (gated)
                v = _mm512_mul_ps(silu(v), _mm512_maskz_loadu_ps(mask, row + k + i));
            if (inputs) _mm512_mask_storeu_ps(inputs + r * inputs_stride + i, mask, v);
            __m256bh vh = _mm512_cvtneps_pbh(v);
            _mm256_storeu_si256((__m256i *)(h + i), (__m256i)vh);
            if (!l) continue;
            __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)vh), 16));
            __m256bh vl = _mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
            _mm256_storeu_si256((__m256i *)(l + i), (__m256i)vl);
        }
    }
}

/* Accumulator t (row tile t >> 1, block t & 1) += A tile 4 + (t >> 1) times B tile 6 + (t & 1); the second row
   tile's two only when `both` (more than 16 rows). A row's sums are the same either way, term for term, so its
   result does not depend on the rows beside it. */
#define PRODUCTS(both)                   \
    do {                                 \
        _tile_dpbf16ps(0, 4, 6);         \
        _tile_dpbf16ps(1, 4, 7);         \
        if (both) {                      \
            _tile_dpbf16ps(2, 5, 6);     \
            _tile_dpbf16ps(3, 5, 7);     \
        }                                \
    } while (0)

/* One pair of blocks (w0, w1) against 32 rows of a (ah, al): out[0:rows, 0:columns] of the pair's 32 columns.
   `next` (bytes of the next pair, or NULL) is prefetched into L2 in even shares over the steps. With 16 rows or
   fewer, the second row tile is neither loaded nor multiplied. With al NULL, ah Wh alone (packs of Wh alone). */
static void block_pair(const uint16_t *w0, const uint16_t *w1, const char *next, int64_t next_bytes, int steps,
                       const uint16_t *ah, const uint16_t *al, int k_padded, float *out, int64_t out_stride,
                       int rows, int columns) {
    const int parts = al ? 2 : 1;
    const int64_t a_stride = (int64_t)k_padded * 2, second = (int64_t)ROWS * k_padded;
    const int64_t share = (next_bytes / steps + 63) / 64 * 64;
    const int both = rows > ROWS;
    _tile_zero(0);
    _tile_zero(1);
    if (both) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int s = 0; s < steps; s++) {
        const uint16_t *h0 = w0 + (int64_t)s * parts * TILE, *h1 = w1 + (int64_t)s * parts * TILE;
        if (next)
            for (int64_t line = s * share; line < (s + 1) * share && line < next_bytes; line += 64)
                _mm_prefetch(next + line, _MM_HINT_T1);
        const int64_t a = (int64_t)s * STEP;
        _tile_loadd(4, ah + a, a_stride);
        if (both) _tile_loadd(5, ah + a + second, a_stride);
        _tile_loadd(6, h0, 64);
        _tile_loadd(7, h1, 64);
        PRODUCTS(both); /* ah Wh */
        if (!al) continue;
        _tile_loadd(6, h0 + TILE, 64);
        _tile_loadd(7, h1 + TILE, 64);
        PRODUCTS(both); /* ah Wl */
        _tile_loadd(4, al + a, a_stride);
        if (both) _tile_loadd(5, al + a + second, a_stride);
        _tile_loadd(6, h0, 64);
        _tile_loadd(7, h1, 64);
        PRODUCTS(both); /* al Wh */
    }
    float result[4][ROWS * COLUMNS];
    _tile_stored(0, result[0], 64);
    _tile_stored(1, result[1], 64);
    if (both) {
        _tile_stored(2, result[2], 64);
        _tile_stored(3, result[3], 64);
    }
    for (int t = 0; t < (both ? 4 : 2); t++) {
        int row0 = (t >> 1) * ROWS, column0 = (t & 1) * COLUMNS;
        int row_end = rows - row0 < ROWS ? rows - row0 : ROWS;
        int width = columns - column0 < COLUMNS ? columns - column0 : COLUMNS;
        if (width > 0)
            for (int r = 0; r < row_end; r++)
                memcpy(out + (row0 + r) * out_stride + column0, result[t] + r * COLUMNS, (size_t)width * 4);
    }
}

static __thread uint16_t *scratch = NULL;
static __thread int64_t scratch_values = 0;

/* out (m, n) = a (m, k) W^T, W packed for n columns (in pairs of 16-column blocks) and k inputs (in steps of 32),
   in three bfloat16 products (`products` 3: packs of Wh and Wl) or one (1: packs of Wh alone).
   a is x, or RMSNorm(x) with weight `norm` when norm is not NULL, or silu(x[:, :k]) * x[:, k:] when gated.
   0 when done; -1 when out of memory, -2 for norm and gated together, -3 for another number of products. */
int rlvr_amx_linear(const float *x, int64_t x_stride, int m, int k, const float *norm, float eps, int gated,
                    float *inputs, int64_t inputs_stride, const uint16_t *packed, int n, float *out,
                    int64_t out_stride, int products) {
    if (norm && gated) return -2;
    if (products != 1 && products != 3) return -3;
    const int parts = products == 3 ? 2 : 1;
    const int k_padded = (k + STEP - 1) / STEP * STEP, steps = k_padded / STEP;
    const int m_padded = (m + 2 * ROWS - 1) / (2 * ROWS) * 2 * ROWS;
    const int pairs = (n + 2 * COLUMNS - 1) / (2 * COLUMNS);
    const int band_groups = (int)(BAND_BYTES / ((int64_t)k_padded * 2 * parts) / (2 * ROWS));
    const int band_rows = (band_groups > 1 ? band_groups : 1) * 2 * ROWS;
    const int64_t values = parts * (int64_t)m_padded * k_padded, pair_values = 2 * (int64_t)steps * parts * TILE;
    if (values > scratch_values) {
        free(scratch);
        scratch = aligned_alloc(64, (size_t)(values * 2 + 63) / 64 * 64);
        scratch_values = scratch ? values : 0;
        if (!scratch) return -1;
    }
    uint16_t *ah = scratch, *al = parts == 2 ? scratch + (int64_t)m_padded * k_padded : NULL;
    memset(ah + (int64_t)m * k_padded, 0, (size_t)(m_padded - m) * k_padded * 2);
    if (al) memset(al + (int64_t)m * k_padded, 0, (size_t)(m_padded - m) * k_padded * 2);
#pragma omp parallel
    {
        int threads = omp_get_num_threads(), me = omp_get_thread_num();
        split(x, x_stride, norm, eps, gated, inputs, inputs_stride, m * me / threads, m * (me + 1) / threads, k,
              k_padded, ah, al);
#pragma omp barrier
        configure();
        int first = pairs * me / threads, last = pairs * (me + 1) / threads;
        for (int band = 0; band < m; band += band_rows)
            for (int p = first; p < last; p++) {
                const uint16_t *w0 = packed + p * pair_values, *w1 = w0 + pair_values / 2;
                const char *next = p + 1 < last ? (const char *)(w0 + pair_values) : NULL;
                for (int group = band; group < m && group < band + band_rows; group += 2 * ROWS)
                    block_pair(w0, w1, group == band ? next : NULL, pair_values * 2, steps,
                               ah + (int64_t)group * k_padded, al ? al + (int64_t)group * k_padded : NULL, k_padded,
                               out + group * out_stride + p * 2 * COLUMNS, out_stride, m - group,
                               n - p * 2 * COLUMNS);
            }
        _tile_release();
    }
    return 0;
}
