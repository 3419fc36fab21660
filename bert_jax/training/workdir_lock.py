"""One writer per workdir: `WorkdirLock`, the lease on WORKDIR/train.lock that the
trainer takes and checks before each write (fencing). Importable without JAX, as
`bert_jax.training.workdir` is.
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

from bert_jax.errors import WorkdirError
from bert_jax.training.workdir import LOCK_FILE

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
            f"{self.path} {found}: this run (pid {self.record['pid']} on host {self.host}) "
            f"no longer holds {self._workdir}, where another run may be writing. It stops "
            "and writes nothing more there; let the other run go on, or stop it and rerun "
            "this command to resume from the last checkpoint.")

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


def _local_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seconds))


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0)
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
