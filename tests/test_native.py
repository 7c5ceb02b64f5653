"""The native CPU kernels (``hdecode_torch.kernels.native``): the same bits as the torch path, and a build cache
that falls back to torch whenever it cannot give a library.

Node sums are compared bit for bit (the raw bits, so -0.0, NaN payloads and subnormals count) against the
torch per-level path on the bundled trees, random unbalanced trees with single-child chains, a depth-1 star
wide enough to sum float32 in float64, and inputs that make the order of the additions visible.  Decisions
of tree_distance(_c) and hamming are compared with the kernel on and off.  The float64 depth-first prefix sums
of hF_β and Jaccard are compared bit for bit against each torch layout they replace (a cumsum down a leaf-major
table, along batch-major rows, along blocks of gathered rows), and those decoders' decisions with the kernel on
and off.  Where this machine has no C compiler the comparisons skip (the torch path is then what runs) and the
fallback tests still run.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from hdecode_torch.kernels.depth_ranges import depth_prefix_sums, depth_ranges
from hdecode_torch.kernels.native import _build
from hdecode_torch.kernels.tree_sums import FLOAT32_MAX_FAN_IN, accumulation_dtype, leaf_to_node_sum
from hdecode_torch.metrics.hamming import hamming_decode, inverse_depth_mass
from hdecode_torch.metrics.tree_distance import tree_distance_decode

from harness import bundled, random_trees
from testing import Operators

ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable here: {native.unavailable_reason()}")
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def _rows(h, batch: int, seed: int, scale: float = 5) -> torch.Tensor:
    """(batch, L) float32 softmax rows of normal logits times ``scale``: model-like rows, peaked at larger scales."""
    return torch.softmax(torch.randn(batch, h.num_leaves, generator=torch.Generator().manual_seed(seed)) * scale, 1)


def _trees():
    star = hd.Hierarchy.from_parents([-1] + [0] * (FLOAT32_MAX_FAN_IN + 5))  # depth 1, float32 summed in float64
    chain = hd.Hierarchy.from_parents([3, 3, 4, 4, 5, 6, -1])  # leaves 0-2 beside single-child chains 4 -> 5 -> 6
    return ([bundled("tieredimagenet-h")[0], bundled("inat19")[0], star, chain, hd.Hierarchy.from_parents([-1, 0])]
            + [h for h, _ in random_trees(23, 10)])


def _binades(g, shape, dtype):
    """Values over 30 binades with zeros, subnormals and a negative zero: sums whose rounding depends on the order."""
    x = torch.rand(shape, generator=g, dtype=torch.float64) * torch.exp2(-30 * torch.rand(shape, generator=g,
                                                                                          dtype=torch.float64))
    x = x.to(dtype)
    flat = x.view(-1)
    if flat.numel() >= 8:
        tiny = torch.finfo(dtype).tiny
        flat[0::7] = 0.0
        flat[1::11] = tiny / 4  # subnormal
        flat[2::13] = -0.0
        flat[3::17] = tiny * 3.5
    return x


def _torch_sums(h, leaf_values):
    with native.use_native(False):
        return leaf_to_node_sum(h, leaf_values, "levels")


def _assert_same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.contiguous().view(BITS[a.dtype]), b.contiguous().view(BITS[b.dtype]))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [0, 1, 7, 4000])
def test_node_sums_equal_the_torch_path_bit_for_bit(dtype, batch):
    g = torch.Generator().manual_seed(batch)
    for h in _trees():
        if batch == 4000 and h.num_leaves > 2000:
            continue  # the wide star: its rows are summed at every other batch size
        x = _binades(g, (batch, h.num_leaves), dtype)
        got = native.leaf_to_node_sum(h, x.t(), accumulation_dtype(h, dtype))
        assert got is not None
        _assert_same_bits(got, _torch_sums(h, x.t()))
        _assert_same_bits(leaf_to_node_sum(h, x.t(), "levels"), got)  # the wiring takes it


@needs_native
def test_node_sums_take_any_strides_and_one_sample():
    g = torch.Generator().manual_seed(5)
    for h in _trees()[:5]:
        for dtype in (torch.float32, torch.float64):
            wide = _binades(g, (40, 3 * h.num_leaves), dtype)
            cases = [wide[:, ::3].t(),                                   # leaves 3 apart
                     wide[::4, : h.num_leaves].t(),                      # every 4th row
                     wide[:9, : h.num_leaves].t().contiguous(),          # node-major input
                     wide[0, : h.num_leaves, None].expand(-1, 11),       # one row broadcast (stride 0)
                     wide[3, : h.num_leaves],                            # one sample, 1-D
                     wide[3, : 3 * h.num_leaves : 3]]                    # one sample, strided
            for x in cases:
                got = native.leaf_to_node_sum(h, x, accumulation_dtype(h, dtype))
                assert got is not None and got.is_contiguous()
                _assert_same_bits(got, _torch_sums(h, x))


@needs_native
def test_node_sums_of_non_finite_values_propagate_as_in_torch():
    h = bundled("tieredimagenet-h")[0]
    x = torch.rand(16, h.num_leaves)
    x[1, 5], x[2, 7], x[3, 9], x[3, 10] = float("inf"), float("nan"), float("inf"), float("-inf")
    x[4] = torch.finfo(torch.float32).max  # overflows to inf in float32 sums
    _assert_same_bits(native.leaf_to_node_sum(h, x.t(), torch.float32), _torch_sums(h, x.t()))


@needs_native
def test_the_kernel_stands_aside_where_a_torch_operator_must_be_seen():
    h = bundled("tieredimagenet-h")[0]
    x = torch.rand(4, h.num_leaves)
    assert native.leaf_to_node_sum(h, x.t().requires_grad_(), torch.float32) is None  # autograd records it
    assert native.leaf_to_node_sum(h, x.t().half(), torch.float16) is None  # dtypes without a kernel
    assert native.leaf_to_node_sum(h, x.t()[..., None], torch.float32) is None  # (L, *, *) tables
    with Operators():  # operator counts see the torch path
        assert native.leaf_to_node_sum(h, x.t(), torch.float32) is None
    with native.use_native(False):
        assert native.leaf_to_node_sum(h, x.t(), torch.float32) is None
    assert native.leaf_to_node_sum(h, x.t(), torch.float32) is not None


@needs_native
@pytest.mark.parametrize("name", ["tree_distance", "hamming", None])
def test_a_call_after_the_kernel_finds_the_torch_paths_tables(name):
    """A call that must run torch operators (counted here, traced by torch.export) after native calls builds
    no tree table inside: the same operators as after a torch warm-up."""
    parents = [h.parent.tolist() for h, _ in random_trees(41, 1)][0]
    counts = []
    for warm_native in (False, True):
        h = hd.Hierarchy.from_parents(parents)  # a fresh tree: no cached table
        decode = (lambda x: hd.node_probabilities(h, x)) if name is None else hd.get_metric(name, h).decode
        with hd.plan_for("cpu"):
            for rows in (1, 40):
                x = torch.softmax(torch.randn(rows, h.num_leaves), 1)
                with native.use_native(warm_native):
                    decode(x)
                with Operators() as c:
                    decode(x)
                counts.append(len(c.ops))
    assert counts[:2] == counts[2:] and min(counts) > 0


@needs_native
def test_posterior_node_probabilities_equal_with_the_kernel_on_and_off():
    h = bundled("inat19")[0]
    p = _rows(h, 33, seed=0, scale=4)
    with hd.plan_for("cpu"):
        on, off = _on_and_off(lambda: hd.node_probabilities(h, p))
    _assert_same_bits(on, off)
    assert on.t().is_contiguous()  # node-major, as the torch path stores it


def _on_and_off(fn):
    """``fn()`` with the native kernels on, then off (the torch path)."""
    with native.use_native(True):
        on = fn()
    with native.use_native(False):
        off = fn()
    return on, off


def _decisions(metric, p, **kw):
    return _on_and_off(lambda: metric.decode(p, **kw))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tree_distance_decisions_equal_with_the_kernel_on_and_off(dtype):
    g = torch.Generator().manual_seed(3)
    with hd.plan_for("cpu"):
        for h in _trees():
            for c in (0.0, 0.1, 0.5, 0.9, 0.999):
                metric = hd.get_metric("tree_distance_c", h, c=c) if c else hd.get_metric("tree_distance", h)
                for batch in (1, 7, 300):
                    logits = torch.randn(batch, h.num_leaves, generator=g, dtype=dtype) * 6
                    p = torch.softmax(logits, 1)
                    on, off = _decisions(metric, p)
                    assert torch.equal(on, off)
                    # unnormalised rows (several root paths above the threshold), zeros, NaN: unvalidated
                    q = torch.rand(batch, h.num_leaves, generator=g, dtype=dtype) * 3
                    q[0] = 0.0
                    if batch > 1:
                        q[1, 0] = float("nan")
                    on, off = _decisions(metric, q, validate=False)
                    assert torch.equal(on, off)


@needs_native
def test_tree_distance_compares_in_the_probabilities_dtype():
    """A node at exactly float32(0.55) is not above the threshold 0.55 compared in float32 (it would be in
    float64), and one a step above it is."""
    h = hd.Hierarchy.from_parents([2, 2, 3, -1])  # leaves 0, 1 under node 2 under the root 3
    t = torch.tensor(0.55, dtype=torch.float32)
    above = torch.nextafter(t, torch.tensor(1.0))
    p = torch.stack([torch.stack([t, 1 - t]), torch.stack([above, 1 - above]), torch.tensor([0.5, 0.5])])
    metric = hd.get_metric("tree_distance_c", h, c=0.1)
    with hd.plan_for("cpu"):
        on, off = _decisions(metric, p, validate=False)
        assert on.tolist() == off.tolist() == [2, 0, 2]
        with pytest.warns(UserWarning, match="root"):
            huge = hd.get_metric("tree_distance_c", h, c=1e300)  # the threshold is inf in float32: the root
        on, off = _decisions(huge, p, validate=False)
        assert on.tolist() == off.tolist() == [3, 3, 3]


@needs_native
def test_a_shared_posterior_decides_from_its_node_table():
    h = bundled("tieredimagenet-h")[0]
    p = _rows(h, 50, seed=1)
    with hd.plan_for("cpu"):
        post = hd.Posterior(h, p)
        fused = tree_distance_decode(post)  # no node table yet: the fused kernel
        assert "node" not in post._memo
        post.node
        assert torch.equal(tree_distance_decode(post), fused)
        fused_sets = hamming_decode(post)  # no weighted table yet: the fused kernel
        assert ("weighted", "inv_depth") not in post._memo
        inverse_depth_mass(post)
        assert torch.equal(hamming_decode(post), fused_sets)
        with native.use_native(False):
            assert torch.equal(hd.get_metric("tree_distance", h).decode(p), fused)
            assert torch.equal(hd.get_metric("hamming", h).decode(p), fused_sets)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_root_share_sets_equal_the_torch_path(dtype):
    """Hamming's rule w(n) > share · w(root) of leaf-weighted sums, on values over 30 binades, and its decisions."""
    g = torch.Generator().manual_seed(11)
    for h in _trees():
        for batch in (1, 7, 300):
            x = _binades(g, (batch, h.num_leaves), dtype)
            weights = _binades(g, (h.num_leaves, 1), dtype) + 0.25
            for share in (0.5, 0.3):
                got = native.above_root_share(h, x, weights, share, accumulation_dtype(h, dtype))
                with native.use_native(False):
                    w = leaf_to_node_sum(h, x.t() * weights, "levels")
                assert got is not None and got.dtype == torch.bool
                assert torch.equal(got, w > share * w[h.root])
        metric = hd.get_metric("hamming", h)
        with hd.plan_for("cpu"):
            p = torch.softmax(torch.randn(40, h.num_leaves, generator=g, dtype=dtype) * 6, 1)
            on, off = _decisions(metric, p)
            assert torch.equal(on, off) and on.stride() == off.stride()
            q = torch.rand(40, h.num_leaves, generator=g, dtype=dtype) * 3
            q[0] = 0.0  # w(root) = 0: no node above 0
            on, off = _decisions(metric, q, validate=False)
            assert torch.equal(on, off)


@needs_native
def test_a_shared_posterior_decides_hamming_from_its_table():
    h = bundled("inat19")[0]
    p = _rows(h, 30, seed=6)
    metric = hd.get_metric("hamming", h)
    with hd.plan_for("cpu"):
        post = hd.Posterior(h, p)
        fused = metric.decode(post)
        assert ("weighted", "inv_depth") not in post._memo  # no float table: the fused kernel
        metric.expected(post, fused)  # sums W(n) in the Posterior
        assert ("weighted", "inv_depth") in post._memo
        assert torch.equal(metric.decode(post), fused)


def _torch_prefixes(h, x):
    """The (L + 1, B) prefix sums of (B, L) ``x`` in the tree's depth-first order by each torch layout the kernel
    replaces: a cumsum down the leaf-major table (``depth_prefix_sums``), along the batch-major rows (hF_β),
    and along blocks of NumPy-gathered rows (Jaccard at batch)."""
    order = depth_ranges(h).leaf_order
    with native.use_native(False):
        leaf_major = depth_prefix_sums(h, x.t())
    rows = torch.nn.functional.pad(x.index_select(1, order).to(torch.float64).cumsum(1), (1, 0)).t()
    blocks = torch.zeros(x.shape[0], h.num_leaves + 1, dtype=torch.float64)
    for a in range(0, x.shape[0], 5):
        part = blocks[a:a + 5, 1:]
        part.copy_(torch.from_numpy(np.take(x[a:a + 5].numpy(), order.numpy(), axis=1)))
        part.cumsum_(1)
    return leaf_major, rows, blocks.t()


def _prefix_trees():
    """Trees with one and with several leaf depths: the bundled two, a chain beside leaves, random ones (not the
    wide star: one leaf depth, as iNat19's)."""
    trees = [h for h in _trees() if h.num_leaves <= 2000]
    depths = [h.num_leaf_depths for h in trees]
    assert max(depths) >= 3 and depths.count(1) >= 1
    return trees


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [0, 1, 7, 4000])
def test_depth_prefix_equals_every_torch_layout_bit_for_bit(dtype, batch):
    g = torch.Generator().manual_seed(100 + batch)
    for h in _prefix_trees():
        if batch == 4000 and h.num_leaves < 50:
            continue
        x = _binades(g, (batch, h.num_leaves), dtype)
        x[:, 0] = -0.0  # a first -0.0: torch's accumulator starts at +0.0
        refs = _torch_prefixes(h, x)
        order = depth_ranges(h).leaf_order
        for batch_major in (False, True):
            got = native.depth_prefix(x.t(), order, batch_major)
            assert got is not None and got.shape == (h.num_leaves + 1, batch)
            assert (got.t() if batch_major else got).is_contiguous()
            for want in refs:
                _assert_same_bits(got, want)
        wired = depth_prefix_sums(h, x.t())  # the wiring takes it
        _assert_same_bits(wired, refs[0])
        assert wired.is_contiguous()


@needs_native
def test_depth_prefix_takes_any_strides():
    g = torch.Generator().manual_seed(6)
    for h in _prefix_trees()[:6]:
        order = depth_ranges(h).leaf_order
        for dtype in (torch.float32, torch.float64):
            wide = _binades(g, (40, 3 * h.num_leaves), dtype)
            cases = [wide[:, ::3],                                       # leaves 3 apart
                     wide[::4, : h.num_leaves],                          # every 4th row
                     wide[:9, : h.num_leaves].t().contiguous().t(),      # from a node-major table
                     wide[0, : h.num_leaves].expand(11, -1),             # one row broadcast (stride 0)
                     wide[3:4, : 3 * h.num_leaves : 3]]                  # one sample, strided
            for x in cases:
                want = _torch_prefixes(h, x.contiguous())
                for batch_major in (False, True):
                    _assert_same_bits(native.depth_prefix(x.t(), order, batch_major), want[0])


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_depth_prefix_of_extreme_values_matches_torch(dtype):
    h = bundled("tieredimagenet-h")[0]
    big, tiny = torch.finfo(dtype).max, torch.finfo(dtype).tiny
    x = torch.rand(24, h.num_leaves, generator=torch.Generator().manual_seed(2), dtype=dtype)
    x[1, 5], x[2, 7], x[3, 9], x[3, 10] = float("inf"), float("nan"), float("inf"), float("-inf")
    x[4] = big  # float64 sums of float64 maxima overflow to inf
    x[5, ::2], x[5, 1::2] = big, -big  # cancellations whose rounding depends on the order
    x[6] = tiny / 8  # subnormals
    x[7] = -x[7] * 1e-30
    x[8, ::3] = 1e30 if dtype == torch.float32 else 1e300
    order = depth_ranges(h).leaf_order
    want = _torch_prefixes(h, x)
    for batch_major in (False, True):
        for w in want:
            _assert_same_bits(native.depth_prefix(x.t(), order, batch_major), w)


@needs_native
def test_depth_prefix_stands_aside_where_it_does_not_apply():
    h = bundled("tieredimagenet-h")[0]
    x = torch.rand(4, h.num_leaves)
    order = depth_ranges(h).leaf_order
    assert native.depth_prefix(x.t().requires_grad_(), order, True) is None  # autograd records it
    assert native.depth_prefix(x.t().half(), order, True) is None  # dtypes without a kernel
    assert native.depth_prefix(x.t(), order.int(), True) is None  # int32 orders
    assert native.depth_prefix(x.t(), order[:-1], True) is None  # an order of another length
    assert native.depth_prefix(x[0], order, True) is None  # 1-D
    with Operators() as count:  # operator counts see the torch path
        assert native.depth_prefix(x.t(), order, True) is None
        depth_prefix_sums(h, x.t())
    assert count.ops
    with native.use_native(False):
        assert native.depth_prefix(x.t(), order, False) is None
    assert native.depth_prefix(x.t(), order, False) is not None


@needs_native
@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_posterior_depth_prefix_equals_with_the_kernel_on_and_off(plan):
    g = torch.Generator().manual_seed(9)
    for h in _prefix_trees()[:3]:
        p = torch.softmax(torch.randn(37, h.num_leaves, generator=g) * 5, 1)
        with hd.plan_for(plan):
            on = hd.Posterior(h, p).depth_prefix()
            with native.use_native(False):
                off = hd.Posterior(h, p).depth_prefix()
        _assert_same_bits(on, off)
        assert on.stride() == off.stride()


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hf_beta_and_jaccard_decisions_equal_with_the_kernel_on_and_off(dtype, monkeypatch):
    """Batches below and above the size from which both decoders scan the batch-major rows in place (Jaccard:
    2^17 entries), on trees with several leaf depths, peaked and flat rows."""
    g = torch.Generator().manual_seed(4)
    ran, kernel = [], native.depth_prefix

    def spy(leaf_values, order, batch_major):
        out = kernel(leaf_values, order, batch_major)
        ran.append(batch_major if out is not None else None)
        return out
    monkeypatch.setattr(native, "depth_prefix", spy)
    trees = [bundled("tieredimagenet-h")[0]] + [h for h in _prefix_trees()[3:] if h.num_leaf_depths > 1][:3]
    with hd.plan_for("cpu"):
        for h in trees:
            metrics = [hd.get_metric("hf_beta", h, beta=b) for b in (0.5, 1.0, 2.0)] + [hd.get_metric("jaccard", h)]
            for batch in (1, 7, max(300, (1 << 17) // h.num_leaves + 5)):
                scale = torch.rand(batch, 1, generator=g, dtype=dtype) * 8
                p = torch.softmax(torch.randn(batch, h.num_leaves, generator=g, dtype=dtype) * scale, 1)
                for metric in metrics:
                    on, off = _decisions(metric, p)
                    assert torch.equal(on, off)
    # both layouts ran: leaf-major (the Posterior's) and batch-major (None: turned off)
    assert set(ran) == {False, True, None}


def test_the_gpu_plan_is_untouched():
    h = bundled("tieredimagenet-h")[0]
    p = _rows(h, 20, seed=2)
    with hd.plan_for("cuda"):
        post = hd.Posterior(h, p)
        assert post.plan.tree_sums == "prefix"
        with native.use_native(False):
            off = hd.get_metric("tree_distance", h).decode(p)
        assert torch.equal(hd.get_metric("tree_distance", h).decode(p), off)


@needs_native
def test_the_portable_c_loops_give_the_same_bits(tmp_path, monkeypatch):
    """The source's plain C loading (what a machine without SSE2 builds) against its SSE2 transposition."""
    monkeypatch.setenv("HDECODE_CACHE_DIR", str(tmp_path))
    lib, reason = _build.load(_build.FLAGS + ("-DHD_PORTABLE",))
    assert lib is not None, reason
    native._declare(lib)
    g = torch.Generator().manual_seed(9)
    for h in _trees()[:4]:
        x = _binades(g, (19, h.num_leaves), torch.float32)
        acc = accumulation_dtype(h, torch.float32)
        fast = native.leaf_to_node_sum(h, x.t(), acc)
        fast_pred = native.deepest_above(h, x, 0.01, acc)
        weights = _binades(g, (h.num_leaves,), torch.float32) + 0.5
        fast_share = native.above_root_share(h, x, weights, 0.3, acc)
        monkeypatch.setitem(native._STATE, "lib", lib)
        _assert_same_bits(native.leaf_to_node_sum(h, x.t(), acc), fast)
        assert torch.equal(native.deepest_above(h, x, 0.01, acc), fast_pred)
        assert torch.equal(native.above_root_share(h, x, weights, 0.3, acc), fast_share)
        monkeypatch.undo()
        monkeypatch.setenv("HDECODE_CACHE_DIR", str(tmp_path))


# ---------------------------------------------------------------------------------------------- the build cache
def test_every_c_source_and_header_is_built_and_shipped():
    """Every C file beside the kernels is compiled (and keys the cache), and the package data ships it."""
    import fnmatch
    import tomllib

    folder = pathlib.Path(native.__file__).parent
    assert set(_build.SOURCES) == set(folder.glob("*.c")) and _build.SOURCES
    assert set(_build.HEADERS) == set(folder.glob("*.h"))
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = config["tool"]["setuptools"]["package-data"]["hdecode_torch.kernels.native"]
    for f in _build.SOURCES + _build.HEADERS:
        assert any(fnmatch.fnmatch(f.name, pattern) for pattern in shipped), f.name


def test_a_second_load_reuses_the_built_library(tmp_path, monkeypatch):
    if _build.find_compiler() is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("HDECODE_CACHE_DIR", str(tmp_path))
    lib, reason = _build.load()
    if lib is None:
        pytest.skip(f"native kernels unavailable here: {reason}")
    built = sorted(tmp_path.iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"
    stamp = built[0].stat().st_mtime_ns, built[0].stat().st_ino

    def no_compile(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(_build, "_compile", no_compile)
    again, reason = _build.load()
    assert again is not None, reason
    assert sorted(tmp_path.iterdir()) == built
    assert (built[0].stat().st_mtime_ns, built[0].stat().st_ino) == stamp


def test_a_corrupt_cache_file_is_rebuilt(tmp_path, monkeypatch):
    cc = _build.find_compiler()
    identity = _build._identity(cc) if cc else None
    if identity is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("HDECODE_CACHE_DIR", str(tmp_path))
    path = _build.library_path(cc, identity, tmp_path)
    path.write_bytes(b"\x7fELF half a library")
    lib, reason = _build.load()
    if lib is None and "compiler failed" in (reason or ""):
        pytest.skip(f"native kernels unavailable here: {reason}")
    assert lib is not None, reason
    assert path.stat().st_size > 1000
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_no_compiler_means_no_library(tmp_path, monkeypatch):
    monkeypatch.setenv("HDECODE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # runs, prints nothing and fails: no compiler identity
    lib, reason = _build.load()
    assert lib is None and "does not run" in reason
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    lib, reason = _build.load()
    assert lib is None and reason == "no C compiler ($CC, cc or gcc)"
    assert list(tmp_path.iterdir()) == []


def _run(code: str, **env) -> str:
    full = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


DECIDE = """
    import torch, hdecode_torch as hd
    from hdecode_torch.kernels import native
    h = hd.load_hierarchy("tieredimagenet-h")
    p = torch.softmax(torch.randn(64, h.num_leaves, generator=torch.Generator().manual_seed(4)) * 5, 1)
    with hd.plan_for("cpu"):
        pred = hd.get_metric("tree_distance", h).decode(p).tolist()
        node = hd.node_probabilities(h, p).contiguous().view(torch.int32).sum().item()
    print(native.available(), native.unavailable_reason(), pred, node, sep="|")
"""


@pytest.mark.plan_independent
def test_without_a_library_the_torch_path_decides(tmp_path):
    """A corrupt cache file and no compiler, or HDECODE_NATIVE=0: the same decisions, from torch."""
    cc = _build.find_compiler()
    identity = _build._identity(cc) if cc else None
    if identity is not None:  # the file this machine's compiler would load, corrupt
        _build.library_path(cc, identity, tmp_path).write_bytes(b"not a library")
    broken = _run(DECIDE, HDECODE_CACHE_DIR=str(tmp_path), CC="false").strip().split("|")
    assert broken[0] == "False" and broken[1].endswith("false does not run")
    off = _run(DECIDE, HDECODE_CACHE_DIR=str(tmp_path), HDECODE_NATIVE="0").strip().split("|")
    assert off[:2] == ["False", "turned off by HDECODE_NATIVE=0"]
    assert broken[2:] == off[2:]
    if native.available():
        on = _run(DECIDE, HDECODE_CACHE_DIR=str(tmp_path / "fresh")).strip().split("|")
        assert on[:2] == ["True", "None"] and on[2:] == off[2:]


@pytest.mark.plan_independent
def test_two_processes_building_at_once_both_load(tmp_path):
    if _build.find_compiler() is None:
        pytest.skip("no C compiler here")
    code = "from hdecode_torch.kernels.native import _build; lib, why = _build.load(); print(lib is not None, why)"
    env = dict(os.environ, HDECODE_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    if not native.available():
        pytest.skip(f"native kernels unavailable here: {native.unavailable_reason()}")
    assert outs == ["True None", "True None"]
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".so"  # one library, no temporary left
