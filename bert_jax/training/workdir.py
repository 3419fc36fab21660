"""The files of a training workdir, and their readers, importable without JAX so
that light tools can use them (the sweep runner reads a run's files while it
trains).

A workdir holds the resolved config the trainer writes (`config.json`), the
metrics log (`metrics.jsonl`, one JSON object per line, `{"step": N,
"train/loss": ..., ...}`), the checkpoint folders `checkpoints/<step>` and the
lock of the run writing there (`train.lock`), and the vocabulary (`vocab/`).
`check_workdir` is the one guard of that shape, run before anything reads or
writes a workdir, and `check_step` of the step folder a command reads. Every
reader of the metrics goes through `read_metrics`, which returns the records in
file order and reports a damaged line instead of dropping it silently;
`checkpoint_steps` lists the checkpoints; `WorkdirLock` keeps one writer per
workdir (the trainer takes it) and `refuse_writing_into` keeps the commands that
read a workdir from writing into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

from absl import logging

from bert_jax.errors import CheckpointError, WorkdirError

CONFIG_FILE = "config.json"     # the resolved config a training run writes
METRICS_FILE = "metrics.jsonl"  # one JSON object a line: {"step": N, "train/loss": ...}
CHECKPOINT_DIR = "checkpoints"  # one folder a step, named by its number in ASCII digits
VOCAB_DIR = "vocab"             # the vocabulary files (= bert_jax.data.vocabulary.VOCAB_DIR)
LOCK_FILE = "train.lock"        # {"host", "pid", "token", "started", "renewed"}: `WorkdirLock`
# What a training run makes in its workdir, by kind (`check_workdir`).
ENTRY_KINDS = {CONFIG_FILE: "file", METRICS_FILE: "file", LOCK_FILE: "file",
               CHECKPOINT_DIR: "folder", VOCAB_DIR: "folder"}
# Seconds a lock of another host stays valid without renewal (`--lock_timeout`):
# ten of its holder's renewals (every minute) can fail, a slow bucket included,
# before a restarted run takes over.
DEFAULT_LOCK_TIMEOUT = 600


class WorkdirLock:
    """One writer per workdir, taken when created: WORKDIR/train.lock, an exclusive
    `flock` on it (the kernel drops it when its process dies) and a lease: the file
    names its holder, `{"host", "pid", "token", "started", "renewed"}` (`token`: random,
    this run's alone, even where a restarted container reuses its pid; `renewed`:
    seconds since the epoch), and a daemon thread rewrites `renewed` every `renew_every`
    seconds while the run trains.

    Fencing: the holder calls `lost()` before each write into the workdir and stops,
    writing nothing more, as soon as the file no longer names it (host, pid and token):
    deleted, taken over or overwritten by another run.

    An existing lock is

    * refused when a process of this host holds its flock (it is running);
    * taken over when it names this host and no process holds its flock: its holder
      has exited (the warning says it no longer holds the lock, not that its pid is
      gone: pids are reused);
    * of another host (a bucket mounted on several VMs: flock does not reach across
      them): refused while renewed within `timeout` seconds by this host's clock (the
      error names the holder and the time left), taken over after with a warning naming
      the holder and its last renewal, so that a VM preempted and recreated under
      another name restarts its run unattended. The hosts' clocks must agree to well
      within `timeout`;
    * unreadable (`_lease`): a file that names no holder (torn, edited, another
      format), or whose `renewed` is no time of this host's clock (not a finite number,
      or more than `timeout` ahead: a skewed clock never holds a workdir for longer).
      It counts as renewed when it was last modified, by whichever host: refused
      (naming the file and why) while that is within `timeout`, taken over after. A
      lock without `renewed` (an older version's) is renewed at its modification time
      too.

    On exit the file is deleted if it still names this run. A process that locked the
    deleted file in between sees that it is no longer the path's and opens the path
    again. `clock` (time.time) is injectable for tests."""

    def __init__(self, workdir: str, timeout: float = DEFAULT_LOCK_TIMEOUT,
                 clock: Callable[[], float] = time.time):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.timeout, self._clock = timeout, clock
        self.renew_every = min(60.0, timeout / 5)
        self.host = socket.gethostname()
        fd, created = self._open_and_flock()
        try:
            if not created:
                self._take_over(fd)
            self.record = {"host": self.host, "pid": os.getpid(),
                           "token": secrets.token_hex(8), "started": _local_time(clock())}
            self.fd = fd
            self._write()
        except BaseException:
            if created:  # an empty file would be refused as "a run may be starting"
                os.unlink(self.path)
            os.close(fd)
            raise
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_until_stopped, daemon=True,
                                         name="workdir lock renewal")
        self._renewer.start()

    def _open_and_flock(self) -> tuple[int, bool]:
        """(fd, whether this process created the file) of the path, flocked."""
        for _ in range(5):
            try:
                fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                try:
                    fd, created = os.open(self.path, os.O_RDWR), False
                except FileNotFoundError:  # deleted by its holder meanwhile
                    continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _lock_record(os.pread(fd, 4096, 0))
                os.close(fd)
                who = (f"pid {holder['pid']} on host {holder['host']} (started "
                       f"{holder.get('started')})" if holder else "a process of this host")
                raise WorkdirError(f"{self._workdir} is in use by another training run: {who}, "
                                   "which holds the lock. Wait for it to finish or stop it, "
                                   "or use another --workdir.") from None
            if os.path.exists(self.path) and os.path.samestat(os.fstat(fd),
                                                               os.stat(self.path)):
                return fd, created
            os.close(fd)  # deleted by its last holder (and maybe made anew): again
        raise WorkdirError(f"{self.path} was deleted and made again 5 times while this run "
                           "tried to lock it: other runs are starting in "
                           f"{self._workdir}; use another --workdir.")

    @property
    def _workdir(self) -> str:
        return os.path.dirname(self.path)

    def _take_over(self, fd: int) -> None:
        """Warns about the takeover of an existing lock that this process flocked,
        or raises a `WorkdirError` when its lease may still run (`timeout`)."""
        now, modified = self._clock(), os.fstat(fd).st_mtime
        holder, unreadable = _lease(os.pread(fd, 4096, 0), now, self.timeout)
        renewed = holder.get("renewed", modified) if holder else modified
        age = now - renewed
        when = f"{_local_time(renewed)}, {_duration(age)} ago"
        if holder and holder["host"] == self.host:
            logging.warning("%s: took over the lock of pid %s of this host (%s), which no "
                            "longer holds it (last renewed %s).", self.path, holder["pid"],
                            self.host, when)
            return
        limit = f"--lock_timeout={self.timeout:g} s"
        if age <= self.timeout:
            left = _duration(self.timeout - age)
            what = (f"{self._workdir} is in use by another training run: pid "
                    f"{holder['pid']} on host {holder['host']} (lock last renewed {when})"
                    if holder else
                    f"{self.path} is an unreadable lock ({unreadable}), modified {when}: a "
                    f"run may be starting in {self._workdir}")
            raise WorkdirError(
                f"{what}. Wait for it to finish or stop it, or use another --workdir; if "
                f"that run is dead, its lock is taken over when not renewed for {limit} "
                f"(in {left}), or delete {self.path} now.")
        who = (f"the lock of pid {holder['pid']} on host {holder['host']}" if holder else
               f"an unreadable lock ({unreadable})")
        logging.warning("%s: took over %s: not renewed since %s, more than %s. If that run "
                        "is still going, it stops before its next write into %s (its lock "
                        "no longer names it).", self.path, who, when, limit, self._workdir)

    def lost(self) -> WorkdirError | None:
        """None while the lock file still names this run (host, pid and token); else
        the error to stop with, naming what the file holds now. One small read: the
        trainer calls it before each write into the workdir (fencing)."""
        try:
            with open(self.path, "rb") as f:
                current = _lock_record(f.read(4096))
        except FileNotFoundError:
            found = "was deleted"
        except OSError as e:
            found = f"cannot be read ({e.strerror})"
        else:
            if current and _identity(current) == _identity(self.record):
                return None
            found = ("now names no holder (not a JSON lock record)" if not current else
                     f"now names pid {current['pid']} on host {current['host']}"
                     + (" (another run: its token differs)"
                        if _identity(current)[:2] == _identity(self.record)[:2] else ""))
        return WorkdirError(
            f"{self.path} {found}, not this run (pid {self.record['pid']} on host "
            f"{self.host}): another run may be writing in {self._workdir}. This run stops "
            "before its next write there and writes nothing more; let the other run go "
            "on, or stop it and rerun this command to resume from the last checkpoint.")

    def fence(self) -> None:
        """Raises the error of `lost`, if any: the check before a write into the workdir
        (the trainer's, and the commit of an asynchronous checkpoint save)."""
        error = self.lost()
        if error:
            raise error

    def renew(self) -> bool:
        """Writes the record with `renewed` = now (fsynced: on a mounted bucket other
        hosts then see it). False, with the error of `lost` logged, once the lock no
        longer names this run."""
        lost = self.lost()
        if lost:
            logging.error("%s", lost)
            return False
        self._write()
        return True

    def _write(self) -> None:
        data = json.dumps({**self.record, "renewed": self._clock()}).encode()
        os.pwrite(self.fd, data, 0)  # then truncate: a reader never sees an empty file
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                if not self.renew():
                    return
            except OSError as e:
                logging.warning("%s: the lock could not be renewed (%s); trying again in "
                                "%g s.", self.path, e, self.renew_every)

    def __enter__(self) -> "WorkdirLock":
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._renewer.join()
        try:
            if self.lost() is None:  # never another run's lock
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)  # while flocked: no one locks it in between
        finally:
            os.close(self.fd)  # releases the flock


def _lock_record(data: bytes) -> dict[str, Any] | None:
    """The JSON object at the start of a lock file's `data` (a longer record's tail may
    follow it while it is rewritten) when it names a `host` and a `pid`, else None."""
    try:
        record, _ = json.JSONDecoder().raw_decode(data.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    if (isinstance(record, dict) and isinstance(record.get("host"), str)
            and isinstance(record.get("pid"), int)):
        return record
    return None


def _identity(record: dict[str, Any]) -> tuple:
    """What tells one run's lock from another's: (host, pid, token)."""
    return record.get("host"), record.get("pid"), record.get("token")


def _lease(data: bytes, now: float, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """(the holder, "") of a lock file's `data` whose `renewed` is absent or a time of
    this host's clock (`now`): seconds since the epoch, at most `timeout` ahead; else
    (None, why the lock is unreadable). A lease is never judged fresh by a time this
    clock cannot have reached."""
    holder = _lock_record(data)
    if holder is None:
        return None, "not a JSON lock record naming a host and a pid"
    renewed = holder.get("renewed", 0)
    if isinstance(renewed, bool) or not isinstance(renewed, (int, float)) or not (
            0 <= renewed <= now + timeout):  # False for NaN
        return None, (f"its renewed, {json.dumps(renewed)}, is no time of this host's "
                      "clock: not seconds since the epoch, or more than --lock_timeout="
                      f"{timeout:g} s ahead of it")
    return holder, ""


def refuse_writing_into(outputs: dict[str, str | None], read: dict[str, str | None]) -> None:
    """Raises a `WorkdirError` when an output of a command, `outputs` ({what: path},
    `what` naming its flag, e.g. "--output=FILE"), resolves (symbolic links followed)
    into a folder the command reads, `read` ({flag: folder}, e.g. {"--workdir": W}): a
    command that reads a training run's files never writes among them. None: not
    given. Every command that reads a workdir or a model folder checks its outputs
    here before it starts (evaluate, ablate, visualize_attention, extract_features,
    --save_average, a transfer study's runs)."""
    for what, path in outputs.items():
        for flag, folder in read.items():
            if path and folder and _inside(os.path.realpath(path), folder):
                resolved = os.path.realpath(path)
                alias = f" (it is {resolved})" if resolved != os.path.abspath(path) else ""
                raise WorkdirError(
                    f"{what}{alias} lies inside {flag}={folder}, which this command reads: "
                    "it never writes among a training run's files. Choose a path outside "
                    f"{os.path.realpath(folder)}.")


def _local_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seconds))


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0)
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The records of WORKDIR/metrics.jsonl in file order (none when it is absent),
    each a dict with an int "step". Damage never drops a record silently: see
    `parse_metrics`; what it finds is logged once per process (one warning naming
    FILE:LINE), as the sweep runner reads the file again and again."""
    path = os.path.join(workdir, METRICS_FILE)
    records, problems = parse_metrics(path)
    report_metrics_damage(path, problems)
    return records


def parse_metrics(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, problems) of a metrics file: a line that is not one JSON record
    (torn by a crash, edited) is skipped and named, the records after it kept; two
    or more records on one line (a lost newline) are all kept; bytes that are not
    UTF-8 are replaced by U+FFFD. A last line without its newline may be one the
    trainer is writing: skipped unreported (a resume drops it)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], []
    records, problems = [], []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        try:
            text, replaced = raw.decode("utf-8"), False
        except UnicodeDecodeError:
            text, replaced = raw.decode("utf-8", errors="replace"), True
        found, damaged = _json_records(text)
        records.extend(found)
        writing = number == len(lines)  # no newline after it (yet)
        what = [*(["bytes that are not UTF-8, replaced by U+FFFD"] if replaced else []),
                *([f"{len(found)} records on one line (a lost newline): all kept"]
                  if len(found) > 1 and not damaged else []),
                *([f"not a JSON record{f' ({len(found)} recovered from it)' if found else ''}"
                   ", skipped"] if damaged and not writing else [])]
        if what:
            problems.append(f"{path}:{number}: {'; '.join(what)}")
    return records, problems


def _json_records(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The {"step": int, ...} objects in `text`, one after another, and whether
    anything else was there; after a damaged part the search restarts at the next
    "{" (a torn record followed by whole ones)."""
    decoder, records, damaged, position = json.JSONDecoder(), [], False, 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return records, damaged
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            damaged, position = True, text.find("{", position + 1)
            if position < 0:
                return records, damaged
            continue
        step = value.get("step") if isinstance(value, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            records.append(value)
        else:
            damaged = True


_REPORTED: set[tuple[str, ...]] = set()


def report_metrics_damage(path: str, problems: list[str], kept: str | None = None) -> None:
    """One warning for `problems` (of `parse_metrics`), unless already given;
    `kept`: where the damaged file was copied before it was rewritten."""
    if problems and (kept or tuple(problems) not in _REPORTED):
        _REPORTED.add(tuple(problems))  # the problems name the file
        logging.warning("%s.%s", "; ".join(problems),
                        f" The file as it was is kept as {kept}." if kept else "")


def is_step_name(name: str) -> bool:
    """Whether `name` names a step folder: ASCII digits only (`str.isdigit` takes "²",
    "٣" too, which `int` reads as another step or not at all)."""
    return name.isascii() and name.isdigit()


def checkpoint_steps(directory: str) -> list[int]:
    """The checkpoint steps in a workdir's `checkpoints/` folder, ascending: its entries
    named by `is_step_name` (an interrupted save's `N.orbax-checkpoint-tmp*` is not
    one; `check_step` tells whether one holds a checkpoint)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if is_step_name(d))


def check_workdir(workdir: str) -> None:
    """Raises a `WorkdirError` naming the first entry of `workdir` that is not what a
    training run makes there, and what to do: an entry of `ENTRY_KINDS` of the other
    kind (or a link that leads nowhere) or unreadable, or in `checkpoints/` a name of
    digits that are not ASCII. Run once before anything reads or writes the workdir
    (the trainer, `evaluation.saved_config`), so that no command reads a part of it
    and writes over the rest: a resume never starts from step 0 beside a
    `checkpoints` it cannot read."""
    for name, kind in ENTRY_KINDS.items():
        path = os.path.join(workdir, name)
        problem = _entry_problem(path, kind)
        if problem:
            raise WorkdirError(f"{path} {problem}: it is not what a training run makes "
                               "there. Move it out of the workdir or fix it, then rerun.")
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        if name.isdigit() and not is_step_name(name):
            raise WorkdirError(f"{os.path.join(directory, name)}: a step folder is named by "
                               f"ASCII digits (0-9), and {name!r} is not. Rename it or move "
                               f"it out of {directory}, then rerun.")


def check_step(workdir: str, step: int | None, flag: str | None) -> int | None:
    """`step`, else the latest of `checkpoint_steps` (None: there is none), once its
    folder is found sound: a folder one can read, not empty, and a symbolic link only
    into the workdir. Else a `CheckpointError` naming its real problem and, as `--FLAG`
    (`rerun_with`), the last earlier step that is sound. A step that does not exist is
    left to the caller."""
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    steps = checkpoint_steps(directory)
    step = steps[-1] if step is None and steps else step
    problem = step in steps and _step_problem(workdir, step)
    if not problem:
        return step
    earlier = max((s for s in steps if s < step and not _step_problem(workdir, s)),
                  default=None)
    use = (f"no earlier step holds a checkpoint: move it out of {directory}"
           if earlier is None else f"use --{flag}={earlier}" if flag else
           f"the last sound step before it is {earlier}")
    raise CheckpointError(
        f"step {step} ({os.path.join(directory, str(step))}) {problem}: {use}.", damaged=True,
        rerun_with={flag: earlier} if flag and earlier is not None else None)


def _step_problem(workdir: str, step: int) -> str | None:
    """What is wrong with the folder of `step` (see `check_step`), or None."""
    path = os.path.join(workdir, CHECKPOINT_DIR, str(step))
    problem = _entry_problem(path, "folder")
    if problem is None and os.path.islink(path) and not _inside(
            os.path.realpath(path), workdir, os.path.join(workdir, CHECKPOINT_DIR)):
        problem = f"is a symbolic link out of the workdir (to {os.path.realpath(path)})"
    if problem or os.listdir(path):
        return problem
    return "is empty: no checkpoint was saved there"


def _entry_problem(path: str, kind: str) -> str | None:
    """What is wrong with `path`, which must be a `kind` ("file" or "folder") that this
    process can read; None when nothing is, or it does not exist."""
    if not os.path.lexists(path):
        return None
    if not os.path.exists(path):
        return "is a symbolic link that leads nowhere (a loop, or its target is gone)"
    actual = "folder" if os.path.isdir(path) else "file" if os.path.isfile(path) else (
        "special file")
    if actual != kind:
        return f"is a {actual}, not a {kind}"
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        return "cannot be read (its permissions)"
    return None


def _inside(path: str, *folders: str) -> bool:
    """Whether the resolved `path` lies in one of `folders` (symbolic links followed)."""
    return any(os.path.commonpath([path, os.path.realpath(f)]) == os.path.realpath(f)
               for f in folders)
