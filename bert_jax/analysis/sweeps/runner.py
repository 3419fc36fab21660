"""The runner: a sweep's runs over a base config, trained here one after
another or written out as launcher commands (print, tpu_vm, slurm)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from bert_jax.analysis.sweeps.files import (
    DONE_FILE, OVERRIDES_FILE, RUN_FILE, SWEEP_FILE, _now, count_parameters, is_finished,
    read_record, run_checkpoint_steps)
from bert_jax.analysis.sweeps.names import run_name
from bert_jax.analysis.sweeps.points import SweepError, apply_overrides, as_points, validate
from bert_jax.file_io import jsonable, write_json
from bert_jax.training.workdir import read_metrics

LAUNCHERS = ("local", "print", "tpu_vm", "slurm")
COMMANDS_FILE = "commands.sh"


def flag_text(value: Any) -> str:
    """A value as `--config.KEY=` text that ml_collections' config_flags parses
    back to it (bools as true/false, tuples and lists as literals)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    if isinstance(value, (dict, type(None))):
        return repr(value)
    return str(value)


def override_flags(overrides: dict[str, Any]) -> list[str]:
    return [f"--config.{k}={flag_text(v)}" for k, v in overrides.items()]


@dataclasses.dataclass
class Run:
    index: int
    name: str
    overrides: dict[str, Any]     # the point's overrides only
    workdir: str                  # local path (files, local training)
    command_workdir: str          # --workdir in launcher commands


class Sweep:
    """The runs of a sweep over a base config.

    Args:
      config: the base ConfigDict (base overrides already applied).
      directory: the sweep directory.
      points: a list of override dicts or a one-line spec string.
      config_file: `experiments/X.py[:ARG]`, for launcher commands.
      base_overrides: flat overrides applied to every run (recorded, and
        repeated in launcher commands; a point's own value wins).
      launcher: 'local' (train here, one after another) or 'print',
        'tpu_vm', 'slurm' (commands).
      command_directory: the sweep directory as the launched jobs see it
        (default: `directory` as given).
      launcher_flags: extra arguments for `tpu_vm.py train` (e.g. --zone=Z) or
        `sbatch` (e.g. --nodes=1 --gpus-per-node=1 --ntasks-per-node=1).
      tpu_name: TPU VM name, a format string of {index} and {name}.
      train_fn: `train_fn(config, workdir)`, default the trainer's
        train_and_evaluate (tests pass a counting wrapper).
      log: where progress lines go (default stderr).
    """

    def __init__(self, config: Any, directory: str, points, *,
                 config_file: str | None = None,
                 base_overrides: dict[str, Any] | None = None,
                 launcher: str = "local", command_directory: str | None = None,
                 launcher_flags: Sequence[str] = (), tpu_name: str = "bert-jax-{index}",
                 python: str = "python",
                 train_fn: Callable[[Any, str], dict] | None = None,
                 log: Callable[[str], None] | None = None):
        if launcher not in LAUNCHERS:
            raise SweepError(f"launcher={launcher!r}: use one of {', '.join(LAUNCHERS)}")
        self.config = config
        self.directory = directory
        self.spec = points if isinstance(points, str) else None
        self.points = as_points(points)
        validate(self.points, config)
        self.config_file = config_file
        self.base_overrides = dict(base_overrides or {})
        self.launcher = launcher
        self.launcher_flags = list(launcher_flags)
        self.tpu_name = tpu_name
        self.python = python
        self.train_fn = train_fn
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        command_directory = command_directory or directory
        self.runs = []
        names: dict[str, dict] = {}
        for i, point in enumerate(self.points):
            name = run_name(point)
            if name in names:
                raise SweepError(f"points {names[name]} and {point} share the run name "
                                 f"{name!r} (a repeated point?)", token=name)
            names[name] = point
            self.runs.append(Run(i, name, dict(point), os.path.join(directory, name),
                                 os.path.join(command_directory, name)))

    # Files.

    def num_steps(self, run: Run) -> int:
        return int(apply_overrides(self.config, run.overrides).train.num_steps)

    def prepare(self) -> None:
        """Writes DIR/sweep.json and each run's overrides.json."""
        os.makedirs(self.directory, exist_ok=True)
        sweep_file = os.path.join(self.directory, SWEEP_FILE)
        previous = read_record(sweep_file) or {}
        names = list(dict.fromkeys([*previous.get("runs", []),
                                    *(r.name for r in self.runs)]))
        write_json(sweep_file, jsonable({
            "config_file": self.config_file,
            "spec": self.spec,
            "base_overrides": self.base_overrides,
            "points": list(self.points),
            "runs": names,   # this sweep's runs after any earlier ones in DIR
            "launcher": self.launcher,
            "updated": _now(),
        }))
        for run in self.runs:
            os.makedirs(run.workdir, exist_ok=True)
            path = os.path.join(run.workdir, OVERRIDES_FILE)
            saved = read_record(path)
            record = jsonable({"name": run.name, "overrides": run.overrides,
                               "base_overrides": self.base_overrides,
                               "config_file": self.config_file,
                               "num_steps": self.num_steps(run)})
            if saved and saved.get("overrides") != record["overrides"]:
                raise SweepError(f"{path} holds other overrides ({saved.get('overrides')}) "
                                 f"than this point ({run.overrides})", token=run.name)
            write_json(path, record)

    # Local runs.

    def run(self, *, stop_on_error: bool = False) -> dict[str, str]:
        """Trains every unfinished point here, one after another, stopping
        after a preempted one. Returns {run name: 'skipped' | 'done' | 'failed'
        | 'interrupted'}."""
        if self.launcher != "local":
            raise SweepError(f"run() trains locally; launcher={self.launcher!r} uses launch()")
        self.prepare()
        outcome = {}
        for run in self.runs:
            outcome[run.name] = self.run_one(run, stop_on_error=stop_on_error)
            if outcome[run.name] == "interrupted":   # preempted: stop here
                break
        return outcome

    def run_one(self, run: Run, *, stop_on_error: bool = False) -> str:
        config = apply_overrides(self.config, run.overrides)
        num_steps = int(config.train.num_steps)
        run_file = os.path.join(run.workdir, RUN_FILE)
        if is_finished(run.workdir, num_steps):
            self.log(f"sweep: [{run.index + 1}/{len(self.runs)}] {run.name}: finished "
                     f"({num_steps} steps), skipped")
            if not os.path.exists(os.path.join(run.workdir, DONE_FILE)):
                write_json(os.path.join(run.workdir, DONE_FILE), {"num_steps": num_steps})
            return "skipped"
        train_fn = self.train_fn
        if train_fn is None:
            from bert_jax.training.trainer import train_and_evaluate
            train_fn = train_and_evaluate
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
            info["status"] = status
            info["end_time"] = session["end"]
            info["wall_seconds"] = sum(s.get("seconds", 0.0) for s in info["sessions"])
            if error:
                info["error"] = error
            else:
                info.pop("error", None)
            write_json(run_file, info)

        try:
            if info.get("params") is None:  # shapes only; a bad config fails here
                info["params"] = count_parameters(config, run.workdir)
                write_json(run_file, info)
            self.log(f"sweep: [{run.index + 1}/{len(self.runs)}] {run.name}: "
                     + (f"resuming from step {resume}" if resume else "starting")
                     + f" ({info['params']:,} parameters, {num_steps} steps)")
            train_fn(config, run.workdir)
        except KeyboardInterrupt:
            finish("interrupted")
            raise
        except Exception as e:  # noqa: BLE001 - recorded, then re-raised or skipped
            finish("failed", "".join(traceback.format_exception_only(type(e), e)).strip())
            self.log(f"sweep: {run.name} failed: {e}")
            if stop_on_error:
                raise
            return "failed"
        if not any(step >= num_steps for step in run_checkpoint_steps(run.workdir)):
            # The trainer returns early after a preemption (SIGTERM) checkpoint.
            finish("interrupted")
            self.log(f"sweep: {run.name}: stopped before step {num_steps} (preempted); "
                     "relaunch the sweep to resume it")
            return "interrupted"
        finish("done")
        write_json(os.path.join(run.workdir, DONE_FILE),
                   {"num_steps": num_steps, "time": _now()})
        self.log(f"sweep: {run.name}: done in {info['wall_seconds']:.1f}s")
        return "done"

    # Launcher commands.

    def train_flags(self, run: Run) -> list[str]:
        if not self.config_file:
            raise SweepError("launcher commands need config_file (experiments/X.py[:ARG])")
        overrides = {**self.base_overrides, **run.overrides}
        return [f"--config={self.config_file}", f"--workdir={run.command_workdir}",
                *override_flags(overrides)]

    def command(self, run: Run) -> list[str]:
        """The argv that trains `run` with this sweep's launcher."""
        flags = self.train_flags(run)
        if self.launcher in ("print", "local"):
            return [self.python, "launch/train.py", *flags]
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
        raise AssertionError(self.launcher)

    def commands(self) -> list[list[str]]:
        return [self.command(run) for run in self.runs]

    def launch(self, *, submit: bool = False, out=None) -> list[str]:
        """Writes DIR/commands.sh and prints one shell-quoted command per run
        (finished runs are left out); with `submit`, also runs each one."""
        self.prepare()
        out = out or sys.stdout
        lines = []
        for run in self.runs:
            if is_finished(run.workdir, self.num_steps(run)):
                self.log(f"sweep: {run.name}: finished, no command")
                continue
            lines.append(shlex.join(self.command(run)))
        with open(os.path.join(self.directory, COMMANDS_FILE), "w") as f:
            f.write("#!/bin/bash\n# One command per run of the sweep; run from the "
                    "repository root.\n" + "".join(line + "\n" for line in lines))
        for line in lines:
            print(line, file=out, flush=True)
        if submit:
            for line in lines:
                rc = subprocess.run(shlex.split(line)).returncode
                if rc:
                    raise SweepError(f"command failed with exit status {rc}: {line}")
        return lines
