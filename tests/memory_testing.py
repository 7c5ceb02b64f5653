"""Peak memory of a call, measured in a fresh subprocess, and the top-k decoders' growth on the 100k-leaf tree.

:func:`peak_growths` runs a snippet in a child process under an address-space cap: the snippet builds its
tree and input, warms the tree's cached tables on one row, and calls ``growth(call)`` for each call to
measure; the peak resident memory is reset (``/proc/self/clear_refs``) before the call and its growth read
back from ``VmHWM``.

:func:`top_k_growths_once` is one such child for every top-k decoder of the suite: the 100k-leaf synthetic
tree (B = 1,024 lists of k = 100 leaves) takes seconds to build and its tables hundreds of MiB, so it is built
once per test session (the ``top_k_growths`` fixture of conftest.py) and each top-k memory test asserts its own
decoders' bound from the labelled result.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import hdecode_torch as hd

ROOT = pathlib.Path(hd.__file__).resolve().parent.parent
MiB = 2**20

#: Peak memory is read from Linux's /proc/self/status and reset through /proc/self/clear_refs.
needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                                reason="peak memory is read from Linux's /proc/self/status")

CHILD = """
import resource
import torch
torch.set_num_threads(1)
import hdecode_torch as hd
# The cap counts from what the imports mapped: a CUDA build of torch maps gigabytes of libraries, which an
# absolute cap set before the import would refuse.
with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + {cap}, mapped + {cap}))


def caterpillar(depth):
    # a spine of `depth` internal nodes with one leaf at every level, two under the deepest
    return hd.Hierarchy.from_parents([-1] + list(range(depth - 1)) + list(range(depth)) + [depth - 1])


def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def growth(call, label=""):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from the current one
    before = rss("VmRSS:")
    call()
    print("GROWTH", rss("VmHWM:") - before, label, flush=True)


torch.manual_seed(0)
{code}
"""


def _run_child(code: str, cap: int) -> subprocess.CompletedProcess:
    # A fixed mmap threshold: glibc returns every large block when it is freed, so the resident peak is
    # what the library held at once, not what the allocator kept of earlier chunks.
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", CHILD.format(cap=cap, code=textwrap.dedent(code))],
                          capture_output=True, text=True, env=env, timeout=600)


def peak_growths(code: str, cap: int = 2 * 2**30) -> list[int]:
    """The peak resident memory growth (bytes) of each ``growth(call)`` that ``code`` makes, in a fresh
    process capped at ``cap`` bytes of address space beyond its imports (a failed allocation fails the test with the
    child's error).  One process for several calls: starting one costs seconds on a busy machine."""
    done = _run_child(code, cap)
    assert done.returncode == 0, done.stderr[-3000:]
    return [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("GROWTH")]


# ------------------------------------------------------------------------- the top-k decoders on the 100k tree
#: Every top-k decoder's calls on the 100k-leaf tree, each labelled ``"<group>: <what> <plan>"``; a call that
#: raises is reported as ``FAILED<tab><label><tab><error>`` and the others are still measured.  The groups are the
#: tests' (test_topk*.py); the budget is the default but in the last group.
TOP_K_CODE = """
import traceback

from benchmarks.topk import drawn_lists
from benchmarks.workloads import random_tree

h = hd.Hierarchy.from_parents(random_tree(100_000, 12, seed=1))
B, k, L = 1024, 100, h.num_leaves
g = torch.Generator().manual_seed(0)
rank = torch.empty_like(h.dfs_leaves)
rank[h.dfs_leaves] = torch.arange(L)
near = torch.rand(B, 5 * k, generator=g).topk(k).indices  # cousins of a random leaf, in depth-first order
indices = h.dfs_leaves[(rank[torch.randint(0, L, (B,), generator=g)][:, None] + near) % L]
values = torch.distributions.Dirichlet(torch.full((k,), 0.3)).sample((B,)) * torch.rand(B, 1)
topk, first = hd.TopK(values, indices), hd.TopK(values[:1], indices[:1])
torch.manual_seed(0)
drawn = drawn_lists(h, 1024, 100)  # the lists sorted, their scale drawn from the generator too
drawn_first = hd.TopK(drawn.values[:1], drawn.indices[:1])
PLANS = ("cpu", "cuda")


def measure(label, call, warm=None):
    try:
        if warm is not None:
            warm()  # the tree's tables
        growth(call, label)
    except Exception:  # one decoder's failure fails its own test, not the others'
        print(f"FAILED\\t{label}\\t" + traceback.format_exc().replace("\\n", " | "), flush=True)


def decode_on_plans(group, m, name, lists=topk, warm=first, **kw):
    what = "certify" if kw.get("certify") else "decode"
    for plan in PLANS:
        with hd.plan_for(plan):
            measure(f"{group}: {name} {what} {plan}", lambda: m.decode(lists, **kw), lambda: m.decode(warm, **kw))


for name in ("accuracy", "lca_height", "tree_distance", "tree_distance_c"):
    decode_on_plans("metrics", hd.get_metric(name, h), name)
for name in ("accuracy", "lca_height", "tree_distance"):
    decode_on_plans("certificate", hd.get_metric(name, h), name, certify=True)
params = {"confidence_threshold": {"tau": 0.8}, "darts": {"lam": 1.0}, "information_threshold": {"threshold": 5.0}}
for name in ("argmax_leaf", "top_down", "majority", "confidence_threshold", "crm", "plurality", "hie", "darts",
             "expected_information", "information_threshold"):
    decode_on_plans("heuristics", hd.get_decoder(name, h, **params.get(name, {})), name)
# below 1/2 the passing nodes leave the root path: another kernel
decode_on_plans("heuristics", hd.get_decoder("confidence_threshold", h, tau=0.3), "confidence_threshold[tau=0.3]")
rc = hd.decoders.RiskControl(h)
rc.lam = 0.05
decode_on_plans("heuristics", rc, "risk_control")


def expected_of_the_decision(label, m):
    sets = []  # decided outside the measure, as a user holds the sets before scoring them
    measure(label, lambda: m.expected(topk, sets[0]), lambda: sets.append(m.decode(topk)))


for beta in (1.0, 0.5):
    m = hd.get_metric("hf_beta", h, beta=beta)
    decode_on_plans("hf_beta", m, f"hf_beta[beta={beta}]")
expected_of_the_decision("hf_beta: hf_beta[beta=0.5] expected", m)
m = hd.get_metric("jaccard", h)
decode_on_plans("jaccard", m, "jaccard")
expected_of_the_decision("jaccard: jaccard expected", m)
m = hd.get_metric("hamming", h)
for plan in PLANS:
    with hd.plan_for(plan):
        measure(f"sets: hamming decode {plan}", lambda: m.decode(topk), lambda: m.expected(first, m.decode(first)))
        expected_of_the_decision(f"sets: hamming expected {plan}", m)
        measure(f"sets: hamming certify {plan}", lambda: m.decode(topk, certify=True))
for name in ("wu_palmer", "zhao"):
    decode_on_plans("wu_palmer_zhao", hd.get_metric(name, h), name, lists=drawn, warm=drawn_first)
hd.set_memory_budget(32 * 2**20)  # the rows in chunks whose support tables fit it
for name in ("lca_height", "tree_distance"):
    measure(f"budget: {name} decode", lambda: hd.get_metric(name, h).decode(topk))
"""


def top_k_growths_once(tmp_path_factory):
    """The growths of :data:`TOP_K_CODE`'s calls, measured by one child for the whole test session: under
    pytest-xdist the first worker to ask runs it and the others read its result (a file beside their temporary
    folders, under a lock), so the 100k tree is built once, not once per test or per worker.

    Returns ``growths(group) -> {label: growth in bytes}`` of the calls of ``group`` (a call that raised: its
    error, a str); a child that failed fails every test that asks, with its error."""
    from filelock import FileLock  # a dependency of torch

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("peak memory is read from Linux's /proc/self/status")
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "top_k_growths.json"
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            done = json.loads(path.read_text())
        else:
            child = _run_child(TOP_K_CODE, 3 * 2**30)
            done = {"returncode": child.returncode, "stdout": child.stdout, "stderr": child.stderr[-3000:]}
            path.write_text(json.dumps(done))
    return functools.partial(_growths_of, done)


def _growths_of(done: dict, group: str) -> dict[str, int | str]:
    assert done["returncode"] == 0, done["stderr"]
    out = {}
    for line in done["stdout"].splitlines():
        word, rest = line.split(" ", 1) if " " in line else (line, "")
        if word == "GROWTH":
            size, label = rest.split(" ", 1)
            out[label] = int(size)
        elif line.startswith("FAILED\t"):
            _, label, error = line.split("\t", 2)
            out[label] = error
    return {label: got for label, got in out.items() if label.startswith(group + ": ")}


def assert_growths_below(got: dict[str, int | str], count: int, bound: int) -> None:
    """Each of the ``count`` calls of ``got`` ran and grew by less than ``bound`` bytes; the message names
    every call that raised or grew past it, with its growth."""
    assert len(got) == count, f"expected {count} measured calls, got {sorted(got)}"
    failed = {label: g for label, g in got.items() if isinstance(g, str)}
    assert not failed, failed
    over = {label: f"{g / MiB:.1f} MiB" for label, g in got.items() if g >= bound}
    assert not over, f"grew past the {bound / MiB:g} MiB bound: {over}"
