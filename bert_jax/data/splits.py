"""A dataset's splits by name: the checks on split names, and picking one split
of a dataset held in memory (the built-in generated corpora, local tagging files).

    examples = select("synthetic_reverse", {"train": [...], "validation": [...]},
                      "validation[:100]")   # a sequence: len(), examples[i]
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

from bert_jax.errors import UserError

T = TypeVar("T")
_SPLIT = re.compile(r"([\w\-]+)(?:\[(-?\d*):(-?\d*)\])?")


class DatasetError(UserError, ValueError):
    """A dataset or split that cannot be read; the message names it."""


def check_split_names(what: str, splits: object, values: str,
                      error: type[Exception] = ValueError) -> None:
    """Raises `error` unless `splits` is a non-empty mapping whose keys are
    valid tfds split names (`values` says what its values are, for the message)."""
    if not isinstance(splits, Mapping) or not splits:
        raise error(f"{what}: splits must be a non-empty mapping of tfds split name -> "
                    f"{values}; got {splits!r}")
    for split in splits:
        if not isinstance(split, str) or not re.fullmatch(r"[\w\-]+", split):
            raise error(f"{what}: split name {split!r} must use only letters, digits, "
                        f"'_' and '-'")


def check_counts(dataset: str, **params: object) -> None:
    """Raises DatasetError naming the first of `params` that is not an int >= 0."""
    for field, value in params.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise DatasetError(f"{dataset}: {field} must be an int >= 0, got {value!r}")


def select(name: str, splits: Mapping[str, Sequence[T]], split: str) -> Sequence[T]:
    """`splits[split]`, or a slice of it written as tfds writes one
    (`"validation[:100]"`, `"train[10:-10]"`; no percentages).

    Raises:
      DatasetError: no such split, or no examples in it (the message names
        the dataset `name` and its splits).
    """
    match = _SPLIT.fullmatch(split.strip())
    if not match or match[1] not in splits:
        raise DatasetError(f"dataset {name} has no split {split!r} (its splits: "
                           f"{sorted(splits)}; a slice is written 'train[:100]').")
    examples = splits[match[1]]
    if match[2] is not None:
        examples = examples[slice(*(int(x) if x else None for x in match.groups()[1:]))]
    if not examples:
        raise DatasetError(f"dataset {name} split {split!r} has no examples: check the "
                           "split name or slice, and the dataset's parameters.")
    return examples
