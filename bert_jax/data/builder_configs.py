"""The base class of the project's tfds builders over local files
(`parallel_text.ParallelText`, `bert_pretraining.BertPretraining`).

A tfds builder declares its configs when its class is defined; these builders
cannot, since a config depends on the files the user names. `LocalFilesBuilder`
lets a subclass make its configs at run time instead: the subclass names each
config by a fingerprint of its files and parameters and makes it once through
`intern(name, make)`, which keeps it in the subclass's `CONFIGS`.
`get_builder_config` looks there too, so `tfds.builder("name/config")` finds a
config made earlier in the same process.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import ClassVar

import tensorflow_datasets as tfds
from etils import epath

_LOCK = threading.Lock()


class LocalFilesBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the builders over local files, whose configs are made at run
    time (from the files given) and kept in the subclass's `CONFIGS`, by name;
    `get_builder_config` resolves them too, so `tfds.builder('name/config')`
    works in the same process."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    CONFIGS: ClassVar[dict]

    def __init_subclass__(cls, **kwargs):
        cls.BUILDER_CONFIGS, cls.CONFIGS = [], {}
        # tfds 4.9.10 computes the default `code_path` through
        # `importlib_resources` (a backport that it declares only for Python
        # < 3.9, so it is missing here) and fails with ModuleNotFoundError;
        # the path is plain to give.
        cls.code_path = epath.Path(inspect.getfile(cls))
        super().__init_subclass__(**kwargs)

    @classmethod
    def intern(cls, name: str, make: Callable):
        """The config named `name`, made by `make()` the first time (thread-safe)."""
        with _LOCK:
            if name not in cls.CONFIGS:
                cls.CONFIGS[name] = make()
            return cls.CONFIGS[name]

    @classmethod
    def get_builder_config(cls, name, version=None):
        found = super().get_builder_config(name, version)
        return found if found is not None else cls.CONFIGS.get(name)
