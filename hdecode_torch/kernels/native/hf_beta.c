/*
 * hF_beta's candidate listing and per-leaf-depth masses, native CPU kernels (metrics/hf_beta.py,
 * kernels/candidates.py, kernels/depth_ranges.py).
 *
 * hd_hf_beta_pairs_<T>: the (sample, node) pairs of an (N, B) node-major table p whose value is at least a
 * per-node bound (and the root's), sample-major with each sample's nodes in a given (depth, id) order, and
 * their values: what candidate_pairs lists from the mask p >= bound, without the (N, B) mask, its reordered
 * copy or its transposition.  Comparisons and copies only: the torch path's pairs and values exactly.
 *
 * hd_hf_beta_masses_<T>: Q_e(n) of (sample, node) pairs read from the float64 prefix sums and the (N + 1, 2E)
 * int32 table of run ends, [hi | lo]: one IEEE double subtraction prefix[hi] - prefix[lo] each, rounded once
 * to T (the torch path's sub then .to(dtype), or its sub written into a T output), bit for bit.
 */
#include <math.h>

#include "hdecode_native.h"

/* Relative margin of the comparisons between set values (float64 sums of at most a few thousand terms, each
 * within 2^-53 of its exact value): a k is checked unless its upper bound is below the best value by more. */
#define HD_VALUE_MARGIN 0x1p-40
/* Relative difference below which two values count as a tie (below HD_VALUE_MARGIN: no k skipped is a tie). */
#define HD_TIE 0x1p-42

/* Two calls: fill == 0 counts each sample's pairs into offsets[0 .. B] (offsets[b] = pairs before sample b,
 * offsets[B] = M) and returns M; fill != 0 then writes the M pairs (offsets used as write positions, changed).
 * p[n * p_node + b * p_row]; bound[n] in T; order: the N node ids in (depth, id) order. */
#define HD_DEFINE_HF_BETA(SUFFIX, T)                                                                           \
int64_t hd_hf_beta_pairs_##SUFFIX(int64_t num_nodes, int64_t bsz, const T *p, int64_t p_node, int64_t p_row,   \
                                  const T *bound, const int64_t *order, int64_t root, int64_t fill,             \
                                  int64_t *offsets, int64_t *sample, int64_t *node, T *value) {                \
    int64_t j, b, total = 0;                                                                                   \
    if (!fill) {                                                                                               \
        for (b = 0; b <= bsz; b++) offsets[b] = 0;                                                             \
        /* node-major: each node's row of B values read in storage order (p_row == 1 at batch) */              \
        for (j = 0; j < num_nodes; j++) {                                                                      \
            int64_t n = order[j];                                                                              \
            const T *pn = p + n * p_node;                                                                      \
            T t = bound[n];                                                                                    \
            if (n == root)                                                                                     \
                for (b = 0; b < bsz; b++) offsets[b + 1] += 1;                                                 \
            else                                                                                               \
                for (b = 0; b < bsz; b++) offsets[b + 1] += pn[b * p_row] >= t;                                \
        }                                                                                                      \
        for (b = 0; b < bsz; b++) offsets[b + 1] += offsets[b];                                                \
        return offsets[bsz];                                                                                   \
    }                                                                                                          \
    for (j = 0; j < num_nodes; j++) {                                                                          \
        int64_t n = order[j];                                                                                  \
        const T *pn = p + n * p_node;                                                                          \
        T t = bound[n];                                                                                        \
        for (b = 0; b < bsz; b++) {                                                                            \
            T v = pn[b * p_row];                                                                               \
            if (v >= t || n == root) {                                                                         \
                int64_t at = offsets[b]++;                                                                     \
                sample[at] = b;                                                                                \
                node[at] = n;                                                                                  \
                value[at] = v;                                                                                 \
                total++;                                                                                       \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    return total;                                                                                              \
}                                                                                                              \
                                                                                                               \
/* out[i * e + k] = (T)(prefix[hi * s_pos + r * s_row] - prefix[lo * s_pos + r * s_row]), with r = rows[i]     \
 * (rows NULL: r = i / per_row, packed (B, C) ids), hi = ends[ids[i] * 2e + k], lo = ends[ids[i] * 2e + e + k]. */ \
void hd_hf_beta_masses_##SUFFIX(int64_t m, int64_t e, const double *prefix, int64_t s_pos, int64_t s_row,      \
                                const int32_t *ends, const int64_t *rows, int64_t per_row, const int64_t *ids, \
                                T *out) {                                                                      \
    int64_t i, k;                                                                                              \
    for (i = 0; i < m; i++) {                                                                                  \
        const double *row = prefix + (rows != NULL ? rows[i] : i / per_row) * s_row;                           \
        const int32_t *at = ends + ids[i] * 2 * e;                                                             \
        T *o = out + i * e;                                                                                    \
        for (k = 0; k < e; k++) {                                                                              \
            double d = row[(int64_t)at[k] * s_pos] - row[(int64_t)at[e + k] * s_pos];                          \
            o[k] = (T)d;                                                                                       \
        }                                                                                                      \
    }                                                                                                          \
}

HD_DEFINE_HF_BETA(f32, float)
HD_DEFINE_HF_BETA(f64, double)

/* One row's hF_beta decision from its listed pairs (metrics/hf_beta.py: hf_beta_decode's two stages, then an exact
 * solve of the second stage's candidates, one pass a row).
 *
 * node[0 .. m), value, q (m, e): the row's pairs above the fixed bound in (depth, id) order (the root first), their
 * p and their masses per leaf depth; tau (N,): tau(n); depths (e,): the leaf depths; r = 1/(1+beta^2); slack, wide:
 * the rounding slacks of the two stages (as the torch path applies them, in T); max_c: the most stage-2 candidates
 * solved here; wt: w_e(k) = 1/(r k + a_e) in float64 for k <= kmax, a_e = (1 - r)(d_e + 1) (ad).
 * Stage 1 (value >= tau * slack, and the root): the best closed prefix set of the candidates ordered by Delta at
 * k_ref = round(E[d(y)] + 1) is an achieved value LB.  Stage 2 (value >= tau * LB * wide, and the root): the same
 * prefix values PV(k) for every k from the order at k_ref, then each k whose upper bound on V(k) reaches the best
 * (rho(k) times the k largest Delta_k_ref, and the coverage bound G(k)) and whose prefix is not shown a top-k set of
 * Delta_k by the gap after its k-th Delta_k_ref is checked: its Delta_k computed, and where the prefix does not
 * hold the k largest, V(k) is the sum of the sorted ones.  The smallest k of the largest V wins; its set is the k
 * largest Delta_k, ties to the earlier candidate (shallower, then smaller id): closed, as Delta_k never grows from
 * a parent to a child (its masses do not, and every sum here adds them in the same order).  Every value a float64
 * sum; the bounds carry a relative margin of 2^-40, so they only ever check more k.  Writes out[n] = 1 for the
 * set's nodes (out zeroed by the caller).  Returns 0, or 1 where stage 2 keeps more than max_c candidates (the
 * caller runs the torch path).  O(m e + C e + C log C) a row, plus O(C (e + log C)) per k checked. */
typedef struct { double v; int64_t i; } hd_ranked;

static int hd_rank_desc(const void *x, const void *y) {
    const hd_ranked *a = (const hd_ranked *)x, *b = (const hd_ranked *)y;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->i < b->i ? -1 : (a->i > b->i);
}

/* w_e(k) = 1 / (r k + a_e) in float64: row k of the table wt (k <= kmax), else computed. */
static double hd_weight(const double *wt, int64_t kmax, int64_t k, int64_t i, int64_t e, double r, const double *ad) {
    return k <= kmax ? wt[k * e + i] : 1.0 / (r * (double)k + ad[i]);
}

/* The E weights of k: the table's row, or computed into buf. */
static const double *hd_weights(const double *wt, int64_t kmax, int64_t k, int64_t e, double r, const double *ad,
                                double *buf) {
    int64_t i;
    if (k <= kmax) return wt + k * e;
    for (i = 0; i < e; i++) buf[i] = 1.0 / (r * (double)k + ad[i]);
    return buf;
}

#define HD_DEFINE_HF_BETA_ROW(SUFFIX, T)                                                                       \
static int64_t hf_beta_row_##SUFFIX(int64_t m, int64_t e, const int64_t *node, const T *value, const T *q,    \
                                    const T *tau, int64_t root, const T *depths, double r_in,                  \
                                    double slack_in, double wide_in, int64_t max_c, uint8_t *out,              \
                                    int64_t *cand, hd_ranked *rank, hd_ranked *sorted, double *w, double *cum,     \
                                    double *pv, double *ub, double *dk, const double *wt, int64_t kmax,        \
                                    const double *ad) {                                                        \
    const T slack = (T)slack_in, wide = (T)wide_in;                                                            \
    int64_t i, j, k, c = 0, k_ref, best_k = 1, nonneg = 1;                                                     \
    const double *wr, *wk_row;                                                                                 \
    double expected = 0.0, lower = 0.0, best_v = -1.0;                                                         \
    /* stage 1 */                                                                                              \
    for (i = 0; i < m; i++)                                                                                    \
        if (node[i] == root || value[i] >= tau[node[i]] * slack) cand[c++] = i;                                \
    for (j = 0; j < m; j++)                                                                                    \
        if (node[j] == root) { for (k = 0; k < e; k++) expected += (double)q[j * e + k] * (double)depths[k]; } \
    k_ref = (int64_t)(expected + 1.5);                                                                         \
    if (k_ref > c) k_ref = c;                                                                                  \
    if (k_ref < 1) k_ref = 1;                                                                                  \
    wr = hd_weights(wt, kmax, k_ref, e, r_in, ad, w);                                                          \
    for (j = 0; j < c; j++) {                                                                                  \
        const T *qj = q + cand[j] * e;                                                                         \
        double d = 0.0;                                                                                        \
        for (k = 0; k < e; k++) d += (double)qj[k] * wr[k];                                             \
        rank[j].v = d;                                                                                         \
        rank[j].i = j;                                                                                         \
    }                                                                                                          \
    qsort(rank, (size_t)c, sizeof(hd_ranked), hd_rank_desc);                                                   \
    for (k = 0; k < e; k++) cum[k] = 0.0;                                                                      \
    for (j = 0; j < c; j++) {                                                                                  \
        const T *qj = q + cand[rank[j].i] * e;                                                                 \
        double v = 0.0;                                                                                        \
        for (k = 0; k < e; k++) {                                                                              \
            cum[k] += (double)qj[k];                                                                           \
            v += cum[k] * hd_weight(wt, kmax, j + 1, k, e, r_in, ad);                                          \
        }                                                                                                      \
        if (v > lower) lower = v;                                                                              \
    }                                                                                                          \
    /* stage 2 */                                                                                              \
    {                                                                                                          \
        const T low = (T)lower;                                                                                \
        c = 0;                                                                                                 \
        for (i = 0; i < m; i++)                                                                                \
            if (node[i] == root || value[i] >= (T)(tau[node[i]] * low) * wide) cand[c++] = i;                  \
    }                                                                                                          \
    if (c > max_c) return 1;                                                                                   \
    /* The candidates ordered by Delta at k_ref: the closed prefix sets' values PV(k) for every k at once, the   \
     * best of them (value, k) a first answer; then each k whose upper bound on V(k) reaches it is checked:     \
     * where its prefix holds the k largest Delta_k, V(k) = PV(k); else V(k) is the sum of the sorted Delta_k. */ \
    k_ref = k_ref > c ? c : k_ref;                                                                             \
    wr = hd_weights(wt, kmax, k_ref, e, r_in, ad, w);                                                          \
    for (j = 0; j < c; j++) {                                                                                  \
        const T *qj = q + cand[j] * e;                                                                         \
        double d = 0.0;                                                                                        \
        for (i = 0; i < e; i++) { d += (double)qj[i] * wr[i]; nonneg &= qj[i] >= 0; }                  \
        rank[j].v = d;                                                                                         \
        rank[j].i = j;                                                                                         \
    }                                                                                                          \
    qsort(rank, (size_t)c, sizeof(hd_ranked), hd_rank_desc);                                                   \
    for (i = 0; i < e; i++) cum[i] = 0.0;                                                                      \
    {                                                                                                          \
        double sref = 0.0;                                                                                     \
        for (j = 0; j < c; j++) {                                                                              \
            const T *qj = q + cand[rank[j].i] * e;                                                             \
            double v = 0.0;                                                                                    \
            for (i = 0; i < e; i++) {                                                                          \
                cum[i] += (double)qj[i];                                                                       \
                v += cum[i] * hd_weight(wt, kmax, j + 1, i, e, r_in, ad);                                      \
            }                                                                                                  \
            sref += rank[j].v;                                                                                 \
            pv[j] = v;                                                                                         \
            ub[j] = sref;                                                                                      \
            if (v > best_v) { best_v = v; best_k = j + 1; }                                                    \
        }                                                                                                      \
    }                                                                                                          \
    for (k = 1; k <= c; k++) {                                                                                 \
        /* V(k) <= rho(k) (sum of the k largest Delta_k_ref), rho(k) = max_e w_e(k) / w_e(k_ref), and          \
         * V(k) <= G(k) = sum_e w_e(k) min(k, d_e + 1) Q_e(root) (q >= 0; node[0] is the root). */             \
        double rho = 0.0, rho_min = HUGE_VAL, cover = 0.0, bound, inside = HUGE_VAL, after = -HUGE_VAL;         \
        if (k == c) continue;  /* every candidate: the prefix itself, PV(c) = V(c) */                          \
        for (i = 0; i < e; i++) {                                                                              \
            double wk = hd_weight(wt, kmax, k, i, e, r_in, ad), ratio = wk / wr[i];                            \
            double d1 = (double)depths[i] + 1.0;                                                               \
            if (ratio > rho) rho = ratio;                                                                      \
            if (ratio < rho_min) rho_min = ratio;                                                              \
            cover += wk * ((double)k < d1 ? (double)k : d1) * (double)q[i];                                    \
        }                                                                                                      \
        if (nonneg) {                                                                                          \
            bound = rho * ub[k - 1] < cover ? rho * ub[k - 1] : cover;                                         \
            if (bound < best_v - fabs(best_v) * HD_VALUE_MARGIN) continue;                                      \
            /* Delta_k / Delta_k_ref lies in [rho_min, rho]: a wide enough gap after the k-th Delta_k_ref shows   \
             * the prefix a top-k set of Delta_k without computing it. */                                      \
            if (rho_min * rank[k - 1].v * (1 - HD_VALUE_MARGIN) > rho * rank[k].v * (1 + HD_VALUE_MARGIN))     \
                continue;                                                                                      \
        }                                                                                                      \
        wk_row = hd_weights(wt, kmax, k, e, r_in, ad, w);                                                      \
        for (j = 0; j < c; j++) {                                                                              \
            const T *qj = q + cand[rank[j].i] * e;                                                             \
            double d = 0.0;                                                                                    \
            for (i = 0; i < e; i++) d += (double)qj[i] * wk_row[i];                                         \
            dk[j] = d;                                                                                         \
            if (j < k) { if (d < inside) inside = d; }                                                         \
            else if (d > after) after = d;                                                                     \
        }                                                                                                      \
        if (inside >= after) continue;  /* the prefix is a top-k set: V(k) = PV(k), counted */                 \
        {                                                                                                      \
            double v = 0.0;                                                                                    \
            for (j = 0; j < c; j++) { sorted[j].v = dk[j]; sorted[j].i = j; }                                  \
            qsort(sorted, (size_t)c, sizeof(hd_ranked), hd_rank_desc);                                         \
            for (j = 0; j < k; j++) v += sorted[j].v;                                                          \
            pv[k - 1] = v;  /* V(k) > PV(k): the prefix is not the best set of size k */                       \
            if (v > best_v) best_v = v;                                                                        \
        }                                                                                                      \
    }                                                                                                          \
    /* The smallest k whose V(k) is the largest, ties within a relative HD_TIE (float64 sums of values equal in    \
     * exact arithmetic differ by a few ulps): the torch path's ties, in its rounding. */                      \
    for (k = 1; k <= c; k++)                                                                                   \
        if (pv[k - 1] >= best_v - fabs(best_v) * HD_TIE) { best_k = k; break; }                                \
    wr = hd_weights(wt, kmax, best_k, e, r_in, ad, w);                                                         \
    for (j = 0; j < c; j++) {                                                                                  \
        const T *qj = q + cand[j] * e;                                                                         \
        double d = 0.0;                                                                                        \
        for (i = 0; i < e; i++) d += (double)qj[i] * wr[i];                                             \
        rank[j].v = d;                                                                                         \
        rank[j].i = j;                                                                                         \
    }                                                                                                          \
    qsort(rank, (size_t)c, sizeof(hd_ranked), hd_rank_desc);                                                   \
    /* The k largest Delta_k, ties to the earlier candidate (the comparator's index order): the torch path's stable \
     * sort of the same masses.  Closed: a parent's Delta_k is at least its child's and it comes earlier. */   \
    for (j = 0; j < best_k && j < c; j++) out[node[cand[rank[j].i]]] = 1;                                      \
    return 0;                                                                                                  \
}                                                                                                              \
                                                                                                               \
/* Every row of sample-major pairs (sample[0 .. m) ascending; each row holds its root): row b's decision into  \
 * out[b * num_nodes ...].  Returns 0, 1 where a row has more than max_c stage-2 candidates, -1 short of memory. */ \
int64_t hd_hf_beta_rows_##SUFFIX(int64_t m, int64_t e, const int64_t *sample, const int64_t *node,             \
                                 const T *value, const T *q, const T *tau, int64_t root, const T *depths,      \
                                 const T *a, double r, double slack, double wide, int64_t max_c,               \
                                 int64_t num_nodes, uint8_t *out) {                                            \
    int64_t lo, hi, status = 0;                                                                                \
    int64_t *cand = (int64_t *)malloc((size_t)(num_nodes > 0 ? num_nodes : 1) * sizeof(int64_t));              \
    hd_ranked *rank = (hd_ranked *)malloc((size_t)(num_nodes > 0 ? num_nodes : 1) * sizeof(hd_ranked));        \
    double *w = (double *)malloc((size_t)(e > 0 ? e : 1) * sizeof(double));                                    \
    int64_t kmax = max_c < num_nodes ? max_c : num_nodes, k, i;                                                \
    double *ad = (double *)malloc((size_t)(e > 0 ? e : 1) * (size_t)(kmax + 2) * sizeof(double));             \
    double *wt = ad == NULL ? NULL : ad + (e > 0 ? e : 1);                                                     \
    double *cum = (double *)malloc((size_t)(e > 0 ? e : 1) * sizeof(double));                                  \
    hd_ranked *sorted = (hd_ranked *)malloc((size_t)(num_nodes > 0 ? num_nodes : 1) * sizeof(hd_ranked));      \
    double *pv = (double *)malloc((size_t)(num_nodes > 0 ? num_nodes : 1) * 3 * sizeof(double));               \
    double *ub = pv == NULL ? NULL : pv + (num_nodes > 0 ? num_nodes : 1);                                     \
    double *dk = pv == NULL ? NULL : pv + 2 * (num_nodes > 0 ? num_nodes : 1);                                 \
    if (cand == NULL || rank == NULL || w == NULL || cum == NULL || sorted == NULL || pv == NULL || ad == NULL) \
        status = -1;                                                                                           \
    for (i = 0; status == 0 && i < e; i++) ad[i] = (1.0 - r) * ((double)depths[i] + 1.0);                                     \
    for (k = 0; status == 0 && k <= kmax; k++)  /* w_e(k) = 1 / (r k + a_e), the rows' common table */        \
        for (i = 0; i < e; i++) wt[k * e + i] = 1.0 / (r * (double)k + ad[i]);                                 \
    for (lo = 0; status == 0 && lo < m; lo = hi) {                                                             \
        for (hi = lo + 1; hi < m && sample[hi] == sample[lo]; hi++) {}                                         \
        status = hf_beta_row_##SUFFIX(hi - lo, e, node + lo, value + lo, q + lo * e, tau, root, depths, r,     \
                                      slack, wide, max_c, out + sample[lo] * num_nodes, cand, rank, sorted, w, \
                                      cum, pv, ub, dk, wt, kmax, ad);                                          \
    }                                                                                                          \
    free(cand); free(rank); free(w); free(cum); free(sorted); free(pv); free(ad);                                        \
    return status;                                                                                             \
}

HD_DEFINE_HF_BETA_ROW(f32, float)
HD_DEFINE_HF_BETA_ROW(f64, double)
