"""Config keys: listing a config's dotted keys, applying a point's overrides
and validating a sweep's keys and values against the base config."""

from __future__ import annotations

import copy
import difflib
from typing import Any, Iterable

from bert_jax.analysis.sweeps.grammar import SweepError


def _is_section(value: Any) -> bool:
    return isinstance(value, dict) or hasattr(value, "keys") and hasattr(value, "items")


def config_keys(config: Any, prefix: str = "") -> list[str]:
    """Every dotted key path of a (nested) ConfigDict, sections included."""
    out = []
    for key in config.keys():
        path = f"{prefix}{key}"
        out.append(path)
        value = config[key]
        if _is_section(value):
            out += config_keys(value, path + ".")
    return out


def _lookup(config: Any, key: str) -> tuple[Any, str]:
    """(parent section, last name) of `key`; KeyError naming the missing part."""
    parts = key.split(".")
    node = config
    for i, part in enumerate(parts[:-1]):
        if not _is_section(node) or part not in node:
            raise KeyError(".".join(parts[:i + 1]))
        node = node[part]
        if not _is_section(node):
            raise KeyError(".".join(parts[:i + 1]))
    if not _is_section(node) or parts[-1] not in node:
        raise KeyError(key)
    return node, parts[-1]


def _unknown_key_message(config: Any, key: str, missing: str) -> str:
    keys = config_keys(config)
    leaves = [k for k in keys if not _is_section(_get(config, k))]
    near = difflib.get_close_matches(key, leaves, n=5, cutoff=0.6)
    parent = missing.rpartition(".")[0]
    if not near:  # same section, else the last component alone
        last = key.rpartition(".")[2]
        near = [k for k in leaves if k.rpartition(".")[2] in
                difflib.get_close_matches(last, [l.rpartition(".")[2] for l in leaves],
                                          n=5, cutoff=0.6)][:5]
    if not near and parent:
        near = [k for k in leaves if k.startswith(parent + ".")][:8]
    if not near:
        near = sorted({k.split(".")[0] for k in keys})
    if missing == key:
        what = f"the config has no {missing!r}"
    elif missing in keys:
        what = f"{missing!r} is a value, not a section"
    else:
        what = f"the config has no section {missing!r}"
    return f"unknown config key {key!r}: {what}; nearest existing keys: {', '.join(near)}"


def _get(config: Any, key: str) -> Any:
    parent, name = _lookup(config, key)
    return parent[name]


def _coerce(old: Any, value: Any) -> Any:
    if isinstance(old, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def apply_overrides(config: Any, overrides: dict[str, Any]) -> Any:
    """A copy of `config` with `overrides` (dotted keys -> values) set."""
    new = copy.deepcopy(config)
    for key, value in overrides.items():
        try:
            parent, name = _lookup(new, key)
        except KeyError as e:
            raise SweepError(_unknown_key_message(new, key, e.args[0]), token=key) from None
        try:
            parent[name] = _coerce(parent[name], value)
        except (TypeError, ValueError, AttributeError) as e:
            raise SweepError(f"{key}={value!r}: cannot set it on the config "
                             f"(currently {parent[name]!r}): {e}", token=key) from None
    return new


def validate(points: Iterable[dict[str, Any]], config: Any) -> None:
    """Raises SweepError unless every key of every point exists in `config`
    (with the nearest existing keys in the message) and every value can be set."""
    positions = getattr(points, "positions", {})
    spec = getattr(points, "spec", None)
    checked = set()
    for point in points:
        for key in point:
            if key in checked:
                continue
            checked.add(key)
            try:
                _lookup(config, key)
            except KeyError as e:
                position, _ = positions.get(key, (None, None))
                raise SweepError(_unknown_key_message(config, key, e.args[0]), spec=spec,
                                 token=key, position=position) from None
    for point in points:
        try:
            apply_overrides(config, point)
        except SweepError as e:
            key = e.token
            position = positions.get(key, (None, None))[0] if key else None
            raise SweepError(str(e), spec=spec, token=key, position=position) from None
