"""``hdecode plot``: where decoders disagree on the simplex, how the gain of optimal decoding grows with noise, the
risk-coverage curve of risk control, and the reliability of the node probabilities per depth."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings

import torch

from ..core.topk import TopK
from ..synthetic import synthetic_miscalibrated, synthetic_outputs
from .common import (
    DEFAULT_CALIBRATION_SPLIT, DEFAULT_SEED, MAX_FIGURE_PIXELS, CLIError,
    Progress, build_heuristics, build_metrics, check_applicable, fit_risk_control, held_out_split,
    heuristic_selection, json_document, load_any_hierarchy, load_probs, load_targets, resolve_device,
    set_threads, split_names, import_modules, one_spec, calibration_report, calibration_split, fit_calibration,
)
from .compare import check_topk_options, relative_gain, topk_at
from .evaluation import evaluate, has_optimal, rows_probabilities
from .io import STDIN, StagedWrites, check_distinct_inputs, check_output_path, is_special_file
from .options import (
    DEFAULT_DISTORTION, DEFAULT_GAIN_NOISE, DEFAULT_GAIN_SEEDS, DEFAULT_NUM_SAMPLES, DEFAULT_STRENGTH, SYNTHETIC_NOISE,
)

# Two-sided 95% Student t quantiles, for confidence bands from a handful of seeds.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}

AGREE, DISAGREE = "#2ca02c", "#d62728"


def _t975(df: int) -> float:
    if df <= 0:
        return math.nan
    keys = [k for k in _T975 if k <= df]
    return _T975[max(keys)] if df <= 30 else 1.96


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CLIError("plotting needs matplotlib: pip install 'hdecode_torch[plot]' (or pip install matplotlib)") \
            from None
    return Figure, FigureCanvasAgg


def figure_path(path: str) -> tuple[str, str]:
    """``(path to write, format)``: the extension names the format; none means PNG, and ``.png`` is
    added (as matplotlib does), so that the path printed is the file written."""
    Figure, Canvas = _matplotlib()
    if is_special_file(path) and not os.path.splitext(path)[1]:
        return path, "png"  # /dev/null, a pipe: written in place, as PNG
    if path == "-" or not path.strip() or os.path.basename(path) in ("", ".", ".."):
        check_output_path(path, "--output")  # the same message as for any other output
        raise CLIError(f"--output: {path!r} is not a file name")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if not ext:
        return path + ".png", "png"
    supported = Canvas(Figure()).get_supported_filetypes()
    if ext not in supported:
        raise CLIError(f"--output: unknown image format '.{ext}' of {path!r}; use one of "
                       f"{', '.join('.' + e for e in sorted(supported))}")
    return path, ext


def check_figure_size(width_in: float, height_in: float, dpi: int) -> None:
    """A figure larger than MAX_FIGURE_PIXELS would exhaust memory while drawing: fail before."""
    pixels = width_in * dpi * height_in * dpi
    if pixels > MAX_FIGURE_PIXELS:
        top = int(math.sqrt(MAX_FIGURE_PIXELS / (width_in * height_in)))
        raise CLIError(f"--dpi {dpi}: the figure would be {width_in * dpi:.0f} x {height_in * dpi:.0f} pixels; at most "
                       f"{MAX_FIGURE_PIXELS // 1_000_000} million pixels are drawn, i.e. --dpi {top} or less for "
                       "this figure")


def _save(fig, canvas_cls, path: str, fmt: str, dpi: int, staged: StagedWrites) -> None:
    canvas_cls(fig)
    staged.write(path, "--output", lambda f: fig.savefig(f, format=fmt, dpi=dpi, bbox_inches="tight"))


# --------------------------------------------------------------------------- agreement
def three_leaf_tree():
    """The paper's 5-node tree: root -> (X, C), X -> (A, B); leaves A, B, C are columns 0, 1, 2."""
    from ..hierarchy import Hierarchy

    return Hierarchy.from_parents([3, 3, 4, 4, -1], names=["A", "B", "C", "X", "root"])


def simplex_grid(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The simplex cut into n² equal small triangles.

    Returns ``(points, triangles)``: ((n+1)(n+2)/2, 3) float64 barycentric points (i, j, k)/n
    with i + j + k = n, and (n², 3) int64 vertex indices of the small triangles.
    """
    i, j = torch.meshgrid(torch.arange(n + 1), torch.arange(n + 1), indexing="ij")
    keep = (i + j) <= n
    index = torch.full((n + 2, n + 2), -1, dtype=torch.long)
    index[i[keep], j[keep]] = torch.arange(int(keep.sum()))
    points = torch.stack([i[keep], j[keep], n - i[keep] - j[keep]], 1).to(torch.float64) / n
    ui, uj = i[(i + j) <= n - 1], j[(i + j) <= n - 1]
    up = torch.stack([index[ui, uj], index[ui + 1, uj], index[ui, uj + 1]], 1)
    di, dj = i[(i + j) <= n - 2], j[(i + j) <= n - 2]
    down = torch.stack([index[di + 1, dj], index[di + 1, dj + 1], index[di, dj + 1]], 1)
    return points, torch.cat([up, down])


def agreement_mask(h, metric, heuristic, probs: torch.Tensor) -> torch.Tensor:
    """(P,) bool: the metric's optimal prediction equals the heuristic's (as ancestor sets for set metrics)."""
    from ..kernels.ancestry import ancestor_mask

    opt = metric.decode(probs)
    pred = heuristic.decode(probs)
    if opt.dtype == torch.bool:
        return (opt == ancestor_mask(h, pred)).all(1)
    return opt == pred


def _ternary(p: torch.Tensor):
    """Barycentric (A, B, C) -> plane: A bottom-left, B bottom-right, C top."""
    x = p[:, 1] + 0.5 * p[:, 2]
    y = p[:, 2] * (math.sqrt(3) / 2)
    return x.numpy(), y.numpy()


def _draw_tree(ax) -> None:
    pos = {"root": (0.5, 1.0), "X": (0.25, 0.5), "C": (0.75, 0.5), "A": (0.05, 0.0), "B": (0.45, 0.0)}
    for parent, child in (("root", "X"), ("root", "C"), ("X", "A"), ("X", "B")):
        (x0, y0), (x1, y1) = pos[parent], pos[child]
        ax.plot([x0, x1], [y0, y1], color="0.3", lw=1.2, zorder=1)
    for name, (x, y) in pos.items():
        leaf = name in ("A", "B", "C")
        ax.scatter([x], [y], s=260 if leaf else 200, color="white", edgecolor="0.2", zorder=2)
        ax.text(x, y, name if name != "root" else "r", ha="center", va="center", fontsize=8, zorder=3,
                fontweight="bold" if leaf else "normal")
    ax.set_xlim(-0.1, 1.1)
    ax.set_ylim(-0.25, 1.2)
    ax.axis("off")


def run_agreement(args: argparse.Namespace, progress: Progress) -> int:
    Figure, Canvas = _matplotlib()
    path, fmt = figure_path(args.output)
    check_output_path(path, "--output")
    h = three_leaf_tree()
    import_modules(getattr(args, "imports", None))
    metric = build_metrics(h, [one_spec(args.metric, "--metric")], args)[0]
    if not has_optimal(metric):
        raise CLIError(f"--metric {args.metric}: No Bayes-optimal decoder for `{metric.name}`, hence no agreement "
                       "map; pick another metric")
    names = heuristic_selection(args.decoders, "--decoders") if args.decoders is not None else ["majority"]
    heuristics = build_heuristics(h, names, args)
    check_applicable(args, metrics=[metric], decoders=heuristics, metric_flag="--metric")
    cols = min(len(heuristics), 4)
    rows = math.ceil(len(heuristics) / cols)
    size = (3.6 * cols, 3.5 * rows + 0.9)
    check_figure_size(*size, args.dpi)
    grid, triangles = simplex_grid(args.resolution)
    x, y = _ternary(grid)
    from matplotlib.colors import ListedColormap
    from matplotlib.tri import Triangulation

    # Colour each small triangle of the grid by the decision at its centroid: a filled map with
    # sharp boundaries, where per-point dots would leave a visible mesh.
    tri = Triangulation(x, y, triangles.numpy())
    centroids = grid[triangles].mean(1)
    cmap = ListedColormap([DISAGREE, AGREE])

    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    top = math.sqrt(3) / 2
    progress.stage("plot agreement: decoding the simplex", total=len(heuristics), unit="decoder")
    for k, ax in enumerate(axes.flat):
        if k >= len(heuristics):
            ax.axis("off")
            continue
        dec = heuristics[k]
        agree = agreement_mask(h, metric, dec, centroids).numpy()
        progress.update(1)
        ax.tripcolor(tri, facecolors=agree.astype(float), cmap=cmap, vmin=0, vmax=1, edgecolors="none",
                     rasterized=True)
        ax.plot([0, 1, 0.5, 0], [0, 0, top, 0], color="0.2", lw=1)
        for vx, vy, label, va in ((0, 0, "A", "top"), (1, 0, "B", "top"), (0.5, top, "C", "bottom")):
            ax.text(vx, vy + (-0.03 if va == "top" else 0.03), label, ha="center", va=va, fontsize=10,
                    fontweight="bold")
        ax.set_title(f"{dec.key}\ndisagrees on {100 * (1 - agree.mean()):.1f}% of the simplex", fontsize=10)
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(-0.12, top + 0.1)
        ax.set_aspect("equal")
        ax.axis("off")
    from matplotlib.patches import Patch

    fig.suptitle(f"Optimal {metric.key} decoder vs heuristics on the 3-leaf simplex\n"
                 "(each point: one distribution p over the leaves A, B, C; a corner puts all the mass on its "
                 "leaf)", fontsize=10)
    fig.legend(handles=[Patch(color=AGREE, label="same prediction"), Patch(color=DISAGREE, label="different")],
               loc="outside lower center", ncols=2, frameon=False)
    # The tree the simplex is over, in the top-left corner as in the paper.
    inset = axes.flat[0].inset_axes([-0.04, 0.66, 0.3, 0.34])
    _draw_tree(inset)
    progress.stage("plot agreement: drawing")
    with StagedWrites() as staged:
        _save(fig, Canvas, path, fmt, args.dpi, staged)
    progress.close()
    print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------- gain
def gain_curves(h, metrics, heuristics, noise_levels, seeds: int, num_samples: int, *, device,
                batch_size: int = 1024, progress=None, first_seed: int = 0) -> dict:
    """gains[metric key][decoder key] = (S, K) relative gains (%) for S seeds (``first_seed``,
    ``first_seed + 1``, ...) and K noise levels, plus the argmax-leaf accuracy per noise level
    (to read the noise axis)."""
    from ..decoders import get_decoder

    argmax = get_decoder("argmax_leaf", h)
    gains = {m.key: {d.key: torch.full((seeds, len(noise_levels)), math.nan, dtype=torch.float64)
                     for d in heuristics} for m in metrics}
    acc = torch.zeros(seeds, len(noise_levels), dtype=torch.float64)
    for k, noise in enumerate(noise_levels):
        for s in range(seeds):
            probs, targets = synthetic_outputs(h, num_samples, noise, seed=first_seed + s, device=device)
            ev = evaluate(h, probs, targets, metrics, heuristics, batch_size=batch_size)
            acc[s, k] = (argmax.decode(probs) == targets).double().mean().cpu()
            for mi, m in enumerate(metrics):
                for di, d in enumerate(heuristics, start=1):
                    gains[m.key][d.key][s, k] = relative_gain(m, float(ev.mean[mi, 0]), float(ev.mean[mi, di]))
            if progress is not None:
                progress.update(num_samples)
    return {"gains": gains, "argmax_accuracy": acc}


def run_gain(args: argparse.Namespace, progress: Progress) -> int:
    start = time.perf_counter()
    Figure, Canvas = _matplotlib()
    if args.old_seeds is not None:
        if args.num_seeds is not None:
            raise CLIError("--seeds is the old name of --num-seeds: give only --num-seeds")
        warnings.warn("--seeds is deprecated: use --num-seeds (the number of seeds per noise level); --seed is the "
                      "first seed", FutureWarning, stacklevel=2)
        args.num_seeds = args.old_seeds
    S = DEFAULT_GAIN_SEEDS if args.num_seeds is None else args.num_seeds
    noise = sorted(dict.fromkeys(args.noise if args.noise is not None else DEFAULT_GAIN_NOISE))
    path, fmt = figure_path(args.output)
    inputs = {"--hierarchy": args.hierarchy, "--leaf-order": args.leaf_order}
    check_distinct_inputs(inputs)
    check_output_path(path, "--output", inputs=inputs)
    if args.json is not None:
        check_output_path(args.json, "--json", inputs=inputs, outputs={"--output": path})
    with set_threads(args.threads):
        progress.stage("plot gain: loading the hierarchy")
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        import_modules(args.imports)
        names = split_names(args.metrics, "--metrics") if args.metrics is not None else ["hf_beta"]
        metrics = build_metrics(h, names, args)
        missing = [m.key for m in metrics if not has_optimal(m)]
        if missing:
            raise CLIError(f"no optimal decoder for {', '.join(missing)}: the gain of optimal decoding is undefined")
        heuristics = build_heuristics(h, heuristic_selection(args.decoders, "--decoders"), args)
        check_applicable(args, metrics=metrics, decoders=heuristics)
        cols = min(len(metrics), 3)
        rows = math.ceil(len(metrics) / cols)
        size = (5.0 * cols, 3.9 * rows + 0.9)
        check_figure_size(*size, args.dpi)
        progress.stage("plot gain: drawing data, decoding, scoring", total=len(noise) * S * args.num_samples)
        t0 = time.perf_counter()
        res = gain_curves(h, metrics, heuristics, noise, S, args.num_samples, device=device,
                          batch_size=args.batch_size, progress=progress, first_seed=args.seed)
        evaluation_s = time.perf_counter() - t0

        t = _t975(S - 1)
        fig = Figure(figsize=size, layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False)
        import matplotlib

        cmap = matplotlib.colormaps["tab10"]
        markers = "os^vDP*Xhp<>"
        acc = res["argmax_accuracy"].mean(0).tolist()
        summary = {}
        for k, ax in enumerate(axes.flat):
            if k >= len(metrics):
                ax.axis("off")
                continue
            m = metrics[k]
            summary[m.key] = {}
            for di, d in enumerate(heuristics):
                g = res["gains"][m.key][d.key]
                mean = g.mean(0)
                half = (t * g.std(0, unbiased=True) / math.sqrt(S)) if S > 1 else torch.zeros_like(mean)
                summary[m.key][d.key] = {"mean": mean.tolist(), "ci95_halfwidth": half.tolist()}
                color = cmap(di % 10)
                ax.plot(noise, mean.numpy(), marker=markers[di % len(markers)], ms=4, lw=1.5, color=color,
                        label=d.key)
                if S > 1:
                    ax.fill_between(noise, (mean - half).numpy(), (mean + half).numpy(), color=color, alpha=0.18,
                                    lw=0)
            overall = torch.stack([res["gains"][m.key][d.key].mean(0) for d in heuristics]).mean(0)
            summary[m.key]["mean_over_heuristics"] = overall.tolist()
            ax.plot(noise, overall.numpy(), color="black", lw=2.5, ls="--", label="mean over heuristics")
            ax.axhline(0, color="0.4", lw=0.8, ls=":")
            ax.set_title(f"{m.key} ({'higher' if m.higher_is_better else 'lower'} is better)", fontsize=10)
            ax.set_xlabel("noise (synthetic model temperature)\nargmax-leaf accuracy below each level")
            ax.set_ylabel("gain of optimal decoding (%)")
            ax.set_xticks(noise)
            ax.set_xticklabels([f"{n:g}\n{100 * a:.0f}%" for n, a in zip(noise, acc)], fontsize=8)
            ax.grid(alpha=0.3)
        tree = "standard input" if args.hierarchy == "-" else os.path.basename(args.hierarchy)
        fig.suptitle(f"Relative gain of optimal decoding over heuristics vs noise — {tree}, "
                     f"calibrated synthetic outputs ({S} seed{'s' if S > 1 else ''} × {args.num_samples} samples; "
                     f"bands: 95% CI)", fontsize=11)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(heuristics) + 1), frameon=False,
                   fontsize=9)
        progress.stage("plot gain: drawing")
        # Both files are written to temporaries first and moved into place together.
        with StagedWrites() as staged:
            _save(fig, Canvas, path, fmt, args.dpi, staged)
            if args.json is not None:
                setting = {"hierarchy": args.hierarchy, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves,
                           "noise": noise, "num_seeds": S, "first_seed": args.seed, "num_samples": args.num_samples,
                           "device": str(device), "batch_size": args.batch_size, "threads": args.threads,
                           "metrics": {m.key: {"name": m.name, **m.params} for m in metrics},
                           "decoders": {d.key: {"name": d.name, **d.params} for d in heuristics}}
                timings = {"evaluation_s": round(evaluation_s, 3), "total_s": round(time.perf_counter() - start, 3)}
                results = {"noise": noise, "argmax_accuracy": acc, "gain_percent": summary}
                doc = json_document("plot gain", {"setting": setting, "timings": timings}, results)
                staged.write(args.json, "--json", lambda f: json.dump(doc, f, indent=2, allow_nan=False), text=True)
    progress.close()
    print(f"wrote {path}" + (f" and {args.json}" if args.json is not None else ""))
    return 0


# --------------------------------------------------------------------------- risk-coverage
def _figure_outputs(args) -> tuple:
    """``(Figure, Canvas, path, format)`` of a figure drawn from --probs/--targets or synthetic outputs, its
    --output and --json checked against the inputs and each other before anything is computed."""
    Figure, Canvas = _matplotlib()
    path, fmt = figure_path(args.output)
    inputs = {"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
              "--leaf-order": args.leaf_order}
    check_distinct_inputs(inputs)
    check_output_path(path, "--output", inputs=inputs)
    if args.json is not None:
        check_output_path(args.json, "--json", inputs=inputs, outputs={"--output": path})
    return Figure, Canvas, path, fmt


def _rows(probs, rows: torch.Tensor):
    """Rows ``rows`` (b,) int64 of (B, L) probabilities or of a :class:`~hdecode_torch.TopK`'s lists."""
    return topk_at(probs, rows) if isinstance(probs, TopK) else probs[rows]


def risk_curve(h, probs, targets: torch.Tensor, fit_rows: torch.Tensor, other_rows: torch.Tensor,
               alpha: float, delta: float | None, points: int, where: str) -> dict:
    """RiskControl fitted on ``fit_rows`` of ``probs`` ((B, L) probabilities, or a TopK of (B, k) lists: their
    completed distribution), its risk-coverage curve on ``other_rows`` read at ``points`` evenly
    spaced λ in [0, 1] and at the fitted λ (ascending): ``{"lambda", "miss_rate", "mean_depth"}`` lists, the
    values at the fitted λ (``at_fitted``), and the fit's report (``fit``: ``fit_risk_control``'s)."""
    rc, info = fit_risk_control(h, _rows(probs, fit_rows), targets[fit_rows], alpha, delta, where)
    curve = rc.risk_coverage(_rows(probs, other_rows), targets[other_rows])
    lam, risk, depth = (t.cpu() for t in (curve.lam, curve.risk, curve.mean_depth))
    # i / (points - 1), each correctly rounded (linspace gives 0.30000000000000004 for 3/10)
    grid = torch.arange(points, dtype=torch.float64) / (points - 1)
    grid = torch.cat([grid, torch.tensor([rc.lam], dtype=torch.float64)]).unique()
    at = torch.searchsorted(lam, grid, right=True) - 1  # the step that holds each λ: lam[0] = 0
    fitted = int(torch.searchsorted(lam, torch.tensor([rc.lam], dtype=torch.float64), right=True)[0]) - 1
    n = int(other_rows.numel())
    miss = float(risk[fitted])
    stderr = math.sqrt(miss * (1 - miss) / (n - 1)) if n > 1 else math.nan
    return {"lambda": grid.tolist(), "miss_rate": risk[at].tolist(), "mean_depth": depth[at].tolist(),
            "scored_rows": n, "at_fitted": {"lambda": rc.lam, "miss_rate": miss, "miss_rate_stderr": stderr,
                                            "mean_depth": float(depth[fitted])},
            "fit": {"decoder": rc.key, **info}}


def run_risk(args: argparse.Namespace, progress: Progress) -> int:
    """The command line was checked by ``commands.check_plot_risk``."""
    start = time.perf_counter()
    Figure, Canvas, path, fmt = _figure_outputs(args)
    size = (11.0, 4.4)
    check_figure_size(*size, args.dpi)
    split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
    seed = DEFAULT_SEED if args.seed is None else args.seed
    with set_threads(args.threads):
        progress.stage("plot risk: loading the hierarchy")
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        setting = {"hierarchy": args.hierarchy, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves}
        if args.probs is None:
            num = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
            noise = SYNTHETIC_NOISE if args.noise is None else args.noise
            progress.stage(f"plot risk: drawing {num} synthetic samples")
            probs, targets = synthetic_outputs(h, num, noise, seed, device=device)
            setting.update(source="synthetic", noise=noise, num_samples=num)
            source = f"synthetic calibrated outputs (noise {noise:g})"
        else:
            progress.stage("plot risk: reading the model outputs")
            raw = load_probs(args.probs, h, top_k=True)
            topk = isinstance(raw, TopK)
            if topk:
                check_topk_options(args)
            num = int((raw.values if topk else raw).shape[0])
            targets = load_targets(args.targets, h, num)
            if num == 0:
                raise CLIError(f"--probs: {args.probs!r} has no rows")
            if topk:
                probs = TopK(raw.values.to(device), raw.indices.to(device))
            else:
                probs = rows_probabilities(h, raw, torch.arange(num), from_logits=args.from_logits,
                                           normalize=args.normalize).to(device)
            targets = targets.to(device)
            setting.update(source="files", probs=args.probs if args.probs == STDIN else os.path.abspath(args.probs),
                           targets=args.targets if args.targets == STDIN else os.path.abspath(args.targets),
                           from_logits=args.from_logits, normalize=bool(args.normalize), num_samples=num)
            if topk:
                setting.update(input="top-k lists", k=raw.k)
            source = "standard input" if args.probs == STDIN else os.path.basename(args.probs)
        fit_rows, other_rows = held_out_split(num, split, seed, "fit λ on")
        progress.stage("plot risk: fitting risk control and its curve")
        t0 = time.perf_counter()
        res = risk_curve(h, probs, targets, fit_rows.to(device), other_rows.to(device), args.alpha, args.delta,
                         args.points, f"--calibration-split {split:g} of {num} rows")
        evaluation_s = time.perf_counter() - t0

        fig = Figure(figsize=size, layout="constrained")
        ax, trade = fig.subplots(1, 2)
        fit = res["at_fitted"]
        level = f"α = {args.alpha:g}" + ("" if args.delta is None else f", δ = {args.delta:g}")
        miss_color, depth_color = "#d62728", "#1f77b4"
        ax.plot(res["lambda"], res["miss_rate"], drawstyle="steps-post", color=miss_color, lw=1.6, label="miss rate")
        ax.axhline(args.alpha, color=miss_color, lw=0.9, ls=":", label=f"level {level}")
        ax.axvline(fit["lambda"], color="0.3", lw=1.0, ls="--", label=f"fitted λ = {fit['lambda']:.4g}")
        ax.set_xlabel("λ (descend while the most probable child has p > λ)")
        ax.set_ylabel("miss rate (target not under the answer)", color=miss_color)
        ax.set_xlim(0, 1)
        ax.set_ylim(bottom=0)
        depth_ax = ax.twinx()
        depth_ax.plot(res["lambda"], res["mean_depth"], drawstyle="steps-post", color=depth_color, lw=1.6,
                      label="mean depth")
        depth_ax.set_ylabel("mean depth of the answers", color=depth_color)
        depth_ax.set_ylim(bottom=0)
        handles = ax.get_legend_handles_labels()
        more = depth_ax.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="upper right", frameon=False)
        ax.grid(alpha=0.3)
        ax.set_title("miss rate and depth as λ moves", fontsize=10)

        trade.plot(res["mean_depth"], res["miss_rate"], color="0.2", lw=1.4)
        trade.axhline(args.alpha, color=miss_color, lw=0.9, ls=":", label=f"level {level}")
        trade.plot([fit["mean_depth"]], [fit["miss_rate"]], marker="o", ms=7, color=miss_color, ls="none",
                   label=f"fitted: miss rate {fit['miss_rate']:.4f}, mean depth {fit['mean_depth']:.3g}")
        trade.set_xlabel("mean depth of the answers (deeper: more specific)")
        trade.set_ylabel("miss rate")
        trade.set_ylim(bottom=0)
        trade.grid(alpha=0.3)
        trade.legend(fontsize=8, loc="upper left", frameon=False)
        trade.set_title("risk vs coverage", fontsize=10)
        tree = "standard input" if args.hierarchy == "-" else os.path.basename(args.hierarchy)
        fig.suptitle(f"Risk control on {tree}, {source}: λ fitted on {res['fit']['calibration_rows']} rows "
                     f"({res['fit']['guarantee'].split(':')[0]}), curves on the other {res['scored_rows']}",
                     fontsize=10)
        progress.stage("plot risk: drawing")
        with StagedWrites() as staged:
            _save(fig, Canvas, path, fmt, args.dpi, staged)
            if args.json is not None:
                setting.update(seed=seed, calibration_split=split, alpha=args.alpha, delta=args.delta,
                               points=args.points, device=str(device), threads=args.threads)
                timings = {"fit_s": res["fit"].pop("seconds"), "evaluation_s": round(evaluation_s, 3),
                           "total_s": round(time.perf_counter() - start, 3)}
                doc = json_document("plot risk", {"setting": setting, "timings": timings}, res)
                staged.write(args.json, "--json", lambda f: json.dump(doc, f, indent=2, allow_nan=False), text=True)
    progress.close()
    print(f"wrote {path}" + (f" and {args.json}" if args.json is not None else ""))
    return 0


# --------------------------------------------------------------------------- reliability
MAX_PANELS = 12
RAW_COLOR, CALIBRATED_COLOR = "#d62728", "#1f77b4"


def panel_depths(ece: list[float]) -> list[int]:
    """The depths drawn: 1..D when D <= MAX_PANELS, else MAX_PANELS of them evenly spaced from 1 to D."""
    top = len(ece) - 1
    if top <= MAX_PANELS:
        return list(range(1, top + 1))
    return sorted({round(1 + i * (top - 1) / (MAX_PANELS - 1)) for i in range(MAX_PANELS)})


def reliability(h, scores: torch.Tensor, targets: torch.Tensor, n_bins: int) -> dict:
    """``hd.functional.node_reliability`` of logits ``scores`` (b, L) as JSON-ready lists (NaN kept, for empty
    bins) and the ECE per depth."""
    from ..functional import node_calibration_error, node_reliability

    rel = node_reliability(scores, targets, h, n_bins, from_logits=True)
    ece = node_calibration_error(scores, targets, h, n_bins, from_logits=True)
    return {"counts": rel.counts.tolist(), "confidence": rel.confidence.tolist(), "frequency": rel.frequency.tolist(),
            "ece": ece.tolist()}


def run_reliability(args: argparse.Namespace, progress: Progress) -> int:
    """The command line was checked by ``commands.check_plot_reliability``."""
    start = time.perf_counter()
    Figure, Canvas, path, fmt = _figure_outputs(args)
    split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
    seed = DEFAULT_SEED if args.seed is None else args.seed
    calibration = None
    with set_threads(args.threads):
        progress.stage("plot reliability: loading the hierarchy")
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        setting = {"hierarchy": args.hierarchy, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves, "bins": args.bins}
        if args.probs is None:
            num = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
            noise = SYNTHETIC_NOISE if args.noise is None else args.noise
            distortion = DEFAULT_DISTORTION if args.distortion is None else args.distortion
            strength = DEFAULT_STRENGTH if args.strength is None else args.strength
            progress.stage(f"plot reliability: drawing {num} synthetic samples")
            scores, targets, _ = synthetic_miscalibrated(h, num, distortion, strength, noise, seed, dtype=torch.float64)
            setting.update(source="synthetic", noise=noise, distortion=distortion, strength=strength, num_samples=num)
            source = f"a synthetic model ({distortion} distortion, strength {strength:g})"
        else:
            progress.stage("plot reliability: reading the model outputs")
            raw = load_probs(args.probs, h)
            num = int(raw.shape[0])
            targets = load_targets(args.targets, h, num)
            if num == 0:
                raise CLIError(f"--probs: {args.probs!r} has no rows")
            # Logits as given, else the log of the checked probabilities: every later step reads logits.
            checked = rows_probabilities(h, raw, torch.arange(num), from_logits=args.from_logits,
                                         normalize=args.normalize)
            scores = raw.to(torch.float64) if args.from_logits is True else checked.to(torch.float64).log()
            setting.update(source="files", probs=args.probs if args.probs == STDIN else os.path.abspath(args.probs),
                           targets=args.targets if args.targets == STDIN else os.path.abspath(args.targets),
                           from_logits=args.from_logits, normalize=bool(args.normalize), num_samples=num)
            source = "standard input" if args.probs == STDIN else os.path.basename(args.probs)
        rows = torch.arange(num)
        if args.calibrate:
            fit_rows, rows = calibration_split(num, split, seed)
            if fit_rows.numel() == 0 or rows.numel() == 0:
                raise CLIError(f"--calibration-split {split:g} of {num} rows leaves no row to "
                               f"{'fit the calibration on' if fit_rows.numel() == 0 else 'draw'}")
            progress.stage(f"plot reliability: fitting the calibration ({args.calibrate})")
            scaler, calibration = fit_calibration(h, scores, targets, fit_rows, rows, args.calibrate)
            setting.update(calibrate=args.calibrate, calibration_split=split, seed=seed)
        progress.stage("plot reliability: binning the node probabilities")
        z, y = scores[rows].to(device), targets[rows].to(device)
        curves = {"raw": reliability(h, z, y, args.bins)}
        if calibration is not None and scaler is not None:
            with torch.no_grad():
                curves["calibrated"] = reliability(h, scaler.to(device)(z), y, args.bins)
        depths = panel_depths(curves["raw"]["ece"])
        cols = min(4, max(1, len(depths)))
        grid_rows = max(1, math.ceil(len(depths) / cols))
        size = (3.0 * cols, 2.9 * grid_rows + 0.5)
        check_figure_size(*size, args.dpi)
        fig = Figure(figsize=size, layout="constrained")
        axes = fig.subplots(grid_rows, cols, squeeze=False).reshape(-1)
        for ax, d in zip(axes, depths):
            ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls="--")
            title = f"depth {d}: ECE {curves['raw']['ece'][d]:.4f}"
            for name, color in (("raw", RAW_COLOR), ("calibrated", CALIBRATED_COLOR)):
                if name not in curves:
                    continue
                c = curves[name]
                pts = [(x, f) for x, f, n in zip(c["confidence"][d], c["frequency"][d], c["counts"][d]) if n > 0]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, lw=1.2, color=color, label=name)
                if name == "calibrated":
                    title += f" → {c['ece'][d]:.4f}"
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
        for ax in axes[len(depths):]:
            ax.set_axis_off()
        axes[0].legend(fontsize=7, loc="upper left", frameon=False)
        fig.supxlabel("mean p(n) in the bin", fontsize=9)
        fig.supylabel("fraction of the bin's nodes that hold the label", fontsize=9)
        tree = "standard input" if args.hierarchy == "-" else os.path.basename(args.hierarchy)
        what = "" if calibration is None else f"; calibration fitted on {calibration['fit_rows']} other rows"
        fig.suptitle(f"Node reliability on {tree}, {source}: {int(rows.numel())} rows{what}", fontsize=10)
        progress.stage("plot reliability: drawing")
        with StagedWrites() as staged:
            _save(fig, Canvas, path, fmt, args.dpi, staged)
            if args.json is not None:
                setting.update(device=str(device), threads=args.threads, drawn_rows=int(rows.numel()))
                results = {"depths": depths, **curves}
                timings = {"total_s": round(time.perf_counter() - start, 3)}
                if calibration is not None:
                    timings["calibration_s"] = calibration.pop("seconds")
                    results["calibration"] = calibration
                doc = json_document("plot reliability", {"setting": setting, "timings": timings}, results)
                staged.write(args.json, "--json", lambda f: json.dump(doc, f, indent=2, allow_nan=False), text=True)
    progress.close()
    if calibration is not None:
        print(f"calibration: {calibration_report(calibration)}")
    print(f"wrote {path}" + (f" and {args.json}" if args.json is not None else ""))
    return 0
