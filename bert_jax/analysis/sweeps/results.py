"""The results of a sweep directory, whatever state it is in (runs not started,
running, interrupted, failed or done).

`collect(directory)` reads every run's files (its overrides, `run.json`, the
trainer's `metrics.jsonl` and `config.json`) into one row per run, a dict
whose keys `collect` lists (status, steps, parameters, wall time, the last
value of each metric, ...). `write_tables` writes the rows as results.csv and
results.md and returns the Markdown table; `plot` draws a metric as a heatmap
over two swept keys, against the parameter count, and as training curves.
`launch/sweep.py` calls these after the runs, or on their own with
`--report_only`.
"""

from __future__ import annotations

import csv
import math
import os
import re
from typing import Any, Sequence

from bert_jax.config_schema import SWEEP_REFUSED, refuse
from bert_jax.analysis.sweeps.runner import (
    OVERRIDES_FILE, RUN_FILE, SWEEP_FILE, format_value, is_finished, read_record,
    run_checkpoint_steps, short_keys)
from bert_jax.training.workdir import CONFIG_FILE, METRICS_FILE, read_metrics

_LOWER_IS_BETTER = ("loss", "nll", "perplexity", "ppl", "error", "wer", "cer")


def _run_dirs(directory: str) -> list[str]:
    """sweep.json's runs first, in its order, then any other run folders."""
    listed = (read_record(os.path.join(directory, SWEEP_FILE)) or {}).get("runs", [])
    try:
        others = sorted(set(os.listdir(directory)) - set(listed))
    except OSError:
        others = []
    return [n for n in [*listed, *others]
            if os.path.exists(os.path.join(directory, n, OVERRIDES_FILE))]


def collect(directory: str) -> list[dict[str, Any]]:
    """One row per run of the sweep directory, whatever state it is in.

    Row keys: name, workdir, overrides, labels (what names the run: the
    sweep's labels, else the overrides), status ('not started', 'unfinished',
    'interrupted', 'failed', or 'done': a DONE marker or a checkpoint of the
    final step), step, num_steps, params, wall_seconds (wall_source:
    'run.json', or 'metrics': training time from steps/s, no evaluation),
    start_time, end_time, metrics (each key's last logged value),
    metrics_step, config (config.json, or None), error."""
    rows = []
    for name in _run_dirs(directory):
        workdir = os.path.join(directory, name)
        record = read_record(os.path.join(workdir, OVERRIDES_FILE)) or {}
        info = read_record(os.path.join(workdir, RUN_FILE)) or {}
        config = read_record(os.path.join(workdir, CONFIG_FILE))
        lines = read_metrics(workdir)
        num_steps = (record.get("num_steps") or info.get("num_steps") or (
            config.get("train", {}).get("num_steps") if isinstance(config, dict) else None))
        metrics: dict[str, float] = {}
        for line in lines:
            metrics.update({k: v for k, v in line.items() if k != "step"})
        step = max([0, *(line["step"] for line in lines), *run_checkpoint_steps(workdir)])
        if num_steps and is_finished(workdir, num_steps):
            status = "done"
        elif info.get("status") in ("failed", "interrupted"):
            status = info["status"]
        elif info or lines or config or step:
            status = "unfinished"
        else:
            status = "not started"
        wall, source = info.get("wall_seconds"), "run.json"
        sessions = info.get("sessions") or []
        if sessions and "seconds" not in sessions[-1] and status != "done":
            # Running now (or killed): count the open session up to the last write.
            start = sessions[-1]["start_time"]
            metrics_file = os.path.join(workdir, METRICS_FILE)
            last = os.path.getmtime(metrics_file) if os.path.exists(metrics_file) else start
            wall = (wall or 0.0) + max(0.0, last - start)
        if wall is None:  # training seconds from the logged steps/s (no evaluation)
            wall, previous, source = 0.0, 0, "metrics"
            for line in lines:
                if line.get("perf/steps_per_second"):
                    wall += (line["step"] - previous) / line["perf/steps_per_second"]
                    previous = line["step"]
            wall = wall or None
        rows.append({
            "name": record.get("name", name), "workdir": workdir,
            "overrides": record.get("overrides", {}),
            "labels": record.get("labels", record.get("overrides", {})),
            "status": status, "step": step,
            "num_steps": num_steps, "params": info.get("params"),
            "wall_seconds": wall, "wall_source": source if wall is not None else None,
            "start_time": info.get("start_time"), "end_time": info.get("end_time"),
            "metrics": metrics, "metrics_step": lines[-1]["step"] if lines else None,
            "config": config, "error": info.get("error"),
        })
    return rows


def _override_keys(rows: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row["overrides"]))


def human_seconds(seconds: float | None, estimated: bool = False) -> str:
    """`12.5s`, `3m07s`, `2h05m`; '~' in front of an estimate; '' for None."""
    if seconds is None:
        return ""
    prefix, seconds = "~" if estimated else "", float(seconds)
    if seconds < 60:
        return f"{prefix}{seconds:.1f}s"
    if seconds < 3600:
        return f"{prefix}{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{prefix}{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def number(value: Any) -> str:
    """A table cell: floats to 4 significant digits, None blank."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def write_tables(rows: Sequence[dict], directory: str,
                 metrics: Sequence[str] | None = None) -> str:
    """Writes DIR/results.csv and DIR/results.md; returns the Markdown table.
    Columns: run, status, the overrides, params, the final value of each metric
    in `metrics` (default: every eval/* metric), steps, wall time."""
    keys = _override_keys(rows)
    names = short_keys(keys)
    columns = list(metrics or sorted({k for row in rows for k in row["metrics"]
                                      if k.startswith("eval/")}))
    csv_rows = [["run", "status", *keys, "params", *columns, "step", "num_steps",
                 "wall_seconds"]]
    header = ["run", "status", *(names[k] for k in keys), "params", *columns, "steps",
              "wall time"]
    body = []
    for row in rows:
        values = [row["overrides"].get(k) for k in keys]
        found = [row["metrics"].get(c) for c in columns]
        wall = row["wall_seconds"]
        csv_rows.append([row["name"], row["status"],
                         *(format_value(v) if isinstance(v, (list, tuple, dict)) else v
                           for v in values),
                         row["params"], *found, row["step"], row["num_steps"],
                         None if wall is None else round(wall, 3)])
        body.append([row["name"], row["status"],
                     *("" if k not in row["overrides"] else format_value(v)
                       for k, v in zip(keys, values)),
                     "" if row["params"] is None else f"{row['params']:,}",
                     *(number(v) for v in found),
                     f"{row['step']}/{row['num_steps'] or '?'}",
                     human_seconds(wall, row["wall_source"] == "metrics")])
    os.makedirs(directory, exist_ok=True)
    write_csv(os.path.join(directory, "results.csv"), csv_rows)
    text = markdown_table(header, body)
    with open(os.path.join(directory, "results.md"), "w") as f:
        f.write(text)
    return text


def write_csv(path: str, rows: Sequence[Sequence[Any]]) -> None:
    """`rows` (the header first) as CSV, None as an empty cell."""
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["" if v is None else v for v in r] for r in rows])


def markdown_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; the columns whose every filled cell looks like a
    number (or a duration) are right-aligned."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    numeric = [any(r[i] != "" for r in body) and all(
        re.fullmatch(r"~?[-+0-9.,e/hms]+|nan|True|False", str(r[i]))
        for r in body if r[i] != "") for i in range(len(header))]
    rule = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in body)]) + "\n"


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


def plot(rows: Sequence[dict], directory: str, metric: str, x: str | None = None,
         y: str | None = None, mode: str | None = None) -> dict[str, str]:
    """Writes PNGs under `directory` and returns {kind: path}:

    - heatmap: `metric` over the swept keys `x` (columns) and `y` (rows)
      (default: the first two swept keys), each cell annotated, with a colour
      bar; other swept keys are reduced to the best run (`mode` 'max'/'min',
      default 'min' for losses and error rates), runs without the metric blank;
    - scatter: `metric` against the parameter count (runs with both);
    - curves: train/loss and `metric` against the step, one line per run.
    """
    import matplotlib
    from matplotlib.figure import Figure
    import numpy as np

    mode = mode or ("min" if any(w in metric.lower() for w in _LOWER_IS_BETTER) else "max")
    best = max if mode == "max" else min
    keys = _override_keys(rows)
    names = short_keys(keys)
    if x is None:
        x = keys[0] if keys else None
    if y is None:
        y = next((k for k in keys if k != x), None)
    refuse([f"plot axis {key!r} is not a swept key; swept: {', '.join(keys) or 'none'}"
            for key in (x, y) if key is not None and key not in keys], SWEEP_REFUSED)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    tag = re.sub(r"[^A-Za-z0-9._-]+", "_", metric).strip("_")

    def save(fig, kind: str, name: str) -> None:   # as DIRECTORY/NAME_TAG.png, paths[kind]
        fig.tight_layout()
        paths[kind] = os.path.join(directory, f"{name}_{tag}.png")
        fig.savefig(paths[kind], dpi=100)

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
            if not np.isfinite(grid[i, j]):
                ax.text(j, i, "n/a", ha="center", va="center", color="#666666", fontsize=8)
                continue
            level = 0.5 if high == low else (grid[i, j] - low) / (high - low)
            if mode == "min":
                level = 1 - level
            ax.text(j, i, f"{grid[i, j]:.4g}", ha="center", va="center",
                    color="black" if level > 0.6 else "white", fontsize=9)
    ax.set_xticks(range(len(xs)), [format_value(v) for v in xs])
    ax.set_yticks(range(len(ys)), [format_value(v) for v in ys] if y else [""])
    ax.set_xlabel(x or "")
    ax.set_ylabel(y or "")
    others = [names[k] for k in keys if k not in (x, y)]
    ax.set_title(metric + (f" (best over {', '.join(others)})"
                           if others and counts.max() > 1 else ""))
    save(fig, "heatmap", "heatmap")

    # Metric against parameters.
    points = [(row["params"], row["metrics"][metric], row["name"]) for row in rows
              if row.get("params") and row["metrics"].get(metric) is not None]
    if points:
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        sizes = [p[0] for p in points]
        ax.scatter(sizes, [p[1] for p in points])
        for params, value, name in points:
            ax.annotate(name, (params, value), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        if max(sizes) > 10 * min(sizes):
            ax.set_xscale("log")
        ax.margins(x=0.3, y=0.1)
        ax.set(xlabel="parameters", ylabel=metric, title=f"{metric} against model size")
        ax.grid(alpha=0.3)
        save(fig, "scatter", "params")

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
        ax.set(xlabel="step", ylabel=key, title=key)
        ax.grid(alpha=0.3)
    if drawn:
        axes[1].legend(fontsize=7, loc="best")
    save(fig, "curves", "curves")
    return paths
