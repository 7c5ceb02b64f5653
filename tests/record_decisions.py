"""The decisions of every decoder on both bundled trees, recorded once, so that a change meant to keep
every decision bit-identical (a refactoring, a faster kernel) proves it: ``test_recorded_decisions.py``
decodes the same rows and compares digests with ``data/recorded_decisions.json``.

Run ``python tests/record_decisions.py`` to write the file anew (only when decisions are meant to change,
saying why in the commit).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy as np
import torch

import hdecode_torch as hd

PATH = pathlib.Path(__file__).parent / "data" / "recorded_decisions.json"
TREES = ("tieredimagenet-h", "inat19")
PLANS = ("cpu", "cuda")
DTYPES = {"float64": torch.float64, "float32": torch.float32}
ROWS = 96
#: Every registered metric's optimal decoder and every heuristic, at the parameters of the command line's
#: defaults and one more setting each where a parameter changes the answer.
DECODERS = ("optimal:accuracy", "optimal:lca_height", "optimal:tree_distance", "optimal:tree_distance_c[c=0.5]",
            "optimal:wu_palmer", "optimal:zhao", "optimal:hf_beta[beta=0.5]", "optimal:hf_beta[beta=1]",
            "optimal:hf_beta[beta=2]", "optimal:hamming", "optimal:jaccard",
            "argmax_leaf", "top_down", "confidence_threshold[tau=0.8]", "confidence_threshold[tau=0.3]", "majority",
            "plurality", "darts[lam=1]", "darts[lam=0]", "expected_information", "information_threshold[threshold=1]",
            "hie", "crm")


def rows(h: hd.Hierarchy, seed: int) -> np.ndarray:
    """(ROWS, L) float64 model-like rows: peaked, diffuse, confused between cousins, and a share on a shallow
    leaf, a quarter each."""
    rng = np.random.default_rng(seed)
    L = h.num_leaves
    q = ROWS // 4
    anc, depth = h.ancestors.numpy(), h.depth.numpy()
    peaked = rng.normal(size=(q, L)) * 2
    peaked[np.arange(q), rng.integers(0, L, q)] += rng.uniform(4, 10, q)
    diffuse = rng.normal(size=(q, L)) * 0.5
    confused = rng.normal(size=(q, L))
    y = rng.integers(0, L, q)
    d = np.maximum(1, (rng.uniform(size=q) * np.maximum(1, depth[y])).astype(np.int64))
    confused += rng.uniform(2, 5, q)[:, None] * (anc[:L][:, d].T == anc[y, d][:, None])
    logits = np.concatenate([peaked, diffuse, confused])
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    shallow_leaves = np.flatnonzero(depth[:L] <= np.sort(depth[:L])[min(L - 1, 20)])
    share = rng.uniform(0.35, 0.55, q)
    s = np.exp(rng.normal(size=(q, L)))
    s = s / s.sum(1, keepdims=True) * (1 - share)[:, None]
    s[np.arange(q), rng.choice(shallow_leaves, q)] += share
    return np.concatenate([p, s])


def digest(pred: torch.Tensor) -> str:
    """sha256 of the decision: int64 node ids, or the (B, N) bool sets packed as bytes."""
    a = pred.cpu().numpy()
    a = np.packbits(a, axis=-1) if a.dtype == bool else a.astype(np.int64)
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def decisions() -> dict:
    out = {}
    for t, tree in enumerate(TREES):
        h = hd.load_hierarchy(tree)
        p64 = torch.from_numpy(rows(h, 100 + t))
        for dname, dtype in DTYPES.items():
            p = p64.to(dtype)
            for plan in PLANS:
                with hd.plan_for(plan):
                    for spec in DECODERS:
                        out[f"{tree}/{dname}/{plan}/{spec}"] = digest(hd.get_decoder(spec, h).decode(p))
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    PATH.parent.mkdir(exist_ok=True)
    PATH.write_text(json.dumps(decisions(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PATH}", file=sys.stderr)
