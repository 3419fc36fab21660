"""A lower bound on a step's time from its compiled program: the roofline.

Three times, each what one resource needs at its peak, per device:

  compute        FLOPs of the program / peak FLOP/s
  memory         bytes the program reads and writes / memory bandwidth
  communication  each collective's bytes / the bandwidth of the links it crosses,
                 times the executions (loops' trip counts)

They overlap at best, so the step takes at least the largest (`bound_s`) and,
without any overlap, about their sum (`sum_s`): "How to Scale Your Model"
(jax-ml/scaling-book, roofline.md, "Where Does the Time Go?": T_lower = max,
T_upper = sum). `bottleneck` names the largest, and `mfu_ceiling` is the model
FLOPs utilization a step at the bound would reach: model FLOPs per device /
(peak x bound). A bound, not a prediction: latency, imbalance, kernels below
peak and host work only add time, so a measured step is never faster.

Collectives, as the scaling book derives them for a bandwidth-bound ring
(sharding.md, "Computation With Sharded Arrays", Cases 2 and 3, and "What Have
We Learned?"): an all-gather of V bytes (the gathered result) over N devices
costs V (N-1)/N / W, with W the one-way bandwidth of a ring without a
wraparound link and the bidirectional one (twice) with it (the book's
V / W_ICI is this form's large-N limit); over several torus axes the
bandwidths add (its "V / (W_ICI n_axes)"). A reduce-scatter costs the same with
V its operand, an all-reduce twice that (reduce-scatter + all-gather), an
all-to-all a quarter of the all-gather on a torus ring (sharding.md, "Our final
communication primitive: the AllToAll") and 1/N of it through a switch
(gpus.md, "How Do Collectives Work on GPUs?", intra-node). A collective-permute
sends its V bytes over one link. Across slices (DCN) or GPU nodes (InfiniBand)
a collective runs as a ring at each level, the levels overlapped (gpus.md,
"Cross-node collectives": V max_i (D_i - 1) / (D_i W_i)): D_0 devices of the
group within a slice or node on its local links, D_1 slices or nodes on the
network, where the group's share of a node's network is its D_0 devices' own
(each TPU chip's share of its host's DCN; each GPU's InfiniBand NIC).
Latency (about 1 us a hop) is left out: small collectives take longer.

Beside it, the roofline per instruction (`Roofline`, JSON
`per_instruction_bound`), over the program's top-level instructions (a fusion
as one, with what it fuses; `hlo_cost.InstructionCost`) in the order the
compiler scheduled them. One execution of an instruction takes at least the
largest of its matmul FLOPs / the matrix peak, its vector operations
(elementwise and reduction work, as `hlo_cost` counts it) / the vector units'
peak (`Machine.vector_flops`), its bytes / the memory bandwidth and, for a
collective, its link time as above: `limit` names the one that binds.
Instructions run one after another, so the step takes at least the sum of
these times their executions. An asynchronous pair (`-start` ... `-done`:
collectives, copies, slices, host transfers) runs beside the instructions
scheduled between its start and its done: it adds only what its own time
exceeds their added time by, the exposed part. The bound is the instructions'
time plus the exposed communication (`instructions_s`,
`exposed_communication_s`). A sum of maxima is at least the maximum of the
sums, so this bound is the tighter one, but for the work it does not see:
what asynchronous pairs hide, and the FLOPs of custom calls `hlo_cost` cannot
cost (Pallas kernels: their bytes are counted; cuDNN attention's FLOPs are
counted). Both are lower bounds.

Inputs are plain (`Machine`, the collective ops as dicts, the instructions'
costs) so that the bound can be computed and tested without a compiler;
`bert_jax.planning.aot` feeds it a compiled step and `launch/benchmark.py` a
measured CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

LIMITS = ("matrix", "vector", "memory", "communication")   # of one instruction


@dataclasses.dataclass(frozen=True)
class Place:
    """Where one device of the program sits."""

    domain: int                     # its TPU slice or GPU node (the network's side)
    coords: tuple[int, ...] = ()    # its chip's position in the slice's torus (TPU)


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """The links a collective can cross; bandwidths in bytes/s, one way."""

    local: str                      # 'ICI' | 'NVLink' | 'memory'
    local_bandwidth: float          # ICI: one link; NVLink: one GPU's (a switch)
    remote: str = ""                # 'DCN' | 'InfiniBand' ('' : one domain only)
    remote_bandwidth: float = 0.0   # one device's share of its domain's network
    torus: tuple[int, ...] = ()     # a slice's chip grid (ICI); () for a switch
    wraparound: tuple[bool, ...] = ()   # per torus axis: a ring closes over it


@dataclasses.dataclass(frozen=True)
class Machine:
    """The hardware figures of one device and where the program's devices sit."""

    name: str
    peak_flops: float               # per device, in the dtype the model computes in
    memory_bandwidth: float         # per device (HBM; a CPU's measured copy)
    interconnect: Interconnect
    places: tuple[Place, ...]       # indexed by the program's device id
    vector_flops: float = 0.0       # per device: the vector units' operations/s
                                    # (0: unknown, vector work not bounded)


@dataclasses.dataclass
class Roofline:
    """The per-instruction bound: seconds per step, per device."""

    bound_s: float                  # instructions_s + exposed_communication_s
    instructions_s: float           # instructions bound by matmuls, vector work or memory
    exposed_communication_s: float  # bound by their links, less what overlapped them
    by_limit_s: dict[str, float]    # the seconds, by the limit that binds (LIMITS)
    mfu_ceiling: float              # model FLOPs utilization at bound_s
    vector_flops: float             # the vector peak used (0: vector work not bounded)
    top: list[dict]                 # the costliest instructions, each `name`, `opcode`,
                                    # `seconds` (a step), `limit`, `executions`

    def summary(self, count: int = 3) -> str:
        costliest = ", ".join(f"{row['name']} ({row['opcode']}, {row['limit']}) "
                              f"{row['seconds'] * 1e3:.2f} ms" for row in self.top[:count])
        return (f"per-instruction roofline {self.bound_s * 1e3:.2f} ms (instructions "
                f"{self.instructions_s * 1e3:.2f} ms + exposed communication "
                f"{self.exposed_communication_s * 1e3:.2f} ms; MFU at most "
                f"{self.mfu_ceiling:.1%}); costliest: {costliest or 'none'}")


@dataclasses.dataclass
class StepBound:
    """Seconds per step, per device, and what they were computed from."""

    compute_s: float
    memory_s: float
    communication_s: float
    bound_s: float                  # max of the three: the step takes at least this
    sum_s: float                    # their sum: no overlap at all
    bottleneck: str                 # 'compute' | 'memory' | 'communication'
    mfu_ceiling: float              # model FLOPs utilization at bound_s
    flops: float                    # per device, as costed
    bytes_accessed: float           # per device, as costed
    model_flops: float              # per device (bert_jax.modeling.flops)
    peak_flops: float
    memory_bandwidth: float
    communication_by_link: dict[str, float]   # seconds, each op on its slowest link
    collective_ops: int             # ops costed (each counted once, run `executions` times)
    sources: dict[str, str]         # where flops, bytes and collectives came from
    roofline: Roofline | None = None   # per instruction, when their costs were given

    def summary(self) -> str:
        links = ", ".join(f"{link} {seconds * 1e3:.2f} ms"
                          for link, seconds in self.communication_by_link.items())
        return (f"step-time bound (a projection, not a measurement): "
                f"{self.bound_s * 1e3:.2f} ms ({self.bottleneck}-bound; MFU at most "
                f"{self.mfu_ceiling:.1%}); compute {self.compute_s * 1e3:.2f} ms "
                f"({self.flops:.3e} FLOPs at {self.peak_flops:.3e}/s), memory "
                f"{self.memory_s * 1e3:.2f} ms ({self.bytes_accessed:.3e} B at "
                f"{self.memory_bandwidth:.3e} B/s), communication "
                f"{self.communication_s * 1e3:.2f} ms" + (f" ({links})" if links else "")
                + f"; no overlap {self.sum_s * 1e3:.2f} ms"
                + (f"; {self.roofline.summary()}" if self.roofline else ""))

    def to_dict(self) -> dict:
        """The JSON of `launch/compile.py`: `step_time_bound` (seconds),
        `bottleneck`, `mfu_ceiling`, the inputs and `per_instruction_bound`."""
        roofline = {"per_instruction_bound": dataclasses.asdict(self.roofline)
                    } if self.roofline else {}
        return {"step_time_bound": {"compute_s": self.compute_s, "memory_s": self.memory_s,
                                    "communication_s": self.communication_s,
                                    "bound_s": self.bound_s, "sum_s": self.sum_s},
                "bottleneck": self.bottleneck, "mfu_ceiling": self.mfu_ceiling,
                "bound_inputs": {
                    "flops_per_device": self.flops, "bytes_accessed_per_device":
                    self.bytes_accessed, "model_flops_per_device": self.model_flops,
                    "peak_flops": self.peak_flops, "memory_bandwidth": self.memory_bandwidth,
                    "communication_by_link_s": self.communication_by_link,
                    "collective_ops": self.collective_ops, "sources": self.sources},
                **roofline}


def step_bound(*, flops: float, bytes_accessed: float, model_flops: float,
               collective_ops: Iterable[Mapping], machine: Machine,
               sources: Mapping[str, str] | None = None,
               instructions: Sequence[Any] | None = None) -> StepBound:
    """The bound of a step that runs `flops` and reads and writes `bytes_accessed`
    per device (loops' trip counts included), and the `collective_ops` (dicts:
    `kind`, `bytes` of the result per device, optionally `name` (the
    instruction that completes it), `operand_bytes`, `executions` (default 1)
    and `replica_groups` (lists of device ids, indices into `machine.places`;
    none: one group of every device)). `model_flops`: per device, for the MFU
    ceiling. With `instructions` (`hlo_cost.InstructionCost`s) the
    per-instruction roofline too."""
    by_link: dict[str, float] = {}
    by_name: dict[str, float] = {}   # one execution's link seconds, by instruction
    count = 0
    for op in collective_ops:
        link, seconds = collective_seconds(op, machine)
        by_link[link] = by_link.get(link, 0.0) + seconds * op.get("executions", 1)
        name = op.get("name", "")
        by_name[name] = by_name.get(name, 0.0) + seconds
        count += 1
    times = {"compute": flops / machine.peak_flops,
             "memory": bytes_accessed / machine.memory_bandwidth,
             "communication": sum(by_link.values())}
    bottleneck = max(times, key=times.get)
    bound = times[bottleneck]
    return StepBound(
        compute_s=times["compute"], memory_s=times["memory"],
        communication_s=times["communication"], bound_s=bound, sum_s=sum(times.values()),
        bottleneck=bottleneck,
        mfu_ceiling=model_flops / (machine.peak_flops * bound) if bound > 0 else 0.0,
        flops=flops, bytes_accessed=bytes_accessed, model_flops=model_flops,
        peak_flops=machine.peak_flops, memory_bandwidth=machine.memory_bandwidth,
        communication_by_link=by_link, collective_ops=count, sources=dict(sources or {}),
        roofline=(None if instructions is None else
                  per_instruction_bound(instructions, by_name, machine, model_flops)))


def per_instruction_bound(instructions: Sequence[Any], link_seconds: Mapping[str, float],
                          machine: Machine, model_flops: float, top: int = 10) -> Roofline:
    """The roofline of each of `instructions` (`hlo_cost.InstructionCost`s,
    each computation's in program order) times its executions, summed;
    `link_seconds`: one execution's link time of a collective, by the name of
    the instruction that completes it. `top`: how many of the costliest to list."""
    computations: dict[str, list] = {}
    for instruction in instructions:
        computations.setdefault(instruction.computation, []).append(instruction)
    rows = [row for group in computations.values()
            for row in _scheduled(group, link_seconds, machine)]
    by_limit = dict.fromkeys(LIMITS, 0.0)
    for seconds, limit, _ in rows:
        by_limit[limit] += seconds
    bound = sum(by_limit.values())
    costliest = sorted(rows, key=lambda row: -row[0])[:top]
    return Roofline(
        bound_s=bound, instructions_s=bound - by_limit["communication"],
        exposed_communication_s=by_limit["communication"], by_limit_s=by_limit,
        mfu_ceiling=model_flops / (machine.peak_flops * bound) if bound > 0 else 0.0,
        vector_flops=machine.vector_flops,
        top=[{"name": i.name, "opcode": i.opcode, "seconds": seconds, "limit": limit,
              "executions": i.executions} for seconds, limit, i in costliest if seconds > 0])


def _scheduled(instructions: Sequence[Any], link_seconds: Mapping[str, float],
               machine: Machine) -> list[tuple[float, str, Any]]:
    """(seconds a step, binding limit, instruction) of one computation's
    instructions in program order: each adds its own time, an asynchronous
    `-done` only what its pair's own time exceeds the time added since its
    `-start` by."""
    rows, added, position = [], [0.0], {}
    for instruction in instructions:
        limit, own = _own_time(instruction, link_seconds, machine)
        start = position.get(instruction.start)
        overlapped = added[-1] - added[start + 1] if start is not None else 0.0
        seconds = max(0.0, own - overlapped)
        position[instruction.name] = len(added) - 1
        added.append(added[-1] + seconds)
        rows.append((seconds * instruction.executions, limit, instruction))
    return rows


def _own_time(instruction: Any, link_seconds: Mapping[str, float], machine: Machine
              ) -> tuple[str, float]:
    """(the limit that binds, seconds) of one execution of `instruction` alone."""
    collectives = (instruction.name, *instruction.fused_collectives)
    times = {"matrix": instruction.flops / machine.peak_flops,
             "vector": (instruction.vector_ops / machine.vector_flops
                        if machine.vector_flops else 0.0),
             "memory": instruction.bytes / machine.memory_bandwidth,
             "communication": sum(link_seconds.get(name, 0.0) for name in collectives)}
    limit = max(times, key=times.get)
    return limit, times[limit]


def collective_seconds(op: Mapping, machine: Machine) -> tuple[str, float]:
    """(the link that limits it, seconds) of one execution of `op`: its most
    expensive replica group (all groups run at once)."""
    groups = [list(g) for g in op.get("replica_groups") or [] if g] or [
        list(range(len(machine.places)))]
    return max((_group_seconds(op, group, machine) for group in groups),
               key=lambda cost: cost[1])


def _group_seconds(op: Mapping, group: Sequence[int], machine: Machine
                   ) -> tuple[str, float]:
    kind, size = op["kind"], len(group)
    links = machine.interconnect
    if size <= 1:
        return links.local, 0.0
    result = float(op["bytes"])
    volume = (float(op.get("operand_bytes") or result * size) if kind == "reduce-scatter"
              else result)
    levels = ring_levels(group, machine)
    if kind == "collective-permute":   # one hop over one link, the network's if it spans it
        if levels[-1][0] == links.remote:
            return links.remote, volume / links.remote_bandwidth
        return links.local, volume / links.local_bandwidth
    per_level = []
    for link, devices, bandwidth in levels:
        seconds = volume * (devices - 1) / devices / bandwidth
        if kind == "all-to-all":
            seconds /= 4 if (link == links.local and links.torus) else devices
        per_level.append((link, seconds))
    link, seconds = max(per_level, key=lambda level: level[1])
    return link, seconds * (2 if kind == "all-reduce" else 1)


def ring_levels(group: Sequence[int], machine: Machine) -> list[tuple[str, int, float]]:
    """[(link, devices on the ring, bandwidth of the ring in bytes/s)] of the
    rings an all-gather over `group` runs: within each slice or node (its
    largest share of the group), then across them."""
    links = machine.interconnect
    domains: dict[int, list[Place]] = {}
    for device in group:
        place = machine.places[device]
        domains.setdefault(place.domain, []).append(place)
    local = max(domains.values(), key=len)
    levels = []
    if len(local) > 1:
        levels.append((links.local, len(local), _local_bandwidth(local, links)))
    if len(domains) > 1:
        if links.remote_bandwidth <= 0:
            raise ValueError(f"a collective spans {len(domains)} domains of {machine.name}, "
                             "which has no network between them")
        levels.append((links.remote, len(domains), len(local) * links.remote_bandwidth))
    return levels


def _local_bandwidth(places: Sequence[Place], links: Interconnect) -> float:
    """A switch gives each device its own bandwidth; a torus ring the links of
    every axis the group spans, both directions where a wraparound closes it."""
    if not links.torus or not places[0].coords:
        return links.local_bandwidth
    total = 0.0
    for axis, length in enumerate(links.torus):
        values = {place.coords[axis] for place in places}
        if len(values) > 1:
            closed = links.wraparound[axis] and len(values) == length
            total += links.local_bandwidth * (2 if closed else 1)
    return total or links.local_bandwidth
