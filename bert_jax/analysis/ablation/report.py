"""The report of the ablation results: `write_report(results, directory,
metric_name=...)` writes the dict that `run_ablations` returns (or any subset
of its keys) to `directory`: `results.json`, `report.md` (Markdown tables),
an annotated heatmap `<analysis>_<group>.png` of every `[layers, heads]`
score, `layer_ablation_<group>.png` of every `[layers]` score, and
`pruning_curve.png` (the metric against the fraction of heads pruned). It
returns file name -> path of every file written. `launch/ablate.py` calls it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from bert_jax.analysis.ablation.scores import PruningStep
from bert_jax.file_io import jsonable, write_atomically, write_json

_TITLES = {
    "single_head_ablation": "Metric change when one head is removed",
    "keep_one_head": "Metric when only this head of the layer remains",
    "head_importance": "Head importance |dL/dmask|",
    "head_importance_normalized": "Head importance, L2-normalised per layer",
    "layer_ablation": "Metric change when one layer is skipped",
}
# Diverging colour maps (centred on 0) for changes, sequential for the rest.
_DIVERGING = {"single_head_ablation", "layer_ablation"}


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _markdown_table(array: np.ndarray, row_label: str = "layer",
                    col_label: str = "head") -> str:
    array = np.atleast_2d(array)
    header = f"| {row_label} \\ {col_label} | " + " | ".join(
        str(h) for h in range(array.shape[1])) + " |"
    rule = "|---" * (array.shape[1] + 1) + "|"
    rows = [f"| {l} | " + " | ".join(_fmt(v) for v in row) + " |"
            for l, row in enumerate(array)]
    return "\n".join([header, rule, *rows])


def _heatmap(array: np.ndarray, path: str, title: str, *, diverging: bool,
             colorbar_label: str, xlabel: str | None = "head") -> None:
    from matplotlib.figure import Figure
    array = np.atleast_2d(np.asarray(array, np.float64))
    layers, heads = array.shape
    fig = Figure(figsize=(max(4.0, 0.7 * heads + 2.5), max(2.5, 0.5 * layers + 1.5)))
    ax = fig.subplots()
    if diverging:
        bound = float(np.abs(array).max()) or 1.0
        image = ax.imshow(array, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    else:
        image = ax.imshow(array, cmap="viridis", aspect="auto")
    ax.set_xticks(range(heads) if xlabel else [])
    ax.set_yticks(range(layers))
    ax.set_xlabel(xlabel or "")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    low, high = image.get_clim()
    for l in range(layers):
        for h in range(heads):
            value = array[l, h]
            dark = (abs(value) > 0.6 * max(abs(low), abs(high)) if diverging
                    else value < low + 0.5 * (high - low))
            ax.text(h, l, f"{value:.2g}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    fig.colorbar(image, ax=ax, label=colorbar_label)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(results: Mapping[str, Any], directory: str, *,
                 metric_name: str) -> dict[str, str]:
    """Writes the results of `run_ablations` (or any subset of its keys) to
    `directory`: `results.json`, `report.md` (tables), one annotated heatmap
    `<analysis>_<group>.png` per `[layers, heads]` score,
    `layer_ablation_<group>.png` and `pruning_curve.png` (metric vs fraction
    of heads pruned). Returns name -> path of every file written.
    """
    os.makedirs(directory, exist_ok=True)
    written: dict[str, str] = {}
    baseline = results.get("baseline")
    tolerance = results.get("tolerance")

    path = os.path.join(directory, "results.json")
    write_json(path, {"metric_name": metric_name, **jsonable(dict(results))})
    written["results.json"] = path

    lines = [f"# Head ablation report ({metric_name})", ""]
    if baseline is not None:
        lines += [f"Baseline (all heads): **{_fmt(baseline)}**", ""]
    for key, title in _TITLES.items():
        if key not in results:
            continue
        lines += [f"## {title}", ""]
        for group, array in results[key].items():
            array = np.asarray(array, np.float64)
            name = f"{key}_{group}.png"
            if array.ndim == 1:  # layer ablation: one row per layer
                table = _markdown_table(array[:, None], "layer", "change")
                _heatmap(array[:, None], os.path.join(directory, name),
                         f"{title}\n({group}, {metric_name})", diverging=True,
                         colorbar_label=f"{metric_name} change", xlabel=None)
            else:
                table = _markdown_table(array)
                label = (f"{metric_name} change" if key in _DIVERGING else
                         metric_name if key == "keep_one_head" else "importance")
                _heatmap(array, os.path.join(directory, name),
                         f"{title}\n({group}, {metric_name})",
                         diverging=key in _DIVERGING, colorbar_label=label)
            written[name] = os.path.join(directory, name)
            lines += [f"### {group}", "", f"![{key} {group}]({name})", "", table, ""]
    if "pruning_curve" in results:
        curve = [PruningStep(*s) if not isinstance(s, Mapping) else
                 PruningStep(s["fraction"], s["heads_remaining"], s["metric"])
                 for s in results["pruning_curve"]]
        name = "pruning_curve.png"
        from matplotlib.figure import Figure
        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        ax.plot([100 * s.fraction for s in curve], [s.metric for s in curve], marker="o",
                label="pruned by importance")
        if baseline is not None:
            ax.axhline(baseline, color="gray", linestyle="--", label="all heads")
            if tolerance is not None:
                ax.axhline(baseline - tolerance, color="red", linestyle=":",
                           label=f"baseline - {tolerance:g}")
        ax.set(xlabel="heads pruned (%)", ylabel=metric_name,
               title=f"{metric_name} vs fraction of heads pruned")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        written[name] = os.path.join(directory, name)
        fig.savefig(written[name], dpi=120)
        lines += ["## Iterative pruning", "", f"![pruning curve]({name})", "",
                  f"| pruned (%) | heads remaining | {metric_name} |", "|---|---|---|"]
        lines += [f"| {100 * s.fraction:.1f} | {s.heads_remaining} | {_fmt(s.metric)} |"
                  for s in curve]
        lines.append("")
        if "largest_prunable_fraction" in results:
            lines += [f"Largest fraction prunable within {_fmt(tolerance or 0.0)} of the "
                      f"baseline: **{100 * results['largest_prunable_fraction']:.1f}%**", ""]
    path = os.path.join(directory, "report.md")
    write_atomically(path, "\n".join(lines))
    written["report.md"] = path
    return written
