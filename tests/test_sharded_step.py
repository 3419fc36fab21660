"""One train step on data-parallel, FSDP and tensor-parallel meshes (8 fake CPU
devices) equals the single-device step; gradient accumulation equals one batch,
and with replicated parameters reduces the gradients once a step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.modeling import BertForTokenClassification, bert_preset
from bert_jax.planning import hlo
from bert_jax.training.optimizer import decay_mask, learning_rate_schedule, make_optimizer
from bert_jax.training.sharding import global_batch, make_mesh, mesh_shape
from bert_jax.config_schema import DROPOUT_PRNGS
from bert_jax.training.train_step import create_train_state, jit_train_step, make_train_step

CONFIG = bert_preset("tiny", hidden_size=32, num_heads=4, mlp_dim=64, vocab_size=96,
                     max_len=16, dropout_rate=0.0, attention_dropout_rate=0.0)
NUM_LABELS = 8
MODEL = BertForTokenClassification(CONFIG, num_labels=NUM_LABELS)
SCANNED = BertForTokenClassification(dataclasses.replace(CONFIG, scan_layers=True),
                                     num_labels=NUM_LABELS)


def _batch(rows=16, length=12):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, CONFIG.vocab_size, (rows, length)).astype(np.int32)
    lengths = rng.integers(4, length + 1, rows)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    labels = rng.integers(0, NUM_LABELS, (rows, length)).astype(np.int32)
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


def make_loss_fn(model):
    def loss_fn(params, batch, rng):
        logits = model.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                             deterministic=False, rngs={"dropout": rng})
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        weights = batch["attention_mask"].astype(jnp.float32)
        correct = (logits.argmax(-1) == batch["labels"]) * weights
        return (losses * weights).sum(), weights.sum(), {"accuracy": correct.sum()}
    return loss_fn


loss_fn = make_loss_fn(MODEL)


def _run(shape, devices, grad_accum_steps=1, model=MODEL, rows=16, compiled=None):
    """((params, metrics, metrics2) after two steps, the state); `compiled`, a
    list, receives the step's compiled HLO text."""
    mesh = make_mesh(shape, devices)
    # eps=1e-3 keeps Adam's m / (sqrt(v) + eps) Lipschitz in the gradient: with
    # eps=1e-6 it maps reduction-order rounding in near-zero gradients of rare
    # embedding rows to full-size steps, which no layout can reproduce bit-exactly.
    tx = make_optimizer("adamw", learning_rate_schedule("linear", 1e-2, 1, 10), eps=1e-3)
    ids = jnp.zeros((2, 12), jnp.int32)
    state, shardings = create_train_state(lambda r: model.init(r, ids), model.apply, tx,
                                          mesh, jax.random.PRNGKey(0))
    step = jit_train_step(make_train_step(make_loss_fn(model), grad_accum_steps),
                          shardings, mesh)
    batch = global_batch(_batch(rows), mesh)
    with jax.set_mesh(mesh):
        step = step.lower(state, batch, jax.random.PRNGKey(1)).compile()
        if compiled is not None:
            compiled.append(step.as_text())
        state, metrics = step(state, batch, jax.random.PRNGKey(1))
        state, metrics2 = step(state, batch, jax.random.PRNGKey(1))
    return jax.device_get((state.params, metrics, metrics2)), state


@pytest.fixture(scope="module")
def single_device():
    return _run((1, 1, 1), jax.devices()[:1])[0]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 1, 4), (2, 2, 2)],
                         ids=["data", "fsdp", "tensor", "mixed"])
def test_sharded_step_equals_single_device(shape, single_device):
    assert len(jax.devices()) == 8, "tests run with 8 fake CPU devices (conftest.py)"
    (params, metrics, metrics2), state = _run(shape, jax.devices())
    ref_params, ref_metrics, ref_metrics2 = single_device
    for key in ("loss", "accuracy", "grad_norm", "weight"):
        np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5)
        np.testing.assert_allclose(metrics2[key], ref_metrics2[key], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
                 params, ref_params)
    # The layout is what the mesh asks for, not a replicated copy.
    kernel = state.params["bert"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
    assert kernel.shape == (32, 64)  # [embed, mlp]: embed over fsdp, mlp over tensor
    expected = {(8, 1, 1): (32, 64), (1, 8, 1): (4, 64), (2, 1, 4): (32, 16),
                (2, 2, 2): (16, 32)}[shape]
    assert kernel.sharding.shard_shape(kernel.shape) == expected


@pytest.mark.slow
def test_gradient_accumulation_equals_one_batch(single_device):
    (params, metrics, _), _ = _run((2, 2, 2), jax.devices(), grad_accum_steps=2)
    ref_params, ref_metrics, _ = single_device
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
                 params, ref_params)


@pytest.mark.slow
def test_data_parallel_accumulation_reduces_once_and_equals_one_batch():
    """Scanned layers, 4 micro-batches over 8 data-parallel devices: the
    program executes one all-reduce of the gradients (and the summed metrics)
    a step, not one per micro-batch and layer, and trains as one batch does."""
    texts = []
    (params, metrics, metrics2), _ = _run((8, 1, 1), jax.devices(), grad_accum_steps=4,
                                          model=SCANNED, rows=32, compiled=texts)
    (ref_params, ref_metrics, ref_metrics2), _ = _run((1, 1, 1), jax.devices()[:1],
                                                      model=SCANNED, rows=32)
    for key in ("loss", "accuracy", "grad_norm", "weight"):
        np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5)
        np.testing.assert_allclose(metrics2[key], ref_metrics2[key], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
                 params, ref_params)
    found = hlo.collective_ops(texts[0])
    parameter_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    metric_bytes = 3 * 4   # loss_sum, weight, accuracy: float32 scalars
    executed = found.executed["all-reduce"]["bytes"]
    assert abs(executed - (parameter_bytes + metric_bytes)) <= 0.1 * parameter_bytes, (
        executed, parameter_bytes, found.ops)
    assert all(op["executions"] == 1 for op in found.ops if op["kind"] == "all-reduce")
    assert "all-gather" not in found.executed and "reduce-scatter" not in found.executed


def _device_draws(dropout_prng: str, rows: int = 32, steps: int = 4) -> np.ndarray:
    """Each row's uniform draw in one data-parallel accumulated step on 8
    devices (the gradient of `w[row] * u_row` is the row's draw `u_row`)."""
    mesh = make_mesh((8, 1, 1), jax.devices())

    def loss_fn(params, batch, rng):
        draws = jax.random.uniform(rng, batch["row"].shape)
        return (params["w"][batch["row"]] * draws).sum(), jnp.float32(draws.size), {}

    state, shardings = create_train_state(
        lambda r: {"params": {"w": jnp.zeros(rows)}}, None, optax.sgd(1.0), mesh,
        jax.random.PRNGKey(0))
    step = jit_train_step(make_train_step(loss_fn, steps, dropout_prng), shardings, mesh)
    with jax.set_mesh(mesh):
        state, metrics = step(state, global_batch({"row": np.arange(rows)}, mesh),
                              jax.random.PRNGKey(1))
    assert metrics["weight"] == rows
    return -np.asarray(state.params["w"]) * metrics["weight"]


@pytest.mark.parametrize("dropout_prng", DROPOUT_PRNGS)
def test_devices_draw_their_own_randomness_when_accumulating_data_parallel(dropout_prng):
    """Under the one-reduction accumulation each device draws for its own rows:
    its key folds in its position, so no two rows share a draw, whatever the
    generator of the bits."""
    draws = _device_draws(dropout_prng)
    assert np.all((draws > 0) & (draws < 1)) and len(set(draws.tolist())) == len(draws)


def test_dropout_prng_changes_the_stream_and_repeats_it():
    threefry = _device_draws("threefry")
    np.testing.assert_array_equal(threefry, _device_draws("threefry"))
    for name in DROPOUT_PRNGS[1:]:
        draws = _device_draws(name)
        np.testing.assert_array_equal(draws, _device_draws(name))
        assert not np.isin(draws, threefry).any(), name


@pytest.mark.slow
def test_padding_never_counts():
    batch = _batch()
    params = MODEL.init(jax.random.PRNGKey(0), batch["input_ids"])["params"]
    loss_sum, weight, _ = loss_fn(params, batch, jax.random.PRNGKey(0))
    changed = dict(batch, labels=np.where(batch["attention_mask"] == 1, batch["labels"],
                                          (batch["labels"] + 1) % NUM_LABELS))
    assert weight == batch["attention_mask"].sum()
    assert float(loss_fn(params, changed, jax.random.PRNGKey(0))[0]) == float(loss_sum)


@pytest.mark.slow
def test_no_weight_decay_on_biases_and_layer_norm():
    params = MODEL.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    mask = jax.tree_util.tree_flatten_with_path(decay_mask(params))[0]
    decayed = {jax.tree_util.keystr(p) for p, m in mask if m}
    assert any("['kernel']" in k for k in decayed)
    assert any("['embedding']" in k for k in decayed)
    assert not any("['bias']" in k or "['scale']" in k for k in decayed)


@pytest.mark.slow
def test_schedules():
    linear = learning_rate_schedule("linear", 1.0, 10, 110)
    assert float(linear(0)) == 0.0 and float(linear(5)) == pytest.approx(0.5)
    assert float(linear(10)) == pytest.approx(1.0) and float(linear(60)) == pytest.approx(0.5)
    cosine = learning_rate_schedule("cosine", 1.0, 0, 100)
    assert float(cosine(50)) == pytest.approx(0.5, abs=1e-6)
    rsqrt = learning_rate_schedule("rsqrt", 1.0, 100, 1000)
    assert float(rsqrt(100)) == pytest.approx(1.0) and float(rsqrt(400)) == pytest.approx(0.5)
    with pytest.raises(KeyError):  # a bug: the command's config_schema names it for a user
        learning_rate_schedule("step", 1.0, 0, 10)


def test_mesh_shapes():
    assert mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
    with pytest.raises(ValueError, match="at most one -1"):
        mesh_shape((-1, -1, 1), 8)
    with pytest.raises(ValueError, match="not divisible by 3"):
        mesh_shape((-1, 3, 1), 8)
    with pytest.raises(ValueError, match="uses 4 devices but 8"):
        mesh_shape((2, 2, 1), 8)


@pytest.mark.slow
def test_the_old_state_is_donated_to_the_step():
    mesh = make_mesh((2, 2, 2), jax.devices())
    ids = jnp.zeros((2, 12), jnp.int32)
    state, shardings = create_train_state(lambda r: MODEL.init(r, ids), MODEL.apply,
                                          optax.sgd(0.1), mesh, jax.random.PRNGKey(0))
    step = jit_train_step(make_train_step(loss_fn), shardings, mesh)
    with jax.set_mesh(mesh):
        new_state, _ = step(state, global_batch(_batch(), mesh), jax.random.PRNGKey(1))
    # The update reuses the old buffers in place: no second copy of the state.
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(new_state.params))
