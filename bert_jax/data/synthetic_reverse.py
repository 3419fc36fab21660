"""`synthetic_reverse`: a tiny built-in parallel corpus of token ids, for smoke tests.

Each example is `inputs`: random token ids in `[3, vocab_size)` of random
length in `[min_length, max_length]`, and `targets`: the same ids reversed,
followed by `EOS_ID` (2). Ids 0 (pad), 1 (bos) and 2 (eos) never occur in
`inputs`. Nothing is downloaded or written: the splits are a pure function of
the parameters, generated in memory in well under a second.

    splits = generate(vocab_size=64, num_train=64)
    splits["train"][i]   # {"inputs": int32 [length], "targets": int32 [length + 1]}
    load_source("synthetic_reverse", "train", num_train=64)   # the same, by name

`train` and `validation` come from separate random streams, a validation
example seen in `train` redrawn. A split keeps the order of the tfds builder
this dataset used to be (by the MD5 of the split name and the example's
index), so an experiment still reads the same examples in the same order.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from bert_jax.data.splits import check_counts
from bert_jax.errors import DataError

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_TOKEN_ID = 3  # first id that is neither pad, bos nor eos


def _example(inputs: np.ndarray) -> dict[str, np.ndarray]:
    return {"inputs": inputs, "targets": np.append(inputs[::-1], np.int32(EOS_ID))}


def _tfds_order(split: str, count: int) -> list[int]:
    """The generation indices in the order tfds stored them."""
    return sorted(range(count), key=lambda i: hashlib.md5(f"{split}{i}".encode()).digest())


@functools.lru_cache(maxsize=2)
def generate(*, vocab_size: int = 32, min_length: int = 4, max_length: int = 12,
             num_train: int = 2000, num_validation: int = 200, seed: int = 0
             ) -> dict[str, tuple[dict[str, np.ndarray], ...]]:
    """`{"train": examples, "validation": examples}`; cached, as a task asks
    for its splits one by one."""
    check_counts("synthetic_reverse", vocab_size=vocab_size, min_length=min_length,
                 max_length=max_length, num_train=num_train, num_validation=num_validation,
                 seed=seed)
    if vocab_size <= FIRST_TOKEN_ID:
        raise DataError("synthetic_reverse", f"vocab_size={vocab_size}",
                        f"use more than {FIRST_TOKEN_ID} (pad, bos, eos)")
    if not 1 <= min_length <= max_length:
        raise DataError("synthetic_reverse", f"min_length={min_length}, max_length="
                        f"{max_length}", "need 1 <= min_length <= max_length")

    def draw(rng: np.random.Generator) -> np.ndarray:
        length = int(rng.integers(min_length, max_length + 1))
        return rng.integers(FIRST_TOKEN_ID, vocab_size, size=length, dtype=np.int32)

    rng = np.random.default_rng([seed, 0])
    train = [draw(rng) for _ in range(num_train)]
    seen = {x.tobytes() for x in train}
    rng = np.random.default_rng([seed, 1])
    validation: list[np.ndarray] = []
    attempts = 0
    while len(validation) < num_validation:
        attempts += 1
        if attempts > 100 * (num_validation + 1):
            raise DataError("synthetic_reverse", f"num_validation={num_validation}: too few "
                            "examples unseen in train", "raise vocab_size or max_length")
        x = draw(rng)
        if x.tobytes() not in seen:
            validation.append(x)
    return {split: tuple(_example(inputs[i]) for i in _tfds_order(split, len(inputs)))
            for split, inputs in (("train", train), ("validation", validation))}
