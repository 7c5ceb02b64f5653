"""The README's self-contained code blocks run as written (the Quickstart, then a metric of one's own)."""

from __future__ import annotations

import pathlib
import re

import torch

import hdecode_torch as hd

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_quickstart_and_a_metric_of_ones_own_run(capsys):
    blocks = _blocks()
    quickstart = next(b for b in blocks if "hd.load_hierarchy(\"tieredimagenet-h\")" in b)
    own = next(b for b in blocks if "@hd.register_metric" in b)
    ns: dict = {}
    try:
        exec(compile(quickstart, "README:quickstart", "exec"), ns)
        assert "tensor([True, True, True, True])" in capsys.readouterr().out
        exec(compile(own, "README:own-metric", "exec"), ns)
        m = hd.get_metric("depth_gap[penalty=3]", ns["h"])
        pred = m.decode(ns["probs"])
        # exact: no node has a lower expected value than the decoded one
        table = m.dense_matrix().to(ns["probs"].dtype) @ ns["probs"].t()
        assert torch.allclose(m.expected(ns["probs"], pred), table.min(0).values)
    finally:
        if "depth_gap" in hd.metrics.METRICS:
            hd.metrics.METRICS.unregister("depth_gap")
