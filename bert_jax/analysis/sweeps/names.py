"""Run names: stable, readable, filesystem-safe names of sweep points (and the
short key and value texts that tables and plots share)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Iterable

MAX_NAME_LENGTH = 80

_SAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def short_keys(keys: Iterable[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix that no other key shares."""
    keys = list(dict.fromkeys(keys))
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if all(not (other == suffix or other.endswith("." + suffix))
                   for other in keys if other != key):
                out[key] = suffix
                break
        else:
            out[key] = key
    return out


def format_value(value: Any) -> str:
    """A short text form of a value (names, tables, plot labels)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(format_value(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _digest(overrides: dict[str, Any]) -> str:
    canonical = json.dumps([[k, repr(overrides[k])] for k in sorted(overrides)])
    return hashlib.sha1(canonical.encode()).hexdigest()[:8]


def run_name(overrides: dict[str, Any]) -> str:
    """A stable, readable, filesystem-safe name: `num_heads=2,num_layers=1`
    (keys sorted, shortened to their last distinct part). Values that need
    other characters, or names longer than MAX_NAME_LENGTH, get an 8-hex hash
    of the exact overrides as a suffix, so different points never share a name."""
    if not overrides:
        return "base"
    names = short_keys(sorted(overrides))
    texts = {k: format_value(overrides[k]) for k in overrides}
    readable = ",".join(f"{names[k]}={texts[k]}" for k in sorted(overrides))
    safe = _SAFE.sub("_", readable.replace("(", "").replace(")", ""))
    lossy = safe != readable or any("," in t or "=" in t for t in texts.values())
    if lossy or len(safe) > MAX_NAME_LENGTH:
        safe = safe[:MAX_NAME_LENGTH - 9].rstrip("_") + "-" + _digest(overrides)
    return safe
