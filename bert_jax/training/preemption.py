"""The trainer's handling of preemption notices (SIGTERM) and Ctrl-C (SIGINT):
each becomes one step, the same on every process, at which all processes save
a checkpoint and stop, without a cross-host collective at every training step.

`PreemptionWatcher` installs the signal handlers; the trainer
(`bert_jax.training.trainer`) calls `requested(step)` after every step and
saves and stops when it returns True, and `close()` at the very end, after its
workdir lock is released, which restores the previous handlers: until then a
further signal cannot tear the final save. How the processes agree depends on
how they run (`choose_mechanism`, described in the class docstring): JAX's
preemption sync manager under `jax.distributed`, a local flag for one process,
else a flag all-gathered every `check_every` steps
($BERT_JAX_PREEMPTION_CHECK_EVERY, default 10).
"""

from __future__ import annotations

import os
import signal
import threading

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

CHECK_EVERY_ENV = "BERT_JAX_PREEMPTION_CHECK_EVERY"
DEFAULT_CHECK_EVERY = 10

LOCAL_FLAG = "local SIGTERM flag"
SYNC_MANAGER = "JAX preemption sync manager"
PERIODIC_ALLGATHER = "SIGTERM flag all-gathered every N steps"


def sync_manager_available() -> bool:
    """True when `jax.distributed` is initialised and created its preemption sync
    manager (it does unless the `jax_enable_preemption_service` option is off)."""
    try:
        from jax._src import distributed as jax_distributed
    except ImportError:  # a JAX without this private module: use the fallback
        return False
    state = jax_distributed.global_state
    return (getattr(state, "client", None) is not None
            and getattr(state, "preemption_sync_manager", None) is not None)


def choose_mechanism() -> str:
    """How notices reach every process: `SYNC_MANAGER` under `jax.distributed`,
    `LOCAL_FLAG` for one process, else `PERIODIC_ALLGATHER`."""
    if sync_manager_available():
        return SYNC_MANAGER
    if jax.process_count() == 1:
        return LOCAL_FLAG
    return PERIODIC_ALLGATHER


def check_every_steps(check_every: int | None = None) -> int:
    """`check_every`, else $BERT_JAX_PREEMPTION_CHECK_EVERY, else the default."""
    value = check_every if check_every is not None else int(
        os.environ.get(CHECK_EVERY_ENV, DEFAULT_CHECK_EVERY))
    if value < 1:
        raise ValueError(f"preemption check_every={value}: use a positive number of steps.")
    return value


class PreemptionWatcher:
    """A step at which every process saves a checkpoint and stops, after a SIGTERM:

    * Under `jax.distributed`: JAX's preemption sync manager (Orbax's
      `reached_preemption` uses it too). It installs its own C++ SIGTERM handler,
      so this class installs none (a Python one would replace it). The processes
      agree once on the step after the furthest any has reported; between notices
      `requested` is a local comparison: no collective, no RPC.
    * One process: a Python SIGTERM handler's local flag.
    * Several processes without the sync manager (libtpu without
      `jax.distributed`, or `jax_enable_preemption_service` off): that flag OR-ed
      over the processes by one `process_allgather` every `check_every` steps (the
      same on every process): up to `check_every - 1` more steps before the
      checkpoint, which must stay well inside the grace period.

    `begin(first_step)` (the constructor, unless `first_step` is None) installs the
    handlers and reports `first_step` (where training resumes) at once, so a notice
    before the first `requested` is agreed on for the first step run. `requested(step)`
    must then be called at every step, with consecutive steps, the same on every
    process: the sync manager fires only at exactly the agreed step.

    Ctrl-C (SIGINT) is a notice too: the first saves and stops as SIGTERM does (under
    the sync manager this process sends itself SIGTERM, which JAX's handler reports);
    a second stops at once: `KeyboardInterrupt`, which `launch/cli.py` reports in one
    line.

    Once the run is stopping (`requested` returned True: its checkpoint is being saved;
    or a second Ctrl-C stopped it), a signal interrupts nothing until `close`: it is
    acknowledged in one line, and a Ctrl-C then is raised (`KeyboardInterrupt`) when
    the watcher closes. The trainer closes it last, after the final save and the
    workdir lock's release, so that no second signal tears the save or leaves the lock.
    """

    def __init__(self, first_step: int | None = 0, check_every: int | None = None):
        self.mechanism = choose_mechanism()
        self.check_every = check_every_steps(check_every)
        self._event = threading.Event()
        self._previous: dict[int, object] = {}
        self._interrupted = False  # a first Ctrl-C was received
        self._stopping = False  # the final save began, or a second Ctrl-C stopped the run
        self._acknowledged = False  # a signal while stopping was reported
        self._interrupt_when_closed = False  # a Ctrl-C came while stopping
        if first_step is not None:
            self.begin(first_step)

    def begin(self, first_step: int) -> None:
        """Installs the handlers; `first_step`: where training resumes."""
        if self.mechanism == SYNC_MANAGER:
            multihost_utils.reached_preemption_sync_point(first_step)
        self._install_handlers()
        logging.info("preemption notices: %s%s", self.mechanism,
                     f" (N={self.check_every})" if self.mechanism == PERIODIC_ALLGATHER
                     else "")

    def _install_handlers(self) -> None:
        """Catches SIGINT, and SIGTERM unless the sync manager's C++ handler has it,
        in Python (signals can only be set in the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self.mechanism != SYNC_MANAGER:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)

    def _handle(self, signum, frame, advice: str = "") -> None:
        if self._event.is_set() or self._stopping:
            return self._acknowledge(signum)
        where = ("at the next step" if self.mechanism == LOCAL_FLAG else
                 "at the step every process agrees on" if self.mechanism == SYNC_MANAGER else
                 f"at the next preemption check (every {self.check_every} steps)")
        logging.warning("%s received: saving a checkpoint %s, then stopping.%s",
                        signal.Signals(signum).name, where, advice)
        self._event.set()

    def _interrupt(self, signum, frame) -> None:
        if self._stopping:
            self._interrupt_when_closed = True
            return self._acknowledge(signum)
        if self._interrupted:
            self._stopping = True
            logging.warning("SIGINT received again: stopping now, without that checkpoint.")
            raise KeyboardInterrupt
        self._interrupted = True
        self._handle(signum, frame, " Ctrl-C again stops at once, without it.")
        if self.mechanism == SYNC_MANAGER:
            os.kill(os.getpid(), signal.SIGTERM)  # to JAX's handler: a preemption notice

    def _acknowledge(self, signum) -> None:
        """One line for the signals that come while the run is already stopping."""
        if not self._acknowledged:
            self._acknowledged = True
            logging.warning("%s received again: the run is already stopping%s; it exits "
                            "once its checkpoint is saved and its workdir lock released "
                            "(further signals are ignored until then).",
                            signal.Signals(signum).name,
                            "" if self._stopping else " (a checkpoint at the next step)")

    def requested(self, step: int) -> bool:
        """True when a checkpoint must be saved at `step` (then stop training)."""
        if self.mechanism == SYNC_MANAGER:
            requested = self._reached_sync_point(step)
        elif self.mechanism == LOCAL_FLAG:
            requested = self._event.is_set()
        else:
            requested = step % self.check_every == 0 and self._any_process_flagged()
        self._stopping = self._stopping or requested
        return requested

    def _reached_sync_point(self, step: int) -> bool:
        if not multihost_utils.reached_preemption_sync_point(step):
            return False
        logging.warning("SIGTERM (a preemption notice) reached a process: all %d processes "
                        "save a checkpoint at step %d, the step they agreed on.",
                        jax.process_count(), step)
        return True

    def _any_process_flagged(self) -> bool:
        flags = multihost_utils.process_allgather(np.array(self._event.is_set()))
        return bool(np.any(flags))

    def close(self) -> None:
        """Restores the handlers that were there before, where this set one; then raises
        the `KeyboardInterrupt` of a Ctrl-C that came while the run was stopping."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._interrupt_when_closed:
            self._interrupt_when_closed = False
            raise KeyboardInterrupt

    def __enter__(self) -> "PreemptionWatcher":
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            self.close()
        except KeyboardInterrupt:
            if exc_type is None:  # never in place of the error that stopped the run
                raise
