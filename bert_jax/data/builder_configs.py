"""What the project's tfds builders over local files share: a base class
(`LocalFilesBuilder`), configs made at run time and named by a fingerprint of
their files and parameters (`config_name`, `file_stats`), and the check that
the files did not change before the dataset is built."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import ClassVar, Generic, TypeVar

import tensorflow_datasets as tfds
from etils import epath

C = TypeVar("C")
FileStat = tuple[str, int, int]   # (file name, size in bytes, mtime in ns)


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


def config_name(directory: str, params: dict, *labels: str, default: str) -> str:
    """`<folder>_<labels...>_<digest>`: a readable, filesystem-safe config name
    whose last part is a fingerprint of `params` (files, stats, options)."""
    digest = hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:12]
    folder = re.sub(r"[^\w\-]+", "_", os.path.basename(directory))[:40] or default
    return "_".join([folder, *(re.sub(r"[^\w\-]+", "_", x) for x in labels), digest])


def file_stats(directory: str, names: Iterable[str]) -> tuple[FileStat, ...]:
    """(name, size, mtime_ns) of each file, for a config's fingerprint."""
    out = []
    for name in names:
        st = os.stat(os.path.join(directory, name))
        out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def check_unchanged(directory: str, files: Iterable[FileStat], config_name: str,
                    what: str, error: type[Exception]) -> None:
    """Raises (`FileNotFoundError`, or `error`) naming the file when one of
    `files` was removed or changed since the config `config_name` was made."""
    for name, size, mtime_ns in files:
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{what}: {path} was removed after the builder was created") from None
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            raise error(
                f"{what}: {path} changed after the builder was created (size/mtime "
                f"differ from config {config_name}); create the builder again so the "
                "new contents get a config (and folder) of their own.")
