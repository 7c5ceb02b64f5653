"""hdecode_torch.functional: every registered metric and decoder as plain functions, equal to the class methods."""

from __future__ import annotations

import importlib
import inspect
import pydoc
import subprocess
import sys

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import functional as F
from harness import FLOAT_DTYPES, bundled, heuristic_cases, metric_cases, model_like
from test_registration import registered  # noqa: F401  (the fixture: depth_gap and second_leaf registered)

TREES = ["tieredimagenet-h", "inat19"]


def _batch(tree, dtype, seed=0, B=8):
    """(h, probs (B, L) in dtype, targets (B,), random node ids (B,), random bool node sets (B, N))."""
    h, _ = bundled(tree)
    rng = np.random.default_rng(seed)
    probs = torch.as_tensor(model_like(rng, h, B, "confused")).to(dtype)
    y = torch.as_tensor(rng.integers(0, h.num_leaves, B))
    ids = torch.as_tensor(rng.integers(0, h.num_nodes, B))
    sets = torch.as_tensor(rng.random((B, h.num_nodes)) < 0.01)
    return h, probs, y, ids, sets


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _within(h, y):
    """(B,) node ids to decode within: each target's grandparent (the root for shallow targets), so the answer
    is known to lie two levels above the target."""
    return h.parent_or_root[h.parent_or_root[y]]  # a class index is its leaf's node id


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("name,params", metric_cases())
def test_metric_functions_equal_the_class_methods(name, params, tree, dtype):
    h, probs, y, ids, sets = _batch(tree, dtype, seed=len(name))
    m = hd.get_metric(name, h, **params)
    value, expected, decode = getattr(F, name), getattr(F, f"expected_{name}"), getattr(F, f"decode_{name}")
    # decoded predictions: scored as they are, in torch's default dtype unless asked
    preds = [ids, m.decode(probs)] + ([sets] if m.kind == "set" else [])
    for pred in preds:
        assert _same(value(pred, y, h, **params), m(pred, y))
        assert value(pred, y, h, **params).dtype == torch.float32
        assert _same(value(pred, y, h, dtype=dtype, **params), m(pred, y, dtype=dtype))
        assert _same(F.value(name, pred, y, h, **params), m(pred, y))
        assert _same(expected(probs, pred, h, **params), m.expected(probs, pred))
        assert _same(F.expected(name, probs, pred, h, **params), m.expected(probs, pred))
        assert expected(probs, pred, h, **params).dtype == dtype
    assert _same(decode(probs, h, **params), m.decode(probs))
    assert _same(F.decode(name, probs, h, **params), m.decode(probs))
    assert _same(decode(probs[0], h, **params), m.decode(probs[0]))  # unbatched
    within = _within(h, y)
    assert _same(decode(probs, h, within=within, **params), m.decode(probs, within=within))
    assert _same(F.decode(name, probs, h, within=within, **params), m.decode(probs, within=within))
    # scores: decoded by the metric's own decoder, then scored; values in the scores' dtype
    exact = m(m.decode(probs), y, dtype=torch.float64)
    assert _same(value(probs, y, h, **params), exact.to(dtype))
    assert _same(value(probs, y, h, reduction="mean", **params),
                 (torch.sort(exact).values.sum() / exact.numel()).to(dtype))
    # the torchmetrics class computes through the same steps: its mean is the function's, bit for bit
    pytest.importorskip("torchmetrics")
    tm = hd.HierarchicalMetric(h, name, **params)
    tm.update(probs, y)
    assert _same(tm.compute(), value(probs, y, h, reduction="mean", **params))
    tm = hd.HierarchicalMetric(h, name, **params)
    tm.update(ids, y)
    assert _same(tm.compute(), value(ids, y, h, reduction="mean", **params))


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("name,params", heuristic_cases())
def test_decoder_functions_equal_the_classes(name, params, tree):
    h, probs, y, _, _ = _batch(tree, torch.float32, seed=len(name))
    d = hd.get_decoder(name, h, **params)
    want = d.decode(probs)
    assert _same(getattr(F, f"decode_{name}")(probs, h, **params), want)
    assert _same(F.decode_with(name, probs, h, **params), want)
    assert _same(getattr(F, f"decode_{name}")(probs.double(), h, **params), d.decode(probs.double()))
    within = _within(h, y)
    if name != "information_threshold":  # its threshold may exceed what a subtree offers (a ValueError)
        inside = d.decode(probs, within=within)
        assert _same(getattr(F, f"decode_{name}")(probs, h, within=within, **params), inside)
        assert _same(F.decode_with(name, probs, h, within=within, **params), inside)
    # a heuristic's predictions scored by a metric function: decoder= or decoding first give the same
    wp = hd.get_metric("wu_palmer", h)
    assert _same(F.wu_palmer(probs, y, h, decoder=d), wp(want, y))
    assert _same(F.value("wu_palmer", probs, y, h, decoder=(name, params)), wp(want, y))


def test_decode_with_takes_optimal_specs():
    h, probs, _, _, _ = _batch("inat19", torch.float64)
    want = F.decode_hf_beta(probs, h, beta=0.5)
    assert torch.equal(F.decode_with("optimal:hf_beta[beta=0.5]", probs, h), want)
    assert torch.equal(F.decode_with("optimal", probs, h, metric="hf_beta", beta=0.5), want)
    assert torch.equal(F.decode("hf_beta[beta=0.5]", probs, h), want)


def test_names_signatures_and_docstrings():
    metrics = hd.list_metrics()
    heuristics = [d for d in hd.list_decoders() if d != "optimal"]
    named = {n for m in metrics for n in (m, f"expected_{m}", f"decode_{m}")} | {f"decode_{d}" for d in heuristics}
    calibration = {"node_calibration_error", "node_reliability", "NodeReliability",
                   "node_calibration_check", "NodeCalibrationCheck"}
    assert set(F.__all__) == named | {"value", "expected", "decode", "decode_with"} | calibration
    assert not {f"decode_{m}" for m in metrics} & {f"decode_{d}" for d in heuristics}  # one function per name
    for name in metrics:
        cls = hd.metrics.metric_class(name)
        for fn, leading in ((getattr(F, name), ["preds", "target", "hierarchy"]),
                            (getattr(F, f"expected_{name}"), ["leaf_probs", "preds", "hierarchy"]),
                            (getattr(F, f"decode_{name}"), ["leaf_probs", "hierarchy"])):
            sig = inspect.signature(fn)
            params = list(sig.parameters.values())
            assert [p.name for p in params[: len(leading)]] == leading, fn.__name__
            declared = {p.name: p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
            for p in cls.PARAMS:  # the metric's parameters, keyword-only, with their defaults and types
                assert declared[p.name].default == p.default and declared[p.name].annotation is p.type, fn.__name__
                assert f"{p.name}: {p.doc}" in fn.__doc__, fn.__name__
            assert f'get_metric("{name}", hierarchy' in fn.__doc__ and cls.__qualname__ in fn.__doc__
            assert fn.__name__ in pydoc.render_doc(fn)
    sig = inspect.signature(F.decode_information_threshold)
    assert sig.parameters["threshold"].default is inspect.Parameter.empty  # required, as declared
    assert "beta: float = 1.0" in pydoc.render_doc(F.hf_beta)  # what help() shows
    assert 'get_decoder("darts", hierarchy, lam=lam)' in F.decode_darts.__doc__


# --------------------------------------------------------------------------- written out, and kept so
def _builtin_functions():
    """(function name, its class, which function) of every built-in metric and heuristic decoder (those a test
    registers are left to the generator)."""
    out = []
    for name in hd.list_metrics():
        cls = hd.metrics.metric_class(name)
        if cls.__module__.startswith("hdecode_torch."):
            out += [(name, cls, "value"), (f"expected_{name}", cls, "expected")]
            out += [(f"decode_{name}", cls, "decode")] if cls.has_decoder else []
    decoders = [hd.decoders.DECODERS.get_class(d) for d in hd.list_decoders() if d != "optimal"]
    return out + [(f"decode_{cls.name}", cls, "decoder") for cls in decoders
                  if cls.__module__.startswith("hdecode_torch.")]


def _generated(cls, which):
    """The function the generator (kept for what a user registers later) makes of ``cls``: the reference the
    written-out ones must not drift from."""
    from hdecode_torch.functional import _generated as gen

    return gen.decoder_function(cls) if which == "decoder" else gen.metric_functions(cls)[
        {"value": cls.name, "expected": f"expected_{cls.name}", "decode": f"decode_{cls.name}"}[which]]


@pytest.mark.parametrize("fname,cls,which", _builtin_functions(), ids=lambda x: x if isinstance(x, str) else "")
def test_written_out_functions_match_their_class(fname, cls, which):
    """Every built-in function is a plain ``def`` of that name in its concept's module, whose signature is
    the one its class's ``PARAMS`` give (names, kinds, defaults and types: the class's parameters keyword-only,
    then the function's own keywords, as the generator makes them), documented with shapes and an example."""
    fn = getattr(F, fname)
    module = importlib.import_module(fn.__module__)
    assert fn.__module__.startswith("hdecode_torch.functional._") and getattr(module, fname) is fn
    assert inspect.isfunction(fn) and fn.__name__ == fname and inspect.getsource(fn).startswith(f"def {fname}(")
    assert fname in module.__all__ and fname in F.__all__
    want = inspect.signature(_generated(cls, which))
    got = inspect.signature(fn)
    assert [(p.name, p.kind, p.default, p.annotation) for p in got.parameters.values()] == \
        [(p.name, p.kind, p.default, p.annotation) for p in want.parameters.values()]
    assert got == want
    assert "Example:" in fn.__doc__ and f"F.{fname}(" in fn.__doc__ and "Returns:" in fn.__doc__
    for p in cls.PARAMS:
        assert f"{p.name}: {p.doc}" in fn.__doc__


def _small():
    """The docstrings' tree (leaves 0-3, 0 and 1 under node 4, root 5) and a batch on it."""
    h = hd.Hierarchy.from_parents([4, 4, 5, 5, 5, -1])
    probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.25] * 4])
    return h, probs, torch.tensor([0, 2, 3, 1]), torch.tensor([4, 0, 5, 3])


@pytest.mark.parametrize("fname,cls,which", _builtin_functions(), ids=lambda x: x if isinstance(x, str) else "")
def test_written_out_functions_equal_their_class_and_generated_form(fname, cls, which):
    """On a small tree, every built-in function returns what its class's method returns, bit for bit, and what
    the generated form of the same class returns; a bad parameter and a bad input raise the same errors."""
    h, probs, y, ids = _small()
    fn, gen = getattr(F, fname), _generated(cls, which)
    params = {p.name: p.default for p in cls.PARAMS}
    if "threshold" in params:  # required: no default
        params["threshold"] = 0.5
    component = cls(h, **params)
    if which == "value":
        calls = [((ids, y, h), component(ids, y)), ((probs, y, h), component(component.decode(probs), y))]
    elif which == "expected":
        calls = [((probs, ids, h), component.expected(probs, ids))]
    else:
        calls = [((probs, h), component.decode(probs)), ((probs[0], h), component.decode(probs[0]))]
    for args, want in calls:
        assert _same(fn(*args, **params), want) and _same(gen(*args, **params), want), fname
    for p in cls.PARAMS:  # a wrong type of parameter: the class's check, in the same words
        bad = {**params, p.name: "x" if p.type is not str else 1.5}
        with pytest.raises(Exception) as written:
            fn(*calls[0][0], **bad)
        with pytest.raises(Exception) as generated:
            gen(*calls[0][0], **bad)
        assert type(written.value) is type(generated.value) and str(written.value) == str(generated.value)
    first = (calls[0][0][0] * 2 if which != "value" else ids + h.num_nodes,) + calls[0][0][1:]
    with pytest.raises(ValueError) as written:
        fn(*first, **params)
    with pytest.raises(ValueError) as generated:
        gen(*first, **params)
    assert str(written.value) == str(generated.value)
    with pytest.raises(TypeError, match="`hierarchy`"):
        fn(*calls[0][0][:-1], "tree", **params)


def test_docstring_examples_run_and_show_what_they_return():
    """The ``Example:`` of every written-out function runs and prints what its docstring shows."""
    import doctest

    modules = sorted({getattr(F, fname).__module__ for fname, _, _ in _builtin_functions()})
    assert len(modules) == 9
    for name in modules:
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted > 0, name


def test_reductions_dtypes_and_batch_order():
    h, probs, y, ids, _ = _batch("tieredimagenet-h", torch.float32, B=64)
    exact = hd.get_metric("zhao", h)(ids, y, dtype=torch.float64)
    mean = F.zhao(ids, y, h, reduction="mean", dtype=torch.float64)
    assert _same(mean, torch.sort(exact).values.sum() / 64)
    assert _same(F.zhao(ids, y, h, reduction="sum"), torch.sort(exact).values.sum().float())
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    assert _same(F.zhao(ids[perm], y[perm], h, reduction="mean"), F.zhao(ids, y, h, reduction="mean"))
    assert F.zhao(probs.half(), y, h).dtype == torch.float32  # the compute dtype of half scores
    assert F.zhao(probs.double(), y, h).dtype == torch.float64
    assert F.zhao(probs, y, h, dtype=torch.float64).dtype == torch.float64
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert _same(F.zhao(ids, y, h), exact)
    finally:
        torch.set_default_dtype(default)
    assert torch.isnan(F.zhao(ids[:0], y[:0], h, reduction="mean"))


def test_logits_and_normalize():
    h, probs, y, ids, _ = _batch("inat19", torch.float64)
    logits = torch.randn(8, h.num_leaves, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    soft = torch.softmax(logits, 1)
    assert torch.equal(F.decode_wu_palmer(logits, h, from_logits=True), F.decode_wu_palmer(soft, h))
    assert torch.equal(F.decode_darts(logits, h, from_logits=True, lam=1.0), F.decode_darts(soft, h, lam=1.0))
    assert torch.equal(F.expected_jaccard(logits, ids, h, from_logits=True), F.expected_jaccard(soft, ids, h))
    assert torch.equal(F.hf_beta(logits, y, h, from_logits=True), F.hf_beta(soft, y, h))
    scaled = probs * 3
    assert torch.equal(F.decode_zhao(scaled, h, normalize=True), F.decode_zhao(scaled / scaled.sum(1, keepdim=True), h))
    with pytest.raises(ValueError, match="sum to 1"):
        F.decode_zhao(probs * 3, h)
    post = hd.Posterior(h, probs)
    assert torch.equal(F.decode_zhao(post, h), F.decode_zhao(probs, h))
    with pytest.raises(ValueError, match="Posterior"):
        F.decode_zhao(post, h, from_logits=True)


def test_errors_name_what_is_wrong():
    h, probs, y, ids, _ = _batch("inat19", torch.float32)
    with pytest.raises(TypeError, match=r"hf_beta\(\) got an unexpected keyword argument 'bta'"):
        F.hf_beta(ids, y, h, bta=1.0)
    with pytest.raises(TypeError, match=r"hf_beta\(\) takes 3 positional arguments but 4 were given"):
        F.hf_beta(ids, y, h, 0.5)  # parameters are keyword-only
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'threshold'"):
        F.decode_information_threshold(probs, h)
    with pytest.raises(ValueError, match="Expected `beta` to be a float > 0, but got -1"):
        F.hf_beta(ids, y, h, beta=-1)
    with pytest.raises(ValueError, match="Bad parameters for metric 'wu_palmer'"):
        F.value("wu_palmer", ids, y, h, beta=2)
    with pytest.raises(ValueError, match="`reduction`"):
        F.zhao(ids, y, h, reduction="average")
    with pytest.raises(TypeError, match="`dtype`"):
        F.zhao(ids, y, h, dtype=torch.int32)
    with pytest.raises(TypeError, match="`hierarchy`"):
        F.zhao(ids, y, "inat19")
    with pytest.raises(ValueError, match="`pred`"):
        F.zhao(ids + h.num_nodes, y, h)
    with pytest.raises(ValueError, match="`target`"):
        F.zhao(probs, y + h.num_leaves, h)
    with pytest.raises(ValueError, match="`preds`.*sum to 1"):
        F.zhao(probs * 2, y, h)
    other = hd.load_hierarchy("tieredimagenet-h")
    with pytest.raises(ValueError, match="on Hierarchy"):
        F.value(hd.get_metric("zhao", other), ids, y, h)
    with pytest.raises(ValueError, match="Unknown metric 'wu_plamer' \\(did you mean 'wu_palmer'\\?\\)"):
        F.value("wu_plamer", ids, y, h)
    with pytest.raises(AttributeError, match="no_such_metric"):
        F.no_such_metric  # noqa: B018
    with pytest.raises(AttributeError):
        F.decode_optimal  # noqa: B018  (decode_<metric> is each metric's optimal decoder)


# --------------------------------------------------------------------------- registered later
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_a_metric_and_a_decoder_registered_later_are_reachable(registered, dtype):  # noqa: F811
    h, probs, y, ids, _ = _batch("inat19", dtype)
    m = hd.get_metric("depth_gap", h, penalty=3.0)
    assert "depth_gap" not in F.__all__ and {"depth_gap", "decode_depth_gap", "decode_second_leaf"} <= set(dir(F))
    assert _same(F.value("depth_gap", ids, y, h, penalty=3.0), m(ids, y))
    assert _same(F.depth_gap(ids, y, h, penalty=3.0), m(ids, y))
    assert _same(F.expected_depth_gap(probs, ids, h, penalty=3.0), m.expected(probs, ids))
    assert _same(F.expected("depth_gap[penalty=3]", probs, ids, h), m.expected(probs, ids))
    assert _same(F.decode_depth_gap(probs, h, penalty=3.0), m.decode(probs))
    second = probs.topk(2, dim=1).indices[:, 1]
    assert _same(F.depth_gap(probs, y, h, penalty=3.0, decoder="second_leaf"),
                 m(second, y, dtype=torch.float64).to(dtype))
    assert _same(F.decode_second_leaf(probs, h), second)
    sig = inspect.signature(F.depth_gap)
    assert sig.parameters["penalty"].default == 2.0 and "penalty: cost of leaving" in F.depth_gap.__doc__
    cls = hd.metrics.metric_class("depth_gap")
    hd.metrics.METRICS.unregister("depth_gap")
    try:
        with pytest.raises(AttributeError):
            F.depth_gap  # noqa: B018
    finally:
        hd.register_metric(cls)


def test_the_generators_old_names_warn_once_and_work():
    """``functional.metric_functions`` and ``functional.decoder_function`` (names of the module when it generated
    every function) still give the generator, with one DeprecationWarning each naming what to use."""
    import warnings

    from hdecode_torch.functional import _generated

    h, probs, y, ids, _ = _batch("inat19", torch.float32)
    F._WARNED.clear()
    for name, use in (("metric_functions", "functional.expected_<metric>"), ("decoder_function", "decode_<decoder>")):
        with pytest.warns(DeprecationWarning, match=f"functional.{name}` is deprecated: register the class.*{use}"):
            got = getattr(F, name)
        assert got is getattr(_generated, name)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert getattr(F, name) is got  # once
    zhao = F.metric_functions(hd.metrics.metric_class("zhao"))["zhao"]
    assert _same(zhao(ids, y, h), F.zhao(ids, y, h))
    darts = F.decoder_function(hd.decoders.DECODERS.get_class("darts"))
    assert _same(darts(probs, h, lam=1.0), F.decode_darts(probs, h, lam=1.0))


def test_functional_loads_lazily_with_the_package():
    assert hd.functional is importlib.import_module("hdecode_torch.functional") and "functional" in dir(hd)
    code = ("import sys, hdecode_torch; "
            "assert 'hdecode_torch.functional' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_readme_block_runs_and_says_what_it_returns():
    """The README's functional block, after the Quickstart: it runs, and each ``# = expr`` comment holds."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    quickstart = next(b for b in blocks if 'hd.load_hierarchy("tieredimagenet-h")' in b)
    block = next(b for b in blocks if "from hdecode_torch import functional as F" in b)
    ns: dict = {}
    exec(compile(quickstart, "README:quickstart", "exec"), ns)
    exec(compile(block, "README:functional", "exec"), ns)
    claims = re.findall(r"^(F\.\S.*?)\s+# = ([^;\n]+)", block, flags=re.M)
    assert len(claims) == 4
    for left, right in claims:
        got, want = eval(left, ns), eval(right, ns)
        assert _same(got, want), left
    assert eval("F.wu_palmer(pred, target, h)", ns).dtype == torch.float32
