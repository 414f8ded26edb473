/* Float32 products y = x W^T (+ b) for a few dozen rows, for x86-64 CPUs with AVX2 and FMA.

   Built and loaded by fma_linear.py (which documents the layout and checks the arguments). A decode step
   multiplies 1 to 64 rows by each weight matrix: too few rows for a general matrix product to reach the CPU's
   multiply rate, and the weights, read from memory once per step, are most of the time at a few rows. This
   kernel reads each weight once per call, whatever the row count, and keeps up to 12 accumulators in flight.

   Weights come packed: per block of 16 output columns, the block's K inputs in order, 16 floats each (the
   columns of one input side by side), zero past the last column. Each thread takes a run of blocks; for each
   block, the rows go in tiles of at most 6 (the rows split evenly, so 8 rows are two tiles of 4), each tile
   multiplied by the block over all K inputs, the block staying in L2 from one tile to the next. A tile of 1 to
   3 rows takes two blocks at once, so that it too has at least 8 independent sums.

   Arithmetic: each output is one float32 fused multiply-add chain over the inputs in order, k = 0, 1, ..., K-1,
   then the bias: the same operations whatever the row count, the tiles or the thread count, so a row's result
   depends on that row alone, bit for bit (what the sampler's seed guarantee needs). */

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the float32 product kernel needs AVX2 and FMA"
#endif

#define COLUMNS 16 /* output columns per block */
#define MAX_ROWS 6 /* rows per tile */

#define INLINE static inline __attribute__((always_inline))

/* Row r of a tile's sums (`vectors` of 8 floats) into out: `width` valid columns, plus the bias. */
INLINE void store_row(__m256 s0, __m256 s1, __m256 s2, __m256 s3, int vectors, const float *bias, float *out,
                      int width) {
    float sums[32] = {0};
    _mm256_storeu_ps(sums, s0);
    _mm256_storeu_ps(sums + 8, s1);
    if (vectors == 4) {
        _mm256_storeu_ps(sums + 16, s2);
        _mm256_storeu_ps(sums + 24, s3);
    }
    for (int c = 0; c < width; c++) out[c] = bias ? sums[c] + bias[c] : sums[c];
}

/* The tiles' sums are named variables (s<row><vector>), not an array: the compiler keeps them in registers. A row
   past the tile's count is compiled out (`rows` is a constant in each call of tile_rows). */
#define SUMS(r) __m256 s##r##0 = _mm256_setzero_ps(), s##r##1 = s##r##0, s##r##2 = s##r##0, s##r##3 = s##r##0
#define FMA2(r)                                                                                                     \
    if (rows > r) {                                                                                                 \
        __m256 a = _mm256_broadcast_ss(x + r * x_stride + i);                                                       \
        s##r##0 = _mm256_fmadd_ps(a, w0, s##r##0);                                                                  \
        s##r##1 = _mm256_fmadd_ps(a, w1, s##r##1);                                                                  \
    }
#define FMA4(r)                                                                                                     \
    if (rows > r) {                                                                                                 \
        __m256 a = _mm256_broadcast_ss(x + r * x_stride + i);                                                       \
        s##r##0 = _mm256_fmadd_ps(a, w0, s##r##0);                                                                  \
        s##r##1 = _mm256_fmadd_ps(a, w1, s##r##1);                                                                  \
        s##r##2 = _mm256_fmadd_ps(a, w2, s##r##2);                                                                  \
        s##r##3 = _mm256_fmadd_ps(a, w3, s##r##3);                                                                  \
    }
#define STORE(r, vectors)                                                                                           \
    if (rows > r) store_row(s##r##0, s##r##1, s##r##2, s##r##3, vectors, bias, out + r * out_stride, width);

/* rows (<= 6) x 16 outputs: x rows [0, rows) (stride x_stride) times one block w (k x 16), into out (stride
   out_stride, `width` valid columns). */
INLINE void tile(const float *x, int64_t x_stride, const int rows, int k, const float *w, const float *next,
                 const float *bias, float *out, int64_t out_stride, int width) {
    SUMS(0); SUMS(1); SUMS(2); SUMS(3); SUMS(4); SUMS(5);
    for (int i = 0; i < k; i++) {
        const float *wi = w + (int64_t)i * COLUMNS;
        if (next) _mm_prefetch((const char *)(next + (int64_t)i * COLUMNS), _MM_HINT_T1);
        __m256 w0 = _mm256_load_ps(wi), w1 = _mm256_load_ps(wi + 8);
        FMA2(0) FMA2(1) FMA2(2) FMA2(3) FMA2(4) FMA2(5)
    }
    STORE(0, 2) STORE(1, 2) STORE(2, 2) STORE(3, 2) STORE(4, 2) STORE(5, 2)
}

/* The same for rows <= 3 and two consecutive blocks (32 outputs), so that a few rows still have 8 or more sums in
   flight. */
INLINE void tile_pair(const float *x, int64_t x_stride, const int rows, int k, const float *w, const float *next,
                      const float *bias, float *out, int64_t out_stride, int width) {
    SUMS(0); SUMS(1); SUMS(2);
    const float *v = w + (int64_t)k * COLUMNS;
    for (int i = 0; i < k; i++) {
        const float *wi = w + (int64_t)i * COLUMNS, *vi = v + (int64_t)i * COLUMNS;
        if (next) {
            _mm_prefetch((const char *)(next + (int64_t)i * 2 * COLUMNS), _MM_HINT_T1);
            _mm_prefetch((const char *)(next + (int64_t)i * 2 * COLUMNS + COLUMNS), _MM_HINT_T1);
        }
        __m256 w0 = _mm256_load_ps(wi), w1 = _mm256_load_ps(wi + 8);
        __m256 w2 = _mm256_load_ps(vi), w3 = _mm256_load_ps(vi + 8);
        FMA4(0) FMA4(1) FMA4(2)
    }
    STORE(0, 4) STORE(1, 4) STORE(2, 4)
}

/* One tile's rows, a compile-time count for each case (so the row loops unroll and the sums stay in registers). */
static void tile_rows(const float *x, int64_t x_stride, int rows, int k, const float *w, const float *next,
                      int blocks, const float *bias, float *out, int64_t out_stride, int width) {
    if (blocks == 2) {
        switch (rows) {
            case 1: tile_pair(x, x_stride, 1, k, w, next, bias, out, out_stride, width); return;
            case 2: tile_pair(x, x_stride, 2, k, w, next, bias, out, out_stride, width); return;
            case 3: tile_pair(x, x_stride, 3, k, w, next, bias, out, out_stride, width); return;
        }
    }
    switch (rows) {
        case 1: tile(x, x_stride, 1, k, w, next, bias, out, out_stride, width); return;
        case 2: tile(x, x_stride, 2, k, w, next, bias, out, out_stride, width); return;
        case 3: tile(x, x_stride, 3, k, w, next, bias, out, out_stride, width); return;
        case 4: tile(x, x_stride, 4, k, w, next, bias, out, out_stride, width); return;
        case 5: tile(x, x_stride, 5, k, w, next, bias, out, out_stride, width); return;
        case 6: tile(x, x_stride, 6, k, w, next, bias, out, out_stride, width); return;
    }
}

/* y (rows x n, stride out_stride) = x (rows x k, stride x_stride) W^T + bias (n, or NULL), W packed as above. */
void rlvr_fma_linear(const float *x, int64_t x_stride, int rows, int k, const float *packed, int n,
                     const float *bias, float *out, int64_t out_stride) {
    const int blocks = (n + COLUMNS - 1) / COLUMNS;
    const int tiles = (rows + MAX_ROWS - 1) / MAX_ROWS;
    const int per_tile = tiles ? (rows + tiles - 1) / tiles : 0; /* even split: 8 rows -> 4 + 4 */
    const int pair = per_tile <= 3;                               /* few rows: two blocks at a time */
    const int step = pair ? 2 : 1;
    const int units = (blocks + step - 1) / step;
#pragma omp parallel
    {
        const int threads = omp_get_num_threads(), me = omp_get_thread_num();
        const int first = (int)((int64_t)units * me / threads), last = (int)((int64_t)units * (me + 1) / threads);
        for (int u = first; u < last; u++) {
            const int b = u * step, count = b + step <= blocks ? step : 1;
            const int column = b * COLUMNS;
            const int width = n - column < count * COLUMNS ? n - column : count * COLUMNS;
            const float *w = packed + (int64_t)b * k * COLUMNS;
            const float *next = u + 1 < last ? w + (int64_t)count * k * COLUMNS : NULL; /* read while w computes */
            for (int r = 0; r < rows; r += per_tile) {
                const int here = rows - r < per_tile ? rows - r : per_tile;
                tile_rows(x + r * x_stride, x_stride, here, k, w, r ? NULL : next, count, bias ? bias + column : NULL,
                          out + r * out_stride + column, out_stride, width);
            }
        }
    }
}
