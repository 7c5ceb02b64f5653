import json
import os
import pickle
import time

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import Hierarchy
from harness import DEVICES, random_trees


def test_bundled_trees_keep_file_ids():
    for name, n, l, dmax in [("tieredimagenet-h", 843, 608, 12), ("inat19", 1190, 1010, 7)]:
        h = hd.load_hierarchy(name)
        assert (h.num_nodes, h.num_leaves, h.max_depth) == (n, l, dmax)
        with open(os.path.join(os.path.dirname(hd.__file__), "hierarchy", "data", f"{name}.json")) as f:
            data = json.load(f)
        assert h.parents_list == data["parents"]
        assert h.names == data["ids"]
        assert h.index(data["ids"][5]) == 5
    assert hd.load_hierarchy("inat19").statistics()["num_single_child_nodes"] == 77
    assert hd.load_hierarchy("tieredimagenet-h").statistics()["min_leaf_depth"] == 3
    assert set(hd.list_hierarchies()) == {"tieredimagenet-h", "inat19"}
    with pytest.raises(ValueError, match="Unknown bundled hierarchy"):
        hd.load_hierarchy("imagenet-21k")


def test_compiled_tables_match_reference():
    for h, info in random_trees(0, 60, num_nodes_max=14):
        assert h.parent.tolist() == info.parents.tolist()
        assert h.depth.tolist() == list(info.depth)
        assert h.leaf_count.tolist() == list(info.leaf_count)
        assert h.min_leaf_depth.tolist() == list(info.dmin)
        assert h.max_leaf_depth.tolist() == list(info.dmax)
        assert h.height.tolist() == list(info.height)
        np.testing.assert_allclose(h.information.numpy(), info.info, rtol=0, atol=1e-12)
        anc = h.ancestors.numpy()
        for n in range(info.N):
            path = info.ancestors(n)[::-1]
            assert anc[n, : len(path)].tolist() == path
            assert (anc[n, len(path):] == info.N).all()
            ch = h.children[h.children_ptr[n]: h.children_ptr[n + 1]].tolist()
            assert ch == sorted(info.children[n])
        inc = h.leaf_ancestor_incidence(torch.float64).to_dense().numpy()
        for l in range(info.L):
            assert set(np.flatnonzero(inc[l])) == set(info.ancestors(l))


def test_from_parents_relabels_noncanonical():
    # root 0, internal 1, leaves 2,3,4 -> leaves first in ascending original id
    h = Hierarchy.from_parents([-1, 0, 1, 1, 0])
    assert h.names == [2, 3, 4, 0, 1]
    assert h.num_leaves == 3 and h.root == 3
    assert h.parent.tolist() == [4, 4, 3, -1, 3]
    h2 = Hierarchy.from_parents([-1, 0, 1, 1, 0], leaf_order=[4, 3, 2])
    assert h2.names[:3] == [4, 3, 2]
    assert h2.index(0) == h2.root


def test_from_dict_edges_networkx_paths_agree():
    children = {"animal": ["dog", "cat"], "dog": ["beagle", "poodle"], "root": ["animal", "car"]}
    order = ["poodle", "beagle", "cat", "car"]
    h1 = Hierarchy.from_dict(children, leaf_order=order)
    edges = [(p, c) for p, cs in children.items() for c in cs]
    h2 = Hierarchy.from_edges(edges, leaf_order=order)
    nx = pytest.importorskip("networkx")
    g = nx.DiGraph(edges)
    h3 = Hierarchy.from_networkx(g, leaf_order=order)
    for h in (h1, h2, h3):
        assert h.names[:4] == order
        assert h.parents_list == h1.parents_list
        assert h.name(h.parent[h.index("beagle")].item()) == "dog"
        assert h.depth[h.index("poodle")].item() == 3
    h4 = Hierarchy.from_paths(["animal/dog/poodle", "animal/dog/beagle", "animal/cat", "car"])
    assert h4.names[:4] == ["animal/dog/poodle", "animal/dog/beagle", "animal/cat", "car"]
    assert h4.name(h4.root) == ""
    assert h4.depth[:4].tolist() == [3, 3, 2, 1]
    h5 = Hierarchy.from_dict({1: [2, 3], 0: [1, 4]})
    assert h5.names == [2, 3, 4, 0, 1]


def test_from_edges_csv(tmp_path):
    f = tmp_path / "tree.csv"
    f.write_text("parent,child\nn0,n1\nn0,n2\nn1,n3\nn1,n4\n")
    h = Hierarchy.from_edges(f)
    assert h.names == ["n2", "n3", "n4", "n0", "n1"]
    g = tmp_path / "tree.tsv"
    g.write_text("# comment\nn0\tn1\nn0\tn2\n")
    assert Hierarchy.from_edges(g).names == ["n1", "n2", "n0"]


def test_malformed_other_inputs():
    with pytest.raises(ValueError, match="two parents"):
        Hierarchy.from_edges([("a", "b"), ("c", "b"), ("a", "c")])
    with pytest.raises(ValueError, match="exactly one root"):
        Hierarchy.from_dict({"a": ["b"], "c": ["d"]})
    with pytest.raises(ValueError, match="cycle"):
        Hierarchy.from_dict({"r": ["x"], "a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="Unknown id 'zebra' in `leaf_order`"):
        Hierarchy.from_dict({"r": ["a", "b"]}, leaf_order=["a", "zebra"])
    with pytest.raises(ValueError, match="all 2 leaves"):
        Hierarchy.from_dict({"r": ["a", "b"]}, leaf_order=["a"])
    with pytest.raises(ValueError, match="internal node"):
        Hierarchy.from_dict({"r": ["a", "b"], "a": ["c"]}, leaf_order=["a", "b"])
    with pytest.raises(ValueError, match="prefix of another class path"):
        Hierarchy.from_paths(["a/b", "a/b/c"])
    with pytest.raises(ValueError, match="empty"):
        Hierarchy.from_dict({})
    with pytest.raises(TypeError, match="mapping"):
        Hierarchy.from_dict([("a", "b")])
    with pytest.raises(ValueError, match="pairs"):
        Hierarchy.from_edges([("a", "b", "c")])



def test_from_paths_whitespace_around_components_is_padding():
    """Issue 24: ["a/b", "a /c"] made two branches "a" and "a "; whitespace around a component is
    padding (as in edge-list files), so both paths go through one node "a"."""
    h = Hierarchy.from_paths(["a/b", "a /c", " a / d ", "/a/e/"])
    assert h.names == ["a/b", "a/c", "a/d", "a/e", "a"]
    assert h.num_nodes == 5 and h.parents_list == [4, 4, 4, 4, -1]
    # spaces inside a component are part of the name
    assert Hierarchy.from_paths(["big cat/lion", "big cat/tiger"]).names[-1] == "big cat"
    # paths equal once stripped are one class twice: an error naming both
    with pytest.raises(ValueError, match=r"'a/b' appears twice: paths\[0\] = 'a/b' and paths\[1\] = 'a /b ' \(equal once"):
        Hierarchy.from_paths(["a/b", "a /b "])
    with pytest.raises(ValueError, match=r"non-empty path components, but paths\[1\] = 'a/ /c'"):
        Hierarchy.from_paths(["a/b", "a/ /c"])
    with pytest.raises(ValueError, match=r"paths\[1\].*invisible character '\\u200b'"):
        Hierarchy.from_paths(["a/b", "a/c\u200bd"])
    with pytest.raises(TypeError, match="`sep`"):
        Hierarchy.from_paths(["a/b", "a/c"], sep="")
    # a multi-character separator is a separator, not a set of characters to strip
    assert Hierarchy.from_paths(["a::b:", "a::c"], sep="::").names[:2] == ["a::b:", "a::c"]


@pytest.mark.parametrize("node", [-1, -5, 5, 2**40])
def test_label_and_name_refuse_ids_out_of_range(node):
    """Issue 24: h.label(-1) and h.name(-1) returned the last node (Python's negative indexing)."""
    h = Hierarchy.from_paths(["a/b", "a/c", "d"])
    assert h.num_nodes == 5
    for method in (h.label, h.name):
        with pytest.raises(ValueError, match=rf"Expected `node` to be a node id in 0..4, but got {node}"):
            method(node)


def test_label_and_name_take_integer_ids_only():
    h = Hierarchy.from_paths(["a/b", "a/c", "d"])
    assert h.names == ["a/b", "a/c", "d", "", "a"]
    assert [h.name(i) for i in (np.int64(0), torch.tensor(1), 3)] == ["a/b", "a/c", ""]
    assert h.label(torch.tensor(4, dtype=torch.int32)) == "a"
    for bad in (1.0, True, "0", torch.tensor([0]), torch.tensor(0.0), None):
        with pytest.raises(TypeError, match="`node` to be an integer node id"):
            h.label(bad)
        with pytest.raises(TypeError, match="`node` to be an integer node id"):
            h.name(bad)

def test_json_pickle_roundtrip(tmp_path):
    h = hd.load_hierarchy("tieredimagenet-h")
    h.to_json(tmp_path / "t.json")
    h2 = Hierarchy.from_json(tmp_path / "t.json")
    assert h2.parents_list == h.parents_list and h2.names == h.names and h2.labels == h.labels
    h3 = pickle.loads(pickle.dumps(h))
    assert torch.equal(h3.ancestors, h.ancestors) and h3.names == h.names
    hs = Hierarchy.from_dict({"r": ["a", "b"], "a": ["c", "d"]})
    hs.to_json(tmp_path / "s.json")
    assert Hierarchy.from_json(tmp_path / "s.json").names == hs.names


def test_with_stop_leaves():
    h = Hierarchy.from_dict({"r": ["a", "b"], "a": ["c", "d"]})
    s = h.with_stop_leaves()
    assert s.num_leaves == h.num_leaves + 2
    assert s.names[: h.num_leaves] == h.names[: h.num_leaves]
    stop_a = s.index(("a", "<stop>"))
    assert s.name(s.parent[stop_a].item()) == "a"


@pytest.mark.parametrize("device", DEVICES)
def test_to_device(device):
    h = hd.load_hierarchy("inat19").to(device)
    assert h.ancestors.device.type == device and h.levels[3].device.type == device
    assert h.to(device) is h


def test_million_node_tree_builds_in_seconds():
    rng = np.random.default_rng(0)
    n = 1_000_000
    par = np.empty(n, dtype=np.int64)
    par[0] = -1
    par[1:] = (np.arange(1, n) * rng.random(n - 1) ** 0.3).astype(np.int64)
    t = time.perf_counter()
    h = Hierarchy.from_parents(par)
    elapsed = time.perf_counter() - t
    assert h.num_nodes == n and h.leaf_count[h.root].item() == h.num_leaves
    assert elapsed < 30, elapsed  # measured 1.3 s on the 2-core CI machine


# --------------------------------------------------------------------------- edge-list and JSON files
def test_edge_list_numeric_leaf_names_sort_by_value(tmp_path):
    f = tmp_path / "tree.csv"
    f.write_text("".join(f"r,{i}\n" for i in range(12)))
    h = Hierarchy.from_edges(f)
    assert h.names[:12] == [str(i) for i in range(12)]  # not 0, 1, 10, 11, 2, ...
    assert h.index("10") == 10
    g = tmp_path / "mixed.csv"
    g.write_text("r,2\nr,10\nr,b\n")  # not all numbers: plain string order
    assert Hierarchy.from_edges(g).names[:3] == ["10", "2", "b"]
    assert Hierarchy.from_edges([("r", "-1.5"), ("r", "1e1"), ("r", "3")]).names[:3] == ["-1.5", "3", "1e1"]


@pytest.mark.parametrize("text, match", [
    ("r a b\nr c\n", r"line 1: expected 2 fields .* has 3 \(names with spaces need a comma"),
    ("r,a\nr,b,extra\n", r"line 2: expected 2 fields .* has 3"),
    ("r,a\nr b\n", r"line 2: expected 2 fields .* has 1"),
    ("r,a\nr,\n", r"line 2: empty child name"),
    ("r,a\n,b\n", r"line 2: empty parent name"),
    ("r,a\nr,b\tc\n", r"line 2: the child name 'b\\tc' contains the invisible character"),
    ("r,a\nr,b\u200b\n", r"line 2: .*U\+200B"),
])
def test_edge_list_line_errors(tmp_path, text, match):
    f = tmp_path / "tree.csv"
    f.write_text(text)
    with pytest.raises(ValueError, match=match) as exc:
        Hierarchy.from_edges(f)
    assert "tree.csv" in str(exc.value)


def test_edge_list_strips_padding_whitespace(tmp_path):
    f = tmp_path / "tree.csv"
    f.write_text("parent , child\nanimal, a/b\n animal ,a/b \nanimal,\"c \"\nroot,animal\nroot,  car\n")
    h = Hierarchy.from_edges(f)
    assert h.names == ["a/b", "c", "car", "animal", "root"]
    g = tmp_path / "tree.tsv"
    g.write_text("\ufeffparent\tchild\nroot\t golden retriever \nroot\tcat\n")  # a BOM, spaces inside a name
    assert Hierarchy.from_edges(g).names == ["cat", "golden retriever", "root"]


def test_edge_list_structure_errors_name_the_nodes(tmp_path):
    f = tmp_path / "tree.csv"
    f.write_text("root,q\nx,y\ny,x\n")
    with pytest.raises(ValueError, match=r"cycle: 'x' -> 'y' -> 'x' .*tree.csv', line 3"):
        Hierarchy.from_edges(f)
    f.write_text("animals,cat\nvehicles,car\n")
    with pytest.raises(ValueError, match=r"exactly one root .* found 2: 'animals', 'vehicles'"):
        Hierarchy.from_edges(f)
    f.write_text("r,a\na,a\n")
    with pytest.raises(ValueError, match=r"node 'a' is its own parent \('.*tree.csv', line 2\)"):
        Hierarchy.from_edges(f)
    f.write_text("r,a\nr,b\nb,a\n")
    with pytest.raises(ValueError, match=r"Node 'a' has two parents \('r' and 'b'\) \('.*tree.csv', lines 1 and 3\)"):
        Hierarchy.from_edges(f)
    with pytest.raises(ValueError, match=r"cycle and no root.*'a' -> 'b' -> 'a'"):
        Hierarchy.from_dict({"a": ["b"], "b": ["a"]})


def test_edge_list_from_open_file(tmp_path):
    import io

    h = Hierarchy.from_edges(io.StringIO("r,b\nr,a\n"))
    assert h.names == ["a", "b", "r"]
    with pytest.raises(ValueError, match="<file object>, line 1: expected 2 fields"):
        Hierarchy.from_edges(io.StringIO("r,a,b\n"))


@pytest.mark.parametrize("content, exc, match", [
    (None, FileNotFoundError, r"Cannot read hierarchy JSON '.*t.json': No such file"),
    ("", ValueError, r"'.*t.json': the file is empty"),
    ('{"parents": [2, 2,', ValueError, r"'.*t.json': not valid JSON .*line 1, column 19; the file looks truncated"),
    ("parent,child\nr,a\n", ValueError, r"'.*t.json': not valid JSON"),
    (b"\x80\x81\x00", ValueError, r"'.*t.json': not UTF-8"),
    ("[1, 2]", ValueError, r"Invalid hierarchy JSON '.*t.json': .*`parents` field, but got list"),
    ('{"parents": [2, 2, -1], "num_nodes": 5}', ValueError, r"num_nodes = 5, but .* 3"),
    ("[" * 100_000, ValueError, "nested too deeply"),
])
def test_from_json_errors_name_the_file(tmp_path, content, exc, match):
    f = tmp_path / "t.json"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    with pytest.raises(exc, match=match):
        Hierarchy.from_json(f)


def test_from_json_directory_and_open_file(tmp_path):
    import io

    with pytest.raises(IsADirectoryError, match="Cannot read hierarchy JSON .*: Is a directory"):
        Hierarchy.from_json(tmp_path)
    h = Hierarchy.from_json(io.StringIO(json.dumps({"parents": [2, 2, -1], "ids": ["a", "b", "r"]})))
    assert h.names == ["a", "b", "r"]


def test_load_hierarchy_with_a_path_points_to_the_file_readers():
    with pytest.raises(ValueError, match=r"Unknown bundled hierarchy 'my_tree.json'.*Hierarchy.from_json\(path\)"):
        hd.load_hierarchy("my_tree.json")
    with pytest.raises(ValueError, match=r"Unknown bundled hierarchy 'imagenet'; available: [a-z0-9, -]+$"):
        hd.load_hierarchy("imagenet")


def test_cached_builds_any_callable_once_with_dynamo_loaded():
    """With Dynamo loaded (any compile in the process), a cache miss builds under torch.compiler.disable;
    a builder that is a class (a cache's container) must work as well as a function, and be built once."""
    import collections

    import torch._dynamo  # noqa: F401

    h = hd.Hierarchy.from_parents([-1, 0, 0])
    box = h.cached("test.box", collections.OrderedDict)
    assert isinstance(box, collections.OrderedDict) and h.cached("test.box", collections.OrderedDict) is box
    calls = []
    assert h.cached("test.fn", lambda: calls.append(1) or 7) == 7 == h.cached("test.fn", lambda: 8)
    assert calls == [1]


def test_a_tree_unpickled_with_read_only_arrays_builds_without_warning():
    """Ray's object store hands workers read-only arrays; torch.as_tensor warned on them (seen in every Ray
    worker decoding with hd.BatchDecoder)."""
    import dataclasses
    import warnings

    h = hd.load_hierarchy("tieredimagenet-h")
    state = h.__getstate__()
    tree = state["_tree"]
    fields = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
    fields = {k: v.copy() for k, v in fields.items() if isinstance(v, np.ndarray)}
    for value in fields.values():
        value.flags.writeable = False
    state["_tree"] = dataclasses.replace(tree, **fields)
    copy = hd.Hierarchy.__new__(hd.Hierarchy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy.__setstate__(state)
    assert torch.equal(copy.parent, h.parent) and torch.equal(copy.depth, h.depth)


# --------------------------------------------------------------------------- construction errors
PARENTS = [5, 5, 6, 6, 6, 7, 7, -1]  # leaves 0..4, internal 5, 6, root 7


@pytest.mark.parametrize("parents,exc,match", [
    ([], ValueError, "non-empty tree"),
    ([-1], ValueError, "at least one leaf"),
    ([-1, -1, 0], ValueError, r"exactly one root .* found 2: nodes \[0, 1\]. Add a common root"),
    ([1, 0, 0], ValueError, "exactly one root.*found none.*cycle"),
    ([-1, 2, 1, 0], ValueError, "cycle"),
    ([-1, 1], ValueError, "cycle: node 1 is its own parent"),
    ([-1, 1, 0], ValueError, "cycle"),
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


def test_device_errors():
    h = Hierarchy.from_parents(PARENTS)
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


@pytest.mark.parametrize("parents", [[-1, 0, True], (-1, 0, False), [-1, 0, np.bool_(True)]])
def test_a_boolean_parent_is_refused_not_read_as_a_node_id(parents):
    # numpy would read True as node 1: a JSON tree with `true` in it must not build a wrong tree
    with pytest.raises(TypeError, match=r"parents\[2\]"):
        hd.Hierarchy.from_parents(parents)
    with pytest.raises(TypeError, match=r"parents\[2\]"):
        hd.Hierarchy.from_json_dict({"parents": list(parents)})


# --------------------------------------------------------------------------- scale
def test_a_chain_of_100k_nodes_compiles_without_a_depth_table():
    """A 100k chain failed with a 74.5 GiB ancestors table; building is O(N log N) whatever the depth."""
    n = 100_000
    h = hd.Hierarchy.from_parents(list(range(1, n)) + [-1])
    assert h.max_depth == n - 1 and not h.ancestor_table_fits
    assert "ancestors" not in h._cache and "levels" not in h._cache
    with pytest.raises(ValueError, match="too deep for it"):
        h.ancestors
    x = torch.ones(3, 1)
    assert hd.get_metric("tree_distance", h).decode(x).tolist() == [0, 0, 0]
    assert hd.get_metric("lca_height", h).decode(x).tolist() == [0, 0, 0]
    assert hd.get_metric("zhao", h)(torch.tensor([0, n - 1]), torch.tensor([0, 0])).tolist() == [1.0, 1.0]  # one leaf
    d = n - 1 - n // 2  # depth of node n // 2, an ancestor of the leaf: it is their LCA
    wp = hd.get_metric("wu_palmer", h)(torch.tensor([n // 2]), torch.tensor([0]), dtype=torch.float64).item()
    assert wp == pytest.approx(2 * d / (d + n - 1), rel=1e-12)
