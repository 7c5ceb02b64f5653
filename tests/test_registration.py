"""A metric and a decoder of the user's own, registered by name, work everywhere a built-in one does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.core.params import Param
from hdecode_torch.core.validation import check_nonnegative
from harness import bundled, model_like


class DepthGap(hd.metrics.NodeMetric):
    """|d(h) − d(y)| + penalty when h is not an ancestor of y (lower is better): values only, so its
    expected values and its exact decoder come from the dense matrix."""

    name = "depth_gap"
    description = "|d(h) - d(y)| + penalty off the target's root path"
    higher_is_better = False
    PARAMS = (Param("penalty", float, 2.0, check_nonnegative, doc="cost of leaving the target's root path"),)

    def _values(self, h, pred, target):
        from hdecode_torch.kernels.ancestry import is_ancestor

        gap = (h.depth[pred] - h.depth[target]).abs().to(torch.float64)
        return gap + self.penalty * (~is_ancestor(h, pred, target)).to(torch.float64)


class SecondLeaf(hd.decoders.Decoder):
    """The second most probable leaf (a decoder of the user's own)."""

    name = "second_leaf"
    description = "second most probable leaf"

    def _decode_default(self, post):
        return post.probs.topk(2, dim=1).indices[:, 1]


@pytest.fixture
def registered():
    hd.register_metric(DepthGap)
    hd.register_decoder(SecondLeaf)
    yield
    hd.metrics.METRICS.unregister("depth_gap")
    hd.decoders.DECODERS.unregister("second_leaf")


def _oracle(h, probs, penalty):
    """Brute force: the expected value of every node, the best (deepest, then smallest id on ties)."""
    n, l = h.num_nodes, h.num_leaves
    depth = h.depth.numpy()
    anc = h.ancestors.numpy()
    cost = np.zeros((n, l))
    for v in range(n):
        for y in range(l):
            on_path = v in set(anc[y][anc[y] < n].tolist())
            cost[v, y] = abs(depth[v] - depth[y]) + (0 if on_path else penalty)
    risk = probs @ cost.T  # (B, N)
    best = risk.min(1, keepdims=True)
    tied = np.isclose(risk, best, rtol=0, atol=1e-12)
    key = np.where(tied, depth[None, :] * n + (n - 1 - np.arange(n))[None, :], -1)
    return key.argmax(1), risk


def test_registered_metric_and_decoder_by_name(registered):
    h, _ = bundled("inat19")
    rng = np.random.default_rng(0)
    probs = np.concatenate([model_like(rng, h, 8, k) for k in ("peaked", "diffuse", "confused")])
    x = torch.as_tensor(probs)
    m = hd.get_metric("depth_gap[penalty=3]", h)
    assert m.key == "depth_gap[penalty=3]" and "depth_gap" in hd.list_metrics()
    assert hd.has_optimal_decoder("depth_gap")
    want, risk = _oracle(h, probs, 3.0)
    got = m.decode(x)
    assert np.array_equal(got.numpy(), want)
    np.testing.assert_allclose(m.expected(x, got).numpy(), risk[np.arange(len(want)), want], rtol=1e-12)
    with hd.plan_for("cuda"):
        assert torch.equal(m.decode(x), got)
    # the decoder, by name and in a spec
    second = hd.get_decoder("second_leaf", h).decode(x)
    assert torch.equal(second, x.topk(2, dim=1).indices[:, 1])
    # the head
    head = hd.DecodingHead(h, "depth_gap", penalty=3.0)
    assert torch.equal(head(x), got)
    assert torch.equal(hd.DecodingHead(h, "depth_gap", decoder="second_leaf")(x), second)
    # the torchmetrics metric: the mean of the metric's values of the decoder's predictions
    target = torch.as_tensor(rng.integers(0, h.num_leaves, x.shape[0]))
    tm = hd.HierarchicalMetric(h, ("depth_gap", {"penalty": 3.0}), "optimal")
    tm.update(x, target)
    assert tm.name == "depth_gap3_optimal"
    assert tm.compute().dtype == x.dtype  # the scores' dtype, summed in float64
    np.testing.assert_allclose(float(tm.compute()), float(m(got, target, dtype=torch.float64).mean()),
                               rtol=torch.finfo(x.dtype).eps)


def test_registered_names_in_the_lightning_callback(registered):
    pytest.importorskip("lightning")
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    h, _ = bundled("inat19")
    cb = HierarchicalMetricsCallback(h, metrics=["depth_gap", "accuracy"], decoders=["optimal", "second_leaf"],
                                     output_key="probs")
    assert {("depth_gap[penalty=2]", "optimal"), ("depth_gap[penalty=2]", "second_leaf"),
            ("accuracy", "second_leaf")} <= set(cb.metrics)


def test_registration_errors(registered):
    with pytest.raises(ValueError, match="taken"):
        hd.register_metric(type("Other", (DepthGap,), {"name": "depth_gap"}))
    with pytest.raises(TypeError, match="subclass of BaseMetric"):
        hd.register_metric(SecondLeaf)
    with pytest.raises(ValueError, match="identifier"):
        hd.register_decoder(type("Bad", (SecondLeaf,), {"name": "bad name"}))
    with pytest.raises(ValueError, match=r"did you mean 'depth_gap'"):
        hd.get_metric("depth_gp", bundled("inat19")[0])
    replaced = hd.register_metric(type("Again", (DepthGap,), {"name": "depth_gap"}), replace=True)
    assert hd.metrics.metric_class("depth_gap") is replaced


def test_registered_metric_and_decoder_on_the_command_line(tmp_path):
    """`hdecode compare --import MODULE` scores a metric and a decoder the module registers, by name and
    by spec, next to the built-in ones."""
    import json
    import subprocess
    import sys

    (tmp_path / "my_metrics.py").write_text(
        "import torch\n"
        "import hdecode_torch as hd\n"
        "from hdecode_torch.core.params import Param\n\n"
        "@hd.register_metric\n"
        "class DepthGap(hd.metrics.NodeMetric):\n"
        "    name, description, higher_is_better = 'depth_gap', 'depth gap', False\n"
        "    PARAMS = (Param('penalty', float, 2.0),)\n\n"
        "    def _values(self, h, pred, target):\n"
        "        off = ~hd.kernels.is_ancestor(h, pred, target)\n"
        "        return (h.depth[pred] - h.depth[target]).abs().double() + self.penalty * off.double()\n\n"
        "@hd.register_decoder\n"
        "class SecondLeaf(hd.decoders.Decoder):\n"
        "    name, description = 'second_leaf', 'second most probable leaf'\n\n"
        "    def _decode_default(self, post):\n"
        "        return post.probs.topk(2, dim=1).indices[:, 1]\n")
    out = tmp_path / "r.json"
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "hdecode_torch", "compare", "--hierarchy", "inat19", "--import",
                          "my_metrics", "--metrics", "depth_gap[penalty=3],accuracy", "--decoders",
                          "second_leaf,argmax_leaf", "--num-samples", "300", "--no-progress", "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())["results"]
    text = json.dumps(results)
    assert "depth_gap[penalty=3]" in text and "second_leaf" in text
    bad = subprocess.run([sys.executable, "-m", "hdecode_torch", "compare", "--metrics", "depth_gp",
                          "--num-samples", "10", "--no-progress", "--json", str(tmp_path / "x.json"), "--import",
                          "my_metrics"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "did you mean 'depth_gap'" in bad.stderr


def test_command_line_parameter_flags_name_declared_parameters():
    """--beta, --c, --tau, --lam, --info-threshold are short for parameters the classes declare."""
    from hdecode_torch.cli.names import PARAM_OWNERS

    for attr, flag, kind, owner in PARAM_OWNERS:
        cls = hd.metrics.metric_class(owner) if kind == "metric" else hd.decoders.decoder_class(owner)
        declared = {p.name for p in cls.PARAMS}
        want = {"betas": "beta", "info_threshold": "threshold"}.get(attr, attr)
        assert want in declared, (flag, owner, declared)


def test_a_decoder_written_against_the_former_hook_name_keeps_working():
    # `_decode_cpu` was the hook's name although every plan without a `_decode_gpu` ran it
    with pytest.warns(DeprecationWarning, match="_decode_cpu is deprecated: name it _decode_default"):
        class FormerDeepestLeaf(hd.decoders.Decoder):
            name = "former_deepest_leaf"
            description = "the last leaf"

            def _decode_cpu(self, post):
                return torch.full((post.batch_size,), self.hierarchy.num_leaves - 1, dtype=torch.long,
                                  device=post.device)

    h, _ = bundled("tieredimagenet-h")
    p = torch.full((3, h.num_leaves), 1.0 / h.num_leaves)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            assert FormerDeepestLeaf(h).decode(p).tolist() == [h.num_leaves - 1] * 3
