"""Imports whose modules log warnings that do not concern this project."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def without_root_warnings(*fragments: str):
    """Drops root-logger records containing any of `fragments` while active
    (e.g. Apache Beam's "apitools not found" when its GCP extras are absent)."""
    def keep(record: logging.LogRecord) -> bool:
        return not any(f in record.getMessage() for f in fragments)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
