"""BatchDecoder: each row's prediction is the library's own decode of it, bit for bit, whatever the
batch it comes in, before and after pickling; other columns pass through; bad input is refused."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import BatchDecoder

SPECS = ["wu_palmer", "tree_distance", "optimal:hf_beta[beta=0.5]", "hamming", "majority", "darts[lam=0.5]",
         ("confidence_threshold", {"tau": 0.3}), "hie"]
COLUMNS = ["wu_palmer_optimal", "tree_distance_optimal", "hf_beta0p5_optimal", "hamming_optimal", "majority",
           "darts0p5", "confidence_threshold0p3", "hie"]


def _tree():
    return hd.load_hierarchy("tieredimagenet-h")


def _logits(B=157, seed=0, dtype=np.float32):
    """Peaked, diffuse and sibling-confused rows: the decoders disagree on them."""
    h = _tree()
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(B, h.num_leaves)) * rng.choice([0.3, 1.0, 3.0], size=(B, 1))
    z[np.arange(B), rng.integers(0, h.num_leaves, B)] += rng.uniform(0, 8, B)
    return z.astype(dtype)


def _softmax(z):
    return torch.softmax(torch.from_numpy(z).double(), 1).to(torch.from_numpy(z).dtype).numpy()


def _direct(h, scores, from_logits):
    """What the library gives, one decoder at a time on the whole input."""
    out = {}
    for spec, col in zip(SPECS, COLUMNS):
        name = spec if isinstance(spec, str) else spec[0]
        if name in hd.list_metrics():
            out[col] = hd.functional.decode(spec, scores, h, from_logits=from_logits)
        else:
            out[col] = hd.functional.decode_with(spec, scores, h, from_logits=from_logits)
    return out


@pytest.mark.parametrize("kind", ["probs", "logits", "auto_probs", "auto_logits"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_the_library_decode(kind, dtype):
    h = _tree()
    z = _logits(dtype=dtype)
    scores = z if kind.endswith("logits") else _softmax(z)
    key = "logits" if kind.endswith("logits") else "probs"
    from_logits = "auto" if kind.startswith("auto") else None
    bd = BatchDecoder(h, SPECS, from_logits=from_logits)
    assert bd.columns == COLUMNS
    ids = np.arange(len(z)) * 10
    out = bd({key: scores, "id": ids})
    assert list(out) == [key, "id", *COLUMNS]
    assert out[key] is scores and out["id"] is ids
    want = _direct(h, torch.from_numpy(scores), "auto" if from_logits else key == "logits")
    for col in COLUMNS:
        assert isinstance(out[col], np.ndarray)
        np.testing.assert_array_equal(out[col], want[col].numpy(), err_msg=col)
    assert out["hf_beta0p5_optimal"].dtype == bool and out["hf_beta0p5_optimal"].shape == (len(z), h.num_nodes)
    assert out["wu_palmer_optimal"].dtype == np.int64
    # The rows are varied enough that the decoders disagree: the comparison is not between constants.
    assert len(np.unique(out["wu_palmer_optimal"])) > 20
    assert (out["majority"] != out["wu_palmer_optimal"]).any()


def test_does_not_depend_on_the_batching():
    h = _tree()
    z = _logits(B=211, seed=3)
    bd = BatchDecoder(h, SPECS)
    whole = bd({"logits": z})
    for cuts in ([1, 2, 50, 51, 200], [0, 0, 105, 210], list(range(0, 211, 17))):
        bounds = [0, *cuts, len(z)]
        parts = [bd({"logits": z[a:b]}) for a, b in zip(bounds, bounds[1:])]
        for col in COLUMNS:
            np.testing.assert_array_equal(np.concatenate([p[col] for p in parts]), whole[col], err_msg=col)
    # One row at a time, too, and with the rows in another order.
    perm = np.random.default_rng(0).permutation(len(z))
    shuffled = bd({"logits": z[perm]})
    for col in COLUMNS:
        np.testing.assert_array_equal(shuffled[col], whole[col][perm], err_msg=col)
    for i in (0, 77, 210):
        one = bd({"logits": z[i:i + 1]})
        for col in COLUMNS:
            np.testing.assert_array_equal(one[col][0], whole[col][i], err_msg=col)


def test_empty_batch():
    h = _tree()
    out = BatchDecoder(h, ["wu_palmer", "hf_beta[beta=0.5]"])({"probs": np.zeros((0, h.num_leaves), np.float32)})
    assert out["wu_palmer_optimal"].shape == (0,) and out["wu_palmer_optimal"].dtype == np.int64
    assert out["hf_beta0p5_optimal"].shape == (0, h.num_nodes)


def test_pickles_as_arrays_and_decodes_the_same():
    h = _tree()
    z = _logits(seed=5)
    scaler = hd.TemperatureScaler(2.5)
    bd = BatchDecoder(h, [*SPECS, hd.get_metric("zhao", h), hd.get_decoder("top_down", h)], calibrator=scaler)
    blob = pickle.dumps(bd)
    copy = pickle.loads(blob)
    assert copy.columns == bd.columns[:-2] + ["zhao_optimal", "top_down"] == bd.columns
    assert copy.calibrator.temperature == pytest.approx(2.5)
    a, b = bd({"logits": z}), copy({"logits": z})
    for col in bd.columns:
        np.testing.assert_array_equal(a[col], b[col], err_msg=col)
    # The tree goes as its arrays: no tensor of the tree's tables is in the pickle.
    assert len(blob) < 200_000


def test_calibrator_is_applied_to_the_logits_first():
    h = _tree()
    z = _logits(seed=7)
    scaler = hd.TemperatureScaler(3.0)
    bd = BatchDecoder(h, ["wu_palmer", "majority"], calibrator=scaler)
    out = bd({"logits": z})
    with torch.no_grad():
        cooled = scaler(torch.from_numpy(z))
    np.testing.assert_array_equal(out["wu_palmer_optimal"],
                                  hd.functional.decode("wu_palmer", cooled, h, from_logits=True).numpy())
    np.testing.assert_array_equal(out["majority"],
                                  hd.functional.decode_with("majority", cooled, h, from_logits=True).numpy())
    # The temperature changes answers on these rows (else the test could not tell it was applied).
    plain = BatchDecoder(h, ["wu_palmer"])({"logits": z})["wu_palmer_optimal"]
    assert (plain != out["wu_palmer_optimal"]).any()
    # The caller's module is copied, not moved or switched to eval mode.
    assert scaler.training and bd.calibrator is not scaler


def test_tensor_input_gives_tensors_and_keep_scores_false_drops_them():
    h = _tree()
    z = torch.from_numpy(_logits(seed=9))
    out = BatchDecoder(h, ["wu_palmer", "hf_beta[beta=2]"], keep_scores=False)({"logits": z, "y": [1, 2]})
    assert list(out) == ["y", "wu_palmer_optimal", "hf_beta2_optimal"]
    assert isinstance(out["wu_palmer_optimal"], torch.Tensor)
    assert torch.equal(out["wu_palmer_optimal"], hd.get_metric("wu_palmer", h).decode(z, from_logits=True))
    assert torch.equal(out["hf_beta2_optimal"], hd.functional.decode("hf_beta", z, h, beta=2.0, from_logits=True))


def test_predict_returns_the_new_columns_only():
    h = _tree()
    p = _softmax(_logits(seed=11))
    bd = BatchDecoder(h, ["wu_palmer", "majority"])
    got = bd.predict(p)
    assert list(got) == ["wu_palmer_optimal", "majority"]
    np.testing.assert_array_equal(got["majority"], hd.functional.decode_with("majority", torch.from_numpy(p), h))
    z = _logits(seed=11)
    got = BatchDecoder(h, ["wu_palmer"], from_logits=True).predict(z)
    np.testing.assert_array_equal(got["wu_palmer_optimal"],
                                  hd.functional.decode("wu_palmer", torch.from_numpy(z), h, from_logits=True))


def test_gpu_plan_equals_the_library_decode_under_it():
    h = _tree()
    z = _logits(seed=13)
    with hd.plan_for("cuda"):
        out = BatchDecoder(h, SPECS)({"logits": z})
        want = _direct(h, torch.from_numpy(z), True)
    for col in COLUMNS:
        np.testing.assert_array_equal(out[col], want[col].numpy(), err_msg=col)


def test_bad_input_and_arguments_are_refused():
    h = _tree()
    p = _softmax(_logits(B=8))
    bd = BatchDecoder(h, ["wu_palmer"])
    with pytest.raises(ValueError, match="exactly one of the columns 'probs' and 'logits'"):
        bd({"probs": p, "logits": p})
    with pytest.raises(ValueError, match="exactly one of the columns"):
        bd({"data": p})
    with pytest.raises(TypeError, match="dict of columns"):
        bd(p)
    bad = p.copy()
    bad[3] *= 2
    with pytest.raises(ValueError, match="row 3"):
        bd({"probs": bad})
    with pytest.raises(ValueError, match=r"\(B, L\) floating-point"):
        bd({"probs": p[0]})
    with pytest.raises(ValueError, match="a logits column with from_logits=True"):
        BatchDecoder(h, ["wu_palmer"], from_logits=True)({"probs": p})
    with pytest.raises(ValueError, match="`from_logits` to be True or None with a `calibrator`"):
        BatchDecoder(h, ["wu_palmer"], from_logits=False, calibrator=hd.TemperatureScaler())
    with pytest.raises(ValueError, match="'logits' column with a `calibrator`"):
        BatchDecoder(h, ["wu_palmer"], calibrator=hd.TemperatureScaler())({"probs": p})
    with pytest.raises(TypeError, match="`decoders` to be a non-empty list"):
        BatchDecoder(h, "wu_palmer")
    with pytest.raises(TypeError, match="`decoders` to be a non-empty list"):
        BatchDecoder(h, [])
    with pytest.raises(ValueError, match="requested twice"):
        BatchDecoder(h, ["wu_palmer", "optimal:wu_palmer"])
    with pytest.raises(ValueError, match="Unknown decoder"):
        BatchDecoder(h, ["no_such_thing"])
    other = hd.load_hierarchy("inat19")
    with pytest.raises(ValueError, match="to be on"):
        BatchDecoder(h, [hd.get_decoder("majority", other)])
    with pytest.raises(TypeError, match="`calibrator` to be an nn.Module"):
        BatchDecoder(h, ["wu_palmer"], calibrator=lambda z: z)
    with pytest.raises(TypeError, match="`keep_scores` to be a bool"):
        BatchDecoder(h, ["wu_palmer"], keep_scores="no")
