"""FLOPs and memory traffic per device of a compiled XLA program, read from its
text (`compiled.as_text()`), every while loop counted as many times as it runs.
The text is parsed, and each computation's executions a step counted (the
loops' trip counts), by `bert_jax.planning.hlo`; this module only costs the
instructions.

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
          inside fusions too. Elementwise work is counted apart (vector,
          below): it runs on the vector units, far below the matmul peak.
          cuDNN's fused attention (`__cudnn$fmha*` custom calls) is costed
          from the scores' shape `[batch, heads, q_len, kv_len]` of its
          backend config and the head size: 4 FLOPs per score and head
          dimension forward (Q Kᵀ and P V), 10 backward (Q Kᵀ recomputed,
          dP, dV, dQ, dK: "2.5 times" the forward, FlashAttention-2, Dao 2023,
          arXiv 2307.08691, Section 4.1), half a square's scores under a
          causal mask (the kernel skips masked tiles; a padding mask, known
          only at run time, none). Its softmax is not counted as vector work.
  bytes   for each instruction the program runs (a fusion as one), the bytes
          of its operands and of its result: what it reads from and writes to
          device memory (on a CPU program without loops, exactly XLA's count).
          An operand that a fusion only slices (a scanned layer's weights out
          of the stacked ones, also through a fusion nested in it) counts the
          slices; each result updated in place (`dynamic-update-slice`, beside
          the fusion's other results) the update. Counting the stacks instead
          would grow with the layers squared in a scanned step. Tuples,
          bitcasts, parameters, constants and libtpu's `AllocateBuffer`
          custom-calls (which only allocate a scan's stacked buffers) move
          nothing; an asynchronous pair (`-start`/`-done`) counts once, as
          its operation would (an async `slice-start`/`slice-done`: its
          slice, read and written, not its source); a computation run
          inside one instruction (a fusion's, a reduction's `to_apply`, an
          async op's) is that instruction's. Arrays libtpu keeps on the
          chip (VMEM, layout memory space `S(1)`) count none: what is left
          is HBM traffic (a model as small as that step lives mostly in
          VMEM: 1.4e7 bytes against XLA's 1.1e8).
  vector  one operation per element of the result of each elementwise
          instruction (XLA's elementwise opcodes, `convert` and the random
          number generators included), per element of the inputs of each
          reduction (`reduce`, `reduce-window`; the reducer not counted
          again), inside fusions too: the work of the vector units
          (softmax, LayerNorm, dropout's random bits), a lower count than
          the instructions they issue (an `exp` is several). Data movement
          (copies, transposes, broadcasts, slices, gathers) counts none.
          JAX's default threefry bits arrive as that arithmetic (about 129
          operations a 32-bit word in a compiled BERT step). An
          `rng-bit-generator` (JAX's 'rbg' keys) costs per 32-bit word of
          its bits by its algorithm (`RNG_OPS_PER_WORD`; the counts of Salmon
          et al. 2011, "Parallel random numbers: as easy as 1, 2, 3", SC'11):
          Philox-4x32-10 25 (10 rounds, each two 32x32->64-bit
          multiplications, high and low halves, four xors and two key
          additions on a 4-word block), Threefry-2x32-20 59 (20 rounds of
          an addition, a rotation as two shifts and an or, and a xor on a
          2-word block; 6 key injections of 3 additions), `rng_default` 1:
          XLA expands that into Philox arithmetic for CPUs and GPUs before
          the text is written, so only a TPU program keeps it, where it is
          the chip's hardware generator (Flax commit 7b20ed2, "Allow use of
          RngBitGenerator TPU hardware PRNG system"; JAX's Pallas TPU guide,
          "Pseudo-Random Number Generation": "the fastest to compute"),
          which publishes no rate: one operation a word, the least an
          instruction that writes the word can cost.

`ProgramCost.instructions` gives the three per top-level instruction (a
fusion with what it fuses) with its executions a step: the input of the
per-instruction roofline of `bert_jax.planning.step_bound`.

Across TPU slices libtpu writes no collective: each slice runs its own
program and hands the data-centre network's share to the host as a `send`
(`is_host_transfer=true`, `_xla_megascale_transfer_type="ALL_REDUCE"`, ...);
`dcn_transfers` lists them (kind, bytes sent per device, executions, the
`send-done` that completes each).
A loop whose trip count cannot be read counts once and is listed in
`unknown_loops`.
"""

from __future__ import annotations

import dataclasses
import math
import re

from bert_jax.planning import hlo
from bert_jax.planning.hlo import Computation, Instruction

_CONTRACTING = re.compile(r"\blhs_contracting_dims=\{([\d,]*)\}")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_GROUPS = re.compile(r"\b(feature_group_count|batch_group_count)=(\d+)")
_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_CUDNN_ATTENTION = re.compile(r'custom_call_target="__cudnn\$fmha(\w*)"')
_SCORES_SHAPE = re.compile(r'"intermediate_tensor_shape":\s*\{[^{}]*?"dimensions":\s*\[([^\]]*)\]')
_MASK_TYPE = re.compile(r'"mask_type":\s*"(\w+)"')

# Instructions that read and write no device memory of their own.
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
               "call", "conditional", "after-all", "partition-id", "replica-id",
               "opt-barrier", "iota", "add-dependency", "send", "recv"}   # ...-done count
_ALLOCATION = 'custom_call_target="AllocateBuffer"'   # libtpu: a buffer, no traffic
_SLICES = {"dynamic-slice", "slice", "gather"}
_ALIASED = "output_to_operand_aliasing={{}: (0, {})}"
_CONTROL = {"while", "conditional", "call"}   # their callees are costed instruction by instruction
# One vector operation per result element: XLA's elementwise opcodes
# (HloInstruction::IsElementwise, less copy and bitcast-convert, which move
# data) and `rng` (rng-bit-generator: RNG_OPS_PER_WORD).
_ELEMENTWISE = frozenset("""
    abs add and atan2 cbrt ceil clamp compare complex convert cosine count-leading-zeros
    divide erf exponential exponential-minus-one floor imag is-finite log log-plus-one
    logistic map maximum minimum multiply negate not or popcnt power real reduce-precision
    remainder rng round-nearest-afz round-nearest-even rsqrt select
    shift-left shift-right-arithmetic shift-right-logical sign sine sqrt stochastic-convert
    subtract tan tanh xor""".split())
_REDUCTIONS = {"reduce", "reduce-window"}   # one vector operation per input element
# rng-bit-generator: vector operations per 32-bit word of its bits, by algorithm
# (module docstring: Philox-4x32-10, Threefry-2x32-20, a TPU's hardware generator).
RNG_OPS_PER_WORD = {"rng_philox": 25.0, "rng_three_fry": 59.0, "rng_default": 1.0}
_RNG_ALGORITHM = re.compile(r"\balgorithm=(\w+)")


@dataclasses.dataclass
class InstructionCost:
    """One execution of a top-level instruction (a fusion with what it fuses)
    and its executions a step: what the per-instruction roofline of
    `bert_jax.planning.step_bound` costs. The list keeps each computation's
    instructions in program order (the schedule)."""

    name: str
    opcode: str
    computation: str
    executions: int
    flops: float                # matmul: dot and convolution, fused ones included
    vector_ops: float           # elementwise and reduction operations (module docstring)
    bytes: float                # HBM read and written
    start: str = ""             # an asynchronous `-done`: the `-start` it completes
    fused_collectives: tuple[str, ...] = ()   # collectives run inside it (fused)


@dataclasses.dataclass
class ProgramCost:
    flops: float                # per device, dot and convolution, loops unrolled
    bytes_accessed: float       # per device, loops unrolled
    loops: dict[str, int]       # while instruction -> trip count used
    unknown_loops: list[str]    # whiles counted once: no count found
    dcn_transfers: list[dict] = dataclasses.field(default_factory=list)
    # [{kind, name, bytes, executions}]: TPU host transfers between slices, per
    # device, each named by its `send-done`
    devices: int = 1            # the program's (num_partitions x replica_count):
                                # one slice's on a multi-slice TPU
    instructions: list[InstructionCost] = dataclasses.field(default_factory=list)


def _hbm(shape_text: str) -> int:
    return hlo.array_bytes(shape_text, hbm_only=True)


def _shape(name: str, defined: dict[str, Instruction]) -> str:
    return defined[name].shape if name in defined else ""


def _elements(shape_text: str) -> int:
    """Elements of an array shape, or of each part of a tuple."""
    return sum(math.prod(hlo.dimensions(part)) for part in hlo.tuple_parts(shape_text))


def program_cost(hlo_text: str) -> ProgramCost:
    """FLOPs and bytes per device of the program `hlo_text`, loops unrolled,
    in total and per top-level instruction."""
    computations = hlo.parse(hlo_text)
    runs, loops = hlo.executions(computations)
    defined = {i.name: i for c in computations.values() for i in c.instructions}
    inside: set[str] = set()   # computations run inside one instruction
    for computation in reversed(computations.values()):   # the text defines callees first
        for instruction in computation.instructions:
            if computation.name in inside or instruction.opcode not in _CONTROL:
                inside.update(name for _, name in instruction.callees())
    work = _Work(computations, defined)
    costs: list[InstructionCost] = []
    transfers: list[dict] = []
    for computation in computations.values():
        times = runs.get(computation.name, 0)
        if not times or computation.name in inside:
            continue
        for instruction in computation.instructions:
            costs.append(work.cost(instruction, computation.name, times))
            transfer = _dcn_transfer(instruction, defined)
            if transfer:
                transfers.append({**transfer, "executions": times})
    return ProgramCost(sum(c.executions * c.flops for c in costs),
                       sum(c.executions * c.bytes for c in costs),
                       {name: 1 if trips is None else trips for name, trips in loops.items()},
                       [name for name, trips in loops.items() if trips is None],
                       transfers, hlo.device_count(hlo_text) or 1, costs)


def _dcn_transfer(instruction: Instruction, defined: dict[str, Instruction]) -> dict | None:
    """{kind, name, bytes} of a TPU host transfer between slices (a megascale
    `send`) completed by the `send-done` `instruction`; None for anything else."""
    send = (defined.get(instruction.operands[0])
            if instruction.opcode == "send-done" and instruction.operands else None)
    megascale = _MEGASCALE.search(send.text) if send is not None else None
    if not megascale:
        return None
    return {"kind": megascale.group(1).lower().replace("_", "-"), "name": instruction.name,
            "bytes": hlo.array_bytes(_shape(send.operands[0], defined))}


class _Work:
    """The matmul FLOPs, vector operations and collectives of instructions,
    through the computations they fuse (each costed once, then remembered)."""

    def __init__(self, computations: dict[str, Computation],
                 defined: dict[str, Instruction]):
        self.computations, self.defined = computations, defined
        self.fused: dict[str, tuple[float, float, tuple[str, ...]]] = {}

    def cost(self, instruction: Instruction, computation: str, times: int
             ) -> InstructionCost:
        """`instruction`, top-level in `computation` and run `times` a step."""
        flops, vector, collectives = self.of(instruction)
        start = instruction.operands[0] if (instruction.opcode.endswith("-done")
                                            and instruction.operands) else ""
        return InstructionCost(
            instruction.name, instruction.opcode, computation, times, flops, vector,
            _traffic(instruction, self.defined, self.computations), start,
            tuple(name for name in collectives if name != instruction.name))

    def of(self, instruction: Instruction) -> tuple[float, float, tuple[str, ...]]:
        """(matmul FLOPs, vector operations, collectives) of one execution."""
        opcode = instruction.opcode
        flops = (_matmul_flops(instruction, self.defined)
                 if opcode in ("dot", "convolution") else
                 _cudnn_attention_flops(instruction, self.defined)
                 if opcode == "custom-call" else 0.0)
        vector = _vector_ops(instruction, self.defined)
        collectives = ((instruction.name,) if opcode.removesuffix("-done") in hlo.COLLECTIVES
                       else ())
        for attribute, callee in instruction.callees() if opcode not in _CONTROL else ():
            if attribute != "to_apply" and callee in self.computations:   # not a reducer
                inner = self._computation(callee)
                flops, vector = flops + inner[0], vector + inner[1]
                collectives += inner[2]
        return flops, vector, collectives

    def _computation(self, name: str) -> tuple[float, float, tuple[str, ...]]:
        if name not in self.fused:
            parts = [self.of(i) for i in self.computations[name].instructions]
            self.fused[name] = (sum(p[0] for p in parts), sum(p[1] for p in parts),
                                tuple(c for p in parts for c in p[2]))
        return self.fused[name]


def _vector_ops(instruction: Instruction, defined: dict[str, Instruction]) -> float:
    """Vector-unit operations of one instruction: one per result element of
    an elementwise one, one per input element of a reduction."""
    if instruction.opcode in _ELEMENTWISE:
        return float(_elements(instruction.shape))
    if instruction.opcode in _REDUCTIONS:   # operands: the inputs, then their initial values
        inputs = instruction.operands[:len(instruction.operands) // 2]
        return float(sum(_elements(_shape(name, defined)) for name in inputs))
    if instruction.opcode == "rng-bit-generator":   # (new state, bits)
        algorithm = _RNG_ALGORITHM.search(instruction.text)
        words = hlo.array_bytes(hlo.tuple_parts(instruction.shape)[-1]) / 4
        return words * RNG_OPS_PER_WORD[algorithm.group(1) if algorithm else "rng_default"]
    return 0.0


def _matmul_flops(instruction: Instruction, defined: dict[str, Instruction]) -> float:
    result = math.prod(hlo.dimensions(instruction.shape))
    lhs = hlo.dimensions(_shape(instruction.operands[0], defined))
    if instruction.opcode == "dot":
        contracting = _CONTRACTING.search(instruction.text)
        dims = contracting.group(1).split(",") if contracting else []
        return 2.0 * result * math.prod(lhs[int(d)] for d in dims if d)
    return _convolution_flops(instruction, lhs,
                              hlo.dimensions(_shape(instruction.operands[1], defined)))


def _cudnn_attention_flops(instruction: Instruction, defined: dict[str, Instruction]
                           ) -> float:
    """Matmul FLOPs of a cuDNN fused-attention custom call (module docstring);
    0 for any other custom call or one whose config gives no scores' shape."""
    kernel = _CUDNN_ATTENTION.search(instruction.text)
    scores = _SCORES_SHAPE.search(instruction.text)
    query = hlo.dimensions(_shape(instruction.operands[0], defined)) if (
        instruction.operands) else []
    if not (kernel and scores and query):
        return 0.0
    batch, heads, q_len, kv_len = (int(d.strip().strip('"')) for d in
                                   scores.group(1).split(","))
    mask = _MASK_TYPE.search(instruction.text)
    causal = mask and "CAUSAL" in mask.group(1)   # query i sees keys 0..i (top-left aligned)
    visible = sum(min(i + 1, kv_len) for i in range(q_len)) if causal else q_len * kv_len
    per_score = 10 if kernel.group(1).endswith("Backward") else 4
    return float(per_score * batch * heads * visible * query[-1])


def _convolution_flops(instruction: Instruction, lhs: list[int], rhs: list[int]) -> float:
    """2 x multiply-adds of a convolution, counting each output position's
    window taps that fall on the (base-dilated) input, not on padding."""
    labels = _DIM_LABELS.search(instruction.text)
    if not labels or not lhs or not rhs:
        return 0.0
    lhs_labels, rhs_labels, _ = labels.groups()
    groups = {k: int(v) for k, v in _GROUPS.findall(instruction.text)}
    window = _window(instruction.text)
    out = hlo.dimensions(instruction.shape)
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


def _window(text: str) -> list[dict[str, int]]:
    """Per spatial dimension: size, stride, pad_low, lhs_dilate, rhs_dilate."""
    match = _WINDOW.search(text)
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


def _traffic(instruction: Instruction, defined: dict[str, Instruction],
             computations: dict[str, Computation]) -> float:
    """Bytes one execution of a top-level `instruction` reads and writes."""
    opcode, operands = instruction.opcode, instruction.operands
    if (opcode in _NO_TRAFFIC or opcode.endswith("-start")
            or opcode == "custom-call" and _ALLOCATION in instruction.text):
        return 0.0
    if opcode.endswith("-done"):   # the pair: its operation on the start's operands
        start = defined.get(operands[0]) if operands else None
        opcode, operands = opcode.removesuffix("-done"), start.operands if start else []
    if opcode in _SLICES:
        return _slice_traffic(instruction.shape, _shape(operands[0], defined) if operands
                              else "")
    if opcode == "dynamic-update-slice":
        return 2 * _hbm(_shape(operands[1], defined))
    if opcode == "fusion":
        fusion = computations.get(dict(instruction.callees()).get("calls", ""))
        if fusion is not None:
            return _fusion_traffic(instruction, fusion, defined, computations)
    return _hbm(instruction.shape) + sum(_hbm(_shape(o, defined)) for o in operands)


def _slice_traffic(result: str, source: str) -> float:
    """Bytes a slice of `source` into `result` moves: its elements read, unless
    the source is on the chip, and written, unless the result is."""
    on_chip = hlo.array_bytes(source) > 0 and not _hbm(source)
    return (0 if on_chip else hlo.array_bytes(result)) + _hbm(result)


def _fusion_traffic(instruction: Instruction, fusion: Computation,
                    defined: dict[str, Instruction], computations: dict[str, Computation]
                    ) -> float:
    parameters, users = _parameters_and_users(fusion)
    in_place: set[str] = set()      # parameters only updated in place
    written = 0.0
    for part, update in _outputs(instruction, fusion):
        if update is None:
            written += _hbm(part)
        else:
            written += _hbm(update[0].shape)
            in_place.add(_source(update[1], fusion.by_name))
    total = written
    for operand, parameter in zip(instruction.operands, parameters):
        if parameter.name in in_place:
            continue
        sliced = _sliced_reads(parameter.name, users, computations)
        total += sliced if sliced is not None else _hbm(_shape(operand, defined))
    return total


def _outputs(instruction: Instruction, fusion: Computation
             ) -> list[tuple[str, tuple[Instruction, str] | None]]:
    """[(the shape of each output of the fusion `instruction`, (the update, the
    buffer it is written into) if that output is a `dynamic-update-slice`
    through bitcasts, else None)]. A scanned layer's fusion returns its stacked
    activations updated in place beside plain arrays: each output is costed
    on its own."""
    root, by_name = fusion.root, fusion.by_name
    parts = hlo.tuple_parts(instruction.shape)
    outputs = ([by_name.get(o) for o in root.operands] if root is not None
               and root.opcode == "tuple" else [root])
    if len(outputs) != len(parts):
        return [(instruction.shape, None)]
    found = []
    for part, output in zip(parts, outputs):
        while output is not None and _same_buffer(output):
            output = by_name.get(output.operands[0])
        update = (by_name.get(output.operands[1])
                  if output is not None and output.opcode == "dynamic-update-slice" else None)
        found.append((part, None if update is None else (update, output.operands[0])))
    return found


def _same_buffer(instruction: Instruction) -> bool:
    """Whether `instruction` hands on its first operand's buffer: a bitcast, a
    copy, or a fusion whose result aliases that operand (as libtpu retiles a
    stacked `pred` mask from T(32,128)(4,1) to T(8,128)(4,1): the same bytes)."""
    return (instruction.opcode in ("bitcast", "copy")
            or instruction.opcode == "fusion" and _ALIASED in instruction.text)


def _source(name: str, by_name: dict[str, Instruction]) -> str:
    """The parameter a buffer comes from, through bitcasts."""
    instruction = by_name.get(name)
    while instruction is not None and _same_buffer(instruction):
        name = instruction.operands[0]
        instruction = by_name.get(name)
    return name


def _parameters_and_users(computation: Computation
                          ) -> tuple[list[Instruction], dict[str, list[Instruction]]]:
    """The parameters of `computation` in their order, and each value's users."""
    users: dict[str, list[Instruction]] = {}
    for inner in computation.instructions:
        for operand in inner.operands:
            users.setdefault(operand, []).append(inner)
    parameters = sorted((i for i in computation.instructions if i.opcode == "parameter"),
                        key=lambda parameter: int(parameter.operands[0]))
    return parameters, users


def _sliced_reads(parameter: str, users: dict[str, list[Instruction]],
                  computations: dict[str, Computation]) -> float | None:
    """The bytes read of a fusion parameter that is only sliced (through
    bitcasts, reshapes and the fusions nested in it, as libtpu nests a scanned
    layer's slice of its stacked weights): the slices; None if any use reads
    it whole."""
    total, frontier = 0.0, [parameter]
    while frontier:
        name = frontier.pop()
        for user in users.get(name, []):
            if user.opcode in _SLICES and user.operands[0] == name:
                total += _hbm(user.shape)
            elif user.opcode == "reshape" or (user.opcode != "copy" and _same_buffer(user)
                                              and user.operands[0] == name):
                frontier.append(user.name)
            elif user.opcode == "fusion" and (
                    nested := _nested_sliced_reads(user, name, computations)) is not None:
                total += nested
            else:
                return None
    return total if users.get(parameter) else None


def _nested_sliced_reads(user: Instruction, operand: str,
                         computations: dict[str, Computation]) -> float | None:
    """What the nested fusion `user` reads of its operand `operand`, if it only
    slices it (None otherwise)."""
    nested = computations.get(dict(user.callees()).get("calls", ""))
    if nested is None:
        return None
    parameters, users = _parameters_and_users(nested)
    total = 0.0
    for index in (i for i, name in enumerate(user.operands) if name == operand):
        if index >= len(parameters):
            return None
        read = _sliced_reads(parameters[index].name, users, computations)
        if read is None:
            return None
        total += read
    return total
