"""The HLO-text reader of `bert_jax.planning.hlo` on small hand-written
programs: loops' trip counts (XLA's `known_trip_count`, libtpu's condition
constants), collectives as written and as executed, replica groups."""

import pytest

from bert_jax.planning import hlo

# A micro-batch loop (4) around a layer loop (3), as libtpu prints them: no
# known_trip_count; the counter starts at a copied constant 0. The layer body
# all-reduces through a called computation; one all-reduce follows the loops.
NESTED = """HloModule jit_step, is_scheduled=true, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%reduce_layer (p: f32[2,8]) -> f32[2,8] {
  %p = f32[2,8]{1,0:T(2,128)} parameter(0)
  ROOT %all-reduce.1 = f32[2,8]{1,0:T(2,128)} all-reduce(%p), channel_id=1,\
    replica_groups=[1,4]<=[4], use_global_device_ids=true, to_apply=%add
}

%layer_body (state: (s32[], f32[2,8])) -> (s32[], f32[2,8]) {
  %state = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%state), index=0
  %g = f32[2,8]{1,0:T(2,128)} get-tuple-element(%state), index=1
  %reduced = f32[2,8]{1,0:T(2,128)} call(%g), to_apply=%reduce_layer
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%i, %one)
  ROOT %tuple.1 = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) tuple(%next, %reduced)
}

%layer_condition (state.1: (s32[], f32[2,8])) -> pred[] {
  %three = s32[]{:T(128)} constant(3)
  %state.1 = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) parameter(0)
  %i.1 = s32[]{:T(128)} get-tuple-element(%state.1), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i.1, %three), direction=LT,\
    metadata={op_name="jit(step)/while/cond/lt"}
}

%micro_body (carry: (s32[], f32[2,8])) -> (s32[], f32[2,8]) {
  %carry = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) parameter(0)
  %j = s32[]{:T(128)} get-tuple-element(%carry), index=0
  %acc = f32[2,8]{1,0:T(2,128)} get-tuple-element(%carry), index=1
  %zero = s32[]{:T(128)} constant(0)
  %start = s32[]{:T(128)} copy(%zero)
  %layers_in = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) tuple(%start, %acc)
  %layers = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) while(%layers_in),\
    condition=%layer_condition, body=%layer_body, backend_config={"flag_configs":[]}
  %out = f32[2,8]{1,0:T(2,128)} get-tuple-element(%layers), index=1
  %one.1 = s32[]{:T(128)} constant(1)
  %j.next = s32[]{:T(128)} add(%j, %one.1)
  ROOT %tuple.2 = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) tuple(%j.next, %out)
}

%micro_condition (carry.1: (s32[], f32[2,8])) -> pred[] {
  %four = s32[]{:T(128)} constant(4)
  %carry.1 = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) parameter(0)
  %j.1 = s32[]{:T(128)} get-tuple-element(%carry.1), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%j.1, %four), direction=LT
}

ENTRY %main (grads: f32[2,8]) -> (f32[2,8], f32[]) {
  %grads = f32[2,8]{1,0:T(2,128)} parameter(0)
  %zero.1 = s32[]{:T(128)} constant(0)
  %copy.1 = s32[]{:T(128)} copy(%zero.1)
  %init = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) tuple(%copy.1, %grads)
  %micro = (s32[]{:T(128)}, f32[2,8]{1,0:T(2,128)}) while(%init), condition=%micro_condition,\
    body=%micro_body
  %summed = f32[2,8]{1,0:T(2,128)} get-tuple-element(%micro), index=1
  %loss = f32[]{:T(128)} constant(1)
  ROOT %metrics = (f32[2,8]{1,0:T(2,128)}, f32[]{:T(128)}) all-reduce(%summed, %loss),\
    channel_id=2, replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'},\
    use_global_device_ids=true, to_apply=%add
}
"""

# XLA's CPU/GPU form: the trip count in the while's backend_config (the
# condition compares with 7, which known_trip_count overrides); an
# asynchronous all-gather in the body; a loop counting from 2 while i <= 5.
KNOWN = """HloModule jit_f, num_partitions=8

%body (s: (s32[], f32[4])) -> (s32[], f32[4]) {
  %s = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = f32[4]{0} get-tuple-element(%s), index=1
  %ags = (f32[4]{0}, f32[16]{0}) all-gather-start(%x), channel_id=3,\
    replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %agd = f32[16]{0} all-gather-done(%ags)
  %y = f32[4]{0} slice(%agd), slice={[0:4]}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %y)
}

%cond (s.1: (s32[], f32[4])) -> pred[] {
  %s.1 = (s32[], f32[4]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%s.1), index=0
  %seven = s32[] constant(7)
  ROOT %lt = pred[] compare(%i.1, %seven), direction=LT
}

%body.2 (s.2: (s32[], f32[4])) -> (s32[], f32[4]) {
  %s.2 = (s32[], f32[4]{0}) parameter(0)
  %x.2 = f32[4]{0} get-tuple-element(%s.2), index=1
  %i.2 = s32[] get-tuple-element(%s.2), index=0
  %rs = f32[1]{0} reduce-scatter(%x.2), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}},\
    dimensions={0}, to_apply=%add
  ROOT %t.2 = (s32[], f32[4]{0}) tuple(%i.2, %x.2)
}

%cond.2 (s.3: (s32[], f32[4])) -> pred[] {
  %five = s32[] constant(5)
  %s.3 = (s32[], f32[4]{0}) parameter(0)
  %i.3 = s32[] get-tuple-element(%s.3), index=0
  ROOT %le = pred[] compare(%i.3, %five), direction=LE
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (x.1: f32[4]) -> (s32[], f32[4]) {
  %x.1 = f32[4]{0} parameter(0)
  %c = s32[] constant(0)
  %tuple = (s32[], f32[4]{0}) tuple(%c, %x.1)
  %w = (s32[], f32[4]{0}) while(%tuple), condition=%cond, body=%body,\
    backend_config={"known_trip_count":{"n":"5"}}
  %two = s32[] constant(2)
  %tuple.2 = (s32[], f32[4]{0}) tuple(%two, %x.1)
  ROOT %w.2 = (s32[], f32[4]{0}) while(%tuple.2), condition=%cond.2, body=%body.2
}
"""


def _ops(text):
    return {op["name"]: op for op in hlo.collective_ops(text).ops}


def test_nested_loops_multiply_without_known_trip_counts():
    found = hlo.collective_ops(NESTED)
    ops = {op["name"]: op for op in found.ops}
    assert ops["all-reduce.1"]["executions"] == 4 * 3
    assert ops["metrics"]["executions"] == 1
    assert found.unknown_loops == []
    assert found.as_written == {"all-reduce": {"count": 2, "bytes": 64 + 68}}
    assert found.executed == {"all-reduce": {"count": 13, "bytes": 12 * 64 + 68}}
    assert ops["all-reduce.1"]["replica_groups"] == [[0, 1, 2, 3]]
    assert ops["metrics"]["group_size"] == 4


def test_known_trip_count_async_pairs_and_a_loop_from_two():
    found = hlo.collective_ops(KNOWN)
    ops = {op["name"]: op for op in found.ops}
    assert set(ops) == {"agd", "rs"}   # the -start/-done pair is one op
    gather = ops["agd"]
    assert gather["kind"] == "all-gather" and gather["executions"] == 5
    assert gather["bytes"] == 64 and gather["operand_bytes"] == 16
    assert gather["replica_groups"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    scatter = ops["rs"]   # i = 2, 3, 4, 5
    assert scatter["executions"] == 4 and scatter["bytes"] == 4
    assert scatter["operand_bytes"] == 16 and scatter["group_size"] == 4
    assert found.executed["reduce-scatter"] == {"count": 4, "bytes": 16}


def test_an_unreadable_loop_counts_once_and_is_named():
    text = NESTED.replace("ROOT %lt.1 = pred[]{:T(512)} compare(%j.1, %four), direction=LT",
                          "ROOT %lt.1 = pred[]{:T(512)} custom-call(%j.1), "
                          'custom_call_target="opaque"')
    found = hlo.collective_ops(text)
    assert found.unknown_loops == ["micro"]
    assert {op["name"]: op["executions"] for op in found.ops}["all-reduce.1"] == 3


@pytest.mark.parametrize("text, groups", [
    ("replica_groups={{0,2},{1,3}}", [[0, 2], [1, 3]]),
    ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[2,4]<=[4,2]T(1,0)", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("replica_groups=[4,2]<=[2,2,2]T(2,1,0)", [[0, 4], [2, 6], [1, 5], [3, 7]]),
    ("replica_groups=mesh['data'=2,'tensor'=4] {'tensor'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=mesh['data'=2,'tensor'=4] {'data'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {'b','a'}", [[0, 4, 1, 5, 2, 6, 3, 7]]),
    # A sub-axis `(pre)size`: `size` devices after a major part of `pre`.
    ("replica_groups=mesh['a'=8] {'a':(2)2}", [[0, 2], [1, 3], [4, 6], [5, 7]]),
    ("replica_groups=mesh['a'=8] {'a':(1)2,'a':(4)2}", [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ("replica_groups=mesh['a'=2,'b'=2], device_ids=([3,1,2,0]) {'b'}", [[3, 1], [2, 0]]),
    ("source_target_pairs={{0,1},{1,2},{2,3}}", [[0, 1], [1, 2], [2, 3]]),
])
def test_replica_groups_are_expanded_to_device_ids(text, groups):
    assert hlo.replica_groups(f"%x = f32[4] all-reduce(%y), {text}, to_apply=%add") == groups


def test_empty_groups_are_all_the_devices():
    text = KNOWN.replace("replica_groups={{0,1,2,3},{4,5,6,7}}", "replica_groups={}")
    scatter = _ops(text)["rs"]
    assert scatter["replica_groups"] == [list(range(8))] and scatter["group_size"] == 8
