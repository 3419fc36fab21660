"""The project's small file helpers: files written whole or not at all
(`write_atomically`, `write_json`), JSON files read with damage reported as a
`DamagedFileError` naming the file (`read_json`), and values made JSON-ready
(`jsonable`: numpy and JAX arrays become lists, non-finite floats strings).
It imports only numpy and bert_jax.errors, so light tools (the sweep runner)
and every layer (data, training, analysis, launch) may use it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax.errors import DamagedFileError


def write_atomically(path: str, data: str | bytes) -> None:
    """Through a temporary file and a rename: a reader sees the old file or the whole
    new one, never a part; a failed write leaves the old file and no temporary one.
    A `path` that exists but is no regular file (/dev/stdout, a pipe) is written to
    in place: a rename would replace the device or pipe itself."""
    in_place = os.path.exists(path) and not os.path.isfile(path)
    tmp = path if in_place else f"{path}.{os.getpid()}.tmp"
    try:
        with (open(tmp, "wb") if isinstance(data, bytes) else
              open(tmp, "w", encoding="utf-8")) as f:
            f.write(data)
        if not in_place:
            os.replace(tmp, path)
    except BaseException:
        if not in_place and os.path.lexists(tmp):
            os.remove(tmp)
        raise


def damaged_file(path: str, reason: str) -> DamagedFileError:
    """The error for a file written earlier that cannot be read, `reason` saying why."""
    return DamagedFileError(f"{path} is damaged ({reason}): restore it from a copy, or use "
                            "a new workdir.")


def read_json(path: str, **load_kwargs: Any) -> Any:
    """The JSON file at `path`; one that is not JSON is a `DamagedFileError`."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f, **load_kwargs)
        except json.JSONDecodeError as e:
            raise damaged_file(path, f"{e.msg}: line {e.lineno} column {e.colno}") from e
        except UnicodeDecodeError as e:
            raise damaged_file(path, f"not {e.encoding} at byte {e.start}") from e


def write_json(path: str, value: Any, **dumps_kwargs: Any) -> None:
    """`value` as indented JSON, written atomically."""
    write_atomically(path, json.dumps(value, indent=2, **dumps_kwargs) + "\n")


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data; non-finite floats as "nan"/"inf", unknown objects
    as their repr."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        value = value._asdict()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return np.asarray(value).tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float)):
        return value
    return repr(value)
