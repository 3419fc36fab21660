"""FLOPs and memory traffic per device of a compiled XLA program, read from its
text (`compiled.as_text()`), every while loop counted as many times as it runs.

Why not `compiled.cost_analysis()`: it counts a loop body once (libtpu on a
2-layer BERT step for v5e:2x2: 9.03e8 FLOPs per device with the layers
written out, 4.41e8 with them scanned; the CPU compiler alike), so a scanned
or accumulated step looks several times cheaper than it is; XLA's GPU
compiler gives no analysis at all (None). This module reads the program text
the same way on every platform (that step: 6.89e8 FLOPs per device written
out and scanned, the model FLOPs of `bert_jax.modeling.flops`):

  FLOPs   2 per multiply-add of every `dot` and `convolution` (the
          matmuls, as TPUs write them: a convolution's taps are counted where
          they meet the input, not its padding, as XLA's HloCostAnalysis does),
          inside fusions too. Elementwise work is not counted: it runs on the
          vector units, below the matmul peak the bound divides by.
  bytes   for each instruction the program runs (a fusion as one), the bytes
          of its operands and of its result: what it reads from and writes to
          device memory (on a CPU program without loops, exactly XLA's count).
          An operand that a fusion only slices (a scanned layer's weights out
          of the stacked ones) counts the slices; a result updated in place
          (`dynamic-update-slice`) the update. Tuples, bitcasts, parameters and
          constants move nothing; an asynchronous pair (`-start`/`-done`) counts
          once. Arrays libtpu keeps on the chip (VMEM, layout memory space
          `S(1)`) count none: what is left is HBM traffic (a model as small
          as that step lives mostly in VMEM: 1.4e7 bytes against XLA's 1.1e8).

Across TPU slices libtpu writes no collective: each slice runs its own
program and hands the data-centre network's share to the host as a `send`
(`is_host_transfer=true`, `_xla_megascale_transfer_type="ALL_REDUCE"`, ...);
`dcn_transfers` lists them (kind, bytes sent per device, executions).

Loops: a `while` runs its body `known_trip_count` times (GPU, CPU), else
(libtpu writes none) the `s32[] constant(N)` its condition compares the
counter against, and its condition once more. Everything the body calls runs
as often. A loop whose count cannot be read counts once and is listed in
`unknown_loops`.
"""

from __future__ import annotations

import dataclasses
import math
import re

_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
          "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")    # a layout's memory space other than 0
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_CALLED = re.compile(r"\b(calls|body|condition|to_apply|true_computation|"
                     r"false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_DIMS = re.compile(r"\b(lhs_contracting_dims|lhs_batch_dims)=\{([\d,]*)\}")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_GROUPS = re.compile(r"\b(feature_group_count|batch_group_count)=(\d+)")
_S32_CONSTANT = re.compile(r"^s32\[\]")
_OPCODE = re.compile(r"([a-z][\w\-]*)\(")
_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_PROGRAM_SIZE = re.compile(r"\b(num_partitions|replica_count)=(\d+)")

# Instructions that read and write no device memory of their own.
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
               "call", "conditional", "after-all", "partition-id", "replica-id",
               "opt-barrier", "iota", "add-dependency", "send", "recv"}   # ...-done count
_SLICES = {"dynamic-slice", "slice", "gather"}
_TRANSPARENT = {"bitcast", "reshape", "copy", "transpose", "convert"}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str                  # the result's shape text
    opcode: str
    operands: tuple[str, ...]   # instruction names
    attributes: str             # the rest of the line


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    root: str
    entry: bool = False


@dataclasses.dataclass
class ProgramCost:
    flops: float                # per device, dot and convolution, loops unrolled
    bytes_accessed: float       # per device, loops unrolled
    loops: dict[str, int]       # while instruction -> trip count used
    unknown_loops: list[str]    # whiles counted once: no count found
    dcn_transfers: list[dict] = dataclasses.field(default_factory=list)
    # [{kind, bytes, executions}]: TPU host transfers between slices, per device
    devices: int = 1            # the program's (num_partitions x replica_count):
                                # one slice's on a multi-slice TPU


def shape_bytes(shape_text: str, on_chip: bool = False) -> float:
    """Device-memory bytes of every `dtype[d0,d1,...]{layout}` in an HLO shape
    (a tuple sums them); arrays placed on chip (TPU: `S(1)`, VMEM) count only
    if `on_chip`."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims, layout in _ARRAY.findall(shape_text)
               if on_chip or not _ON_CHIP.search(layout))


def _dims(shape_text: str) -> list[int]:
    found = _ARRAY.search(shape_text)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket group opening at `text[start]`."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "([{":
            depth += 1
        elif text[index] in ")]}":
            depth -= 1
            if depth == 0:
                return index + 1
    return len(text)


def _instruction(line: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    start = match.end()
    end = _balanced(line, start) if line.startswith("(", start) else line.find(" ", start)
    opcode = _OPCODE.match(line, end + 1)
    if end < 0 or not opcode:
        return None
    close = line.find(")", opcode.end())   # operands are names: no parentheses inside
    operands = tuple(part.split()[-1].lstrip("%")
                     for part in line[opcode.end():close].split(",") if part.strip())
    return Instruction(match.group(1), line[start:end], opcode.group(1), operands,
                       line[close + 1:])


def parse(hlo_text: str) -> dict[str, Computation]:
    """The program's computations by name (the entry's `entry` set)."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and current is None:
            current = Computation(header.group(2), [], "", bool(header.group(1)))
            continue
        if current is None:
            continue
        if line.strip() == "}":
            computations[current.name] = current
            current = None
            continue
        instruction = _instruction(line)
        if instruction:
            current.instructions.append(instruction)
            if line.lstrip().startswith("ROOT"):
                current.root = instruction.name
    return computations


def program_cost(hlo_text: str) -> ProgramCost:
    """FLOPs and bytes per device of the program `hlo_text`, loops unrolled."""
    computations = parse(hlo_text)
    shapes = {i.name: i.shape for c in computations.values() for i in c.instructions}
    defined = {i.name: i for c in computations.values() for i in c.instructions}
    runs = {name: 0.0 for name in computations}      # executions of each computation
    fused: set[str] = set()                           # computations inside a fusion
    loops: dict[str, int] = {}
    unknown: list[str] = []
    order = list(computations.values())[::-1]         # the text defines callees first
    for computation in order:
        if computation.entry:
            runs[computation.name] = 1.0
    for computation in order:
        times = runs[computation.name]
        for instruction in computation.instructions:
            called = dict(_CALLED.findall(instruction.attributes))
            branches = _BRANCHES.search(instruction.attributes)
            if instruction.opcode == "while":
                trips = _trip_count(instruction, computations.get(called.get("condition")),
                                    defined)
                if trips is None:
                    unknown.append(instruction.name)
                    trips = 1
                loops[instruction.name] = trips
                runs[called["body"]] += times * trips
                runs[called["condition"]] += times * (trips + 1)
            elif ((instruction.opcode == "fusion" or instruction.opcode.endswith("-start"))
                  and "calls" in called):   # costed at the call (an async pair: its -done)
                runs[called["calls"]] += times
                fused.add(called["calls"])
            elif "calls" in called or "true_computation" in called:
                for key in ("calls", "true_computation", "false_computation"):
                    if key in called:
                        runs[called[key]] += times
            if branches:
                for name in branches.group(1).split(","):
                    runs[name.strip().lstrip("%")] += times
            if computation.name in fused and "calls" in called:
                fused.add(called["calls"])
    flops = bytes_accessed = 0.0
    transfers: list[dict] = []
    for computation in computations.values():
        times = runs[computation.name]
        if not times:
            continue
        for instruction in computation.instructions:
            if instruction.opcode in ("dot", "convolution"):
                flops += times * _matmul_flops(instruction, shapes)
            if computation.name not in fused:
                bytes_accessed += times * _traffic(instruction, shapes, defined,
                                                   computations)
            megascale = _MEGASCALE.search(instruction.attributes)
            if instruction.opcode == "send" and megascale:
                transfers.append({
                    "kind": megascale.group(1).lower().replace("_", "-"),
                    "bytes": shape_bytes(shapes.get(instruction.operands[0], ""),
                                         on_chip=True),
                    "executions": times})
    sizes = dict(_PROGRAM_SIZE.findall(hlo_text[:hlo_text.find("\n")]))
    devices = int(sizes.get("num_partitions", 1)) * int(sizes.get("replica_count", 1))
    return ProgramCost(flops, bytes_accessed, loops, unknown, transfers, devices)


def _trip_count(loop: Instruction, condition: Computation | None,
                defined: dict[str, Instruction]) -> int | None:
    known = _TRIP_COUNT.search(loop.attributes)
    if known:
        return int(known.group(1))
    if condition is None:
        return None
    counts = []
    for instruction in condition.instructions:   # counter < N, the compare maybe fused
        if ((instruction.opcode == "compare" and "direction=LT" in instruction.attributes)
                or instruction.opcode == "fusion"):
            for operand in instruction.operands:
                constant = defined.get(operand)
                if (constant is not None and constant.opcode == "constant"
                        and _S32_CONSTANT.match(constant.shape)):
                    counts.append(_constant_value(constant))
    counts = [c for c in counts if c is not None]
    return counts[0] if len(counts) == 1 else None


def _constant_value(instruction: Instruction) -> int | None:
    # `constant(N)`: the operand list holds the literal.
    try:
        return int(instruction.operands[0])
    except (IndexError, ValueError):
        return None


def _matmul_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
    result = math.prod(_dims(instruction.shape))
    lhs = _dims(shapes.get(instruction.operands[0], ""))
    if instruction.opcode == "dot":
        contracting = dict(_DIMS.findall(instruction.attributes)).get(
            "lhs_contracting_dims", "")
        return 2.0 * result * math.prod(lhs[int(d)] for d in contracting.split(",") if d)
    return _convolution_flops(instruction, lhs, _dims(shapes.get(instruction.operands[1], "")))


def _convolution_flops(instruction: Instruction, lhs: list[int], rhs: list[int]) -> float:
    """2 x multiply-adds of a convolution, counting each output position's
    window taps that fall on the (base-dilated) input, not on padding."""
    labels = _DIM_LABELS.search(instruction.attributes)
    if not labels or not lhs or not rhs:
        return 0.0
    lhs_labels, rhs_labels, _ = labels.groups()
    groups = {k: int(v) for k, v in _GROUPS.findall(instruction.attributes)}
    window = _window(instruction.attributes)
    out = _dims(instruction.shape)
    out_labels = labels.group(3)
    spatial = [str(i) for i in range(len(window))]
    taps = 1
    for index, label in enumerate(spatial):
        size = rhs[rhs_labels.index(label)]
        input_size = lhs[lhs_labels.index(label)]
        output_size = out[out_labels.index(label)]
        dim = window[index]
        base = dim.get("lhs_dilate", 1)
        limit = (input_size - 1) * base + 1
        valid = 0
        for o in range(output_size):
            for k in range(size):
                position = o * dim.get("stride", 1) - dim.get("pad_low", 0) + k * dim.get(
                    "rhs_dilate", 1)
                if 0 <= position < limit and position % base == 0:
                    valid += 1
        taps *= valid
    batch = lhs[lhs_labels.index("b")]
    input_features = lhs[lhs_labels.index("f")]
    output_features = rhs[rhs_labels.index("o")]
    multiply_adds = (input_features // groups.get("feature_group_count", 1) * output_features
                     * batch // groups.get("batch_group_count", 1) * taps)
    return 2.0 * multiply_adds


def _window(attributes: str) -> list[dict[str, int]]:
    """Per spatial dimension: size, stride, pad_low, lhs_dilate, rhs_dilate."""
    match = _WINDOW.search(attributes)
    if not match:
        return []
    fields = dict(item.split("=") for item in match.group(1).split())
    count = len(fields["size"].split("x"))
    dims = [{} for _ in range(count)]
    for key, name in (("size", "size"), ("stride", "stride"), ("lhs_dilate", "lhs_dilate"),
                      ("rhs_dilate", "rhs_dilate")):
        if key in fields:
            for dim, value in zip(dims, fields[key].split("x")):
                dim[name] = int(value)
    if "pad" in fields:
        for dim, value in zip(dims, fields["pad"].split("x")):
            dim["pad_low"] = int(value.split("_")[0])
    return dims


def _traffic(instruction: Instruction, shapes: dict[str, str],
             defined: dict[str, Instruction], computations: dict[str, Computation]) -> float:
    """Bytes one execution of a top-level `instruction` reads and writes."""
    opcode = instruction.opcode
    if opcode in _NO_TRAFFIC or opcode.endswith("-start"):
        return 0.0
    if opcode.endswith("-done"):      # the pair's traffic: the start's operands, the result
        start = defined.get(instruction.operands[0])
        operands = start.operands if start else ()
        return shape_bytes(instruction.shape) + sum(shape_bytes(shapes.get(o, ""))
                                                    for o in operands)
    if opcode in _SLICES:
        return 2 * shape_bytes(instruction.shape)
    if opcode == "dynamic-update-slice":
        return 2 * shape_bytes(shapes.get(instruction.operands[1], ""))
    if opcode == "fusion":
        called = dict(_CALLED.findall(instruction.attributes)).get("calls")
        fusion = computations.get(called)
        if fusion is not None:
            return _fusion_traffic(instruction, fusion, shapes)
    return shape_bytes(instruction.shape) + sum(shape_bytes(shapes.get(o, ""))
                                                for o in instruction.operands)


def _fusion_traffic(instruction: Instruction, fusion: Computation,
                    shapes: dict[str, str]) -> float:
    users: dict[str, list[Instruction]] = {}
    for inner in fusion.instructions:
        for operand in inner.operands:
            users.setdefault(operand, []).append(inner)
    by_name = {inner.name: inner for inner in fusion.instructions}
    parameters = sorted((i for i in fusion.instructions if i.opcode == "parameter"),
                        key=lambda parameter: int(parameter.operands[0]))
    in_place: set[str] = set()      # parameters only updated in place
    written = shape_bytes(instruction.shape)
    updates = _in_place_updates(by_name.get(fusion.root), by_name)
    if updates is not None:
        written = sum(shape_bytes(update.shape) for update in updates)
        in_place = {_source(update_target, by_name) for update_target in updates.values()}
    total = written
    for index, operand in enumerate(instruction.operands):
        if index >= len(parameters):
            break
        parameter = parameters[index].name
        if parameter in in_place:
            continue
        sliced = _sliced_reads(parameter, users)
        total += sliced if sliced is not None else shape_bytes(shapes.get(operand, ""))
    return total


def _in_place_updates(root: Instruction | None, by_name: dict[str, Instruction]
                      ) -> dict[Instruction, str] | None:
    """{update: the buffer it is written into} if every output of the fusion is
    a `dynamic-update-slice` (through bitcasts), else None."""
    if root is None:
        return None
    outputs = [by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    updates = {}
    for output in outputs:
        while output is not None and output.opcode in ("bitcast", "copy"):
            output = by_name.get(output.operands[0])
        if output is None or output.opcode != "dynamic-update-slice":
            return None
        update = by_name.get(output.operands[1])
        if update is None:
            return None
        updates[update] = output.operands[0]
    return updates


def _source(name: str, by_name: dict[str, Instruction]) -> str:
    """The parameter a buffer comes from, through bitcasts."""
    instruction = by_name.get(name)
    while instruction is not None and instruction.opcode in ("bitcast", "copy"):
        name = instruction.operands[0]
        instruction = by_name.get(name)
    return name


def _sliced_reads(parameter: str, users: dict[str, list[Instruction]]) -> float | None:
    """The bytes read of a fusion parameter that is only sliced (through
    bitcasts and reshapes): the slices; None if any use reads it whole."""
    total, frontier = 0.0, [parameter]
    while frontier:
        name = frontier.pop()
        for user in users.get(name, []):
            if user.opcode in _SLICES and user.operands[0] == name:
                total += shape_bytes(user.shape)
            elif user.opcode in ("bitcast", "reshape"):
                frontier.append(user.name)
            else:
                return None
    return total if users.get(parameter) else None
