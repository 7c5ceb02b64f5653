"""A call's peak memory stays within the memory budget plus its output and the tree's tables, on deep
trees too (issue 31: the dense matrix of Wu-Palmer and Zhao, ``WuPalmer.expected``, ``node_probabilities``
on the depth-first layout, ``within=`` and the candidates' root paths ignored the budget).

Each case runs in a fresh subprocess under an address-space cap: the tree and the input are built, a
warm-up call on one row builds the tree's cached tables where the case says so, the peak resident
memory is reset (``/proc/self/clear_refs``) and the call's growth is read back from ``VmHWM``.  The
trees are small enough for a few seconds and deep enough for the old code to exceed the bounds many
times over.  The bound of each case is the budget plus the call's output plus its tree tables.
"""

from __future__ import annotations

from memory_testing import MiB, needs_proc, peak_growths

pytestmark = needs_proc


# ---------------------------------------------------------------------------------------- item 5
def test_dense_matrix_of_a_deep_tree_is_built_in_the_memory_of_the_matrix():
    # A 401-node caterpillar (depth 200): the (N, L) matrix is 0.6 MiB; gathering both root paths of
    # every (node, leaf) pair took an (N, L, D + 1) int64 grid, 390 MiB (6 GiB at depth 500).
    got = peak_growths("""
    hd.set_memory_budget(8 * 2**20)
    for name in ("wu_palmer", "zhao"):
        for plan in ("cpu", "cuda"):
            h = caterpillar(200)  # a new tree: its matrix is built by the call
            probs = torch.distributions.Dirichlet(torch.ones(h.num_leaves, dtype=torch.float64)).sample((2,))
            m = hd.get_metric(name, h, strategy="dense")
            with hd.plan_for(plan):
                growth(lambda: m.decode(probs))
    """)
    assert len(got) == 4 and max(got) < 24 * MiB, got


def test_candidates_take_their_root_paths_in_blocks_within_the_budget():
    # Candidates scored along their root paths hold D·E masses per (sample, node) pair: on a 241-node
    # caterpillar (D = E = 120) 0.9 MiB a pair, and nearly every node is a candidate (2 rows: 0.45 GiB).
    got = peak_growths("""
    h = caterpillar(120)
    probs = torch.distributions.Dirichlet(torch.full((h.num_leaves,), 0.1, dtype=torch.float64)).sample((2,))
    hd.set_memory_budget(8 * 2**20)
    for name in ("wu_palmer", "zhao"):
        m = hd.get_metric(name, h, strategy="candidates")
        m.DENSE_MAX_ENTRIES = 0  # the path of trees too large for the dense matrix
        for plan in ("cpu", "cuda"):
            with hd.plan_for(plan):
                m.decode(probs[:1])  # the tree's tables
                growth(lambda: m.decode(probs))
    """)
    assert len(got) == 4 and max(got) < 16 * MiB, got


# ---------------------------------------------------------------------------------------- item 7
def test_wu_palmer_expected_chunks_by_its_own_tables():
    # The expected values are the structural (N, E, B) tables whatever strategy decode takes; they were
    # chunked by the candidates' size per sample, and the depth-first layout's root-path sums gather a
    # float64 prefix twice as wide: 74 MiB (CPU plan) and 45 MiB (GPU plan) at a 32 MiB budget here
    # (3.3 GiB at 512 MiB on a 200k-leaf tree).
    got = peak_growths("""
    import sys
    from benchmarks.workloads import random_tree
    h = hd.Hierarchy.from_parents(random_tree(20_000, 12, seed=1))  # 29,449 nodes, 10 leaf depths
    probs = torch.distributions.Dirichlet(torch.ones(h.num_leaves)).sample((64,))
    pred = torch.randint(0, h.num_nodes, (64,))
    m = hd.get_metric("wu_palmer", h)
    hd.set_memory_budget(32 * 2**20)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            m.expected(probs[:1], pred[:1])
            growth(lambda: m.expected(probs, pred))
    """)
    assert len(got) == 2 and max(got) < 32 * MiB, got


# ---------------------------------------------------------------------------------------- item 8
def test_node_probabilities_on_the_depth_first_layout_follow_the_budget():
    # Beyond 512 levels (and on the GPU plan) node sums are depth-first prefix sums, whose float64 table
    # holds 2L + 1 entries per row: 113 MiB for 4,096 rows of a 1,201-node caterpillar, against an
    # 18.8 MiB output and an 8 MiB budget.
    got = peak_growths("""
    h = caterpillar(600)  # 601 levels: the CPU plan takes the prefix sums too
    probs = torch.distributions.Dirichlet(torch.ones(h.num_leaves)).sample((4096,))
    hd.set_memory_budget(8 * 2**20)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            hd.node_probabilities(h, probs[:1])
            growth(lambda: hd.node_probabilities(h, probs))
    """)
    output = 4096 * 1201 * 4
    assert len(got) == 2 and max(got) < 8 * MiB + output + 2 * MiB, got


# ---------------------------------------------------------------------------------------- item 9
def test_within_a_deep_subtree_stays_within_the_budget():
    # The subtree under the spine's first node is a 399-node caterpillar of depth 199: decoding on it
    # built its (N, L) matrix from an (N, L, D + 1) grid (0.38 GiB; 4.6 GB at B = 64 on larger trees).
    got = peak_growths("""
    h = caterpillar(200)
    probs = torch.distributions.Dirichlet(torch.full((h.num_leaves,), 0.1, dtype=torch.float64)).sample((64,))
    spine = int((h.parent == h.root).nonzero()[-1])  # the root's internal child
    hd.set_memory_budget(8 * 2**20)
    for name in ("wu_palmer", "zhao"):
        m = hd.get_metric(name, h)
        for plan in ("cpu", "cuda"):
            with hd.plan_for(plan):
                growth(lambda: m.decode(probs, within=spine))
    """)
    assert len(got) == 4 and max(got) < 24 * MiB, got


# ---------------------------------------------------------------------------- hF_β on a deep caterpillar
def test_hf_beta_packed_solver_on_a_deep_caterpillar_stays_within_the_budget():
    # A 4,001-node caterpillar (D = E = 2,000): the GPU plan packs ~1,500 candidates per row.  Its lower
    # bound held four (B, D + 1, E) tables of the root path at once, its masses a float64 copy, and the
    # exact solver sorted the whole (B, C, C) table of every Δ_k (values and int64 indices): 78 MiB at a
    # 64 MiB budget.  The CPU plan's prefix sets on a 2,001-node one, same budget.
    got = peak_growths("""
    hd.set_memory_budget(64 * 2**20)
    for depth, plan in ((2000, "cuda"), (1000, "cpu")):
        h = caterpillar(depth)
        probs = torch.distributions.Dirichlet(torch.full((h.num_leaves,), 0.3, dtype=torch.float64)).sample((2,))
        m = hd.get_metric("hf_beta", h, beta=1.0)
        with hd.plan_for(plan):
            m.decode(probs[:1].float())  # the tree's tables
            growth(lambda: m.decode(probs.float()))
    """)
    assert len(got) == 2 and max(got) < 64 * MiB + 2 * 4001, got


# ---------------------------------------------------------------------------------------- item 11
def test_jaccard_on_a_deep_caterpillar_stays_within_the_budget():
    # A 2,001-node caterpillar (depth 1,000, 1,000 leaf depths), 2 Dirichlet(0.3) rows: a sample keeps
    # ~800 candidates and ~300 (sample, size) pairs are left to solve.  Each knapsack took a table of
    # every candidate by every size up to its own, the chunks as large as the budget beside one sample's
    # masses and gains: 144 MiB (CPU plan) and 166 MiB (GPU plan) at a 128 MiB budget on afab9d5.  Now
    # each pair keeps only its allowed candidates, in a band of the states its size can reach: 39 and
    # 57 MiB.
    got = peak_growths("""
    h = caterpillar(1000)
    probs = torch.distributions.Dirichlet(torch.full((h.num_leaves,), 0.3, dtype=torch.float64)).sample((2,))
    dec = hd.get_decoder("optimal", h, metric="jaccard")
    hd.set_memory_budget(128 * 2**20)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            dec.decode(probs[:1])  # the tree's tables
            growth(lambda: dec.decode(probs))
    """)
    assert len(got) == 2 and max(got) < 128 * MiB, got
