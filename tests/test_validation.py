"""Input checks and conversions (``core/validation.py``) at every entry point: bad input gets a clear
error, never a wrong answer (the audit is docs/validation.md).

Every message names the argument, says what was expected and what was found, and, where there is
one, the fix.  Validation is one fused check with a single host sync, and ``validate=False`` skips
it.  The input convention: probabilities unless told otherwise, a warning for probabilities handed
over as logits, ``from_logits="auto"`` deciding only what it can tell apart, ``normalize=True``;
row-sum tolerances that follow the arithmetic.  The tree's own construction errors are in
test_hierarchy.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import warnings

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import Hierarchy, Posterior
import hdecode_torch.core.row_checks as row_checks
from hdecode_torch.core.validation import ROW_SUM_TOLERANCE, prepare_leaf_probs, row_sum_tolerance
from harness import bundled, heuristic_cases, metric_cases, model_like

PARENTS = [5, 5, 6, 6, 6, 7, 7, -1]  # leaves 0..4, internal 5, 6, root 7
L, N = 5, 8


@pytest.fixture(scope="module")
def h():
    return Hierarchy.from_parents(PARENTS)


@pytest.fixture(scope="module")
def P():
    return torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2], [0.5, 0.0, 0.25, 0.25, 0.0]], dtype=torch.float64)


@pytest.fixture(scope="module")
def tiered():
    return bundled("tieredimagenet-h")[0]


@pytest.fixture(scope="module")
def probs(tiered):
    return torch.as_tensor(model_like(np.random.default_rng(0), tiered, 64, "confused"), dtype=torch.float32)


@pytest.fixture(scope="module")
def inat():
    return bundled("inat19")[0]


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


def test_normalize_and_logits():
    h, _ = bundled("inat19")
    x = torch.rand(3, h.num_leaves, dtype=torch.float64)
    p = hd.node_probabilities(h, x, normalize=True)
    torch.testing.assert_close(p[:, h.root], torch.ones(3, dtype=torch.float64))
    q = hd.node_probabilities(h, x, from_logits=True)
    torch.testing.assert_close(q, hd.node_probabilities(h, torch.softmax(x, 1)))


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


# --------------------------------------------------------------------------- one input convention
def test_every_entry_point_takes_probabilities_by_default(tiered, probs):
    want = hd.get_metric("wu_palmer", tiered).decode(probs)
    assert torch.equal(hd.DecodingHead(tiered, "wu_palmer")(probs), want)
    metric = hd.HierarchicalMetric(tiered, "wu_palmer")
    metric.update(probs, want.clamp(max=tiered.num_leaves - 1))
    assert torch.equal(hd.get_decoder("optimal", tiered, metric="wu_palmer").decode(probs), want)


@pytest.mark.parametrize("name", ["wu_palmer", "hf_beta", "tree_distance"])
def test_probabilities_given_as_logits_warn_and_auto_decides(tiered, probs, name):
    """A softmax of probabilities changed 823–959 predictions in 1,000 without a word."""
    right = hd.DecodingHead(tiered, name)(probs)
    with pytest.warns(UserWarning, match="looks like probabilities.*from_logits=True"):
        hd.DecodingHead(tiered, name, from_logits=True)(probs)
    with pytest.warns(UserWarning, match="looks like probabilities"):
        hd.HierarchicalMetric(tiered, name, from_logits=True).update(probs.clone(), torch.zeros(64, dtype=torch.long))
    logits = probs.log()
    auto = hd.DecodingHead(tiered, name, from_logits="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither input warns in auto mode
        assert torch.equal(auto(probs), right)
        assert torch.equal(auto(logits), hd.DecodingHead(tiered, name, from_logits=True)(logits))


def test_auto_refuses_what_it_cannot_tell_apart(tiered):
    x = torch.full((2, tiered.num_leaves), 0.5 / tiered.num_leaves)  # in [0, 1], sums to 1/2
    with pytest.raises(ValueError, match="Cannot tell whether .* probabilities or logits.*normalize=True"):
        hd.node_probabilities(tiered, x, from_logits="auto")
    with pytest.raises(ValueError, match="`from_logits` to be False .*, True .* or 'auto'"):
        hd.node_probabilities(tiered, x, from_logits="yes")
    with pytest.raises(ValueError, match="`from_logits`"):
        hd.DecodingHead(tiered, "accuracy", from_logits="logits")
    masked = torch.randn(2, tiered.num_leaves)
    masked[:, 5:] = float("-inf")  # masked classes are logits
    torch.testing.assert_close(hd.node_probabilities(tiered, masked, from_logits="auto")[:, : tiered.num_leaves],
                               torch.softmax(masked, 1))


def test_a_refilled_buffer_is_not_a_stale_posterior(tiered):
    """Inference tensors have no version counter: reuse keyed on identity would return the first batch."""
    rng = np.random.default_rng(1)
    b1, b2 = (torch.as_tensor(model_like(rng, tiered, 32, k), dtype=torch.float32) for k in ("peaked", "diffuse"))
    t1, t2 = torch.randint(0, tiered.num_leaves, (32,)), torch.randint(0, tiered.num_leaves, (32,))
    fresh = hd.HierarchicalMetric(tiered, "wu_palmer")
    fresh.update(b1, t1)
    fresh.update(b2, t2)
    with torch.inference_mode():
        buf = torch.empty_like(b1)
        m = hd.HierarchicalMetric(tiered, "wu_palmer")
        buf.copy_(b1)
        m.update(buf, t1)
        buf.copy_(b2)
        m.update(buf, t2)
        assert float(m.compute()) == float(fresh.compute())


# --------------------------------------------------------------------------- from_logits and normalize
def _logits(h, b=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h.num_leaves, generator=g, dtype=dtype) * 3


def _probs(h, b=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, h.num_leaves, generator=g, dtype=torch.float64) * 3, 1)


@pytest.mark.parametrize("name,params", metric_cases(decodable=True, full=False))
def test_metric_decode_and_expected_take_from_logits_and_normalize(tiered, name, params):
    """Issue 24: docs/validation.md lists `from_logits` for metrics and decoders, but `decode` and `expected`
    raised "unexpected keyword"."""
    m = hd.get_metric(name, tiered, **params)
    z = _logits(tiered)
    p = torch.softmax(z, 1)
    want = m.decode(p)
    assert torch.equal(m.decode(z, from_logits=True), want)
    assert torch.equal(m.decode(z, from_logits="auto"), want)
    assert torch.equal(m.decode(p, from_logits="auto"), want)
    assert torch.equal(m.decode(p, from_logits=False), want)
    assert torch.equal(m.decode(p * 7, normalize=True), m.decode(p * 7 / (p * 7).sum(1, keepdim=True)))
    assert torch.equal(m.decode(z[0], from_logits=True), want[0])  # unbatched
    e = m.expected(p, want)
    torch.testing.assert_close(m.expected(z, want, from_logits=True), e)
    torch.testing.assert_close(m.expected(z, want, from_logits="auto"), e)
    torch.testing.assert_close(m.expected(p * 3, want, normalize=True), e)
    # the optimal decoder of the metric forwards them
    dec = hd.get_decoder("optimal", tiered, metric=m)
    assert torch.equal(dec.decode(z, from_logits=True), want)


@pytest.mark.parametrize("name,params", heuristic_cases(full=False))
def test_heuristic_decode_takes_from_logits_and_normalize(tiered, name, params):
    dec = hd.get_decoder(name, tiered, **params)
    z = _logits(tiered, seed=1)
    p = torch.softmax(z, 1)
    want = dec.decode(p)
    assert torch.equal(dec.decode(z, from_logits=True), want)
    assert torch.equal(dec.decode(z, from_logits="auto"), want)
    assert torch.equal(dec.decode(p * 2, normalize=True), dec.decode(p * 2 / (p * 2).sum(1, keepdim=True)))


def test_conversion_errors_name_the_input(tiered):
    m = hd.get_metric("wu_palmer", tiered)
    p = torch.softmax(_logits(tiered), 1)
    with pytest.raises(ValueError, match="Expected `from_logits` to be False .*, True .* or 'auto', but got 'yes'"):
        m.decode(p, from_logits="yes")
    with pytest.raises(ValueError, match="Cannot tell whether `leaf_probs` holds probabilities or logits"):
        m.decode(torch.full_like(p, 0.5), from_logits="auto")
    with pytest.raises(ValueError, match="normalize=True is for unnormalised probabilities"):
        m.expected(_logits(tiered), m.decode(p), from_logits="auto", normalize=True)
    with pytest.raises(ValueError, match="sum to 1"):
        m.expected(p * 2, m.decode(p))  # not normalized: refused, as before
    with pytest.warns(UserWarning, match="looks like probabilities"):
        m.decode(p, from_logits=True)  # a softmax of probabilities: warned, as everywhere


def test_a_posterior_is_converted_already(tiered):
    """A Posterior holds probabilities: from_logits / normalize given with one are an error, not ignored."""
    z = _logits(tiered)
    post = Posterior(tiered, z, from_logits=True)
    m = hd.get_metric("zhao", tiered)
    dec = hd.get_decoder("darts", tiered, lam=0.5)
    want = m.decode(torch.softmax(z, 1))
    assert torch.equal(m.decode(post), want) and torch.equal(m.decode(post, from_logits=False), want)
    for call in (lambda **kw: m.decode(post, **kw), lambda **kw: dec.decode(post, **kw),
                 lambda **kw: m.expected(post, want, **kw),
                 lambda **kw: hd.get_decoder("optimal", tiered, metric=m).decode(post, **kw)):
        for kw in ({"from_logits": True}, {"from_logits": "auto"}, {"normalize": True}):
            with pytest.raises(ValueError, match=f"`leaf_probs` is a Posterior, whose probabilities are converted "
                                                 f"already: {next(iter(kw))}="):
                call(**kw)
        with pytest.raises(ValueError, match="Expected `from_logits`"):
            call(from_logits=2)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_decode_with_logits_reads_the_host_once(tiered, plan, monkeypatch):
    """The one-host-read design holds with the conversions: the deferred check of the logits (or of the
    "auto" decision) is read with the decision, as that of probabilities is."""
    z = _logits(tiered, b=32, seed=3).float()
    with hd.plan_for(plan):
        for name in ("tree_distance", "hamming"):
            m = hd.get_metric(name, tiered)
            m.decode(z, from_logits=True)  # tree tables built
            for kind in (True, "auto"):
                assert _host_reads(monkeypatch, lambda: m.decode(z, from_logits=kind)) == 1, (name, kind)


def test_auto_refuses_probabilities_with_a_tiny_negative_entry(inat):
    """Used to be read as logits and softmaxed (node probabilities off by up to 0.56)."""
    p = _probs(inat)
    p[2, 7] = -1e-12
    with pytest.raises(ValueError, match=r"Cannot tell whether `leaf_probs` holds probabilities or logits: row 2 has "
                                         r"a negative entry"):
        hd.node_probabilities(inat, p, from_logits="auto")
    with pytest.raises(ValueError, match="negative entry"):
        hd.get_metric("tree_distance", inat).decode(p)  # probabilities: refused too, as before
    # a clear case of each kind is decided
    logits = torch.randn(4, inat.num_leaves, dtype=torch.float64)
    torch.testing.assert_close(hd.node_probabilities(inat, logits, from_logits="auto"),
                               hd.node_probabilities(inat, logits, from_logits=True))
    torch.testing.assert_close(hd.node_probabilities(inat, _probs(inat), from_logits="auto"),
                               hd.node_probabilities(inat, _probs(inat)))


def test_auto_refuses_values_in_the_unit_interval_that_are_not_distributions(inat):
    x = torch.full((3, inat.num_leaves), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"entries are in \[0\.5, 0\.5\] but row 0 sums to 505"):
        hd.node_probabilities(inat, x, from_logits="auto")
    # just past the margin it is logits
    x[1, 3] = 1.01
    torch.testing.assert_close(hd.node_probabilities(inat, x, from_logits="auto"),
                               hd.node_probabilities(inat, x, from_logits=True))


def test_auto_with_normalize_normalizes_counts_and_refuses_negatives(inat):
    counts = torch.randint(0, 5, (4, inat.num_leaves)).double()
    counts[:, 0] += 1  # no zero row
    want = hd.node_probabilities(inat, counts, normalize=True)
    torch.testing.assert_close(hd.node_probabilities(inat, counts, from_logits="auto", normalize=True), want)
    logits = torch.randn(4, inat.num_leaves, dtype=torch.float64)
    with pytest.raises(ValueError, match="normalize=True is for unnormalised probabilities, but `leaf_probs` has "
                                         "negative entries"):
        hd.node_probabilities(inat, logits, from_logits="auto", normalize=True)


def _host_reads(monkeypatch, fn) -> int:
    """Tensor -> Python conversions during ``fn()`` (each a device-to-host read on a GPU)."""
    calls = []
    with monkeypatch.context() as m:
        for attr in ("tolist", "item", "__bool__", "__int__", "__float__"):
            def wrapper(self, *a, _orig=getattr(torch.Tensor, attr), **k):
                calls.append(1)
                return _orig(self, *a, **k)
            m.setattr(torch.Tensor, attr, wrapper)
        fn()
    return len(calls)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_deferred_check_reads_once_and_raises_the_same_error(inat, plan, monkeypatch):
    """A decoder's input check is read with the decoder's own host read (one in all on the GPU plan),
    and bad input still raises the check's own error, not whatever the decoder did with the bad values."""
    from hdecode_torch.kernels import native

    p = _probs(inat, 32).float()
    # The GPU plan's reads are what a GPU pays: on CPU tensors its native kernels (hF_β's decoder, read-free) would
    # run instead, so that plan is checked on its torch path.
    with hd.plan_for(plan), native.use_native(plan == "cpu"):
        for name, kw in [("tree_distance", {}), ("hf_beta", {"beta": 2.0}), ("wu_palmer", {}), ("hamming", {})]:
            m = hd.get_metric(name, inat, **kw)
            m.decode(p)
            checked = _host_reads(monkeypatch, lambda: m.decode(p))
            unchecked = _host_reads(monkeypatch, lambda: m.decode(p, validate=False))
            if plan == "cuda" or name in ("tree_distance", "hamming"):
                assert checked == 1, name
            # the check rides on the decoder's own read where it has one (hF_β's candidate count)
            assert unchecked == checked - (0 if (plan == "cuda" and name == "hf_beta") else 1), name
            bad = p.clone()
            bad[5, 3] = float("nan")
            with pytest.raises(ValueError, match="row 5 contains NaN"):
                m.decode(bad)
            bad[5, 3] = -0.5
            with pytest.raises(ValueError, match="row 5 has a negative entry"):
                m.decode(bad)


def test_from_logits_values_and_normalize_with_logits(inat):
    """0 and 1 are False and True; other values are refused naming `from_logits`; normalize=True changes
    nothing for logits (the softmax sums to 1), for every converting entry point."""
    z, p = _logits(inat, seed=1), _probs(inat)
    m, d = hd.get_metric("wu_palmer", inat), hd.get_decoder("majority", inat)
    soft = torch.softmax(z, 1)
    assert torch.equal(hd.node_probabilities(inat, z, from_logits=1), hd.node_probabilities(inat, soft))
    assert torch.equal(hd.node_probabilities(inat, p, from_logits=0), hd.node_probabilities(inat, p))
    for kind in ("yes", None, 2, "Auto"):
        with pytest.raises(ValueError, match="Expected `from_logits` to be False"):
            m.decode(z, from_logits=kind)
    assert torch.equal(hd.node_probabilities(inat, z, from_logits=True, normalize=True),
                       hd.node_probabilities(inat, z, from_logits=True))
    assert torch.equal(m.decode(z, from_logits=True, normalize=True), m.decode(soft))
    assert torch.equal(d.decode(z, from_logits=True, normalize=True), d.decode(soft))
    pred = m.decode(soft)
    assert torch.equal(m.expected(z, pred, from_logits=True, normalize=True), m.expected(soft, pred))


def test_head_and_metric_take_no_normalize(inat):
    """DecodingHead and HierarchicalMetric convert with from_logits only: `normalize=` is an unknown
    metric parameter, refused by name, not ignored."""
    for make in (lambda: hd.DecodingHead(inat, "wu_palmer", normalize=True),
                 lambda: hd.HierarchicalMetric(inat, "wu_palmer", normalize=True)):
        with pytest.raises(ValueError, match="unknown parameter\\(s\\) 'normalize'"):
            make()
    z = _logits(inat, seed=1)
    head = hd.DecodingHead(inat, "wu_palmer", from_logits="auto")
    assert torch.equal(head(z), hd.get_metric("wu_palmer", inat).decode(z, from_logits=True))
    metric = hd.HierarchicalMetric(inat, "wu_palmer", from_logits="auto")
    target = torch.arange(z.shape[0])
    metric.update(z[0], target[0])  # one (L,) row with a () target
    metric.update(z[1:], target[1:])
    want = hd.get_metric("wu_palmer", inat)
    got = metric.compute()
    assert got.dtype == z.dtype  # the mean comes back in the scores' dtype
    torch.testing.assert_close(got, want(want.decode(z, from_logits=True), target).mean().to(z.dtype))


@pytest.mark.parametrize("key, from_logits", [("logits", True), ("logit", True), ("scores", True), ("probs", False),
                                              ("probabilities", False), ("prob", False), ("leaf_probs", False),
                                              ("out", None)])
@pytest.mark.skipif(not any(importlib.util.find_spec(m) for m in ("lightning", "pytorch_lightning")),
                    reason="needs lightning")
def test_callback_reads_the_input_kind_from_its_output_key(inat, key, from_logits):
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    if from_logits is None:
        with pytest.raises(ValueError, match=f"Cannot tell whether `output_key='{key}'` holds logits"):
            HierarchicalMetricsCallback(inat, metrics=["wu_palmer"], output_key=key)
        return
    cb = HierarchicalMetricsCallback(inat, metrics=["wu_palmer"], output_key=key)
    assert [m.from_logits for m in cb.metrics.values()] == [from_logits]


def test_calibrate_darts_decides_auto_as_the_explicit_kind(inat):
    z, p = _logits(inat, 40, seed=1), _probs(inat, 40)
    target = torch.randint(0, inat.num_leaves, (40,), generator=torch.Generator().manual_seed(2))
    assert hd.calibrate_darts(inat, z, target, 0.3, from_logits="auto") == \
        hd.calibrate_darts(inat, z, target, 0.3, from_logits=True)
    assert hd.calibrate_darts(inat, p, target, 0.3, from_logits="auto") == hd.calibrate_darts(inat, p, target, 0.3)


# --------------------------------------------------------------------------- framework outputs
@pytest.mark.parametrize("num_classes", [1000, 100_000, 2_000_000])
def test_a_float32_softmax_of_any_width_is_accepted(num_classes):
    """On the CPU a float32 softmax over 2M classes sums to 1 ± 6e-4; a fixed 1e-4 rejected it."""
    g = torch.Generator().manual_seed(num_classes)
    logits = torch.randn(3, num_classes, generator=g) * 3
    logits[0, 0] += 40  # one peaked row
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            p = torch.softmax(logits, 1)
        finally:
            torch.set_num_threads(1)
        prepare_leaf_probs(p, num_classes)  # no error
        assert float((p.double().sum(1) - 1).abs().max()) <= row_sum_tolerance(torch.float32, num_classes)
    bad = p.clone()
    bad[1] *= 1.02  # a row off by 2%
    with pytest.raises(ValueError, match="sum to 1"):
        prepare_leaf_probs(bad, num_classes)


def test_row_sum_tolerance_rule():
    assert row_sum_tolerance(torch.float32, 1) == hd.ROW_SUM_TOLERANCE[torch.float32]
    tol = [row_sum_tolerance(torch.float32, n) for n in (10, 10**3, 10**5, 10**6, 10**7)]
    assert tol == sorted(tol) and tol[-1] < 0.02  # grows with L, still rejects a 2% error at 10M classes
    assert row_sum_tolerance(torch.float64, 10**7) < 1e-5
    assert row_sum_tolerance(torch.float16, 1000) < 0.01
