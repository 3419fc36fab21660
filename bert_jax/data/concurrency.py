"""The input's concurrency: batches made ahead in a thread or in worker processes
(the trainer's `training.device_prefetch` copies them to the devices ahead).

`pipeline.train_iterator` makes a local batch, a dict of numpy arrays
`[local_batch, length]` (scalar features `[local_batch]`), from one row stream
per row; its state is JSON with per-row lists `consumed` and `filtered`
(`[local_batch]` each) beside scalars (`step`, seed, layout). The wrappers here
change when and where batches are made, never which ones:

- `ThreadPrefetch`: the parent's batches made ahead in one host thread.
- `BlockWorkers`: the local rows split into contiguous blocks of rows, each
  made by its own spawned process (a row iterator of `[len(block), length]`
  batches, its state the block's slice of the per-row lists); the batch and
  state are the blocks' concatenated in row order, so they are the same for
  any number of workers. Workers ignore Ctrl-C (the trainer answers it with a
  checkpoint and needs batches meanwhile); a worker's exception is raised
  again, with its type, by the `next` that reads it.

All are grain `DatasetIterator`s whose state is that of the last batch
*returned*, however many are in flight, so a checkpoint after step k resumes at
batch k+1; `set_state` drops the batches made ahead and `close` stops threads
and processes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import functools
import multiprocessing
import queue
import signal
from collections.abc import Callable
from typing import Any

import grain
import numpy as np

_PER_ROW = ("consumed", "filtered")  # the state's per-row lists, split among blocks


class ThreadPrefetch(grain.DatasetIterator):
    """`parent`'s batches made ahead in one worker thread: `size + 1` are
    pending (made or being made) after each `next`; the state is that of the
    last batch returned, so checkpoints stay exact.

    Not grain's `ThreadPrefetchIterDataset`: its daemon thread can still be in
    array_record's C++ reader at interpreter exit, which aborts the process
    (`terminate called without an active exception`, exit code 134). A
    `ThreadPoolExecutor` worker is joined before teardown.
    """

    def __init__(self, parent: grain.DatasetIterator, size: int):
        super().__init__(parent)
        self._size = size
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: collections.deque[concurrent.futures.Future] = collections.deque()
        self._state = parent.get_state()

    def _produce(self):
        element = next(self._parent)
        return element, copy.deepcopy(self._parent.get_state())

    def start_prefetch(self) -> None:
        """Starts producing batches (grain's CheckpointRestore calls this)."""
        self._assert_not_closed()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="bert_jax-train-prefetch")
        while len(self._pending) <= self._size:
            self._pending.append(self._pool.submit(self._produce))

    def __next__(self) -> Any:
        self.start_prefetch()
        element, self._state = self._pending.popleft().result()
        self.start_prefetch()
        return element

    def _drain(self) -> None:
        """Cancels the batches produced ahead; waits for the one in progress."""
        for future in self._pending:
            future.cancel()
        for future in self._pending:
            if not future.cancelled():
                try:
                    future.result()
                except Exception:  # noqa: BLE001 - discarded work
                    pass
        self._pending.clear()

    def get_state(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)

    def set_state(self, state: dict[str, Any]) -> None:
        self._drain()
        self._parent.set_state(state)
        self._state = self._parent.get_state()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._drain()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        except Exception:  # noqa: BLE001 - may run during interpreter teardown
            pass

    def __str__(self) -> str:
        return f"ThreadPrefetch(size={self._size})"


def _block_worker(make_rows: Callable[[], grain.DatasetIterator], state: dict[str, Any],
                  out: Any) -> None:
    """Worker process: the batches of one block of rows, each with its state,
    into the bounded queue `out`, an error too; it ends when its parent is gone.
    It ignores Ctrl-C, which a terminal sends to the whole process group: the
    trainer answers it (a checkpoint, then a stop) and needs its batches meanwhile."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rows = make_rows()
        rows.set_state(state)
        while True:
            item = (next(rows), rows.get_state())
            while True:
                try:
                    out.put(item, timeout=5)
                    break
                except queue.Full:
                    if not multiprocessing.parent_process().is_alive():
                        return
    except BaseException as e:  # noqa: BLE001 - raised again by the reader
        out.put(e)


class BlockWorkers(grain.DatasetIterator):
    """The local batches of `rows` made by `workers` spawned processes, each
    a contiguous block of the rows: `make_rows(first, count)` (picklable) is
    the iterator of rows `[first, first + count)`, as `rows` is of all of them
    (rows are independent streams). Batch and state are the concatenation of
    theirs, so they and a resume are the same for any worker count. Workers
    start at the first batch and again after `set_state`; each has up to
    `prefetch` batches (at least 1) in its queue and one more being made.
    """

    def __init__(self, rows: grain.DatasetIterator, make_rows: Callable[[int, int], Any],
                 workers: int, prefetch: int):
        super().__init__()
        self._rows = rows               # the whole local batch: checks states
        self._make_rows, self._prefetch = make_rows, max(prefetch, 1)
        self._state, self._running = rows.get_state(), []
        self._blocks = np.array_split(np.arange(len(self._state["consumed"])), workers)

    def start_prefetch(self) -> None:
        if self._running:
            return
        context = multiprocessing.get_context("spawn")
        for block in self._blocks:
            state = {**self._state, **{key: self._state[key][block[0]:block[-1] + 1]
                                       for key in _PER_ROW}}
            out = context.Queue(self._prefetch)
            process = context.Process(target=_block_worker, daemon=True, args=(
                functools.partial(self._make_rows, block[0], len(block)), state, out))
            process.start()
            self._running.append((process, out))

    def _get(self, process, out):
        while True:
            try:
                item = out.get(timeout=5)
            except queue.Empty:
                if not process.is_alive():
                    raise RuntimeError(f"train_iterator: an input worker process exited "
                                       f"(code {process.exitcode})") from None
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def __next__(self) -> dict[str, np.ndarray]:
        self._assert_not_closed()
        self.start_prefetch()
        parts = [self._get(*running) for running in self._running]
        self._state = {**parts[0][1], **{key: [n for _, state in parts for n in state[key]]
                                         for key in _PER_ROW}}
        return {key: np.concatenate([batch[key] for batch, _ in parts])
                for key in parts[0][0]}

    def get_state(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)

    def set_state(self, state: dict[str, Any]) -> None:
        self._rows.set_state(state)     # raises on another pipeline's state
        self._stop()
        self._state = self._rows.get_state()

    def _stop(self) -> None:
        for process, _ in self._running:
            process.kill()
            process.join()
        self._running = []

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop()

