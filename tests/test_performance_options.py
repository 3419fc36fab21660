"""Performance switches give the results of the plain model: rematerialisation
policies and `nn.scan` over layers (BERT and the Transformer, training and
incremental decoding), and the scanned layout under a sharded train step."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.evaluation.decoding import transformer_search
from bert_jax.modeling import BertForPreTraining, Transformer, precision
from bert_jax.errors import ConfigError
from bert_jax.modeling.layers import scan_params, unscan_params
from bert_jax.training.sharding import make_mesh
from bert_jax.training.train_step import create_train_state
from tiny_models import BERT, TRANSFORMER, max_diff, random_variables

IDS = np.array([[5, 7, 9, 11, 13, 3, 0, 0], [4, 6, 8, 10, 12, 14, 16, 3]], np.int32)
MASK = (IDS != 0).astype(np.int32)
HEAD_MASK = jnp.array([[1.0, 0.0], [0.5, 1.0]])
LAYER_MASK = jnp.array([True, False])
OPTIONS = [dict(remat="full"), dict(remat="dots"), dict(remat="dots_no_batch"),
           dict(remat="attention"), dict(scan_layers=True),
           dict(scan_layers=True, remat="full"), dict(scan_layers=True, remat="attention")]


def _bert_outputs(config, params):
    """Pretraining loss-like scalar, its gradient, and hidden states."""
    model = BertForPreTraining(config)
    positions = jnp.array([[1, 2], [3, 6]])

    def loss(params, head_mask):
        out = model.apply({"params": params}, IDS, MASK, masked_positions=positions,
                          head_mask=head_mask, layer_mask=LAYER_MASK,
                          output_hidden_states=True)
        value = (jax.nn.log_softmax(out.mlm_logits)[..., 5].sum()
                 + out.nsp_logits[:, 0].sum())
        return value, out.bert.hidden_states

    (value, hidden), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1),
                                                        has_aux=True))(params, HEAD_MASK)
    return value, hidden, grads


@pytest.fixture(scope="module")
def bert_reference():
    config = dataclasses.replace(BERT, dropout_rate=0.0, attention_dropout_rate=0.0)
    params = random_variables(BertForPreTraining(config), IDS, MASK)["params"]
    return config, params, _bert_outputs(config, params)


@pytest.mark.slow
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(
    f"{k}={v}" for k, v in o.items()))
def test_bert_options_give_the_same_outputs_and_gradients(options, bert_reference):
    config, params, (value, hidden, (grads, head_grads)) = bert_reference
    fast = dataclasses.replace(config, **options)
    scanned = fast.scan_layers
    fast_params = scan_params(params) if scanned else params
    # The model's own initialisation has the layout scan_params produces.
    init_shapes = jax.eval_shape(lambda: BertForPreTraining(fast).init(
        jax.random.PRNGKey(0), IDS, MASK))["params"]
    assert (jax.tree.map(jnp.shape, fast_params)
            == jax.tree.map(lambda x: x.shape, nn.unbox(init_shapes)))
    value2, hidden2, (grads2, head_grads2) = _bert_outputs(fast, fast_params)
    np.testing.assert_allclose(value2, value, rtol=1e-5)
    assert len(hidden2) == len(hidden) == config.num_layers + 1
    for a, b in zip(hidden2, hidden):
        assert max_diff(a, b) < 1e-5
    if scanned:
        grads2 = unscan_params(grads2)
    for a, b in zip(jax.tree.leaves(grads2), jax.tree.leaves(grads)):
        assert max_diff(a, b) < 1e-5
    assert max_diff(head_grads2, head_grads) < 1e-5  # head importance works scanned


@pytest.mark.slow
def test_scan_params_round_trip(bert_reference):
    _, params, _ = bert_reference
    scanned = scan_params(params)
    layers = scanned["bert"]["encoder"]["layers"]["layer"]
    assert layers["attention"]["query"]["kernel"].shape[0] == BERT.num_layers
    assert "layer_0" not in scanned["bert"]["encoder"]
    back = unscan_params(scanned)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_scanned_transformer_trains_and_decodes_like_the_plain_one():
    config = dataclasses.replace(TRANSFORMER, dropout_rate=0.0, attention_dropout_rate=0.0)
    fast = dataclasses.replace(config, scan_layers=True, remat="dots")
    inputs = jnp.array([[5, 6, 7, 8, 2, 0], [9, 10, 11, 2, 0, 0]])
    targets = jnp.array([[8, 7, 6, 5, 2, 0], [11, 10, 9, 2, 0, 0]])
    params = random_variables(Transformer(config), inputs, targets)["params"]
    logits = Transformer(config).apply({"params": params}, inputs, targets)
    logits2 = Transformer(fast).apply({"params": scan_params(params)}, inputs, targets)
    assert max_diff(logits, logits2) < 1e-5
    outputs = [transformer_search(Transformer(c, incremental=True), p, inputs,
                                  max_length=8, beam_size=2, alpha=0.6)
               for c, p in ((config, params), (fast, scan_params(params)))]
    (best, (beams, scores)), (best2, (beams2, scores2)) = outputs
    np.testing.assert_array_equal(best, best2)
    np.testing.assert_array_equal(beams, beams2)
    np.testing.assert_allclose(scores, scores2, rtol=1e-5)


@pytest.mark.slow
def test_scanned_parameters_shard_like_their_layers():
    config = dataclasses.replace(BERT, scan_layers=True, num_heads=4)
    model = BertForPreTraining(config)
    mesh = make_mesh((2, 2, 2), jax.devices())
    state, shardings = create_train_state(
        lambda rng: model.init(rng, IDS, MASK), model.apply,
        optax.sgd(0.1), mesh, jax.random.PRNGKey(0))
    kernel = state.params["bert"]["encoder"]["layers"]["layer"]["mlp"]["intermediate"]["kernel"]
    assert kernel.shape == (2, 32, 64)  # [layers, embed, mlp]
    assert kernel.sharding.shard_shape(kernel.shape) == (2, 16, 32)


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"config\.model\.remat='some'"):
        dataclasses.replace(BERT, remat="some")
    with pytest.raises(ConfigError, match=r"config\.model\.scan_layers=1"):
        dataclasses.replace(BERT, scan_layers=1)


@pytest.mark.slow
@pytest.mark.parametrize("lhs_shape,rhs_shape,count", [
    ((2, 3, 4), (4, 5), 1), ((2, 3, 4, 5), (4, 5, 6), 2), ((2, 3, 4), (4, 2, 3), 1)])
def test_dense_contraction_has_the_autodiff_gradients(lhs_shape, rhs_shape, count):
    rng = np.random.default_rng(0)
    lhs, rhs = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in (lhs_shape, rhs_shape))
    cotangent = jnp.asarray(rng.normal(size=lhs_shape[:-count] + rhs_shape[count:]))
    dims = ((tuple(range(len(lhs_shape) - count, len(lhs_shape))), tuple(range(count))),
            ((), ()))

    def plain(a, b):
        return jax.lax.dot_general(a, b, dims)

    out, vjp = jax.vjp(lambda a, b: precision.contract(a, b, count), lhs, rhs)
    ref_out, ref_vjp = jax.vjp(plain, lhs, rhs)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    for grad, ref in zip(vjp(cotangent), ref_vjp(cotangent)):
        np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-5)
    # bfloat16 operands take the custom path and keep their dtype end to end.
    low = [x.astype(jnp.bfloat16) for x in (lhs, rhs)]
    out16, vjp16 = jax.vjp(lambda a, b: precision.float32_accumulation(a, b, dims), *low)
    assert out16.dtype == jnp.bfloat16
    grads16 = vjp16(cotangent.astype(jnp.bfloat16))
    assert [g.dtype for g in grads16] == [jnp.bfloat16] * 2
    for grad, ref in zip(grads16, ref_vjp(cotangent)):
        np.testing.assert_allclose(np.asarray(grad, np.float32), ref, rtol=0.05, atol=0.1)


@pytest.mark.slow
def test_bfloat16_bert_tracks_float32(bert_reference):
    config, params, (value, hidden, (grads, _)) = bert_reference
    value16, hidden16, (grads16, _) = _bert_outputs(
        dataclasses.replace(config, dtype="bfloat16"), params)
    assert hidden16[-1].dtype == jnp.bfloat16
    assert abs(float(value16) - float(value)) < 0.02 * abs(float(value)) + 0.05
    assert max_diff(hidden16[-1], hidden[-1]) < 0.1
    for (path, g16), g in zip(jax.tree_util.tree_leaves_with_path(grads16),
                              jax.tree.leaves(grads)):
        assert g16.dtype == jnp.float32  # float32 master weights get float32 gradients
        if jax.tree_util.keystr(path).endswith("['key']['bias']"):
            # Zero in exact arithmetic (the bias adds one constant to all of a
            # query's scores). bfloat16 attention rounds dS to bfloat16 before
            # its dK matmul, as flash kernels do (lean_attention), so its rows
            # no longer sum to zero: noise, small beside the query bias's.
            query_bias = grads[path[0].key]["encoder"][path[2].key]["attention"][
                "query"]["bias"]
            assert np.abs(np.asarray(g16)).max() <= 2e-2 * np.abs(np.asarray(query_bias)).max()
            continue
        assert max_diff(g16, g) < 0.05 * float(np.abs(g).max()) + 1e-3
