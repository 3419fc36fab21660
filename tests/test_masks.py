"""Masks, tested on model outputs: what a position may not see must not matter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.modeling import BertForSequenceClassification, BertModel, Transformer
from bert_jax.modeling.masks import causal_mask, combine_masks, padding_mask, segment_mask
import ml_collections

from bert_jax.config_schema import POOLINGS, config_problems
from bert_jax.modeling.layers import EncoderStack

from tiny_models import BERT, TRANSFORMER, random_variables, jitted, max_diff


# ----------------------------------------------------------------------------
# BERT: padded positions.


@pytest.fixture(scope="module")
def bert():
    model = BertModel(BERT)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(3, 50, size=(2, 12)), jnp.int32)
    attention_mask = jnp.asarray(np.array([[1] * 8 + [0] * 4, [1] * 10 + [0] * 2]),
                                 jnp.int32)
    return jitted(model), random_variables(model, ids), ids, attention_mask


@pytest.mark.slow
def test_bert_padded_tokens_do_not_change_real_positions(bert):
    apply, variables, ids, attention_mask = bert
    valid = np.asarray(attention_mask, bool)
    ref = apply(variables, ids, attention_mask)
    # New tokens and token types wherever attention_mask is 0.
    other = jnp.where(attention_mask == 0, (ids + 7) % 47 + 3, ids)
    types = jnp.where(attention_mask == 0, 1, 0)
    assert np.all(np.asarray(other != ids)[~valid])
    out = apply(variables, other, attention_mask, types)

    seq, ref_seq = np.asarray(out.sequence_output), np.asarray(ref.sequence_output)
    np.testing.assert_allclose(seq[valid], ref_seq[valid], rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.pooled_output),
                               np.asarray(ref.pooled_output), rtol=0, atol=1e-6)
    # The padded positions themselves did change (their own tokens changed).
    assert max_diff(seq[~valid], ref_seq[~valid]) > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("pooling", POOLINGS)
def test_sequence_classifier_pooling_ignores_padding(bert, pooling):
    _, _, ids, attention_mask = bert
    model = BertForSequenceClassification(BERT, num_labels=3, pooling=pooling)
    apply, variables = jitted(model), random_variables(model, ids)
    ref = np.asarray(apply(variables, ids, attention_mask))
    padded = jnp.where(attention_mask == 0, (ids + 7) % 47 + 3, ids)
    np.testing.assert_allclose(np.asarray(apply(variables, padded, attention_mask)), ref,
                               rtol=0, atol=1e-6)
    real = ids.at[:, 4].set((ids[:, 4] + 5) % 47 + 3)  # position 4 is real in both rows
    assert max_diff(apply(variables, real, attention_mask), ref) > 1e-3


@pytest.mark.slow
def test_mean_pooling_averages_real_positions_only(bert):
    _, _, ids, attention_mask = bert
    model = BertForSequenceClassification(BERT, num_labels=3, pooling="mean")
    variables = random_variables(model, ids)
    logits, state = model.apply(variables, ids, attention_mask, capture_intermediates=True,
                                mutable=["intermediates"])
    sequence = np.asarray(state["intermediates"]["bert"]["__call__"][0].sequence_output)
    mask = np.asarray(attention_mask, np.float32)[..., None]
    pooled = (sequence * mask).sum(1) / mask.sum(1)
    classifier = variables["params"]["classifier"]
    expected = pooled @ np.asarray(classifier["kernel"]) + np.asarray(classifier["bias"])
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"config\.head\.pooling='max'"):
        BertForSequenceClassification(BERT, pooling="max").init(jax.random.PRNGKey(0), ids)


def test_an_unknown_pooling_is_refused_from_the_config():
    """Before any model is built (`config_schema.CHOICES`): the model refuses only
    a direct caller's (above)."""
    config = ml_collections.ConfigDict({"head": {"pooling": "max"}, "train": {"num_steps": 1},
                                        "optimizer": {"warmup_steps": 0, "learning_rate": 0.1}})
    assert config_problems(config) == [
        "config.head.pooling='max': unknown; choose one of ['cls', 'mean']."]


@pytest.mark.slow
def test_bert_real_tokens_do_change_other_positions(bert):
    """Sanity check for the test above: real tokens are attended to."""
    apply, variables, ids, attention_mask = bert
    ref = apply(variables, ids, attention_mask)
    out = apply(variables, ids.at[:, 3].set((ids[:, 3] + 5) % 47 + 3), attention_mask)
    seq, ref_seq = np.asarray(out.sequence_output), np.asarray(ref.sequence_output)
    others = [0, 1, 2, 4, 5, 6, 7]  # real positions other than 3
    assert max_diff(seq[:, others], ref_seq[:, others]) > 1e-3
    assert max_diff(out.pooled_output, ref.pooled_output) > 1e-3
    # And un-padding a position changes the real positions too.
    unpadded = apply(variables, ids, attention_mask.at[0, 8].set(1))
    assert max_diff(np.asarray(unpadded.sequence_output)[0, :8], ref_seq[0, :8]) > 1e-3


# ----------------------------------------------------------------------------
# Transformer: causal and source padding masks.


@pytest.fixture(scope="module")
def transformer():
    model = Transformer(TRANSFORMER)
    rng = np.random.default_rng(1)
    src = rng.integers(3, 50, size=(2, 10))
    src[0, 6:] = TRANSFORMER.pad_id
    tgt = rng.integers(3, 50, size=(2, 9))
    src, tgt = jnp.asarray(src, jnp.int32), jnp.asarray(tgt, jnp.int32)
    return model, random_variables(model, src, tgt), src, tgt


def _positions(tokens):
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


def _logits(model, variables, src, tgt, src_positions=None):
    """Teacher-forced logits; positions are always passed, so that one
    compiled program serves every call of this shape."""
    if src_positions is None:
        src_positions = _positions(src)
    return jitted(model)(variables, src, tgt, None, None, src_positions,
                         _positions(tgt))


@pytest.mark.slow
@pytest.mark.parametrize("j", [0, 3, 7, 8])
def test_future_targets_do_not_change_earlier_logits(transformer, j):
    model, variables, src, tgt = transformer
    ref = np.asarray(_logits(model, variables, src, tgt))
    changed = tgt.at[:, j].set((tgt[:, j] + 11) % 47 + 3)
    out = np.asarray(_logits(model, variables, src, changed))
    # The decoder input is [bos, targets[:-1]]: targets[j] is first seen at j + 1.
    np.testing.assert_allclose(out[:, : j + 1], ref[:, : j + 1], rtol=0, atol=1e-6)
    if j + 1 < tgt.shape[1]:
        assert max_diff(out[:, j + 1], ref[:, j + 1]) > 1e-3  # it is seen there


@pytest.mark.slow
def test_padded_source_positions_do_not_change_logits(transformer):
    model, variables, src, tgt = transformer
    assert np.any(np.asarray(src) == 0)
    ref = np.asarray(_logits(model, variables, src, tgt))
    # Same tokens, but the padded source positions get other position
    # embeddings: their encoder states change, and must not leak.
    positions = jnp.where(src == 0, 13, _positions(src))
    out = np.asarray(_logits(model, variables, src, tgt, positions))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)
    # Sanity: moving a real token's position does change the logits.
    moved = _positions(src).at[0, 2].set(13)
    out = np.asarray(_logits(model, variables, src, tgt, moved))
    assert max_diff(out[0], ref[0]) > 1e-3
    np.testing.assert_allclose(out[1], ref[1], rtol=0, atol=1e-6)  # other row


@pytest.mark.slow
def test_more_source_padding_changes_nothing(transformer):
    model, variables, src, tgt = transformer
    ref = np.asarray(_logits(model, variables, src, tgt))
    longer = jnp.pad(src, ((0, 0), (0, 4)), constant_values=TRANSFORMER.pad_id)
    out = np.asarray(_logits(model, variables, longer, tgt))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_source_tokens_do_change_logits(transformer):
    model, variables, src, tgt = transformer
    ref = np.asarray(_logits(model, variables, src, tgt))
    changed = src.at[0, 1].set((src[0, 1] + 5) % 47 + 3)
    out = np.asarray(_logits(model, variables, changed, tgt))
    assert max_diff(out[0], ref[0]) > 1e-3
    # Turning a pad into a real token is a change as well.
    unpadded = src.at[0, 7].set(9)
    out = np.asarray(_logits(model, variables, unpadded, tgt))
    assert max_diff(out[0], ref[0]) > 1e-3


# ----------------------------------------------------------------------------
# Packed sequences.


@pytest.mark.slow
def test_packed_segments_match_separate_sequences(transformer):
    model, variables, _, _ = transformer
    a_src, a_tgt = [5, 6, 7, 8], [9, 10, 11, 12]
    b_src, b_tgt = [13, 14, 15, 16, 17], [18, 19, 20, 21]

    def pad(tokens, length):
        return tokens + [0] * (length - len(tokens))

    # Alone: one sequence per row, padded.
    src = jnp.array([pad(a_src, 10), pad(b_src, 10)], jnp.int32)
    tgt = jnp.array([pad(a_tgt, 9), pad(b_tgt, 9)], jnp.int32)
    alone = np.asarray(_logits(model, variables, src, tgt))

    # Packed: both sequences in one row, with segment ids and per-segment positions.
    packed_src = jnp.array([pad(a_src + b_src, 10)], jnp.int32)
    packed_tgt = jnp.array([pad(a_tgt + b_tgt, 9)], jnp.int32)
    src_seg = jnp.array([[1] * 4 + [2] * 5 + [0]], jnp.int32)
    tgt_seg = jnp.array([[1] * 4 + [2] * 4 + [0]], jnp.int32)
    src_pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]], jnp.int32)
    tgt_pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 0]], jnp.int32)
    packed = np.asarray(jitted(model)(variables, packed_src, packed_tgt, src_seg,
                                      tgt_seg, src_pos, tgt_pos))

    np.testing.assert_allclose(packed[0, 0:4], alone[0, 0:4], rtol=0, atol=1e-5)
    np.testing.assert_allclose(packed[0, 4:8], alone[1, 0:4], rtol=0, atol=1e-5)
    # Sanity: without segment ids, B would see A and its logits would differ.
    leaky = np.asarray(_logits(model, variables, packed_src, packed_tgt))
    assert max_diff(leaky[0, 4:8], alone[1, 0:4]) > 1e-3


# ----------------------------------------------------------------------------
# Mask helpers: shapes and values.


@pytest.mark.slow
def test_padding_mask_contract():
    q_valid = np.array([[1, 1, 0], [1, 0, 0]], bool)
    k_valid = np.array([[1, 0, 1, 1], [0, 1, 1, 0]], bool)
    mask = padding_mask(jnp.asarray(q_valid), jnp.asarray(k_valid))
    assert mask.shape == (2, 1, 3, 4) and mask.dtype == jnp.bool_
    for b in range(2):
        for i in range(3):
            for j in range(4):
                assert bool(mask[b, 0, i, j]) == (q_valid[b, i] and k_valid[b, j])


def test_causal_mask_contract():
    mask = causal_mask(5)
    assert mask.shape == (1, 1, 5, 5) and mask.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(mask[0, 0]), np.tril(np.ones((5, 5), bool)))


def test_segment_mask_contract():
    q_seg = np.array([[1, 1, 2, 0]])
    k_seg = np.array([[1, 2, 2, 0, 0]])
    mask = segment_mask(jnp.asarray(q_seg), jnp.asarray(k_seg))
    assert mask.shape == (1, 1, 4, 5) and mask.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(mask[0, 0]),
                                  q_seg[0][:, None] == k_seg[0][None, :])


def test_combine_masks_contract():
    assert combine_masks() is None
    assert combine_masks(None, None) is None
    causal = causal_mask(4)
    assert combine_masks(None, causal) is causal
    valid = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    pad = padding_mask(valid, valid)
    seg = segment_mask(jnp.array([[1, 1, 2, 2], [1, 1, 1, 1]]),
                       jnp.array([[1, 1, 2, 2], [1, 1, 1, 1]]))
    combined = combine_masks(causal, None, pad, seg)
    assert combined.shape == (2, 1, 4, 4) and combined.dtype == jnp.bool_
    np.testing.assert_array_equal(
        np.asarray(combined), np.asarray(causal) & np.asarray(pad) & np.asarray(seg))


# ----------------------------------------------------------------------------
# Layer mask and whole-layer head mask.


@pytest.fixture(scope="module", params=["post", "pre"])
def stacks(request):
    cfg = BERT.replace(norm_position=request.param)
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 12, 32)), jnp.float32)
    valid = jnp.asarray(np.arange(12)[None, :] < np.array([[12], [9]]))
    mask = padding_mask(jnp.ones_like(valid), valid)
    two = EncoderStack(cfg)
    one = EncoderStack(cfg.replace(num_layers=1))
    variables = random_variables(two, x, mask)
    return cfg, two, one, variables, x, mask


def _single_layer_params(params, layer):
    single = {"layer_0": params[f"layer_{layer}"]}
    if "final_norm" in params:
        single["final_norm"] = params["final_norm"]
    return {"params": single}


@pytest.mark.slow
def test_layer_mask_false_is_identity(stacks):
    cfg, two, one, variables, x, mask = stacks
    run_two, run_one = jitted(two), jitted(one)
    params = variables["params"]
    for layer_mask, only in (([True, False], 0), ([False, True], 1)):
        out, _ = run_two(variables, x, mask, layer_mask=jnp.array(layer_mask))
        ref, _ = run_one(_single_layer_params(params, only), x, mask)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-5)
    # No layer at all: the input itself (post-norm) or its final LayerNorm (pre).
    out, _ = run_two(variables, x, mask, layer_mask=jnp.array([False, False]))
    if cfg.norm_position == "post":
        np.testing.assert_allclose(np.asarray(out), np.asarray(x), rtol=0, atol=1e-6)
    else:
        xn = np.asarray(x, np.float64)
        xn = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(
            xn.var(-1, keepdims=True) + cfg.layer_norm_eps)
        norm = params["final_norm"]
        np.testing.assert_allclose(
            np.asarray(out), xn * np.asarray(norm["scale"]) + np.asarray(norm["bias"]),
            rtol=1e-5, atol=1e-5)
    # Sanity: both layers do something.
    full, _ = run_two(variables, x, mask, layer_mask=jnp.array([True, True]))
    first, _ = run_two(variables, x, mask, layer_mask=jnp.array([True, False]))
    assert max_diff(full, first) > 1e-2


@pytest.mark.slow
def test_zero_head_mask_removes_the_layers_attention(stacks):
    """All heads of layer 1 masked = that layer's attention output is its bias:
    the same as a zero output-projection kernel."""
    cfg, two, _, variables, x, mask = stacks
    head_mask = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    out, _ = jitted(two)(variables, x, mask, head_mask=head_mask)
    params = jax.tree_util.tree_map(lambda a: a, variables["params"])  # copy dicts
    kernel = params["layer_1"]["attention"]["out"]["kernel"]
    params["layer_1"]["attention"]["out"]["kernel"] = jnp.zeros_like(kernel)
    ref, _ = jitted(two)({"params": params}, x, mask,
                         head_mask=jnp.ones((2, cfg.num_heads)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-5)
    full, _ = jitted(two)(variables, x, mask, head_mask=jnp.ones((2, cfg.num_heads)))
    assert max_diff(full, out) > 1e-2
