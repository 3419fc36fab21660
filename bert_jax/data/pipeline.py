"""Grain input pipelines: static-shape, deterministic, checkpointable batches.

Batches are dicts of numpy arrays: a 1-D feature of `preprocess` becomes
`[local_batch, max_length]`, padded with 0 (the pad id), a scalar
`[local_batch]`; integer and bool features are int32, floating ones float32.

Training (`train_iterator`, infinite): the dataset shuffled with `seed`, a
new permutation each epoch, is a stream of positions 0, 1, 2, ... Row `r` of
every global batch (`G = global_batch_size` rows) reads its own *row stream*,
positions `r, r + G, r + 2G, ...`, skipping the examples longer than
`max_length` (dropped, not truncated: a cut target would teach the model to
stop mid-sentence; logged, and counted by `num_filtered`). Process `p` of `P`
makes rows `[p * L, (p + 1) * L)`, `L = G // P`, reading only their examples.
So with nothing dropped global batch `k` is positions `[k * G, (k + 1) * G)`,
and a row depends only on the seed and the row, never on the process count:
the concatenated local batches are the same for 1, 2 or 8 processes.
Packing (`pack_length > 0`): a row takes the next examples of its stream
while every 1-D feature fits in `pack_length` slots, with segment ids and
positions (`_Packer`); both properties hold.

The state (`step`, per row `consumed` and `filtered`, and the seed, layout
and dataset size, which `set_state` checks) is JSON and exact: `set_state`
then `next` gives the batch the saved iterator would have. Batches are made
ahead in a thread, or by worker processes each making a block of the rows
(`concurrency.py`); the state is still that of the last batch returned.

Evaluation (`eval_batches`, one pass in dataset order): global batch `k` is
examples `[k * G, (k + 1) * G)`, the rows split as in training; positions past
the end and too-long examples (counted, logged) are all-zero rows, so every
process yields `ceil(len(source) / G)` batches. The losses weight pad id 0 as
zero, so a task must weight an example by a token feature (`inputs != 0`),
not by a scalar label, whose padding 0 is a valid class.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from absl import logging

from bert_jax.data.concurrency import BlockWorkers, ThreadPrefetch

Example = Mapping[str, Any]
Batch = dict[str, np.ndarray]
Preprocess = Callable[[Example], Mapping[str, Any]]
# (local batch, 0-based global step, first global row of this process) -> batch
BatchTransform = Callable[[Batch, int, int], Batch]
MaxLength = int | Mapping[str, int]

_SHUFFLE_PURPOSE = 0x5EED  # mixed into the user seed for the shuffle seed


@dataclasses.dataclass
class _Prepare:
    """`preprocess`, then every 1-D feature padded to its max length (unless
    `pad=False`, for packing): `(row, too_long)`, a too-long row all zeros."""
    preprocess: Preprocess
    max_length: MaxLength
    pad: bool = True

    def __call__(self, example: Example) -> tuple[Batch, bool]:
        features = self.preprocess(example)
        if not isinstance(features, Mapping) or not features:
            raise TypeError(f"preprocess returned a {type(features).__name__}; return a "
                            "non-empty dict of arrays")
        row, too_long = {}, False
        for key, value in features.items():
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_:
                dtype = np.int32
            elif np.issubdtype(value.dtype, np.floating):
                dtype = np.float32
            else:
                raise TypeError(f"feature {key!r}: dtype {value.dtype}; use an integer, "
                                "bool or floating one")
            if value.ndim > 1:
                raise ValueError(f"feature {key!r}: shape {value.shape}; preprocess returns "
                                 "scalars or 1-D arrays")
            row[key] = value.astype(dtype)
            if value.ndim == 1:
                length = self.max_length
                if isinstance(length, Mapping):
                    if key not in length:
                        raise ValueError(f"max_length has no entry for feature {key!r}; "
                                         "give one per 1-D feature")
                    length = length[key]
                too_long |= len(value) > length
                if self.pad:
                    row[key] = np.pad(row[key][:length], (0, max(0, length - len(value))))
        if too_long and self.pad:
            row = {k: np.zeros_like(v) for k, v in row.items()}
        return row, too_long


def _stack(rows: Sequence[Batch]) -> Batch:
    keys = rows[0].keys()
    for row in rows:
        if row.keys() != keys:
            raise ValueError(f"preprocess returned different features for different "
                             f"examples: {sorted(keys)} vs {sorted(row.keys())}")
    return {k: np.stack([row[k] for row in rows]) for k in keys}


@dataclasses.dataclass
class _Packer:
    """Whole examples packed into one row of `length` slots: each 1-D feature
    `key` concatenated and 0-padded, with `key_segmentation` (1, 2, ... per
    example, 0 at padding) and `key_positions` (0, 1, ... per example), all
    `[length]` int32: what the models take for packed sequences."""
    length: int

    @staticmethod
    def _check(example: Batch) -> Batch:
        for key, value in example.items():
            if np.ndim(value) != 1:
                raise ValueError(f"feature {key!r}: shape {np.shape(value)}, and packing "
                                 "needs 1-D features; set pack_length=0")
        return example

    def fits(self, segments: Sequence[Batch], example: Batch) -> bool:
        return all(sum(len(s[key]) for s in segments) + len(value) <= self.length
                   for key, value in self._check(example).items())

    def __call__(self, segments: Sequence[Batch]) -> Batch:
        row = {}
        for key, value in self._check(segments[0]).items():
            pieces = [s[key] for s in segments]
            pad = np.zeros(self.length - sum(len(piece) for piece in pieces), np.int32)
            row[key] = np.concatenate(pieces + [pad.astype(value.dtype)])
            row[f"{key}_segmentation"] = np.concatenate(
                [np.full(len(piece), i + 1, np.int32) for i, piece in enumerate(pieces)]
                + [pad])
            row[f"{key}_positions"] = np.concatenate(
                [np.arange(len(piece), dtype=np.int32) for piece in pieces] + [pad])
        return row


def _check_layout(global_batch_size: int, process_index: int, process_count: int,
                  max_length: MaxLength) -> int:
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size={global_batch_size}; use a positive one")
    if process_count <= 0 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index}, process_count={process_count}; "
                         "need 0 <= process_index < process_count")
    if global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                         f"process_count={process_count}; change the batch size")
    lengths = max_length.values() if isinstance(max_length, Mapping) else [max_length]
    if any(int(n) <= 0 for n in lengths):
        raise ValueError(f"max_length={max_length}; use positive lengths")
    return global_batch_size // process_count


@dataclasses.dataclass
class _FilterLog:
    """Logs dropped examples: the first, then at every power of two."""
    what: str

    def __call__(self, num_filtered: int, num_seen: int, max_length: MaxLength):
        if num_filtered & (num_filtered - 1) == 0:  # 1, 2, 4, 8, ...
            logging.warning(
                "%s: dropped %d of %d examples so far as longer than max_length=%s "
                "(after preprocess).", self.what, num_filtered, num_seen, max_length)


class TrainDatasetIterator(grain.DatasetIterator):
    """Local batches of the row streams over an infinite shuffled `MapDataset`."""

    def __init__(self, examples: grain.MapDataset, *, num_examples: int,
                 global_batch_size: int, local_batch_size: int, first_row: int,
                 identity: dict[str, int], max_length: MaxLength,
                 packer: _Packer | None, transform: BatchTransform | None):
        super().__init__()
        self._examples = examples
        self._num_examples = num_examples
        self._global_batch_size = global_batch_size
        self._local_batch_size = local_batch_size
        self._first_row = first_row
        self._identity = identity
        self._max_length = max_length
        self._packer = packer
        self._transform = transform
        self._step = 0
        self._consumed = [0] * local_batch_size
        self._filtered = [0] * local_batch_size
        self._peeked: dict[int, Batch] = {}  # read, but left for the next batch
        self._log = _FilterLog("train_iterator")

    def _example(self, position: int) -> tuple[Batch, bool]:
        if position in self._peeked:
            return self._peeked.pop(position), False
        return self._examples[position]

    def _fill_row(self, i: int, consumed: list[int], filtered: list[int]) -> Batch:
        """Local row `i`: the next example of its stream (packing: the next
        ones while they fit), too-long ones skipped and counted."""
        segments, run = [], 0
        while True:
            position = consumed[i] * self._global_batch_size + self._first_row + i
            example, too_long = self._example(position)
            if too_long:
                consumed[i] += 1
                filtered[i] += 1
                run += 1
                self._log(sum(filtered), sum(consumed), self._max_length)
                if run >= self._num_examples:
                    raise ValueError(f"train_iterator: {run} examples in a row are longer "
                                     f"than max_length={self._max_length}; raise it or "
                                     "check preprocess")
                continue
            run = 0
            if self._packer is None:
                consumed[i] += 1
                return example
            if segments and not self._packer.fits(segments, example):
                self._peeked[position] = example
                return self._packer(segments)
            segments.append(example)
            consumed[i] += 1

    def __next__(self) -> Batch:
        consumed, filtered = list(self._consumed), list(self._filtered)
        rows = [self._fill_row(i, consumed, filtered)
                for i in range(self._local_batch_size)]
        batch = _stack(rows)
        if self._transform is not None:
            batch = self._transform(batch, self._step, self._first_row)
        self._consumed, self._filtered = consumed, filtered
        self._step += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"step": self._step, "consumed": list(self._consumed),
                "filtered": list(self._filtered), **self._identity}

    def set_state(self, state: dict[str, Any]) -> None:
        mismatched = {k: (state.get(k), v) for k, v in self._identity.items()
                      if state.get(k) != v}
        if mismatched:
            raise ValueError("train_iterator.set_state: saved by a pipeline with other "
                             "settings, (saved, now): " + ", ".join(
                                 f"{k}={a!r} vs {b!r}" for k, (a, b) in mismatched.items()))
        for key in ("consumed", "filtered"):
            if len(state.get(key, ())) != self._local_batch_size:
                raise ValueError(f"train_iterator.set_state: {key}={state.get(key)!r}, not "
                                 f"{self._local_batch_size} rows")
        self._step = int(state["step"])
        self._consumed = [int(n) for n in state["consumed"]]
        self._filtered = [int(n) for n in state["filtered"]]
        self._peeked.clear()

    def __str__(self) -> str:
        return f"TrainDatasetIterator(step={self._step})"


def _row_block(examples: grain.MapDataset, first_row: int, kwargs: dict[str, Any],
               first: int, count: int) -> TrainDatasetIterator:
    """The iterator of local rows `[first, first + count)` (picklable as a partial)."""
    return TrainDatasetIterator(examples, local_batch_size=count,
                                first_row=first_row + first, **kwargs)


def num_filtered(it_or_state: grain.DatasetIterator | Mapping[str, Any]) -> int:
    """Examples this process's `train_iterator` dropped as longer than
    max_length, up to the last batch it returned."""
    state = it_or_state if isinstance(it_or_state, Mapping) else it_or_state.get_state()
    return sum(state["filtered"])


def shuffle_seed(seed: int) -> int:
    """The grain shuffle seed for a user seed.

    Grain seeds epoch `e` with `shuffle_seed + e`, so raw seeds 0 and 1 would
    share all but one epoch's order; hashing the seed keeps nearby seeds apart.
    """
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(np.random.SeedSequence([int(seed), _SHUFFLE_PURPOSE]).generate_state(1)[0])


def train_iterator(source: Sequence[Example], *, global_batch_size: int, seed: int,
                   process_index: int, process_count: int, preprocess: Preprocess,
                   max_length: MaxLength, pack_length: int = 0,
                   batch_transform: BatchTransform | None = None,
                   prefetch: int = 2, workers: int = 0) -> grain.DatasetIterator:
    """Infinite local batches `[global_batch_size // process_count, max_length]`
    (`pack_length` instead of `max_length` when packing); see the module doc.

    `source`: random access (`len`, `source[i]`). `preprocess`: example ->
    dict of 1-D (or scalar) arrays. `max_length`: one padded length, or one
    per feature. `batch_transform(batch, step, first_row)` runs on every local
    batch, `first_row` the global index of its row 0, so randomness derived
    from (seed, step, global row) is the same on resume and for any process
    count (e.g. dynamic masking). `prefetch`: batches made ahead in a thread
    (`concurrency.ThreadPrefetch`), or queued per worker.
    `workers`: that many spawned processes (`concurrency.BlockWorkers`;
    `preprocess` and the transform must pickle), each making a block of the
    local rows from its own `_row_block` iterator; the same batches and
    state as without. Save the returned iterator's state with grain's
    `CheckpointSave`.
    """
    local = _check_layout(global_batch_size, process_index, process_count, max_length)
    num_examples = len(source)
    if num_examples == 0:
        raise ValueError("train_iterator: the source has no examples; check the split")
    lengths = max_length.values() if isinstance(max_length, Mapping) else [max_length]
    if pack_length and pack_length < max(lengths):
        raise ValueError(f"pack_length={pack_length} < max_length={max_length}; every "
                         "example must fit in a packed row")
    examples = (grain.MapDataset.source(source)
                .shuffle(seed=shuffle_seed(seed))
                .repeat()
                .map(_Prepare(preprocess, max_length, pad=not pack_length)))
    identity = dict(seed=int(seed), global_batch_size=global_batch_size,
                    process_index=process_index, process_count=process_count,
                    num_examples=num_examples, pack_length=int(pack_length))
    rows = functools.partial(_row_block, examples, process_index * local, dict(
        num_examples=num_examples, global_batch_size=global_batch_size, identity=identity,
        max_length=max_length, packer=_Packer(pack_length) if pack_length else None,
        transform=batch_transform))
    if workers > 0:
        return BlockWorkers(rows(0, local), rows, min(workers, local), prefetch)
    it = rows(0, local)
    return ThreadPrefetch(it, prefetch) if prefetch > 0 else it


class EvalBatches(Iterator[Batch]):
    """One pass of local eval batches (`len()`: the same on every process);
    `num_filtered`: this process's dropped examples so far."""

    def __init__(self, it: Iterator[Batch], num_batches: int, max_length: MaxLength):
        self._it = it
        self.num_batches = num_batches
        self.max_length = max_length
        self.num_filtered = 0
        self._num_real = 0
        self._log = _FilterLog("eval_batches")

    def __len__(self) -> int:
        return self.num_batches

    def __next__(self) -> Batch:
        batch = dict(next(self._it))
        too_long = batch.pop("_too_long")
        real = batch.pop("_real")
        self._num_real += int(real.sum())
        for _ in range(int(too_long.sum())):
            self.num_filtered += 1
            self._log(self.num_filtered, self._num_real, self.max_length)
        return batch


@dataclasses.dataclass
class _EvalRow:
    """Position -> padded row (zeros past the end or when too long) + flags."""
    source: Sequence[Example]
    prepare: _Prepare
    zero_row: Batch

    def __call__(self, position: int) -> Batch:
        if position >= len(self.source):
            row, too_long, real = dict(self.zero_row), False, False
        else:
            row, too_long = self.prepare(self.source[position])
            real = True
            if row.keys() != self.zero_row.keys():
                raise ValueError("preprocess returned different features for "
                                 f"different examples: {sorted(row)} vs "
                                 f"{sorted(self.zero_row)}")
        row["_too_long"] = np.bool_(too_long)
        row["_real"] = np.bool_(real)
        return row


def eval_batches(source: Sequence[Example], *, global_batch_size: int,
                 process_index: int, process_count: int, preprocess: Preprocess,
                 max_length: MaxLength) -> EvalBatches:
    """Every example exactly once across processes, in dataset order, in
    batches of `train_iterator`'s shapes (see the module doc)."""
    local = _check_layout(global_batch_size, process_index, process_count, max_length)
    num_examples = len(source)
    if num_examples == 0:
        raise ValueError("eval_batches: the source has no examples; check the split")
    prepare = _Prepare(preprocess, max_length)
    first, _ = prepare(source[0])
    zero_row = {k: np.zeros_like(v) for k, v in first.items()}
    num_batches = math.ceil(num_examples / global_batch_size)
    first_row = process_index * local

    def position(j: int) -> int:  # j-th local row -> global position
        step, i = divmod(j, local)
        return step * global_batch_size + first_row + i

    ds = (grain.MapDataset.range(num_batches * local)
          .map(position)
          .map(_EvalRow(source, prepare, zero_row))
          .batch(local)
          # Grain's default read-ahead is 500 elements (here: batches).
          .to_iter_dataset(grain.ReadOptions(num_threads=4, prefetch_buffer_size=8)))
    return EvalBatches(iter(ds), num_batches, max_length)
