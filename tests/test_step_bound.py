"""The step-time bound (`step_bound`) on hand-made machines and collectives:
each collective costs what the scaling book's ring formulas give on the links
it crosses, and the bound is the largest of compute, memory and communication;
the per-instruction roofline on hand-written programs. No compiler runs here."""

from __future__ import annotations

import pytest

from bert_jax.planning import aot, hlo, topologies
from bert_jax.planning.hlo_cost import ProgramCost, program_cost
from bert_jax.planning.step_bound import (
    Interconnect, Machine, Place, collective_seconds, step_bound)

B = 64 * 2**20          # bytes of one collective's result per device
ICI = 4.5e10            # v5e: one ICI link, one way (scaling book, tpus.md)
DCN = 3.125e9           # v5e: one chip's share of its host's DCN
PEAK, HBM = 197e12, 8.1e11                   # v5e: bf16 FLOP/s, HBM bytes/s
VECTOR = topologies.TPUS["v5e"].vector_flops   # its vector units' operations/s


def tpu(grid=(4, 4), slices=1, wrap=(False, False, False)) -> Machine:
    """v5e-like slices of `grid` chips, device ids slice-major, x fastest."""
    torus = tuple(grid) + (1,) * (3 - len(grid))
    places = tuple(Place(s, (x, y, 0)) for s in range(slices)
                   for y in range(torus[1]) for x in range(torus[0]))
    return Machine("v5e", PEAK, HBM,
                   Interconnect("ICI", ICI, "DCN", DCN, torus, tuple(wrap)), places, VECTOR)


def gpus(nodes=1) -> Machine:
    spec = topologies.GPUS["h100"]
    return Machine("h100", spec.peak_flops, spec.memory_bandwidth,
                   Interconnect("NVLink", spec.nvlink_bandwidth, "InfiniBand",
                                spec.network_bandwidth),
                   tuple(Place(n) for n in range(nodes) for _ in range(8)))


def op(kind, groups=None, nbytes=B, **extra):
    return {"kind": kind, "bytes": nbytes, "replica_groups": groups, **extra}


def test_an_all_reduce_over_four_chips_of_one_slice_costs_two_ring_passes():
    """sharding.md: an all-gather of V bytes over N devices of a ring without a
    wraparound takes V (N-1)/N over the one-way link bandwidth; an all-reduce
    (reduce-scatter + all-gather) twice that."""
    row = [[0, 1, 2, 3]]                       # x = 0..3 at y = 0: one axis of 4
    link, seconds = collective_seconds(op("all-reduce", row), tpu())
    assert link == "ICI"
    assert seconds == pytest.approx(2 * B * 3 / 4 / ICI)
    _, gather = collective_seconds(op("all-gather", row), tpu())
    assert gather == pytest.approx(B * 3 / 4 / ICI)
    # A reduce-scatter's V is its operand: N times its result unless given.
    _, scatter = collective_seconds(op("reduce-scatter", row, nbytes=B // 4), tpu())
    assert scatter == pytest.approx(gather)
    _, given = collective_seconds(op("reduce-scatter", row, nbytes=B // 4,
                                     operand_bytes=B // 2), tpu())
    assert given == pytest.approx(gather / 2)


def test_a_wraparound_ring_and_a_second_axis_add_bandwidth():
    """A ring closed by a wraparound link runs both ways (the bidirectional
    bandwidth, twice the one-way); a group over two axes uses both."""
    closed = tpu(grid=(16, 16), wrap=(True, True, False))
    row = [list(range(16))]
    _, seconds = collective_seconds(op("all-gather", row), closed)
    assert seconds == pytest.approx(B * 15 / 16 / (2 * ICI))
    _, square = collective_seconds(op("all-gather", [[0, 1, 4, 5]]), tpu())  # 2x2 block
    assert square == pytest.approx(B * 3 / 4 / (2 * ICI))
    _, quarter = collective_seconds(op("all-to-all", row), closed)
    assert quarter == pytest.approx(seconds / 4)


def test_a_collective_across_slices_is_costed_on_dcn():
    two = tpu(grid=(2, 2), slices=2)
    link, seconds = collective_seconds(op("all-reduce", [[0, 4], [1, 5], [2, 6], [3, 7]]),
                                       two)
    assert link == "DCN"
    assert seconds == pytest.approx(2 * B * 1 / 2 / DCN)
    # Every device in one group: the slice's ring and the DCN ring overlap; the
    # DCN one, with the four chips' shares, is the slower.
    link, everyone = collective_seconds(op("all-reduce"), two)
    assert link == "DCN"
    assert everyone == pytest.approx(2 * B * 1 / 2 / (4 * DCN))


def test_gpu_collectives_use_nvlink_in_a_node_and_infiniband_across():
    """gpus.md: B (N-1)/N over the GPU's NVLink egress within a node; across
    nodes the node's network (8 NICs) at the same time, the slower counts."""
    spec = topologies.GPUS["h100"]
    link, node = collective_seconds(op("all-reduce"), gpus(1))
    assert link == "NVLink"
    assert node == pytest.approx(2 * B * 7 / 8 / spec.nvlink_bandwidth)
    link, two_nodes = collective_seconds(op("all-reduce"), gpus(2))
    assert (link, two_nodes) == ("NVLink", pytest.approx(node))   # half crosses IB: faster
    link, eight_nodes = collective_seconds(op("all-reduce"), gpus(8))
    assert link == "InfiniBand"
    assert eight_nodes == pytest.approx(2 * B * 7 / 8 / (8 * spec.network_bandwidth))
    _, a2a = collective_seconds(op("all-to-all"), gpus(1))
    assert a2a == pytest.approx(B * 7 / 8 / spec.nvlink_bandwidth / 8)
    link, permute = collective_seconds(op("collective-permute", [[0, 8]]), gpus(2))
    assert (link, permute) == ("InfiniBand", pytest.approx(B / spec.network_bandwidth))


def test_the_bound_is_the_largest_time_and_names_it():
    machine = tpu(grid=(2, 2))
    ops = [op("all-reduce", [[0, 1, 2, 3]], executions=24)]   # inside a 24-layer loop
    bound = step_bound(flops=197e12 * 0.010, bytes_accessed=8.1e11 * 0.004,
                       model_flops=197e12 * 0.008, collective_ops=ops, machine=machine)
    communication = 24 * collective_seconds(ops[0], machine)[1]
    assert bound.compute_s == pytest.approx(0.010) and bound.memory_s == pytest.approx(0.004)
    assert bound.communication_s == pytest.approx(communication)
    assert bound.bound_s == max(0.010, 0.004, communication)
    assert bound.sum_s == pytest.approx(0.014 + communication)
    assert bound.bottleneck == "communication" and communication > 0.010
    assert bound.mfu_ceiling == pytest.approx(0.008 / communication)
    assert bound.communication_by_link == {"ICI": pytest.approx(communication)}
    report = bound.to_dict()
    assert set(report["step_time_bound"]) == {"compute_s", "memory_s", "communication_s",
                                              "bound_s", "sum_s"}
    assert report["bottleneck"] == "communication"
    quiet = step_bound(flops=197e12 * 0.010, bytes_accessed=8.1e11 * 0.004,
                       model_flops=197e12 * 0.008, collective_ops=[], machine=machine)
    assert quiet.bottleneck == "compute" and quiet.mfu_ceiling == pytest.approx(0.8)


@pytest.mark.parametrize("kind, grid, closed", [
    ("v5e", (16, 16, 1), (True, True, False)), ("v5e", (4, 8, 1), (False,) * 3),
    ("v5e", (8, 16, 1), (False, True, False)), ("v5p", (4, 4, 4), (True,) * 3),
    ("v5p", (4, 4, 8), (True,) * 3), ("v4", (2, 2, 4), (False,) * 3)])
def test_wraparound_links_follow_the_scaling_book(kind, grid, closed):
    assert topologies.wraparound(topologies.TPUS[kind], grid) == closed


def test_a_slices_program_is_costed_within_its_slice_and_its_transfers_on_dcn():
    """On two slices each runs its own 4-device program: its collectives stay
    on the slice's ICI, its host transfers cross DCN (one chip per slice)."""
    two = tpu(grid=(2, 2), slices=2)
    program = ProgramCost(0.0, 0.0, {}, [], [{"kind": "all-reduce", "bytes": B,
                                              "executions": 3}], devices=4)
    step = aot.StepReport(1.0, {"total": 0}, None, {"all-reduce": {"count": 1, "bytes": B}},
                          {}, collective_ops=[op("all-reduce", [[0, 1, 2, 3]])], program=program)
    bound = aot.bound_of(step, two, model_flops_per_device=1.0)
    ici = collective_seconds(op("all-reduce", [[0, 1, 2, 3]]), two)[1]
    assert bound.communication_by_link == {"ICI": pytest.approx(ici),
                                           "DCN": pytest.approx(3 * 2 * B / 2 / DCN)}


# A matmul (2 x 2048^3 FLOPs over three 16 MiB arrays: compute-bound on v5e)
# and an add (three 16 MiB arrays, 2048^2 operations: memory-bound); between
# them, per case, a 64 MiB all-reduce over the four chips.
ARRAY = 2048 * 2048 * 4
MATMUL_S = 2 * 2048**3 / PEAK   # 87.2 us (its bytes: 3 * ARRAY / HBM = 62.1 us)
ADD_S = 3 * ARRAY / HBM         # 62.1 us (its 2048^2 operations at VECTOR: 0.7 us)
ROOFLINE = """\
HloModule m, is_scheduled=true, num_partitions=4

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.0 = f32[] add(%x, %y)
}

ENTRY %main (a: f32[2048,2048], b: f32[2048,2048], g: f32[4096,4096]) -> f32[2048,2048] {
  %a = f32[2048,2048]{1,0} parameter(0)
  %b = f32[2048,2048]{1,0} parameter(1)
  %g = f32[4096,4096]{1,0} parameter(2)
  COLLECTIVE_START
  %dot = f32[2048,2048]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  COLLECTIVE_DONE
  ROOT %add = f32[2048,2048]{1,0} add(%dot, %b)
}
"""
GROUPS = ("channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, "
          "to_apply=%sum")
SYNC = "%all-reduce = f32[4096,4096]{1,0} all-reduce(%g), " + GROUPS
START = "%all-reduce-start = f32[4096,4096]{1,0} all-reduce-start(%g), " + GROUPS
DONE = "%all-reduce-done = f32[4096,4096]{1,0} all-reduce-done(%all-reduce-start)"


def module(start: str = "", done: str = "") -> str:
    return ROOFLINE.replace("COLLECTIVE_START", start).replace("COLLECTIVE_DONE", done)


def roofline(text: str):
    cost = program_cost(text)
    return step_bound(flops=cost.flops, bytes_accessed=cost.bytes_accessed,
                      model_flops=cost.flops, collective_ops=hlo.collective_ops(text).ops,
                      machine=tpu(grid=(2, 2)), instructions=cost.instructions)


def test_the_per_instruction_roofline_sums_each_instructions_binding_limit():
    """The matmul waits for the matrix units, the add for HBM: the step takes
    at least the sum, more than the step-total bound (the larger of all
    FLOPs at the peak and all bytes at the bandwidth)."""
    bound = roofline(module())
    per_instruction = bound.roofline
    assert per_instruction.bound_s == pytest.approx(MATMUL_S + ADD_S)   # 149.3 us
    assert bound.bound_s == pytest.approx(max(MATMUL_S, 2 * ADD_S))     # 124.3 us
    assert bound.bound_s < per_instruction.bound_s
    assert per_instruction.instructions_s == per_instruction.bound_s
    assert per_instruction.by_limit_s == {"matrix": pytest.approx(MATMUL_S), "vector": 0.0,
                                          "memory": pytest.approx(ADD_S), "communication": 0.0}
    assert [(row["name"], row["limit"]) for row in per_instruction.top] == [
        ("dot", "matrix"), ("add", "memory")]
    assert per_instruction.mfu_ceiling == pytest.approx(MATMUL_S / (MATMUL_S + ADD_S))
    report = bound.to_dict()["per_instruction_bound"]
    assert report["bound_s"] == per_instruction.bound_s and report["top"][0]["name"] == "dot"


def test_communication_is_exposed_where_nothing_runs_beside_it():
    """An asynchronous all-reduce runs beside the matmul scheduled between its
    start and its done: only the rest of its link time is exposed. A
    synchronous one is exposed whole."""
    sync = module(done=SYNC)
    link = collective_seconds(hlo.collective_ops(sync).ops[0], tpu(grid=(2, 2)))[1]
    assert link > MATMUL_S and link > 2 * 4096 * 4096 * 4 / HBM   # its links bind
    exposed = roofline(sync).roofline
    assert exposed.exposed_communication_s == pytest.approx(link)
    assert exposed.bound_s == pytest.approx(MATMUL_S + ADD_S + link)
    overlapped = roofline(module(start=START, done=DONE)).roofline
    assert overlapped.exposed_communication_s == pytest.approx(link - MATMUL_S)
    assert overlapped.bound_s == pytest.approx(link + ADD_S)
