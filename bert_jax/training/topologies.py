"""Accelerators that may not be here: TPU slices and GPU nodes, by name.

`target(name, num_slices)` gives the devices of a TPU slice or a GPU node for
ahead-of-time compilation on a CPU (`bert_jax.training.aot`), with the chip's
memory and peak bfloat16 FLOP/s (`TPUS`, `GPUS`: the one chip table):

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
`bert_jax.training.step_bound` (`machine(target, devices)`): HBM, the links
within a slice or node (ICI, NVLink) and the network between them (DCN,
InfiniBand), cited where they are set.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Sequence

from bert_jax.errors import ConfigError
from bert_jax.training.step_bound import Interconnect, Machine, Place

GiB = 1 << 30

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


@dataclasses.dataclass(frozen=True)
class TpuChip:
    prefix: str                # topology_name prefix libtpu knows
    dims: int                  # torus dimensions
    cores_per_chip: int        # the "-N" of a name counts cores
    memory_bytes: int
    peak_flops: float
    hbm_bandwidth: float       # bytes/s per chip
    ici_bandwidth: float       # bytes/s per link, one way
    dcn_bandwidth: float       # bytes/s per chip: its share of its host's network
    full_cube: bool            # wraparound links close an axis only in slices of
                               # whole 4x4x4 cubes (True), else on an axis of 16
    mxus: int                  # matrix units a core, each mxu_side x mxu_side
    mxu_side: int
    vpu_alus: int              # vector ALUs in each of a core's 8 x 128 lanes

    @property
    def clock_hz(self) -> float:
        """The clock the peak implies: a systolic array does mxu_side^2
        multiply-adds a cycle."""
        return self.peak_flops / (self.cores_per_chip * self.mxus * self.mxu_side**2 * 2)

    @property
    def vector_flops(self) -> float:
        """Vector operations/s per chip: one per ALU, lane and cycle."""
        return VPU_LANES * self.vpu_alus * self.cores_per_chip * self.clock_hz


# Cloud TPU system-architecture pages: HBM per chip, peak bf16 FLOP/s per chip.
# Bandwidths: "How to Scale Your Model" (jax-ml/scaling-book), tpus.md. HBM and
# ICI: the tables of "Key Takeaways" (commit 0819a7d) and "TPU Specs" (54e2c43),
# the same in both: HBM v4 1.2e12, v5p 2.8e12, v5e 8.1e11, v6e 1.6e12; ICI
# one-way per link v4 4.5e10, v5p 9e10, v5e 4.5e10, v6e 9e10 (the book's
# footnote: Cloud's pages list slightly higher per-link figures, e.g. 100 GB/s
# on v5p). DCN: "DCN bandwidth is typically around 6.25e9 bytes / second per
# TPU (12.5e9 for TPU v6e and 3.125e9 for TPU v5e)" (54e2c43, "TPU Specs"),
# which is the 2.5e10 bytes/s per host of 0819a7d over v4/v5p's 4 and v5e's 8
# chips a host. Wraparound: tpus.md, "TPU Networking" (54e2c43): v4/v5p only in
# multiples of a full 4x4x4 cube ("a 2x2x4 won't have any wraparounds"),
# v5e/v6e on an axis of 16.
# The vector units' peak: Google publishes none for any TPU (nor their clock),
# so it is derived, per core, as lanes x ALUs x clock. The VPU is an (8, 128)
# array of lanes with 2 ALUs each on v4 and 4 on v5 ("in v5 you can add 4
# pairs of f32 values together from VREGs in each cycle"): the scaling book,
# tpus.md, "VPU" (0819a7d). The clock follows from the bf16 peak and the
# matrix units: MXUs a core and their side from JAX's Pallas TPU table
# (jax/_src/pallas/mosaic/tpu_info.py, jax 0.10.2: v4, v5e, v5p 4 of 128,
# v6e 2 of 256). That gives v4 1.05 GHz (4.3e12 operations/s), v5e 1.50 GHz
# (6.2e12; the book: "5e13 bf16 FLOPs/s per MXU at 1.5GHz on TPU v5e"), v5p
# 1.75 GHz (1.43e13). v6e: 3.5 GHz (1.43e13), v5's 4 ALUs assumed; if either
# is high, its vector bound is only looser.
TPUS = {
    "v4": TpuChip("v4", 3, 2, 32 * GiB, 275e12, 1.2e12, 4.5e10, 6.25e9, True, 4, 128, 2),
    "v5p": TpuChip("v5", 3, 2, 95 * GiB, 459e12, 2.8e12, 9e10, 6.25e9, True, 4, 128, 4),
    "v5e": TpuChip("v5e", 2, 1, 16 * GiB, 197e12, 8.1e11, 4.5e10, 3.125e9, False, 4, 128, 4),
    "v6e": TpuChip("v6e", 2, 1, 32 * GiB, 918e12, 1.6e12, 9e10, 12.5e9, False, 2, 256, 4),
}
VPU_LANES = 8 * 128
TORUS_AXIS = 16     # v5e/v6e: an axis this long has a wraparound link
CUBE_SIDE = 4       # v4/v5p: slices of whole cubes of this side have them on every axis


@dataclasses.dataclass(frozen=True)
class GpuSpec:

    description: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int
    memory_bandwidth: float        # bytes/s
    l2_cache_bytes: int
    clock_ghz: float
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    fp32_cores_per_sm: int
    peak_flops: float              # dense bfloat16 tensor-core FLOP/s
    nvlink_bandwidth: float        # bytes/s per GPU, one way (half the datasheet's total)
    network_bandwidth: float       # bytes/s per GPU, one way: its InfiniBand NIC

    @property
    def vector_flops(self) -> float:
        """FP32 FLOP/s of the CUDA cores (an FMA as 2): the vector peak."""
        return self.sm_count * self.fp32_cores_per_sm * 2 * self.clock_ghz * 1e9


# NVIDIA data sheets and CUDA occupancy tables (SXM parts). The A100 (the
# NVIDIA A100 Tensor Core GPU datasheet and architecture whitepaper): 108 SMs,
# compute capability 8.0, 80 GB, 40 MB L2, 1.41 GHz boost, 164 KB shared memory
# per SM (163 KB a block), 64 FP32 cores per SM, 312 TFLOP/s dense bfloat16;
# its GpuTargetConfig is `gpu_target_config(GPUS["a100"])`. Memory bandwidth:
# H100 SXM "3.35TB/s" (HBM3), H200 "4.8TB/s", A100 80GB SXM "2,039GB/s", B200
# "8TB/s". NVLink, the datasheets' totals over both directions: NVLink 4
# (H100, H200) 900 GB/s, NVLink 3 (A100) 600 GB/s, NVLink 5 (B200) 1.8 TB/s; the
# scaling book's gpus.md ("GPU egress bandwidth": H100 450e9, B200 900e9) uses
# one direction, as here. InfiniBand per GPU: the DGX systems' one NIC a GPU,
# NDR 400 Gb/s ConnectX-7 (DGX H100, H200, B200): 5e10 bytes/s, and HDR 200
# Gb/s ConnectX-6 (DGX A100): 2.5e10 (gpus.md: "8x400Gbps IB links egressing
# each node"). The vector peak (elementwise work on the CUDA cores, not the
# tensor cores): SMs x FP32 cores x 2 x boost clock, the datasheets' FP32
# figure: H100 SXM and H200 6.69e13 ("FP32 67 teraFLOPS"), A100 1.95e13
# ("FP32 19.5 TFLOPS"); B200 7.44e13 (its datasheet lists tensor-core figures
# only). Packed bfloat16 arithmetic (two a core and cycle) reaches the same
# rate in elements.
GPUS = {
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", (9, 0), 132, 84_929_347_584, 3.35232e12,
                    50 * 2**20, 1.98, 233_472, 232_448, 128, 989e12, 450e9, 50e9),
    "h200": GpuSpec("NVIDIA H200", (9, 0), 132, 150_754_820_096, 4.8e12,
                    50 * 2**20, 1.98, 233_472, 232_448, 128, 989e12, 450e9, 50e9),
    "a100": GpuSpec("NVIDIA A100-SXM4-80GB", (8, 0), 108, 85_899_345_920, 2.039e12,
                    40 * 2**20, 1.41, 167_936, 166_912, 64, 312e12, 300e9, 25e9),
    "b200": GpuSpec("NVIDIA B200", (10, 0), 148, 192_265_846_784, 8.0e12,
                    126 * 2**20, 1.965, 233_472, 232_448, 128, 2.25e15, 900e9, 50e9),
}
GPUS_PER_NODE = 8
# `jax.Device.device_kind` prefix -> the chip of TPUS or GPUS (for the peak FLOP/s of MFU).
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5p": "v5p",
                "TPU v6 lite": "v6e", "NVIDIA H100": "h100", "NVIDIA H200": "h200",
                "NVIDIA A100": "a100", "NVIDIA B200": "b200"}
# JAX's GPU allocator takes this share of a GPU's memory (75% unless the
# variable says otherwise; XLA_PYTHON_CLIENT_MEM_FRACTION is its older name):
# a step that needs more runs out of memory on the node however large the card.
MEMORY_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
DEFAULT_MEMORY_FRACTION = 0.75
CUDNN_VERSION = (9, 8)       # the cuDNN and CUDA the target configs describe
CUDA_VERSION = (12, 8)


def chip(device_kind: str) -> TpuChip | GpuSpec | None:
    """The `TPUS` or `GPUS` entry of a `jax.Device.device_kind` (None: unknown)."""
    for prefix, name in DEVICE_KINDS.items():
        if device_kind.startswith(prefix):
            return TPUS.get(name) or GPUS[name]
    return None


def peak_flops(device_kind: str) -> float | None:
    """Dense bfloat16 peak FLOP/s of one device of `device_kind` (None: unknown)."""
    spec = chip(device_kind)
    return spec.peak_flops if spec else None


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
            raise ConfigError(f"{variable}={text!r}: give a share in (0, 1], e.g. 0.9.")
        return fraction
    return DEFAULT_MEMORY_FRACTION


def tpu_grid(chips: int, dims: int) -> tuple[int, ...]:
    """The chip grid Cloud TPU gives a slice of `chips` chips: start from 1x1
    (2-D) or 2x2x1 (3-D) and double the smallest side, the last one on ties
    (v4-8: 2x2x1, v4-32: 2x2x4, v5p-128: 4x4x4, v5e-8: 2x4, v5e-256: 16x16)."""
    smallest_slice = 4 if dims == 3 else 1
    if chips < smallest_slice or chips & (chips - 1):
        raise ConfigError(f"{chips} chips: a slice by size is a power of two (3-D: 4 or "
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
            raise ConfigError(f"--num_slices is for TPUs; name the GPUs instead "
                              f"({match.group(1)}-16: two nodes).")
        return _gpu(match.group(1), int(match.group(2)))
    raise ConfigError(f"unknown accelerator {name!r}: use a TPU slice (v5e-256, v5e:16x16) "
                      f"or GPU nodes ({', '.join(GPUS)} with -8, -16, ...).")


def _tpu(name: str, num_slices: int) -> Target:
    sized = _SIZED.match(name)
    kind = (sized or _GRID.match(name)).group(1)
    chip = TPUS[kind]
    if sized:
        cores = int(sized.group(2))
        if cores % chip.cores_per_chip:
            raise ConfigError(f"{name}: {kind} counts {chip.cores_per_chip} cores a chip.")
        grid = tpu_grid(cores // chip.cores_per_chip, chip.dims)
    else:
        grid = tuple(int(g) for g in _GRID.match(name).group(2).split("x"))
        if len(grid) != chip.dims:
            raise ConfigError(f"{name}: a {kind} grid has {chip.dims} sides.")
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
        raise ConfigError(f"{kind}-{count}: use whole nodes of {GPUS_PER_NODE} GPUs.")
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
        raise ConfigError(f"{target.name}: no bandwidths are known for its chips.")
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
        raise ConfigError(f"cannot describe {name} to the {platform.upper()} compiler "
                          f"({type(e).__name__}; --debug shows its error).\nIt needs "
                          f"{install}.") from e
