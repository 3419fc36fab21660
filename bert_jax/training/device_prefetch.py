"""The trainer's batches copied to the devices ahead of their step.

`DevicePrefetch(parent, to_device, size)` applies `to_device` (the trainer's:
`sharding.global_batch` on the run's mesh) `size` batches ahead of the one asked
for, so that the copy of batch k+1 to the devices overlaps step k; it passes
whatever `to_device` returns (global `jax.Array`s `[global_batch, length]`). It
lives in training, beside the placement it runs: the input pipeline
(`bert_jax.data`, whose `concurrency` makes batches ahead on the host) never
touches a device. Like those wrappers it is a grain `DatasetIterator` whose state
is that of the last batch *returned*, however many are in flight, so a
checkpoint after step k resumes at batch k+1; `set_state` drops the batches
placed ahead and `close` closes the parent.
"""

from __future__ import annotations

import collections
import copy
from typing import Any, Callable

import grain


class DevicePrefetch(grain.DatasetIterator):
    """`to_device` runs `size` batches ahead of `parent`'s (a grain
    `DatasetIterator`); 0: when a batch is asked for."""

    def __init__(self, parent: grain.DatasetIterator, to_device: Callable[[Any], Any],
                 size: int):
        super().__init__(parent)
        self._queue: collections.deque[tuple[Any, Any]] = collections.deque()  # close() needs it
        if size < 0:
            raise ValueError(f"device prefetch size must be >= 0, got {size}")
        self._to_device, self._size, self._state = to_device, size, parent.get_state()

    def __next__(self) -> Any:
        while len(self._queue) <= self._size:  # (batch on the devices, the state after it)
            self._queue.append((self._to_device(next(self._parent)),
                                copy.deepcopy(self._parent.get_state())))
        batch, self._state = self._queue.popleft()
        return batch

    def get_state(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)

    def set_state(self, state: dict[str, Any]) -> None:
        self._queue.clear()
        self._parent.set_state(state)
        self._state = self._parent.get_state()

    def close(self) -> None:
        self._queue.clear()
        super().close()  # closes the parent

    def __str__(self) -> str:
        return f"DevicePrefetch(size={self._size})"
