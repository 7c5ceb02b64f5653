/*
 * Native CPU kernels of hdecode_torch: the per-level node sums p(n) = sum of p(l) over the leaves l under n,
 * and the deepest node with p(n) > t, one pass over each row of leaf probabilities; and the float64 prefix
 * sums of each row's leaves in a given order (kernels/depth_ranges.py).
 *
 * Plain C99 over raw pointers, element strides and int64 index tables, built by the package on first use
 * (hdecode_torch/kernels/native/_build.py) and called through ctypes.  No Python or torch header.
 *
 * Bits: every node's sum is 0, then its children's sums added one at a time in ascending id order, in the
 * accumulation type; exactly the additions of the torch path (kernels/tree_sums.py: the leaves' rows added
 * into their parents by one index_add_, then one index_add_ per level over the internal nodes, deepest
 * first; leaves have the smallest ids and every level lists its nodes in ascending order).  Each addition
 * is one IEEE operation of its type: built without -ffast-math and with -ffp-contract=off, and refused
 * (#error) where the compiler would evaluate float expressions in a wider type.
 *
 * Layout: rows are processed in groups of HD_LANES; a group's sums live in a node-major buffer of
 * N x HD_LANES values (acc[n * HD_LANES + lane]), so each addition is a short loop over the lanes that
 * the compiler can vectorise without changing any lane's bits, and the buffer stays in the L1/L2 cache.  A
 * last, partial group sums only its lanes; the others hold zeros (calloc) or an earlier group's values, which
 * the threshold scans read and no output takes.
 */
#include "hdecode_native.h"

#define HD_ABI 3

int64_t hd_native_abi(void) { return HD_ABI; }

#define HD_DEFINE(SUFFIX, TIN, TACC, TOUT)                                                                     \
HD_DEFINE_TREE_SUMS(SUFFIX, TIN, TACC)                                                                          \
                                                                                                                \
/* out[n * out_node + r * out_row] = p(n) of row r, in TOUT (rounded from TACC once, at the end). */             \
int hd_node_sums_##SUFFIX(int64_t rows, int64_t num_leaves, int64_t num_nodes, const TIN *x, int64_t x_leaf,    \
                          int64_t x_row, TOUT *out, int64_t out_node, int64_t out_row, int64_t num_parents,     \
                          const int64_t *parent, const int64_t *start, const int64_t *child) {                  \
    int64_t r0, n, w;                                                                                           \
    TACC *acc = (TACC *)calloc((size_t)num_nodes * HD_LANES, sizeof(TACC));                                    \
    if (acc == NULL) return 1;                                                                                  \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                            \
        load_##SUFFIX(acc, lanes, num_leaves, x + r0 * x_row, x_leaf, x_row, NULL);                                   \
        sum_##SUFFIX(acc, lanes, num_parents, parent, start, child);                                                   \
        if (lanes == HD_LANES && out_row == 1) {                                                                \
            for (n = 0; n < num_nodes; n++) {                                                                   \
                TOUT *o = out + n * out_node + r0;                                                              \
                const TACC *a = acc + n * HD_LANES;                                                             \
                for (w = 0; w < HD_LANES; w++) o[w] = (TOUT)a[w];                                               \
            }                                                                                                   \
        } else {                                                                                                \
            for (n = 0; n < num_nodes; n++)                                                                     \
                for (w = 0; w < lanes; w++) out[n * out_node + (r0 + w) * out_row] = (TOUT)acc[n * HD_LANES + w]; \
        }                                                                                                       \
    }                                                                                                           \
    free(acc);                                                                                                  \
    return 0;                                                                                                   \
}                                                                                                               \
                                                                                                                \
/* pred[r * pred_stride] = the node of largest key[n] among those whose p(n), rounded to TOUT, exceeds        \
 * threshold rounded to TOUT; node_of[0] (the root) where none does.  key: distinct, 1..N, 0 never used. */    \
int hd_deepest_above_##SUFFIX(int64_t rows, int64_t num_leaves, int64_t num_nodes, const TIN *x,               \
                              int64_t x_leaf, int64_t x_row, int64_t *pred, int64_t pred_stride,               \
                              double threshold, int64_t num_parents, const int64_t *parent,                    \
                              const int64_t *start, const int64_t *child, const int32_t *key,                  \
                              const int64_t *node_of) {                                                        \
    int64_t r0, n, w;                                                                                           \
    const TOUT t = (TOUT)threshold;                                                                             \
    TACC *acc = (TACC *)calloc((size_t)num_nodes * HD_LANES, sizeof(TACC));                                    \
    if (acc == NULL) return 1;                                                                                  \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                            \
        int32_t best[HD_LANES];                                                                                 \
        load_##SUFFIX(acc, lanes, num_leaves, x + r0 * x_row, x_leaf, x_row, NULL);                                   \
        sum_##SUFFIX(acc, lanes, num_parents, parent, start, child);                                                   \
        for (w = 0; w < HD_LANES; w++) best[w] = 0;                                                             \
        for (n = 0; n < num_nodes; n++) {                                                                       \
            const TACC *a = acc + n * HD_LANES;                                                                 \
            const int32_t k = key[n];                                                                           \
            int above = 0;                                                                                      \
            for (w = 0; w < HD_LANES; w++) above |= (TOUT)a[w] > t;                                             \
            if (above)  /* rare in a row of probabilities: the nodes above t >= 1/2 are one root path */          \
                for (w = 0; w < HD_LANES; w++)                                                                  \
                    if ((TOUT)a[w] > t && k > best[w]) best[w] = k;                                             \
        }                                                                                                       \
        for (w = 0; w < lanes; w++) pred[(r0 + w) * pred_stride] = node_of[best[w]];                            \
    }                                                                                                           \
    free(acc);                                                                                                  \
    return 0;                                                                                                   \
}                                                                                                       \
                                                                                                                \
/* out[n * out_node + r * out_row] = 1 where p_w(n) > share * p_w(root) (both rounded to TOUT, the product in     \
 * TOUT), else 0; p_w(n) the sum over the leaves l under n of x[l] * weight[l], each product rounded in TIN. */    \
int hd_above_root_share_##SUFFIX(int64_t rows, int64_t num_leaves, int64_t num_nodes, const TIN *x,            \
                                 int64_t x_leaf, int64_t x_row, const TIN *weight, uint8_t *out,               \
                                 int64_t out_node, int64_t out_row, double share, int64_t root,                \
                                 int64_t num_parents, const int64_t *parent, const int64_t *start,             \
                                 const int64_t *child) {                                                       \
    int64_t r0, n, w;                                                                                           \
    const TOUT f = (TOUT)share;                                                                                 \
    TACC *acc = (TACC *)calloc((size_t)num_nodes * HD_LANES, sizeof(TACC));                                    \
    if (acc == NULL) return 1;                                                                                  \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                            \
        TOUT bar[HD_LANES];                                                                                     \
        load_##SUFFIX(acc, lanes, num_leaves, x + r0 * x_row, x_leaf, x_row, weight);                           \
        sum_##SUFFIX(acc, lanes, num_parents, parent, start, child);                                                   \
        for (w = 0; w < HD_LANES; w++) bar[w] = f * (TOUT)acc[root * HD_LANES + w];                             \
        if (lanes == HD_LANES && out_row == 1) {                                                                \
            for (n = 0; n < num_nodes; n++) {                                                                   \
                uint8_t *o = out + n * out_node + r0;                                                           \
                const TACC *a = acc + n * HD_LANES;                                                             \
                for (w = 0; w < HD_LANES; w++) o[w] = (TOUT)a[w] > bar[w];                                      \
            }                                                                                                   \
        } else {                                                                                                \
            for (n = 0; n < num_nodes; n++)                                                                     \
                for (w = 0; w < lanes; w++)                                                                     \
                    out[n * out_node + (r0 + w) * out_row] = (TOUT)acc[n * HD_LANES + w] > bar[w];              \
        }                                                                                                       \
    }                                                                                                           \
    free(acc);                                                                                                  \
    return 0;                                                                                                   \
}

HD_DEFINE(f32, float, float, float)
HD_DEFINE(f64, double, double, double)
/* float32 probabilities summed in float64 (trees with a node of very many children), rounded to float32 */
HD_DEFINE(f32w, float, double, float)

/* Prefix sums in float64 of each row's leaves in the order order[0 .. L): for every row r,
 * out[0 * out_pos + r * out_row] = 0 and out[(j + 1) * out_pos + r * out_row] = s_j, with s_{-1} = 0 and
 * s_j = s_{j-1} + (double)x[order[j] * x_leaf + r * x_row]: one IEEE double addition each, left to right,
 * the sequence torch's CPU cumsum runs along either dimension (an accumulator started at 0, so a first -0.0
 * gives +0.0), after an exact conversion of float32 values.  Leaf-major output (out_row == 1) sums a whole
 * output row from the previous one (B independent sums, vectorisable); any other layout sums HD_PREFIX_LANES
 * rows at a time from a buffer (below). */
#define HD_PREFIX_LANES 4  /* the rows summed together: four accumulators below */
#define HD_DEFINE_PREFIX(SUFFIX, TIN)                                                                          \
void hd_depth_prefix_##SUFFIX(int64_t rows, int64_t num_leaves, const TIN *x, int64_t x_leaf, int64_t x_row,    \
                             const int64_t *order, double *out, int64_t out_pos, int64_t out_row) {             \
    int64_t r0, r, j, w;                                                                                        \
    double *buf;                                                                                                \
    if (out_row == 1) {                                                                                         \
        for (r = 0; r < rows; r++) out[r] = 0.0;                                                                \
        for (j = 0; j < num_leaves; j++) {                                                                      \
            const TIN *xj = x + order[j] * x_leaf;                                                              \
            const double *prev = out + j * out_pos;                                                             \
            double *cur = out + (j + 1) * out_pos;                                                              \
            if (x_row == 1)                                                                                     \
                for (r = 0; r < rows; r++) cur[r] = prev[r] + (double)xj[r];                                    \
            else                                                                                                \
                for (r = 0; r < rows; r++) cur[r] = prev[r] + (double)xj[r * x_row];                            \
        }                                                                                                       \
        return;                                                                                                 \
    }                                                                                                           \
    /* leaves[l * HD_PREFIX_LANES + w]: row r0 + w's leaf l in double, read in storage order (the prefetcher    \
     * follows it; gathered from memory in the tree's order, rows were a cache miss per line), then gathered    \
     * from this buffer, which stays in the L1 cache; HD_PREFIX_LANES independent chains of additions. */       \
    buf = (double *)malloc((size_t)(num_leaves > 0 ? num_leaves : 1) * HD_PREFIX_LANES * sizeof(double));     \
    for (r0 = 0; buf != NULL && r0 + HD_PREFIX_LANES <= rows; r0 += HD_PREFIX_LANES) {                          \
        double *o = out + r0 * out_row;                                                                         \
        for (w = 0; w < HD_PREFIX_LANES; w++) {                                                                 \
            const TIN *row = x + (r0 + w) * x_row;                                                              \
            if (x_leaf == 1)                                                                                    \
                for (j = 0; j < num_leaves; j++) buf[j * HD_PREFIX_LANES + w] = (double)row[j];                 \
            else                                                                                                \
                for (j = 0; j < num_leaves; j++) buf[j * HD_PREFIX_LANES + w] = (double)row[j * x_leaf];        \
            o[w * out_row] = 0.0;                                                                               \
        }                                                                                                       \
        {   /* four named accumulators: an array of them was kept on the stack, a store and a reload a sum */   \
            double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;                                                      \
            for (j = 0; j < num_leaves; j++) {                                                                  \
                const double *lj = buf + order[j] * HD_PREFIX_LANES;                                            \
                double *oj = o + (j + 1) * out_pos;                                                             \
                s0 += lj[0]; s1 += lj[1]; s2 += lj[2]; s3 += lj[3];                                             \
                oj[0] = s0; oj[out_row] = s1; oj[2 * out_row] = s2; oj[3 * out_row] = s3;                       \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    if (buf == NULL) r0 = 0;  /* no buffer: every row one at a time, the same sums */                           \
    free(buf);                                                                                                  \
    for (r = r0; r < rows; r++) {  /* the last rows, fewer than HD_PREFIX_LANES: one at a time */                   \
        double s = 0.0;                                                                                         \
        const TIN *xr = x + r * x_row;                                                                          \
        double *o = out + r * out_row;                                                                          \
        o[0] = 0.0;                                                                                             \
        for (j = 0; j < num_leaves; j++) {                                                                      \
            s += (double)xr[order[j] * x_leaf];                                                                 \
            o[(j + 1) * out_pos] = s;                                                                           \
        }                                                                                                       \
    }                                                                                                           \
}

HD_DEFINE_PREFIX(f32, float)
HD_DEFINE_PREFIX(f64, double)
