"""Hostile inputs through every subcommand and every file reader.

The contract: a clear one-line error (exit status 1 or 2, no traceback, no "internal error") or a
correct result; and no existing file other than the requested output ever changes (inputs never,
even when named as the output).  Most cases run ``main()`` in-process (fast); one child process
runs, one after the other, what only a real process shows: a closed stdout, a full stdout, a
file-size limit, a real SIGINT.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hdecode_torch as hd
from hdecode_torch import Hierarchy
from hdecode_torch.cli.main import main
from hdecode_torch.synthetic import synthetic_outputs

TREE = "parent,child\nroot,x\nroot,y\nroot,e\nx,a\nx,b\ny,z\nz,c\nz,d\n"  # 5 leaves a..e


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder of good and hostile files; returns (folder, {name: path}, good probabilities)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("hostile")
    (d / "tree.csv").write_text(TREE)
    h = Hierarchy.from_edges(d / "tree.csv")
    probs, y = synthetic_outputs(h, 12, 1.0, seed=0, dtype=torch.float64)
    np.save(d / "good.npy", probs.numpy())
    np.savetxt(d / "good.csv", probs.numpy(), delimiter=",", fmt="%.17g")
    np.save(d / "logits.npy", (2 * probs.log()).numpy())
    np.save(d / "y.npy", y.numpy())
    np.savetxt(d / "y.txt", y.numpy(), fmt="%d")
    h.to_json(d / "tree.json")
    (d / "order.txt").write_text("e\nd\nc\nb\na\n")
    # hostile files
    (d / "empty.npy").write_bytes(b"")
    (d / "empty.pt").write_bytes(b"")
    (d / "empty.csv").write_text("")
    (d / "header_only.csv").write_text("a,b,c,d,e\n")
    (d / "ragged.csv").write_text("0.2,0.2,0.2,0.2,0.2\n0.5,0.5\n")
    (d / "bad_cell.csv").write_text("NA,0.25,0.25,0.25,0.25\n")
    (d / "trunc.npy").write_bytes((d / "good.npy").read_bytes()[:150])
    torch.save(probs, d / "good.pt")
    (d / "trunc.pt").write_bytes((d / "good.pt").read_bytes()[:200])
    np.save(d / "wrong_shape.npy", probs.numpy()[:, :3])
    np.save(d / "three_d.npy", probs.numpy()[None])
    nan = probs.clone()
    nan[3, 1] = float("nan")
    np.save(d / "nan.npy", nan.numpy())
    np.save(d / "negative.npy", (probs - 0.5).numpy())
    np.save(d / "bool.npy", probs.numpy() > 0.2)
    np.save(d / "complex.npy", probs.numpy().astype(np.complex64))
    np.save(d / "int8.npy", (probs.numpy() * 100).astype(np.int8))
    np.save(d / "big_endian.npy", probs.numpy().astype(">f8"))
    np.save(d / "object.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (d / "garbage.npy").write_text("this is not an array\n")
    (d / "garbage.csv").write_bytes(b"\x89\xff\x00\x01binary")
    (d / "garbage.json").write_text("{not json")
    (d / "cycle.csv").write_text("r,a\na,b\nb,a\n")
    (d / "three_fields.csv").write_text("r,a,b\n")
    np.save(d / "y_range.npy", np.full(12, 7))
    np.save(d / "y_float.npy", np.full(12, 0.5))
    np.save(d / "y_short.npy", y.numpy()[:5])
    (d / "dir.npy").mkdir()
    for name in ("existing.npy", "existing.csv", "existing.json", "existing.png", "existing.jsonl"):
        (d / name).write_bytes(b"precious old content")
    os.symlink(d / "good.npy", d / "link_to_good.npy")
    files = {p.name: str(p) for p in d.iterdir()}
    files["missing.npy"] = str(d / "missing.npy")
    yield d, files, h, probs
    torch.set_num_threads(before)


def snapshot(folder) -> dict:
    out = {}
    for root, dirs, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            else:
                with open(p, "rb") as f:
                    out[p] = f.read()
    return out


def run_main(argv, stdin: bytes = b"") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def assert_clean_failure(code, err, argv):
    assert code in (1, 2), (code, argv, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and errors[0].startswith("hdecode"), (argv, err)
    assert err.strip().splitlines()[-1].strip() == errors[0].strip(), (argv, err)  # the last line says what failed


# --------------------------------------------------------------------------- argv strategies
# Valid command lines, each then hit by up to three hostile changes (a bad file, a bad output path,
# a bad number, a stray or inapplicable option, a dropped argument, standard input).
BASES = [
    ["compare", "--hierarchy", "tree.csv", "--probs", "good.npy", "--targets", "y.npy", "--metrics", "zhao,hf_beta",
     "--betas", "1", "--decoders", "majority", "--json", "new.json", "--no-progress"],
    ["compare", "--hierarchy", "tree.csv", "--num-samples", "20", "--metrics", "zhao", "--decoders", "majority",
     "--json", "new.json", "--no-progress"],
    ["decode", "--hierarchy", "tree.csv", "--probs", "good.npy", "--metric", "zhao", "--output", "new.npy",
     "--no-progress"],
    ["decode", "--hierarchy", "tree.csv", "--probs", "good.csv", "--metric", "hf_beta", "--no-progress"],
    ["decode", "--hierarchy", "tree.json", "--probs", "logits.npy", "--from-logits", "--calibrate", "--targets",
     "y.txt", "--decoder", "darts", "--output", "new.csv", "--no-progress"],
    ["info", "--hierarchy", "tree.csv", "--json"],
    ["plot", "agreement", "--resolution", "6", "--output", "new.png"],
    ["plot", "gain", "--hierarchy", "tree.csv", "--metrics", "tree_distance", "--decoders", "majority", "--noise", "1",
     "--num-seeds", "1", "--num-samples", "15", "--output", "new.png", "--json", "new.json", "--no-progress"],
]
INPUTS = ["good.npy", "good.csv", "good.pt", "logits.npy", "link_to_good.npy", "empty.npy", "empty.pt", "empty.csv",
          "header_only.csv", "ragged.csv", "bad_cell.csv", "trunc.npy", "trunc.pt", "wrong_shape.npy", "three_d.npy",
          "nan.npy", "negative.npy", "bool.npy", "complex.npy", "int8.npy", "big_endian.npy", "object.npy",
          "garbage.npy", "garbage.csv", "dir.npy", "missing.npy", "tree.csv", "-"]
TARGETS = ["y.npy", "y.txt", "y_range.npy", "y_float.npy", "y_short.npy", "empty.npy", "garbage.csv", "good.npy",
           "missing.npy", "dir.npy", "-"]
TREES = ["tree.csv", "tree.json", "cycle.csv", "three_fields.csv", "garbage.json", "garbage.csv", "empty.csv",
         "missing.npy", "dir.npy", "inat19", "no_such_tree", "-"]
OUTPUTS = ["new.npy", "new.csv", "new.jsonl", "new.pt", "new.json", "new", "new.txt", "new.png", "existing.npy",
           "existing.csv", "existing.jsonl", "existing.json", "existing.png", "good.npy", "link_to_good.npy", "y.npy",
           "tree.csv", "dir.npy", "nodir/out.npy", "/proc/x.npy", "-", ""]
NUMBERS = ["1", "2", "0.5", "0.3", "3", "0", "-1", "nan", "1e400", "abc", "99999999999999999999"]
VALUE_FLAGS = {
    "--probs": INPUTS, "--targets": TARGETS, "--hierarchy": TREES, "--output": OUTPUTS, "--json": OUTPUTS,
    "--leaf-order": ["order.txt", "missing.npy", "garbage.csv", "-"],
    "--metrics": ["zhao", "jaccard", "nope", ",", "hf,hf_beta", "tree_distance_c"],
    "--metric": ["wu_palmer", "jaccard", "nope", "zhao,hamming"],
    "--decoders": ["all", "optimal", "nope", ",", "darts,darts"], "--decoder": ["majority", "nope", "crm"],
}
PARAMS = ["--beta", "--c", "--tau", "--lam", "--info-threshold"]
NUMBER_FLAGS = {  # the numeric options each subcommand takes
    "compare": PARAMS + ["--betas", "--seed", "--batch-size", "--threads", "--num-samples", "--noise", "--width",
                         "--calibration-split"],
    "decode": PARAMS + ["--seed", "--batch-size", "--threads", "--calibration-split"],
    "info": [],
    "plot agreement": PARAMS + ["--resolution", "--dpi"],
    "plot gain": PARAMS + ["--betas", "--seed", "--batch-size", "--threads", "--num-samples", "--noise", "--num-seeds",
                           "--dpi"],
}
VALUE_FLAG_OF = {"compare": ["--probs", "--targets", "--hierarchy", "--leaf-order", "--json", "--metrics",
                             "--decoders"],
                 "decode": ["--probs", "--targets", "--hierarchy", "--leaf-order", "--output", "--metric", "--decoder"],
                 "info": ["--hierarchy", "--leaf-order"],
                 "plot agreement": ["--output", "--metric", "--decoders"],
                 "plot gain": ["--hierarchy", "--leaf-order", "--output", "--json", "--metrics", "--decoders"]}
SWITCHES = ["--from-logits", "--normalize", "--names", "--calibrate", "--from-logits", "--normalize", "--bogus"]
STDIN_DATA = [b"", b"garbage\n1,2\n", None]  # None: the good probabilities as .npy bytes


@st.composite
def command(draw):
    argv = list(draw(st.sampled_from(BASES)))
    cmd = " ".join(argv[:2]) if argv[0] == "plot" else argv[0]
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["value", "value", "value", "number", "number", "switch", "drop"]))
        if kind == "number" and not NUMBER_FLAGS[cmd]:
            kind = "value"
        if kind == "value":
            flag = draw(st.sampled_from(VALUE_FLAG_OF[cmd]))
            value = draw(st.sampled_from(VALUE_FLAGS[flag]))
            if flag in argv and argv.index(flag) + 1 < len(argv):
                argv[argv.index(flag) + 1] = value
            else:
                argv += [flag, value]
        elif kind == "number":
            flag = draw(st.sampled_from(NUMBER_FLAGS[cmd]))
            value = draw(st.sampled_from(NUMBERS))
            if flag in argv:
                argv[argv.index(flag) + 1] = value
            else:
                argv += [flag, value]
        elif kind == "switch":
            argv.append(draw(st.sampled_from(SWITCHES)))
        elif len(argv) > 3:
            i = draw(st.integers(2, len(argv) - 1))
            del argv[i]
    outputs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--output", "--json") and i > 0]
    inputs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--probs", "--targets", "--hierarchy",
                                                                    "--leaf-order")]
    return argv, {"output": outputs, "input": inputs}, draw(st.sampled_from(STDIN_DATA))


def check_run(work, argv, stdin) -> int:
    """Run ``argv`` (file names relative to the work folder) and check the contract; returns the exit status."""
    folder, paths, h, probs = work
    if stdin is None:
        buf = io.BytesIO()
        np.save(buf, probs.numpy())
        stdin = buf.getvalue()
    flags_out = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--output", "--json") and i > 0]
    flags_in = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--probs", "--targets", "--hierarchy",
                                                                      "--leaf-order")]
    real = [paths.get(a, a) if not a.startswith("-") or a == "-" else a for a in argv]
    real = [os.path.join(str(folder), a) if a.startswith(("new", "nodir/")) else a for a in real]
    outputs = {os.path.realpath(paths.get(o, os.path.join(str(folder), o))) for o in flags_out if o}
    outputs |= {p + ".png" for p in outputs}  # a figure path without extension gets .png
    inputs = {os.path.realpath(paths[i]) for i in flags_in if i in paths}
    before = snapshot(folder)
    cwd = os.getcwd()
    os.chdir(folder)  # a stray file written relative to the working folder is seen too
    try:
        code, out, err = run_main(real, stdin)
    finally:
        os.chdir(cwd)
    after = snapshot(folder)
    for path, content in before.items():
        if os.path.realpath(path) in outputs and os.path.realpath(path) not in inputs:
            continue
        assert after.get(path) == content, (f"{path} changed", real, err)
    created = set(after) - set(before)
    assert all(os.path.realpath(p) in outputs for p in created), (created, real, err)
    assert not [p for p in after if p.endswith(".tmp")], (after, real)
    if code != 0:
        assert_clean_failure(code, err, real)
    else:
        assert "Traceback" not in err and "internal error" not in err
        check_result(real, out, h, probs)
    for p in created:  # leave the folder as it was for the next case
        os.unlink(p)
    for p, content in before.items():
        if after.get(p) != content and isinstance(content, bytes):
            with open(p, "wb") as f:
                f.write(content)
    return code


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=command())
def test_hostile_command_lines(work, case):
    argv, _, stdin = case
    check_run(work, argv, stdin)


def test_every_hostile_file_and_output_path(work):
    """Each hostile input in its place, each hostile output path as each kind of output: no example left to chance."""
    codes = {}
    for f in INPUTS:
        codes[("probs", f)] = check_run(work, ["decode", "--hierarchy", "tree.csv", "--probs", f, "--metric", "zhao",
                                               "--output", "new.npy"], None if f == "-" else b"")
    for f in TARGETS:
        codes[("targets", f)] = check_run(work, ["compare", "--hierarchy", "tree.csv", "--probs", "good.npy",
                                                 "--targets", f, "--metrics", "zhao", "--decoders", "majority",
                                                 "--no-progress"], b"1\n2\n")
    for f in TREES:
        codes[("tree", f)] = check_run(work, ["info", "--hierarchy", f, "--json"], b"r,a\nr,b\n")
    for f in OUTPUTS:
        codes[("decode -o", f)] = check_run(work, ["decode", "--hierarchy", "tree.csv", "--probs", "good.npy",
                                                   "--metric", "zhao", "--output", f], b"")
        codes[("--json", f)] = check_run(work, ["compare", "--hierarchy", "tree.csv", "--num-samples", "5",
                                                "--metrics", "zhao", "--decoders", "majority", "--json", f,
                                                "--no-progress"], b"")
        codes[("plot -o", f)] = check_run(work, ["plot", "agreement", "--resolution", "4", "--output", f], b"")
    ok = {k for k, c in codes.items() if c == 0}
    # The good ones succeed (the contract is not met by failing everything) ...
    assert {("probs", "good.npy"), ("probs", "good.csv"), ("probs", "good.pt"), ("probs", "link_to_good.npy"),
            ("probs", "big_endian.npy"), ("probs", "-"), ("targets", "y.npy"), ("targets", "y.txt"),
            ("tree", "tree.csv"), ("tree", "tree.json"), ("tree", "inat19"), ("tree", "-"),
            ("decode -o", "new.npy"), ("decode -o", "existing.npy"), ("--json", "new.json"),
            ("--json", "existing.json"), ("plot -o", "new.png"), ("plot -o", "new"), ("plot -o", "existing.png")} <= ok
    # ... and an input of the run is never its output.
    assert not ok & {("decode -o", "good.npy"), ("decode -o", "link_to_good.npy"), ("decode -o", "tree.csv"),
                     ("--json", "tree.csv")}


def check_result(argv, out, h, probs):
    """A successful decode of the good probabilities gives the library's predictions."""
    if argv[0] != "decode" or "--metric" not in argv or "--from-logits" in argv or "--calibrate" in argv:
        return
    src = argv[argv.index("--probs") + 1]
    if not (src.endswith(("good.npy", "good.csv", "good.pt", "link_to_good.npy")) or src == "-"):
        return
    if "--hierarchy" in argv and not argv[argv.index("--hierarchy") + 1].endswith(("tree.csv", "tree.json")):
        return
    if "--hierarchy" not in argv or "--leaf-order" in argv:
        return
    name = argv[argv.index("--metric") + 1]
    params = {}
    if name in ("hf_beta", "hf") and "--beta" in argv:
        params["beta"] = float(argv[argv.index("--beta") + 1])
    if name == "tree_distance_c":
        params["c"] = float(argv[argv.index("--c") + 1]) if "--c" in argv else 0.5
    want = hd.get_metric(name, h, **params).decode(probs)
    path = argv[argv.index("--output") + 1] if "--output" in argv else None
    if path is None and "--names" not in argv:
        got = [ln for ln in out.splitlines()]
        text = [";".join(map(str, row.nonzero().flatten().tolist())) if want.dtype == torch.bool else str(int(row))
                for row in want]
        if want.dtype == torch.bool:
            assert [sorted(map(int, g.split(";"))) for g in got] == [sorted(map(int, t.split(";"))) for t in text]
        else:
            assert got == text
    elif path is not None and path.endswith(".npy"):
        assert torch.equal(torch.from_numpy(np.load(path)), want)


# --------------------------------------------------------------------------- the file readers
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(
    st.text(max_size=80),
    st.lists(st.tuples(st.sampled_from(["r", " r", "a", "b ", "1", "10", "2", "\t", "", "a b", '"q"', "#"]),
                       st.sampled_from([",", "\t", " ", ",,", ", "]),
                       st.sampled_from(["a", "b", "c", "1", "2", "10", "", "x\u200b", "r"])),
             max_size=8).map(lambda rows: "\n".join(p + s + c for p, s, c in rows)),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
))
def test_hostile_tree_files(tmp_path, text):
    """from_edges / from_json / from_paths / load_hierarchy: a tree or a ValueError/TypeError/OSError, nothing else."""
    p = tmp_path / "t.txt"
    p.write_text(text, encoding="utf-8")
    builds = {"edges": lambda: Hierarchy.from_edges(p), "json": lambda: Hierarchy.from_json(p),
              "paths": lambda: Hierarchy.from_paths(text.splitlines()), "bundled": lambda: hd.load_hierarchy(text)}
    for kind, build in builds.items():
        try:
            h = build()
        except (ValueError, TypeError, OSError) as exc:
            assert str(exc).strip() and "\n" not in str(exc).strip(), repr(exc)
        else:
            assert isinstance(h, Hierarchy) and h.num_leaves >= 1
            assert int(h.leaf_count[h.root]) == h.num_leaves
            assert all(isinstance(n, (str, int, float, tuple, type(None), bool)) for n in h.names)
            if kind == "edges":
                assert all(n == n.strip() and n and n.isprintable() for n in h.names)  # padding stripped


def test_hostile_tree_paths(tmp_path):
    (tmp_path / "d.json").mkdir()
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "nul.csv").write_bytes(b"\x00" * 64)  # valid UTF-8, not text
    cases = [(lambda: Hierarchy.from_json(tmp_path / "d.json"), IsADirectoryError, "d.json"),
             (lambda: Hierarchy.from_json(tmp_path / "nope.json"), FileNotFoundError, "nope.json"),
             (lambda: Hierarchy.from_json(tmp_path / "bin.json"), ValueError, "bin.json': not UTF-8"),
             (lambda: Hierarchy.from_edges(tmp_path / "bin.csv"), ValueError, "bin.csv': not UTF-8"),
             (lambda: Hierarchy.from_edges(tmp_path / "nul.csv"), ValueError,
              r"nul.csv': not a text file \(character 0 is a NUL byte\)"),
             (lambda: Hierarchy.from_edges(tmp_path / "d.json"), IsADirectoryError, "d.json"),
             (lambda: hd.load_hierarchy(str(tmp_path / "nope.json")), ValueError, "Hierarchy.from_json")]
    for build, exc, match in cases:
        with pytest.raises(exc, match=match):
            build()


def test_a_csv_of_nul_bytes_is_not_a_text_table(tmp_path, capsys):
    """It was "has a header line but no data" (one line of one non-numeric cell)."""
    from test_cli import run_cli

    for content in (b"\x00" * 64, b"\x00" * 64 + b"\n", b"0.5,0.5\n\x00,1\n"):
        (tmp_path / "nul.csv").write_bytes(content)
        code, _, err = run_cli(["decode", "--metric", "tree_distance", "--probs", tmp_path / "nul.csv"], capsys)
        assert code == 2 and "nul.csv' is not a text table" in err and "NUL byte" in err, err
        code, _, err = run_cli(["info", "--hierarchy", tmp_path / "nul.csv"], capsys)
        assert code == 2 and "not a text file" in err and "NUL byte" in err, err


# --------------------------------------------------------------------------- a real process
# What only a real process shows (a closed or full stdout, a file-size limit, a real SIGINT) runs in
# one child interpreter, one scenario after the other, so that the start-up cost is paid once.
_CHILD = r"""
import io, json, os, resource, signal, sys
from hdecode_torch.cli.main import main

tree, probs, big, out_dir = sys.argv[1:5]
results = {}


def run(name, argv):
    err = io.StringIO()
    real_err, sys.stderr = sys.stderr, err
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stderr = real_err
    results[name] = [code, err.getvalue()]


# A closed stdout (`hdecode decode ... >&-`): Python starts with sys.stdout = None.
saved = os.dup(1)
sys.stdout.flush()
os.close(1)
real_out, sys.stdout = sys.stdout, None
run("closed stdout", ["decode", "--hierarchy", tree, "--probs", probs, "--metric", "zhao"])
run("closed stdout, -o", ["decode", "--hierarchy", tree, "--probs", probs, "--metric", "zhao", "--output",
                          os.path.join(out_dir, "closed.npy")])
os.dup2(saved, 1)
sys.stdout = real_out

# A full stdout (`> /dev/full`).
full = os.open("/dev/full", os.O_WRONLY)
os.dup2(full, 1)
sys.stdout = open(1, "w", closefd=False)
run("full stdout", ["info", "--hierarchy", tree, "--json"])
os.dup2(saved, 1)
sys.stdout = real_out

# A file-size limit of 64 bytes (the process ignores SIGXFSZ, as CPython does): the write fails.
with open(os.path.join(out_dir, "limited.jsonl"), "wb") as f:
    f.write(b"old")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
run("file-size limit", ["decode", "--hierarchy", tree, "--probs", probs, "--metric", "hf_beta", "--names",
                        "--output", os.path.join(out_dir, "limited.jsonl")])
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

# A real SIGINT, 0.6 s into a long decode.
with open(os.path.join(out_dir, "interrupted.npy"), "wb") as f:
    f.write(b"old")
signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))
signal.setitimer(signal.ITIMER_REAL, 0.6)
run("sigint", ["decode", "--probs", big, "--metric", "wu_palmer", "--batch-size", "64", "--output",
               os.path.join(out_dir, "interrupted.npy")])
signal.setitimer(signal.ITIMER_REAL, 0)
with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f)
"""


def _sigint_as_on_a_terminal():
    """The child's SIGINT as a terminal gives it.  Under a parent that ignores SIGINT (a background job
    of a non-interactive shell, as CI may run the suite) the child inherits SIG_IGN, and Python then
    installs no KeyboardInterrupt handler: a Ctrl-C test would see the run finish."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.plan_independent
def test_real_process_conditions(work, tmp_path):
    folder, paths, *_ = work
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    h = hd.load_hierarchy("tieredimagenet-h")
    big, _ = synthetic_outputs(h, 20_000, 1.0, seed=0)
    np.save(tmp_path / "big.npy", big.numpy())
    proc = subprocess.run([sys.executable, "-c", _CHILD, paths["tree.csv"], paths["good.npy"],
                           str(tmp_path / "big.npy"), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1"),
                          preexec_fn=_sigint_as_on_a_terminal)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["closed stdout"] == [2, "hdecode decode: error: standard output is closed, and no --output is given: "
                                       "the predictions would be lost\n"]
    assert res["closed stdout, -o"][0] == 0 and np.load(tmp_path / "closed.npy").shape == (12,)
    assert res["full stdout"] == [1, "hdecode info: error: cannot write to standard output: No space left on "
                                     "device\n"]
    limited = tmp_path / "limited.jsonl"
    assert res["file-size limit"] == [1, f"hdecode decode: error: --output: cannot write '{limited}': File too "
                                         "large\n"]
    assert limited.read_bytes() == b"old"
    if res["sigint"][0] != 0:  # (0: the decode finished before the interrupt)
        assert res["sigint"] == [130, "hdecode decode: interrupted\n"]
        assert (tmp_path / "interrupted.npy").read_bytes() == b"old"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- issue 24: inputs and outputs
def _decode_lines(argv) -> tuple[int, list[str], str]:
    code, out, err = run_main(["decode", *map(str, argv), "--no-progress"])
    return code, out.splitlines(), err


@pytest.mark.parametrize("first", [0, 1], ids=["0..L-1", "1..L"])
@pytest.mark.parametrize("kind", ["probabilities", "logits", "counts"])
def test_a_numeric_csv_header_is_not_a_sample(work, tmp_path, kind, first):
    """pandas' to_csv(index=False) and np.savetxt(header=...) write the column numbers as the first
    line: it is a header, with --from-logits and --normalize too, never one more (shifted) sample."""
    folder, paths, h, probs = work
    data, flags, kw = {"probabilities": (probs, [], {}), "logits": (2 * probs.log() - 1, ["--from-logits"],
                                                                      {"from_logits": True}),
                       "counts": (3 * probs, ["--normalize"], {"normalize": True})}[kind]
    path = tmp_path / "p.csv"
    np.savetxt(path, data.numpy(), delimiter=",", fmt="%.17g", comments="",
               header=",".join(str(j + first) for j in range(h.num_leaves)))
    code, lines, err = _decode_lines(["--hierarchy", paths["tree.csv"], "--probs", path, *flags, "--metric", "zhao"])
    post = hd.Posterior(h, data, **kw)
    assert code == 0, err
    assert [int(x) for x in lines] == hd.get_metric("zhao", h).decode(post).tolist()  # 12 rows, none shifted


def test_a_numeric_first_line_that_could_be_a_sample_is_refused(work, tmp_path):
    """Where the column numbers could be a row of the data, the reader refuses instead of guessing."""
    folder, paths, h, probs = work
    (tmp_path / "two.csv").write_text("r,a\nr,b\n")
    cases = [
        ("two_columns.csv", "0,1\n0.25,0.75\n0.5,0.5\n", "two.csv", "with two columns it is also a probability row"),
        ("integers.csv", "0,1,2,3,4\n" + "0,0,1,0,0\n" * 3, "tree.csv", "every other line holds integers too"),
        ("alone.csv", "0,1,2,3,4\n", "tree.csv", "it is the only line"),
    ]
    for name, text, tree, why in cases:
        (tmp_path / name).write_text(text)
        tree_path = tmp_path / tree if tree == "two.csv" else paths[tree]
        code, _, err = _decode_lines(["--hierarchy", tree_path, "--probs", tmp_path / name, "--metric", "zhao"])
        assert_clean_failure(code, err, name)
        assert "is the column numbers, a header or a sample?" in err and why in err, err
    # A first row of other numbers is data, as before (here: a bad row, reported as such).
    (tmp_path / "data.csv").write_text("0,1,2,3,5\n" + "0.2,0.2,0.2,0.2,0.2\n")
    code, _, err = _decode_lines(["--hierarchy", paths["tree.csv"], "--probs", tmp_path / "data.csv", "--metric",
                                  "zhao"])
    assert_clean_failure(code, err, "data.csv")
    assert "row 0" in err
    # Targets with a numeric header line: one target too many, and the message says why.
    (tmp_path / "y.csv").write_text("0\n" + "\n".join(["1"] * 12) + "\n")
    code, _, err = run_main(["compare", "--hierarchy", paths["tree.csv"], "--probs", paths["good.npy"], "--targets",
                             str(tmp_path / "y.csv"), "--metrics", "zhao", "--decoders", "majority", "--no-progress"])
    assert_clean_failure(code, err, "y.csv")
    assert "has 13 targets but the probabilities have 12 rows; is its first line a header of numbers?" in err


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_pt_files_without_data_are_clear_errors(work, tmp_path):
    folder, paths, *_ = work
    torch.save(torch.empty(3, 5, device="meta"), tmp_path / "meta.pt")
    torch.save(torch.nested.nested_tensor([torch.zeros(5), torch.zeros(5)]), tmp_path / "nested.pt")
    for name, message in (("meta.pt", "holds a tensor on the meta device: a shape (3, 5) without values"),
                          ("nested.pt", "holds a nested tensor")):
        code, _, err = _decode_lines(["--hierarchy", paths["tree.csv"], "--probs", tmp_path / name, "--metric",
                                      "zhao"])
        assert_clean_failure(code, err, name)
        assert message in err, err


def test_device_and_pipe_outputs_are_written_in_place(work, tmp_path):
    """`-o /dev/null` (timing a run, discarding its output) and a named pipe are accepted; a device or a
    pipe without a format extension gets the lines of standard output."""
    import threading

    folder, paths, h, probs = work
    base = ["--hierarchy", paths["tree.csv"], "--probs", paths["good.npy"], "--metric", "hf_beta"]
    code, stdout_lines, _ = _decode_lines(base)
    assert code == 0 and len(stdout_lines) == 12
    for out in ("/dev/null", "/dev/null.npy"[:-4]):
        code, lines, err = _decode_lines(base + ["--output", out])
        assert code == 0 and lines == [] and "12 predictions written to /dev/null" in err, err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    code, _, err = _decode_lines(base + ["--output", fifo])
    reader.join(timeout=30)
    assert code == 0, err
    assert got == ["\n".join(stdout_lines) + "\n"]
    code, _, err = run_main(["compare", "--hierarchy", paths["tree.csv"], "--num-samples", "5", "--metrics", "zhao",
                             "--decoders", "majority", "--json", "/dev/null", "--no-progress"])
    assert code == 0, err
    if importlib.util.find_spec("matplotlib") is not None:
        code, out, err = run_main(["plot", "agreement", "--resolution", "4", "--output", "/dev/null"])
        assert code == 0 and out.strip() == "wrote /dev/null", err
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sigterm_during_a_write_leaves_no_fragment_and_stale_ones_are_swept(work, tmp_path, monkeypatch):
    """SIGTERM while the output is being written: exit 143 with one line, the old file intact, no
    temporary left.  A temporary left by a killed run (SIGKILL: nothing can clean up) is removed by the
    next run writing that output; one of a live process, or of another output, is not."""
    import signal

    import hdecode_torch.cli.io as cli_io

    folder, paths, *_ = work
    out = tmp_path / "pred.npy"
    out.write_bytes(b"old predictions")
    dead, live = _dead_pid(), os.getpid()
    stale = tmp_path / f".pred.npy.hdecode-{dead}-k3j8x2.tmp"
    running = tmp_path / f".pred.npy.hdecode-{live}-a1b2c3.tmp"
    other = tmp_path / f".other.npy.hdecode-{dead}-q9w8e7.tmp"
    for p in (stale, running, other):
        p.write_bytes(b"fragment")

    class Terminated:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(data[: max(1, len(data) // 2)]))
            os.kill(os.getpid(), signal.SIGTERM)  # the handler of main() runs at the next bytecode
            return self.f.write(bytes(data[len(data) // 2:]))

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(cli_io, "_PlainWrites", Terminated)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = _decode_lines(["--hierarchy", paths["tree.csv"], "--probs", paths["good.npy"], "--metric", "zhao",
                                  "--output", out])
    assert code == 143 and err.strip() == "hdecode decode: terminated", err
    assert signal.getsignal(signal.SIGTERM) == before  # main() restores the handler
    assert out.read_bytes() == b"old predictions"
    # No fragment of this run; the stale one was swept when it began to write.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (out, running, other))
    monkeypatch.undo()
    stale.write_bytes(b"fragment")  # as a SIGKILL would leave it
    code, _, err = _decode_lines(["--hierarchy", paths["tree.csv"], "--probs", paths["good.npy"], "--metric", "zhao",
                                  "--output", out])
    assert code == 0, err
    assert np.load(out).shape == (12,)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (out, running, other))


@pytest.mark.plan_independent
def test_ctrl_c_while_torch_loads_is_one_line(tmp_path):
    """On a terminal the progress line is up at once, before torch loads (~2 s): Ctrl-C right then
    exits 130 with one line, not a traceback from inside torch's import."""
    import pty
    import re
    import signal
    import time

    master, slave = pty.openpty()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([sys.executable, "-m", "hdecode_torch", "compare", "--num-samples", "100", "--json",
                             str(tmp_path / "r.json")], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env=env, preexec_fn=_sigint_as_on_a_terminal)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 60
    while b"loading" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=120)
    proc.stdout.close()
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", seen.decode(errors="replace")).replace("\r", "\n")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    assert b"loading" in seen and code == 130, seen
    assert "Traceback" not in text and lines[-1] == "hdecode compare: interrupted", seen
    assert [ln for ln in lines if "compare: loading" not in ln] == ["hdecode compare: interrupted"], text
    assert not (tmp_path / "r.json").exists()


def test_ctrl_c_while_the_progress_bar_cannot_close_is_still_an_interrupt(monkeypatch, capsys):
    """A Ctrl-C can land while tqdm holds only some of its write locks (seen once on a 16-core machine while
    torch loaded): closing the bar then raises "release unlocked lock", which must not turn the interrupt
    into an internal error (exit 1) instead of one line and exit 130."""
    from hdecode_torch.cli import main as cli_main
    from hdecode_torch.cli.progress import Progress

    def torn_close(self):
        raise RuntimeError("release unlocked lock")

    def interrupted(args, progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "close", torn_close)
    monkeypatch.setattr(cli_main, "_runner", lambda spec: interrupted)
    assert cli_main.main(["info"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["hdecode info: interrupted"]
    with pytest.raises(RuntimeError, match="release unlocked lock"):  # without an interrupt it is an error
        with Progress("x", enabled=False):
            pass
