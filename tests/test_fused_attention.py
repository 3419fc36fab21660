"""The fused kernels behind `attention_impl`: structured masks, the cuDNN length
form (run on CPU through XLA with the same arguments), 'flash' per platform,
clear refusals, and splash through the models in Pallas interpret mode."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

import ml_collections

from bert_jax.config_schema import MODEL_RULES
from bert_jax.modeling import BertModel, Transformer
from bert_jax.modeling.attention import dot_product_attention
from bert_jax.modeling.fused_attention import length_masked_attention, resolve
from bert_jax.modeling.masks import (
    AttentionMask, causal_mask, combine_masks, padding_mask, segment_mask)
from bert_jax.training.sharding import make_mesh
from tiny_models import BERT, TRANSFORMER, jitted, random_variables

RNG = np.random.default_rng(0)
QUERY_VALID = jnp.array([[1] * 6, [1] * 4 + [0] * 2], bool)
KEY_VALID = jnp.array([[1] * 5 + [0] * 3, [1] * 8], bool)
SEGMENTS = jnp.array([[1, 1, 2, 2, 2, 3], [1, 1, 1, 1, 0, 0]], jnp.int32)


def qkv(lq=6, lk=6, heads=2, depth=8, dtype=jnp.float32):
    draw = lambda length: jnp.asarray(RNG.normal(size=(2, length, heads, depth)), dtype)
    return draw(lq), draw(lk), draw(lk)


@pytest.mark.slow
def test_structured_mask_is_the_dense_masks_combined():
    dense = AttentionMask(query_valid=QUERY_VALID[:, :6], key_valid=QUERY_VALID,
                          query_segments=SEGMENTS, key_segments=SEGMENTS,
                          causal=True).dense(6, 6)
    expected = combine_masks(padding_mask(QUERY_VALID, QUERY_VALID),
                             segment_mask(SEGMENTS, SEGMENTS), causal_mask(6))
    np.testing.assert_array_equal(np.asarray(dense), np.asarray(expected))
    # Keys only (BERT): every query row sees the valid keys.
    keys = AttentionMask(key_valid=KEY_VALID).dense(3, 8)
    assert keys.shape == (2, 1, 3, 8)
    np.testing.assert_array_equal(np.asarray(keys[:, 0, 2]), np.asarray(KEY_VALID))
    assert AttentionMask().dense(4, 4) is None
    np.testing.assert_array_equal(np.asarray(AttentionMask(causal=True).dense(4, 4)),
                                  np.asarray(causal_mask(4)))


@pytest.mark.slow
@pytest.mark.parametrize("name, lq, lk, mask, valid_queries", [
    ("key padding (BERT)", 6, 8, AttentionMask(key_valid=KEY_VALID), None),
    ("padding both sides (encoder)", 6, 6,
     AttentionMask(query_valid=QUERY_VALID, key_valid=QUERY_VALID), QUERY_VALID),
    ("causal and padding (decoder)", 6, 6,
     AttentionMask(query_valid=QUERY_VALID, key_valid=QUERY_VALID, causal=True),
     QUERY_VALID),
    ("cross-attention", 6, 8, AttentionMask(query_valid=QUERY_VALID, key_valid=KEY_VALID),
     QUERY_VALID),
])
def test_cudnn_length_form_equals_einsum(name, lq, lk, mask, valid_queries):
    """The arguments the cuDNN path passes (sequence lengths, is_causal), run by
    XLA on CPU, give einsum's outputs at every valid query."""
    q, k, v = qkv(lq, lk)
    scale = 1 / np.sqrt(q.shape[-1])
    lengths = length_masked_attention(q, k, v, mask, scale=scale, implementation="xla")
    einsum, _ = dot_product_attention(q, k, v, mask)
    rows = np.ones((2, lq), bool) if valid_queries is None else np.asarray(valid_queries)
    np.testing.assert_allclose(np.asarray(lengths)[rows], np.asarray(einsum)[rows],
                               atol=1e-5, rtol=1e-5, err_msg=name)


def test_cudnn_refuses_what_it_cannot_run():
    """A direct call that breaks a kernel's rule is a bug of its caller: no silent
    fallback (the config's own rules are `test_the_config_rules_of_the_kernels`)."""
    q, k, v = qkv()
    packed = AttentionMask(query_segments=SEGMENTS, key_segments=SEGMENTS)
    with pytest.raises(ValueError, match=r"config\.data\.pack_length=0"):
        length_masked_attention(q, k, v, packed, scale=1.0, implementation="xla")
    with pytest.raises(TypeError, match="AttentionMask"):
        dot_product_attention(*qkv(dtype=jnp.bfloat16), causal_mask(6), impl="cudnn")
    with pytest.raises(ValueError, match=r"attention_dropout_rate=0\.1"):
        dot_product_attention(q, k, v, impl="flash", dropout_rate=0.1,
                              deterministic=False, dropout_rng=jax.random.PRNGKey(0))


def _rule_problems(platform=None, **fields):
    """The model rules' lines for `fields` ('model.x' or 'data.x': value), with the
    mesh of a fake `platform` in context when given."""
    config = ml_collections.ConfigDict({"model": {}, "data": {}})
    for path, value in fields.items():
        section, field = path.split("__")
        config[section][field] = value
    if platform is None:
        return [line for rule in MODEL_RULES for line in rule(config)]
    mesh = AbstractMesh((2,), ("data",), axis_types=(AxisType.Auto,),
                        abstract_device=_abstract_device(platform))
    with jax.sharding.use_abstract_mesh(mesh):
        return _rule_problems(**fields)


def test_the_config_rules_of_the_kernels():
    """What a kernel cannot run is refused from the config before the model is
    built, one line each, naming the field and the fix; 'flash' is judged as the
    kernel of the platform the step compiles for."""
    (line,) = _rule_problems(model__attention_impl="cudnn", model__dtype="float32")
    assert "config.model.dtype='bfloat16'" in line and "not float32" in line
    assert _rule_problems("gpu", model__attention_impl="flash", model__dtype="float32")
    assert not _rule_problems("tpu", model__attention_impl="flash", model__dtype="float32")
    assert not _rule_problems(model__attention_impl="flash", model__dtype="float32")  # CPU
    (line,) = _rule_problems("gpu", model__attention_impl="flash", model__dtype="bfloat16",
                             data__pack_length=16)
    assert "packed segments" in line and "config.data.pack_length=0" in line
    (line,) = _rule_problems(model__attention_impl="xla", model__attention_dropout_rate=0.1)
    assert "config.model.attention_dropout_rate=0.1" in line and "'einsum'" in line
    (line,) = _rule_problems("metal", model__attention_impl="flash")
    assert "no flash kernel for platform 'metal'" in line
    (line,) = _rule_problems(model__attention_impl="fused")
    assert "renamed 'xla'" in line
    (line,) = _rule_problems(model__attention_impl="sdpa")
    assert "'sdpa': unknown" in line
    (line,) = _rule_problems(model__attention_impl="splash", data__max_seq_length=128,
                             data__length_buckets=(128, 200))
    assert "multiples of 128 (config.data.length_buckets=(128, 200))" in line
    assert _rule_problems("tpu", model__attention_impl="flash", data__max_length=100)
    assert not _rule_problems(model__attention_impl="einsum", model__attention_dropout_rate=0.1,
                              data__max_length=100)


@pytest.mark.parametrize("platform, kernel", [("cpu", "xla"), ("tpu", "splash"),
                                              ("gpu", "cudnn")])
def test_flash_is_the_kernel_of_the_mesh_platform(platform, kernel):
    """'flash' follows the platform of the mesh in context (what the step is
    compiled for), not the machine the code runs on."""
    mesh = AbstractMesh((2,), ("data",), axis_types=(AxisType.Auto,),
                        abstract_device=_abstract_device(platform))
    with jax.sharding.use_abstract_mesh(mesh):
        assert resolve("flash") == kernel
        assert resolve("einsum") == "einsum"
    assert resolve("flash") == "xla"  # no mesh: this CPU


def _abstract_device(platform):
    from jax._src.mesh import AbstractDevice
    return AbstractDevice(device_kind=f"fake {platform}", num_cores=None,
                          platform=platform)


# ----------------------------------------------------------------------------
# Splash through the models, in Pallas interpret mode (lengths of 128).


@pytest.mark.slow
def test_bert_splash_equals_einsum_on_a_mesh():
    config = dataclasses.replace(BERT, max_len=128)
    ids = jnp.asarray(RNG.integers(3, 50, size=(4, 128)), jnp.int32)
    attention_mask = jnp.ones((4, 128), jnp.int32).at[1, 90:].set(0).at[3, 7:].set(0)
    variables = random_variables(BertModel(config), ids, attention_mask)
    einsum = jitted(BertModel(config))(variables, ids, attention_mask)
    with jax.set_mesh(make_mesh((2, 1, 2), jax.devices()[:4])):
        splash = jitted(BertModel(config.replace(attention_impl="splash")))(
            variables, ids, attention_mask)
    np.testing.assert_allclose(np.asarray(splash.sequence_output),
                               np.asarray(einsum.sequence_output), atol=2e-5, rtol=0)


@pytest.mark.slow
def test_packed_transformer_splash_equals_einsum():
    """Packed rows (segments restart positions; padding at the end): the
    encoder, causal decoder and cross-attention masks all go through splash."""
    config = dataclasses.replace(TRANSFORMER, max_len=128)
    lengths = [(40, 30), (50, 60), (20, 25)]   # (source, target) pairs in one row
    batch = {k: np.zeros((2, 128), np.int32) for k in (
        "inputs", "targets", "inputs_segmentation", "targets_segmentation",
        "inputs_positions", "targets_positions")}
    for row in range(2):
        starts = {"inputs": 0, "targets": 0}
        for segment, pair in enumerate(lengths[row:], start=1):
            for key, n in zip(("inputs", "targets"), pair):
                at = slice(starts[key], starts[key] + n)
                batch[key][row, at] = RNG.integers(3, 50, size=n)
                batch[f"{key}_segmentation"][row, at] = segment
                batch[f"{key}_positions"][row, at] = np.arange(n)
                starts[key] += n
    args = (batch["inputs"], batch["targets"], batch["inputs_segmentation"],
            batch["targets_segmentation"], batch["inputs_positions"],
            batch["targets_positions"])
    variables = random_variables(Transformer(config), *args)
    einsum = jitted(Transformer(config))(variables, *args)
    with jax.set_mesh(make_mesh((2, 1, 1), jax.devices()[:2])):
        splash = jitted(Transformer(config.replace(attention_impl="splash")))(
            variables, *args)
    real = np.asarray(batch["targets"]) != 0
    np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(einsum)[real],
                               atol=2e-5, rtol=1e-5)


def test_splash_refuses_lengths_it_cannot_tile():
    ids = jnp.ones((2, 12), jnp.int32)
    model = BertModel(BERT.replace(attention_impl="splash"))
    variables = random_variables(BertModel(BERT), ids)
    with jax.set_mesh(make_mesh((2, 1, 1), jax.devices()[:2])):
        with pytest.raises(ValueError, match="q_len=12"):
            jax.eval_shape(model.apply, variables, ids)
