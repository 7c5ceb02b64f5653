/*
 * Native CPU kernels of the node decoders' fused ops: hdecode::path_score_best (Zhao's similarity, the LCA
 * height) and hdecode::wu_palmer_best (Wu-Palmer's structural decoder), a whole decision per row, no (N, B)
 * table.  Python side: kernels/fused/path_score_best/native.py and kernels/fused/wu_palmer_best/native.py,
 * which pass the tables the ops' torch implementations derive (reordered nodes, table endpoints, weights).
 *
 * Bits: every value is the torch implementation's, IEEE operation by IEEE operation in the same order and
 * type (built with -ffp-contract=off, no -ffast-math): the table [0 | C | g] of each row (g the gathered leaf
 * probabilities in float64, C their inclusive prefix, summed left to right from 0 as torch's CPU cumsum
 * does), each range sum one difference of two of its entries, the Euler tour's terms and their running sum
 * from 0, then the scores and the first best in the order the caller gives.  The decisions are therefore
 * the torch implementation's, row by row, at any batch size.
 *
 * Layout: rows in groups of HD_LANES, every table node-major with the group's lanes side by side
 * (t[i * HD_LANES + lane]), so that each operation is a loop over the lanes (vectorisable without changing
 * any lane's bits) and the Euler tour's running sums of the lanes run side by side.  A last, partial group
 * computes its unused lanes from zeros (or from an earlier group's values): no output reads them.
 */
#include <math.h>
#include <string.h>

#include "hdecode_native.h"

/* One operation on the HD_LANES lanes of a group (restrict parameters: the compiler vectorises these loops, each
 * lane's operation unchanged). */
static void lanes_sub(double *restrict o, const double *restrict a, const double *restrict b) {
    int w;
    for (w = 0; w < HD_LANES; w++) o[w] = a[w] - b[w];
}

/* o = a * s + b * t */
static void lanes_mul_add(double *restrict o, const double *restrict a, double s, const double *restrict b,
                          double t) {
    int w;
    for (w = 0; w < HD_LANES; w++) o[w] = a[w] * s + b[w] * t;
}

/* acc += a * s, then o = acc */
static void lanes_scan(double *restrict acc, double *restrict o, const double *restrict a, double s) {
    int w;
    for (w = 0; w < HD_LANES; w++) { acc[w] += a[w] * s; o[w] = acc[w]; }
}

/* acc += a, then o = acc */
static void lanes_scan1(double *restrict acc, double *restrict o, const double *restrict a) {
    int w;
    for (w = 0; w < HD_LANES; w++) { acc[w] += a[w]; o[w] = acc[w]; }
}

/* The running best of each lane: where score > best (``higher``) or score < best, best = score and first = k (the
 * first best entry is kept among equal ones). */
static void lanes_best(double *restrict best, int64_t *restrict first, const double *restrict score, int64_t k,
                       int higher) {
    int w;
    if (higher) {
        for (w = 0; w < HD_LANES; w++) {
            const int up = score[w] > best[w];
            best[w] = up ? score[w] : best[w];
            first[w] = up ? k : first[w];
        }
    } else {
        for (w = 0; w < HD_LANES; w++) {
            const int up = score[w] < best[w];
            best[w] = up ? score[w] : best[w];
            first[w] = up ? k : first[w];
        }
    }
}

/* tab = [0 | C | g] of a group: g[j] = (double)x[row w, src[j]], C[j] = g[0] + ... + g[j] summed from 0. */
#define HD_DEFINE_PREFIX_TABLE(SUFFIX, TIN)                                                                    \
static void prefix_table_##SUFFIX(double *tab, int64_t lanes, const TIN *x, int64_t x_row, int64_t x_col,     \
                                  int64_t num_src, const int64_t *src) {                                       \
    int64_t j, w;                                                                                               \
    double acc[HD_LANES];                                                                                       \
    double *g = tab + (num_src + 1) * HD_LANES;                                                                 \
    for (j = 0; j < num_src; j++) {                                                                             \
        const TIN *col = x + src[j] * x_col;                                                                    \
        double *gj = g + j * HD_LANES;                                                                          \
        for (w = 0; w < lanes; w++) gj[w] = (double)col[w * x_row];                                             \
    }                                                                                                           \
    for (w = 0; w < HD_LANES; w++) { acc[w] = 0; tab[w] = 0; }                                                  \
    for (j = 0; j < num_src; j++) {                                                                             \
        double *c = tab + (j + 1) * HD_LANES;                                                                   \
        lanes_scan1(acc, c, g + j * HD_LANES);                                                                  \
    }                                                                                                           \
}

HD_DEFINE_PREFIX_TABLE(f32, float)
HD_DEFINE_PREFIX_TABLE(f64, double)

/*
 * hdecode::path_score_best on the tables of its torch implementation's _prepared (nodes reordered: the K
 * allowed ones first, in preference order).  ends (2N): p(k) = tab[ends[k]] - tab[ends[N + k]];
 * v(k) = p(parent[k]) * alpha[k] + p(k) * beta[k]; E[0] = 0, E[i + 1] = E[i] + v(euler[i]) * sign[i];
 * for k < K: score = E[at[k] + at_offset] (* gamma[k] where gamma is given) + p(k) * delta[k], NaN read as the
 * worst value; pred[r * pred_stride] = keep[first best k], -1 where the best is the worst value (-inf when
 * higher is better, +inf otherwise).  Returns 1 where its buffers cannot be allocated, else 0.
 */
#define HD_DEFINE_PATH_SCORE_BEST(SUFFIX, TIN)                                                                 \
int hd_path_score_best_##SUFFIX(int64_t rows, const TIN *x, int64_t x_row, int64_t x_col, int64_t num_src,    \
                                const int64_t *src, int64_t num_nodes, const int64_t *ends,                    \
                                const int64_t *parent, const double *alpha, const double *beta,                \
                                int64_t tour_len, const int64_t *euler, const double *sign, const int64_t *at, \
                                int64_t at_offset, int64_t num_kept, const double *gamma, const double *delta, \
                                const int64_t *keep, int64_t higher, int64_t *pred, int64_t pred_stride) {     \
    int64_t r0, i, k, w;                                                                                        \
    const double worst = higher ? -INFINITY : INFINITY;                                                         \
    const size_t tab_n = (size_t)(2 * num_src + 1), node_n = (size_t)num_nodes, tour_n = (size_t)(tour_len + 1); \
    double *tab = (double *)calloc((tab_n + 2 * node_n + tour_n) * HD_LANES, sizeof(double));                 \
    double *p, *v, *e;                                                                                          \
    if (tab == NULL) return 1;                                                                                  \
    p = tab + tab_n * HD_LANES;                                                                                 \
    v = p + node_n * HD_LANES;                                                                                  \
    e = v + node_n * HD_LANES;                                                                                  \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        const int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                      \
        double acc[HD_LANES], best[HD_LANES];                                                                   \
        int64_t first[HD_LANES];                                                                                \
        prefix_table_##SUFFIX(tab, lanes, x + r0 * x_row, x_row, x_col, num_src, src);                          \
        for (k = 0; k < num_nodes; k++) {                                                                       \
            lanes_sub(p + k * HD_LANES, tab + ends[k] * HD_LANES, tab + ends[num_nodes + k] * HD_LANES);        \
        }                                                                                                       \
        for (k = 0; k < num_nodes; k++) {                                                                       \
            lanes_mul_add(v + k * HD_LANES, p + parent[k] * HD_LANES, alpha[k], p + k * HD_LANES, beta[k]);     \
        }                                                                                                       \
        for (w = 0; w < HD_LANES; w++) { acc[w] = 0; e[w] = 0; }                                                \
        for (i = 0; i < tour_len; i++) {                                                                        \
            lanes_scan(acc, e + (i + 1) * HD_LANES, v + euler[i] * HD_LANES, sign[i]);                          \
        }                                                                                                       \
        /* the torch path: NaN made the worst value, then the first best entry (every entry the worst: the     \
         * first, which answers -1 either way) */                                                               \
        for (k = 0; k < num_kept; k++) {                                                                        \
            const double *restrict sk = e + (at[k] + at_offset) * HD_LANES, *restrict pk = p + k * HD_LANES;    \
            const double d = delta[k], g = gamma != NULL ? gamma[k] : 1;                                        \
            double score[HD_LANES];                                                                             \
            if (gamma != NULL) {                                                                                \
                for (w = 0; w < HD_LANES; w++) score[w] = sk[w] * g + pk[w] * d;                                \
            } else {  /* the torch path skips the product by 1 (exact but for a NaN's payload) */               \
                for (w = 0; w < HD_LANES; w++) score[w] = sk[w] + pk[w] * d;                                    \
            }                                                                                                   \
            for (w = 0; w < HD_LANES; w++) score[w] = score[w] != score[w] ? worst : score[w];                  \
            if (k == 0) {                                                                                       \
                for (w = 0; w < HD_LANES; w++) { best[w] = score[w]; first[w] = 0; }                            \
            } else {                                                                                            \
                lanes_best(best, first, score, k, higher != 0);                                                 \
            }                                                                                                   \
        }                                                                                                       \
        for (w = 0; w < lanes; w++)                                                                             \
            pred[(r0 + w) * pred_stride] = best[w] == worst ? -1 : keep[first[w]];                  \
    }                                                                                                           \
    free(tab);                                                                                                  \
    return 0;                                                                                                   \
}

HD_DEFINE_PATH_SCORE_BEST(f32, float)
HD_DEFINE_PATH_SCORE_BEST(f64, double)

/*
 * hdecode::wu_palmer_best, T the compute type (float for float32 leaves, double for float64).  For each leaf
 * depth i < num_depths: Q(n) = (T)(tab[hi[i N + n]] - tab[lo[i N + n]]); E[0] = 0,
 * E[k + 1] = E[k] + (double)Q(euler[k]) * sign[k]; s(n) = (T)E[at[n]] * weight[i N + n], score(n) = s(n) at
 * i = 0, score(n) + s(n) after.  Then over the nodes in ``order``: NaN read as -inf, the first largest score;
 * pred[r * pred_stride] = that node, -1 where the best is -inf.  Returns 1 where its buffers cannot be
 * allocated, else 0.
 */
#define HD_DEFINE_WU_PALMER_BEST(SUFFIX, TIN, T)                                                               \
int hd_wu_palmer_best_##SUFFIX(int64_t rows, const TIN *x, int64_t x_row, int64_t x_col, int64_t num_src,     \
                               const int64_t *src, int64_t num_nodes, int64_t num_depths, const int64_t *hi,   \
                               const int64_t *lo, int64_t tour_len, const int64_t *euler, const double *sign,  \
                               const int64_t *at, const T *weight, const int64_t *order, int64_t *pred,        \
                               int64_t pred_stride) {                                                          \
    int64_t r0, i, k, n, w;                                                                                     \
    const size_t tab_n = (size_t)(2 * num_src + 1), node_n = (size_t)num_nodes, tour_n = (size_t)(tour_len + 1); \
    double *tab = (double *)calloc((tab_n + tour_n) * HD_LANES, sizeof(double));                               \
    T *q = (T *)calloc(2 * node_n * HD_LANES, sizeof(T));                                                       \
    double *e;                                                                                                  \
    T *score;                                                                                                   \
    if (tab == NULL || q == NULL) { free(tab); free(q); return 1; }                                             \
    e = tab + tab_n * HD_LANES;                                                                                 \
    score = q + node_n * HD_LANES;                                                                              \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        const int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                      \
        double acc[HD_LANES];                                                                                   \
        T best[HD_LANES];                                                                                       \
        int64_t first[HD_LANES];                                                                                \
        prefix_table_##SUFFIX(tab, lanes, x + r0 * x_row, x_row, x_col, num_src, src);                          \
        for (i = 0; i < num_depths; i++) {                                                                      \
            const int64_t *hi_i = hi + i * num_nodes, *lo_i = lo + i * num_nodes;                               \
            const T *wt = weight + i * num_nodes;                                                               \
            for (n = 0; n < num_nodes; n++) {                                                                   \
                const double *a = tab + hi_i[n] * HD_LANES, *b = tab + lo_i[n] * HD_LANES;                      \
                T *qn = q + n * HD_LANES;                                                                       \
                for (w = 0; w < HD_LANES; w++) qn[w] = (T)(a[w] - b[w]);                                        \
            }                                                                                                   \
            for (w = 0; w < HD_LANES; w++) { acc[w] = 0; e[w] = 0; }                                            \
            for (k = 0; k < tour_len; k++) {                                                                    \
                const T *qk = q + euler[k] * HD_LANES;                                                          \
                const double s = sign[k];                                                                       \
                double *ek = e + (k + 1) * HD_LANES;                                                            \
                for (w = 0; w < HD_LANES; w++) { acc[w] += (double)qk[w] * s; ek[w] = acc[w]; }                 \
            }                                                                                                   \
            for (n = 0; n < num_nodes; n++) {                                                                   \
                const double *en = e + at[n] * HD_LANES;                                                        \
                const T wn = wt[n];                                                                             \
                T *sn = score + n * HD_LANES;                                                                   \
                if (i == 0) {                                                                                   \
                    for (w = 0; w < HD_LANES; w++) sn[w] = (T)en[w] * wn;                                       \
                } else {                                                                                        \
                    for (w = 0; w < HD_LANES; w++) { const T s = (T)en[w] * wn; sn[w] = sn[w] + s; }            \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (w = 0; w < HD_LANES; w++) { best[w] = -INFINITY; first[w] = -1; }                                  \
        for (k = 0; k < num_nodes; k++) {                                                                       \
            const T *sk = score + order[k] * HD_LANES;                                                          \
            for (w = 0; w < HD_LANES; w++) {                                                                    \
                const T s = sk[w] != sk[w] ? (T)-INFINITY : sk[w];                                              \
                if (first[w] < 0 || s > best[w]) { best[w] = s; first[w] = k; }                                 \
            }                                                                                                   \
        }                                                                                                       \
        for (w = 0; w < lanes; w++)                                                                             \
            pred[(r0 + w) * pred_stride] = (first[w] < 0 || best[w] == -INFINITY) ? -1 : order[first[w]];       \
    }                                                                                                           \
    free(tab);                                                                                                  \
    free(q);                                                                                                    \
    return 0;                                                                                                   \
}

HD_DEFINE_WU_PALMER_BEST(f32, float, float)
HD_DEFINE_WU_PALMER_BEST(f64, double, double)

/*
 * The CPU plan's structural node decoders (metrics/zhao.py, metrics/wu_palmer.py on trees whose leaves sit at one
 * depth, metrics/lca_height.py), a row's decision in one pass: bit for bit the torch path's tables, hence its
 * decision.  In the values' type TIN (node sums accumulated in TACC, as hdecode_native.c's):
 *
 *     p(n)  the per-level node sums (HD_DEFINE_TREE_SUMS), rounded to TIN once;
 *     v(n)  = p(n) * coef[n] (mode 0), or (p(up[n]) - p(n)) * coef[n] (mode 1);
 *     S     = v, S(root) = 0 where zero_root, then S(n) = S(n) + S(up[n]) for n in ``down`` (every node below the
 *             root, parents first): the per-level root-path sums (kernels/tree_sums.py, ordered_path_sum_);
 *     score = S / scale[n] (scale_mode 0), S * scale[n] (1) or S (2);
 *
 * and pred[r * pred_stride] = the first of ``cand`` (the candidates in preference order) of largest score
 * (``higher``) or least, a NaN score winning at its first place, as torch's argmax / argmin over the reordered
 * table.  Returns 1 where its buffers cannot be allocated, else 0.
 */
#if defined(__GNUC__)
#define HD_NOINLINE __attribute__((noinline))
#else
#define HD_NOINLINE
#endif

/* A group's scores and first best, given its node sums acc, on NL lanes: the constant HD_LANES for a full group
 * (loops the compiler vectorises) or the lanes in use of a partial one (a single row no longer pays for eight).
 * Each lane's operations are the same either way.  Two functions, so that the full group's code is as alone. */
#define HD_DEFINE_PATH_ARGBEST_SCORES(SUFFIX, TIN, TACC, NAME, NL)                                              \
static HD_NOINLINE void NAME##_##SUFFIX(int64_t lanes, const TACC *acc, TIN *p, TIN *s, int64_t num_nodes,      \
        int64_t mode, const int64_t *up, const TIN *coef, int64_t root, int64_t zero_root, int64_t num_down,    \
        const int64_t *down, int64_t scale_mode, const TIN *scale, int64_t num_cand, const int64_t *cand,       \
        int64_t higher, TIN *best, int64_t *first) {                                                            \
    int64_t i, k, w;                                                                                            \
    (void)lanes;                                                                                                \
    for (i = 0; i < num_nodes; i++) for (w = 0; w < (NL); w++) p[i * HD_LANES + w] = (TIN)acc[i * HD_LANES + w]; \
    if (mode == 0) {                                                                                            \
        for (i = 0; i < num_nodes; i++) {                                                                       \
            const TIN c = coef[i];                                                                              \
            for (w = 0; w < (NL); w++) s[i * HD_LANES + w] = p[i * HD_LANES + w] * c;                           \
        }                                                                                                       \
    } else {                                                                                                    \
        for (i = 0; i < num_nodes; i++) {                                                                       \
            const TIN c = coef[i];                                                                              \
            const TIN *pu = p + up[i] * HD_LANES, *pi = p + i * HD_LANES;                                       \
            for (w = 0; w < (NL); w++) { const TIN d = pu[w] - pi[w]; s[i * HD_LANES + w] = d * c; }            \
        }                                                                                                       \
    }                                                                                                           \
    if (zero_root)                                                                                              \
        for (w = 0; w < (NL); w++) s[root * HD_LANES + w] = 0;                                                  \
    for (i = 0; i < num_down; i++) {                                                                            \
        TIN *sn = s + down[i] * HD_LANES;                                                                       \
        const TIN *su = s + up[down[i]] * HD_LANES;                                                             \
        for (w = 0; w < (NL); w++) sn[w] = sn[w] + su[w];                                                       \
    }                                                                                                           \
    for (k = 0; k < num_cand; k++) {                                                                            \
        const int64_t n = cand[k];                                                                              \
        const TIN *sn = s + n * HD_LANES;                                                                       \
        for (w = 0; w < (NL); w++) {                                                                            \
            const TIN v = scale_mode == 0 ? sn[w] / scale[n] : scale_mode == 1 ? sn[w] * scale[n] : sn[w];      \
            int take;                                                                                           \
            if (k == 0) take = 1;                                                                               \
            else if (best[w] != best[w]) take = 0;  /* a NaN stays the answer */                                \
            else take = v != v || (higher ? v > best[w] : v < best[w]);                                         \
            if (take) { best[w] = v; first[w] = k; }                                                            \
        }                                                                                                       \
    }                                                                                                           \
}

#define HD_DEFINE_PATH_ARGBEST(SUFFIX, TIN, TACC)                                                              \
HD_DEFINE_TREE_SUMS(SUFFIX, TIN, TACC)                                                                          \
HD_DEFINE_PATH_ARGBEST_SCORES(SUFFIX, TIN, TACC, path_scores_full, HD_LANES)                                    \
HD_DEFINE_PATH_ARGBEST_SCORES(SUFFIX, TIN, TACC, path_scores_part, lanes)                                       \
                                                                                                                \
int hd_path_argbest_##SUFFIX(int64_t rows, int64_t num_leaves, int64_t num_nodes, const TIN *x, int64_t x_leaf, \
                             int64_t x_row, int64_t num_parents, const int64_t *parent, const int64_t *start,  \
                             const int64_t *child, int64_t mode, const int64_t *up, const TIN *coef,           \
                             int64_t root, int64_t zero_root, int64_t num_down, const int64_t *down,           \
                             int64_t scale_mode, const TIN *scale, int64_t num_cand, const int64_t *cand,      \
                             int64_t higher, int64_t *pred, int64_t pred_stride) {                             \
    int64_t r0, w;                                                                                              \
    TACC *acc = (TACC *)calloc((size_t)num_nodes * HD_LANES, sizeof(TACC));                                    \
    TIN *p = (TIN *)calloc((size_t)num_nodes * HD_LANES * 2, sizeof(TIN));                                     \
    TIN *s;                                                                                                     \
    if (acc == NULL || p == NULL) { free(acc); free(p); return 1; }                                             \
    s = p + num_nodes * HD_LANES;                                                                               \
    for (r0 = 0; r0 < rows; r0 += HD_LANES) {                                                                   \
        const int64_t lanes = rows - r0 < HD_LANES ? rows - r0 : HD_LANES;                                      \
        TIN best[HD_LANES];                                                                                     \
        int64_t first[HD_LANES];                                                                                \
        load_##SUFFIX(acc, lanes, num_leaves, x + r0 * x_row, x_leaf, x_row, NULL);                             \
        sum_##SUFFIX(acc, lanes, num_parents, parent, start, child);                                            \
        if (lanes == HD_LANES)                                                                                  \
            path_scores_full_##SUFFIX(lanes, acc, p, s, num_nodes, mode, up, coef, root, zero_root, num_down, down, \
                                      scale_mode, scale, num_cand, cand, higher, best, first);                  \
        else                                                                                                    \
            path_scores_part_##SUFFIX(lanes, acc, p, s, num_nodes, mode, up, coef, root, zero_root, num_down, down, \
                                      scale_mode, scale, num_cand, cand, higher, best, first);                  \
        for (w = 0; w < lanes; w++) pred[(r0 + w) * pred_stride] = num_cand > 0 ? cand[first[w]] : -1;          \
    }                                                                                                           \
    free(acc);                                                                                                  \
    free(p);                                                                                                    \
    return 0;                                                                                                   \
}

HD_DEFINE_PATH_ARGBEST(f32, float, float)
HD_DEFINE_PATH_ARGBEST(f64, double, double)
HD_DEFINE_PATH_ARGBEST(f32w, float, double)
