"""Round trips: Hierarchy JSON (original ids of any JSON-representable type, tuples included) and
pickling of hierarchies, metrics, decoders and posteriors (the unpickled object decodes the same).

``to_json`` writes ids that are JSON scalars (str, int, float, bool, None) as they are, numpy
scalars as Python ones, and tuples as JSON arrays, read back as tuples; any other id type is a
TypeError, raised before the file is touched.
"""

from __future__ import annotations

import copy
import json
import pickle
import warnings

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from hdecode_torch import Hierarchy
from harness import heuristic_cases, metric_pairs, model_like, param, strategies

#: Every registered metric over its parameter grid, with its default strategy and each explicit one.
METRICS = [param(name, dict(params, **({"strategy": s} if s else {})))
           for name, params in metric_pairs() for s in dict.fromkeys([None, *strategies(name)])]
#: Every heuristic over its grid, and the "optimal" decoder of every metric with an exact decoder.
DECODERS = heuristic_cases() + [param("optimal", dict(params, metric=name))
                                for name, params in metric_pairs(decodable=True)]


def _roundtrip_json(h, tmp_path, name="h.json"):
    path = tmp_path / name
    h.to_json(path)
    return Hierarchy.from_json(path), json.loads(path.read_text())


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_bundled_trees_roundtrip(tree, tmp_path):
    h = hd.load_hierarchy(tree)
    h2, data = _roundtrip_json(h, tmp_path)
    assert h2.parents_list == h.parents_list and h2.names == h.names and h2.labels == h.labels
    assert data["num_nodes"] == h.num_nodes and data["num_leaves"] == h.num_leaves
    rng = np.random.default_rng(0)
    P = torch.as_tensor(model_like(rng, h, 4, "confused"))
    for name in ("wu_palmer", "hf_beta"):
        assert torch.equal(hd.get_metric(name, h2).decode(P), hd.get_metric(name, h).decode(P))


@pytest.mark.parametrize("children,leaf_order", [
    ({"root": ["animal", "car"], "animal": ["dog", "cat"]}, None),  # strings
    ({10: [3, 7], 7: [1, 2]}, None),  # ints that are not canonical ids
    ({10: [3, 7], 7: [1, 2]}, [2, 3, 1]),  # ints with a column order
    ({("r",): [("r", "a"), ("r", "b")], ("r", "a"): [("r", "a", 0), ("r", "a", 1)]}, None),  # tuples
    ({(0, ("x", 1)): [(1, ("y", 2)), 5]}, None),  # nested tuples mixed with ints
    ({"root": [1, "b", 2.5, None, True]}, None),  # mixed JSON scalars (incomparable: first-seen order)
])
def test_ids_of_any_json_type_roundtrip(children, leaf_order, tmp_path):
    h = Hierarchy.from_dict(children, leaf_order=leaf_order)
    h2, data = _roundtrip_json(h, tmp_path)
    assert h2.names == h.names and h2.parents_list == h.parents_list
    for x in h.names:
        assert h2.index(x) == h.index(x)
    assert all(not isinstance(x, tuple) for x in data["ids"])  # tuples are JSON arrays on disk


def test_stop_leaf_ids_roundtrip(tmp_path):
    h = Hierarchy.from_dict({"r": ["a", "b"], "a": ["c", "d"]}, labels={"a": "Alpha"}).with_stop_leaves()
    assert ("a", "<stop>") in h.names
    h2, data = _roundtrip_json(h, tmp_path)
    assert ["a", "<stop>"] in data["ids"]
    assert h2.names == h.names and h2.labels == h.labels
    assert h2.index(("a", "<stop>")) == h.index(("a", "<stop>"))
    assert h2.label(h2.index(("a", "<stop>"))) == "Alpha (<stop>)"


def test_numpy_scalar_ids_are_written_as_python_numbers(tmp_path):
    h = Hierarchy.from_parents([2, 2, -1], names=[np.int64(5), np.int32(6), np.int16(7)])
    h2, data = _roundtrip_json(h, tmp_path)
    assert data["ids"] == [5, 6, 7] and h2.names == [5, 6, 7]
    assert h2.index(5) == h.index(np.int64(5)) == 0


def test_unrepresentable_ids_are_a_type_error_and_write_nothing(tmp_path):
    h = Hierarchy.from_dict({frozenset({1}): ["a", "b"]})
    path = tmp_path / "h.json"
    with pytest.raises(TypeError, match=r"Cannot write node id frozenset\(\{1\}\).*convert the ids to strings"):
        h.to_json(path)
    assert not path.exists()
    path.write_text("keep")
    with pytest.raises(TypeError):
        h.to_json(path)
    assert path.read_text() == "keep"


def test_json_without_ids_uses_positions(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"parents": [3, 3, 4, 4, -1]}))
    h = Hierarchy.from_json(path)
    assert h.names == [0, 1, 2, 3, 4] and h.parents_list == [3, 3, 4, 4, -1]


# --------------------------------------------------------------------------- pickling
@pytest.fixture(scope="module")
def tree_and_probs():
    h = Hierarchy.from_parents(ref.random_tree(np.random.default_rng(3), num_nodes_max=40, unary_prob=0.3))
    rng = np.random.default_rng(1)
    P = torch.as_tensor(np.stack([ref.random_distribution(rng, h.num_leaves, "random") for _ in range(9)]))
    return h, P


def test_hierarchy_pickle_and_deepcopy(tree_and_probs):
    h, P = tree_and_probs
    hd.get_metric("hf_beta", h).decode(P)  # fill caches
    for h2 in (pickle.loads(pickle.dumps(h)), copy.deepcopy(h)):
        assert h2.parents_list == h.parents_list and h2.names == h.names and h2.device == h.device
        for attr in ("parent", "depth", "ancestors", "leaf_count", "information", "min_leaf_depth",
                     "max_leaf_depth", "height", "children_ptr", "children"):
            assert torch.equal(getattr(h2, attr), getattr(h, attr)), attr
        assert all(torch.equal(a, b) for a, b in zip(h2.levels, h.levels))
        assert h2.same_tree(h) and h2.to("cpu") is h2


def test_hierarchy_pickled_on_cuda_loads_on_cpu_only_machines():
    if torch.cuda.is_available():
        pytest.skip("simulates a machine without CUDA")
    h = Hierarchy.from_parents([2, 2, -1])
    state = h.__getstate__()
    state["_device"] = "cuda:0"
    h2 = object.__new__(Hierarchy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h2.__setstate__(state)
    assert h2.device == torch.device("cpu") and any("CUDA is not available" in str(w.message) for w in caught)
    assert h2.parents_list == h.parents_list


@pytest.mark.parametrize("name,params", METRICS)
def test_metric_pickle_decodes_the_same(tree_and_probs, name, params):
    h, P = tree_and_probs
    m = hd.get_metric(name, h, **params)
    fresh = pickle.loads(pickle.dumps(m))  # before any cache is filled
    want = m.decode(P)
    used = pickle.loads(pickle.dumps(m))  # after decode filled the caches
    for m2 in (fresh, used, copy.deepcopy(m)):
        assert type(m2) is type(m) and m2.params == m.params and m2.key == m.key
        assert torch.equal(m2.decode(P), want)
        torch.testing.assert_close(m2.expected(P, want), m.expected(P, want), rtol=0, atol=0)
        y = torch.arange(P.shape[0]) % h.num_leaves
        assert torch.equal(m2(want, y), m(want, y))
        assert torch.equal(m2.decode(hd.Posterior(h, P)), want)  # a Posterior of the original tree is accepted


def test_cost_matrix_metric_pickle(tree_and_probs):
    h, P = tree_and_probs
    cost = hd.get_metric("wu_palmer", h).dense_matrix()
    m = hd.CostMatrixMetric(h, cost, higher_is_better=True, name="my_wp")
    want = m.decode(P)
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.name == "my_wp" and m2.higher_is_better and torch.equal(m2.cost, m.cost)
    assert torch.equal(m2.decode(P), want)
    assert m2.is_hierarchically_reasonable == m.is_hierarchically_reasonable


@pytest.mark.parametrize("name,params", DECODERS)
def test_decoder_pickle_decodes_the_same(tree_and_probs, name, params):
    h, P = tree_and_probs
    if name == "information_threshold" and params["threshold"] > np.log(h.num_leaves):
        pytest.skip("threshold above log L")
    dec = hd.get_decoder(name, h, **params)
    want = dec.decode(P)
    for d2 in (pickle.loads(pickle.dumps(dec)), copy.deepcopy(dec)):
        assert d2.key == dec.key
        assert torch.equal(d2.decode(P), want)
        assert torch.equal(d2.decode(P[0]), want[0])


def test_posterior_pickle(tree_and_probs):
    h, P = tree_and_probs
    post = hd.Posterior(h, P)
    _ = post.node, post.by_leaf_depth()
    post2 = pickle.loads(pickle.dumps(post))
    assert torch.equal(post2.probs, post.probs) and torch.equal(post2.node, post.node)
    for name, params in (c.values for c in METRICS[:5]):
        m = hd.get_metric(name, h, **params)
        assert torch.equal(m.decode(post2), m.decode(post))


def test_copies_on_other_devices_are_not_pickled(tree_and_probs):
    h, _ = tree_and_probs
    h.to("cpu")
    state = h.__getstate__()
    assert "_copies" not in state and "_cache" not in state and "ancestors" not in state
    assert isinstance(state["_device"], str)
