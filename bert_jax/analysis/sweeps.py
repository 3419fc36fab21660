r"""Hyperparameter sweeps: a small grammar, a runner, results tables and plots.

Grammar (`parse_sweep`)::

    model.num_heads=1,2,4,8 x model.num_layers=1,2     product: 8 runs
    optimizer.learning_rate=1e-3,3e-3 + train.batch_size=32,64
                                                       zip: 2 runs, paired
    a=1,2 + b=3,4 x c=5,6                              (a+b) x c: 4 runs

An axis is `KEY=V1,V2,...`. `x` (or `*`) makes a product, `+` zips axes of
equal length; zips bind tighter than products. Operators are separate words
(spaces on both sides). Values are Python literals (`3`, `1e-3`, `True`,
`None`, `'a b'`, `(1, 4, 1)`); anything that is not a literal is a string, so
`data.vocab_type=unigram,bpe` needs no quotes (`true`/`false` are booleans, as
on absl command lines). Quote strings holding commas or spaces. Products vary
the last axis fastest (as `itertools.product`).

A sweep directory holds one workdir per point, named by `run_name` (e.g.
`num_heads=2,num_layers=1`)::

    DIR/sweep.json                   the sweep: config file, base overrides, points
    DIR/<run>/overrides.json         the point's overrides (written before it runs)
    DIR/<run>/run.json               runner's record: parameters, status, sessions
                                     (start/end times, steps), wall time
    DIR/<run>/DONE                   written when a local run finished its steps
    DIR/<run>/config.json, metrics.jsonl, checkpoints/ ...   the trainer's
    DIR/results.csv, results.md, *.png                        `write_tables`, `plot`
    DIR/commands.sh                  launcher commands (print/tpu_vm/slurm)

`Sweep.run()` trains the points one after another in this process; a run
whose DONE marker (or final-step checkpoint) exists is skipped, and an
interrupted one resumes from its last checkpoint (the trainer resumes). With
`launcher='print'|'tpu_vm'|'slurm'`, `Sweep.launch()` writes (and prints) one
shell-quoted command per run instead: `python launch/train.py ...`,
`python launch/tpu_vm.py train NAME ... -- ...` or
`sbatch ... launch/slurm_train.sbatch ...`.

`collect(DIR)` reads what exists (partial sweeps included), `write_tables`
writes results.csv / results.md and `plot` the heatmap, the metric against
the parameter count and the training curves.

A config file may define `get_sweep()` (or `get_sweep(arg)`) returning a spec
string or a list of override dicts; `load_sweep` reads it.
"""

from __future__ import annotations

import ast
import copy
import csv
import dataclasses
import datetime
import difflib
import hashlib
import importlib.util
import inspect
import itertools
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, Sequence

PRODUCT_OPERATORS = ("x", "*", "\u00d7")
ZIP_OPERATORS = ("+",)
LAUNCHERS = ("local", "print", "tpu_vm", "slurm")

SWEEP_FILE = "sweep.json"
OVERRIDES_FILE = "overrides.json"
RUN_FILE = "run.json"
DONE_FILE = "DONE"
COMMANDS_FILE = "commands.sh"
MAX_NAME_LENGTH = 80

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}
_SAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


class SweepError(ValueError):
    """A bad sweep spec, key or point. `token` and `position` (a 0-based
    character offset in the spec, or None) say where."""

    def __init__(self, message: str, *, spec: str | None = None,
                 token: str | None = None, position: int | None = None):
        self.token, self.position, self.spec = token, position, spec
        if position is not None:
            message = f"{message} (at position {position}"
            message += f": {token!r})" if token is not None else ")"
            if spec and spec.strip() and "\n" not in spec:
                message += f"\n  {spec}\n  {' ' * position}^"
        super().__init__(message)


# -- grammar -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Axis:
    """One `KEY=V1,V2,...` of a spec."""
    key: str
    values: tuple
    position: int      # of the key in the spec
    text: str          # the axis as written


class SweepPoints(list):
    """The points of a sweep (a list of override dicts) plus where each key
    was written (`positions`: key -> (position, token)) and the spec."""

    def __init__(self, points: Iterable[dict[str, Any]] = (), *, spec: str | None = None,
                 axes: Sequence[Axis] = ()):
        super().__init__(points)
        self.spec = spec
        self.axes = list(axes)
        self.positions = {a.key: (a.position, a.text) for a in axes}


def parse_value(text: str) -> Any:
    """A value as written in a spec: a Python literal, `true`/`false`, or else
    the text itself (an unquoted string)."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _scan(spec: str) -> list[tuple[str, str, int]]:
    """Splits `spec` into ('axis', text, position) and ('op', text, position)
    items at operators that stand alone outside quotes and brackets."""
    items: list[tuple[str, str, int]] = []
    stack: list[tuple[str, int]] = []
    quote: tuple[str, int] | None = None
    start: int | None = None
    i, n = 0, len(spec)

    def flush(end: int):
        nonlocal start
        if start is not None:
            items.append(("axis", spec[start:end].rstrip(), start))
            start = None

    while i < n:
        c = spec[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if c == quote[0]:
                quote = None
            i += 1
            continue
        if not stack and not c.isspace() and (i == 0 or spec[i - 1].isspace()):
            end = i
            while end < n and not spec[end].isspace():
                end += 1
            word = spec[i:end]
            if word in PRODUCT_OPERATORS or word in ZIP_OPERATORS:
                flush(i)
                items.append(("op", word, i))
                i = end
                continue
        if start is None and not c.isspace():
            start = i
        if c in "'\"":
            quote = (c, i)
        elif c in _BRACKETS:
            stack.append((c, i))
        elif c in _BRACKETS.values():
            if not stack or _BRACKETS[stack[-1][0]] != c:
                raise SweepError(f"unbalanced {c!r}", spec=spec, token=c, position=i)
            stack.pop()
        i += 1
    if quote is not None:
        raise SweepError("unterminated quote", spec=spec, token=spec[quote[1]:],
                         position=quote[1])
    if stack:
        raise SweepError(f"unclosed {stack[-1][0]!r}", spec=spec,
                         token=spec[stack[-1][1]:], position=stack[-1][1])
    flush(n)
    return items


def _top_level(text: str) -> Iterator[tuple[int, str]]:
    """(index, character) of every character outside quotes and brackets."""
    depth, quote, escaped = 0, None, False
    for i, c in enumerate(text):
        if quote is not None:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in _BRACKETS:
            depth += 1
        elif c in _BRACKETS.values() and depth:
            depth -= 1
        elif depth == 0:
            yield i, c


def _split_values(text: str, offset: int, spec: str) -> list[tuple[str, int]]:
    """Top-level comma-separated values of an axis, with their positions."""
    out, start = [], 0
    for i, c in _top_level(text + ","):
        if c == ",":
            raw = text[start:i]
            out.append((raw.strip(), offset + start + (len(raw) - len(raw.lstrip()))))
            start = i + 1
    return out


def _has_top_level_space(text: str) -> int:
    """Index of the first whitespace outside quotes/brackets, or -1."""
    return next((i for i, c in _top_level(text) if c.isspace()), -1)


def _parse_axis(text: str, position: int, spec: str) -> Axis:
    eq = text.find("=")
    if eq < 0:
        raise SweepError(f"missing '=' in {text!r}: write an axis as KEY=V1,V2,...",
                         spec=spec, token=text, position=position)
    key = text[:eq].strip()
    if not key:
        raise SweepError(f"missing key before '=' in {text!r}", spec=spec, token=text,
                         position=position)
    if not _KEY.fullmatch(key):
        raise SweepError(f"invalid key {key!r}: expected a dotted config path such as "
                         "model.num_heads", spec=spec, token=key, position=position)
    rest = text[eq + 1:]
    if not rest.strip():
        raise SweepError(f"empty value list for {key!r}: give at least one value "
                         f"({key}=V1,V2,...)", spec=spec, token=text, position=position)
    values = []
    for value_text, value_pos in _split_values(rest, position + eq + 1, spec):
        if not value_text:
            raise SweepError(f"empty value in the list of {key!r}", spec=spec,
                             token=text, position=value_pos)
        space = _has_top_level_space(value_text)
        if space >= 0:
            extra = value_text[space:].strip()
            raise SweepError(
                f"unexpected {extra!r} after {key}'s value {value_text[:space]!r}: "
                "separate axes with ' x ' (product) or ' + ' (zip), and quote values "
                "holding spaces", spec=spec, token=extra,
                position=value_pos + value_text.index(extra, space))
        values.append(parse_value(value_text))
    return Axis(key, tuple(values), position, text)


def parse_sweep(spec: str) -> SweepPoints:
    """The points (override dicts, keys in spec order) of a sweep spec."""
    if not isinstance(spec, str) or not spec.strip():
        raise SweepError("empty sweep spec: expected e.g. "
                         "'model.num_heads=1,2,4 x model.num_layers=1,2'",
                         spec=spec if isinstance(spec, str) else None, token="",
                         position=0)
    items = _scan(spec)
    # Alternate axis, op, axis, ...
    groups: list[list[Axis]] = [[]]
    expect_axis = True
    for kind, text, pos in items:
        if kind == "op":
            if expect_axis:
                where = "at the start" if pos == items[0][2] else "after an operator"
                raise SweepError(f"operator {text!r} {where}: expected KEY=V1,V2,... "
                                 "before it", spec=spec, token=text, position=pos)
            if text in PRODUCT_OPERATORS:
                groups.append([])
            expect_axis = True
        else:
            if not expect_axis:  # two axes in a row cannot come out of _scan
                raise SweepError("expected 'x' or '+' between axes", spec=spec,
                                 token=text, position=pos)
            groups[-1].append(_parse_axis(text, pos, spec))
            expect_axis = False
    if expect_axis:
        op = items[-1]
        raise SweepError(f"operator {op[1]!r} at the end: expected KEY=V1,V2,... after it",
                         spec=spec, token=op[1], position=op[2])

    seen: dict[str, Axis] = {}
    for axis in (a for group in groups for a in group):
        if axis.key in seen:
            raise SweepError(f"duplicate key {axis.key!r} (first at position "
                             f"{seen[axis.key].position})", spec=spec, token=axis.key,
                             position=axis.position)
        seen[axis.key] = axis

    zipped = []
    for group in groups:
        lengths = {len(a.values) for a in group}
        if len(lengths) > 1:
            first = group[0]
            bad = next(a for a in group if len(a.values) != len(first.values))
            raise SweepError(
                f"zip of unequal lengths: {first.key!r} has {len(first.values)} values, "
                f"{bad.key!r} has {len(bad.values)}; '+' pairs values one to one "
                "(use ' x ' for every combination)", spec=spec, token=bad.text,
                position=bad.position)
        zipped.append([dict(zip([a.key for a in group], combo))
                       for combo in zip(*[a.values for a in group])])
    points = []
    for combo in itertools.product(*zipped):
        point: dict[str, Any] = {}
        for part in combo:
            point.update(part)
        points.append(point)
    return SweepPoints(points, spec=spec, axes=list(seen.values()))


def as_points(sweep: str | Iterable[dict[str, Any]]) -> SweepPoints:
    """A spec string or a list of override dicts -> SweepPoints (checked)."""
    if isinstance(sweep, SweepPoints):
        return sweep
    if isinstance(sweep, str):
        return parse_sweep(sweep)
    points = list(sweep) if sweep is not None else []
    if not points:
        raise SweepError("empty sweep: no points")
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            raise SweepError(f"point {i} is a {type(point).__name__}, not a dict of "
                             "overrides", token=repr(point), position=None)
        for key in point:
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise SweepError(f"point {i}: invalid key {key!r}: expected a dotted "
                                 "config path such as model.num_heads")
    return SweepPoints([dict(p) for p in points])


def load_sweep(config_file: str) -> SweepPoints:
    """The sweep a config file defines with `get_sweep()` (or `get_sweep(arg)`
    for `path.py:arg`)."""
    path, _, arg = config_file.partition(":")
    spec = importlib.util.spec_from_file_location("_bert_jax_sweep_config", path)
    if spec is None or spec.loader is None:
        raise SweepError(f"cannot load config file {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    get_sweep = getattr(module, "get_sweep", None)
    if get_sweep is None:
        raise SweepError(f"no --sweep given and {path} defines no get_sweep(): pass "
                         "--sweep='KEY=V1,V2 x ...' or add get_sweep() to the config file")
    takes_arg = bool(inspect.signature(get_sweep).parameters)
    return as_points(get_sweep(arg or None) if takes_arg else get_sweep())


# -- config keys -----------------------------------------------------------------


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


# -- run names -------------------------------------------------------------------


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


# -- files -------------------------------------------------------------------------


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=False, default=repr)
        f.write("\n")
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def read_metrics(workdir: str) -> list[dict[str, float]]:
    """metrics.jsonl's lines (none if absent; a torn last line is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def checkpoint_steps(workdir: str) -> list[int]:
    """Steps of the complete checkpoints under WORKDIR/checkpoints."""
    directory = os.path.join(workdir, "checkpoints")
    try:
        return sorted(int(d) for d in os.listdir(directory)
                      if d.isdigit() and os.path.isdir(os.path.join(directory, d)))
    except OSError:
        return []


def is_finished(workdir: str, num_steps: int) -> bool:
    """A DONE marker for at least `num_steps`, or a checkpoint of that step."""
    done = _read_json(os.path.join(workdir, DONE_FILE))
    if isinstance(done, dict) and int(done.get("num_steps", -1)) >= num_steps:
        return True
    return any(step >= num_steps for step in checkpoint_steps(workdir))


def count_parameters(config: Any, workdir: str) -> int:
    """The model's parameter count, from shapes only (`jax.eval_shape` of the
    task's `init_variables`; nothing is allocated). The task may write its
    vocabulary into `workdir`, as training would."""
    import jax
    import numpy as np
    from bert_jax.tasks import build_task

    task = build_task(config, workdir)
    shapes = jax.eval_shape(task.init_variables, jax.random.PRNGKey(0))
    params = shapes["params"] if "params" in shapes else shapes
    return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params)))


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# -- the runner ----------------------------------------------------------------------


def flag_text(value: Any) -> str:
    """A value as `--config.KEY=` text that ml_collections' config_flags parses
    back to it (bools as true/false, tuples and lists as literals)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    if isinstance(value, (dict, type(None))):
        return repr(value)
    return str(value)


def override_flags(overrides: dict[str, Any]) -> list[str]:
    return [f"--config.{k}={flag_text(v)}" for k, v in overrides.items()]


@dataclasses.dataclass
class Run:
    index: int
    name: str
    overrides: dict[str, Any]     # the point's overrides only
    workdir: str                  # local path (files, local training)
    command_workdir: str          # --workdir in launcher commands


class Sweep:
    """The runs of a sweep over a base config.

    Args:
      config: the base ConfigDict (base overrides already applied).
      directory: the sweep directory.
      points: a spec string, a list of override dicts or SweepPoints.
      config_file: `experiments/X.py[:ARG]`, for launcher commands.
      base_overrides: flat overrides applied to every run (recorded, and
        repeated in launcher commands; a point's own value wins).
      launcher: 'local' (train here, one after another) or 'print',
        'tpu_vm', 'slurm' (commands).
      command_directory: the sweep directory as the launched jobs see it
        (default: `directory` as given).
      launcher_flags: extra arguments for `tpu_vm.py train` (e.g. --zone=Z) or
        `sbatch` (e.g. --nodes=1 --gpus-per-node=1 --ntasks-per-node=1).
      tpu_name: TPU VM name, a format string of {index} and {name}.
      train_fn: `train_fn(config, workdir)`, default the trainer's
        train_and_evaluate (tests pass a counting wrapper).
      log: where progress lines go (default stderr).
    """

    def __init__(self, config: Any, directory: str, points, *,
                 config_file: str | None = None,
                 base_overrides: dict[str, Any] | None = None,
                 launcher: str = "local", command_directory: str | None = None,
                 launcher_flags: Sequence[str] = (), tpu_name: str = "bert-jax-{index}",
                 python: str = "python",
                 train_fn: Callable[[Any, str], dict] | None = None,
                 log: Callable[[str], None] | None = None):
        if launcher not in LAUNCHERS:
            raise SweepError(f"launcher={launcher!r}: use one of {', '.join(LAUNCHERS)}")
        self.config = config
        self.directory = directory
        self.points = as_points(points)
        validate(self.points, config)
        self.config_file = config_file
        self.base_overrides = dict(base_overrides or {})
        self.launcher = launcher
        self.launcher_flags = list(launcher_flags)
        self.tpu_name = tpu_name
        self.python = python
        self.train_fn = train_fn
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        command_directory = command_directory or directory
        self.runs = []
        names: dict[str, dict] = {}
        for i, point in enumerate(self.points):
            name = run_name(point)
            if name in names:
                raise SweepError(f"points {names[name]} and {point} share the run name "
                                 f"{name!r} (a repeated point?)", token=name)
            names[name] = point
            self.runs.append(Run(i, name, dict(point), os.path.join(directory, name),
                                 os.path.join(command_directory, name)))

    # Files.

    def num_steps(self, run: Run) -> int:
        return int(apply_overrides(self.config, run.overrides).train.num_steps)

    def prepare(self) -> None:
        """Writes DIR/sweep.json and each run's overrides.json."""
        os.makedirs(self.directory, exist_ok=True)
        sweep_file = os.path.join(self.directory, SWEEP_FILE)
        previous = _read_json(sweep_file) or {}
        names = list(dict.fromkeys([*previous.get("runs", []),
                                    *(r.name for r in self.runs)]))
        _write_json(sweep_file, _jsonable({
            "config_file": self.config_file,
            "spec": self.points.spec,
            "base_overrides": self.base_overrides,
            "points": list(self.points),
            "runs": names,   # this sweep's runs after any earlier ones in DIR
            "launcher": self.launcher,
            "updated": _now(),
        }))
        for run in self.runs:
            os.makedirs(run.workdir, exist_ok=True)
            path = os.path.join(run.workdir, OVERRIDES_FILE)
            saved = _read_json(path)
            record = _jsonable({"name": run.name, "overrides": run.overrides,
                                "base_overrides": self.base_overrides,
                                "config_file": self.config_file,
                                "num_steps": self.num_steps(run)})
            if saved and saved.get("overrides") != record["overrides"]:
                raise SweepError(f"{path} holds other overrides ({saved.get('overrides')}) "
                                 f"than this point ({run.overrides})", token=run.name)
            _write_json(path, record)

    # Local runs.

    def run(self, *, stop_on_error: bool = False) -> dict[str, str]:
        """Trains every unfinished point here, one after another, stopping
        after a preempted one. Returns {run name: 'skipped' | 'done' | 'failed'
        | 'interrupted'}."""
        if self.launcher != "local":
            raise SweepError(f"run() trains locally; launcher={self.launcher!r} uses launch()")
        self.prepare()
        outcome = {}
        for run in self.runs:
            outcome[run.name] = self.run_one(run, stop_on_error=stop_on_error)
            if outcome[run.name] == "interrupted":   # preempted: stop here
                break
        return outcome

    def run_one(self, run: Run, *, stop_on_error: bool = False) -> str:
        config = apply_overrides(self.config, run.overrides)
        num_steps = int(config.train.num_steps)
        run_file = os.path.join(run.workdir, RUN_FILE)
        if is_finished(run.workdir, num_steps):
            self.log(f"sweep: [{run.index + 1}/{len(self.runs)}] {run.name}: finished "
                     f"({num_steps} steps), skipped")
            if not os.path.exists(os.path.join(run.workdir, DONE_FILE)):
                _write_json(os.path.join(run.workdir, DONE_FILE), {"num_steps": num_steps})
            return "skipped"
        train_fn = self.train_fn
        if train_fn is None:
            from bert_jax.training.trainer import train_and_evaluate
            train_fn = train_and_evaluate
        info = _read_json(run_file) or {}
        info.update({"name": run.name, "overrides": _jsonable(run.overrides),
                     "num_steps": num_steps, "status": "running"})
        resume = (checkpoint_steps(run.workdir) or [0])[-1]
        session = {"start": _now(), "start_time": time.time(), "first_step": resume,
                   "host": socket.gethostname()}
        info.setdefault("sessions", []).append(session)
        info.setdefault("start_time", session["start"])
        _write_json(run_file, info)

        def finish(status: str, error: str | None = None):
            session["end"] = _now()
            session["end_time"] = time.time()
            session["seconds"] = session["end_time"] - session["start_time"]
            session["last_step"] = max([*checkpoint_steps(run.workdir),
                                        *(m["step"] for m in read_metrics(run.workdir)), 0])
            info["status"] = status
            info["end_time"] = session["end"]
            info["wall_seconds"] = sum(s.get("seconds", 0.0) for s in info["sessions"])
            if error:
                info["error"] = error
            else:
                info.pop("error", None)
            _write_json(run_file, info)

        try:
            if info.get("params") is None:  # shapes only; a bad config fails here
                info["params"] = count_parameters(config, run.workdir)
                _write_json(run_file, info)
            self.log(f"sweep: [{run.index + 1}/{len(self.runs)}] {run.name}: "
                     + (f"resuming from step {resume}" if resume else "starting")
                     + f" ({info['params']:,} parameters, {num_steps} steps)")
            train_fn(config, run.workdir)
        except KeyboardInterrupt:
            finish("interrupted")
            raise
        except Exception as e:  # noqa: BLE001 - recorded, then re-raised or skipped
            finish("failed", "".join(traceback.format_exception_only(type(e), e)).strip())
            self.log(f"sweep: {run.name} failed: {e}")
            if stop_on_error:
                raise
            return "failed"
        if not any(step >= num_steps for step in checkpoint_steps(run.workdir)):
            # The trainer returns early after a preemption (SIGTERM) checkpoint.
            finish("interrupted")
            self.log(f"sweep: {run.name}: stopped before step {num_steps} (preempted); "
                     "relaunch the sweep to resume it")
            return "interrupted"
        finish("done")
        _write_json(os.path.join(run.workdir, DONE_FILE),
                    {"num_steps": num_steps, "time": _now()})
        self.log(f"sweep: {run.name}: done in {info['wall_seconds']:.1f}s")
        return "done"

    # Launcher commands.

    def train_flags(self, run: Run) -> list[str]:
        if not self.config_file:
            raise SweepError("launcher commands need config_file (experiments/X.py[:ARG])")
        overrides = {**self.base_overrides, **run.overrides}
        return [f"--config={self.config_file}", f"--workdir={run.command_workdir}",
                *override_flags(overrides)]

    def command(self, run: Run) -> list[str]:
        """The argv that trains `run` with this sweep's launcher."""
        flags = self.train_flags(run)
        if self.launcher in ("print", "local"):
            return [self.python, "launch/train.py", *flags]
        if self.launcher == "tpu_vm":
            name = self.tpu_name.format(index=run.index, name=run.name)
            return [self.python, "launch/tpu_vm.py", "train", name, *self.launcher_flags,
                    "--", *flags]
        if self.launcher == "slurm":
            job = [f"--job-name={run.name}"]
            if os.path.abspath(run.command_workdir) == os.path.abspath(run.workdir):
                job.append(f"--output={run.command_workdir}/slurm-%j.out")
            return ["sbatch", *job, *self.launcher_flags, "launch/slurm_train.sbatch",
                    *flags]
        raise AssertionError(self.launcher)

    def commands(self) -> list[list[str]]:
        return [self.command(run) for run in self.runs]

    def launch(self, *, submit: bool = False, out=None) -> list[str]:
        """Writes DIR/commands.sh and prints one shell-quoted command per run
        (finished runs are left out); with `submit`, also runs each one."""
        self.prepare()
        out = out or sys.stdout
        lines = []
        for run in self.runs:
            if is_finished(run.workdir, self.num_steps(run)):
                self.log(f"sweep: {run.name}: finished, no command")
                continue
            lines.append(shlex.join(self.command(run)))
        with open(os.path.join(self.directory, COMMANDS_FILE), "w") as f:
            f.write("#!/bin/bash\n# One command per run of the sweep; run from the "
                    "repository root.\n" + "".join(line + "\n" for line in lines))
        for line in lines:
            print(line, file=out, flush=True)
        if submit:
            for line in lines:
                rc = subprocess.run(shlex.split(line)).returncode
                if rc:
                    raise SweepError(f"command failed with exit status {rc}: {line}")
        return lines


# -- results ---------------------------------------------------------------------------


def _run_dirs(directory: str) -> list[str]:
    sweep = _read_json(os.path.join(directory, SWEEP_FILE)) or {}
    names = [n for n in sweep.get("runs", [])
             if os.path.exists(os.path.join(directory, n, OVERRIDES_FILE))]
    try:
        others = sorted(d for d in os.listdir(directory)
                        if d not in names
                        and os.path.exists(os.path.join(directory, d, OVERRIDES_FILE)))
    except OSError:
        others = []
    return names + others


def _estimated_seconds(lines: list[dict]) -> float | None:
    """Training seconds from the logged steps/s (no evaluation time)."""
    total, previous = 0.0, 0
    for line in lines:
        rate = line.get("perf/steps_per_second")
        if rate:
            total += (line["step"] - previous) / rate
            previous = line["step"]
    return total or None


def collect(directory: str) -> list[dict[str, Any]]:
    """One row per run of the sweep directory, whatever state it is in.

    Row keys: name, workdir, overrides, status ('not started', 'unfinished',
    'interrupted', 'failed', or 'done': a DONE marker or a checkpoint of the
    final step), step, num_steps, params, wall_seconds
    (wall_source: 'run.json' or 'metrics' (training time from steps/s, no
    evaluation)), start_time, end_time, metrics (each key's last logged value),
    metrics_step, config (config.json, or None), error."""
    rows = []
    for name in _run_dirs(directory):
        workdir = os.path.join(directory, name)
        record = _read_json(os.path.join(workdir, OVERRIDES_FILE)) or {}
        info = _read_json(os.path.join(workdir, RUN_FILE)) or {}
        config = _read_json(os.path.join(workdir, "config.json"))
        lines = read_metrics(workdir)
        num_steps = None
        if isinstance(config, dict):
            num_steps = config.get("train", {}).get("num_steps")
        num_steps = record.get("num_steps") or info.get("num_steps") or num_steps
        metrics: dict[str, float] = {}
        for line in lines:
            metrics.update({k: v for k, v in line.items() if k != "step"})
        step = max([0, *(line["step"] for line in lines), *checkpoint_steps(workdir)])
        if num_steps and is_finished(workdir, num_steps):
            status = "done"
        elif info.get("status") in ("failed", "interrupted"):
            status = info["status"]
        elif info or lines or config or step:
            status = "unfinished"
        else:
            status = "not started"
        wall, source = info.get("wall_seconds"), "run.json"
        sessions = info.get("sessions") or []
        if sessions and "seconds" not in sessions[-1] and status != "done":
            # Running now (or killed): count the open session up to the last write.
            last = max([os.path.getmtime(p) for p in
                        (os.path.join(workdir, "metrics.jsonl"),) if os.path.exists(p)]
                       or [sessions[-1]["start_time"]])
            wall = (wall or 0.0) + max(0.0, last - sessions[-1]["start_time"])
        if wall is None:
            wall, source = _estimated_seconds(lines), "metrics"
        rows.append({
            "name": record.get("name", name), "workdir": workdir,
            "overrides": record.get("overrides", {}), "status": status, "step": step,
            "num_steps": num_steps, "params": info.get("params"),
            "wall_seconds": wall, "wall_source": source if wall is not None else None,
            "start_time": info.get("start_time"), "end_time": info.get("end_time"),
            "metrics": metrics, "metrics_step": lines[-1]["step"] if lines else None,
            "config": config, "error": info.get("error"),
        })
    return rows


def _override_keys(rows: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row["overrides"]))


def _metric_columns(rows: Sequence[dict], metrics: Sequence[str] | None) -> list[str]:
    if metrics:
        return list(metrics)
    return sorted({k for row in rows for k in row["metrics"] if k.startswith("eval/")})


def _human_seconds(seconds: float | None, estimated: bool = False) -> str:
    if seconds is None:
        return ""
    prefix = "~" if estimated else ""
    seconds = float(seconds)
    if seconds < 60:
        return f"{prefix}{seconds:.1f}s"
    if seconds < 3600:
        return f"{prefix}{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{prefix}{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table(rows: Sequence[dict], metrics: Sequence[str] | None = None
          ) -> tuple[list[str], list[list[Any]], list[str], list[list[str]]]:
    """(csv header, csv rows, markdown header, markdown rows)."""
    keys = _override_keys(rows)
    names = short_keys(keys)
    columns = _metric_columns(rows, metrics)
    csv_header = ["run", "status", *keys, "params", *columns, "step", "num_steps",
                  "wall_seconds"]
    md_header = ["run", "status", *(names[k] for k in keys), "params", *columns, "steps",
                 "wall time"]
    csv_rows, md_rows = [], []
    for row in rows:
        values = [row["overrides"].get(k) for k in keys]
        found = [row["metrics"].get(c) for c in columns]
        csv_rows.append([row["name"], row["status"],
                         *(format_value(v) if isinstance(v, (list, tuple, dict)) else v
                           for v in values),
                         row["params"], *found, row["step"], row["num_steps"],
                         None if row["wall_seconds"] is None
                         else round(row["wall_seconds"], 3)])
        md_rows.append([row["name"], row["status"],
                        *("" if k not in row["overrides"] else format_value(v)
                          for k, v in zip(keys, values)),
                        "" if row["params"] is None else f"{row['params']:,}",
                        *(_number(v) for v in found),
                        f"{row['step']}/{row['num_steps'] or '?'}",
                        _human_seconds(row["wall_seconds"], row["wall_source"] == "metrics")])
    return csv_header, csv_rows, md_header, md_rows


def markdown(rows: Sequence[dict], metrics: Sequence[str] | None = None) -> str:
    """The results as a Markdown table (one line per run)."""
    _, _, header, body = table(rows, metrics)

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    numeric = [all(_looks_numeric(r[i]) for r in body if r[i] != "") and
               any(r[i] != "" for r in body) for i in range(len(header))]
    rule = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in body)]) + "\n"


def _looks_numeric(text: str) -> bool:
    return bool(re.fullmatch(r"~?[-+0-9.,e/hms]+|nan|True|False", str(text)))


def write_tables(rows: Sequence[dict], directory: str,
                 metrics: Sequence[str] | None = None) -> str:
    """Writes DIR/results.csv and DIR/results.md; returns the Markdown table.
    Columns: run, status, the overrides, params, the final value of each metric
    in `metrics` (default: every eval/* metric), steps, wall time."""
    header, body, _, _ = table(rows, metrics)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "results.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if v is None else v for v in r] for r in body])
    text = markdown(rows, metrics)
    with open(os.path.join(directory, "results.md"), "w") as f:
        f.write(text)
    return text


# -- plots -------------------------------------------------------------------------------

_LOWER_IS_BETTER = ("loss", "nll", "perplexity", "ppl", "error", "wer", "cer")


def metric_mode(metric: str) -> str:
    """'min' for losses and error rates, else 'max'."""
    return "min" if any(w in metric.lower() for w in _LOWER_IS_BETTER) else "max"


def _axis_values(rows: Sequence[dict], key: str | None) -> list[Any]:
    if key is None:
        return [None]
    values = []
    for row in rows:
        value = row["overrides"].get(key)
        if value not in values:
            values.append(value)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        values.sort()
    return values


def _safe_file(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def plot(rows: Sequence[dict], directory: str, metric: str, x: str | None = None,
         y: str | None = None, mode: str | None = None) -> dict[str, str]:
    """Writes PNGs under `directory` and returns {kind: path}:

    - heatmap: `metric` over the swept keys `x` (columns) and `y` (rows)
      (default: the first two swept keys), each cell annotated, with a colour
      bar; other swept keys are reduced to the best run (`mode` 'max'/'min',
      default by the metric's name), runs without the metric left blank;
    - scatter: `metric` against the parameter count (runs with both);
    - curves: train/loss and `metric` against the step, one line per run.
    """
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    import numpy as np

    mode = mode or metric_mode(metric)
    best = max if mode == "max" else min
    keys = _override_keys(rows)
    names = short_keys(keys)
    if x is None:
        x = keys[0] if keys else None
    if y is None:
        rest = [k for k in keys if k != x]
        y = rest[0] if rest else None
    for key in (x, y):
        if key is not None and key not in keys:
            raise SweepError(f"plot axis {key!r} is not a swept key; swept: "
                             f"{', '.join(keys) or 'none'}", token=key)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    tag = _safe_file(metric)

    # Heatmap.
    xs, ys = _axis_values(rows, x), _axis_values(rows, y)
    grid = np.full((len(ys), len(xs)), np.nan)
    counts = np.zeros_like(grid, dtype=int)
    for row in rows:
        value = row["metrics"].get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        i = ys.index(row["overrides"].get(y) if y else None)
        j = xs.index(row["overrides"].get(x) if x else None)
        grid[i, j] = value if counts[i, j] == 0 else best(grid[i, j], value)
        counts[i, j] += 1
    fig = Figure(figsize=(max(4.0, 1.1 * len(xs) + 2.5), max(2.5, 0.8 * len(ys) + 1.8)))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis" if mode == "max" else "viridis_r"] \
        .with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto")
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label(f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)")
    finite = grid[np.isfinite(grid)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(grid[i, j]):
                level = 0.5 if high == low else (grid[i, j] - low) / (high - low)
                if mode == "min":
                    level = 1 - level
                ax.text(j, i, f"{grid[i, j]:.4g}", ha="center", va="center",
                        color="black" if level > 0.6 else "white", fontsize=9)
            else:
                ax.text(j, i, "n/a", ha="center", va="center", color="#666666",
                        fontsize=8)
    ax.set_xticks(range(len(xs)), [format_value(v) for v in xs])
    ax.set_yticks(range(len(ys)), [format_value(v) for v in ys] if y else [""])
    ax.set_xlabel(x or "")
    ax.set_ylabel(y or "")
    others = [names[k] for k in keys if k not in (x, y)]
    title = metric + (f" (best over {', '.join(others)})" if others and counts.max() > 1
                      else "")
    ax.set_title(title)
    fig.tight_layout()
    paths["heatmap"] = os.path.join(directory, f"heatmap_{tag}.png")
    fig.savefig(paths["heatmap"], dpi=100)

    # Metric against parameters.
    points = [(row["params"], row["metrics"][metric], row["name"]) for row in rows
              if row.get("params") and row["metrics"].get(metric) is not None]
    if points:
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        ax.scatter([p[0] for p in points], [p[1] for p in points])
        for params, value, name in points:
            ax.annotate(name, (params, value), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        sizes = [p[0] for p in points]
        if max(sizes) > 10 * min(sizes):
            ax.set_xscale("log")
        ax.margins(x=0.3, y=0.1)
        ax.set_xlabel("parameters")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against model size")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        paths["scatter"] = os.path.join(directory, f"params_{tag}.png")
        fig.savefig(paths["scatter"], dpi=100)

    # Training curves.
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    drawn = False
    for row in rows:
        lines = read_metrics(row["workdir"])
        for ax, key in zip(axes, ("train/loss", metric)):
            steps = [l["step"] for l in lines if key in l]
            if steps:
                ax.plot(steps, [l[key] for l in lines if key in l], marker="." if
                        len(steps) < 30 else None, label=row["name"])
                drawn = True
    for ax, key in zip(axes, ("train/loss", metric)):
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    if drawn:
        axes[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    paths["curves"] = os.path.join(directory, f"curves_{tag}.png")
    fig.savefig(paths["curves"], dpi=100)
    return paths


def report(directory: str, metric: str | None = None,
           metrics: Sequence[str] | None = None, x: str | None = None,
           y: str | None = None, mode: str | None = None) -> str:
    """collect + write_tables + plot (when a metric is known); the Markdown."""
    rows = collect(directory)
    text = write_tables(rows, directory, metrics)
    if metric is None:
        found = _metric_columns(rows, metrics)
        metric = found[0] if found else None
    if metric and rows:
        plot(rows, directory, metric, x=x, y=y, mode=mode)
    return text
