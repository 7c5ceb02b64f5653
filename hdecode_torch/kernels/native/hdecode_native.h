/*
 * What the native CPU kernels' C sources share (every *.c file next to this one is compiled into one library):
 * the floating-point guard, the row groups, and the per-level node sums of a group of rows (load_<SUFFIX> and
 * sum_<SUFFIX>, static functions a source instantiates with HD_DEFINE_TREE_SUMS for its types).
 *
 * Bits: every node's sum is 0, then its children's sums added one at a time in ascending id order, in the
 * accumulation type; exactly the additions of the torch path (kernels/tree_sums.py).  See hdecode_native.c.
 */
#ifndef HDECODE_NATIVE_H
#define HDECODE_NATIVE_H
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "hdecode_native needs float arithmetic evaluated in each operand's own type (FLT_EVAL_METHOD == 0)"
#endif

#define HD_LANES 8
/* The leaves of a full group of rows moved into the buffer by a transposition of 4 x 4 blocks in SSE registers
 * (x86-64 always has SSE2): moves only, the bits unchanged, and the products by the leaves' weights if given.  Returns how many leaves it moved (a multiple of 4;
 * the caller moves the rest one by one); 0 where it does not apply. */
#if defined(__SSE2__) && !defined(HD_PORTABLE)
#include <emmintrin.h>
static int64_t fast_load_f32(float *acc, int64_t lanes, int64_t num_leaves, const float *x, int64_t x_leaf,
                             int64_t x_row, const float *weight) {
    int64_t l, g;
    if (lanes != HD_LANES || x_leaf != 1) return 0;
    for (l = 0; l + 4 <= num_leaves; l += 4) {
        for (g = 0; g < HD_LANES; g += 4) {
            __m128 r0 = _mm_loadu_ps(x + (g + 0) * x_row + l), r1 = _mm_loadu_ps(x + (g + 1) * x_row + l);
            __m128 r2 = _mm_loadu_ps(x + (g + 2) * x_row + l), r3 = _mm_loadu_ps(x + (g + 3) * x_row + l);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            if (weight != NULL) {  /* leaf l + i's row times its weight: one IEEE product a lane, as scalars */
                r0 = _mm_mul_ps(r0, _mm_set1_ps(weight[l + 0]));
                r1 = _mm_mul_ps(r1, _mm_set1_ps(weight[l + 1]));
                r2 = _mm_mul_ps(r2, _mm_set1_ps(weight[l + 2]));
                r3 = _mm_mul_ps(r3, _mm_set1_ps(weight[l + 3]));
            }
            _mm_storeu_ps(acc + (l + 0) * HD_LANES + g, r0);
            _mm_storeu_ps(acc + (l + 1) * HD_LANES + g, r1);
            _mm_storeu_ps(acc + (l + 2) * HD_LANES + g, r2);
            _mm_storeu_ps(acc + (l + 3) * HD_LANES + g, r3);
        }
    }
    return l;
}
#else
static int64_t fast_load_f32(float *acc, int64_t lanes, int64_t num_leaves, const float *x, int64_t x_leaf,
                             int64_t x_row, const float *weight) {
    (void)acc; (void)lanes; (void)num_leaves; (void)x; (void)x_leaf; (void)x_row; (void)weight;
    return 0;
}
#endif
#define fast_load_f64(acc, lanes, num_leaves, x, x_leaf, x_row, weight) 0
#define fast_load_f32w(acc, lanes, num_leaves, x, x_leaf, x_row, weight) 0

/* The children of the internal nodes as CSR, parents in an order that puts every internal child before its
 * parent (deepest first): parent[i]'s children are child[start[i] .. start[i + 1]), ascending ids. */
#define HD_DEFINE_TREE_SUMS(SUFFIX, TIN, TACC)                                                                     \
/* acc[l * HD_LANES + w] = x[l * x_leaf + w * x_row] (times weight[l], rounded in TIN, when weight is given) */  \
static void load_##SUFFIX(TACC *acc, int64_t lanes, int64_t num_leaves, const TIN *x, int64_t x_leaf,          \
                          int64_t x_row, const TIN *weight) {                                                   \
    int64_t w, l;                                                                                               \
    const int64_t first = fast_load_##SUFFIX(acc, lanes, num_leaves, x, x_leaf, x_row, weight);                 \
    for (w = 0; w < lanes; w++) {                                                                               \
        const TIN *row = x + w * x_row;                                                                         \
        if (weight != NULL) {                                                                                   \
            for (l = first; l < num_leaves; l++) {                                                              \
                const TIN v = row[l * x_leaf] * weight[l];                                                      \
                acc[l * HD_LANES + w] = (TACC)v;                                                                \
            }                                                                                                   \
        } else if (x_leaf == 1) {                                                                               \
            for (l = first; l < num_leaves; l++) acc[l * HD_LANES + w] = (TACC)row[l];                          \
        } else {                                                                                                \
            for (l = first; l < num_leaves; l++) acc[l * HD_LANES + w] = (TACC)row[l * x_leaf];                 \
        }                                                                                                       \
    }                                                                                                           \
}                                                                                                               \
                                                                                                                \
static void sum_##SUFFIX(TACC *acc, int64_t lanes, int64_t num_parents, const int64_t *parent,                 \
                         const int64_t *start, const int64_t *child) {                                          \
    int64_t i, j, w;                                                                                            \
    if (lanes < HD_LANES) {  /* the last group of rows, or a few rows: only the lanes in use */                  \
        for (i = 0; i < num_parents; i++) {                                                                     \
            TACC *dst = acc + parent[i] * HD_LANES;                                                             \
            for (w = 0; w < lanes; w++) {                                                                       \
                TACC s = 0;                                                                                     \
                for (j = start[i]; j < start[i + 1]; j++) s += acc[child[j] * HD_LANES + w];                    \
                dst[w] = s;                                                                                     \
            }                                                                                                   \
        }                                                                                                       \
        return;                                                                                                 \
    }                                                                                                           \
    for (i = 0; i < num_parents; i++) {                                                                         \
        TACC s[HD_LANES];                                                                                       \
        TACC *dst = acc + parent[i] * HD_LANES;                                                                 \
        for (w = 0; w < HD_LANES; w++) s[w] = 0;                                                                \
        for (j = start[i]; j < start[i + 1]; j++) {                                                             \
            const TACC *c = acc + child[j] * HD_LANES;                                                          \
            for (w = 0; w < HD_LANES; w++) s[w] += c[w];                                                        \
        }                                                                                                       \
        for (w = 0; w < HD_LANES; w++) dst[w] = s[w];                                                           \
    }                                                                                                           \
}

#endif
