r"""The sweep grammar: a spec string (or a config file's `get_sweep()`) -> points.

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

A config file may define `get_sweep()` (or `get_sweep(arg)`) returning a spec
string or a list of override dicts; `load_sweep` reads it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import itertools
import re
from typing import Any, Iterable, Iterator, Sequence

from bert_jax.errors import UserError

PRODUCT_OPERATORS = ("x", "*", "\u00d7")
ZIP_OPERATORS = ("+",)

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


class SweepError(UserError, ValueError):
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
