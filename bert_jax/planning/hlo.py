"""The reader of a compiled XLA program's text (`compiled.as_text()`): its
computations and instructions, how often each runs, and its collectives as
written and as executed (`bert_jax.planning.hlo_cost` costs the same parse).

HLO text is a list of computations, `%name (params) -> shape {` ... `}`, one
of them `ENTRY`. An instruction is `%name = shape opcode(operands), attr=...`;
it calls other computations through `condition=`/`body=` (`while`), `calls=`
(fusions, `call`, async wrappers), `to_apply=`, `branch_computations=` or
`true_computation=`/`false_computation=` (`conditional`) and
`called_computations=`. A computation runs as many times as its callers run it:
the entry once, a `while` body (trip count) times per execution of the `while`
(its condition once more), every other callee once per call (a `conditional`
branch counted as if taken: an upper bound). A collective runs as often as the
computation holding it: inside a scanned-layer loop inside a micro-batch loop,
layers x micro-batches times a step although it is written once.

Trip counts: XLA's `"known_trip_count":{"n":"N"}` in the `while`'s
backend_config when present (the CPU and GPU compilers write it); libtpu's
text has none, so the count comes from the loop condition: its `compare` of
the induction variable (a tuple element of the loop state) with an integer
`constant(N)` (the compare may be wrapped in a fusion, as XLA:CPU writes it),
starting from the initial tuple's value when that is a
constant (through copies), else 0, stepping by 1 (how `lax.scan` and
`fori_loop` lower). A loop whose count cannot be read counts once and is
listed in `Collectives.unknown_loops`.

Replica groups come as explicit lists `{{0,1},{2,3}}` (`{}`: all devices in
one group), XLA's iota form `[groups,size]<=[dims]T(perm)` (device ids
`iota(prod(dims))` reshaped to `dims`, transposed by `perm`, reshaped to
`[groups, size]`), or the mesh-axes form libtpu prints,
`mesh['a'=4,'b'=2] {'a'}` (the devices of a mesh, iota unless
`device_ids=(...)` follows, grouped along the named axes; `'a':(1)2` names a
sub-axis: the 2 devices of stride 1 within axis `a`). Ids are the program's
logical device ids: positions in the compiled computation's device
assignment, which for a jitted step over a `Mesh` is `mesh.devices.flat`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from typing import Any

import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute")
_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
          "bf16": 2, "f8e4m3fn": 1, "f8e5m2": 1, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
          "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")    # a layout's memory space other than 0 (TPU VMEM)
_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(")
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_CALLEES = re.compile(r"\b(condition|body|calls|to_apply|branch_computations|"
                      r"true_computation|false_computation|called_computations)="
                      r"(\{[^}]*\}|%?[^\s,{}]+)")
_KNOWN_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_INTEGER = re.compile(r"constant\((-?\d+)\)")
_INDEX = re.compile(r"\bindex=(\d+)")
_DIRECTION = re.compile(r"\bdirection=(\w+)")
_REPLICA_GROUPS = re.compile(
    r"replica_groups=(\{(?:\{[\d,]*\},?)*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?|"
    r"mesh\[[^\]]*\](?:,\s*device_ids=\([^)]*\))?\s*\{[^}]*\})")
_PAIRS = re.compile(r"source_target_pairs=(\{(?:\{[\d,]*\},?)*\})")


@dataclasses.dataclass
class Instruction:

    name: str
    shape: str        # the result shape text: `f32[8,16]{1,0}` or a tuple `(..., ...)`
    opcode: str       # `all-reduce`, `while`, `fusion`, `all-gather-start`, ...
    operands: list[str]
    text: str         # the whole line

    def callees(self) -> list[tuple[str, str]]:
        """(attribute, computation name) of each computation it calls."""
        return [(attribute, name.strip().lstrip("%"))
                for attribute, value in _CALLEES.findall(self.text)
                for name in value.strip("{}").split(",") if name.strip()]


@dataclasses.dataclass
class Computation:

    name: str
    entry: bool
    instructions: list[Instruction]

    @functools.cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {instruction.name: instruction for instruction in self.instructions}

    @functools.cached_property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.text.lstrip().startswith("ROOT")),
                    self.instructions[-1] if self.instructions else None)


def _balanced(text: str, start: int) -> int:
    """The end of the bracketed group opening at `text[start]` ((, [ or {)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _instruction(line: str) -> Instruction | None:
    match = _DEFINITION.match(line)
    if not match:
        return None
    start = match.end()
    if start < len(line) and line[start] == "(":
        end = _balanced(line, start)
    else:
        end = start
        while end < len(line) and not line[end].isspace():
            end = _balanced(line, end) if line[end] in "{[" else end + 1
    opcode = _OPCODE.match(line, end)
    if not opcode:
        return None
    close = _balanced(line, opcode.end() - 1)
    operands = [o.split(" ")[-1].lstrip("%") for o in _split(line[opcode.end():close - 1])]
    return Instruction(match.group(1), line[start:end], opcode.group(1), operands, line)


def _split(text: str) -> list[str]:
    """The comma-separated items of `text` outside brackets, comments dropped."""
    parts, depth, current = [], 0, ""
    for char in re.sub(r"/\*.*?\*/", "", text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [part for part in parts + [current.strip()] if part]


def parse(hlo_text: str) -> dict[str, Computation]:
    """The computations of an HLO module's text, by name."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in hlo_text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and line.rstrip().endswith("{") and not line.startswith("HloModule"):
                current = Computation(header.group(2), bool(header.group(1)), [])
        elif line.strip() == "}":
            computations[current.name] = current
            current = None
        elif (instruction := _instruction(line)) is not None:
            current.instructions.append(instruction)
    return computations


def _constant_value(computation: Computation, name: str) -> int | None:
    """The integer a scalar instruction holds, following copies and bitcasts."""
    instructions = computation.by_name
    for _ in range(8):
        instruction = instructions.get(name)
        if instruction is None:
            return None
        if instruction.opcode == "constant":
            value = _INTEGER.search(instruction.text)
            return int(value.group(1)) if value else None
        if instruction.opcode not in ("copy", "bitcast", "convert") or not instruction.operands:
            return None
        name = instruction.operands[0]
    return None


def trip_count(loop: Instruction, caller: Computation,
               computations: dict[str, Computation]) -> int | None:
    """How many times the `while` instruction `loop` (in `caller`) runs its body."""
    known = _KNOWN_TRIP_COUNT.search(loop.text)
    if known:
        return int(known.group(1))
    condition = computations.get(dict(loop.callees()).get("condition", ""))
    compare = root = condition.root if condition is not None else None
    if root is not None and root.opcode == "fusion":   # a fused compare: its parameters
        fused = computations.get(dict(root.callees()).get("calls", ""))   # are the operands
        compare = fused.root if fused is not None else None
    if compare is None or compare.opcode != "compare" or len(compare.operands) != 2:
        return None
    operands = [(condition, name) for name in compare.operands]
    if compare is not root:
        number = {i.name: int(i.operands[0]) for i in fused.instructions
                  if i.opcode == "parameter"}
        operands = [(condition, root.operands[number[name]]) if name in number else (fused, name)
                    for name in compare.operands]
    values = [_constant_value(scope, name) for scope, name in operands]
    if (values[0] is None) == (values[1] is None):
        return None
    bound = values[0] if values[0] is not None else values[1]
    variable = condition.by_name.get(operands[1 if values[0] is not None else 0][1])
    direction = _DIRECTION.search(compare.text)
    direction = direction.group(1) if direction else "LT"
    if values[0] is not None:   # `N > i` is `i < N`
        direction = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE"}.get(direction, direction)
    start = 0
    index = _INDEX.search(variable.text) if variable is not None else None
    if variable is not None and variable.opcode == "get-tuple-element" and index:
        state = caller.by_name.get(loop.operands[0]) if loop.operands else None
        if state is not None and state.opcode == "tuple":
            position = int(index.group(1))
            if position < len(state.operands):
                initial = _constant_value(caller, state.operands[position])
                start = initial if initial is not None else 0
    if direction == "LT":
        return max(bound - start, 0)
    if direction == "LE":
        return max(bound - start + 1, 0)
    return None


def executions(computations: dict[str, Computation]
               ) -> tuple[dict[str, int], dict[str, int | None]]:
    """({computation: times it runs per execution of the entry}, {`while`
    instruction: its trip count, None where it could not be read})."""
    callers: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    loops: dict[str, int | None] = {}
    for computation in computations.values():
        for instruction in computation.instructions:
            trips = None
            if instruction.opcode == "while":
                trips = loops[instruction.name] = trip_count(instruction, computation,
                                                             computations)
            if instruction.opcode.endswith(("-done", "-update")):
                continue   # an async op's computation runs once, counted at its -start
            for attribute, callee in instruction.callees():
                times = 1
                if attribute == "body":
                    times = 1 if trips is None else trips
                elif attribute == "condition":
                    times = 1 if trips is None else trips + 1
                callers[callee].append((computation.name, times))
    counts: dict[str, int] = {}

    def count(name: str, visiting: frozenset = frozenset()) -> int:
        if name not in counts:
            if computations[name].entry:
                counts[name] = 1
            elif name in visiting:   # not in valid HLO (no recursion)
                return 0
            else:
                counts[name] = sum(count(caller, visiting | {name}) * times
                                   for caller, times in callers.get(name, ()))
        return counts[name]

    for name in computations:
        count(name)
    return counts, loops


def array_bytes(shape_text: str, hbm_only: bool = False) -> int:
    """Bytes of every `dtype[d0,d1,...]{layout}` in an HLO shape (a tuple sums
    them); with `hbm_only`, not of the arrays a TPU keeps on the chip (VMEM,
    layout memory space `S(1)`)."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims, layout in _ARRAY.findall(shape_text)
               if not (hbm_only and _ON_CHIP.search(layout)))


def dimensions(shape_text: str) -> list[int]:
    """The dimensions of the first array in an HLO shape."""
    found = _ARRAY.search(shape_text)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def tuple_parts(shape_text: str) -> list[str]:
    """The element shapes of a tuple shape (a non-tuple is its own one part)."""
    text = shape_text.strip()
    return _split(text[1:-1]) if text.startswith("(") else [text]


def _mesh_groups(text: str) -> list[list[int]]:
    """Replica groups of the mesh-axes form `mesh['a'=4,'b'=2] {'a','b':(1)2}`,
    as XLA's `MeshAxesReplicaGroupList` expands it: each mesh axis is reshaped
    so that its grouped sub-axes (`(pre)size`: `size` devices after a major
    part of `pre`) are dimensions of their own, the grouped dimensions are
    moved last (in the order listed), and consecutive runs of the group size
    are the groups."""
    mesh, _, listed = text.rpartition("{")
    sizes = [(name, int(size)) for name, size in re.findall(r"'([^']*)'=(\d+)", mesh)]
    full = dict(sizes)
    devices = np.arange(math.prod(full.values()))
    ids = re.search(r"device_ids=\((.*)\)", mesh)
    if ids:
        devices = np.array([int(d) for d in re.findall(r"\d+", ids.group(1))])
    axes = [(name, (int(pre), int(size)) if pre else None) for name, pre, size in
            re.findall(r"'([^']*)'(?::\((\d+)\)(\d+))?", listed)]
    dims: list[int] = []
    grouped: dict[int, int] = {}   # position in `axes` -> reshaped dimension
    for name, size in sizes:
        refs = [(i, sub) for i, (axis, sub) in enumerate(axes) if axis == name]
        if not refs:
            dims.append(size)
            continue
        if len(refs) == 1 and refs[0][1] is None:
            grouped[refs[0][0]] = len(dims)
            dims.append(size)
            continue
        prefix = 1
        for i, (pre, part) in sorted(refs, key=lambda ref: ref[1][0]):
            if pre != prefix:
                dims.append(pre // prefix)
                prefix = pre
            grouped[i] = len(dims)
            dims.append(part)
            prefix *= part
        if prefix != size:
            dims.append(size // prefix)
    last = [grouped[i] for i in range(len(axes))]
    order = [d for d in range(len(dims)) if d not in last] + last
    group_size = math.prod(dims[d] for d in last)
    return devices.reshape(dims).transpose(order).reshape(-1, group_size).tolist()


def replica_groups(text: str) -> list[list[int]] | None:
    """The replica groups in an instruction's text, expanded to device ids
    (None when it names none; `[[]]` for `{}`, all devices)."""
    match = _REPLICA_GROUPS.search(text)
    if not match:
        pairs = _PAIRS.search(text)
        return ([[int(d) for d in g.split(",")] for g in re.findall(r"\{([\d,]+)\}",
                                                                      pairs.group(1))]
                if pairs else None)
    groups = match.group(1)
    if groups.startswith("mesh"):
        return _mesh_groups(groups)
    if groups.startswith("["):
        shape, _, rest = groups.partition("<=")
        rows, size = (int(d) for d in shape.strip("[]").split(","))
        dims = [int(d) for d in rest[1:rest.index("]")].split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        transpose = re.search(r"T\(([\d,]+)\)", rest)
        if transpose:
            ids = ids.transpose([int(d) for d in transpose.group(1).split(",")])
        return ids.reshape(rows, size).tolist()
    found = [[int(d) for d in g.split(",") if d] for g in re.findall(r"\{([\d,]*)\}",
                                                                      groups[1:-1])]
    return found or [[]]


@dataclasses.dataclass
class Collectives:
    """A program's collectives: `as_written` and `executed` as `{kind: {'count',
    'bytes'}}` (result bytes per device; an op inside loops counts once as
    written, its executions times as executed), `ops` one dict per op (see
    `collective_ops`), `unknown_loops` the `while`s counted once."""

    as_written: dict[str, dict[str, float]]
    executed: dict[str, dict[str, float]]
    ops: list[dict[str, Any]]
    unknown_loops: list[str]


def collective_ops(hlo_text: str) -> Collectives:
    """Every collective of a compiled program. Each op: `kind`, `name`, `bytes`
    (result bytes per device of one execution), `operand_bytes` (reduce-scatter,
    all-gather: the input's), `executions` (per step), `group_size` (devices per
    replica group; 2 for a collective-permute's source-target pairs),
    `replica_groups` (lists of device ids; the pairs for collective-permute).
    An asynchronous pair (`-start`/`-done`) is one op: the `-done`'s result, the
    `-start`'s groups and operands."""
    computations = parse(hlo_text)
    counts, loops = executions(computations)
    ops = []
    for computation in computations.values():
        instructions = computation.by_name
        for instruction in computation.instructions:
            kind = instruction.opcode.removesuffix("-done")
            if kind not in COLLECTIVES:
                continue
            source = instruction
            if instruction.opcode.endswith("-done") and instruction.operands:
                source = instructions.get(instruction.operands[0], instruction)
            elif instruction.opcode.endswith("-start"):
                continue
            groups = replica_groups(source.text)
            if groups == [[]]:
                devices = device_count(hlo_text)
                groups = [list(range(devices))] if devices else groups
            operand_bytes = sum(array_bytes(instructions[name].shape) for name in
                                source.operands if name in instructions)
            if source is not instruction and not operand_bytes:
                operand_bytes = array_bytes(tuple_parts(source.shape)[0])
            ops.append({"kind": kind, "name": instruction.name,
                        "bytes": array_bytes(instruction.shape),
                        "operand_bytes": operand_bytes,
                        "executions": counts.get(computation.name, 0),
                        "group_size": len(groups[0]) if groups else 1,
                        "replica_groups": groups or []})
    return Collectives(_totals(ops, lambda op: 1), _totals(ops, lambda op: op["executions"]),
                       ops, [name for name, trips in loops.items() if trips is None])


def device_count(hlo_text: str) -> int:
    """num_partitions x replica_count of the module header, 0 when absent."""
    header = hlo_text.split("\n", 1)[0]
    counts = [int(n) for n in re.findall(r"(?:num_partitions|replica_count)=(\d+)", header)]
    return math.prod(counts) if counts else 0


def _totals(ops: list[dict[str, Any]], times) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: {"count": 0, "bytes": 0})
    for op in ops:
        found[op["kind"]]["count"] += times(op)
        found[op["kind"]]["bytes"] += times(op) * op["bytes"]
    return {kind: dict(found[kind]) for kind in COLLECTIVES if kind in found}

