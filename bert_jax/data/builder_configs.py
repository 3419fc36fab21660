"""What the project's tfds builders over local files share: configs made at
run time (named by a fingerprint of their files and parameters) and the check
that those files did not change before the dataset is built."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import ClassVar, Generic, TypeVar

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


class ResolvesRuntimeConfigs:
    """Builder mixin: `get_builder_config` also resolves the configs of
    `CONFIGS` (so `tfds.builder('name/config')` works in the same process)."""

    CONFIGS: ClassVar[ConfigRegistry]

    @classmethod
    def get_builder_config(cls, name, version=None):
        found = super().get_builder_config(name, version)
        return found if found is not None else cls.CONFIGS.get(name)


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
