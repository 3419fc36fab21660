"""Accelerators that may not be here: TPU slices and GPU nodes, by name.

`target(name, num_slices)` gives the devices of a TPU slice or a GPU node for
ahead-of-time compilation on a CPU (`bert_jax.planning.aot`), with the chip's
memory and peak bfloat16 FLOP/s (`TPUS`, `GPUS`: the one chip table,
`bert_jax.training.chips`):

  TPU (needs `libtpu`: `pip install -e ".[tpu]"`)
    v4-N, v5p-N   N TensorCores (2 per chip), 3-D torus, e.g. v4-32, v5p-128
    v5e-N, v6e-N  N chips, 2-D torus, e.g. v5e-256
    v5e:16x16, v4:2x2x4, v5p:4x4x4   an explicit chip grid
  GPU (needs `pip install -e ".[cuda12]"`, and JAX_PLATFORMS=cpu
  JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 without a GPU)
    h100-8, h200-8, a100-8, b200-8   one node of 8 GPUs; -16, -32 ...: nodes of 8

A GPU is described to XLA by a `GpuTargetConfig` text proto rendered from the
vendors' figures; memory sizes are what the device reports (nvidia-smi's total).

Bandwidths (bytes/s, one way) for the step-time bound of
`bert_jax.planning.step_bound` (`machine(target, devices)`): HBM, the links
within a slice or node (ICI, NVLink) and the network between them (DCN,
InfiniBand), cited where they are set.

A name, `num_slices` or memory share (`MEMORY_FRACTION_VARIABLES`) that cannot
form a slice is the user's error (`launch/compile.py`'s --topology, --num_slices
and environment): a `UserError` naming the value, which `launch/cli.py` reports
as one line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Sequence

from bert_jax.errors import UserError
from bert_jax.planning.step_bound import Interconnect, Machine, Place
from bert_jax.training.chips import GPUS, TPUS, GiB, GpuSpec, TpuChip, chip

# Set before JAX starts to compile on a CPU for accelerators that are not here:
# the CUDA plugin describes GPUs without a driver only with the platform check
# off; libtpu serves several processes only when allowed, and without a worker
# list and host bounds says at every start it found no TPU VM.
COMPILE_ONLY_ENVIRONMENT = {
    "JAX_PLATFORMS": "cpu",
    "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
}


@dataclasses.dataclass(frozen=True)
class Target:

    name: str
    platform: str              # 'tpu' | 'gpu'
    devices: tuple
    chip: str                  # e.g. 'TPU v5e', 'NVIDIA H100 80GB HBM3'
    memory_bytes: int          # what a step may use: a chip's HBM (TPU); a GPU's
                               # memory times JAX's allocator share (GPU)
    peak_flops: float          # per chip, dense bfloat16
    num_slices: int = 1
    memory_note: str = ""      # how memory_bytes follows from the chip, for reports
    memory_bandwidth: float = 0.0            # HBM bytes/s per chip
    interconnect: Interconnect | None = None  # its links (step_bound)
    vector_flops: float = 0.0  # per chip: vector-unit operations/s (step_bound)


TORUS_AXIS = 16     # v5e/v6e: an axis this long has a wraparound link
CUBE_SIDE = 4       # v4/v5p: slices of whole cubes of this side have them on every axis


GPUS_PER_NODE = 8
# JAX's GPU allocator takes this share of a GPU's memory (75% unless the
# variable says otherwise; XLA_PYTHON_CLIENT_MEM_FRACTION is its older name):
# a step that needs more runs out of memory on the node however large the card.
MEMORY_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
DEFAULT_MEMORY_FRACTION = 0.75
CUDNN_VERSION = (9, 8)       # the cuDNN and CUDA the target configs describe
CUDA_VERSION = (12, 8)


def local_machine(devices: Sequence) -> Machine | None:
    """Real `devices` of one host (one chip, or a GPU node on its NVLink) as
    the chip table describes them: the bound of a step timed on them (None:
    a kind not in the table)."""
    spec = chip(devices[0].device_kind)
    if spec is None:
        return None
    gpu = isinstance(spec, GpuSpec)
    links = (Interconnect("NVLink", spec.nvlink_bandwidth) if gpu
             else Interconnect("ICI", spec.ici_bandwidth))
    return Machine(devices[0].device_kind, spec.peak_flops,
                   spec.memory_bandwidth if gpu else spec.hbm_bandwidth, links,
                   (Place(0),) * len(devices), spec.vector_flops)


def gpu_target_config(spec: GpuSpec) -> str:
    major, minor = spec.compute_capability
    info = {
        "threads_per_block_limit": 1024, "threads_per_warp": 32,
        "shared_memory_per_block": 49152,
        "shared_memory_per_core": spec.shared_memory_per_sm,
        "threads_per_core_limit": 2048, "core_count": spec.sm_count,
        "fpus_per_core": spec.fp32_cores_per_sm,
        "block_dim_limit_x": 2147483647, "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535, "memory_bandwidth": int(spec.memory_bandwidth),
        "l2_cache_size": spec.l2_cache_bytes, "clock_rate_ghz": spec.clock_ghz,
        "device_memory_size": spec.memory_bytes,
        "shared_memory_per_block_optin": spec.shared_memory_per_block_optin,
    }
    lines = [f"  {key}: {value}" for key, value in info.items()]
    lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor} }}")
    lines += ["  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536"]
    return "\n".join([
        "gpu_device_info {", *lines, "}",
        'platform_name: "CUDA"',
        f"dnn_version_info {{ major: {CUDNN_VERSION[0]} minor: {CUDNN_VERSION[1]} }}",
        f"runtime_version {{ major: {CUDA_VERSION[0]} minor: {CUDA_VERSION[1]} }}",
        f'device_description_str: "{spec.description}"', ""])


def gpu_memory_fraction() -> float:
    """JAX's allocator share of GPU memory, from the environment as on the node."""
    for variable in MEMORY_FRACTION_VARIABLES:
        text = os.environ.get(variable, "")
        if not text:
            continue
        try:
            fraction = float(text)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise UserError(f"{variable}={text!r}: give a share in (0, 1], e.g. 0.9.")
        return fraction
    return DEFAULT_MEMORY_FRACTION


def tpu_grid(chips: int, dims: int) -> tuple[int, ...]:
    """The chip grid Cloud TPU gives a slice of `chips` chips: start from 1x1
    (2-D) or 2x2x1 (3-D) and double the smallest side, the last one on ties
    (v4-8: 2x2x1, v4-32: 2x2x4, v5p-128: 4x4x4, v5e-8: 2x4, v5e-256: 16x16)."""
    smallest_slice = 4 if dims == 3 else 1
    if chips < smallest_slice or chips & (chips - 1):
        raise UserError(f"{chips} chips: a slice by size is a power of two (3-D: 4 or "
                        "more); give the grid instead, e.g. v5e:4x8.")
    grid = [2, 2, 1] if dims == 3 else [1] * dims
    while math.prod(grid) < chips:
        smallest = min(grid)
        index = max(i for i, g in enumerate(grid) if g == smallest)
        grid[index] *= 2
    return tuple(grid)


_SIZED = re.compile(r"^(v4|v5p|v5e|v6e)-(\d+)$")
_GRID = re.compile(r"^(v4|v5p|v5e|v6e):(\d+(?:x\d+)+)$")
_GPU = re.compile(r"^([a-z]\d+)-(\d+)$")


def target(name: str, num_slices: int = 1) -> Target:
    name = name.strip().lower()
    if _SIZED.match(name) or _GRID.match(name):
        return _tpu(name, num_slices)
    match = _GPU.match(name)
    if match and match.group(1) in GPUS:
        if num_slices != 1:
            raise UserError(f"--num_slices is for TPUs; name the GPUs instead "
                            f"({match.group(1)}-16: two nodes).")
        return _gpu(match.group(1), int(match.group(2)))
    raise UserError(f"unknown accelerator {name!r}: use a TPU slice (v5e-256, "
                    f"v5e:16x16) or GPU nodes ({', '.join(GPUS)} with -8, -16, ...).")


def _tpu(name: str, num_slices: int) -> Target:
    sized = _SIZED.match(name)
    kind = (sized or _GRID.match(name)).group(1)
    chip = TPUS[kind]
    if sized:
        cores = int(sized.group(2))
        if cores % chip.cores_per_chip:
            raise UserError(f"{name}: {kind} counts {chip.cores_per_chip} cores a chip.")
        grid = tpu_grid(cores // chip.cores_per_chip, chip.dims)
    else:
        grid = tuple(int(g) for g in _GRID.match(name).group(2).split("x"))
        if len(grid) != chip.dims:
            raise UserError(f"{name}: a {kind} grid has {chip.dims} sides.")
    topology = f"{chip.prefix}:{'x'.join(map(str, grid))}"
    options = {"chip_config_name": "megacore"} if chip.cores_per_chip == 2 else {}
    devices = _topology_devices(dict(topology_name=topology, platform="tpu",
                                     num_slices=num_slices, **options), "tpu", name)
    torus = tuple(grid) + (1,) * (3 - len(grid))   # devices' coords are (x, y, z)
    links = Interconnect("ICI", chip.ici_bandwidth, "DCN", chip.dcn_bandwidth, torus,
                         wraparound(chip, torus))
    return Target(name, "tpu", devices, f"TPU {kind}", chip.memory_bytes,
                  chip.peak_flops, num_slices, memory_bandwidth=chip.hbm_bandwidth,
                  interconnect=links, vector_flops=chip.vector_flops)


def wraparound(chip: TpuChip, torus: tuple[int, ...]) -> tuple[bool, ...]:
    """Per axis of a slice's chip grid: whether a wraparound link closes it
    into a ring (v4/v5p: every axis of a slice of whole 4x4x4 cubes; v5e/v6e:
    an axis of 16)."""
    if chip.full_cube:
        return (all(side % CUBE_SIDE == 0 for side in torus),) * len(torus)
    return tuple(side == TORUS_AXIS for side in torus)


def _gpu(kind: str, count: int) -> Target:
    if count <= GPUS_PER_NODE:
        layout = f"1x1x{count}"
    elif count % GPUS_PER_NODE == 0:
        layout = f"1x{count // GPUS_PER_NODE}x{GPUS_PER_NODE}"
    else:
        raise UserError(f"{kind}-{count}: use whole nodes of {GPUS_PER_NODE} GPUs.")
    spec = GPUS[kind]
    devices = _topology_devices(dict(platform="cuda", topology=layout,
                                     target_config=gpu_target_config(spec)),
                                "gpu", f"{kind}-{count}")
    fraction = gpu_memory_fraction()
    note = (f"{fraction:.0%} of the GPU's {spec.memory_bytes / GiB:.1f} GiB: the share JAX's "
            f"allocator takes; {MEMORY_FRACTION_VARIABLES[0]} changes it, here as on the node")
    return Target(f"{kind}-{count}", "gpu", devices, spec.description,
                  int(spec.memory_bytes * fraction), spec.peak_flops, memory_note=note,
                  memory_bandwidth=spec.memory_bandwidth,
                  interconnect=Interconnect("NVLink", spec.nvlink_bandwidth, "InfiniBand",
                                            spec.network_bandwidth),
                  vector_flops=spec.vector_flops)


def machine(target: Target, devices: Sequence) -> Machine:
    """`target`'s figures, with `devices` (the program's, in its device-id
    order: a mesh's `devices.flat`) placed in their slice (TPU: `slice_index`,
    `coords`) or node (GPU: `process_index`, one process a node)."""
    if target.interconnect is None:
        raise ValueError(f"{target.name}: no bandwidths are known for its chips.")
    places = tuple(Place(getattr(d, "slice_index", 0) or 0, tuple(d.coords))
                   if target.platform == "tpu" else Place(d.process_index)
                   for d in devices)
    return Machine(target.name, target.peak_flops, target.memory_bandwidth,
                   target.interconnect, places, target.vector_flops)


def _topology_devices(options: dict, platform: str, name: str) -> tuple:
    from jax.experimental import topologies
    try:
        return tuple(topologies.get_topology_desc(**options).devices)
    except Exception as e:  # noqa: BLE001  (the plugin's error, --debug shows it)
        install = ('"jax[tpu]" (pip install -e ".[tpu]")' if platform == "tpu" else
                   '"jax[cuda12]" (pip install -e ".[cuda12]") and run with '
                   "JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1")
        raise UserError(f"cannot describe {name} to the {platform.upper()} compiler "
                        f"({type(e).__name__}; --debug shows its error).\nIt needs "
                        f"{install}.") from e
