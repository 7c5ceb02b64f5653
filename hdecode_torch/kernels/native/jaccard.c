/* Native CPU kernel of Jaccard's tree knapsacks: hdecode_torch.kernels.fused.jaccard_sets.knapsack_sets (the
 * knapsack of every (sample, size) pair and the walk back to its set), one pair at a time.
 *
 * For pair r (sample b = b[r], nodes left to choose k = kidx[r], after the root), the gains of the sample's
 * candidates at size k + 1 are G_i = gains[entry[b, i] * K + k], i = 0..C-1, the candidates in preorder, root
 * first, nxt[b, i] the position after i's subtree.  A candidate whose gain is not > -inf (-inf or NaN) is never
 * taken, nor anything under it: the pair keeps its A allowed candidates with no disallowed ancestor, renumbered
 * 0..A-1 in preorder (their subtrees' ends renumbered as the count of kept positions before them).  Then, on the
 * kept candidates,
 *
 *     F(A, 0) = 0,  F(A, t > 0) = -inf,  F(i, 0) = 0,
 *     F(i, t) = take >= skip ? take : skip,   take = F(i + 1, t - 1) + G_i,  skip = F(nxt(i), t),
 *     V = G_0 + F(1, k),
 *
 * and the walk from (1, k): at position i with t > 0 left, take v_i where the comparison took it (t - 1 left,
 * next position i + 1), else go to nxt(i).  These are the additions (in the gains' own type) and comparisons of
 * the torch path's knapsack (by nodes left, or by candidates skipped: the same values at every state the walk
 * can reach), so every value and set is that path's, bit for bit.  A pair with A <= k (no set of its size)
 * gets V = -inf and the root alone.
 *
 * States: only those with s = i - 1 - k + t candidates skipped so far in 0..A - k are ever read on the way from
 * (1, k) (taking keeps s, skipping adds nxt(i) - i, and past A - k too few positions are left: -inf), so a
 * position holds min(k + 1, A - k + 1) of them, stored by t or by s, whichever is fewer.  O(A * min(k + 1,
 * A - k + 1)) time and scratch a pair (grown as needed, reused across pairs), O(C) more.
 *
 * Returns 0, or 1 where scratch could not be allocated (then nothing is trusted). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef struct {
    void *f;        /* the F tables, (A + 1) positions of `width` states */
    uint8_t *dec;   /* the decisions, A positions of `width` states */
    size_t cap;     /* states allocated in each */
    size_t fsize;   /* bytes of one F state */
} hd_jk_scratch;

static int hd_jk_reserve(hd_jk_scratch *s, size_t states) {
    if (states <= s->cap) return 0;
    free(s->f);
    free(s->dec);
    s->f = malloc(states * s->fsize);
    s->dec = (uint8_t *)malloc(states);
    if (s->f == NULL || s->dec == NULL) {
        free(s->f); free(s->dec);
        s->f = NULL; s->dec = NULL; s->cap = 0;
        return 1;
    }
    s->cap = states;
    return 0;
}

/* The slot of F(p, t) in the tables of one pair: -2 where it is 0 (t = 0), -1 where it is -inf (too few positions
 * left, t > a - p, or outside the stored states), else its index. */
static int64_t hd_jk_slot(int64_t width, int64_t by_t, int64_t k, int64_t a, int64_t p, int64_t t) {
    int64_t q;
    if (t == 0) return -2;
    if (p >= a || t > a - p) return -1;
    q = by_t ? t : p - 1 - k + t;
    return (q < 0 || q >= width) ? -1 : p * width + q;
}

#define HD_JK_F(P, TT) (sl = hd_jk_slot(width, by_t, k, a, (P), (TT)), sl == -2 ? zero : sl == -1 ? neg : f[sl])

#define HD_DEFINE_JACCARD_KNAPSACK(SUFFIX, T)                                                                   \
int hd_jaccard_knapsack_##SUFFIX(int64_t pairs, int64_t c, int64_t kk, const T *gains, const int64_t *entry,    \
                                 const int64_t *nxt, const int64_t *b, const int64_t *kidx, T *val,              \
                                 uint8_t *members) {                                                             \
    int64_t r, i, j, sl;                                                                                        \
    int status = 0;                                                                                             \
    const T neg = (T)(-INFINITY), zero = (T)0;                                                                  \
    hd_jk_scratch s = {NULL, NULL, 0, sizeof(T)};                                                               \
    /* per pair: the kept gains, and (c + 1) each: kept ends, kept columns, difference array, kept before */   \
    T *g = (T *)malloc((size_t)(c > 0 ? c : 1) * sizeof(T));                                                    \
    int64_t *ints = (int64_t *)malloc((size_t)(c + 1) * 4 * sizeof(int64_t));                                   \
    if (g == NULL || ints == NULL) { free(g); free(ints); return 1; }                                           \
    for (r = 0; r < pairs; r++) {                                                                               \
        const int64_t *ent = entry + b[r] * c, *nx = nxt + b[r] * c;                                           \
        const int64_t k = kidx[r];                                                                              \
        int64_t *cnx = ints, *where = ints + (c + 1), *cover = ints + 2 * (c + 1), *before = ints + 3 * (c + 1); \
        int64_t a = 0, depth = 0, width, by_t, q, pos, t;                                                       \
        uint8_t *mem = members + r * c;                                                                         \
        T *f;                                                                                                   \
        uint8_t *dec;                                                                                           \
        memset(mem, 0, (size_t)c);                                                                              \
        val[r] = neg;                                                                                           \
        if (c == 0) continue;                                                                                   \
        mem[0] = 1;                                                                                             \
        /* the kept positions: none inside the subtree (to max(nxt, i + 1)) of a disallowed one; the root kept */ \
        memset(cover, 0, (size_t)(c + 1) * sizeof(int64_t));                                                    \
        for (i = 0; i < c; i++) {                                                                               \
            T gi = gains[ent[i] * kk + k];                                                                      \
            depth += cover[i];                                                                                  \
            before[i] = a;                                                                                      \
            if (i > 0 && !(gi > neg)) {                                                                         \
                int64_t e = nx[i] > i + 1 ? nx[i] : i + 1;                                                      \
                depth += 1;                                                                                     \
                if (e <= c) cover[e] -= 1;                                                                      \
            }                                                                                                   \
            if (depth == 0) { g[a] = gi; where[a] = i; a++; }                                                   \
        }                                                                                                       \
        before[c] = a;                                                                                          \
        if (a <= k) continue;  /* no set of this size: -inf, the root alone */                                  \
        for (j = 0; j < a; j++) cnx[j] = before[nx[where[j]] < c ? nx[where[j]] : c];                            \
        /* states by t (k + 1 of them) or by s = i - 1 - k + t (a - k + 1), whichever is fewer */              \
        by_t = (k + 1 <= a - k + 1);                                                                            \
        width = by_t ? k + 1 : a - k + 1;                                                                       \
        if (hd_jk_reserve(&s, (size_t)(a + 1) * (size_t)width)) { status = 1; break; }                          \
        f = (T *)s.f;                                                                                           \
        dec = s.dec;                                                                                            \
        for (i = a - 1; i >= 1; i--) {                                                                          \
            T *fi = f + i * width;                                                                              \
            uint8_t *di = dec + i * width;                                                                      \
            for (q = 0; q < width; q++) {                                                                       \
                T take, skip;                                                                                   \
                t = by_t ? q : q + k + 1 - i;                                                                   \
                if (t <= 0) { fi[q] = t == 0 ? zero : neg; di[q] = 0; continue; }                               \
                if (t > a - i) { fi[q] = neg; di[q] = 1; continue; }                                            \
                take = HD_JK_F(i + 1, t - 1) + g[i];                                                            \
                skip = HD_JK_F(cnx[i], t);                                                                      \
                di[q] = take >= skip;                                                                           \
                fi[q] = di[q] ? take : skip;                                                                    \
            }                                                                                                   \
        }                                                                                                       \
        val[r] = g[0] + HD_JK_F(1, k);                                                                          \
        /* the walk from (1, k): take where the comparison took, else past the subtree */                       \
        for (i = 1, pos = 1, t = k; i < a; i++) {                                                               \
            if (pos != i) continue;                                                                             \
            q = by_t ? t : i - 1 - k + t;  /* within the states on every finite path; checked all the same */    \
            if (t > 0 && q >= 0 && q < width && dec[i * width + q]) {                                            \
                mem[where[i]] = 1; t--; pos = i + 1;                                                            \
            } else {                                                                                            \
                pos = cnx[i];                                                                                   \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    free(g); free(ints); free(s.f); free(s.dec);                                                                \
    return status;                                                                                              \
}

HD_DEFINE_JACCARD_KNAPSACK(f32, float)
HD_DEFINE_JACCARD_KNAPSACK(f64, double)
