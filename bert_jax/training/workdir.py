"""The files of a training workdir, readable without JAX (the sweep runner
reads them while its runs train): the resolved config, the metrics log and the
checkpoint folders `checkpoints/<step>`."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from absl import logging

from bert_jax.errors import UserError

CONFIG_FILE = "config.json"     # the resolved config a training run writes
METRICS_FILE = "metrics.jsonl"  # one JSON object a line: {"step": N, "train/loss": ...}
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "train.lock"        # {"host", "pid", "started"} of the run writing here; empty: none


class WorkdirError(UserError, RuntimeError):
    """The workdir cannot be used."""


class WorkdirLock:
    """One writer per workdir (taken when created): an exclusive `flock` on
    WORKDIR/train.lock, which the kernel drops when the process dies (a killed run's
    lock is taken over). flock may not reach across hosts, so the file also names its
    holder; one on another host is refused until the user deletes the file. Deleted
    on exit; a process that locked the deleted file meanwhile sees it is no longer
    the path's and stops."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK_FILE)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = not (os.path.exists(self.path) and os.path.samestat(
                os.fstat(fd), os.stat(self.path)))  # or deleted by its last holder
        except BlockingIOError:
            held = True
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:  # torn by a crash mid-write: no holder
            holder = {}
        host = socket.gethostname()
        if held or holder.get("host", host) != host:
            os.close(fd)
            who = (f"pid {holder.get('pid')} on host {holder.get('host')} (started "
                   f"{holder.get('started')})" if holder else "another process")
            raise WorkdirError(
                f"{os.path.dirname(self.path)} is in use by another training run: {who}. "
                "Wait for it to finish or stop it, or use another --workdir; if that run "
                f"is dead, delete {self.path}.")
        if holder:
            logging.warning("%s: took over the lock of pid %s, which is no longer running.",
                            self.path, holder.get("pid"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": host, "pid": os.getpid(), "started": time.strftime(
            "%Y-%m-%dT%H:%M:%S%z")}).encode(), 0)
        self.fd = fd

    def __enter__(self) -> "WorkdirLock":
        return self

    def __exit__(self, *exc_info) -> None:
        os.unlink(self.path)  # while locked: no one takes a lock on it in between
        os.close(self.fd)  # releases the flock


def read_metrics(workdir: str) -> list[dict[str, float]]:
    """The lines of WORKDIR/metrics.jsonl; none when it is absent, and a torn
    line (the trainer is writing it) is skipped."""
    out = []
    try:
        with open(os.path.join(workdir, METRICS_FILE)) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def checkpoint_steps(directory: str) -> list[int]:
    """The complete checkpoint steps in a workdir's `checkpoints/` folder,
    ascending (an interrupted save's `N.orbax-checkpoint-tmp*` is not one)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if d.isdigit())
