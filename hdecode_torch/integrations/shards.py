"""Prediction shards: one ``.npz`` file per rank, written atomically, merged back in the dataset's order.

Written by :class:`~hdecode_torch.integrations.prediction_writer.DecodingPredictionWriter`; read
without Lightning by :func:`merge_shards`.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np

__all__ = ["merge_shards", "shard_name", "write_atomically"]


def shard_name(prefix: str, dataloader_idx: int, rank: int, world_size: int) -> str:
    """``<prefix>-dl<dataloader_idx>-rank<rank>-of-<world_size>.npz``, the numbers zero-padded to 5 digits."""
    return f"{prefix}-dl{dataloader_idx}-rank{rank:05d}-of-{world_size:05d}.npz"


def write_atomically(path: str, table: dict) -> None:
    """Write ``table`` ({name: array}) as an ``.npz`` at ``path``: into a temporary file beside it, then
    renamed over it (``os.replace``), so that a reader sees the old file or the whole new one."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **table)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


_SHARD = re.compile(r"(?P<prefix>.+)-dl(?P<dl>\d+)-rank(?P<rank>\d+)-of-(?P<world>\d+)\.npz")


def merge_shards(output_dir: str | os.PathLike, prefix: str = "predictions", dataloader_idx: int = 0) -> dict:
    """The shards of one prediction run as one table: ``{column: array}``, rows in the dataset's order.

    Every rank's shard of ``dataloader_idx`` must be there (one world size, ranks ``0..W-1``).  Rows
    are ordered by their dataset index (the ``"index"`` column, kept), and a row that a sampler gave
    to two ranks (padding to equal shares) is kept once, after checking both copies agree; without
    indices (an iterable dataset) the shards are concatenated in rank order.

    Returns the columns the writer wrote, each with one row per dataset row: ``"index"`` (n,) int64,
    one column per decoder ((n,) int64 node ids, or (n, N) bool node sets), the other columns
    ``predict_step`` returned and, if kept, the (n, L) scores.  Cost: reads every shard once,
    O(n log n) to order the rows.
    """
    found = {}
    for entry in os.listdir(output_dir):
        m = _SHARD.fullmatch(entry)
        if m and m["prefix"] == prefix and int(m["dl"]) == dataloader_idx:
            found[(int(m["world"]), int(m["rank"]))] = os.path.join(output_dir, entry)
    if not found:
        raise FileNotFoundError(f"No shard {shard_name(prefix, dataloader_idx, 0, 1).replace('00000', '*')} in "
                                f"{os.fspath(output_dir)!r}")
    worlds = sorted({w for w, _ in found})
    if len(worlds) != 1:
        raise ValueError(f"Expected the shards of one run, but {os.fspath(output_dir)!r} holds runs on {worlds} "
                         "processes: remove the stale shards")
    (world,) = worlds
    missing = sorted(set(range(world)) - {r for _, r in found})
    if missing:
        raise ValueError(f"Expected {world} shards, but ranks {missing} are missing in {os.fspath(output_dir)!r}")
    tables = []
    for r in range(world):
        with np.load(found[(world, r)]) as f:
            tables.append({k: f[k] for k in f.files})
    names = list(tables[0])
    table = {k: np.concatenate([t[k] for t in tables]) for k in names}
    if "index" not in table:
        return table
    index = table["index"]
    order = np.argsort(index, kind="stable")
    first = np.ones(len(index), dtype=bool)
    first[1:] = index[order][1:] != index[order][:-1]
    for k, v in table.items():
        v = v[order]
        # A duplicated row: its copies, decoded on two ranks, must agree.
        dup = ~first
        if dup.any() and not np.array_equal(v[dup], v[np.flatnonzero(dup) - 1]):
            raise ValueError(f"Row(s) {sorted(set(index[order][dup].tolist()))} were decoded on two ranks with "
                             f"different `{k}`")
        table[k] = v[first]
    return table
