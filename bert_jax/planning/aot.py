"""Ahead-of-time compilation of an experiment's train and evaluation steps for
accelerators that are not here (`launch/compile.py`).

The steps are those `launch/train.py` runs (the task built without data, its
loss through `make_train_step`/`jit_train_step` with donation, the trainer's
optimizer, the logical-axis shardings, `config.mesh`, `evaluation.jit_predict`);
only the arrays are abstract (`jax.ShapeDtypeStruct`s with their shardings).

A `StepReport` gives, per device: memory (`compiled_memory`) against the
chip's; XLA's FLOP count (TPU only; the GPU compiler gives none) beside the
model FLOPs of `bert_jax.modeling.flops`; the collectives with count and
result bytes, as written in the program text (an op inside a loop counted once)
and as executed a step (times the trip counts of the loops around it:
`bert_jax.planning.hlo`), and each collective op with its replica groups; the
fused attention kernels (cuDNN's, splash's); the program's matmul FLOPs and
memory traffic with every loop unrolled (`hlo_cost`).

`CompileReport.bound` is the train step's time bound (`step_bound`): compute,
memory and communication time at the target's peak figures
(`topologies.machine`), the largest of them, their sum, the bottleneck and the
MFU ceiling it implies; beside it the per-instruction roofline and its
costliest instructions. `fit_global_batch` ranks the configurations that fit
by the second (the tighter: a sum of per-instruction maxima), or by the first
where the instructions were not costed.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import time
from typing import Any

import jax
import ml_collections

from bert_jax.auto_dtype import Hardware, resolve_model_dtype
from bert_jax.config_schema import check_config, refuse
from bert_jax.errors import ConfigError, DoesNotFit
from bert_jax.planning import hlo
from bert_jax.planning.hlo_cost import ProgramCost, program_cost
from bert_jax.planning.step_bound import Machine, StepBound, step_bound
from bert_jax.planning.topologies import GPUS, Target, machine
from bert_jax.tasks import build_task
from bert_jax.training.evaluation import jit_predict
from bert_jax.training.optimizer import optimizer_from_config
from bert_jax.training.sharding import BATCH_AXES, batch_sharding, mesh_from_config
from bert_jax.training.train_step import (
    abstract_train_state, jit_train_step, make_train_step)
from bert_jax.training.validation import check_batch

COLLECTIVES = hlo.COLLECTIVES
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([A-Za-z_][\w\-]*?)(?:\.\d+)*\s*=")
GiB = float(1 << 30)


@dataclasses.dataclass
class StepReport:
    """`collectives`: `{kind: {'count', 'bytes'}}` as written (an op inside a
    loop once); `collectives_executed`: the same a step, as executed;
    `collective_ops`: one dict per op, with `kind`, `name`, `bytes` (result
    bytes per device of one execution), `operand_bytes`, `executions` (a step),
    `group_size` and `replica_groups` (lists of logical device ids: positions
    in `mesh.devices.flat`); see `hlo.collective_ops`."""

    compile_seconds: float
    memory: dict[str, int]
    xla_flops: float | None
    collectives: dict[str, dict[str, float]]
    attention_kernels: dict[str, int]
    collectives_executed: dict[str, dict[str, float]] = dataclasses.field(
        default_factory=dict)
    collective_ops: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    program: ProgramCost | None = None   # FLOPs and bytes per device, loops unrolled

    @property
    def total_bytes(self) -> int:
        return self.memory["total"]


@dataclasses.dataclass
class CompileReport:

    topology: str
    chip: str
    num_devices: int
    num_slices: int
    memory_per_device: int     # what a step may use (Target.memory_bytes)
    memory_note: str
    mesh: dict[str, int]
    global_batch: int
    per_device_batch: float
    model_flops: float
    train: StepReport
    eval: StepReport | None
    bound: StepBound | None = None   # the train step's; None without the chip's figures

    @property
    def fits(self) -> bool:
        steps = [self.train] + ([self.eval] if self.eval else [])
        return all(step.total_bytes <= self.memory_per_device for step in steps)

    def to_dict(self) -> dict[str, Any]:
        """The report; the bound under `step_time_bound` (seconds: compute,
        memory, communication, bound, sum), `bottleneck`, `mfu_ceiling`,
        `per_instruction_bound` (its costliest instructions, not all of them)."""
        report = dataclasses.asdict(self)
        del report["bound"]
        for step in (report["train"], report["eval"]):
            if step and step["program"]:
                del step["program"]["instructions"]
        return {**report, "fits": self.fits, **(self.bound.to_dict() if self.bound else {})}

    def summary(self) -> str:
        slices = f", {self.num_slices} slices" if self.num_slices > 1 else ""
        lines = [f"{self.topology} ({self.num_devices} x {self.chip}{slices}); "
                 f"mesh {self.mesh}; global batch "
                 f"{self.global_batch} ({self.per_device_batch:g} per device)"]
        if self.memory_note:
            lines.append(f"memory a step may use: {self.memory_per_device / GiB:.1f} GiB "
                         f"per device ({self.memory_note})")
        for name, step in (("train", self.train), ("eval", self.eval)):
            if step is None:
                continue
            m = step.memory
            lines.append(
                f"{name}: compiled in {step.compile_seconds:.1f} s; per device "
                f"{m['total'] / GiB:.2f} GiB of {self.memory_per_device / GiB:.1f} GiB "
                f"(arguments {m['arguments'] / GiB:.2f}, outputs {m['outputs'] / GiB:.2f}, "
                f"temporaries {m['temporaries'] / GiB:.2f}, code "
                f"{m['generated_code'] / GiB:.3f}, aliased -{m['aliased'] / GiB:.2f})")
            if name == "train":
                xla = ("not reported by this compiler" if step.xla_flops is None else
                       f"XLA {step.xla_flops:.3e} ({step.xla_flops / self.model_flops:.3f}x)")
                program = ("" if step.program is None else
                           f"; program's matmuls, loops unrolled "
                           f"{step.program.flops * self.num_devices:.3e}")
                lines.append(f"  FLOPs per step: model {self.model_flops:.3e}; {xla}{program}")
            for when, found in (("as written", step.collectives),
                                ("as executed a step", step.collectives_executed)):
                lines.append(f"  collectives {when}: " + (", ".join(
                    f"{kind} x{int(c['count'])} ({c['bytes'] / 2**20:.2f} MiB)"
                    for kind, c in found.items()) or "none"))
            lines.append("  attention kernels: " + (", ".join(
                f"{k} x{n}" for k, n in step.attention_kernels.items()) or
                "none (attention is XLA fusions)"))
            if name == "train" and self.bound:
                lines.append("  " + self.bound.summary())
        return "\n".join(lines)


def collectives(hlo_text: str) -> dict[str, dict[str, float]]:
    """`{kind: {'count', 'bytes'}}` of a compiled program's communication ops as
    written (an op inside a loop counts once); an asynchronous pair
    (`-start`/`-done`) counts once, with its result's bytes. As executed:
    `hlo.collective_ops(hlo_text).executed`."""
    return hlo.collective_ops(hlo_text).as_written


def attention_kernels(hlo_text: str) -> dict[str, int]:
    """cuDNN's `__cudnn$fmha*` calls, and Mosaic kernels by instruction name
    (e.g. `splash_mha_fwd_segmented_residuals`)."""
    found: collections.Counter = collections.Counter()
    for line in hlo_text.splitlines():
        for target in _CUSTOM_CALL.findall(line):
            if target.startswith("__cudnn$fmha"):
                found[target] += 1
            elif target == "tpu_custom_call":
                name = _INSTRUCTION.match(line)
                found[f"tpu_custom_call:{name.group(1) if name else 'unnamed'}"] += 1
    return dict(sorted(found.items()))


def compiled_memory(compiled) -> dict[str, int]:
    """Bytes per device of a compiled step: its parts, and `total` (aliased
    outputs share their donated arguments' buffers, so count once)."""
    stats = compiled.memory_analysis()
    memory = {"arguments": stats.argument_size_in_bytes,
              "outputs": stats.output_size_in_bytes,
              "temporaries": stats.temp_size_in_bytes,
              "generated_code": stats.generated_code_size_in_bytes,
              "aliased": stats.alias_size_in_bytes}
    memory["total"] = (memory["arguments"] + memory["outputs"] + memory["temporaries"]
                       + memory["generated_code"] - memory["aliased"])
    return memory


def _xla_flops(compiled, num_devices: int) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"]) * num_devices


def _compile(jitted, args, num_devices: int) -> StepReport:
    start = time.perf_counter()
    try:
        compiled = jitted.lower(*args).compile()
    except Exception as e:  # noqa: BLE001  (the TPU compiler refuses what exceeds HBM)
        # The one message test in bert_jax: XLA raises a plain XlaRuntimeError whose text
        # starts with its status code, the only signal there is of an out-of-memory refusal.
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        raise DoesNotFit("the compiler ran out of device memory: " + " ".join(
            line.strip() for line in str(e).splitlines()[:3])) from e
    return step_report(compiled, time.perf_counter() - start, num_devices)


def step_report(compiled, compile_seconds: float, num_devices: int) -> StepReport:
    """What a compiled step needs and does, per device."""
    text = compiled.as_text()
    found = hlo.collective_ops(text)
    return StepReport(compile_seconds, compiled_memory(compiled),
                      _xla_flops(compiled, num_devices), found.as_written,
                      attention_kernels(text), found.executed, found.ops, program_cost(text))


def bound_of(step: StepReport, hardware: Machine, model_flops_per_device: float
             ) -> StepBound:
    """The time bound of `step` on `hardware` (its `places` indexed by the
    program's device ids; one slice's program on a multi-slice TPU: the first
    slice's devices come first). FLOPs: the program's matmuls, loops unrolled,
    or the model's if more (the program's count misses the custom calls it
    cannot cost: Pallas kernels; cuDNN attention it costs, `hlo_cost`)."""
    program = step.program or ProgramCost(0.0, 0.0, {}, [])
    flops, source = ((program.flops, "the program's dots, convolutions and cuDNN attention, "
                      "loops unrolled")
                     if program.flops >= model_flops_per_device else
                     (model_flops_per_device, "the model's matmuls (bert_jax.modeling.flops), "
                      f"above the program's count of {program.flops:.3e} (custom calls "
                      "uncounted)"))
    ops = step.collective_ops
    if program.dcn_transfers:   # a slice's program: its share of a ring across the slices
        slices: dict[int, int] = {}
        for index, place in enumerate(hardware.places):
            slices.setdefault(place.domain, index)
        ops = ops + [{**transfer, "replica_groups": [list(slices.values())]}
                     for transfer in program.dcn_transfers]
    return step_bound(
        flops=flops, bytes_accessed=program.bytes_accessed,
        model_flops=model_flops_per_device, collective_ops=ops,
        machine=hardware, instructions=program.instructions or None, sources={
            "flops": source,
            "bytes": "operands and results of the instructions run, loops unrolled (hlo_cost)",
            "collectives": "each op's executions and replica groups"
            + ("; between slices: the TPU host transfers" if program.dcn_transfers else "")})


def program_order(mesh) -> tuple:
    """The mesh's devices in the order of the program's device ids: the mesh's
    order; with several TPU slices, each runs its own program over its devices
    (in the mesh's order), so the first slice's come first."""
    flat = tuple(mesh.devices.flat)
    first = tuple(d for d in flat
                  if getattr(d, "slice_index", 0) == getattr(flat[0], "slice_index", 0))
    return first + tuple(d for d in flat if d not in first)


def with_per_device_batch(config: ml_collections.ConfigDict, per_device: int,
                          batch_devices: int) -> ml_collections.ConfigDict:
    """`config` with `per_device * batch_devices` rows a step (no token budget)."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.batch_size = per_device * batch_devices
    if config.data.get("batch_tokens", 0):
        config.data.batch_tokens = 0
    return config


def batch_devices(mesh) -> int:
    return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def target_hardware(target: Target) -> Hardware:
    """model.dtype='auto' is resolved for the target, not the compiling CPU."""
    capability = next((spec.compute_capability for spec in GPUS.values()
                       if spec.description == target.chip), None)
    return Hardware(target.platform, target.chip, capability)


def compile_experiment(config: ml_collections.ConfigDict, target: Target,
                       eval_step: bool = True) -> CompileReport:
    config = resolve_model_dtype(config, target_hardware(target))
    mesh = mesh_from_config(config.mesh, target.devices)
    with jax.set_mesh(mesh):  # the rules read the target's platform ('flash')
        check_config(config)
    task = build_task(config, None, abstract=True)
    num_devices = len(target.devices)
    state, shardings = abstract_train_state(task.init_variables, task.model.apply,
                                            optimizer_from_config(config), mesh)
    rng = jax.ShapeDtypeStruct((2,), jax.numpy.uint32,
                               sharding=jax.sharding.NamedSharding(
                                   mesh, jax.sharding.PartitionSpec()))

    def batch(train: bool):
        return {key: jax.ShapeDtypeStruct(spec.shape, spec.dtype,
                                          sharding=batch_sharding(mesh))
                for key, spec in task.batch_spec(train).items()}

    check_batch(task, batch_devices(mesh))
    train_batch = batch(True)
    global_rows = next(iter(train_batch.values())).shape[0]
    with jax.set_mesh(mesh):
        step = jit_train_step(make_train_step(task.loss_fn, config.train.grad_accum_steps,
                                              config.train.dropout_prng),
                              shardings, mesh)
        train = _compile(step, (state, train_batch, rng), num_devices)
        evaluation = None
        if eval_step:
            evaluation = _compile(jit_predict(task, mesh),
                                  (state.params, batch(False), None), num_devices)
    model_flops = task.flops_per_step()
    bound = None
    if target.interconnect is not None:
        bound = bound_of(train, machine(target, program_order(mesh)), model_flops / num_devices)
    return CompileReport(
        topology=target.name, chip=target.chip, num_devices=num_devices,
        num_slices=target.num_slices, memory_per_device=target.memory_bytes,
        memory_note=target.memory_note,
        mesh=dict(mesh.shape), global_batch=global_rows,
        per_device_batch=global_rows / batch_devices(mesh),
        model_flops=model_flops, train=train, eval=evaluation, bound=bound)


@dataclasses.dataclass
class MaxBatch:

    per_device: int               # 0 when the first size tried does not fit
    report: CompileReport | None  # the step at that batch
    reached_limit: bool           # the search stopped at its limit, not at a
                                  # batch that does not fit: the answer is a floor


def find_max_batch(config: ml_collections.ConfigDict, target: Target, start: int = 1,
                   limit: int = 4096, bisect: bool = True) -> MaxBatch:
    """The largest per-device training batch that fits: doubling from `start` up
    to `limit`, then (`bisect`) bisection to within 1/8 of the answer. About
    log2(answer / start) + 1 compiles, plus 3 to bisect."""
    mesh = mesh_from_config(config.mesh, target.devices)
    devices = batch_devices(mesh)

    def attempt(per_device: int) -> CompileReport | None:
        try:
            report = compile_experiment(with_per_device_batch(config, per_device, devices),
                                        target, eval_step=False)
        except DoesNotFit:
            return None
        return report if report.fits else None

    best, best_report, low, high = 0, None, 0, None
    size = start
    while high is None and size <= limit:
        report = attempt(size)
        if report is None:
            high = size
        else:
            best, best_report, low = size, report, size
            size *= 2
    while bisect and high is not None and high - low > max(1, low // 8):
        middle = (low + high) // 2
        report = attempt(middle)
        if report is None:
            high = middle
        else:
            best, best_report, low = middle, report, middle
    return MaxBatch(best, best_report, reached_limit=high is None)


@dataclasses.dataclass
class GlobalBatchFit:

    micro_batch: int              # rows per device in one micro-batch
    grad_accum_steps: int         # micro-batches a step: global = micro x devices x steps
    mesh_shape: tuple[int, int, int]
    scan_layers: bool             # config.model.scan_layers of the step compiled
    report: CompileReport         # the step at that micro-batch, as train.py runs it

    @property
    def bound_s(self) -> float:
        """What the search ranks by: the per-instruction roofline's bound when
        the report has one, else the step-total bound, else infinity (no
        figures for the chip)."""
        bound = self.report.bound
        if bound is None:
            return math.inf
        return bound.roofline.bound_s if bound.roofline else bound.bound_s


FSDP_MESH = (1, -1, 1)


def fit_global_batch(config: ml_collections.ConfigDict, target: Target,
                     alternatives: bool = True) -> list[GlobalBatchFit]:
    """The ways to run `config.train.batch_size` rows a step that fit, the
    fastest bound first (`GlobalBatchFit.bound_s`: the per-instruction roofline,
    else the step-total bound; ties, or no bound: the larger micro-batch).

    Per candidate mesh and layer form, a bisection over the divisors of each
    device's share of the batch finds the largest micro-batch that fits,
    compiling the step `launch/train.py` runs (`grad_accum_steps` = share /
    micro-batch; the accumulation scan's buffers count) and assuming every
    smaller micro-batch fits; every size compiled that fits is a candidate.
    Candidates: `config.mesh` and FSDP over the whole target, the layers
    scanned as configured and the other way (`alternatives`; 4 searches).
    Without `alternatives`: the configured layers, and FSDP only if nothing
    fits `config.mesh`."""
    scans = [bool(config.model.get("scan_layers", False))]
    if alternatives and "scan_layers" in config.model:
        scans.append(not scans[0])
    meshes = list(dict.fromkeys([tuple(config.mesh.shape), FSDP_MESH]))
    found: list[GlobalBatchFit] = []
    for shape in meshes:
        for scan in scans:
            try:
                found += _fits_at(config, target, shape, scan)
            except ConfigError:
                if shape == meshes[0]:
                    raise       # the configured mesh; FSDP may not split this batch
        if found and not alternatives:
            break
    if not found:
        raise DoesNotFit(f"one row per device does not fit {target.name}, even with FSDP: "
                         "set config.model.remat, or use config.mesh.shape's tensor axis.")
    return sorted(found, key=lambda fit: (fit.bound_s, -fit.micro_batch))


def _fits_at(config: ml_collections.ConfigDict, target: Target, shape: tuple,
             scan: bool) -> list[GlobalBatchFit]:
    """The micro-batches that fit with mesh `shape` and the layers `scan`ned,
    compiled while bisecting for the largest."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.mesh.shape = shape
    if "scan_layers" in config.model:
        config.model.scan_layers = scan
    devices = batch_devices(mesh_from_config(config.mesh, target.devices))
    share, rest = divmod(config.train.batch_size, devices)
    if rest or not share:
        refuse([f"config.train.batch_size={config.train.batch_size}: use a multiple of "
                f"{target.name}'s {devices} devices (mesh {shape})."],
               f"the config cannot compile for {target.name}")
    sizes = [size for size in range(1, share + 1) if share % size == 0]
    low, high, fits = -1, len(sizes), []   # sizes[low] fits, sizes[high] does not
    while high - low > 1:
        middle = (low + high) // 2
        config.train.grad_accum_steps = share // sizes[middle]
        try:
            report = compile_experiment(config, target, eval_step=False)
        except DoesNotFit:
            report = None
        if report is not None and report.fits:
            low = middle
            fits.append(GlobalBatchFit(sizes[middle], share // sizes[middle], shape, scan,
                                       report))
        else:
            high = middle
    return fits


def projected_hours(report: CompileReport, steps: int, mfu: float, peak_flops: float
                    ) -> float:
    return steps * report.model_flops / (mfu * peak_flops * report.num_devices) / 3600
