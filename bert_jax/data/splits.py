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
        raise error(f"{what}: splits={splits!r}; give a non-empty mapping of tfds split "
                    f"name -> {values}")
    for split in splits:
        if not isinstance(split, str) or not re.fullmatch(r"[\w\-]+", split):
            raise error(f"{what}: split name {split!r}; use only letters, digits, '_', '-'")


def check_counts(dataset: str, **params: object) -> None:
    """Raises DatasetError naming the first of `params` that is not an int >= 0."""
    for field, value in params.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise DatasetError(f"{dataset}: {field}={value!r}; give an int >= 0")


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


def no_split(name: str, split: str, known, check: str) -> DatasetError:
    return DatasetError(f"dataset {name} has no split {split!r} (its splits: "
                        f"{sorted(known)}); check the name, and {check}")


def no_examples(name: str, split: str, check: str) -> DatasetError:
    return DatasetError(f"dataset {name} split {split!r} has no examples; check the name "
                        f"or slice, and {check}")
