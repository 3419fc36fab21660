"""Scaled dot-product and multi-head attention against independent references."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.modeling import BertModel, Transformer
from bert_jax.modeling.attention import MultiHeadAttention, dot_product_attention
from bert_jax.modeling.masks import causal_mask, combine_masks, padding_mask

from tiny_models import BERT, TRANSFORMER, random_variables, jitted


def np_softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def np_attention(q, k, v, mask=None):
    """softmax(Q Kᵀ / √d) V in float64, masked keys excluded from the softmax.

    q `[b, lq, h, d]`, k/v `[b, lk, h, d]`, mask broadcastable to `[b, h, lq, lk]`.
    Returns outputs `[b, lq, h, d]` and weights `[b, h, lq, lk]`.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, lq, h, d = q.shape
    lk = k.shape[1]
    weights = np.zeros((b, h, lq, lk))
    out = np.zeros((b, lq, h, d))
    full = (np.ones((b, h, lq, lk), bool) if mask is None
            else np.broadcast_to(np.asarray(mask), (b, h, lq, lk)))
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                visible = np.flatnonzero(full[bi, hi, i])
                scores = np.array([q[bi, i, hi] @ k[bi, j, hi] for j in visible])
                w = np_softmax(scores / math.sqrt(d))
                weights[bi, hi, i, visible] = w
                out[bi, i, hi] = w @ v[bi, visible, hi]
    return out, weights


def random_qkv(seed, b=2, lq=5, lk=7, h=3, d=8):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, lq, h, d)).astype(np.float32)
    k = rng.normal(size=(b, lk, h, d)).astype(np.float32)
    v = rng.normal(size=(b, lk, h, d)).astype(np.float32)
    return q, k, v


# ----------------------------------------------------------------------------
# dot_product_attention.


@pytest.mark.slow
def test_worked_example_scores_112_96_16_8():
    """Scores 112, 96, 16, 8 with √d = 8 are 14, 12, 2, 1 after scaling."""
    d = 64
    rng = np.random.default_rng(0)
    q = rng.normal(size=d)
    unit = q / np.linalg.norm(q)
    scores = np.array([112.0, 96.0, 16.0, 8.0])
    keys = []
    for s in scores:
        r = rng.normal(size=d)
        r -= (r @ unit) * unit  # orthogonal to q: does not change q·k
        keys.append(s * q / (q @ q) + r)
    keys = np.stack(keys)
    np.testing.assert_allclose(keys @ q, scores, rtol=1e-12)
    values = rng.normal(size=(4, d))

    out, weights = dot_product_attention(
        jnp.asarray(q[None, None, None, :], jnp.float32),
        jnp.asarray(keys[None, :, None, :], jnp.float32),
        jnp.asarray(values[None, :, None, :], jnp.float32),
        return_weights=True)
    assert weights.shape == (1, 1, 1, 4) and weights.dtype == jnp.float32
    w = np.asarray(weights[0, 0, 0])

    scaled = np.array([14.0, 12.0, 2.0, 1.0])
    expected = np.exp(scaled) / np.exp(scaled).sum()
    np.testing.assert_allclose(w, expected, rtol=1e-4, atol=1e-7)
    # By hand: 1 / (1 + e^-2 + e^-12 + e^-13) = 0.881, e^-2 * 0.881 = 0.119,
    # and the last two are about 5e-6 and 2e-6.
    np.testing.assert_allclose(w, [0.88, 0.12, 0.00, 0.00], atol=0.005)
    np.testing.assert_allclose(np.asarray(out[0, 0, 0]), w @ values, rtol=1e-4,
                               atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_bfloat16_scores_are_accumulated_in_float32(impl):
    """q·k = 257 and 256 with bfloat16 inputs. 257 is not a bfloat16 number
    (spacing 2 above 256), so scores kept in bfloat16 would tie at 256 and give
    weights 0.5, 0.5; float32 scores give softmax([257, 256] / 8)."""
    d = 64
    q = np.zeros(d)
    q[:2] = 1.0
    k = np.zeros((2, d))
    k[0, :2] = [256.0, 1.0]
    k[1, 0] = 256.0
    v = np.zeros((2, d))
    v[0, 0] = v[1, 1] = 1.0  # the output's first two entries are the weights

    def bf16(x):
        return jnp.asarray(x, jnp.bfloat16)

    out, _ = dot_product_attention(bf16(q[None, None, None]), bf16(k[None, :, None]),
                                   bf16(v[None, :, None]), impl=impl)
    assert out.dtype == jnp.bfloat16
    expected = np_softmax(np.array([257.0, 256.0]) / 8.0)  # [0.531, 0.469]
    np.testing.assert_allclose(np.asarray(out[0, 0, 0, :2], np.float32), expected,
                               atol=4e-3)  # bfloat16 output rounding


@pytest.mark.slow
def test_matches_numpy_reference_with_padding():
    q, k, v = random_qkv(1)
    rng = np.random.default_rng(1)
    key_valid = rng.random((2, 7)) < 0.6
    key_valid[:, 0] = True  # at least one visible key per row
    mask = np.ones((2, 5), bool)[:, None, :, None] & key_valid[:, None, None, :]
    out, weights = dot_product_attention(q, k, v, jnp.asarray(mask), return_weights=True)
    ref_out, ref_w = np_attention(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(weights), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    # Masked keys get exactly zero probability.
    hidden = np.broadcast_to(~key_valid[:, None, None, :], weights.shape)
    assert np.all(np.asarray(weights)[hidden] == 0.0)


@pytest.mark.slow
def test_matches_numpy_reference_causal_cross_lengths():
    q, k, v = random_qkv(2, lq=6, lk=6, h=2, d=4)
    out, weights = dot_product_attention(q, k, v, causal_mask(6), return_weights=True)
    ref_out, ref_w = np_attention(q, k, v, np.tril(np.ones((6, 6), bool)))
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(weights), ref_w, rtol=1e-5, atol=1e-6)
    # No mask: plain softmax over all keys, query and key lengths differ.
    q, k, v = random_qkv(3, lq=3, lk=9)
    out, _ = dot_product_attention(q, k, v)
    np.testing.assert_allclose(np.asarray(out), np_attention(q, k, v)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.slow
def test_query_with_no_visible_key_gets_uniform_weights():
    q, k, v = random_qkv(4, b=1, lq=3, lk=4, h=1, d=4)
    mask = np.ones((1, 1, 3, 4), bool)
    mask[0, 0, 1] = False  # query 1 sees nothing
    out, weights = dot_product_attention(q, k, v, jnp.asarray(mask), return_weights=True)
    assert np.all(np.isfinite(np.asarray(out)))
    np.testing.assert_allclose(np.asarray(weights[0, 0, 1]), np.full(4, 0.25), atol=1e-7)


MASKS = {
    "none": lambda: None,
    "padding": lambda: padding_mask(jnp.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool),
                                    jnp.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool)),
    "causal": lambda: causal_mask(6),
    "combined": lambda: combine_masks(
        causal_mask(6),
        padding_mask(jnp.ones((2, 6), bool),
                     jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool))),
}


@pytest.mark.slow
@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize("with_head_mask", [False, True])
def test_fused_matches_einsum(mask_name, with_head_mask):
    q, k, v = random_qkv(5, lq=6, lk=6, h=3, d=8)
    mask = MASKS[mask_name]()
    head_mask = jnp.array([1.0, 0.0, 0.5]) if with_head_mask else None
    einsum, _ = dot_product_attention(q, k, v, mask, head_mask=head_mask, impl="einsum")
    fused, weights = dot_product_attention(q, k, v, mask, head_mask=head_mask,
                                           impl="xla")
    assert weights is None  # the fused kernel exposes no probabilities
    np.testing.assert_allclose(np.asarray(fused), np.asarray(einsum), atol=1e-5, rtol=0)
    if with_head_mask:
        assert np.all(np.asarray(fused[:, :, 1]) == 0.0)


def test_unknown_impl_raises():
    q, k, v = random_qkv(6)
    with pytest.raises(ValueError, match="attention_impl='flash_attention'"):
        dot_product_attention(q, k, v, impl="flash_attention")


# ----------------------------------------------------------------------------
# Through the models.


@pytest.fixture(scope="module")
def bert_setup():
    model = BertModel(BERT)
    ids = jnp.asarray(np.random.default_rng(1).integers(3, 50, size=(2, 12)), jnp.int32)
    attention_mask = jnp.ones((2, 12), jnp.int32).at[1, 8:].set(0)
    variables = random_variables(model, ids)
    return variables, ids, attention_mask


@pytest.fixture(scope="module")
def transformer_setup():
    model = Transformer(TRANSFORMER)
    rng = np.random.default_rng(2)
    src = rng.integers(3, 50, size=(2, 10))
    src[1, 7:] = 0
    tgt = rng.integers(3, 50, size=(2, 9))
    tgt[0, 6:] = 0
    src, tgt = jnp.asarray(src, jnp.int32), jnp.asarray(tgt, jnp.int32)
    variables = random_variables(model, src, tgt)
    return variables, src, tgt


@pytest.mark.slow
def test_bert_fused_matches_einsum(bert_setup):
    variables, ids, attention_mask = bert_setup
    einsum = jitted(BertModel(BERT))(variables, ids, attention_mask)
    fused = jitted(BertModel(BERT.replace(attention_impl="xla")))(
        variables, ids, attention_mask)
    np.testing.assert_allclose(np.asarray(fused.sequence_output),
                               np.asarray(einsum.sequence_output), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(fused.pooled_output),
                               np.asarray(einsum.pooled_output), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_transformer_fused_matches_einsum(transformer_setup):
    variables, src, tgt = transformer_setup
    einsum = jitted(Transformer(TRANSFORMER))(variables, src, tgt)
    fused = jitted(Transformer(TRANSFORMER.replace(attention_impl="xla")))(
        variables, src, tgt)
    valid = np.asarray(tgt != 0)
    np.testing.assert_allclose(np.asarray(fused)[valid], np.asarray(einsum)[valid],
                               atol=1e-5, rtol=1e-5)


def _max_rel_error(approx, exact):
    approx, exact = np.asarray(approx, np.float32), np.asarray(exact, np.float32)
    return np.abs(approx - exact).max() / np.abs(exact).max()


def _rms_rel_error(approx, exact):
    approx, exact = np.asarray(approx, np.float32), np.asarray(exact, np.float32)
    return np.sqrt(np.mean((approx - exact) ** 2) / np.mean(exact ** 2))


@pytest.mark.slow
def test_bert_bfloat16_close_to_float32(bert_setup):
    variables, ids, attention_mask = bert_setup
    ref = jitted(BertModel(BERT))(variables, ids, attention_mask)
    bf16_model = BertModel(BERT.replace(dtype="bfloat16"))
    out, state = jitted(bf16_model, mutable=("intermediates",))(
        variables, ids, attention_mask)
    assert out.sequence_output.dtype == jnp.bfloat16  # bf16 compute really ran
    assert not np.array_equal(np.asarray(out.sequence_output, np.float32),
                              np.asarray(ref.sequence_output))
    # bfloat16 keeps 8 significant bits (relative step 2^-8 ≈ 0.4%); through two
    # layers the error is a few such steps (measured: about 1% RMS, 2% max over
    # several random draws). Broken masking or scaling would give O(1) errors.
    assert _max_rel_error(out.sequence_output, ref.sequence_output) < 5e-2
    assert _rms_rel_error(out.sequence_output, ref.sequence_output) < 2.5e-2
    assert _max_rel_error(out.pooled_output, ref.pooled_output) < 5e-2

    for layer in ("layer_0", "layer_1"):
        (weights,) = state["intermediates"]["encoder"][layer]["attention"][
            "attention_weights"]
        assert weights.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, atol=1e-6)
        assert np.all(np.asarray(weights)[1, :, :, 8:] == 0.0)


@pytest.mark.slow
def test_transformer_bfloat16_close_to_float32(transformer_setup):
    variables, src, tgt = transformer_setup
    ref = jitted(Transformer(TRANSFORMER))(variables, src, tgt)
    out, state = jitted(Transformer(TRANSFORMER.replace(dtype="bfloat16")),
                        mutable=("intermediates",))(variables, src, tgt)
    assert out.dtype == jnp.float32  # logits are returned in float32
    assert not np.array_equal(np.asarray(out), np.asarray(ref))
    valid = np.asarray(tgt != 0)
    assert _max_rel_error(np.asarray(out)[valid], np.asarray(ref)[valid]) < 5e-2
    assert _rms_rel_error(np.asarray(out)[valid], np.asarray(ref)[valid]) < 2.5e-2
    layer = state["intermediates"]["decoder"]["layer_0"]
    for name in ("self_attention", "cross_attention"):
        (weights,) = layer[name]["attention_weights"]
        assert weights.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------
# MultiHeadAttention: head mask, recorded probabilities, dropout.

HEADS, HEAD_DIM, EMBED = 4, 8, 32


def _mha(**kwargs):
    return MultiHeadAttention(num_heads=HEADS, head_dim=HEAD_DIM, out_features=EMBED,
                              **kwargs)


@pytest.fixture(scope="module")
def mha_setup():
    rng = np.random.default_rng(7)
    xq = jnp.asarray(rng.normal(size=(2, 5, EMBED)), jnp.float32)
    xkv = jnp.asarray(rng.normal(size=(2, 6, EMBED)), jnp.float32)
    key_valid = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    mask = padding_mask(jnp.ones((2, 5), bool), key_valid)
    # Random kernels and biases, so that every term of the computation counts.
    return random_variables(_mha(), xq, xkv, mask, seed=7), xq, xkv, mask


def _np_per_head(params, xq, xkv, mask):
    """Per-head attention outputs `[b, lq, heads, head_dim]` by hand (float64)."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params["params"])
    xq, xkv = np.asarray(xq, np.float64), np.asarray(xkv, np.float64)

    def project(name, x):
        return np.einsum("ble,ehd->blhd", x, p[name]["kernel"]) + p[name]["bias"]

    out, _ = np_attention(project("query", xq), project("key", xkv),
                          project("value", xkv), np.asarray(mask))
    return out, p["out"]


def test_mha_matches_manual_computation(mha_setup):
    params, xq, xkv, mask = mha_setup
    per_head, out_p = _np_per_head(params, xq, xkv, mask)
    expected = np.einsum("blhd,hde->ble", per_head, out_p["kernel"]) + out_p["bias"]
    got = jitted(_mha())(params, xq, xkv, mask)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_head_mask_removes_that_heads_contribution(mha_setup, impl):
    params, xq, xkv, mask = mha_setup
    per_head, out_p = _np_per_head(params, xq, xkv, mask)
    module = jitted(_mha(attention_impl=impl))
    for head_mask in ([1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.5, 0.0]):
        # Zeroing (scaling) a head's probabilities = zeroing (scaling) its slice
        # of the input to the output projection.
        scaled = per_head * np.asarray(head_mask)[None, None, :, None]
        expected = np.einsum("blhd,hde->ble", scaled, out_p["kernel"]) + out_p["bias"]
        got = module(params, xq, xkv, mask, head_mask=jnp.asarray(head_mask))
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)
    # Sanity: removing a head really changes the output.
    full = module(params, xq, xkv, mask)
    without = module(params, xq, xkv, mask, head_mask=jnp.array([1.0, 0, 1, 1]))
    assert np.abs(np.asarray(full - without)).max() > 1e-2
    # All ones changes nothing.
    ones = module(params, xq, xkv, mask, head_mask=jnp.ones(HEADS))
    np.testing.assert_allclose(np.asarray(ones), np.asarray(full), rtol=0, atol=1e-7)


@pytest.mark.slow
def test_head_mask_all_ones_changes_nothing_in_bert(bert_setup):
    variables, ids, attention_mask = bert_setup
    model = jitted(BertModel(BERT))
    ref = model(variables, ids, attention_mask)
    out = model(variables, ids, attention_mask,
                head_mask=jnp.ones((BERT.num_layers, BERT.num_heads)))
    np.testing.assert_allclose(np.asarray(out.sequence_output),
                               np.asarray(ref.sequence_output), rtol=0, atol=1e-7)
    out = model(variables, ids, attention_mask,
                head_mask=jnp.array([[1.0, 1.0], [0.0, 1.0]]))
    assert np.abs(np.asarray(out.sequence_output - ref.sequence_output)).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_attention_probabilities_recorded(bert_setup, impl):
    variables, ids, attention_mask = bert_setup
    model = BertModel(BERT.replace(attention_impl=impl))
    out, state = jitted(model, mutable=("intermediates",))(
        variables, ids, attention_mask)
    ref = jitted(BertModel(BERT))(variables, ids, attention_mask)
    np.testing.assert_allclose(np.asarray(out.sequence_output),
                               np.asarray(ref.sequence_output), atol=1e-5, rtol=0)
    recorded = state["intermediates"]["encoder"]
    assert set(recorded) == {"layer_0", "layer_1"}
    for layer in recorded.values():
        (weights,) = layer["attention"]["attention_weights"]
        w = np.asarray(weights)
        assert w.shape == (2, BERT.num_heads, 12, 12)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
        assert np.all(w >= 0)
        assert np.all(w[1, :, :, 8:] == 0.0)  # padded keys: exactly zero
        assert np.all(w[1, :, :, :8] > 0.0)
        assert np.all(w[0] > 0.0)  # no padding in row 0


def test_recorded_weights_match_reference(mha_setup):
    params, xq, xkv, mask = mha_setup
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params["params"])

    def project(name, x):
        return np.einsum("ble,ehd->blhd", np.asarray(x, np.float64),
                         p[name]["kernel"]) + p[name]["bias"]

    _, ref_w = np_attention(project("query", xq), project("key", xkv),
                            project("value", xkv), np.asarray(mask))
    head_mask = jnp.array([1.0, 0.0, 0.5, 1.0])
    _, state = jitted(_mha(attention_impl="xla"), mutable=("intermediates",))(
        params, xq, xkv, mask, head_mask=head_mask)
    (weights,) = state["intermediates"]["attention_weights"]
    np.testing.assert_allclose(
        np.asarray(weights), ref_w * np.asarray(head_mask)[None, :, None, None],
        rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_fused_with_attention_dropout_in_training_raises(mha_setup, bert_setup):
    params, xq, xkv, mask = mha_setup
    module = _mha(attention_impl="xla", dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"attention_dropout_rate=0\.1"):
        jitted(module, deterministic=False)(params, xq, xkv, mask,
                                            rngs={"dropout": jax.random.PRNGKey(0)})
    # Evaluation is fine, and so is training without attention dropout.
    jitted(module, deterministic=True)(params, xq, xkv, mask)
    jitted(_mha(attention_impl="xla", dropout_rate=0.0), deterministic=False)(
        params, xq, xkv, mask)

    variables, ids, attention_mask = bert_setup
    model = BertModel(BERT.replace(attention_impl="xla", attention_dropout_rate=0.1))
    with pytest.raises(ValueError, match="attention_dropout_rate"):
        jax.eval_shape(functools.partial(model.apply, deterministic=False),
                       variables, ids, attention_mask,
                       rngs={"dropout": jax.random.PRNGKey(0)})
    # Recording attention weights does not change that.
    with pytest.raises(ValueError, match="attention_dropout_rate"):
        jax.eval_shape(functools.partial(model.apply, deterministic=False,
                                         mutable=["intermediates"]),
                       variables, ids, attention_mask,
                       rngs={"dropout": jax.random.PRNGKey(0)})


@pytest.mark.slow
def test_attention_dropout(mha_setup):
    params, xq, xkv, mask = mha_setup
    rate = 0.5
    module = _mha(dropout_rate=rate)
    record = ("intermediates",)
    eval_out, eval_state = jitted(module, mutable=record)(params, xq, xkv, mask)
    again = jitted(module, deterministic=True)(
        params, xq, xkv, mask, rngs={"dropout": jax.random.PRNGKey(3)})
    np.testing.assert_allclose(np.asarray(again), np.asarray(eval_out), rtol=0,
                               atol=1e-6)
    # Without dropout the module equals the dropout-free one.
    np.testing.assert_allclose(np.asarray(eval_out),
                               np.asarray(jitted(_mha())(params, xq, xkv, mask)),
                               rtol=0, atol=1e-6)

    def train(seed):
        return jitted(module, mutable=record, deterministic=False)(
            params, xq, xkv, mask, rngs={"dropout": jax.random.PRNGKey(seed)})

    (out1, state1), (out1b, _), (out2, _) = train(1), train(1), train(2)
    assert np.abs(np.asarray(out1 - eval_out)).max() > 1e-2
    assert np.abs(np.asarray(out1 - out2)).max() > 1e-2
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(out1b))  # same rng

    # Each probability is either dropped or rescaled by 1 / (1 - rate).
    (w_eval,) = eval_state["intermediates"]["attention_weights"]
    (w_train,) = state1["intermediates"]["attention_weights"]
    w_eval, w_train = np.asarray(w_eval), np.asarray(w_train)
    dropped = w_train == 0.0
    kept_fraction = 1 - dropped[w_eval > 0].mean()
    assert 0.3 < kept_fraction < 0.7
    np.testing.assert_allclose(w_train[~dropped], w_eval[~dropped] / (1 - rate),
                               rtol=1e-6)
