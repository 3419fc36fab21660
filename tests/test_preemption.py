"""Preemption (SIGTERM) without a per-step cross-host collective: JAX's sync
manager under `jax.distributed`, the every-N-steps fallback, and two training
processes of which one is sent SIGTERM."""

import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from bert_jax.training import preemption
from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.preemption import PreemptionWatcher
from helpers import REPO, finish, free_port, launch, losses

# ----------------------------------------------------------------------------
# The fallback: several processes, no sync manager.


@pytest.fixture
def two_processes_without_sync_manager(monkeypatch):
    """Makes this process one of two without JAX's preemption sync manager and
    fakes `process_allgather` (the other process's flag: the next of
    `other_flags`, False when empty). Returns (this process's gathered flags,
    other_flags)."""
    gathered, other_flags = [], []

    def allgather(flag):
        gathered.append(bool(flag))
        return np.array([bool(flag), other_flags.pop(0) if other_flags else False])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    return gathered, other_flags


def watch(steps, watcher: PreemptionWatcher) -> list[int]:
    """The steps among `steps` at which `watcher` asks for a checkpoint."""
    return [step for step in steps if watcher.requested(step)]


def test_fallback_gathers_the_flag_only_every_n_steps(two_processes_without_sync_manager,
                                                      monkeypatch):
    gathered, _ = two_processes_without_sync_manager
    monkeypatch.setenv(preemption.CHECK_EVERY_ENV, "4")
    watcher = PreemptionWatcher()
    try:
        assert watcher.mechanism == preemption.PERIODIC_ALLGATHER
        assert watch(range(1, 7), watcher) == [] and gathered == [False]  # step 4 only
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch(range(7, 10), watcher) == [8] and gathered == [False, True]
    finally:
        watcher.close()


def test_fallback_stops_when_another_process_was_signalled(
        two_processes_without_sync_manager):
    gathered, other_flags = two_processes_without_sync_manager
    other_flags.extend([False, True])
    watcher = PreemptionWatcher(check_every=3)
    try:
        assert watch(range(1, 7), watcher) == [6] and gathered == [False, False]
    finally:
        watcher.close()


def test_check_every_must_be_positive():
    with pytest.raises(ValueError, match="check_every=0"):
        preemption.check_every_steps(0)


# ----------------------------------------------------------------------------
# JAX's preemption sync manager, one process under jax.distributed.

SYNC_MANAGER_SCRIPT = """
import os, signal, sys, time
import jax
from jax.experimental import multihost_utils
sys.path.insert(0, {repo!r})
from bert_jax.training.preemption import PreemptionWatcher

def no_collective(*args, **kwargs):
    raise AssertionError("process_allgather was called")

jax.distributed.initialize("127.0.0.1:{port}", num_processes=1, process_id=0)
jax.process_count = lambda: 2  # as in a multi-process job, where the old code gathered
multihost_utils.process_allgather = no_collective
watcher = PreemptionWatcher()
print("mechanism:", watcher.mechanism)
checkpoints = []
for step in range(1, 3000):
    if watcher.requested(step):
        checkpoints.append(step)
    if checkpoints and step == checkpoints[0] + 20:
        break
    if step == {signal_at}:
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)
print("checkpoints at steps", checkpoints)
"""


@pytest.mark.slow
def test_sync_manager_catches_sigterm_without_a_collective():
    """A real coordination service and a real SIGTERM, in one process that
    claims to be one of two: it survives the signal (JAX's handler, not the
    default), no collective runs, and `requested` is True at exactly one step
    after the signal."""
    script = SYNC_MANAGER_SCRIPT.format(repo=str(REPO), port=free_port(), signal_at=10)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"mechanism: {preemption.SYNC_MANAGER}" in result.stdout
    found = re.search(r"checkpoints at steps \[(\d+)\]", result.stdout)
    assert found and int(found.group(1)) > 10, result.stdout + result.stderr


# ----------------------------------------------------------------------------
# Two training processes; SIGTERM to one of them.

TWO_PROCESS_RUN = {"train.num_steps": 1000, "train.checkpoint_every": 100000,
                   "train.log_every": 5, "train.eval_every": 100000,
                   "optimizer.warmup_steps": 5, "data.bleu_examples": 0}


@pytest.fixture
def start_job():
    """Starts training jobs of `count` processes (one CPU device each) in a
    workdir; kills any process still running when the test ends."""
    started = []

    def start(workdir, overrides: dict, count: int = 2) -> list:
        port = free_port()
        started.extend(launch("train.py", workdir, overrides, devices=1,
                              extra=[f"--coordinator_address=127.0.0.1:{port}",
                                     f"--num_processes={count}", f"--process_id={i}"])
                       for i in range(count))
        return started[-count:]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


def finish_all(processes) -> list[str]:
    """Every process's output, after checking that each exited cleanly."""
    outputs = []
    for process in processes:
        code, out = finish(process, timeout=240)
        assert code == 0, out
        outputs.append(out)
    return outputs


def wait_for_training(workdir, processes, seconds: float = 180) -> None:
    """Returns once process 0 has logged a training loss."""
    deadline = time.time() + seconds
    while not (workdir / "metrics.jsonl").exists() or not losses(workdir):
        for process in processes:
            if process.poll() is not None:
                pytest.fail("exited before training:\n" + process.communicate()[0])
        assert time.time() < deadline, f"no training loss logged within {seconds}s"
        time.sleep(0.05)


def preemption_step(output: str) -> int:
    """The step of the preemption checkpoint that a process's log reports."""
    found = re.search(r"stopping after the preemption checkpoint at step (\d+)", output)
    assert found, output
    return int(found.group(1))


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes(tmp_path, data_dir, start_job):  # noqa: F811
    """Both processes save the same step and exit 0; the run resumes from it."""
    overrides = {**TWO_PROCESS_RUN, "data.data_dir": data_dir}
    processes = start_job(tmp_path, overrides)
    wait_for_training(tmp_path, processes)
    processes[1].send_signal(signal.SIGTERM)
    outputs = finish_all(processes)
    assert all("SIGTERM" in out for out in outputs)
    step, other = map(preemption_step, outputs)
    assert step == other < TWO_PROCESS_RUN["train.num_steps"]
    assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [step]

    for out in finish_all(start_job(tmp_path, {**overrides, "train.num_steps": step + 5})):
        assert f"resumed from {tmp_path}/checkpoints/{step}" in out, out
    assert Checkpointer(str(tmp_path), read_only=True).all_steps() == [step, step + 5]
    assert max(losses(tmp_path)) == step + 5
