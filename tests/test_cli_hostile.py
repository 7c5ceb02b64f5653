"""Hostile inputs through every subcommand and every file reader.

The contract: a clear one-line error (exit status 1 or 2, no traceback, no "internal error") or a
correct result; and no existing file other than the requested output ever changes (inputs never,
even when named as the output).  Most cases run ``main()`` in-process (fast); a handful run the
real command in a subprocess, for what only a process shows: a closed stdout, a file-size limit,
a real SIGINT, a full stdout.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
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
    cases = [(lambda: Hierarchy.from_json(tmp_path / "d.json"), IsADirectoryError, "d.json"),
             (lambda: Hierarchy.from_json(tmp_path / "nope.json"), FileNotFoundError, "nope.json"),
             (lambda: Hierarchy.from_json(tmp_path / "bin.json"), ValueError, "bin.json': not UTF-8"),
             (lambda: Hierarchy.from_edges(tmp_path / "bin.csv"), ValueError, "bin.csv': not UTF-8"),
             (lambda: Hierarchy.from_edges(tmp_path / "d.json"), IsADirectoryError, "d.json"),
             (lambda: hd.load_hierarchy(str(tmp_path / "nope.json")), ValueError, "Hierarchy.from_json")]
    for build, exc, match in cases:
        with pytest.raises(exc, match=match):
            build()


# --------------------------------------------------------------------------- real processes
def _cli(args, **kw):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    kw.setdefault("capture_output", True)
    return subprocess.run([sys.executable, "-m", "hdecode_torch", *map(str, args)], text=True, timeout=120, env=env,
                          **kw)


def test_closed_stdout(work):
    folder, paths, *_ = work
    base = ["decode", "--hierarchy", paths["tree.csv"], "--probs", paths["good.npy"], "--metric", "zhao"]
    proc = _cli(base, capture_output=False, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("hdecode decode: error: standard output is closed, and no --output is given: the "
                                   "predictions would be lost")


def test_full_stdout(work):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    folder, paths, *_ = work
    with open("/dev/full", "w") as full:
        proc = _cli(["info", "--hierarchy", paths["tree.csv"], "--json"], stdout=full, stderr=subprocess.PIPE,
                    capture_output=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "hdecode info: error: cannot write to standard output: No space left on device"


def test_file_size_limit_keeps_the_old_file(work):
    folder, paths, *_ = work
    out = folder / "limited.jsonl"
    out.write_bytes(b"old")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    proc = _cli(["decode", "--hierarchy", paths["tree.csv"], "--probs", paths["good.npy"], "--metric", "hf_beta",
                 "--names", "--output", out], preexec_fn=limit)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"hdecode decode: error: --output: cannot write '{out}': File too large"
    assert out.read_bytes() == b"old" and not list(folder.glob("*.tmp"))
    out.unlink()


def test_real_sigint(tmp_path):
    """SIGINT during a long decode: exit 130, one line, the old output intact."""
    h = hd.load_hierarchy("tieredimagenet-h")
    probs, _ = synthetic_outputs(h, 20_000, 1.0, seed=0)
    np.save(tmp_path / "p.npy", probs.numpy())
    out = tmp_path / "pred.npy"
    out.write_bytes(b"old")
    code = ("import os, signal, sys\n"
            "signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))\n"
            "from hdecode_torch.cli.main import main\n"
            "signal.setitimer(signal.ITIMER_REAL, 0.6)\n"
            f"sys.exit(main(['decode', '--probs', {str(tmp_path / 'p.npy')!r}, '--metric', 'wu_palmer', "
            f"'--batch-size', '64', '--output', {str(out)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode == 0:
        pytest.skip("the decode finished before the interrupt")
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "hdecode decode: interrupted"
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["p.npy", "pred.npy"]


def test_no_traceback_from_the_real_command():
    proc = _cli(["compare", "--seed", "99999999999999999999"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("hdecode compare: error: argument --seed: expected an integer in "
                                                    "0..2^63-1, got 99999999999999999999")
