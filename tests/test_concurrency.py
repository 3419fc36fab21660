"""The input's concurrency (`bert_jax/data/concurrency.py`): a prefetch thread,
worker processes and device prefetch return their parent's batches in order,
make a bounded number ahead, pass a worker's exception on with its type, leave
no thread or process behind, and checkpoint the position of the last batch
returned.

Spawned workers import this module to unpickle `_Rows`: JAX, Flax and the tiny
models are imported inside the tests that need them, so a worker starts fast.
"""

import os
import pathlib
import signal
import threading
import time
from functools import partial

import grain
import numpy as np
import pytest

from bert_jax.data.concurrency import BlockWorkers, ThreadPrefetch
from bert_jax.data.pipeline import train_iterator
from bert_jax.training.device_prefetch import DevicePrefetch

SOURCE = [{"inputs": np.full(3 + i % 5, 3 + i, np.int32),
           "targets": np.full(2 + i % 4, 3 + i, np.int32)} for i in range(50)]


class _Rows(grain.DatasetIterator):
    """Rows `[first, first + count)`: batch `k` is `{"x": 1000 * row + k}`, the
    state per-row lists as `train_iterator`'s; `fail_at`: the batch that raises
    a KeyError; `log`: a directory where each batch made adds a line to a file
    named after `first`."""

    def __init__(self, log: str | None, fail_at: int | None, first: int, count: int):
        super().__init__()
        self._log, self._fail_at, self._first = log, fail_at, first
        self._rows = np.arange(first, first + count)
        self._step, self.made = 0, 0

    def __next__(self):
        if self._step == self._fail_at:
            raise KeyError(f"row block {self._first}: batch {self._step}")
        self.made += 1
        if self._log is not None:
            with open(os.path.join(self._log, str(self._first)), "a") as f:
                f.write(f"{self._step}\n")
        self._step += 1
        return {"x": 1000 * self._rows + self._step - 1}

    def get_state(self):
        return {"step": self._step, "seed": 0, "consumed": [self._step] * len(self._rows),
                "filtered": [0] * len(self._rows)}

    def set_state(self, state):
        if state["seed"] != 0:
            raise ValueError(f"seed={state['seed']}")
        self._step = state["step"]


def _wait_for(count, what, timeout=120.0):
    """Polls `count()` until it is `what` (a loaded machine starts processes
    slowly), then checks that it stays there: nothing more is made ahead."""
    deadline = time.monotonic() + timeout
    while count() < what and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert count() == what


def _made(log: pathlib.Path, first: int) -> int:
    path = log / str(first)
    return len(path.read_text().splitlines()) if path.exists() else 0


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("bert_jax-train-prefetch")]


def test_thread_prefetch_keeps_order_and_state_and_makes_size_plus_one_ahead():
    parent = _Rows(None, None, 0, 3)
    it = ThreadPrefetch(parent, size=2)
    for k in range(3):
        np.testing.assert_array_equal(next(it)["x"], [k, 1000 + k, 2000 + k])
        assert it.get_state()["step"] == k + 1  # the last batch returned, not made
        _wait_for(lambda: parent.made, k + 1 + 3)  # 3 = size + 1 pending
    state = it.get_state()
    next(it)
    it.set_state(state)  # drops the batches made ahead
    np.testing.assert_array_equal(next(it)["x"], [3, 1003, 2003])
    assert _prefetch_threads()
    it.close()
    assert not _prefetch_threads()
    with pytest.raises(ValueError, match="closed"):
        next(it)


def test_thread_prefetch_raises_the_parents_error():
    it = ThreadPrefetch(_Rows(None, 2, 0, 1), size=3)
    next(it), next(it)
    with pytest.raises(KeyError, match="batch 2"):
        next(it)
    it.close()
    assert not _prefetch_threads()


@pytest.mark.slow
def test_block_workers_keep_row_order_ignore_ctrl_c_bound_depth_and_stop(tmp_path):
    """5 rows in 3 workers (rows 0-1, 2-3, 4): the batches and states of one
    iterator of the 5 rows; each worker `prefetch` + 1 batches ahead."""
    reference = _Rows(None, None, 0, 5)
    it = BlockWorkers(_Rows(None, None, 0, 5), partial(_Rows, str(tmp_path), None),
                      workers=3, prefetch=2)
    expected = next(reference)
    np.testing.assert_array_equal(next(it)["x"], expected["x"])
    assert it.get_state() == reference.get_state()
    processes = [process for process, _ in it._running]
    assert len(processes) == 3
    for first in (0, 2, 4):
        _wait_for(lambda: _made(tmp_path, first), 1 + 2 + 1)  # returned + queue + held
    for process in processes:  # a terminal's Ctrl-C reaches the whole process group
        os.kill(process.pid, signal.SIGINT)
    for _ in range(4):
        np.testing.assert_array_equal(next(it)["x"], next(reference)["x"])
        assert it.get_state() == reference.get_state()
    assert all(process.is_alive() for process in processes)
    with pytest.raises(ValueError, match="seed=1"):
        it.set_state({**it.get_state(), "seed": 1})
    it.close()
    assert not any(process.is_alive() for process in processes)


@pytest.mark.slow
def test_a_workers_exception_reaches_the_reader_with_its_type(tmp_path):
    it = BlockWorkers(_Rows(None, None, 0, 4), partial(_Rows, None, 1), workers=2,
                      prefetch=1)
    np.testing.assert_array_equal(next(it)["x"], [0, 1000, 2000, 3000])
    with pytest.raises(KeyError, match="row block 0: batch 1"):
        next(it)
    processes = [process for process, _ in it._running]
    it.close()
    assert processes and not any(process.is_alive() for process in processes)


def _pipeline():
    from tiny_models import translation_preprocess  # imports JAX: not in the workers
    return train_iterator(SOURCE, global_batch_size=8, seed=0, process_index=0,
                          process_count=1, preprocess=translation_preprocess,
                          max_length=8, prefetch=0)


@pytest.mark.parametrize("size", [0, 1, 3])
def test_device_prefetch_is_transparent_and_resumes_exactly(size):
    import jax

    from bert_jax.training.sharding import global_batch, make_mesh
    mesh = make_mesh((-1, 1, 1))
    transfers = []

    def to_device(batch):
        transfers.append(batch["inputs"][0, 0])
        return global_batch(batch, mesh)

    reference = _pipeline()
    expected = [next(reference) for _ in range(10)]
    it = DevicePrefetch(_pipeline(), to_device, size)
    for k in range(4):
        batch = next(it)
        assert isinstance(batch["inputs"], jax.Array)
        assert batch["inputs"].sharding.mesh.shape == mesh.shape
        np.testing.assert_array_equal(np.asarray(batch["inputs"]), expected[k]["inputs"])
        assert len(transfers) == k + 1 + size  # `size` batches already on the devices
    state = it.get_state()
    assert state["step"] == 4  # the last batch returned, not the last transferred
    resumed = DevicePrefetch(_pipeline(), to_device, size)
    resumed.set_state(state)
    for k in range(4, 10):
        np.testing.assert_array_equal(np.asarray(next(resumed)["targets"]),
                                      expected[k]["targets"])
    it.set_state(state)  # rewinding drops the batches in flight
    np.testing.assert_array_equal(np.asarray(next(it)["inputs"]), expected[4]["inputs"])
    it.close()
    resumed.close()


def test_negative_size_is_refused():
    with pytest.raises(ValueError, match="size.*-1"):
        DevicePrefetch(_pipeline(), lambda b: b, -1)
