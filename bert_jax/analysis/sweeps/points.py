r"""Sweep points: lists of override dicts (dotted config key -> value).

A config's `get_sweep()` builds them with `sweep`, `product` and `zip` (the
convention of big_vision and Google's `hyper`); `--sweep` takes the same in one
line (`parse_sweep`): ` x ` is a product, ` + ` zips axes of equal length and
binds tighter (`a=1,2 + b=3,4 x c=5,6` is 4 runs). Values are Python literals,
`true`/`false`, or else the text itself. Anything the one-line form cannot say
(a value holding ` x ` or ` + `, points that are not a grid) goes in
`get_sweep()`. See docs/SWEEPS.md.
"""

from __future__ import annotations

import ast
import builtins
import copy
import difflib
import importlib.util
import inspect
import itertools
import re
from typing import Any, Iterable, Sequence

from flax import traverse_util

from bert_jax.errors import ConfigError

Point = dict[str, Any]
_NOT_LITERAL = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


def sweep(key: str, values: Iterable[Any]) -> list[Point]:
    """One axis: `[{key: value} for value in values]`."""
    values = list(values)
    if not values:
        raise ConfigError(f"sweep({key!r}): give at least one value")
    return [{key: value} for value in values]


def product(*axes: Sequence[Point]) -> list[Point]:
    """Every combination, the last axis varying fastest (`itertools.product`)."""
    _check_disjoint(axes)
    return [_merge(combo) for combo in itertools.product(*axes)]


def zip(*axes: Sequence[Point]) -> list[Point]:  # noqa: A001 - hyper's name
    """The axes' points paired one to one (axes of equal length)."""
    _check_disjoint(axes)
    lengths = [len(axis) for axis in axes]
    if len(set(lengths)) > 1:
        keys = [", ".join(dict.fromkeys(k for p in axis for k in p)) for axis in axes]
        raise ConfigError(f"zip of axes of unequal lengths {lengths} ({'; '.join(keys)}); "
                          "use ' x ' for every combination")
    return [_merge(combo) for combo in builtins.zip(*axes)]


def _check_disjoint(axes: Sequence[Sequence[Point]]) -> None:
    seen: set[str] = set()
    for keys in ({k for point in axis for k in point} for axis in axes):
        if seen & keys:
            raise ConfigError(f"key {sorted(seen & keys)[0]!r} is swept twice")
        seen |= keys


def _merge(parts: Iterable[Point]) -> Point:
    return {k: v for part in parts for k, v in part.items()}


def parse_value(text: str) -> Any:
    """A Python literal, `true`/`false`, or else the text itself."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return ast.literal_eval(text)
    except _NOT_LITERAL:
        return text


def _parse_axis(text: str) -> list[Point]:
    key, equals, values = (part.strip() for part in text.partition("="))
    if not equals or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
        raise ConfigError(f"{text!r}: write an axis as KEY=V1,V2,... (e.g. model.num_heads=1,2)")
    try:  # literals, quoted strings holding commas and tuples included
        return sweep(key, ast.literal_eval(f"({values},)"))
    except _NOT_LITERAL:
        pass
    texts = [v.strip() for v in values.split(",")]
    for value in texts:
        if not value or re.search(r"\s", value):
            raise ConfigError(f"bad value {value!r} of {key}; separate axes with ' x ' or "
                              "' + ' and quote values holding spaces or commas")
    return sweep(key, map(parse_value, texts))


def parse_sweep(spec: str) -> list[Point]:
    """The points of a one-line spec (` x ` product, ` + ` zip, zip first)."""
    if not spec or not spec.strip():
        raise ConfigError("empty sweep spec: give e.g. 'model.num_heads=1,2 x model.num_layers=1'")
    factors = re.split(r"\s+[x*\u00d7]\s+", spec.strip())
    return product(*(zip(*map(_parse_axis, re.split(r"\s+\+\s+", factor)))
                     for factor in factors))


def as_points(points: str | Iterable[Point]) -> list[Point]:
    """A spec string or a list of override dicts -> a checked list of points."""
    if isinstance(points, str):
        return parse_sweep(points)
    points = list(points or [])
    if not points or not all(isinstance(p, dict) for p in points):
        raise ConfigError(f"a sweep is a non-empty list of override dicts, not {points!r}")
    return [dict(p) for p in points]


def load_module(path: str, name: str = "_bert_jax_sweep_config"):
    """The Python file `path` as a module (a config file, a study file)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(config_file: str) -> Any:
    """`get_config(arg)` of `path.py:arg` (`get_config()` without one), as
    `--config=path.py[:arg]` gives it."""
    path, _, arg = config_file.partition(":")
    module = load_module(path)
    return module.get_config(arg) if arg else module.get_config()


def load_sweep(config_file: str) -> list[Point]:
    """The points of a config file's `get_sweep()` (`get_sweep(arg)` for
    `path.py:arg`): a list of override dicts or a spec."""
    path, _, arg = config_file.partition(":")
    module = load_module(path)
    get_sweep = getattr(module, "get_sweep", None)
    if get_sweep is None:
        raise ConfigError(f"{path} defines no get_sweep(); pass --sweep='KEY=V1,V2 x ...'")
    takes_arg = bool(inspect.signature(get_sweep).parameters)
    return as_points(get_sweep(arg or None) if takes_arg else get_sweep())


def apply_overrides(config: Any, overrides: Point) -> Any:
    """A copy of `config` (a ConfigDict) with `overrides` set; an unknown key
    fails naming the nearest existing keys."""
    keys = [".".join(k) for k in traverse_util.flatten_dict(config.to_dict())]
    for key in overrides:
        if key not in keys:
            near = difflib.get_close_matches(key, keys, n=5, cutoff=0.6)
            raise ConfigError(f"unknown config key {key!r}; nearest existing keys: "
                              + ", ".join(near or sorted({k.split(".")[0] for k in keys})))
    new = copy.deepcopy(config)   # field references kept, as on the command line
    try:
        new.update_from_flattened_dict(overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot set {overrides}: {e}") from None
    return new


def validate(points: Iterable[Point], config: Any) -> None:
    """Raises ConfigError unless every point applies to `config`."""
    for point in points:
        apply_overrides(config, point)
