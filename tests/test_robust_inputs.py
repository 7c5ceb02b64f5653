"""Bad input gets a clear error, never a wrong answer (SPEC §6; the audit is docs/validation.md).

Every message names the argument, says what was expected and what was found, and, where
there is one, the fix.  Validation is one fused check with a single host sync, and
``validate=False`` skips it.
"""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import Hierarchy
import hdecode_torch.core.row_checks as row_checks
from hdecode_torch.core.validation import ROW_SUM_TOLERANCE, prepare_leaf_probs, row_sum_tolerance

PARENTS = [5, 5, 6, 6, 6, 7, 7, -1]  # leaves 0..4, internal 5, 6, root 7
L, N = 5, 8


@pytest.fixture(scope="module")
def h():
    return Hierarchy.from_parents(PARENTS)


@pytest.fixture(scope="module")
def P():
    return torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2], [0.5, 0.0, 0.25, 0.25, 0.0]], dtype=torch.float64)


def all_entry_points(h):
    """(label, callable taking leaf_probs) for every public function that reads probabilities."""
    out = [("node_probabilities", lambda x: hd.node_probabilities(h, x)),
           ("Posterior", lambda x: hd.Posterior(h, x))]
    for name, params in [("accuracy", {}), ("wu_palmer", {}), ("hf_beta", {"beta": 1.0}), ("hamming", {})]:
        m = hd.get_metric(name, h, **params)
        out.append((f"{name}.decode", m.decode))
        out.append((f"{name}.expected", lambda x, m=m: m.expected(x, torch.zeros(2, dtype=torch.long))))
    for name in ("majority", "plurality", "crm"):
        out.append((f"{name}.decode", hd.get_decoder(name, h).decode))
    out.append(("calibrate_darts", lambda x: hd.calibrate_darts(h, x, torch.tensor([0, 1]), 0.5)))
    return out


# --------------------------------------------------------------------------- hierarchies
@pytest.mark.parametrize("parents,exc,match", [
    ([], ValueError, "non-empty tree"),
    ([-1], ValueError, "at least one leaf"),
    ([-1, -1, 0], ValueError, r"exactly one root .* found 2: nodes \[0, 1\]. Add a common root"),
    ([1, 0, 0], ValueError, "exactly one root.*found none.*cycle"),
    ([-1, 2, 1, 0], ValueError, "cycle"),
    ([-1, 1], ValueError, "cycle: node 1 is its own parent"),
    ([-1, 5], ValueError, r"every entry of `parents` in -1..1, but parents\[1\] = 5"),
    ([-1, -2], ValueError, r"parents\[1\] = -2"),
    ([-1, 2**70], ValueError, r"parents\[1\] = 1180591620717411303424"),
    ([-1, 0.5], TypeError, r"integer node ids, but parents\[1\] = .*0.5"),
    ([-1, float("nan")], TypeError, r"integer node ids, but parents\[1\] = .*nan"),
    ([-1, None], TypeError, "integer node ids"),
    ([-1, "0"], TypeError, "integer node ids"),
    ([True, False], TypeError, r"parents\[0\] = True"),
    (np.array([True, False]), TypeError, "dtype bool"),
    ([[1, -1]], ValueError, r"one-dimensional, but got shape \(1, 2\)"),
    ([[1], [1, 2]], TypeError, "flat sequence"),
    (None, TypeError, "sequence of integer node ids, but got NoneType"),
    ("abc", TypeError, "but got str"),
    ({0: 1}, TypeError, "but got dict"),
    (3, TypeError, "but got int"),
])
def test_from_parents_errors(parents, exc, match):
    with pytest.raises(exc, match=match):
        Hierarchy.from_parents(parents)


def test_from_parents_accepts_arrays_tensors_and_integral_floats():
    for parents in (np.array(PARENTS, dtype=np.int32), torch.tensor(PARENTS), [float(p) for p in PARENTS],
                    np.array(PARENTS, dtype=object)):
        assert Hierarchy.from_parents(parents).parents_list == PARENTS


def test_names_and_labels_errors():
    with pytest.raises(ValueError, match=r"`names` to have one entry per node \(8\), but got 2"):
        Hierarchy.from_parents(PARENTS, names=["a", "b"])
    with pytest.raises(ValueError, match="distinct node ids in `names`, but 'a' appears more than once"):
        Hierarchy.from_parents([2, 2, -1], names=["a", "a", "r"])
    with pytest.raises(TypeError, match=r"hashable node ids in `names`, but got \[1\]"):
        Hierarchy.from_parents([2, 2, -1], names=[[1], [2], [3]])
    with pytest.raises(TypeError, match="`labels` to be a sequence"):
        Hierarchy.from_parents([2, 2, -1], labels=5)
    with pytest.raises(ValueError, match=r"`labels` to have one entry per node \(3\), but got 1"):
        Hierarchy.from_parents([2, 2, -1], labels=["x"])
    with pytest.raises(TypeError, match="`names` to be a sequence"):
        Hierarchy.from_parents([2, 2, -1], names="abc")


def test_from_dict_edges_paths_errors():
    with pytest.raises(TypeError, match="`children_of` to be a mapping"):
        Hierarchy.from_dict([("a", "b")])
    with pytest.raises(TypeError, match="children of 'a' to be a list of ids, but got 'b'"):
        Hierarchy.from_dict({"a": "b"})
    with pytest.raises(ValueError, match=r"Node 'b' has two parents \('a' and 'c'\)"):
        Hierarchy.from_edges([("a", "b"), ("c", "b"), ("a", "c")])
    with pytest.raises(ValueError, match="Unknown id 'zebra' in `leaf_order` \\(item 1\\)"):
        Hierarchy.from_dict({"r": ["a", "b"]}, leaf_order=["a", "zebra"])
    with pytest.raises(ValueError, match="each leaf once in `leaf_order`"):
        Hierarchy.from_dict({"r": ["a", "b"]}, leaf_order=["a", "a"])
    with pytest.raises(ValueError, match="`leaf_order` item 0 \\('r'\\) is an internal node"):
        Hierarchy.from_dict({"r": ["a", "b"]}, leaf_order=["r", "a"])
    with pytest.raises(ValueError, match="empty"):
        Hierarchy.from_dict({})
    with pytest.raises(ValueError, match="cycle"):
        Hierarchy.from_dict({"r": ["x"], "a": ["b"], "b": ["a"]})
    with pytest.raises(TypeError, match="`pairs` to be an iterable of \\(parent, child\\) pairs"):
        Hierarchy.from_edges(None)
    with pytest.raises(ValueError, match="item 0 is 1"):
        Hierarchy.from_edges([1, 2])
    with pytest.raises(ValueError, match="item 1 is 'ab'"):
        Hierarchy.from_edges([("r", "a"), "ab"])
    with pytest.raises(TypeError, match="single string"):
        Hierarchy.from_paths("a/b")
    with pytest.raises(ValueError, match="appears twice"):
        Hierarchy.from_paths(["a/b", "a/b"])


def test_json_and_bundled_errors(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(ValueError):  # json.JSONDecodeError is a ValueError
        Hierarchy.from_json(f)
    f.write_text(json.dumps({"ids": [1, 2]}))
    with pytest.raises(ValueError, match="`parents` field"):
        Hierarchy.from_json(f)
    f.write_text(json.dumps({"parents": [2, 2, -1], "ids": ["a", "a", "r"]}))
    with pytest.raises(ValueError, match="distinct node ids"):
        Hierarchy.from_json(f)
    with pytest.raises(ValueError, match="Unknown bundled hierarchy 'imagenet'; available: inat19, tieredimagenet-h"):
        hd.load_hierarchy("imagenet")
    with pytest.raises(TypeError, match="`name` to be a string"):
        hd.load_hierarchy(3)


def test_device_errors(h):
    with pytest.raises(ValueError, match="`device` to be a torch device such as 'cpu'.*'gpu0'"):
        h.to("gpu0")
    with pytest.raises(TypeError, match="`device` to be a torch.device or a string"):
        h.to(1.5)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            h.to("cuda")
    with pytest.raises(ValueError, match="internal node ids in 5..7, but got 0"):
        h.with_stop_leaves([0])
    with pytest.raises(TypeError, match="`nodes` to be internal node ids"):
        h.with_stop_leaves(["x"])


# --------------------------------------------------------------------------- probabilities
BAD_PROBS = [
    ("negative", lambda: torch.tensor([[0.5, -0.1, 0.2, 0.2, 0.2]] * 2), ValueError,
     r"`leaf_probs` to be probabilities \(>= 0\), but row 0 has a negative entry \(-0.1\).*from_logits=True"),
    ("logits", lambda: torch.randn(2, L, generator=torch.Generator().manual_seed(0)), ValueError, "from_logits=True"),
    ("sum", lambda: torch.full((2, L), 0.3), ValueError,
     r"each row of `leaf_probs` to sum to 1 \(tolerance 0.00010\d* for torch.float32 input\), but row 0 sums to 1.5 "
     r"\(2 bad row\(s\)\). Pass normalize=True"),
    ("nan", lambda: torch.tensor([[0.2] * 5, [float("nan")] + [0.2] * 4]), ValueError,
     "`leaf_probs` to be finite, but row 1 contains NaN"),
    ("inf", lambda: torch.tensor([[float("inf")] + [0.2] * 4] * 2), ValueError, "row 0 contains infinite"),
    ("columns", lambda: torch.full((2, 4), 0.25), ValueError,
     r"`leaf_probs` to have 5 columns \(one per leaf of the hierarchy\), but got shape \(2, 4\)"),
    ("3d", lambda: torch.full((2, 1, L), 0.2), ValueError, r"shape \(B, 5\) or \(5,\), but got \(2, 1, 5\)"),
    ("0d", lambda: torch.tensor(1.0), ValueError, r"shape \(B, 5\) or \(5,\), but got \(\)"),
    ("int", lambda: torch.ones(2, L, dtype=torch.long), TypeError, "floating-point tensor, but got dtype torch.int64"),
    ("bool", lambda: torch.ones(2, L, dtype=torch.bool), TypeError, "floating-point tensor, but got dtype torch.bool"),
    ("complex", lambda: torch.ones(2, L, dtype=torch.complex64), TypeError, "dtype torch.complex64"),
    ("sparse", lambda: torch.full((2, L), 0.2).to_sparse(), TypeError, r"dense tensor.*to_dense\(\)"),
    ("string", lambda: "probs", TypeError, "`leaf_probs` to be a torch.Tensor, but got str"),
    ("ragged", lambda: [[0.5, 0.5], [1.0]], TypeError, "tensor or array of numbers"),
    ("objects", lambda: [[0.2, None, 0.2, 0.2, 0.4]] * 2, TypeError, "tensor or array of numbers"),
]


@pytest.mark.parametrize("label,make,exc,match", BAD_PROBS, ids=[b[0] for b in BAD_PROBS])
def test_bad_probabilities_every_entry_point(h, label, make, exc, match):
    for where, fn in all_entry_points(h):
        with pytest.raises(exc, match=match):
            fn(make())


def test_probabilities_accepted_forms(h, P):
    want = hd.node_probabilities(h, P)
    assert torch.equal(hd.node_probabilities(h, P.numpy()), want)
    assert torch.equal(hd.node_probabilities(h, P.tolist()), want)
    assert torch.equal(hd.node_probabilities(h, P.t().contiguous().t()), want)  # non-contiguous
    assert torch.equal(hd.node_probabilities(h, P.clone().requires_grad_()).detach(), want)


def test_row_sum_tolerance_is_per_input_dtype(h):
    for dtype in ROW_SUM_TOLERANCE:
        tol = row_sum_tolerance(dtype, L)
        ok = torch.full((1, L), 0.2, dtype=torch.float64)
        ok[0, 0] += tol / 2
        hd.node_probabilities(h, ok.to(dtype))  # within tolerance (after the cast too)
        bad = torch.full((1, L), 0.2, dtype=torch.float64)
        bad[0, 0] += 4 * tol
        with pytest.raises(ValueError, match=f"tolerance {tol:g} for {dtype} input"):
            hd.node_probabilities(h, bad.to(dtype))
    assert hd.ROW_SUM_TOLERANCE is ROW_SUM_TOLERANCE


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_row_sum_test_at_its_bounds_is_the_row_by_row_one(h, plan, dtype):
    """Rows whose sums sit on either side of 1 ± tol, NaN, ±inf, negative and -0.0 entries, alone or among
    good rows: a batch passes exactly when every row passes ``abs(float64 row sum - 1) <= tol`` and holds
    no negative entry, on both plans, for decode (check read with the decision), expected (with the range
    check of ``pred``) and node_probabilities."""
    tol = row_sum_tolerance(dtype, L)
    finfo = torch.finfo(dtype)
    sums = []
    for edge in (1 - tol, 1 + tol):  # the floats of dtype around each bound
        s = torch.tensor(edge, dtype=dtype)
        for _ in range(3):
            s = torch.nextafter(s, torch.tensor(0.0, dtype=dtype))
        for _ in range(7):
            sums.append(float(s))
            s = torch.nextafter(s, torch.tensor(2.0, dtype=dtype))
    m = hd.get_metric("tree_distance", h)
    good = torch.tensor([[0.25, 0.25, 0.25, 0.25, 0.0]], dtype=dtype)
    rows = [(torch.tensor([[v, 0.0, 0.0, 0.0, 0.0]], dtype=dtype), abs(v - 1.0) <= tol) for v in sums]
    rows += [(torch.tensor([[1.0, 0.0, -0.0, 0.0, 0.0]], dtype=dtype), True),
             (torch.tensor([[1.0, float("nan"), 0.0, 0.0, 0.0]], dtype=dtype), False),
             (torch.tensor([[float("inf"), 0.0, 0.0, 0.0, 0.0]], dtype=dtype), False),
             (torch.tensor([[1.0 + 2 * finfo.eps, -finfo.eps, 0.0, 0.0, 0.0]], dtype=dtype), False)]
    assert {want for _, want in rows} == {True, False}
    with hd.plan_for(plan):
        for row, want in rows:
            for x in (row, torch.cat([good, row, good])):
                pred = torch.zeros(x.shape[0], dtype=torch.long)
                # a decoder's own host read, the pending check read with it (its flag on the device)
                read = lambda: hd.Posterior(h, x, defer_check=True).read(torch.tensor(3))  # noqa: E731
                for call in (lambda: m.decode(x), lambda: m.expected(x, pred), lambda: hd.node_probabilities(h, x),
                             read):
                    if want:
                        out = call()
                        assert out == [3] if call is read else out.shape[0] == x.shape[0]
                    else:
                        with pytest.raises(ValueError, match="`leaf_probs`"):
                            call()
        with pytest.raises(ValueError, match="`pred`"):  # a bad id among good rows: its own error
            m.expected(torch.cat([good, good]), torch.tensor([0, N]))


def test_a_large_table_is_checked_block_by_block_with_the_same_result(monkeypatch):
    """Row sums and the minimum read block by block equal the whole table's, and every error is still found
    in whichever block it lies (the last one, a partial block, included)."""
    big = hd.load_hierarchy("inat19")
    x = torch.rand(1003, big.num_leaves, generator=torch.Generator().manual_seed(0)).softmax(1)
    want = (row_checks.row_sums(x), x.amin())
    monkeypatch.setattr(row_checks, "CHECK_BLOCK_BYTES", 7 * big.num_leaves * 4)  # blocks of 7 rows
    monkeypatch.setattr(row_checks, "CHECK_BLOCKED_FROM_BYTES", 0)
    with monkeypatch.context() as m:  # the whole-table path would call row_sums: the blocks are read
        m.setattr(row_checks, "row_sums", lambda _: pytest.fail("read as a whole, not block by block"))
        sums, low = row_checks.row_sums_and_min(x)
    assert torch.equal(sums, want[0]) and torch.equal(low, want[1])
    calls = []
    with monkeypatch.context() as m:  # a table no larger than the limit: read as a whole, two passes
        m.setattr(row_checks, "CHECK_BLOCKED_FROM_BYTES", x.numel() * x.element_size())
        m.setattr(row_checks, "row_sums", lambda t: calls.append(t.shape) or t.sum(1).double())
        assert torch.equal(row_checks.row_sums_and_min(x)[0], want[0]) and calls == [x.shape]
    hd.node_probabilities(big, x)
    for row, value, match in [(1002, -1e-3, "negative entry"), (1001, float("nan"), "NaN"), (3, 0.5, "sum to 1")]:
        bad = x.clone()
        bad[row, 5] = value
        with pytest.raises(ValueError, match=match):
            hd.node_probabilities(big, bad)


def test_normalize(h):
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0], [0.0, 0.0, 0.0, 0.0, 5.0]], dtype=torch.float64)
    out = hd.node_probabilities(h, x, normalize=True)
    torch.testing.assert_close(out[:, :L], x / x.sum(1, keepdim=True))
    with pytest.raises(ValueError, match="Cannot normalize `leaf_probs`: row 1 sums to 0"):
        hd.node_probabilities(h, torch.tensor([[1.0, 0, 0, 0, 0], [0.0] * 5]), normalize=True)
    with pytest.raises(ValueError, match="negative entry"):
        hd.node_probabilities(h, -x, normalize=True)
    with pytest.raises(ValueError, match="NaN"):
        hd.node_probabilities(h, x * float("nan"), normalize=True)
    # finite entries whose sum overflows are rescaled, not turned into zeros
    big = torch.full((2, L), 3e38, dtype=torch.float32)
    out = hd.node_probabilities(h, big, normalize=True)
    torch.testing.assert_close(out[:, :L], torch.full((2, L), 0.2))
    # tiny (subnormal-scale) rows are fine too
    tiny = torch.tensor([[1e-40, 3e-40, 0, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(hd.node_probabilities(h, tiny, normalize=True)[0, :2], torch.tensor([0.25, 0.75]),
                               rtol=1e-3, atol=0)
    m = hd.get_metric("tree_distance", h)
    assert torch.equal(m.decode(hd.Posterior(h, x, normalize=True)), m.decode(x / x.sum(1, keepdim=True)))


def test_logits(h):
    z = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf"), 2.0]])
    p = hd.node_probabilities(h, z, from_logits=True)
    torch.testing.assert_close(p[:, :L], torch.softmax(z, 1))
    assert p[0, 1] == 0 and p[0, 3] == 0  # -inf logits are masked classes
    with pytest.raises(ValueError, match=r"row 0 is all -inf \(every class masked\)"):
        hd.node_probabilities(h, torch.full((1, L), float("-inf")), from_logits=True)
    with pytest.raises(ValueError, match=r"\(logits\) to be free of NaN, but row 1 contains NaN"):
        hd.node_probabilities(h, torch.tensor([[0.0] * 5, [float("nan")] * 5]), from_logits=True)
    with pytest.raises(ValueError, match=r"\(logits\) to be finite or -inf, but row 0 contains \+inf"):
        hd.node_probabilities(h, torch.tensor([[float("inf")] + [0.0] * 4]), from_logits=True)
    huge = torch.tensor([[1e38, -1e38, 0.0, 0.0, 0.0]])
    assert hd.node_probabilities(h, huge, from_logits=True)[0, 0] == 1
    with pytest.raises(TypeError, match="floating-point"):
        hd.node_probabilities(h, torch.zeros(1, L, dtype=torch.long), from_logits=True)


def test_validate_false_skips_checks(h):
    bad = torch.full((2, L), 0.4)  # rows sum to 2
    with pytest.raises(ValueError):
        hd.node_probabilities(h, bad)
    torch.testing.assert_close(hd.node_probabilities(h, bad, validate=False)[:, h.root], torch.full((2,), 2.0))
    nan = torch.full((2, L), float("nan"))
    hd.get_metric("wu_palmer", h).decode(nan, validate=False)  # no error: the caller vouched for its input
    hd.get_decoder("majority", h, validate=False).decode(nan)
    m = hd.get_metric("tree_distance", h, validate=False)
    m.decode(nan)
    m(torch.tensor([0]), torch.tensor([L - 1]))
    # shapes and dtypes are still checked: they are free (no data is read)
    with pytest.raises(ValueError, match="columns"):
        m.decode(torch.full((2, 4), 0.25))
    with pytest.raises(TypeError, match="floating-point"):
        m.decode(torch.ones(2, L, dtype=torch.long))


@contextlib.contextmanager
def count_host_syncs(monkeypatch):
    """Counts the tensor -> Python conversions (each one a device-to-host sync on a GPU)."""
    calls = []
    for attr in ("tolist", "item", "__bool__", "__int__", "__float__"):
        orig = getattr(torch.Tensor, attr)

        def wrapper(self, *a, _orig=orig, _attr=attr, **k):
            calls.append(_attr)
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, attr, wrapper)
    yield calls
    monkeypatch.undo()


def test_one_host_sync_per_validated_call(h, P, monkeypatch):
    pred = torch.tensor([0, 6])
    target = torch.tensor([1, 4])
    m = hd.get_metric("tree_distance", h)
    cases = [
        ("prepare_leaf_probs", lambda v: prepare_leaf_probs(P, L, validate=v)),
        ("prepare_leaf_probs normalize", lambda v: prepare_leaf_probs(P * 3, L, normalize=True, validate=v)),
        ("prepare_leaf_probs logits", lambda v: prepare_leaf_probs(P, L, from_logits=True, validate=v)),
        ("node_probabilities", lambda v: hd.node_probabilities(h, P, validate=v)),
        ("metric call", lambda v: m(pred, target, validate=v)),
        ("metric expected", lambda v: m.expected(P, pred, validate=v)),
        ("set metric call", lambda v: hd.get_metric("jaccard", h)(pred, target, validate=v)),
        ("set metric expected", lambda v: hd.get_metric("hamming", h).expected(P, pred, validate=v)),
        ("majority", lambda v: hd.get_decoder("majority", h).decode(P, validate=v)),
    ]
    for label, fn in cases:
        for validate, want in ((True, 1), (False, 0)):
            # Probabilities given as logits: the checked call says so.
            said = pytest.warns(UserWarning, match="looks like probabilities") if "logits" in label and validate \
                else contextlib.nullcontext()
            with said, count_host_syncs(monkeypatch) as calls:
                fn(validate)
            assert len(calls) == want, (label, validate, calls)


# --------------------------------------------------------------------------- predictions and targets
def test_prediction_and_target_errors(h, P):
    m = hd.get_metric("wu_palmer", h)
    s = hd.get_metric("hf_beta", h)
    with pytest.raises(ValueError, match=r"`pred` in 0..7 \(node ids\), but got 8 at position 1"):
        m(torch.tensor([0, 8]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"`target` in 0..4 \(leaf ids\), but got -1 at position 0"):
        m(torch.tensor([0, 1]), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"`target` in 0..4 \(leaf ids\), but got 5"):
        s(torch.tensor([0, 1]), torch.tensor([5, 0]))
    with pytest.raises(TypeError, match="`target` to hold integer class indices, but got dtype torch.float32"):
        m(torch.tensor([0]), torch.tensor([0.0]))
    with pytest.raises(TypeError, match="`pred` to hold integer node ids, but got dtype torch.complex64"):
        m(torch.tensor([1j]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"`target` to have 2 entries \(one per sample\), but got 3"):
        m(torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"`pred` to have shape \(B,\) or \(\) \(node ids\), but got \(2, 2\)"):
        m(torch.zeros(2, 2, dtype=torch.long), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"`target` to have shape \(B,\) or \(\), but got \(2, 1\)"):
        m(torch.tensor([0, 1]), torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(TypeError, match="scores single nodes.*bool set"):
        m(torch.zeros(1, N, dtype=torch.bool), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"`pred` to have shape \(B, 8\) or \(8,\), but got \(2, 3\)"):
        s(torch.zeros(2, 3, dtype=torch.bool), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"`pred` to have shape \(B, 8\) or \(8,\), but got \(\)"):
        s(torch.tensor(True), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"`pred` to have shape \(2,\) \(one node id per sample\), but got \(3,\)"):
        m.expected(P, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"`pred` in 0..7 \(node ids\), but got 99"):
        m.expected(P, torch.tensor([0, 99]))
    with pytest.raises(ValueError, match=r"`pred` to have shape \(2, 8\) or \(2,\).*got \(8,\)"):
        s.expected(P, torch.ones(N, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"`pred` to have shape \(8,\) or \(\).*got \(1, 8\)"):
        s.expected(P[0], torch.ones(1, N, dtype=torch.bool))
    with pytest.raises(TypeError, match="`pred` to be a torch.Tensor, but got int"):
        m(3, torch.tensor(0))


def test_validate_false_skips_range_checks(h):
    m = hd.get_metric("tree_distance", h)
    with pytest.raises(ValueError):
        m(torch.tensor([N]), torch.tensor([0]))
    with pytest.raises((IndexError, RuntimeError)):  # unchecked: the caller's responsibility
        m(torch.tensor([N + 5]), torch.tensor([0]), validate=False)


def test_predictions_accept_lists_arrays_and_broadcast(h):
    m = hd.get_metric("tree_distance", h)
    want = m(torch.tensor([0, 6]), torch.tensor([1, 4]))
    assert torch.equal(m([0, 6], [1, 4]), want)
    assert torch.equal(m(np.array([0, 6]), np.array([1, 4], dtype=np.uint8)), want)
    # a single prediction is broadcast against a batch of targets, and vice versa
    assert torch.equal(m(torch.tensor(6), torch.tensor([1, 4])), m(torch.tensor([6, 6]), torch.tensor([1, 4])))
    assert torch.equal(m(torch.tensor([0, 6]), torch.tensor(4)), m(torch.tensor([0, 6]), torch.tensor([4, 4])))
    s = hd.get_metric("jaccard", h)
    one = torch.zeros(N, dtype=torch.bool)
    one[6] = True
    assert s(one, torch.tensor([1, 4])).shape == (2,)
    assert torch.equal(s(one, torch.tensor([1, 4])), s(torch.tensor([6, 6]), torch.tensor([1, 4])))
    assert s(one, torch.tensor(4)).shape == ()


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("build,exc,match", [
    (lambda h: hd.get_metric("hf_beta", h, beta=0), ValueError, r"`beta` to be a float > 0, but got 0"),
    (lambda h: hd.get_metric("hf_beta", h, beta=-1), ValueError, r"`beta` to be a float > 0, but got -1"),
    (lambda h: hd.get_metric("hf_beta", h, beta=float("inf")), ValueError, "`beta` to be a float > 0"),
    (lambda h: hd.get_metric("hf_beta", h, beta=float("nan")), ValueError, "`beta` to be a number, but got nan"),
    (lambda h: hd.get_metric("hf_beta", h, beta="1"), TypeError, "`beta` to be a real number, but got str"),
    (lambda h: hd.get_metric("hf_beta", h, beta=True), TypeError, "`beta` to be a real number, but got bool"),
    (lambda h: hd.get_metric("tree_distance_c", h, c=-0.5), ValueError, r"`c` to be a float >= 0, but got -0.5"),
    (lambda h: hd.get_metric("wu_palmer", h, strategy="fast"), ValueError, "`strategy` to be one of"),
    (lambda h: hd.get_metric("wu_palmer", h, beta=2), ValueError,
     r"Bad parameters for metric 'wu_palmer': unknown parameter\(s\) 'beta'; accepted: strategy"),
    (lambda h: hd.get_metric("f1", h), ValueError, "Unknown metric 'f1'; available: accuracy"),
    (lambda h: hd.get_metric(None, h), TypeError, "`name` to be a metric name"),
    (lambda h: hd.get_metric("accuracy", PARENTS), TypeError, "`hierarchy` to be a Hierarchy, but got list"),
    (lambda h: hd.get_metric("cost_matrix", h), ValueError, "it requires 'cost'"),
    (lambda h: hd.CostMatrixMetric(h, torch.zeros(3, 3)), ValueError,
     r"`cost` to have shape \(num_nodes, num_leaves\) = \(8, 5\), but got \(3, 3\)"),
    (lambda h: hd.CostMatrixMetric(h, torch.full((N, L), float("nan"))), ValueError, "`cost` to be finite"),
    (lambda h: hd.CostMatrixMetric(h, torch.zeros(N, L, dtype=torch.complex64)), TypeError, "real"),
    (lambda h: hd.CostMatrixMetric(h, torch.zeros(N, L), higher_is_better="no"), TypeError, "`higher_is_better`"),
    (lambda h: hd.get_decoder("confidence_threshold", h, tau=1.0), ValueError, r"`tau` to be a float in \[0, 1\)"),
    (lambda h: hd.get_decoder("confidence_threshold", h, tau=None), TypeError, "`tau` to be a real number"),
    (lambda h: hd.get_decoder("darts", h, lam=-1), ValueError, "`lam` to be a float >= 0, but got -1"),
    (lambda h: hd.get_decoder("information_threshold", h, threshold=2.0), ValueError, r"log\(L\)"),
    (lambda h: hd.get_decoder("information_threshold", h), ValueError, r"Bad parameters for decoder 'information_threshold': it requires 'threshold'"),
    (lambda h: hd.get_decoder("darts", h, lambda_=1), ValueError, r"unknown parameter\(s\) 'lambda_'.*accepted: lam"),
    (lambda h: hd.get_decoder("nope", h), ValueError, "Unknown decoder 'nope'; available:"),
    (lambda h: hd.get_decoder("optimal", h, metric=NoDecoderHamming(h)), ValueError,
     "`hamming_no_decoder` has no Bayes-optimal decoder"),
    (lambda h: hd.get_decoder("optimal", h, metric="hf_beta", beta=-1), ValueError, "`beta`"),
    (lambda h: hd.get_decoder("majority", PARENTS), TypeError, "`hierarchy` to be a Hierarchy"),
])
def test_parameter_errors(h, build, exc, match):
    with pytest.raises(exc, match=match):
        build(h)


class NoDecoderHamming(hd.metrics.Hamming):
    """A metric declared without an exact decoder (every built-in metric has one)."""

    name = "hamming_no_decoder"
    has_decoder = False


def test_decode_of_a_metric_without_decoder_is_not_implemented(h, P):
    # The class says so (has_decoder) and decode raises NotImplementedError.
    assert all(hd.has_optimal_decoder(name) for name in hd.list_metrics())
    assert hd.has_optimal_decoder("jaccard") and not hd.has_optimal_decoder(NoDecoderHamming)
    with pytest.raises(NotImplementedError, match="`hamming_no_decoder` has no Bayes-optimal decoder"):
        NoDecoderHamming(h).decode(P)


def test_chunk_size_and_global_settings(h, P):
    m = hd.get_metric("hf_beta", h)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="`chunk_size` to be a positive int"):
            m.decode(P, chunk_size=bad)
    with pytest.raises(TypeError, match="`chunk_size`"):
        m.decode(P, chunk_size="2")
    assert torch.equal(m.decode(P, chunk_size=np.int64(1)), m.decode(P))
    for bad in (0, -5, 1.5, "1", True):
        with pytest.raises(ValueError, match="`num_bytes` to be a positive int"):
            hd.set_memory_budget(bad)
    budget = hd.get_memory_budget()
    try:
        hd.set_memory_budget(1 << 20)
        assert hd.get_memory_budget() == 1 << 20
        hd.set_memory_budget(None)  # back to the default
        assert hd.get_memory_budget() == 512 * 2**20
    finally:
        hd.set_memory_budget(budget)
    for bad in ("numba", None, 3):
        with pytest.raises(ValueError, match="`name` to be 'torch' or 'scatter'"):
            hd.set_backend(bad)
    if not hd.kernels.scatter_available():
        with pytest.raises(ValueError, match="pip install"):
            hd.set_backend("scatter")
    assert hd.get_backend() == "torch"


def test_node_probabilities_needs_a_hierarchy(P):
    with pytest.raises(TypeError, match="`h` to be a Hierarchy, but got list"):
        hd.node_probabilities(PARENTS, P)


def test_posterior_errors(h, P):
    with pytest.raises(TypeError, match="`hierarchy` to be a Hierarchy, but got NoneType"):
        hd.Posterior(None, P)
    post = hd.Posterior(h, P)
    with pytest.raises(TypeError, match="already a Posterior"):
        hd.Posterior(h, post)
    other = Hierarchy.from_parents([2, 2, -1])
    with pytest.raises(ValueError, match="Posterior of .* different tree"):
        hd.get_metric("wu_palmer", other).decode(post)
    with pytest.raises(ValueError, match="different tree"):
        hd.get_decoder("majority", other).decode(post)
    # an identical tree (e.g. unpickled, or rebuilt) is accepted
    same = Hierarchy.from_parents(PARENTS)
    assert torch.equal(hd.get_metric("wu_palmer", same).decode(post), hd.get_metric("wu_palmer", h).decode(P))


def test_calibrate_darts_errors(h, P):
    y = torch.tensor([0, 2])
    with pytest.raises(TypeError, match="`hierarchy` to be a Hierarchy"):
        hd.calibrate_darts(None, P, y, 0.5)
    with pytest.raises(TypeError, match="`target_accuracy` to be a real number, but got str"):
        hd.calibrate_darts(h, P, y, "high")
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"`target_accuracy` to be a float in \[0, 1\]"):
            hd.calibrate_darts(h, P, y, bad)
    with pytest.raises(ValueError, match=r"`targets` to have shape \(2,\) \(one label per sample\), but got \(3,\)"):
        hd.calibrate_darts(h, P, torch.tensor([0, 1, 2]), 0.5)
    with pytest.raises(ValueError, match=r"`targets` in 0..4 \(leaf ids\), but got 7"):
        hd.calibrate_darts(h, P, torch.tensor([0, 7]), 0.5)
    with pytest.raises(TypeError, match="`targets` to hold integer class indices"):
        hd.calibrate_darts(h, P, torch.tensor([0.0, 1.0]), 0.5)
    with pytest.raises(ValueError, match=r"`max_iter` to be a positive int"):
        hd.calibrate_darts(h, P, y, 0.5, max_iter=0)
    assert hd.calibrate_darts(h, P, y, np.float64(0.0)) == 0.0
    assert hd.calibrate_darts(h, P, y, torch.tensor(0.0)) == 0.0
    assert math.isfinite(hd.calibrate_darts(h, P, y, 1.0))
