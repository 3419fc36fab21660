"""A dataset's splits by name: the checks on split names, and picking one split
of a dataset held in memory (the built-in generated corpora, local tagging files).

    examples = select("synthetic_reverse", {"train": [...], "validation": [...]},
                      "validation[:100]")   # a sequence: len(), examples[i]
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

from bert_jax.errors import DataError, MissingFileError

T = TypeVar("T")
_SPLIT = re.compile(r"([\w\-]+)(?:\[(-?\d*):(-?\d*)\])?")


def check_split_files(what: str, directory: str, splits: object, suffixes: Sequence[str]
                      ) -> tuple[tuple[str, str], ...]:
    """Sorted `splits` (split name -> a file name in `directory`, completed by
    each of `suffixes`), checked: tfds split names, plain names, files there
    (else a `DataError` naming the `what` dataset's `directory`)."""
    if not isinstance(splits, Mapping) or not splits:
        raise DataError(directory, f"{what}: splits={splits!r}", "give a non-empty mapping "
                        "of tfds split name -> file name")
    for split, name in splits.items():
        if not isinstance(split, str) or not re.fullmatch(r"[\w\-]+", split):
            raise DataError(directory, f"{what}: split name {split!r}", "use only letters, "
                            "digits, '_', '-'")
        if not isinstance(name, str) or not name or os.sep in name:
            raise DataError(directory, f"{what}: splits.{split}={name!r}",
                            f"give a file name in {directory}")
    missing = [os.path.join(directory, name + suffix) for name in splits.values()
               for suffix in suffixes if not os.path.isfile(os.path.join(
                   directory, name + suffix))]
    if missing:
        raise MissingFileError(f"{', '.join(missing)}: no such file(s); check the splits "
                               f"{dict(splits)}")
    return tuple(sorted(splits.items()))


def check_counts(dataset: str, **params: object) -> None:
    """Raises a `DataError` naming the dataset and the first of `params` (its
    parameters) that is not an int >= 0."""
    for field, value in params.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise DataError(dataset, f"{field}={value!r}", "give an int >= 0")


def select(name: str, splits: Mapping[str, Sequence[T]], split: str) -> Sequence[T]:
    """`splits[split]`, or a slice of it written as tfds writes one
    (`"validation[:100]"`, `"train[10:-10]"`; no percentages)."""
    match = _SPLIT.fullmatch(split.strip())
    if not match or match[1] not in splits:
        raise no_split(name, split, splits, "a slice is written 'train[:100]'")
    examples = splits[match[1]]
    if match[2] is not None:
        examples = examples[slice(*(int(x) if x else None for x in match.groups()[1:]))]
    if not examples:
        raise no_examples(name, split, "the dataset's parameters")
    return examples


def no_split(name: str, split: str, known, check: str) -> DataError:
    return DataError(f"dataset {name}", f"no split {split!r} (its splits: {sorted(known)})",
                     f"check the name, and {check}")


def no_examples(name: str, split: str, check: str) -> DataError:
    return DataError(f"dataset {name}", f"split {split!r} has no examples",
                     f"check the name or slice, and {check}")
