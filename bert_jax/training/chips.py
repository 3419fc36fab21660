"""The chip table: the figures of the TPU chips and GPUs the project knows
(memory, peak bfloat16 FLOP/s, memory and link bandwidths, vector units), each
cited where it is set.

The trainer reads one figure, the peak FLOP/s of the local devices for MFU
(`metrics.peak_flops_per_device` via `peak_flops(device_kind)`); accelerator
planning (`bert_jax.planning.topologies`) builds slices and nodes from the
whole table.
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30
VPU_LANES = 8 * 128


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
# `jax.Device.device_kind` prefix -> the chip of TPUS or GPUS (for the peak FLOP/s of MFU).
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5p": "v5p",
                "TPU v6 lite": "v6e", "NVIDIA H100": "h100", "NVIDIA H200": "h200",
                "NVIDIA A100": "a100", "NVIDIA B200": "b200"}


def chip(device_kind: str) -> TpuChip | GpuSpec | None:
    """The `TPUS` or `GPUS` entry of a `jax.Device.device_kind` (None: unknown)."""
    return next((TPUS.get(name) or GPUS[name] for prefix, name in DEVICE_KINDS.items()
                 if device_kind.startswith(prefix)), None)


def peak_flops(device_kind: str) -> float | None:
    """Dense bfloat16 peak FLOP/s of one device of `device_kind` (None: unknown)."""
    spec = chip(device_kind)
    return spec.peak_flops if spec else None
