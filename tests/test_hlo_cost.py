"""FLOPs and bytes of compiled programs read from their text (`hlo_cost`):
every loop counted as often as it runs, where XLA's own cost analysis counts a
loop body once; sliced and in-place operands; on-chip buffers; TPU
convolutions written with padding."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from bert_jax.planning import hlo_cost

L, N, D = 6, 8, 256      # layers, rows, width: the weights dominate the traffic


def _layers(x, w):
    return jax.lax.scan(lambda x, wl: (jnp.tanh(x @ wl), None), x, w)[0]


def _written_out(x, w):
    for layer in range(L):
        x = jnp.tanh(x @ w[layer])
    return x


def _compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def _xla_cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    return cost[0] if isinstance(cost, (list, tuple)) else cost


@pytest.fixture(scope="module")
def programs():
    x, w = jnp.ones((N, D)), jnp.ones((L, D, D))
    return {fn.__name__: _compiled(fn, x, w) for fn in (_layers, _written_out)}


def test_a_scanned_program_costs_what_the_written_out_one_does(programs):
    expected = 2.0 * L * N * D * D
    scanned = hlo_cost.program_cost(programs["_layers"].as_text())
    written = hlo_cost.program_cost(programs["_written_out"].as_text())
    assert scanned.flops == written.flops == expected
    assert list(scanned.loops.values()) == [L] and not scanned.unknown_loops
    # XLA's cost analysis counts the loop body once (why this module exists),
    # and agrees with this count where there is no loop.
    assert _xla_cost(programs["_layers"])["flops"] == pytest.approx(expected / L, rel=1e-3)
    assert written.bytes_accessed == pytest.approx(
        _xla_cost(programs["_written_out"])["bytes accessed"], rel=0.01)
    # Each layer reads its own slice of the stacked weights (which XLA:CPU
    # copies out before the matmul reads it), not all of them each time.
    stack = L * D * D * 4
    assert stack < written.bytes_accessed < scanned.bytes_accessed < L * stack


def test_a_loop_without_a_known_trip_count_counts_to_its_condition(programs):
    """libtpu writes no `known_trip_count`: the count is the constant the
    condition compares the counter against."""
    text = programs["_layers"].as_text()
    stripped = re.sub(r',?"known_trip_count":\{"n":"\d+"\}', "", text)
    assert "known_trip_count" not in stripped
    cost = hlo_cost.program_cost(stripped)
    assert list(cost.loops.values()) == [L] and cost.flops == 2.0 * L * N * D * D


def test_nested_loops_multiply():
    x, w = jnp.ones((3, N, D)), jnp.ones((L, D, D))

    def accumulated(xs, w):   # 3 micro-batches, each through L scanned layers
        return jax.lax.scan(lambda c, x: (c + _layers(x, w).sum(), None), 0.0, xs)[0]

    cost = hlo_cost.program_cost(_compiled(accumulated, x, w).as_text())
    assert sorted(cost.loops.values()) == [3, L]
    assert cost.flops == 3 * 2.0 * L * N * D * D


# Hand-written programs (a backslash continues an HLO line on the next source line).
ON_CHIP = """\
HloModule m, is_scheduled=true

%fused (p0: f32[1024,256], p1: f32[256,128]) -> f32[1024,128] {
  %p0 = f32[1024,256]{1,0:T(8,128)} parameter(0)
  %p1 = f32[256,128]{1,0:T(8,128)S(1)} parameter(1)
  ROOT %dot.1 = f32[1024,128]{1,0:T(8,128)} dot(%p0, %p1), lhs_contracting_dims={1}, \
    rhs_contracting_dims={0}
}

ENTRY %main (a: f32[1024,256], b: f32[256,128]) -> f32[1024,128] {
  %a = f32[1024,256]{1,0:T(8,128)} parameter(0)
  %b = f32[256,128]{1,0:T(8,128)S(1)} parameter(1)
  ROOT %fusion = f32[1024,128]{1,0:T(8,128)} fusion(%a, %b), kind=kOutput, calls=%fused
}
"""


def test_buffers_placed_on_chip_move_no_device_memory():
    """A layout's `S(1)` (a TPU's VMEM) is on the chip: its bytes do not
    cross the HBM bandwidth the bound divides by."""
    cost = hlo_cost.program_cost(ON_CHIP)
    assert cost.flops == 2.0 * 1024 * 256 * 128
    assert cost.bytes_accessed == 4 * (1024 * 256 + 1024 * 128)


# A scanned layer's fusion as libtpu writes it: it returns its activation and
# the stack of them updated in place (a tuple; the stack relabelled first by a
# nested fusion that aliases it, as libtpu retiles `pred` masks), and reads its
# layer's weights out of the stacked ones through a nested fusion.
LAYER_FUSION = """\
HloModule m, is_scheduled=true

%slice_layer (q0: f32[8,256,256], q1: s32[]) -> f32[256,256] {
  %q0 = f32[8,256,256]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,256,256]{2,1,0} dynamic-slice(%q0, %q1, %zero, %zero), \
    dynamic_slice_sizes={1,256,256}
  ROOT %b = f32[256,256]{1,0} bitcast(%ds)
}

%relabel (r0: f32[8,256,256]) -> f32[8,256,256] {
  %r0 = f32[8,256,256]{2,1,0} parameter(0)
  ROOT %c = f32[8,256,256]{2,1,0} copy(%r0)
}

%layer (p0: f32[8,256,256], p1: s32[], p2: f32[8,256,256], p3: f32[256,256]) \
    -> (f32[8,256,256], f32[256,256]) {
  %p0 = f32[8,256,256]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = f32[8,256,256]{2,1,0} parameter(2)
  %p3 = f32[256,256]{1,0} parameter(3)
  %w = f32[256,256]{1,0} fusion(%p2, %p1), kind=kLoop, calls=%slice_layer
  %y = f32[256,256]{1,0} add(%w, %p3)
  %u = f32[1,256,256]{2,1,0} bitcast(%y)
  %zero = s32[] constant(0)
  %stack = f32[8,256,256]{2,1,0} fusion(%p0), kind=kLoop, \
    output_to_operand_aliasing={{}: (0, {})}, calls=%relabel
  %stacked = f32[8,256,256]{2,1,0} dynamic-update-slice(%stack, %u, %p1, %zero, %zero)
  ROOT %t = (f32[8,256,256]{2,1,0}, f32[256,256]{1,0}) tuple(%stacked, %y)
}

ENTRY %main (a: f32[8,256,256], i: s32[], w: f32[8,256,256], x: f32[256,256]) \
    -> (f32[8,256,256], f32[256,256]) {
  %a = f32[8,256,256]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %w = f32[8,256,256]{2,1,0} parameter(2)
  %x = f32[256,256]{1,0} parameter(3)
  ROOT %f = (f32[8,256,256]{2,1,0}, f32[256,256]{1,0}) fusion(%a, %i, %w, %x), \
    kind=kOutput, calls=%layer
}
"""


def test_a_layer_fusion_moves_its_slices_not_the_stacks():
    """Stacked [8, 256, 256] activations updated in place beside a plain
    output, stacked weights sliced in a nested fusion: one layer's arrays move
    (written: the update and the output; read: the weights' slice, the input,
    the index), not the stacks (which would count the layers squared in a
    scanned step)."""
    layer = 256 * 256 * 4
    assert hlo_cost.program_cost(LAYER_FUSION).bytes_accessed == 4 * layer + 4


# As libtpu writes BERT's key projection [4, 64, 128] x [128, 2, 64]: the heads
# as a spatial dimension of window 2 over an input of 1, padded by 1 each side.
TPU_CONVOLUTION = """\
ENTRY %main (x: bf16[4,64,128,1], k: bf16[128,2,64,1]) -> f32[4,64,2,64] {
  %x = bf16[4,64,128,1]{2,1,3,0:T(8,128)(2,1)} parameter(0)
  %k = bf16[128,2,64,1]{0,2,1,3:T(8,128)(2,1)} parameter(1)
  ROOT %convolution.86 = f32[4,64,2,64]{3,1,2,0:T(8,128)} convolution(%x, %k), \
    window={size=1x2 pad=0_0x1_1 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}
"""


def test_a_tpu_convolution_counts_the_taps_that_meet_the_input():
    assert hlo_cost.program_cost(TPU_CONVOLUTION).flops == 2.0 * 4 * 64 * 128 * 2 * 64


# One slice's program of a two-slice step (libtpu): the cross-slice all-reduce
# is a host transfer, not a collective.
MEGASCALE = """\
HloModule jit_sum, is_scheduled=true, num_partitions=4

ENTRY %main (p: f32[1,2,128]) -> f32[1,2,128] {
  %p = f32[1,2,128]{2,1,0:T(2,128)} parameter(0)
  %after-all = token[] after-all()
  %send = (f32[1,2,128]{2,1,0:T(2,128)}, u32[], token[]) send(%p, %after-all), channel_id=2, \
    is_host_transfer=true, frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (f32[1,2,128]{2,1,0:T(2,128)}, u32[], token[]) recv(%after-all), channel_id=1, \
    is_host_transfer=true, frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}
  %send-done = token[] send-done(%send), channel_id=2, is_host_transfer=true
  %recv-done = (f32[1,2,128]{2,1,0:T(2,128)}, token[]) recv-done(%recv), channel_id=1, \
    is_host_transfer=true
  ROOT %sum = f32[1,2,128]{2,1,0:T(2,128)} get-tuple-element(%recv-done), index=0
}
"""


def test_transfers_between_tpu_slices_are_listed():
    cost = hlo_cost.program_cost(MEGASCALE)
    assert cost.devices == 4   # one slice's program
    assert cost.dcn_transfers == [{"kind": "all-reduce", "name": "send-done", "bytes": 1024,
                                   "executions": 1}]


# libtpu allocates a scan's stacked buffer with a custom-call (here in HBM, as a
# BERT step's are) that a layer's fusion then updates in place.
ALLOCATE_BUFFER = """\
HloModule m, is_scheduled=true

ENTRY %main (x: f32[1,1024,1024], i: s32[]) -> f32[8,1024,1024] {
  %x = f32[1,1024,1024]{2,1,0:T(8,128)} parameter(0)
  %i = s32[]{:T(128)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  %custom-call = f32[8,1024,1024]{2,1,0:T(8,128)} custom-call(), \
    custom_call_target="AllocateBuffer", metadata={op_name="broadcast.1"}, \
    backend_config={"flag_configs":[],"scoped_memory_configs":[],\
"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"0"}],\
"retry_config":{"retry_count":"0"},"aliasing_operands":{"lists":[]}}
  ROOT %stacked = f32[8,1024,1024]{2,1,0:T(8,128)} \
    dynamic-update-slice(%custom-call, %x, %i, %zero, %zero)
}
"""


def test_an_allocate_buffer_moves_no_bytes():
    """An `AllocateBuffer` custom-call is an allocation, not a write of its
    32 MiB: the step moves only the layer's update (read and written)."""
    cost = hlo_cost.program_cost(ALLOCATE_BUFFER)
    allocation = next(i for i in cost.instructions if i.opcode == "custom-call")
    assert allocation.bytes == 0
    assert cost.bytes_accessed == 2 * 1024 * 1024 * 4


# libtpu's asynchronous slices of a 64 MiB stack (the syntax of XLA's
# memory_space_assignment tests): one 4 MiB slice into HBM, one into VMEM.
ASYNC_SLICE = """\
HloModule m, is_scheduled=true

ENTRY %main (stack: f32[16,1024,1024]) -> (f32[1,1024,1024], f32[1,1024,1024]) {
  %stack = f32[16,1024,1024]{2,1,0:T(8,128)} parameter(0)
  %slice-start = ((f32[16,1024,1024]{2,1,0:T(8,128)}), f32[1,1024,1024]{2,1,0:T(8,128)}, \
s32[]) slice-start(%stack), slice={[4:5], [0:1024], [0:1024]}
  %slice-start.1 = ((f32[16,1024,1024]{2,1,0:T(8,128)}), \
f32[1,1024,1024]{2,1,0:T(8,128)S(1)}, s32[]) slice-start(%stack), \
    slice={[5:6], [0:1024], [0:1024]}
  %slice-done = f32[1,1024,1024]{2,1,0:T(8,128)} slice-done(%slice-start)
  %slice-done.1 = f32[1,1024,1024]{2,1,0:T(8,128)S(1)} slice-done(%slice-start.1)
  ROOT %tuple = (f32[1,1024,1024]{2,1,0:T(8,128)}, f32[1,1024,1024]{2,1,0:T(8,128)S(1)}) \
    tuple(%slice-done, %slice-done.1)
}
"""


def test_an_async_slice_moves_its_slice_not_its_source():
    """Each pair reads its 4 MiB slice out of the stack and writes it (to
    VMEM: no HBM write); the 64 MiB source is not charged."""
    cost = hlo_cost.program_cost(ASYNC_SLICE)
    slice_bytes = 1024 * 1024 * 4
    assert {i.name: i.bytes for i in cost.instructions if i.bytes} == {
        "slice-done": 2 * slice_bytes, "slice-done.1": slice_bytes}
    assert cost.bytes_accessed == 3 * slice_bytes


# Vector work: an exponential and a sum fused, then a negation.
VECTOR_WORK = """\
HloModule m, is_scheduled=true

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(%x, %y)
}

%exp_sum (p: f32[128,256]) -> f32[128] {
  %p = f32[128,256]{1,0} parameter(0)
  %e = f32[128,256]{1,0} exponential(%p)
  %t = f32[256,128]{0,1} transpose(%e), dimensions={1,0}
  %zero = f32[] constant(0)
  ROOT %r = f32[128]{0} reduce(%t, %zero), dimensions={0}, to_apply=%sum
}

ENTRY %main (a: f32[128,256]) -> f32[128] {
  %a = f32[128,256]{1,0} parameter(0)
  %f = f32[128]{0} fusion(%a), kind=kLoop, calls=%exp_sum
  ROOT %n = f32[128]{0} negate(%f)
}
"""


def test_vector_work_is_one_operation_an_element():
    """Elementwise: one per result element; a reduction: one per input
    element (its reducer not again); a transpose moves data: none."""
    cost = hlo_cost.program_cost(VECTOR_WORK)
    assert [(i.name, i.vector_ops) for i in cost.instructions if i.vector_ops] == [
        ("f", 2 * 128 * 256), ("n", 128)]
    assert cost.flops == 0


# XLA's RngBitGenerator as a TPU program keeps it (JAX's 'rbg' keys): the
# hardware generator (rng_default) inside a dropout fusion, and Philox written out.
RNG_BITS = """\
HloModule m, is_scheduled=true

%keep (s: u64[2]) -> pred[8,128] {
  %s = u64[2]{0} parameter(0)
  %g = (u64[2]{0}, u32[8,128]{1,0}) rng-bit-generator(%s), algorithm=rng_default
  %b = u32[8,128]{1,0} get-tuple-element(%g), index=1
  %c = u32[8,128]{1,0} constant({...})
  ROOT %k = pred[8,128]{1,0} compare(%b, %c), direction=LT
}

ENTRY %main (s: u64[2]) -> u32[4,256] {
  %s = u64[2]{0} parameter(0)
  %dropout = pred[8,128]{1,0} fusion(%s), kind=kLoop, calls=%keep
  %philox = (u64[2]{0}, u32[4,256]{1,0}) rng-bit-generator(%s), algorithm=rng_philox
  ROOT %bits = u32[4,256]{1,0} get-tuple-element(%philox), index=1
}
"""


def test_random_bits_cost_their_generators_operations_a_word():
    """An rng-bit-generator costs per 32-bit word of its bits (not its state):
    the TPU's generator one operation, Philox-4x32-10 its rounds' 25."""
    cost = hlo_cost.program_cost(RNG_BITS)
    vector = {i.name: i.vector_ops for i in cost.instructions if i.vector_ops}
    assert vector == {"dropout": 8 * 128 * (1 + 1),   # the bits, then the compare
                      "philox": 4 * 256 * 25}


# cuDNN's fused attention as XLA:GPU writes it (from a compiled BERT step, the
# backend config cut to the fields read): queries [batch 4, 128 positions,
# 2 heads, 64], scores [4, 2, 128, 128]; the second call causal.
CUDNN_ATTENTION = """\
HloModule m, is_scheduled=true

ENTRY %main (q: bf16[4,128,2,64], k: bf16[4,128,2,64], v: bf16[4,128,2,64], \
s: f32[4,2,128], o: bf16[4,128,2,64]) -> bf16[4,2,128,64] {
  %q = bf16[4,128,2,64]{3,2,1,0} parameter(0)
  %k = bf16[4,128,2,64]{3,2,1,0} parameter(1)
  %v = bf16[4,128,2,64]{3,2,1,0} parameter(2)
  %s = f32[4,2,128]{2,1,0} parameter(3)
  %o = bf16[4,128,2,64]{3,2,1,0} parameter(4)
  %fwd = (bf16[4,2,128,64]{3,1,2,0}, f32[4,2,128]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), \
custom_call_target="__cudnn$fmhaSoftmax", backend_config={"operation_queue_id": "0", \
"cudnn_fmha_backend_config": {"fmha_scale": 0.125, "intermediate_tensor_shape": \
{"element_type": "BF16", "dimensions": ["4", "2", "128", "128"], "tuple_shapes": []}, \
"is_flash_attention": true, "mask_type": "PADDING", "dropout_rate": 0.0}}
  %bwd = (bf16[4,2,128,64]{3,1,2,0}, bf16[4,2,128,64]{3,1,2,0}, bf16[4,2,128,64]{3,1,2,0}, \
u8[0]{0}) custom-call(%q, %k, %v, %s, %o, %o), custom_call_target="__cudnn$fmhaSoftmaxBackward", \
backend_config={"operation_queue_id": "0", "cudnn_fmha_backend_config": {"fmha_scale": 0.125, \
"intermediate_tensor_shape": {"element_type": "BF16", "dimensions": ["4", "2", "128", "128"], \
"tuple_shapes": []}, "is_flash_attention": true, "mask_type": "CAUSAL", "dropout_rate": 0.0}}
  ROOT %dq = bf16[4,2,128,64]{3,1,2,0} get-tuple-element(%bwd), index=0
}
"""


def test_cudnn_attention_flops_are_counted():
    """Forward: Q Kᵀ and P V, 2 x 2 FLOPs per score and head dimension.
    Backward: 5 matmuls (Q Kᵀ again, dP, dV, dQ, dK), 10 per score, over the
    128 x 129 / 2 scores a causal mask leaves. Nothing else in the program
    multiplies."""
    cost = hlo_cost.program_cost(CUDNN_ATTENTION)
    flops = {i.name: i.flops for i in cost.instructions if i.opcode == "custom-call"}
    batch, heads, length, head_dim = 4, 2, 128, 64
    assert flops == {"fwd": 4 * batch * heads * length * length * head_dim,
                     "bwd": 10 * batch * heads * (length * (length + 1) // 2) * head_dim}
    assert cost.flops == sum(flops.values())
