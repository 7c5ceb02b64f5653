/*
 * Native CPU kernel of hdecode::gathered_prefix (kernels/fused/gathered_prefix): range sums of a gathered,
 * weighted prefix accumulated in float64, the GPU plan's node sums and leaf-depth prefix sums on a CPU.
 * Python side: kernels/fused/gathered_prefix/native.py.
 *
 * Bits: the torch implementation's, IEEE operation by IEEE operation (built with -ffp-contract=off, no
 * -ffast-math): the table [0 | C | g] of each row (g[j] = (double)x[row, src[j]], times weight[j] where given,
 * one product; C[j] = g[0] + ... + g[j] summed left to right from 0, as torch's CPU cumsum does), then each
 * range one difference of two entries of it, tab[hi'] - tab[lo'], rounded once to the output type.
 *
 * Layout: rows in groups of HD_LANES, the table entry-major with the group's lanes side by side
 * (tab[i * HD_LANES + lane]), so that the running sums of the lanes run side by side.
 */
#include "hdecode_native.h"

/*
 * out[r * out_row + k * out_col] = tab_r[ends[k]] - tab_r[ends[num_out + k]] for k < num_out, in double
 * (out_f32 == 0) or rounded to float (out_f32 != 0).  weight: NULL for all ones.  Returns 1 where the table
 * cannot be allocated, else 0.
 */
#define HD_DEFINE_GATHERED_PREFIX(SUFFIX, TIN)                                                                 \
int hd_gathered_prefix_##SUFFIX(int64_t rows, const TIN *x, int64_t x_row, int64_t x_col, int64_t num_src,     \
                                const int64_t *src, const double *weight, int64_t num_out, const int64_t *ends, \
                                void *out, int64_t out_row, int64_t out_col, int64_t out_f32) {                \
    int64_t r0, j, k, w;                                                                                        \
    double *tab = (double *)calloc((size_t)(2 * num_src + 1) * HD_LANES, sizeof(double));                      \
    if (tab == NULL) return 1;                                                                                  \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        const int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                      \
        double *g = tab + (num_src + 1) * HD_LANES;                                                             \
        double acc[HD_LANES];                                                                                   \
        for (w = 0; w < lanes; w++) {                                                                           \
            const TIN *row = x + (r0 + w) * x_row;                                                              \
            if (weight == NULL)                                                                                 \
                for (j = 0; j < num_src; j++) g[j * HD_LANES + w] = (double)row[src[j] * x_col];               \
            else                                                                                                \
                for (j = 0; j < num_src; j++) g[j * HD_LANES + w] = (double)row[src[j] * x_col] * weight[j];   \
        }                                                                                                       \
        for (w = 0; w < HD_LANES; w++) acc[w] = 0.0;                                                            \
        for (j = 0; j < num_src; j++) {                                                                         \
            const double *gj = g + j * HD_LANES;                                                                \
            double *c = tab + (j + 1) * HD_LANES;                                                               \
            for (w = 0; w < HD_LANES; w++) { acc[w] += gj[w]; c[w] = acc[w]; }                                  \
        }                                                                                                       \
        for (w = 0; w < lanes; w++) {                                                                           \
            const double *t = tab + w;                                                                          \
            if (out_f32) {                                                                                      \
                float *o = (float *)out + (r0 + w) * out_row;                                                   \
                for (k = 0; k < num_out; k++)                                                                   \
                    o[k * out_col] = (float)(t[ends[k] * HD_LANES] - t[ends[num_out + k] * HD_LANES]);          \
            } else {                                                                                            \
                double *o = (double *)out + (r0 + w) * out_row;                                                 \
                for (k = 0; k < num_out; k++)                                                                   \
                    o[k * out_col] = t[ends[k] * HD_LANES] - t[ends[num_out + k] * HD_LANES];                   \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    free(tab);                                                                                                  \
    return 0;                                                                                                   \
}

HD_DEFINE_GATHERED_PREFIX(f32, float)
HD_DEFINE_GATHERED_PREFIX(f64, double)
