r"""A sweep's runs: their names, their directories' files, and `Sweep`, which
trains them here one after another or writes launcher commands.

A sweep directory holds one workdir per point, named by `run_name`::

    DIR/sweep.json            the sweep: config file, base overrides, points, runs
    DIR/<run>/overrides.json  the point's overrides (written before it runs)
    DIR/<run>/run.json        parameters, status, sessions (start/end, steps), wall time
    DIR/<run>/DONE            written when a local run finished its steps
    DIR/<run>/config.json, metrics.jsonl, checkpoints/ ...   the trainer's
    DIR/results.csv, results.md, *.png                        `results`
    DIR/commands.sh           launcher commands (print/tpu_vm/slurm)
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Sequence

from bert_jax.analysis.sweeps.points import apply_overrides, as_points, validate
from bert_jax.config_schema import SWEEP_REFUSED, check_config, choice, refuse
from bert_jax.errors import DamagedFileError
from bert_jax.file_io import jsonable, read_json, write_json
from bert_jax.training.workdir import read_metrics
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps

SWEEP_FILE = "sweep.json"
OVERRIDES_FILE = "overrides.json"
RUN_FILE = "run.json"
DONE_FILE = "DONE"
COMMANDS_FILE = "commands.sh"
LAUNCHERS = ("local", "print", "tpu_vm", "slurm")
MAX_NAME_LENGTH = 80
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def short_keys(keys: Iterable[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix that no other key shares."""
    keys = list(dict.fromkeys(keys))
    out = {}
    for key in keys:
        parts = key.split(".")
        out[key] = key
        for n in range(1, len(parts)):
            suffix = ".".join(parts[-n:])
            if not any(o == suffix or o.endswith("." + suffix) for o in keys if o != key):
                out[key] = suffix
                break
    return out


def format_value(value: Any) -> str:
    """A short text form of a value (names, tables, plot labels)."""
    if isinstance(value, float):  # numpy floats too, as run names always had them
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(format_value(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def run_name(overrides: dict[str, Any]) -> str:
    """A stable, readable, filesystem-safe name: `num_heads=2,num_layers=1`
    (keys sorted, shortened by `short_keys`). Values that need other
    characters, or names longer than MAX_NAME_LENGTH, get an 8-hex hash of the
    exact overrides as a suffix, so different points never share a name."""
    if not overrides:
        return "base"
    names = short_keys(sorted(overrides))
    texts = {k: format_value(overrides[k]) for k in overrides}
    readable = ",".join(f"{names[k]}={texts[k]}" for k in sorted(overrides))
    safe = _UNSAFE.sub("_", readable.replace("(", "").replace(")", ""))
    lossy = safe != readable or any("," in t or "=" in t for t in texts.values())
    if lossy or len(safe) > MAX_NAME_LENGTH:
        canonical = json.dumps([[k, repr(overrides[k])] for k in sorted(overrides)])
        digest = hashlib.sha1(canonical.encode()).hexdigest()[:8]
        safe = safe[:MAX_NAME_LENGTH - 9].rstrip("_") + "-" + digest
    return safe


def read_record(path: str) -> Any:
    """The JSON file at `path`, or None when it is absent or unreadable."""
    try:
        return read_json(path)
    except (OSError, DamagedFileError):
        return None


def run_checkpoint_steps(workdir: str) -> list[int]:
    return checkpoint_steps(os.path.join(workdir, CHECKPOINT_DIR))


def is_finished(workdir: str, num_steps: int) -> bool:
    """A DONE marker for at least `num_steps`, or a checkpoint of that step."""
    done = read_record(os.path.join(workdir, DONE_FILE))
    if isinstance(done, dict) and int(done.get("num_steps", -1)) >= num_steps:
        return True
    return any(step >= num_steps for step in run_checkpoint_steps(workdir))


def count_parameters(config: Any, workdir: str) -> int:
    """The model's parameter count from shapes only (`jax.eval_shape`; nothing
    is allocated). The task may write its vocabulary into `workdir`."""
    import jax
    import numpy as np
    from bert_jax.tasks import build_task

    task = build_task(config, workdir)
    shapes = jax.eval_shape(task.init_variables, jax.random.PRNGKey(0))
    params = shapes["params"] if "params" in shapes else shapes
    return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params)))


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def flag_text(value: Any) -> str:
    """`value` as `--config.KEY=` text that ml_collections' config_flags parses
    back to it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    return str(value)


@dataclasses.dataclass
class Run:
    index: int
    name: str
    overrides: dict[str, Any]     # the point's overrides only
    workdir: str                  # local path (files, local training)
    command_workdir: str          # --workdir in launcher commands
    labels: dict[str, Any] | None = None   # what names the run, when not its overrides


class Sweep:
    """The runs of `points` (override dicts or a spec) over `config` (base
    overrides already applied). `base_overrides` are recorded and repeated in
    launcher commands (a point's own value wins); `config_file`
    (`experiments/X.py[:ARG]`) is for launcher commands; `command_directory`
    is `directory` as the launched jobs see it; `tpu_name` formats {index} and
    {name}; `train_fn(config, workdir)` defaults to the trainer's. `labels`,
    one dict a point, name the runs in place of their overrides (e.g.
    `{"backbone": "bert", "seed": 1}` for a point of many model fields) and are
    recorded in overrides.json."""

    def __init__(self, config: Any, directory: str, points, *,
                 config_file: str | None = None,
                 base_overrides: dict[str, Any] | None = None,
                 launcher: str = "local", command_directory: str | None = None,
                 launcher_flags: Sequence[str] = (), tpu_name: str = "bert-jax-{index}",
                 python: str = "python",
                 train_fn: Callable[[Any, str], dict] | None = None,
                 log: Callable[[str], None] | None = None,
                 labels: Sequence[dict[str, Any]] | None = None):
        self.config = config
        self.directory = directory
        self.spec = points if isinstance(points, str) else None
        self.points = as_points(points)
        validate(self.points, config)
        self.config_file = config_file
        self.base_overrides = dict(base_overrides or {})
        self.launcher = choice("launcher", launcher, LAUNCHERS)
        self.launcher_flags = list(launcher_flags)
        self.tpu_name = tpu_name
        self.python = python
        self.train_fn = train_fn
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        command_directory = command_directory or directory
        labels = [None] * len(self.points) if labels is None else [dict(x) for x in labels]
        problems = [] if len(labels) == len(self.points) else [
            f"{len(labels)} labels for {len(self.points)} points"]
        self.runs = []
        names: dict[str, dict] = {}
        for i, (point, label) in enumerate(zip(self.points, labels)):
            name = run_name(point if label is None else label)
            if name in names:
                problems.append(f"points {names[name]} and {label or point} share the run "
                                f"name {name!r}; remove the repeated point")
            names[name] = label or point
            self.runs.append(Run(i, name, dict(point), os.path.join(directory, name),
                                 os.path.join(command_directory, name), label))
        refuse(problems, SWEEP_REFUSED)

    def num_steps(self, run: Run) -> int:
        return int(apply_overrides(self.config, run.overrides).train.num_steps)

    def prepare(self) -> None:
        """Writes DIR/sweep.json and each run's overrides.json."""
        os.makedirs(self.directory, exist_ok=True)
        sweep_file = os.path.join(self.directory, SWEEP_FILE)
        previous = read_record(sweep_file) or {}
        write_json(sweep_file, jsonable({
            "config_file": self.config_file,
            "spec": self.spec,
            "base_overrides": self.base_overrides,
            "points": list(self.points),
            # This sweep's runs after any earlier ones in DIR.
            "runs": list(dict.fromkeys([*previous.get("runs", []),
                                        *(r.name for r in self.runs)])),
            "launcher": self.launcher,
            "updated": _now(),
        }))
        problems = []
        for run in self.runs:
            os.makedirs(run.workdir, exist_ok=True)
            path = os.path.join(run.workdir, OVERRIDES_FILE)
            saved = read_record(path)
            record = jsonable({"name": run.name, "overrides": run.overrides,
                               "base_overrides": self.base_overrides,
                               "config_file": self.config_file,
                               "num_steps": self.num_steps(run)})
            if run.labels is not None:
                record["labels"] = jsonable(run.labels)
            if saved and saved.get("overrides") != record["overrides"]:
                problems.append(f"{path} holds other overrides ({saved.get('overrides')}) "
                                f"than this point ({run.overrides}); use another --workdir")
            else:
                write_json(path, record)
        refuse(problems, SWEEP_REFUSED)

    def run(self, *, stop_on_error: bool = False) -> dict[str, str]:
        """Trains every unfinished point here, one after another, stopping
        after a preempted one. Returns {run name: 'skipped' | 'done' | 'failed'
        | 'interrupted'}."""
        if self.launcher != "local":
            refuse([f"run() trains locally; launcher={self.launcher!r} uses launch()"],
                   SWEEP_REFUSED)
        self.prepare()
        outcome = {}
        for run in self.runs:
            outcome[run.name] = self.run_one(run, stop_on_error=stop_on_error)
            if outcome[run.name] == "interrupted":
                break
        return outcome

    def run_one(self, run: Run, *, stop_on_error: bool = False) -> str:
        config = apply_overrides(self.config, run.overrides)
        num_steps = int(config.train.num_steps)
        run_file = os.path.join(run.workdir, RUN_FILE)
        done_file = os.path.join(run.workdir, DONE_FILE)
        counter = f"sweep: [{run.index + 1}/{len(self.runs)}] {run.name}:"
        if is_finished(run.workdir, num_steps):
            self.log(f"{counter} finished ({num_steps} steps), skipped")
            if not os.path.exists(done_file):
                write_json(done_file, {"num_steps": num_steps})
            return "skipped"
        if self.train_fn is None:
            from bert_jax.training.trainer import train_and_evaluate
            self.train_fn = train_and_evaluate
        info = read_record(run_file) or {}
        info.update({"name": run.name, "overrides": jsonable(run.overrides),
                     "num_steps": num_steps, "status": "running"})
        resume = (run_checkpoint_steps(run.workdir) or [0])[-1]
        session = {"start": _now(), "start_time": time.time(), "first_step": resume,
                   "host": socket.gethostname()}
        info.setdefault("sessions", []).append(session)
        info.setdefault("start_time", session["start"])
        write_json(run_file, info)

        def finish(status: str, error: str | None = None):
            session["end"] = _now()
            session["end_time"] = time.time()
            session["seconds"] = session["end_time"] - session["start_time"]
            session["last_step"] = max([*run_checkpoint_steps(run.workdir),
                                        *(m["step"] for m in read_metrics(run.workdir)), 0])
            info.update(status=status, end_time=session["end"],
                        wall_seconds=sum(s.get("seconds", 0.0) for s in info["sessions"]))
            info.pop("error", None)
            if error:
                info["error"] = error
            write_json(run_file, info)

        try:
            check_config(config)  # the rules of the config alone, as launch/train.py
            if info.get("params") is None:  # shapes only; a bad config fails here
                info["params"] = count_parameters(config, run.workdir)
                write_json(run_file, info)
            self.log(f"{counter} " + (f"resuming from step {resume}" if resume else "starting")
                     + f" ({info['params']:,} parameters, {num_steps} steps)")
            self.train_fn(config, run.workdir)
        except KeyboardInterrupt:
            finish("interrupted")
            raise
        except Exception as e:  # noqa: BLE001 - recorded, then re-raised or skipped
            finish("failed", "".join(traceback.format_exception_only(type(e), e)).strip())
            self.log(f"sweep: {run.name} failed: {e}")
            if stop_on_error:
                raise
            return "failed"
        if not is_finished(run.workdir, num_steps):
            # The trainer returns early after a preemption (SIGTERM) checkpoint.
            finish("interrupted")
            self.log(f"sweep: {run.name}: stopped before step {num_steps} (preempted); "
                     "relaunch the sweep to resume it")
            return "interrupted"
        finish("done")
        write_json(done_file, {"num_steps": num_steps, "time": _now()})
        self.log(f"sweep: {run.name}: done in {info['wall_seconds']:.1f}s")
        return "done"

    def train_flags(self, run: Run) -> list[str]:
        if not self.config_file:
            refuse(["launcher commands need config_file (experiments/X.py[:ARG])"],
                   SWEEP_REFUSED)
        overrides = {**self.base_overrides, **run.overrides}
        return [f"--config={self.config_file}", f"--workdir={run.command_workdir}",
                *(f"--config.{k}={flag_text(v)}" for k, v in overrides.items())]

    def command(self, run: Run) -> list[str]:
        """The argv that trains `run` with this sweep's launcher."""
        flags = self.train_flags(run)
        if self.launcher == "tpu_vm":
            name = self.tpu_name.format(index=run.index, name=run.name)
            return [self.python, "launch/tpu_vm.py", "train", name, *self.launcher_flags,
                    "--", *flags]
        if self.launcher == "slurm":
            job = [f"--job-name={run.name}"]
            if os.path.abspath(run.command_workdir) == os.path.abspath(run.workdir):
                job.append(f"--output={run.command_workdir}/slurm-%j.out")
            return ["sbatch", *job, *self.launcher_flags, "launch/slurm_train.sbatch",
                    *flags]
        return [self.python, "launch/train.py", *flags]

    def commands(self) -> list[list[str]]:
        return [self.command(run) for run in self.runs]

    def launch(self, *, submit: bool = False, out=None) -> list[str]:
        """Writes DIR/commands.sh and prints one shell-quoted command per
        unfinished run; with `submit`, also runs each one."""
        self.prepare()
        lines = []
        for run in self.runs:
            if is_finished(run.workdir, self.num_steps(run)):
                self.log(f"sweep: {run.name}: finished, no command")
            else:
                lines.append(shlex.join(self.command(run)))
        with open(os.path.join(self.directory, COMMANDS_FILE), "w") as f:
            f.write("#!/bin/bash\n# One command per run of the sweep; run from the "
                    "repository root.\n" + "".join(line + "\n" for line in lines))
        for line in lines:
            print(line, file=out or sys.stdout, flush=True)
        if submit:
            for line in lines:
                rc = subprocess.run(shlex.split(line)).returncode
                if rc:
                    refuse([f"command failed with exit status {rc}: {line}"],
                           "the sweep's launcher failed")
        return lines
