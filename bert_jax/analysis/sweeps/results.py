"""Results: one row per run of a sweep directory (whatever state it is in),
and the tables (results.csv, results.md) made of them."""

from __future__ import annotations

import csv
import math
import os
import re
from typing import Any, Sequence

from bert_jax.analysis.sweeps.files import (
    OVERRIDES_FILE, RUN_FILE, SWEEP_FILE, is_finished, read_record, run_checkpoint_steps)
from bert_jax.analysis.sweeps.names import format_value, short_keys
from bert_jax.training.workdir import CONFIG_FILE, read_metrics


def _run_dirs(directory: str) -> list[str]:
    sweep = read_record(os.path.join(directory, SWEEP_FILE)) or {}
    names = [n for n in sweep.get("runs", [])
             if os.path.exists(os.path.join(directory, n, OVERRIDES_FILE))]
    try:
        others = sorted(d for d in os.listdir(directory)
                        if d not in names
                        and os.path.exists(os.path.join(directory, d, OVERRIDES_FILE)))
    except OSError:
        others = []
    return names + others


def _estimated_seconds(lines: list[dict]) -> float | None:
    """Training seconds from the logged steps/s (no evaluation time)."""
    total, previous = 0.0, 0
    for line in lines:
        rate = line.get("perf/steps_per_second")
        if rate:
            total += (line["step"] - previous) / rate
            previous = line["step"]
    return total or None


def collect(directory: str) -> list[dict[str, Any]]:
    """One row per run of the sweep directory, whatever state it is in.

    Row keys: name, workdir, overrides, status ('not started', 'unfinished',
    'interrupted', 'failed', or 'done': a DONE marker or a checkpoint of the
    final step), step, num_steps, params, wall_seconds
    (wall_source: 'run.json' or 'metrics' (training time from steps/s, no
    evaluation)), start_time, end_time, metrics (each key's last logged value),
    metrics_step, config (config.json, or None), error."""
    rows = []
    for name in _run_dirs(directory):
        workdir = os.path.join(directory, name)
        record = read_record(os.path.join(workdir, OVERRIDES_FILE)) or {}
        info = read_record(os.path.join(workdir, RUN_FILE)) or {}
        config = read_record(os.path.join(workdir, CONFIG_FILE))
        lines = read_metrics(workdir)
        num_steps = None
        if isinstance(config, dict):
            num_steps = config.get("train", {}).get("num_steps")
        num_steps = record.get("num_steps") or info.get("num_steps") or num_steps
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
            last = max([os.path.getmtime(p) for p in
                        (os.path.join(workdir, "metrics.jsonl"),) if os.path.exists(p)]
                       or [sessions[-1]["start_time"]])
            wall = (wall or 0.0) + max(0.0, last - sessions[-1]["start_time"])
        if wall is None:
            wall, source = _estimated_seconds(lines), "metrics"
        rows.append({
            "name": record.get("name", name), "workdir": workdir,
            "overrides": record.get("overrides", {}), "status": status, "step": step,
            "num_steps": num_steps, "params": info.get("params"),
            "wall_seconds": wall, "wall_source": source if wall is not None else None,
            "start_time": info.get("start_time"), "end_time": info.get("end_time"),
            "metrics": metrics, "metrics_step": lines[-1]["step"] if lines else None,
            "config": config, "error": info.get("error"),
        })
    return rows


def _override_keys(rows: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row["overrides"]))


def _metric_columns(rows: Sequence[dict], metrics: Sequence[str] | None) -> list[str]:
    if metrics:
        return list(metrics)
    return sorted({k for row in rows for k in row["metrics"] if k.startswith("eval/")})


def _human_seconds(seconds: float | None, estimated: bool = False) -> str:
    if seconds is None:
        return ""
    prefix = "~" if estimated else ""
    seconds = float(seconds)
    if seconds < 60:
        return f"{prefix}{seconds:.1f}s"
    if seconds < 3600:
        return f"{prefix}{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{prefix}{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table(rows: Sequence[dict], metrics: Sequence[str] | None = None
          ) -> tuple[list[str], list[list[Any]], list[str], list[list[str]]]:
    """(csv header, csv rows, markdown header, markdown rows)."""
    keys = _override_keys(rows)
    names = short_keys(keys)
    columns = _metric_columns(rows, metrics)
    csv_header = ["run", "status", *keys, "params", *columns, "step", "num_steps",
                  "wall_seconds"]
    md_header = ["run", "status", *(names[k] for k in keys), "params", *columns, "steps",
                 "wall time"]
    csv_rows, md_rows = [], []
    for row in rows:
        values = [row["overrides"].get(k) for k in keys]
        found = [row["metrics"].get(c) for c in columns]
        csv_rows.append([row["name"], row["status"],
                         *(format_value(v) if isinstance(v, (list, tuple, dict)) else v
                           for v in values),
                         row["params"], *found, row["step"], row["num_steps"],
                         None if row["wall_seconds"] is None
                         else round(row["wall_seconds"], 3)])
        md_rows.append([row["name"], row["status"],
                        *("" if k not in row["overrides"] else format_value(v)
                          for k, v in zip(keys, values)),
                        "" if row["params"] is None else f"{row['params']:,}",
                        *(_number(v) for v in found),
                        f"{row['step']}/{row['num_steps'] or '?'}",
                        _human_seconds(row["wall_seconds"], row["wall_source"] == "metrics")])
    return csv_header, csv_rows, md_header, md_rows


def markdown(rows: Sequence[dict], metrics: Sequence[str] | None = None) -> str:
    """The results as a Markdown table (one line per run)."""
    _, _, header, body = table(rows, metrics)

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    numeric = [all(_looks_numeric(r[i]) for r in body if r[i] != "") and
               any(r[i] != "" for r in body) for i in range(len(header))]
    rule = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in body)]) + "\n"


def _looks_numeric(text: str) -> bool:
    return bool(re.fullmatch(r"~?[-+0-9.,e/hms]+|nan|True|False", str(text)))


def write_tables(rows: Sequence[dict], directory: str,
                 metrics: Sequence[str] | None = None) -> str:
    """Writes DIR/results.csv and DIR/results.md; returns the Markdown table.
    Columns: run, status, the overrides, params, the final value of each metric
    in `metrics` (default: every eval/* metric), steps, wall time."""
    header, body, _, _ = table(rows, metrics)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "results.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if v is None else v for v in r] for r in body])
    text = markdown(rows, metrics)
    with open(os.path.join(directory, "results.md"), "w") as f:
        f.write(text)
    return text
