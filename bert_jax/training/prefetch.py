"""Host-to-device prefetch: batches are on the devices before their step.

The input pipeline prepares numpy batches ahead in a host thread;
`DevicePrefetch` also starts their transfer `size` steps ahead, so the copy of
batch k+1 overlaps step k. Its state is that of the last batch *returned*, so a
checkpoint after step k resumes at batch k+1 however many are in flight.
"""

from __future__ import annotations

import collections
import copy
from typing import Any, Callable

import grain


class DevicePrefetch(grain.DatasetIterator):
    """`to_device` (e.g. `sharding.global_batch`) runs `size` batches ahead of
    `parent`'s (a grain `DatasetIterator`); 0: when a batch is asked for."""

    def __init__(self, parent: grain.DatasetIterator, to_device: Callable[[Any], Any],
                 size: int):
        super().__init__(parent)
        self._queue: collections.deque[tuple[Any, Any]] = collections.deque()  # close() needs it
        if size < 0:
            raise ValueError(f"device prefetch size must be >= 0, got {size}")
        self._to_device = to_device
        self._size = size
        self._state = parent.get_state()

    def _enqueue(self) -> None:
        batch = self._to_device(next(self._parent))
        self._queue.append((batch, copy.deepcopy(self._parent.get_state())))

    def __next__(self) -> Any:
        while len(self._queue) <= self._size:
            self._enqueue()
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
        close = getattr(self._parent, "close", None)
        if close is not None:
            close()

    def __str__(self) -> str:
        return f"DevicePrefetch(size={self._size})"
