/*
 * The input check of probability rows (hdecode::row_check) in one pass a row: a float64 sum and a minimum.
 *
 * Row b passes iff lo <= s <= hi and no entry is below 0, s its float64 sum: entry j (widened to float64, exact)
 * added to the partial sum j mod 8, then s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).  NaN anywhere
 * makes s NaN, which fails both comparisons; an infinite entry makes s infinite or NaN.  The eight partial sums
 * let the additions overlap (a compiler keeps one chain of float additions otherwise: they are not associative;
 * one chain is bound by the addition's latency) and map onto four SSE2 registers of two float64 lanes; the
 * scalar loop (strided rows, the tail, other machines) adds in the same order, so a
 * row's verdict never depends on its layout or its batch.  The torch implementation sums in an order of its own:
 * the two agree to a few float64 ulps of the row's absolute sum.
 */
#include <math.h>

#include "hdecode_native.h"

#if defined(__SSE2__) && !defined(HD_PORTABLE)
#include <emmintrin.h>
#define HD_ROW_CHECK_SSE2 1
#endif

/* The entries of a contiguous row added to the partial sums and folded into the minimum, 8 at a time; returns
 * the first entry not read. */
static int64_t fast_f32(const float *r, int64_t cols, double *s, float *low) {
    int64_t j = 0;
#ifdef HD_ROW_CHECK_SSE2
    __m128d a[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
    __m128 m = _mm_setzero_ps(), n = _mm_setzero_ps();
    for (; j + 8 <= cols; j += 8) {
        __m128 v = _mm_loadu_ps(r + j), w = _mm_loadu_ps(r + j + 4);
        a[0] = _mm_add_pd(a[0], _mm_cvtps_pd(v));                    /* entries j, j + 1 */
        a[1] = _mm_add_pd(a[1], _mm_cvtps_pd(_mm_movehl_ps(v, v)));  /* j + 2, j + 3 */
        a[2] = _mm_add_pd(a[2], _mm_cvtps_pd(w));
        a[3] = _mm_add_pd(a[3], _mm_cvtps_pd(_mm_movehl_ps(w, w)));
        m = _mm_min_ps(v, m);  /* a NaN entry leaves the minimum (the sum catches it) */
        n = _mm_min_ps(w, n);
    }
    {
        double t[2];
        float u[4];
        for (int i = 0; i < 4; i++) {
            _mm_storeu_pd(t, a[i]);
            s[2 * i] = t[0];
            s[2 * i + 1] = t[1];
        }
        _mm_storeu_ps(u, _mm_min_ps(m, n));
        for (int i = 0; i < 4; i++) *low = u[i] < *low ? u[i] : *low;
    }
#else
    (void)r; (void)cols; (void)s; (void)low;
#endif
    return j;
}

static int64_t fast_f64(const double *r, int64_t cols, double *s, double *low) {
    int64_t j = 0;
#ifdef HD_ROW_CHECK_SSE2
    __m128d a[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
    __m128d m = _mm_setzero_pd(), n = _mm_setzero_pd();
    for (; j + 8 <= cols; j += 8) {
        __m128d v0 = _mm_loadu_pd(r + j), v1 = _mm_loadu_pd(r + j + 2);
        __m128d v2 = _mm_loadu_pd(r + j + 4), v3 = _mm_loadu_pd(r + j + 6);
        a[0] = _mm_add_pd(a[0], v0);
        a[1] = _mm_add_pd(a[1], v1);
        a[2] = _mm_add_pd(a[2], v2);
        a[3] = _mm_add_pd(a[3], v3);
        m = _mm_min_pd(v1, _mm_min_pd(v0, m));
        n = _mm_min_pd(v3, _mm_min_pd(v2, n));
    }
    {
        double t[2];
        for (int i = 0; i < 4; i++) {
            _mm_storeu_pd(t, a[i]);
            s[2 * i] = t[0];
            s[2 * i + 1] = t[1];
        }
        _mm_storeu_pd(t, _mm_min_pd(m, n));
        for (int i = 0; i < 2; i++) *low = t[i] < *low ? t[i] : *low;
    }
#else
    (void)r; (void)cols; (void)s; (void)low;
#endif
    return j;
}

/* Row b's float64 sum (returned) and its entries' minimum folded into *low (which starts at 0 or above). */
#define HD_DEFINE_ROW_SUM(SUFFIX, T)                                                                          \
    static double row_sum_##SUFFIX(const T *r, int64_t cols, int64_t x_col, T *low) {                          \
        double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                                                \
        int64_t j = x_col == 1 ? fast_##SUFFIX(r, cols, s, low) : 0;                                           \
        for (; j < cols; j++) {                                                                                \
            T a = r[j * x_col];                                                                                \
            s[j & 7] += (double)a;                                                                             \
            *low = a < *low ? a : *low;                                                                        \
        }                                                                                                      \
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));                              \
    }                                                                                                          \
                                                                                                               \
    /* out[b] = 1 iff row b passes (see the top of this file). */                                             \
    void hd_row_check_##SUFFIX(int64_t rows, int64_t cols, const T *x, int64_t x_row, int64_t x_col,           \
                                double lo, double hi, uint8_t *out) {                                          \
        int64_t b;                                                                                             \
        for (b = 0; b < rows; b++) {                                                                           \
            T low = 0;                                                                                         \
            double total = row_sum_##SUFFIX(x + b * x_row, cols, x_col, &low);                                 \
            out[b] = (uint8_t)(!(low < 0) && lo <= total && total <= hi);                                      \
        }                                                                                                      \
    }                                                                                                          \
                                                                                                               \
    /* out = (smallest row sum, largest row sum, min(0, smallest entry)) of rows >= 1 rows; both sums NaN if   \
     * any row's is. */                                                                                        \
    void hd_row_stats_##SUFFIX(int64_t rows, int64_t cols, const T *x, int64_t x_row, int64_t x_col,           \
                                double *out) {                                                                 \
        int64_t b;                                                                                             \
        T low = 0;                                                                                             \
        double lo = 0.0, hi = 0.0;                                                                             \
        int nan = 0;                                                                                           \
        for (b = 0; b < rows; b++) {                                                                           \
            double total = row_sum_##SUFFIX(x + b * x_row, cols, x_col, &low);                                 \
            if (total != total) nan = 1;                                                                       \
            if (b == 0 || total < lo) lo = total;                                                              \
            if (b == 0 || total > hi) hi = total;                                                              \
        }                                                                                                      \
        out[0] = nan ? (double)NAN : lo;                                                                       \
        out[1] = nan ? (double)NAN : hi;                                                                       \
        out[2] = (double)low;                                                                                  \
    }

HD_DEFINE_ROW_SUM(f32, float)
HD_DEFINE_ROW_SUM(f64, double)
