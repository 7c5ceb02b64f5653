"""Every ```python block of the README runs, in order, in one namespace, as a reader pasting them would.

What a block may rely on: the blocks above it (their names), the files of ``FILES`` in the working
folder (a temporary one), and the packages of the ``[test]`` extra.  Metrics and decoders a block
registers are unregistered after the run.  The values the blocks compute are then checked.

Blocks fenced ```python engine are snippets that run inside an engine's job (a Ray dataset, a Spark
DataFrame, several Lightning devices): tests/test_engines.py and tests/test_prediction_writer.py run the
same calls under a local Ray cluster, a local Spark session and two Lightning processes, and
``test_engine_snippets_are_the_tested_calls`` checks that each snippet's calls are there.
"""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest
import torch

import hdecode_torch as hd

README = pathlib.Path(hd.__file__).resolve().parents[1] / "README.md"  # of the checkout under test

#: The files the README's blocks read, by name, as a reader would have them beside the code.
FILES = {"edges.csv": "parent,child\nroot,animal\nroot,vehicle\nanimal,dog\nanimal,cat\nvehicle,car\n"}


def _blocks() -> list[str]:
    """The ```python blocks, in order; one indented under a list item is dedented."""
    found = re.findall(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [textwrap.dedent(block) for _, block in found]


@pytest.fixture
def readme_namespace(tmp_path, monkeypatch, capsys):
    """Run every block in order; yields (namespace, what the blocks printed)."""
    from hdecode_torch.decoders.registry import DECODERS
    from hdecode_torch.metrics.registry import METRICS

    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    before = {reg: set(reg._classes) for reg in (METRICS, DECODERS)}
    threads = torch.get_num_threads()
    ns: dict = {"__name__": "readme"}
    try:
        blocks = _blocks()
        for i, block in enumerate(blocks, 1):
            exec(compile(block, f"README.md, python block {i} of {len(blocks)}", "exec"), ns)  # noqa: S102
        yield ns, capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
        for reg, names in before.items():
            for name in set(reg._classes) - names:
                reg.unregister(name)


def test_every_block_runs_in_order(readme_namespace):
    ns, out = readme_namespace
    assert len(_blocks()) >= 7
    # The Quickstart: the optimal decoder's expected score is never below the heuristic's.
    assert "tensor([True, True, True, True])" in out
    h, probs = ns["h"], ns["probs"]
    assert (h.num_nodes, h.num_leaves) == (843, 608)  # the bundled tree, not rebound by a later block
    # Trees of one's own: the last one is read from the edge list FILES gives.
    tree = ns["tree"]
    assert tree.num_leaves == 3 and tree.num_nodes == 6
    # A metric of one's own: its decoder is exact, no node has a lower expected value.
    m = hd.get_metric("depth_gap[penalty=3]", h)
    pred = m.decode(probs)
    table = m.dense_matrix().to(probs.dtype) @ probs.t()
    assert torch.allclose(m.expected(probs, pred), table.min(0).values)
    # Decoding within a subtree: every answer lies under the given node.
    assert bool(hd.kernels.is_ancestor(h, torch.full_like(ns["pred"], ns["dogs"]), ns["pred"]).all())
    # Risk control: fitted on the stand-in rows, its answers are node ids of the tree.
    rc, nodes = ns["rc"], ns["nodes"]
    assert 0.0 <= rc.lam <= 1.0 and nodes.shape == (probs.shape[0],) and int(nodes.max()) < h.num_nodes
    # Calibration on the stand-in validation set: a temperature near 1 (the synthetic outputs are calibrated).
    assert 0.8 < ns["scaler"].temperature < 1.25


def test_blocks_are_found_whole():
    """The test sees every block: each opening fence has its closing one, and nothing is left out."""
    text = README.read_text(encoding="utf-8")
    assert len(_blocks()) == len(re.findall(r"^[ \t]*```python[ \t]*$", text, flags=re.M))


def test_engine_snippets_are_the_tested_calls():
    """Each ```python engine snippet's library calls appear in the tests that start the engine."""
    text = README.read_text(encoding="utf-8")
    snippets = re.findall(r"^```python engine\n(.*?)^```", text, flags=re.S | re.M)
    assert len(snippets) == 3
    tests = pathlib.Path(__file__).parent
    engines = (tests / "test_engines.py").read_text() + (tests / "test_prediction_writer.py").read_text()
    wanted = [["map_batches(", "ActorPoolStrategy(", "fn_constructor_kwargs", "BatchDecoder"],
              ["predict_batch_udf(", "BatchDecoder(", ".predict", "input_tensor_shapes"],
              ["DecodingPredictionWriter(", "merge_shards(", "strategy=\"ddp\""]]
    for snippet, calls in zip(snippets, wanted):
        for call in calls:
            assert call in snippet and call in engines, call
