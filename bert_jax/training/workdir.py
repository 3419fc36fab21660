"""The files of a training workdir, and their readers, importable without JAX so
that light tools can use them (the sweep runner reads a run's files while it
trains).

A workdir holds the resolved config the trainer writes (`config.json`), the
metrics log (`metrics.jsonl`, one JSON object per line, `{"step": N,
"train/loss": ..., ...}`), the checkpoint folders `checkpoints/<step>` and the
lock of the run writing there (`train.lock`). Every reader of the metrics goes
through `read_metrics`, which returns the records in file order and reports a
damaged line instead of dropping it silently; `checkpoint_steps` lists the
complete checkpoints; `WorkdirLock` keeps one writer per workdir (the trainer
takes it).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from typing import Any, Callable

from absl import logging

from bert_jax.errors import WorkdirError
from bert_jax.workdir_layout import CHECKPOINT_DIR, checkpoint_steps  # noqa: F401 (re-exported)

CONFIG_FILE = "config.json"     # the resolved config a training run writes
METRICS_FILE = "metrics.jsonl"  # one JSON object a line: {"step": N, "train/loss": ...}
LOCK_FILE = "train.lock"        # {"host", "pid", "started", "renewed"}: `WorkdirLock`
# Seconds a lock of another host stays valid without renewal (`--lock_timeout`):
# ten of its holder's renewals (every minute) can fail, a slow bucket included,
# before a restarted run takes over.
DEFAULT_LOCK_TIMEOUT = 600


class WorkdirLock:
    """One writer per workdir, taken when created: WORKDIR/train.lock, an exclusive
    `flock` on it (the kernel drops it when its process dies) and a lease: the file
    names its holder, `{"host", "pid", "started", "renewed"}` (`renewed`: seconds since
    the epoch), and a daemon thread rewrites `renewed` every `renew_every` seconds
    while the run trains. An existing lock is

    * refused when a process of this host holds its flock (it is running);
    * taken over when it names this host and no process holds its flock: its holder
      has exited (the warning says it no longer holds the lock, not that its pid is
      gone: pids are reused);
    * of another host (a bucket mounted on several VMs: flock does not reach across
      them): refused while renewed within `timeout` seconds (the error names the
      holder and the time left), taken over after with a warning naming the holder
      and its last renewal, so that a VM preempted and recreated under another name
      restarts its run unattended. The hosts' clocks must agree to well within
      `timeout`;
    * a file that names no holder (torn, edited, another format): treated as renewed
      when it was last modified, by whichever host: refused (naming the file) while
      that is within `timeout`, taken over after. A lock file without `renewed` (an
      older version's) is renewed at its modification time too.

    On exit the file is deleted, unless another run took it over meanwhile; a process
    that locked the deleted file in between sees that it is no longer the path's and
    opens the path again. `clock` (time.time) is injectable for tests."""

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
                           "started": _local_time(clock())}
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
        holder, stat = _lock_record(os.pread(fd, 4096, 0)), os.fstat(fd)
        renewed = holder.get("renewed") if holder else None
        if not isinstance(renewed, (int, float)) or isinstance(renewed, bool):
            renewed = stat.st_mtime
        age = self._clock() - renewed
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
                    f"{self.path} names no holder (not a JSON lock record) and was "
                    f"modified {when}: a run may be starting in {self._workdir}")
            raise WorkdirError(
                f"{what}. Wait for it to finish or stop it, or use another --workdir; if "
                f"that run is dead, its lock is taken over when not renewed for {limit} "
                f"(in {left}), or delete {self.path} now.")
        who = (f"the lock of pid {holder['pid']} on host {holder['host']}" if holder else
               "a lock file that names no holder (not a JSON lock record)")
        logging.warning("%s: took over %s: not renewed since %s, more than %s. If that run "
                        "is still going, stop it: two runs now write in %s.", self.path, who,
                        when, limit, self._workdir)

    def renew(self) -> bool:
        """Writes the record with `renewed` = now (fsynced: on a mounted bucket other
        hosts then see it). False, with an error logged, when another run has taken
        the lock over (this run's renewals stopped for longer than its timeout)."""
        with open(self.path, "rb") as f:
            current = _lock_record(f.read(4096))
        if current and (current["host"], current["pid"]) != (self.host, self.record["pid"]):
            logging.error("%s was taken over by pid %s on host %s: this run's lock was not "
                          "renewed in time. Two runs write in %s: stop one.", self.path,
                          current["pid"], current["host"], self._workdir)
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
            with open(self.path, "rb") as f:
                current = _lock_record(f.read(4096))
            if not current or (current["host"], current["pid"]) == (self.host,
                                                                     self.record["pid"]):
                os.unlink(self.path)  # while locked: no one takes a lock on it in between
        except FileNotFoundError:
            pass
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
