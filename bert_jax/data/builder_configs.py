"""What the project's tfds builders over local files share: a base class
(`LocalFilesBuilder`) whose configs are made at run time, named by a
fingerprint of their files and parameters, and kept in a `ConfigRegistry`."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

import tensorflow_datasets as tfds
from etils import epath

C = TypeVar("C")


class ConfigRegistry(Generic[C]):
    """The configs made in this process, by name (thread-safe)."""

    def __init__(self):
        self._configs: dict[str, C] = {}
        self._lock = threading.Lock()

    def intern(self, name: str, make: Callable[[], C]) -> C:
        """The config named `name`, made by `make()` the first time."""
        with self._lock:
            if name not in self._configs:
                self._configs[name] = make()
            return self._configs[name]

    def get(self, name: str) -> C | None:
        with self._lock:
            return self._configs.get(name)


class LocalFilesBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the builders over local files, whose configs are made at run
    time (from the files given) and kept in the subclass's `CONFIGS`;
    `get_builder_config` resolves them too, so `tfds.builder('name/config')`
    works in the same process."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    CONFIGS: ClassVar[ConfigRegistry]

    def __init_subclass__(cls, **kwargs):
        cls.BUILDER_CONFIGS = []
        # tfds 4.9.10 computes the default `code_path` through
        # `importlib_resources` (a backport that it declares only for Python
        # < 3.9, so it is missing here) and fails with ModuleNotFoundError;
        # the path is plain to give.
        cls.code_path = epath.Path(inspect.getfile(cls))
        super().__init_subclass__(**kwargs)

    @classmethod
    def get_builder_config(cls, name, version=None):
        found = super().get_builder_config(name, version)
        return found if found is not None else cls.CONFIGS.get(name)
