"""``hdecode plot``: where decoders disagree on the simplex, and how the gain of optimal decoding grows with noise."""

from __future__ import annotations

import argparse
import json
import math
import os

import torch

from ..synthetic import synthetic_outputs
from .common import (
    DEFAULT_BETAS, DEFAULT_C, CLIError, Progress, add_decoder_param_args, add_hierarchy_args, build_heuristics,
    build_metrics, heuristic_names, load_any_hierarchy, resolve_device, split_names,
)
from .compare import relative_gain
from .evaluation import evaluate, has_optimal

# Small enough for well under a minute on a 2-core CPU (7 noise levels x 3 seeds x 2000 samples).
DEFAULT_GAIN_NOISE = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
DEFAULT_GAIN_SEEDS = 3
DEFAULT_GAIN_SAMPLES = 2000

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


def _save(fig, canvas_cls, path: str, dpi: int) -> None:
    canvas_cls(fig)
    try:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise CLIError(f"--output: cannot write {path!r}: {exc}") from None


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="figures: decoder agreement on the simplex, gain of optimal decoding vs noise",
                       description="Figures of the paper, recomputed: `plot agreement` and `plot gain`.")
    psub = p.add_subparsers(dest="plot_command", required=True, metavar="FIGURE")

    a = psub.add_parser(
        "agreement", help="where a metric's optimal decoder agrees with a heuristic, on the 3-leaf simplex",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Agreement map (the paper's Fig. 2): on the tree root -> (X, C), X -> (A, B), every point of\n"
            "the probability simplex over the leaves A, B, C is decoded by the optimal decoder of --metric\n"
            "and by each --heuristic; green where they predict the same node (or, for set metrics, the\n"
            "same ancestor set), red where they differ."),
        epilog="example:\n  hdecode plot agreement --metric hf_beta --beta 1 --heuristic majority --output agreement.png\n"
               "  hdecode plot agreement --metric wu_palmer --heuristic all --output wu_palmer.png")
    a.add_argument("--metric", default="hf_beta", help="metric whose optimal decoder is mapped (default: hf_beta)")
    a.add_argument("--beta", type=float, default=1.0, help="hf_beta: beta (default: 1)")
    a.add_argument("--c", type=float, default=DEFAULT_C, help=f"tree_distance_c: c (default: {DEFAULT_C})")
    a.add_argument("--heuristic", nargs="+", default=["majority"], metavar="NAME",
                   help="heuristic decoder(s), comma or space separated, or 'all' (default: majority)")
    add_decoder_param_args(a)
    a.add_argument("--resolution", type=int, default=200,
                   help="grid steps per simplex edge; the map has resolution² cells (default: 200)")
    a.add_argument("--output", "-o", required=True, metavar="PNG", help="image file to write (.png, .pdf, .svg)")
    a.add_argument("--dpi", type=int, default=120, help="resolution of raster outputs (default: 120)")
    a.set_defaults(func=run_agreement)

    g = psub.add_parser(
        "gain", help="relative gain (%%) of optimal decoding over each heuristic vs the noise level",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The paper's blur experiment on synthetic calibrated outputs: for each noise level (the\n"
            "temperature of the synthetic model; larger = more underdetermined) and seed, draw outputs,\n"
            "decode them with each metric's optimal decoder and each heuristic, and plot the relative gain\n"
            "(%) of optimal decoding over each heuristic: 100·(U_opt − U_h)/|U_h| for a score,\n"
            "100·(C_h − C_opt)/C_h for a cost.  Lines: mean over seeds; bands: 95%% confidence intervals."),
        epilog="example:\n  hdecode plot gain --output gain.png\n"
               "  hdecode plot gain --metrics tree_distance,wu_palmer --seeds 5 --num-samples 5000 --output gain.png")
    add_hierarchy_args(g)
    g.add_argument("--metrics", nargs="+", metavar="NAME", help="metrics, one panel each (default: hf_beta at each --betas)")
    g.add_argument("--betas", type=float, nargs="+", default=list(DEFAULT_BETAS), help="hf_beta betas (default: 0.5 1 2)")
    g.add_argument("--c", type=float, default=DEFAULT_C, help=f"tree_distance_c: c (default: {DEFAULT_C})")
    g.add_argument("--decoders", nargs="+", metavar="NAME", help="heuristics, comma or space separated (default: all)")
    add_decoder_param_args(g)
    g.add_argument("--noise", type=float, nargs="+", default=list(DEFAULT_GAIN_NOISE),
                   help=f"noise levels (default: {' '.join(f'{x:g}' for x in DEFAULT_GAIN_NOISE)})")
    g.add_argument("--seeds", type=int, default=DEFAULT_GAIN_SEEDS,
                   help=f"seeds per noise level, for the confidence bands (default: {DEFAULT_GAIN_SEEDS})")
    g.add_argument("--num-samples", type=int, default=DEFAULT_GAIN_SAMPLES,
                   help=f"samples per seed and noise level (default: {DEFAULT_GAIN_SAMPLES})")
    g.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available, else cpu)")
    g.add_argument("--batch-size", type=int, default=1024, help="samples per chunk (default: 1024)")
    g.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default: 1)")
    g.add_argument("--output", "-o", required=True, metavar="PNG", help="image file to write (.png, .pdf, .svg)")
    g.add_argument("--json", metavar="PATH", help="also write the plotted numbers as JSON")
    g.add_argument("--dpi", type=int, default=120, help="resolution of raster outputs (default: 120)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.set_defaults(func=run_gain)


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


def run_agreement(args: argparse.Namespace) -> int:
    Figure, Canvas = _matplotlib()
    if args.resolution < 2 or args.resolution > 1000:
        raise CLIError(f"--resolution must be in 2..1000, got {args.resolution}")
    h = three_leaf_tree()
    metric = build_metrics(h, [args.metric], [args.beta], args.c)[0]
    if not has_optimal(metric):
        raise CLIError(f"--metric {args.metric}: No Bayes-optimal decoder for `{metric.name}`, hence no agreement map; "
                       "pick another metric")
    names = split_names(args.heuristic)
    if names == ["all"]:
        names = heuristic_names()
    heuristics = build_heuristics(h, names, args.tau, args.lam, args.info_threshold)
    grid, triangles = simplex_grid(args.resolution)
    x, y = _ternary(grid)
    from matplotlib.colors import ListedColormap
    from matplotlib.tri import Triangulation

    # Colour each small triangle of the grid by the decision at its centroid: a filled map with
    # sharp boundaries, where per-point dots would leave a visible mesh.
    tri = Triangulation(x, y, triangles.numpy())
    centroids = grid[triangles].mean(1)
    cmap = ListedColormap([DISAGREE, AGREE])

    cols = min(len(heuristics), 4)
    rows = math.ceil(len(heuristics) / cols)
    fig = Figure(figsize=(3.6 * cols, 3.5 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    top = math.sqrt(3) / 2
    for k, ax in enumerate(axes.flat):
        if k >= len(heuristics):
            ax.axis("off")
            continue
        dec = heuristics[k]
        agree = agreement_mask(h, metric, dec, centroids).numpy()
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
                 "(each point: one distribution p over the leaves A, B, C; a corner puts all the mass on its leaf)",
                 fontsize=10)
    fig.legend(handles=[Patch(color=AGREE, label="same prediction"), Patch(color=DISAGREE, label="different")],
               loc="outside lower center", ncols=2, frameon=False)
    # The tree the simplex is over, in the top-left corner as in the paper.
    inset = axes.flat[0].inset_axes([-0.04, 0.66, 0.3, 0.34])
    _draw_tree(inset)
    _save(fig, Canvas, args.output, args.dpi)
    print(f"wrote {args.output}")
    return 0


# --------------------------------------------------------------------------- gain
def gain_curves(h, metrics, heuristics, noise_levels, seeds: int, num_samples: int, *, device,
                batch_size: int = 1024, progress=None) -> dict:
    """gains[metric key][decoder key] = (S, K) relative gains (%) for S seeds and K noise levels,
    plus the argmax-leaf accuracy per noise level (to read the noise axis)."""
    from ..decoders import get_decoder

    argmax = get_decoder("argmax_leaf", h)
    gains = {m.key: {d.key: torch.full((seeds, len(noise_levels)), math.nan, dtype=torch.float64)
                     for d in heuristics} for m in metrics}
    acc = torch.zeros(seeds, len(noise_levels), dtype=torch.float64)
    for k, noise in enumerate(noise_levels):
        for s in range(seeds):
            probs, targets = synthetic_outputs(h, num_samples, noise, seed=s, device=device)
            ev = evaluate(h, probs, targets, metrics, heuristics, batch_size=batch_size)
            acc[s, k] = (argmax.decode(probs) == targets).double().mean().cpu()
            for mi, m in enumerate(metrics):
                for di, d in enumerate(heuristics, start=1):
                    gains[m.key][d.key][s, k] = relative_gain(m, float(ev.mean[mi, 0]), float(ev.mean[mi, di]))
            if progress is not None:
                progress.update(num_samples)
    return {"gains": gains, "argmax_accuracy": acc}


def run_gain(args: argparse.Namespace) -> int:
    Figure, Canvas = _matplotlib()
    for flag, v in (("--seeds", args.seeds), ("--num-samples", args.num_samples), ("--batch-size", args.batch_size),
                    ("--threads", args.threads)):
        if v <= 0:
            raise CLIError(f"{flag} must be positive, got {v}")
    if any(not (x > 0 and math.isfinite(x)) for x in args.noise):
        raise CLIError(f"--noise levels must be finite and > 0, got {args.noise}")
    h = load_any_hierarchy(args.hierarchy, args.leaf_order)
    device = resolve_device(args.device)
    metrics = build_metrics(h, split_names(args.metrics) or ["hf_beta"], args.betas, args.c)
    missing = [m.key for m in metrics if not has_optimal(m)]
    if missing:
        raise CLIError(f"no optimal decoder for {', '.join(missing)}: the gain of optimal decoding is undefined")
    heuristics = build_heuristics(h, split_names(args.decoders) or heuristic_names(), args.tau, args.lam,
                                  args.info_threshold)
    noise = sorted(args.noise)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    progress = Progress(len(noise) * args.seeds * args.num_samples, "plot gain", enabled=not args.no_progress)
    try:
        res = gain_curves(h, metrics, heuristics, noise, args.seeds, args.num_samples, device=device,
                          batch_size=args.batch_size, progress=progress)
    finally:
        progress.close()
        torch.set_num_threads(threads)

    S = args.seeds
    t = _t975(S - 1)
    cols = min(len(metrics), 3)
    rows = math.ceil(len(metrics) / cols)
    fig = Figure(figsize=(5.0 * cols, 3.9 * rows + 0.9), layout="constrained")
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
            ax.plot(noise, mean.numpy(), marker=markers[di % len(markers)], ms=4, lw=1.5, color=color, label=d.key)
            if S > 1:
                ax.fill_between(noise, (mean - half).numpy(), (mean + half).numpy(), color=color, alpha=0.18, lw=0)
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
    fig.suptitle(f"Relative gain of optimal decoding over heuristics vs noise — {os.path.basename(args.hierarchy)}, "
                 f"calibrated synthetic outputs ({S} seed{'s' if S > 1 else ''} × {args.num_samples} samples; "
                 f"bands: 95% CI)", fontsize=11)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(heuristics) + 1), frameon=False, fontsize=9)
    _save(fig, Canvas, args.output, args.dpi)
    if args.json:
        data = {"noise": noise, "seeds": S, "num_samples": args.num_samples, "hierarchy": args.hierarchy,
                "argmax_accuracy": acc, "gain_percent": summary}
        try:
            with open(args.json, "w") as f:
                json.dump(data, f, indent=2)
        except OSError as exc:
            raise CLIError(f"--json: cannot write {args.json!r}: {exc.strerror}") from None
    print(f"wrote {args.output}")
    return 0
