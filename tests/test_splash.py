"""Splash attention: Pallas interpret mode vs an einsum reference, and TPU AOT compiles.

The CPU tests run the kernel in the Pallas interpreter on a fake-CPU-device mesh
(the kernel needs lengths that are multiples of 128, hence length 128/256). The
TPU tests compile ahead of time for a `v5e:2x2` topology with libtpu, which needs
no TPU to be present.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax.modeling.splash import splash_attention

AXES = ("data", "fsdp", "tensor")
HEAD_DIM = 64  # BERT-base; the kernel accepts it as is.
SCALE = 1 / math.sqrt(HEAD_DIM)
TOL = dict(rtol=1e-5, atol=1e-5)


def cpu_mesh(shape=(2, 1, 1), axes=AXES) -> Mesh:
    """A mesh of fake CPU devices (tests/conftest.py provides 8)."""
    return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes))


def random_qkv(seed, *, batch=2, q_len=128, kv_len=128, heads=2, head_dim=HEAD_DIM):
    """float32 q `[batch, q_len, heads, head_dim]`, k/v `[batch, kv_len, heads, ...]`."""
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (batch, q_len, heads, head_dim)),
        jax.random.normal(kk, (batch, kv_len, heads, head_dim)),
        jax.random.normal(kv, (batch, kv_len, heads, head_dim)),
    )


def padding_segments(lengths, max_len) -> jax.Array:
    """Right padding: `[batch, max_len]` int32, 1 on the first `lengths[b]` tokens."""
    return (np.arange(max_len)[None] < np.asarray(lengths)[:, None]).astype(np.int32)


def packed_segments(rows, max_len) -> jax.Array:
    """Packed rows: `rows[b]` lists sequence lengths, ids 1, 2, ..., then 0 padding."""
    out = np.zeros((len(rows), max_len), np.int32)
    for b, lengths in enumerate(rows):
        out[b, : sum(lengths)] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
    return out


def reference(q, k, v, q_segments, k_segments, *, causal, scale):
    """softmax(scale · Q Kᵀ) V with a boolean mask, in plain jnp (float32)."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * scale
    mask = q_segments[:, :, None] == k_segments[:, None, :]
    if causal:
        mask &= np.tril(np.ones((q.shape[1], k.shape[1]), bool))
    scores = jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v, precision="highest")


@functools.partial(jax.jit, static_argnames=("causal", "mesh"))
def splash(q, k, v, q_segments, k_segments, *, causal, mesh):
    """`splash_attention` in interpret mode with the BERT scale 1/√64 (jitted)."""
    return splash_attention(
        q, k, v,
        query_segments=q_segments, key_segments=k_segments,
        causal=causal, scale=SCALE, mesh=mesh, interpret=True,
    )


def assert_matches_reference(q, k, v, q_segments, k_segments, *, causal, mesh):
    """Outputs agree at the query positions with a nonzero segment id."""
    got = splash(q, k, v, q_segments, k_segments, causal=causal, mesh=mesh)
    want = reference(q, k, v, q_segments, k_segments, causal=causal, scale=SCALE)
    assert got.shape == want.shape and got.dtype == q.dtype
    valid = np.asarray(q_segments) != 0
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], **TOL)


# ----------------------------------------------------------------------------
# Interpret mode (CPU) vs the reference.


@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh_shape, axes, heads",
    [
        ((2, 1, 1), AXES, 2),  # batch over "data"
        ((1, 1, 2), AXES, 2),  # heads over "tensor"
        ((2, 1, 2), AXES, 3),  # 3 heads do not split over 2: replicated
        ((2, 1, 1, 2), ("dcn",) + AXES, 2),  # an extra leading batch axis
    ],
)
def test_key_padding(mesh_shape, axes, heads):
    q, k, v = random_qkv(0, heads=heads)
    segments = padding_segments([128, 37], 128)
    assert_matches_reference(
        q, k, v, segments, segments, causal=False, mesh=cpu_mesh(mesh_shape, axes)
    )


@pytest.mark.slow
def test_inside_a_shard_map_over_the_whole_mesh():
    """The train step's accumulation over data-parallel devices runs the model
    under `jax.shard_map` manual over every mesh axis: the kernel then runs on
    each device's own rows, without a shard_map of its own."""
    q, k, v = random_qkv(3)
    segments = padding_segments([128, 37], 128)

    def local(q, k, v, segments):
        return splash_attention(q, k, v, query_segments=segments, key_segments=segments,
                                scale=SCALE, mesh=jax.sharding.get_abstract_mesh(),
                                interpret=True)

    spec = P(("data", "fsdp"))
    with jax.set_mesh(cpu_mesh()):
        got = jax.jit(jax.shard_map(local, in_specs=(spec,) * 4, out_specs=spec,
                                    check_vma=False))(q, k, v, segments)
    want = reference(q, k, v, segments, segments, causal=False, scale=SCALE)
    valid = segments != 0
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], **TOL)


@pytest.mark.slow
def test_causal_with_padding():
    q, k, v = random_qkv(1)
    segments = padding_segments([100, 128], 128)
    assert_matches_reference(q, k, v, segments, segments, causal=True, mesh=cpu_mesh())


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_packed_segments(causal):
    q, k, v = random_qkv(2)
    segments = packed_segments([[50, 40, 30], [70, 58]], 128)
    assert_matches_reference(q, k, v, segments, segments, causal=causal, mesh=cpu_mesh())


@pytest.mark.slow
def test_cross_attention():
    q, k, v = random_qkv(3, q_len=128, kv_len=256)
    q_segments = padding_segments([128, 90], 128)
    k_segments = padding_segments([200, 256], 256)
    assert_matches_reference(q, k, v, q_segments, k_segments, causal=False, mesh=cpu_mesh())


@pytest.mark.slow
def test_bfloat16():
    """bfloat16 in and out; compared with the float32 reference on the same inputs."""
    q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(8))
    segments = padding_segments([128, 60], 128)
    got = splash(q, k, v, segments, segments, causal=True, mesh=cpu_mesh())
    assert got.dtype == jnp.bfloat16
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    want = reference(q, k, v, segments, segments, causal=True, scale=SCALE)
    valid = segments != 0
    np.testing.assert_allclose(
        np.asarray(got, np.float32)[valid], np.asarray(want)[valid], rtol=0, atol=2e-2
    )


@pytest.mark.slow
def test_no_segments():
    q, k, v = random_qkv(4)
    got = splash(q, k, v, None, None, causal=True, mesh=cpu_mesh())
    ones = np.ones(q.shape[:2], np.int32)
    want = reference(q, k, v, ones, ones, causal=True, scale=SCALE)
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize(
    "q_len, kv_len, causal, q_rows, k_rows",
    [
        (128, 128, True, [[50, 40, 30], [70, 58]], None),  # causal + packed
        (128, 256, False, [[128], [90]], [[200], [256]]),  # cross-attention + padding
    ],
)
def test_gradients(q_len, kv_len, causal, q_rows, k_rows):
    """d/d(q, k, v) of a weighted sum over the valid query positions."""
    q, k, v = random_qkv(5, q_len=q_len, kv_len=kv_len)
    q_segments = packed_segments(q_rows, q_len)
    k_segments = q_segments if k_rows is None else packed_segments(k_rows, kv_len)
    cotangent = jax.random.normal(jax.random.key(6), q.shape)
    cotangent *= (q_segments != 0)[:, :, None, None]
    mesh = cpu_mesh()

    def grads(attention):
        def loss(*qkv):
            return jnp.sum(attention(*qkv, q_segments, k_segments) * cotangent)

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    got = grads(functools.partial(splash, causal=causal, mesh=mesh))
    want = grads(functools.partial(reference, causal=causal, scale=SCALE))
    for name, g, w in zip("qkv", got, want):
        np.testing.assert_allclose(g, w, **TOL, err_msg=f"d{name}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "q_len, kv_len, kwargs, message",
    [
        (96, 96, {}, "q_len=96"),
        (128, 256, {"causal": True}, "causal"),
        (128, 128, {"query_segments": np.ones((2, 128), np.int32)}, "key_segments"),
    ],
)
def test_invalid_arguments(q_len, kv_len, kwargs, message):
    q, k, v = random_qkv(7, q_len=q_len, kv_len=kv_len)
    with pytest.raises(ValueError, match=message):
        splash_attention(q, k, v, scale=1.0, mesh=cpu_mesh(), **kwargs)


# ----------------------------------------------------------------------------
# Ahead-of-time compilation for a TPU topology (libtpu, no TPU needed).

KERNEL_MARKER = 'custom_call_target="tpu_custom_call"'
KERNEL_NAMES = ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv")


@pytest.fixture(scope="module")
def tpu_devices():
    """The 4 devices of a `v5e:2x2` topology description (created lazily)."""
    pytest.importorskip("libtpu", reason="libtpu is needed for TPU AOT compilation")
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
    except Exception as error:  # noqa: BLE001 - any libtpu start-up failure
        pytest.skip(f"no TPU topology description from libtpu: {error}")
    return np.array(topology.devices)


def compile_forward_backward(mesh, shape, dtype, *, causal, segments):
    """AOT-compiles d/d(q, k, v) of sum(splash_attention) -> HLO text."""
    batch, length, _, head_dim = shape
    batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
    qkv = jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
    segment_ids = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=batch_sharding)

    def loss(q, k, v, segment_ids=None):
        out = splash_attention(
            q, k, v, query_segments=segment_ids, key_segments=segment_ids,
            causal=causal, scale=1 / math.sqrt(head_dim), mesh=mesh,
        )
        return out.astype(jnp.float32).sum()

    args = (qkv, qkv, qkv) + ((segment_ids,) if segments else ())
    step = jax.grad(loss, argnums=(0, 1, 2))
    return jax.jit(step).lower(*args).compile().as_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh_shape, heads, head_dim, dtype, causal, segments, local_shape",
    [
        ((4, 1, 1), 4, 64, jnp.bfloat16, True, True, (2, 4)),  # data parallel
        ((1, 1, 4), 4, 128, jnp.bfloat16, True, True, (8, 1)),  # heads over "tensor"
        ((2, 1, 2), 4, 64, jnp.float32, False, True, (4, 2)),  # both
        ((2, 1, 2), 3, 64, jnp.bfloat16, False, False, (4, 3)),  # heads replicated
    ],
)
def test_tpu_aot_compile(
    tpu_devices, mesh_shape, heads, head_dim, dtype, causal, segments, local_shape
):
    mesh = Mesh(tpu_devices.reshape(mesh_shape), AXES, axis_types=(AxisType.Auto,) * 3)
    hlo = compile_forward_backward(
        mesh, (8, 256, heads, head_dim), dtype, causal=causal, segments=segments
    )
    kernel_lines = [line for line in hlo.splitlines() if KERNEL_MARKER in line]
    assert len(kernel_lines) == 3, "one Mosaic call each for fwd, dq and dkv"
    for name in KERNEL_NAMES:
        assert any(name in line for line in kernel_lines), name
    assert all(("_segmented" in line) == segments for line in kernel_lines)
    # The per-device kernel sees [local_batch, local_heads, length, head_dim].
    local = f"[{local_shape[0]},{local_shape[1]},256,{head_dim}]"
    assert any(local in line for line in kernel_lines), local
