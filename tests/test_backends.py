"""The optional torch-scatter backend gives the same results as the default pure-torch path."""

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import segment
from harness import bundled, model_like

pytestmark = pytest.mark.skipif(not segment.scatter_available(), reason="torch-scatter is not installed")


@pytest.fixture
def scatter_backend():
    hd.set_backend("scatter")
    yield
    hd.set_backend("torch")


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_scatter_backend_equals_torch(tree):
    h, _ = bundled(tree)
    rng = np.random.default_rng(0)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 20, k) for k in ("peaked", "diffuse", "confused")]))
    names = [("tree_distance", {}), ("lca_height", {}), ("wu_palmer", {"strategy": "structural"}), ("zhao", {}),
             ("hf_beta", {"beta": 1.0}), ("hamming", {})]
    want = {n: hd.get_metric(n, h, **p).decode(P) for n, p in names}
    want_nodes = hd.node_probabilities(h, P)
    hd.set_backend("scatter")
    try:
        torch.testing.assert_close(hd.node_probabilities(h, P), want_nodes, rtol=0, atol=1e-12)
        for n, p in names:
            assert torch.equal(hd.get_metric(n, h, **p).decode(P), want[n]), n
    finally:
        hd.set_backend("torch")
