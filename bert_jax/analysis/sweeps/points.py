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

from bert_jax.config_schema import SWEEP_REFUSED, axes_problems, refuse, spec

Point = dict[str, Any]
OVERRIDES_REFUSED = "the overrides do not fit the config"
_NOT_LITERAL = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


def sweep(key: str, values: Iterable[Any]) -> list[Point]:
    """One axis: `[{key: value} for value in values]`."""
    values = list(values)
    if not values:
        refuse([f"sweep({key!r}): give at least one value"], SWEEP_REFUSED)
    return [{key: value} for value in values]


def product(*axes: Sequence[Point]) -> list[Point]:
    """Every combination, the last axis varying fastest (`itertools.product`)."""
    refuse(axes_problems(axes, zipped=False), SWEEP_REFUSED)
    return [_merge(combo) for combo in itertools.product(*axes)]


def zip(*axes: Sequence[Point]) -> list[Point]:  # noqa: A001 - hyper's name
    """The axes' points paired one to one (axes of equal length)."""
    refuse(axes_problems(axes, zipped=True), SWEEP_REFUSED)
    return [_merge(combo) for combo in builtins.zip(*axes)]


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


def _parse_axis(text: str, problems: list[str]) -> list[Point]:
    """The points of `KEY=V1,V2,...`; [] with its lines added to `problems`."""
    if (parts := spec("sweep axis", text, problems)) is None:
        return []
    key, values = parts["key"], parts["values"]
    try:  # literals, quoted strings holding commas and tuples included
        return sweep(key, ast.literal_eval(f"({values},)"))
    except _NOT_LITERAL:
        pass
    texts = [v.strip() for v in values.split(",")]
    if any(spec("sweep value", value, problems, key=key) is None for value in texts):
        return []
    return sweep(key, map(parse_value, texts))


def parse_sweep(text: str) -> list[Point]:
    """The points of a one-line spec (` x ` product, ` + ` zip, zip first)."""
    problems: list[str] = []
    factors = [[_parse_axis(axis, problems) for axis in re.split(r"\s+\+\s+", factor)]
               for factor in re.split(r"\s+[x*\u00d7]\s+", text.strip())
               ] if spec("--sweep", text, problems) is not None else []
    refuse(problems, SWEEP_REFUSED)
    return product(*(zip(*axes) for axes in factors))


def as_points(points: str | Iterable[Point]) -> list[Point]:
    """A spec string or a list of override dicts -> a checked list of points."""
    if isinstance(points, str):
        return parse_sweep(points)
    points = list(points or [])
    refuse([] if points and all(isinstance(p, dict) for p in points) else [
        f"a sweep is a non-empty list of override dicts, not {points!r}"], SWEEP_REFUSED)
    return [dict(p) for p in points]


def load_module(path: str, name: str = "_bert_jax_sweep_config"):
    """The Python file `path` as a module (a config file, a study file)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def module_function(path: str, name: str, fix: str) -> Any:
    """The function `name` of the Python file `path` (a config file, a study
    file); refused naming `fix` when it defines none."""
    function = getattr(load_module(path, f"_bert_jax_{name}"), name, None)
    if function is None:
        refuse([f"{path} defines no {name}(); {fix}"], SWEEP_REFUSED)
    return function


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
    get_sweep = module_function(path, "get_sweep", "pass --sweep='KEY=V1,V2 x ...'")
    takes_arg = bool(inspect.signature(get_sweep).parameters)
    return as_points(get_sweep(arg or None) if takes_arg else get_sweep())


def apply_overrides(config: Any, overrides: Point) -> Any:
    """A copy of `config` (a ConfigDict) with `overrides` set; an unknown key
    fails naming the nearest existing keys."""
    keys = [".".join(k) for k in traverse_util.flatten_dict(config.to_dict())]
    problems = [f"unknown config key {key!r}; nearest existing keys: " + ", ".join(
        difflib.get_close_matches(key, keys, n=5, cutoff=0.6)
        or sorted({k.split(".")[0] for k in keys})) for key in overrides if key not in keys]
    refuse(problems, OVERRIDES_REFUSED)
    new = copy.deepcopy(config)   # field references kept, as on the command line
    try:
        new.update_from_flattened_dict(overrides)
    except (TypeError, ValueError) as e:
        problems = [f"cannot set {overrides}: {e}"]
    refuse(problems, OVERRIDES_REFUSED)
    return new


def validate(points: Iterable[Point], config: Any) -> None:
    """Raises ConfigError unless every point applies to `config`."""
    for point in points:
        apply_overrides(config, point)
