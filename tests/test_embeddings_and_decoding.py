"""Position tables, incremental decoding, residual wiring, heads and metadata."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from bert_jax.modeling import BertForPreTraining, BertModel, Transformer
from bert_jax.modeling.attention import MultiHeadAttention
from bert_jax.modeling.embeddings import (
    PositionEmbedding, sinusoidal_table, tile_learned_positions)
from bert_jax.modeling.layers import EncoderStack, FeedForward
from bert_jax.modeling.transformer import shift_right

from tiny_models import BERT, TRANSFORMER, random_variables, jitted


AXIS_NAMES = {"vocab", "type_vocab", "position", "embed", "mlp", "heads", "kv",
              "classes"}


def np_layer_norm(x, params, eps):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * np.asarray(params["scale"])
            + np.asarray(params["bias"]))


def np_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def np_relu(x):
    return np.maximum(x, 0.0)


NP_ACTIVATIONS = {"gelu": np_gelu, "gelu_tanh": np_gelu_tanh, "relu": np_relu}


def np_feed_forward(x, params, activation):
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    h = np.asarray(x, np.float64) @ p["intermediate"]["kernel"] + p["intermediate"]["bias"]
    return NP_ACTIVATIONS[activation](h) @ p["output"]["kernel"] + p["output"]["bias"]


# ----------------------------------------------------------------------------
# Sinusoidal position table (Vaswani et al. 2017, section 3.5).


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_table_matches_paper_formula(d_model):
    max_len = 50
    table = sinusoidal_table(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == np.float32
    for pos in (0, 1, 2, 9, 49):
        for dim in range(d_model):
            i = dim // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
            assert table[pos, dim] == pytest.approx(expected, abs=1e-6), (pos, dim)
    assert np.all(np.abs(table) <= 1.0)
    np.testing.assert_array_equal(table[0], [0.0 if d % 2 == 0 else 1.0
                                             for d in range(d_model)])
    # The first pair has wavelength 2π, so position 1 gives sin(1), cos(1).
    np.testing.assert_allclose(table[1, :2], [math.sin(1.0), math.cos(1.0)], atol=1e-7)


def test_sinusoidal_position_embedding_uses_the_table():
    cfg = TRANSFORMER
    module = PositionEmbedding(cfg, "sinusoidal")
    positions = jnp.array([[0, 1, 2, 3], [5, 15, 0, 7]])
    variables = module.init(jax.random.PRNGKey(0), positions)
    assert not variables.get("params")  # the table is fixed: no parameters
    out = module.apply(variables, positions)
    table = sinusoidal_table(cfg.max_len, cfg.hidden_size)
    np.testing.assert_array_equal(np.asarray(out), table[np.asarray(positions)])


def test_tiling_copies_the_trained_position_rows():
    """A BERT's position table after a phase at sequence 5: rows 5.. become
    rows 0-4 repeated; every other parameter is untouched."""
    ids = jnp.ones((1, 4), jnp.int32)
    params = random_variables(BertModel(BERT), ids)["params"]
    tiled, count = tile_learned_positions(params, 5)
    table = np.asarray(params["embeddings"]["position_embeddings"]["embedding"])
    new = np.asarray(tiled["embeddings"]["position_embeddings"]["embedding"])
    assert count == 1 and new.shape == table.shape and table.shape[0] > 10
    np.testing.assert_array_equal(new, np.tile(table[:5], (-(-len(table) // 5), 1))[:len(table)])
    np.testing.assert_array_equal(tiled["embeddings"]["word_embeddings"]["embedding"],
                                  params["embeddings"]["word_embeddings"]["embedding"])
    assert tile_learned_positions(params, len(table))[1] == 0  # nothing left to fill


# ----------------------------------------------------------------------------
# Incremental decoding with the key/value cache.


@pytest.fixture(scope="module")
def translation_batch():
    rng = np.random.default_rng(3)
    src = rng.integers(3, 50, size=(2, 10))
    src[1, 7:] = TRANSFORMER.pad_id
    tgt = rng.integers(3, 50, size=(2, 9))
    tgt[:, -1] = TRANSFORMER.eos_id
    return jnp.asarray(src, jnp.int32), jnp.asarray(tgt, jnp.int32)


def _decode_both_ways(cfg, variables, src, tgt):
    """Teacher-forced logits, and logits from feeding the decoder one token at a
    time through the key/value cache, as the module docstring describes:

        cache = model.init(rng, inputs, full_length_targets)["cache"]
        encoded = model.apply(params, inputs, method=model.encode)
        logits, vars = model.apply({"params": p, "cache": cache}, encoded, inputs,
                                   token[:, None], method=model.decode,
                                   mutable=["cache"])

    The step at position i is fed [bos, targets[:-1]][i]. Everything runs in
    one jitted function (the steps in a `lax.scan`), compiled once."""
    model = Transformer(cfg)
    incremental = Transformer(cfg, incremental=True)

    @jax.jit
    def run(variables, src, tgt):
        full = model.apply(variables, src, tgt)
        cache = incremental.init(jax.random.PRNGKey(0), src, tgt)["cache"]
        encoded = incremental.apply(variables, src, method=incremental.encode)
        decoder_inputs = jnp.concatenate(
            [jnp.full((tgt.shape[0], 1), cfg.bos_id, tgt.dtype), tgt[:, :-1]], axis=1)

        def step(cache, token):
            logits, state = incremental.apply(
                {"params": variables["params"], "cache": cache}, encoded, src,
                token[:, None], method=incremental.decode, mutable=["cache"])
            return state["cache"], logits[:, 0]

        cache, logits = jax.lax.scan(step, cache, decoder_inputs.T)
        return full, jnp.swapaxes(logits, 0, 1), cache

    return run(variables, src, tgt)


@pytest.mark.slow
@pytest.mark.parametrize("position, norm_position, num_layers", [
    ("sinusoidal", "post", 2),
    ("learned", "post", 1),
    ("sinusoidal", "pre", 1),
    ("learned", "pre", 2),
])
def test_incremental_decoding_matches_teacher_forcing(translation_batch, position,
                                                      norm_position, num_layers):
    src, tgt = translation_batch
    cfg = TRANSFORMER.replace(position=position, norm_position=norm_position,
                              num_layers=num_layers)
    variables = random_variables(Transformer(cfg), src, tgt, seed=4)
    full, incremental, cache = _decode_both_ways(cfg, variables, src, tgt)
    assert incremental.shape == full.shape == (2, 9, cfg.vocab_size)
    assert incremental.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(incremental), np.asarray(full), rtol=0,
                               atol=1e-5)
    # Position counter and every layer's cache advanced by one per step.
    assert int(cache["target_positions"]["index"]) == tgt.shape[1]
    for layer in range(num_layers):
        attention_cache = cache["decoder"][f"layer_{layer}"]["self_attention"]
        assert int(attention_cache["cache_index"]) == tgt.shape[1]
        assert attention_cache["cached_key"].shape == (2, 9, cfg.num_heads,
                                                       cfg.head_dim)
    # Sanity: the logits depend on the earlier tokens, so the cache matters.
    assert np.abs(np.asarray(full[0, 1:] - full[1, 1:])).max() > 1e-2


@pytest.mark.slow
def test_decoding_misuse_fails_loudly(translation_batch):
    src, tgt = translation_batch
    incremental = Transformer(TRANSFORMER, incremental=True)
    variables = random_variables(Transformer(TRANSFORMER), src, tgt, seed=4)
    encoded = incremental.apply(variables, src, method=incremental.encode)
    token = tgt[:, :1]
    # No cache passed: an error, not a silent one-token "init".
    with pytest.raises(ValueError, match="'cache'"):
        incremental.apply(variables, encoded, src, token, method=incremental.decode,
                          mutable=["cache"])
    # Past the cache length: NaN logits, not silently overwritten slots.
    cache = incremental.init(jax.random.PRNGKey(0), src, tgt[:, :3])["cache"]
    step = jax.jit(lambda cache, token: incremental.apply(
        {"params": variables["params"], "cache": cache}, encoded, src, token,
        method=incremental.decode, mutable=["cache"]))
    for i in range(4):
        logits, state = step(cache, token)
        cache = state["cache"]
        assert bool(jnp.isnan(logits).any()) == (i == 3), i


@pytest.mark.slow
def test_packed_targets_need_source_segments_and_positions(translation_batch):
    src, tgt = translation_batch
    model = Transformer(TRANSFORMER)
    variables = random_variables(model, src, tgt)
    segments = jnp.ones_like(tgt)
    with pytest.raises(ValueError, match="inputs_segmentation"):
        model.apply(variables, src, tgt, None, segments)
    with pytest.raises(ValueError, match="targets_positions"):
        model.apply(variables, src, tgt, jnp.ones_like(src), segments)


def test_out_of_range_position_ids_are_rejected():
    model = BertModel(BERT)
    ids = jnp.ones((1, 4), jnp.int32)
    variables = random_variables(model, ids)
    with pytest.raises(ValueError, match=r"\[0, 16\].*config\.model\.max_len=16"):
        model.apply(variables, ids, position_ids=jnp.array([[0, 1, 2, 16]]))


def test_shift_right():
    targets = jnp.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    np.testing.assert_array_equal(np.asarray(shift_right(targets, 1)),
                                  [[1, 3, 4, 5], [1, 7, 8, 0]])
    # Packed: each segment starts (position 0) with bos, not with the previous
    # segment's last token.
    packed = jnp.array([[3, 4, 5, 6, 7, 0]])
    positions = jnp.array([[0, 1, 0, 1, 2, 0]])
    np.testing.assert_array_equal(np.asarray(shift_right(packed, 1, positions)),
                                  [[1, 3, 1, 5, 6, 1]])
    np.testing.assert_array_equal(np.asarray(shift_right(packed, 9)),
                                  [[9, 3, 4, 5, 6, 7]])


# ----------------------------------------------------------------------------
# Residual wiring: post-norm and pre-norm.


@pytest.mark.slow
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_transformer_norm_position_params(translation_batch, norm_position):
    src, tgt = translation_batch
    model = Transformer(TRANSFORMER.replace(norm_position=norm_position))
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), src, tgt))["params"]
    has_final = norm_position == "pre"
    assert ("final_norm" in params["encoder"]) == has_final
    assert ("final_norm" in params["decoder"]) == has_final
    # Both variants trace to logits of the right shape; their numerics are
    # checked in test_encoder_layer_wiring and the incremental decoding tests.
    logits = jax.eval_shape(model.apply, {"params": params}, src, tgt)
    assert logits.shape == (2, 9, 50) and logits.dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_layer_wiring(norm_position):
    """One encoder layer against a hand-assembled residual block:
    post: x = LN(x + Sublayer(x));  pre: x = x + Sublayer(LN(x)), final LN."""
    cfg = BERT.replace(norm_position=norm_position, num_layers=1)
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, 6, 32)), jnp.float32)
    stack = EncoderStack(cfg)
    variables = random_variables(stack, x, None, seed=5)
    out, _ = jitted(stack)(variables, x, None)

    p = variables["params"]["layer_0"]
    eps = cfg.layer_norm_eps
    mha = jitted(MultiHeadAttention(num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                                    out_features=cfg.hidden_size))

    def attend(h):
        h = jnp.asarray(h, jnp.float32)
        return np.asarray(mha({"params": p["attention"]}, h, h), np.float64)

    h = np.asarray(x, np.float64)
    if norm_position == "post":
        h = np_layer_norm(h + attend(h), p["attention_norm"], eps)
        h = np_layer_norm(h + np_feed_forward(h, p["mlp"], cfg.activation),
                          p["mlp_norm"], eps)
    else:
        h = h + attend(np_layer_norm(h, p["attention_norm"], eps))
        h = h + np_feed_forward(np_layer_norm(h, p["mlp_norm"], eps), p["mlp"],
                                cfg.activation)
        h = np_layer_norm(h, variables["params"]["final_norm"], eps)
    np.testing.assert_allclose(np.asarray(out), h, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------
# Feed-forward activations.


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_feed_forward_activation(activation):
    cfg = BERT.replace(activation=activation)
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.normal(size=(2, 5, 32)), jnp.float32)
    module = FeedForward(cfg)
    # Pre-activations of order 1-3, where GELU and its tanh form differ most.
    variables = random_variables(module, x, seed=6, scale=0.3)
    out = np.asarray(jitted(module)(variables, x))
    expected = np_feed_forward(x, variables["params"], activation)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-5)
    # The comparison can tell the activations apart.
    for other in NP_ACTIVATIONS:
        if other != activation:
            wrong = np_feed_forward(x, variables["params"], other)
            assert np.abs(out - wrong).max() > 2e-4, other


# ----------------------------------------------------------------------------
# Output projection: tied or not.


def _is_decoder(module, method_name):
    return module.name == "decoder" and method_name == "__call__"


@pytest.mark.slow
@pytest.mark.parametrize("tie_output, share_embeddings", [
    (True, True), (True, False), (False, True)])
def test_output_projection(translation_batch, tie_output, share_embeddings):
    src, tgt = translation_batch
    cfg = TRANSFORMER.replace(num_layers=1, tie_output=tie_output,
                              share_embeddings=share_embeddings)
    model = Transformer(cfg)
    variables = random_variables(model, src, tgt)
    params = variables["params"]
    assert ("logits" in params) == (not tie_output)
    assert ("target_embedding" in params) == (not share_embeddings)
    logits, state = jitted(model, capture_intermediates=_is_decoder)(variables, src, tgt)
    (decoded,) = state["intermediates"]["decoder"]["__call__"]
    decoded = np.asarray(decoded, np.float64)
    if tie_output:
        table = params["source_embedding" if share_embeddings else "target_embedding"]
        expected = decoded @ np.asarray(table["embedding"], np.float64).T
    else:
        assert params["logits"]["kernel"].shape == (32, 50)
        expected = (decoded @ np.asarray(params["logits"]["kernel"], np.float64)
                    + np.asarray(params["logits"]["bias"]))
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Logical axis names on every parameter.


def _check_logical_axes(boxed_params):
    leaves = jax.tree_util.tree_leaves_with_path(
        boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path)
        assert isinstance(leaf, nn.Partitioned), name
        assert len(leaf.names) == len(leaf.value.shape), (name, leaf.names)
        assert set(leaf.names) <= AXIS_NAMES, (name, leaf.names)
    specs = jax.tree_util.tree_leaves(
        nn.get_partition_spec(boxed_params),
        is_leaf=lambda x: isinstance(x, PartitionSpec))
    assert len(specs) == len(leaves)
    for spec, (_, leaf) in zip(specs, leaves):
        assert tuple(spec) == tuple(leaf.names)
    return {jax.tree_util.keystr(path): leaf.names for path, leaf in leaves}


def test_bert_parameters_carry_logical_axes():
    model = BertForPreTraining(BERT)
    ids = jnp.ones((2, 12), jnp.int32)
    # `init` traced for shapes only: the boxes (and their names) are the same.
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids))["params"]
    names = _check_logical_axes(params)
    assert names["['bert']['embeddings']['word_embeddings']['embedding']"] == (
        "vocab", "embed")
    assert names["['bert']['encoder']['layer_0']['attention']['query']['kernel']"] == (
        "embed", "heads", "kv")
    assert names["['bert']['encoder']['layer_0']['attention']['out']['kernel']"] == (
        "heads", "kv", "embed")
    assert names["['bert']['encoder']['layer_1']['mlp']['intermediate']['kernel']"] == (
        "embed", "mlp")
    assert names["['mlm']['output_bias']"] == ("vocab",)


@pytest.mark.parametrize("overrides", [
    {}, dict(position="learned", share_embeddings=False, tie_output=False)])
def test_transformer_parameters_carry_logical_axes(translation_batch, overrides):
    src, tgt = translation_batch
    model = Transformer(TRANSFORMER.replace(**overrides))
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), src, tgt))["params"]
    names = _check_logical_axes(params)
    assert names["['source_embedding']['embedding']"] == ("vocab", "embed")
    if overrides:
        assert names["['target_positions']['embedding']"] == ("position", "embed")
        assert names["['logits']['kernel']"] == ("embed", "vocab")


# ----------------------------------------------------------------------------
# BERT outputs.


@pytest.fixture(scope="module")
def bert_batch():
    rng = np.random.default_rng(8)
    ids = jnp.asarray(rng.integers(3, 50, size=(2, 12)), jnp.int32)
    attention_mask = jnp.asarray(np.array([[1] * 12, [1] * 9 + [0] * 3]), jnp.int32)
    token_types = jnp.asarray(np.array([[0] * 6 + [1] * 6, [0] * 4 + [1] * 8]), jnp.int32)
    return ids, attention_mask, token_types


@pytest.mark.slow
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_bert_hidden_states(bert_batch, norm_position):
    ids, attention_mask, token_types = bert_batch
    model = BertModel(BERT.replace(norm_position=norm_position))
    variables = random_variables(model, ids)
    out = jitted(model, output_hidden_states=True)(variables, ids, attention_mask,
                                                   token_types)
    assert len(out.hidden_states) == BERT.num_layers + 1
    for h in out.hidden_states:
        assert h.shape == (2, 12, 32)
    # hidden_states[0]: word + position + token type embeddings, then LayerNorm.
    p = variables["params"]["embeddings"]
    positions = np.arange(12)[None, :]
    summed = (np.asarray(p["word_embeddings"]["embedding"])[np.asarray(ids)]
              + np.asarray(p["position_embeddings"]["embedding"])[positions]
              + np.asarray(p["token_type_embeddings"]["embedding"])[np.asarray(token_types)])
    embeddings = np_layer_norm(summed, p["norm"], BERT.layer_norm_eps)
    np.testing.assert_allclose(np.asarray(out.hidden_states[0]), embeddings, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.hidden_states[-1]),
                                  np.asarray(out.sequence_output))
    assert np.abs(np.asarray(out.hidden_states[1] - out.hidden_states[0])).max() > 1e-2
    # The pooled output is tanh(W h_[CLS] + b).
    pooler = variables["params"]["pooler"]
    cls = np.asarray(out.sequence_output, np.float64)[:, 0]
    np.testing.assert_allclose(
        np.asarray(out.pooled_output),
        np.tanh(cls @ np.asarray(pooler["kernel"]) + np.asarray(pooler["bias"])),
        rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_bert_pretraining_masked_positions(bert_batch):
    ids, attention_mask, token_types = bert_batch
    model = BertForPreTraining(BERT)
    variables = random_variables(model, ids)
    masked_positions = jnp.array([[1, 3, 5], [0, 2, 8]], jnp.int32)

    @jax.jit  # one compilation for both calls
    def both(variables):
        return (model.apply(variables, ids, attention_mask, token_types,
                            masked_positions),
                model.apply(variables, ids, attention_mask, token_types))

    gathered, everywhere = both(variables)
    assert gathered.mlm_logits.shape == (2, 3, 50)
    assert everywhere.mlm_logits.shape == (2, 12, 50)
    assert gathered.mlm_logits.dtype == jnp.float32
    expected = np.take_along_axis(np.asarray(everywhere.mlm_logits),
                                  np.asarray(masked_positions)[..., None], axis=1)
    np.testing.assert_allclose(np.asarray(gathered.mlm_logits), expected, rtol=0,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(gathered.nsp_logits),
                               np.asarray(everywhere.nsp_logits), rtol=0, atol=1e-6)
    assert gathered.nsp_logits.shape == (2, 2)
