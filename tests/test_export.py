"""DecodingHead in graphs: torch.export, ONNX (onnxruntime), torch.compile and CUDA graphs.

Every exported program is compared with the eager head under the same plan, on batch sizes other
than the example's (the batch dimension is dynamic).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hdecode_torch as hd
from hdecode_torch.integrations import DecodingHead
from harness import DEVICES, heuristic_cases, metric_cases, model_like, random_trees

H = hd.load_hierarchy("tieredimagenet-h")
L = H.num_leaves
#: Every metric with an exact decoder, except those whose decoding has data-dependent sizes.
FIXED_SIZE = [c for c in metric_cases(decodable=True, full=False)
              if not hd.metrics.metric_class(c.values[0]).data_dependent_sizes]


def _probs(seed, batch, h=H, kind="confused"):
    return torch.as_tensor(model_like(np.random.default_rng(seed), h, batch, kind), dtype=torch.float32)


def _no_fake_tables(h):
    from torch._subclasses.fake_tensor import FakeTensor

    def walk(v):
        if isinstance(v, torch.Tensor):
            return not isinstance(v, FakeTensor)
        if isinstance(v, (tuple, list)):
            return all(walk(x) for x in v)
        if isinstance(v, dict):
            return all(walk(x) for x in v.values())
        return all(walk(x) for x in getattr(v, "__dict__", {}).values()) if hasattr(v, "_fields") else True
    return all(walk(v) for v in h._cache.values())


def _ops(ep):
    return {str(n.target) for n in ep.graph_module.graph.nodes if n.op == "call_function"}


def test_fixed_size_list_covers_node_metrics_and_hamming():
    names = {c.values[0] for c in FIXED_SIZE}
    assert {"accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao", "hamming"} <= names
    assert "hf_beta" not in names


# --------------------------------------------------------------------------- torch.export
@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("name,params", FIXED_SIZE)
def test_torch_export_equals_eager(name, params, plan):
    head = DecodingHead(H, name, **params)
    assert head.traceable
    with hd.plan_for(plan):
        ep = head.export(_probs(0, 8))
        for seed, batch in [(1, 1), (2, 5), (3, 33)]:  # dynamic batch: not the example's size
            x = _probs(seed, batch)
            got, want = ep.module()(x), head(x)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want), (name, batch)
    ops = _ops(ep)
    hdecode_ops = {op for op in ops if op.startswith("hdecode.")}
    if plan == "cpu":  # standard operators only: loadable without hdecode_torch, convertible to ONNX
        assert not hdecode_ops, hdecode_ops
    assert all(op.startswith(("aten.", "hdecode.", "<built-in")) for op in ops), ops
    assert _no_fake_tables(H.to("cpu"))


@pytest.mark.parametrize("name,params", heuristic_cases(full=False))
def test_torch_export_heuristic_heads(name, params):
    h, _ = next(random_trees(5, 1, num_nodes_max=40, unary_prob=0.3))
    head = DecodingHead(h, "tree_distance", decoder=(name, params), from_logits=True)
    g = torch.Generator().manual_seed(0)
    ep = head.export(torch.randn(6, h.num_leaves, generator=g) * 3)
    for batch in (1, 9):
        x = torch.randn(batch, h.num_leaves, generator=g) * 3
        assert torch.equal(ep.module()(x), head(x)), (name, batch)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_torch_export_cost_matrix_head(plan):
    """A hierarchically reasonable cost matrix prunes candidates eagerly; the graph scores every node."""
    h, _ = next(random_trees(8, 1, num_nodes_max=30, unary_prob=0.3))
    n, leaves = h.num_nodes, h.num_leaves
    td = hd.get_metric("tree_distance", h)
    cost = td(torch.arange(n).repeat_interleave(leaves), torch.arange(leaves).repeat(n)).reshape(n, leaves).double()
    cm = hd.CostMatrixMetric(h, cost)
    assert cm.is_hierarchically_reasonable
    head = DecodingHead(h, cm)
    assert torch.equal(head(_probs(0, 9, h)), td.decode(_probs(0, 9, h)))
    with hd.plan_for(plan):
        ep = head.export(_probs(1, 4, h))
        for seed, batch in [(2, 1), (3, 17)]:
            x = _probs(seed, batch, h)
            assert torch.equal(ep.module()(x), head(x))


def test_saved_programs_load_in_a_fresh_process(tmp_path):
    """The CPU plan's program needs nothing but torch; the GPU plan's needs the hdecode:: ops registered."""
    x = _probs(5, 6)
    head = DecodingHead(H, "hamming")
    with hd.plan_for("cpu"):
        torch.export.save(head.export(x), tmp_path / "cpu.pt2")
    with hd.plan_for("cuda"):
        gpu = head.export(x)
    assert any(op.startswith("hdecode.") for op in _ops(gpu))
    torch.export.save(gpu, tmp_path / "gpu.pt2")
    torch.save({"x": x, "want": head(x)}, tmp_path / "io.pt")
    code = (
        "import sys, torch\n"
        f"d = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"ep = torch.export.load({str(tmp_path / 'cpu.pt2')!r})\n"
        "print(torch.equal(ep.module()(d['x']), d['want']), 'hdecode_torch' in sys.modules)\n"
        "import hdecode_torch.kernels.fused\n"
        f"ep = torch.export.load({str(tmp_path / 'gpu.pt2')!r})\n"
        "print(torch.equal(ep.module()(d['x']), d['want']))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False", "True"]


def test_export_of_a_model_ending_in_the_head():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, L)).eval()
    head = DecodingHead(H, "wu_palmer", from_logits=True)  # CPU plan: pruned candidates eagerly
    model = nn.Sequential(backbone, head)
    x = torch.randn(16, 12) * 5
    # non-strict, as the head documents (strict tracing, torch's default before 2.7, cannot read the plan)
    with pytest.raises(ValueError, match="validate=False"):
        torch.export.export(model, (x,), strict=False)
    head.validate = False
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},), strict=False)
    for batch in (3, 40):
        xb = torch.randn(batch, 12) * 5
        with torch.no_grad():
            assert torch.equal(ep.module()(xb), model(xb))


def test_export_checks_the_example_and_rejects_untraceable_heads():
    head = DecodingHead(H, "tree_distance")
    bad = _probs(0, 4) * 2  # rows sum to 2
    with pytest.raises(ValueError, match="sum to 1"):
        head.export(bad)
    with pytest.raises(ValueError, match="B >= 2"):
        head.export(_probs(0, 1))
    with pytest.raises(TypeError, match="example"):
        head.export(_probs(0, 4).numpy())
    hf = DecodingHead(H, "hf_beta", beta=0.5)
    assert not hf.traceable and DecodingHead(H, "hf_beta", decoder="majority").traceable
    with pytest.raises(ValueError, match="hf_beta.*depend on the data"):
        hf.export(_probs(0, 4))
    with pytest.raises(ValueError, match="cuda_graph"):
        DecodingHead(H, "hf_beta", cuda_graph=True)
    # The probabilities check stays in the eager head after an export.
    head.export(_probs(1, 4))
    with pytest.raises(ValueError, match="sum to 1"):
        head(bad)


def test_exported_program_from_logits_and_unbatched_input():
    head = DecodingHead(H, "zhao", from_logits=True)
    g = torch.Generator().manual_seed(4)
    ep = head.export(torch.randn(4, L, generator=g) * 3, dynamic_batch=False)
    x = torch.randn(4, L, generator=g) * 3
    assert torch.equal(ep.module()(x), head(x))
    with pytest.raises(Exception):
        ep.module()(torch.randn(5, L))  # the batch size was fixed
    single = DecodingHead(H, "zhao", from_logits=True, validate=False)
    assert torch.equal(torch.export.export(single, (x[0],), strict=False).module()(x[1]), head(x[1]))


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("name,from_logits", [("zhao", True), ("hamming", True), ("tree_distance", "auto"),
                                              ("wu_palmer", False)])
def test_exported_program_takes_an_empty_batch(name, from_logits, plan):
    """An empty batch gives the eager head's empty prediction (the logits' statistics were reduced over the
    whole batch, which an empty one has no value for: amin's error)."""
    head = DecodingHead(H, name, from_logits=from_logits)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, L, generator=g) * 3
    x = torch.softmax(x, 1) if from_logits is False else x
    with hd.plan_for(plan):
        module = head.export(x).module()
        got, want = module(x[:0]), head(x[:0])
        assert got.dtype == want.dtype and got.shape == want.shape and want.shape[0] == 0
        assert torch.equal(module(x), head(x))
        if from_logits == "auto":
            assert torch.equal(module(x.softmax(1)), head(x.softmax(1)))


def test_exported_program_refuses_other_shapes_by_name():
    """Issue 24: a 1-D input to head.export()'s program was an IndexError from torch's guards."""
    head = DecodingHead(H, "tree_distance")
    x = _probs(0, 4)
    module = head.export(x).module()
    assert torch.equal(module(x), head(x))
    with pytest.raises(ValueError, match=rf"Expected `scores` to have shape \(B, {L}\) \(the program takes batches: "
                                         rf"pass scores\[None\] for one sample\), but got \({L},\)"):
        module(x[0])
    assert torch.equal(module(x[0][None]), head(x[0])[None])
    with pytest.raises(ValueError, match=rf"shape \(B, {L}\), but got \(4, {L - 1}\)"):
        module(x[:, 1:])
    with pytest.raises(TypeError, match="`scores` to be a torch.Tensor"):
        module(x.numpy())
    fixed = head.export(x, dynamic_batch=False).module()
    with pytest.raises(ValueError, match="the program takes batches"):
        fixed(x[0])


def test_onnx_export_checks_the_destination_first(tmp_path, monkeypatch):
    """Issue 24: a missing folder was a FileNotFoundError naming a temporary file, after the whole export."""
    pytest.importorskip("onnxscript")
    head = DecodingHead(H, "tree_distance")
    traced = []
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: traced.append(a))
    missing = tmp_path / "no" / "such" / "head.onnx"
    with pytest.raises(FileNotFoundError, match=f"the folder '{tmp_path / 'no' / 'such'}' does not exist"):
        head.export_onnx(_probs(0, 4), missing)
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        head.export_onnx(_probs(0, 4), tmp_path)
    assert traced == [] and not (tmp_path / "no").exists()
    head.export_onnx(_probs(0, 4), str(tmp_path / "head.onnx"))  # an existing folder: exported
    assert len(traced) == 1 and traced[0][2] == str(tmp_path / "head.onnx")


def test_graph_body_reads_nothing_on_the_host_on_the_gpu_plan():
    """What a CUDA graph capture needs: once the tree tables exist, the decoding of every traceable head
    makes no host read (no sync, no size read back), counted with the GPU plan on CPU tensors."""
    try:
        from benchmarks.plan_cost import Cost  # where later versions keep the counter
    except ImportError:
        from test_plan import Cost

    x = _probs(0, 16)
    heads = [DecodingHead(H, name, **params) for name, params in (c.values for c in FIXED_SIZE)]
    heads += [DecodingHead(H, "tree_distance", decoder=(name, params)) for name, params in
              (c.values for c in heuristic_cases(full=False))]
    with hd.plan_for("cuda"):
        for head in heads:
            h = head.hierarchy
            head._build_tables(h, x)
            with Cost() as cost:
                out = head._graph_body(h, x)
            assert cost.reads == 0, (head, cost.by_op)
            assert torch.equal(out, head(x)), head


# --------------------------------------------------------------------------- ONNX
ONNX_HEADS = [("tree_distance", {}, "optimal", False), ("hamming", {}, "optimal", False),
              ("wu_palmer", {}, "optimal", True), ("zhao", {}, "optimal", "auto")]


@pytest.mark.parametrize("name,params,decoder,logits", ONNX_HEADS, ids=[f"{m}-{d if isinstance(d, str) else d[0]}"
                                                                          for m, _, d, _ in ONNX_HEADS])
def test_onnx_round_trip_through_onnxruntime(name, params, decoder, logits, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    head = DecodingHead(H, name, decoder=decoder, from_logits=logits, **params)
    g = torch.Generator().manual_seed(7)
    make = (lambda b: torch.randn(b, L, generator=g) * 3) if logits else (lambda b: _probs(int(b), b))
    path = tmp_path / "head.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head.export_onnx(make(8), path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["scores"]
    for batch in (0, 1, 3, 50):  # an empty batch gives an empty prediction, as the eager head does
        for x in [make(batch)] + ([torch.softmax(make(batch), 1)] if logits == "auto" else []):
            (got,) = session.run(None, {"scores": x.numpy()})
            want = head(x).numpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(got, want), (name, batch)


def test_onnx_export_refuses_fused_trees(monkeypatch):
    pytest.importorskip("onnxscript")
    import hdecode_torch.core.plan as plan

    monkeypatch.setattr(plan, "MAX_LEVELS", 3)
    with pytest.raises(ValueError, match="levels"):
        DecodingHead(H, "tree_distance").export_onnx(_probs(0, 4))


# --------------------------------------------------------------------------- torch.compile
def test_compiled_model_breaks_the_graph_at_the_head():
    import torch._dynamo

    backbone = nn.Sequential(nn.Linear(8, L)).eval()
    model = nn.Sequential(backbone, DecodingHead(H, "tree_distance", from_logits=True))
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(3)) * 4
    with torch.no_grad():
        want = model(x)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(model)(x), want)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="disable"):  # the head is not in the graph (torch's words vary)
            torch.compile(model, fullgraph=True)(x)
    torch._dynamo.reset()


def _dynamo_folds_is_exporting_to_true(real):
    """torch.compiler.is_exporting as Dynamo of torch 2.7 to 2.11 traces it: True in every traced frame."""
    return lambda: torch.compiler.is_dynamo_compiling() or real()


def test_head_stays_out_of_the_graph_whatever_torch_says_about_exporting(monkeypatch):
    """Issue 24: on torch 2.11, torch.compile of backbone + head raised "Expected a DecodingHead built with
    `validate=False` in an exported graph" (Dynamo folded is_exporting() to True).  That behaviour (torch
    2.7 to 2.11) is simulated here."""
    import torch._dynamo

    import hdecode_torch.integrations.export as export

    monkeypatch.setattr(export, "_is_exporting", _dynamo_folds_is_exporting_to_true(torch.compiler.is_exporting))
    backbone = nn.Sequential(nn.Linear(8, L)).eval()
    model = nn.Sequential(backbone, DecodingHead(H, "wu_palmer", from_logits=True))
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(5)) * 4
    with torch.no_grad():
        want = model(x)
        torch._dynamo.reset()
        try:
            assert torch.equal(torch.compile(model)(x), want)
        finally:
            torch._dynamo.reset()
    head = DecodingHead(H, "tree_distance")  # non-strict export still traces the head, unchecked
    ep = head.export(_probs(0, 4))
    assert torch.equal(ep.module()(_probs(1, 7)), head(_probs(1, 7)))


# --------------------------------------------------------------------------- CUDA graphs
def test_cuda_graph_flag_on_cpu_decodes_eagerly_with_one_warning():
    head = DecodingHead(H, "wu_palmer", cuda_graph=True)
    x = _probs(0, 6)
    with pytest.warns(UserWarning, match="CUDA inputs only"):
        out = head(x)
    assert torch.equal(out, hd.get_metric("wu_palmer", H).decode(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(head(x), out)
    assert head._graph is None
    with pytest.raises(TypeError, match="cuda_graph"):
        DecodingHead(H, "wu_palmer", cuda_graph=1)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA")
@pytest.mark.parametrize("name,params", FIXED_SIZE)
def test_cuda_graph_replay_equals_eager(name, params):
    eager = DecodingHead(H, name, **params).to("cuda")
    graphed = DecodingHead(H, name, cuda_graph=True, **params).to("cuda")
    for seed in range(3):
        x = _probs(seed, 24).cuda()
        assert torch.equal(graphed(x), eager(x)), (name, seed)
    assert graphed._graph is not None and graphed._graph.key[0] == (24, L)
    out = graphed(_probs(9, 24).cuda())
    assert out.data_ptr() != graphed._graph.static_out.data_ptr()  # a new tensor, not the graph's buffer
    other = _probs(10, 7).cuda()  # another shape: eager
    assert torch.equal(graphed(other), eager(other))
    with pytest.raises(ValueError, match="sum to 1"):
        graphed(_probs(11, 24).cuda() * 2)  # checked before the replay
    buf = io.BytesIO()
    torch.save(graphed, buf)  # the graph is not saved; the loaded head captures its own
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded._graph is None
    x = _probs(12, 24).cuda()
    assert torch.equal(loaded(x), eager(x)) and loaded._graph is not None


def test_each_metric_says_its_fixed_size_equivalent():
    """metric.fixed_size(plan): the exact search a graph runs in place of a pruned candidate list, deciding
    the same; every other metric answers itself."""
    from hdecode_torch.core.plan import resolve_plan

    x = _probs(4, 64)
    with hd.plan_for("cpu"):
        plan = resolve_plan(H, x.device)
        for name, params in [("wu_palmer", {"strategy": "candidates"}), ("zhao", {"strategy": "candidates"}),
                             ("wu_palmer", {"strategy": "structural"}), ("tree_distance", {}), ("hamming", {})]:
            m = hd.get_metric(name, H, **params)
            fixed = m.fixed_size(plan, H)
            if params.get("strategy") == "candidates":
                assert fixed is not m and fixed.strategy == "dense" and m.strategy == "candidates"
            else:
                assert fixed is m
            assert torch.equal(fixed.decode(x), m.decode(x)), name
        big = hd.get_metric("wu_palmer", H, strategy="candidates")
        big.DENSE_MAX_ENTRIES = 0  # as on a tree too large for the (N, L) matrix: root-path sums
        assert big.fixed_size(plan, H).strategy == "structural"
        assert torch.equal(big.fixed_size(plan, H).decode(x), big.decode(x))
        cost = hd.get_metric("tree_distance", H).dense_matrix().to(torch.float64)
        m = hd.get_metric("cost_matrix", H, cost=cost)
        fixed = m.fixed_size(plan, H)
        assert m.is_hierarchically_reasonable and fixed.strategy == "dense" and m.strategy == "auto"
        assert torch.equal(fixed.decode(x), m.decode(x))
