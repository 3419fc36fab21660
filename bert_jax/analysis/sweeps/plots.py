"""Plots of a sweep's results (heatmap, metric against parameters, training
curves) and `report`: tables and plots of a sweep directory in one call."""

from __future__ import annotations

import math
import os
import re
from typing import Any, Sequence

from bert_jax.training.workdir import read_metrics
from bert_jax.analysis.sweeps.points import SweepError
from bert_jax.analysis.sweeps.names import format_value, short_keys
from bert_jax.analysis.sweeps.results import (
    _metric_columns, _override_keys, collect, write_tables)

_LOWER_IS_BETTER = ("loss", "nll", "perplexity", "ppl", "error", "wer", "cer")


def metric_mode(metric: str) -> str:
    """'min' for losses and error rates, else 'max'."""
    return "min" if any(w in metric.lower() for w in _LOWER_IS_BETTER) else "max"


def _axis_values(rows: Sequence[dict], key: str | None) -> list[Any]:
    if key is None:
        return [None]
    values = []
    for row in rows:
        value = row["overrides"].get(key)
        if value not in values:
            values.append(value)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        values.sort()
    return values


def _safe_file(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def plot(rows: Sequence[dict], directory: str, metric: str, x: str | None = None,
         y: str | None = None, mode: str | None = None) -> dict[str, str]:
    """Writes PNGs under `directory` and returns {kind: path}:

    - heatmap: `metric` over the swept keys `x` (columns) and `y` (rows)
      (default: the first two swept keys), each cell annotated, with a colour
      bar; other swept keys are reduced to the best run (`mode` 'max'/'min',
      default by the metric's name), runs without the metric left blank;
    - scatter: `metric` against the parameter count (runs with both);
    - curves: train/loss and `metric` against the step, one line per run.
    """
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    import numpy as np

    mode = mode or metric_mode(metric)
    best = max if mode == "max" else min
    keys = _override_keys(rows)
    names = short_keys(keys)
    if x is None:
        x = keys[0] if keys else None
    if y is None:
        rest = [k for k in keys if k != x]
        y = rest[0] if rest else None
    for key in (x, y):
        if key is not None and key not in keys:
            raise SweepError(f"plot axis {key!r} is not a swept key; swept: "
                             f"{', '.join(keys) or 'none'}", token=key)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    tag = _safe_file(metric)

    # Heatmap.
    xs, ys = _axis_values(rows, x), _axis_values(rows, y)
    grid = np.full((len(ys), len(xs)), np.nan)
    counts = np.zeros_like(grid, dtype=int)
    for row in rows:
        value = row["metrics"].get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        i = ys.index(row["overrides"].get(y) if y else None)
        j = xs.index(row["overrides"].get(x) if x else None)
        grid[i, j] = value if counts[i, j] == 0 else best(grid[i, j], value)
        counts[i, j] += 1
    fig = Figure(figsize=(max(4.0, 1.1 * len(xs) + 2.5), max(2.5, 0.8 * len(ys) + 1.8)))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis" if mode == "max" else "viridis_r"] \
        .with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto")
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label(f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)")
    finite = grid[np.isfinite(grid)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(grid[i, j]):
                level = 0.5 if high == low else (grid[i, j] - low) / (high - low)
                if mode == "min":
                    level = 1 - level
                ax.text(j, i, f"{grid[i, j]:.4g}", ha="center", va="center",
                        color="black" if level > 0.6 else "white", fontsize=9)
            else:
                ax.text(j, i, "n/a", ha="center", va="center", color="#666666",
                        fontsize=8)
    ax.set_xticks(range(len(xs)), [format_value(v) for v in xs])
    ax.set_yticks(range(len(ys)), [format_value(v) for v in ys] if y else [""])
    ax.set_xlabel(x or "")
    ax.set_ylabel(y or "")
    others = [names[k] for k in keys if k not in (x, y)]
    title = metric + (f" (best over {', '.join(others)})" if others and counts.max() > 1
                      else "")
    ax.set_title(title)
    fig.tight_layout()
    paths["heatmap"] = os.path.join(directory, f"heatmap_{tag}.png")
    fig.savefig(paths["heatmap"], dpi=100)

    # Metric against parameters.
    points = [(row["params"], row["metrics"][metric], row["name"]) for row in rows
              if row.get("params") and row["metrics"].get(metric) is not None]
    if points:
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        ax.scatter([p[0] for p in points], [p[1] for p in points])
        for params, value, name in points:
            ax.annotate(name, (params, value), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        sizes = [p[0] for p in points]
        if max(sizes) > 10 * min(sizes):
            ax.set_xscale("log")
        ax.margins(x=0.3, y=0.1)
        ax.set_xlabel("parameters")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against model size")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        paths["scatter"] = os.path.join(directory, f"params_{tag}.png")
        fig.savefig(paths["scatter"], dpi=100)

    # Training curves.
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    drawn = False
    for row in rows:
        lines = read_metrics(row["workdir"])
        for ax, key in zip(axes, ("train/loss", metric)):
            steps = [l["step"] for l in lines if key in l]
            if steps:
                ax.plot(steps, [l[key] for l in lines if key in l], marker="." if
                        len(steps) < 30 else None, label=row["name"])
                drawn = True
    for ax, key in zip(axes, ("train/loss", metric)):
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    if drawn:
        axes[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    paths["curves"] = os.path.join(directory, f"curves_{tag}.png")
    fig.savefig(paths["curves"], dpi=100)
    return paths


def report(directory: str, metric: str | None = None,
           metrics: Sequence[str] | None = None, x: str | None = None,
           y: str | None = None, mode: str | None = None) -> str:
    """collect + write_tables + plot (when a metric is known); the Markdown."""
    rows = collect(directory)
    text = write_tables(rows, directory, metrics)
    if metric is None:
        found = _metric_columns(rows, metrics)
        metric = found[0] if found else None
    if metric and rows:
        plot(rows, directory, metric, x=x, y=y, mode=mode)
    return text
