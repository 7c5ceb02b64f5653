"""What the fused ops share besides their registration: argument checks, index checks read once per
index tensor (:func:`trust_indices`), and index tables derived once per index tensor (:func:`derived`).

Checks raise ValueError / TypeError naming the argument.  Shape, dtype and device checks read no
value (the fake kernels run them too); index checks read each index tensor once (a host sync on
the CPU, a device-side assert on CUDA) and remember it until the tensor changes.
"""

from __future__ import annotations

import operator
import weakref
from typing import Callable, Hashable

import torch

__all__ = ["FLOAT_INPUTS", "OUT_DTYPES", "check_float_tensor", "check_vector", "check_ranges", "check_index_values",
           "check_bounds", "trust_indices", "derived", "CACHE_ENTRIES", "check_tables_once"]

FLOAT_INPUTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OUT_DTYPES = (torch.float32, torch.float64)


def check_float_tensor(x, name: str, shape: str = "(B, M)", dtypes=FLOAT_INPUTS,
                       dtype_names: str = "float16, bfloat16, float32 or float64") -> None:
    """``x`` is a tensor of ``shape`` (its number of dimensions) and one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a Tensor, but got {type(x).__name__}")
    dims = shape.count(",") + 1
    if x.dim() != dims:
        raise ValueError(f"Expected `{name}` to be a {dims}-D {shape} tensor, but got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise TypeError(f"Expected `{name}` to be {dtype_names}, but got {x.dtype}")


def check_vector(t, name: str, dtype: torch.dtype, device: torch.device, size: int | None = None) -> None:
    """``t`` is a 1-D tensor of ``dtype`` on ``device`` (with ``size`` entries when given)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a Tensor, but got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"Expected `{name}` to be 1-D, but got shape {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"Expected `{name}` to be {dtype}, but got {t.dtype}")
    if t.device != device:
        raise ValueError(f"Expected `{name}` on the device of `x` ({device}), but got {t.device}")
    if size is not None and t.shape[0] != size:
        raise ValueError(f"Expected `{name}` to have {size} entries, but got {t.shape[0]}")


def check_ranges(x, src, weight, hi, lo) -> None:
    """Shapes, dtypes and devices of the range-sum arguments ``x, src, weight, hi, lo`` (no value is read)."""
    check_float_tensor(x, "x")
    check_vector(src, "src", torch.int64, x.device)
    if weight is not None:
        check_vector(weight, "weight", torch.float64, x.device, src.shape[0])
    check_vector(hi, "hi", torch.int64, x.device)
    if lo is not None:
        check_vector(lo, "lo", torch.int64, x.device, hi.shape[0])


def trust_indices(t: torch.Tensor, top: int) -> torch.Tensor:
    """Mark an index tensor built correct by construction (``0 <= t <= top``) as checked; returns it.

    For tables the library derives from a validated tree: their first use then needs no host read.
    """
    derived(("in range", top), (t,), bool)
    return t


def check_index_values(x, src, hi, lo) -> None:
    """Every index in range: ``0 <= src < M``, ``0 <= hi, lo <= J``.

    An index tensor that passed against the same bound and was not modified since is not read
    again.  On CPU a violation raises ValueError.  On CUDA the check is queued with ``torch._assert_async``
    (a device-side assert, like an out-of-range ``index_select`` on CUDA): no host sync, so the ops
    stay asynchronous and CUDA-graph capturable, and the failed assert stops the stream before the
    Triton kernel queued after it can read out of bounds.
    """
    m, j = x.shape[1], src.shape[0]
    checks = [(src, m - 1, "src", "M - 1 = x.shape[1] - 1"), (hi, j, "hi", "J = len(src)")]
    if lo is not None:
        checks.append((lo, j, "lo", "J = len(src)"))
    check_bounds(checks)


def check_bounds(checks, remember: bool = True, trusted_ok: bool = False) -> None:
    """``0 <= t <= top`` for every ``(t, top, name, what)`` of ``checks`` (see :func:`check_index_values`).

    ``remember=False`` for data tensors (e.g. per-batch counts) that are checked on every call, unless
    ``trusted_ok`` and their producer marked them with :func:`trust_indices`.
    """
    for t, top, name, what in checks:
        if t.numel() == 0 or t.device.type == "meta":
            continue
        check = (lambda t=t, top=top, name=name, what=what: _check_range(t, top, name, what))
        if not (remember or trusted_ok):
            check()
            continue
        # Read once per tensor and version (:func:`derived`: the library passes the same cached tree tables on
        # every call, and a read is a host sync); a CUDA check is queued, not yet known to pass: not kept.
        derived(("in range", top), (t,), check, None if remember and t.device.type != "cuda" else _never)


def _check_range(t: torch.Tensor, top: int, name: str, what: str) -> bool:
    """True if ``0 <= t <= top`` (read on the host), ValueError naming ``name`` otherwise; on CUDA queued."""
    if t.device.type == "cuda":
        lo_v, hi_v = torch.aminmax(t)
        torch._assert_async((lo_v >= 0) & (hi_v <= top), f"`{name}` out of range [0, {what}]")
        return True
    lo_v, hi_v = (int(v) for v in torch.aminmax(t))
    if lo_v < 0 or hi_v > top:
        bad = lo_v if lo_v < 0 else hi_v
        raise ValueError(f"Expected every entry of `{name}` in [0, {what}] = [0, {top}], but got {bad}")
    return True


def _never(_) -> bool:
    """A ``keep`` of :func:`derived` that keeps nothing: look up, never insert."""
    return False


#: Tables derived from index tensors (or from constants alone) and index checks passed (:func:`check_bounds`), by
#: (tag, ids of the sources): (weak references, versions, value), least recently used first.
_DERIVED: dict[tuple, tuple] = {}

#: Entries :data:`_DERIVED` keeps: a tree's tables go with its tensors, but the tables of a width (a set per
#: candidate count a row brings, ``jaccard_sets``' of at most 2^16 float64 cells each: 64 MiB at most) would
#: accumulate.  A one-row Jaccard call reads six or seven.
CACHE_ENTRIES = 128

_version = operator.attrgetter("_version")


def derived(tag: Hashable, sources: tuple, build: Callable[[], object], keep: Callable[[object], bool] | None = None):
    """``build()``, computed once per set of ``sources`` tensors and reused while none of them changes.

    For index tables an op derives from its index arguments (reordered ranges, remapped endpoints) and
    for the tables of a width (``sources`` empty): the library passes the same cached tree tables on every
    call, so the derivation runs once per tree rather than once per call.  ``tag`` (hashable) names the
    derivation and holds every non-tensor input of ``build``.  Inference tensors (no version counter) are
    never cached, nor a value ``keep`` rejects.  At most ``CACHE_ENTRIES`` entries, the least recently used
    dropped: a call reads and inserts several, and clearing a full cache would drop the first before the
    call's next read.  An entry also goes with any of its sources.  O(1) a lookup.
    """
    try:
        versions = tuple(map(_version, sources))
    except RuntimeError:
        return build()
    key = (tag, *map(id, sources))
    entry = _DERIVED.pop(key, None)
    # An entry's sources are alive (a dead one's weak reference removes the entry before its id can
    # be reused), so equal ids are the same tensors.
    if entry is not None and entry[1] == versions:
        _DERIVED[key] = entry  # the most recently used
        return entry[2]
    value = build()
    if keep is not None and not keep(value):
        return value
    refs = tuple(weakref.ref(t, lambda _, key=key, table=_DERIVED: table.pop(key, None)) for t in sources)
    _DERIVED[key] = (refs, versions, value)
    over = len(_DERIVED) - CACHE_ENTRIES
    if over > 0:  # (a negative slice end would drop entries below the limit)
        for old in list(_DERIVED)[:over]:  # a snapshot: another thread may insert meanwhile
            _DERIVED.pop(old, None)
    return value


def check_tables_once(tag: str, x: torch.Tensor, tables: tuple, check: Callable[[], None]) -> None:
    """Run ``check()``, the checks of an op's tree tables ``tables`` (index and weight tensors, None
    entries skipped) against ``x``'s device and row length, once per set of tables (:func:`derived`):
    the library passes the same cached tables on every call, whose shapes, dtypes, devices and index
    values cannot change without a new version.  ``x`` itself is the caller's to check on every call;
    ``tag`` names the op and holds every other input of ``check``."""
    check_float_tensor(x, "x")
    tables = tuple(t for t in tables if t is not None)
    if not all(isinstance(t, torch.Tensor) for t in tables):
        check()  # raises the argument's error
        return
    derived(f"checked/{tag}/{x.device}/{x.shape[1]}", tables, lambda: check() or True)
