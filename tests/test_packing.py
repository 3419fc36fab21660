"""Sequence packing for translation: packed rows give the same loss, metrics and
gradients as the same pairs one per row, and a packed run trains."""

import pathlib
import sys

import jax
import numpy as np
import pytest

from bert_jax.config_schema import config_problems
from bert_jax.tasks import build_task
from bert_jax.training import trainer
from tiny_models import random_variables

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import tiny_translate  # noqa: E402

PACKING = ("inputs_segmentation", "targets_segmentation", "inputs_positions",
           "targets_positions")


@pytest.fixture(scope="module")
def packed_task(tmp_path_factory):
    config = tiny_translate.get_config()
    config.data.data_dir = str(tmp_path_factory.mktemp("tfds"))
    config.data.update(dict(pack_length=40, batch_tokens=8 * 40, label_smoothing=0.1))
    config.model.update(dict(max_len=16, dropout_rate=0.0))
    return build_task(config, str(tmp_path_factory.mktemp("workdir")))


def _unpacked(batch, max_length):
    """The pairs of a packed batch, one per row padded to `max_length`."""
    rows = {"inputs": [], "targets": []}
    for r in range(len(batch["inputs"])):
        for segment in range(1, batch["targets_segmentation"][r].max() + 1):
            for key in rows:
                tokens = batch[key][r][batch[f"{key}_segmentation"][r] == segment]
                rows[key].append(np.pad(tokens, (0, max_length - len(tokens))))
    return {key: np.stack(value) for key, value in rows.items()}


@pytest.mark.slow
def test_packed_rows_give_the_loss_of_unpacked_rows(packed_task):
    task = packed_task
    assert task.batch_rows == 8 and task.row_length == 40
    it = task.train_iterator(0, 1)
    packed = next(it)
    it.close()
    assert set(packed) == {"inputs", "targets", *PACKING}
    assert packed["inputs"].shape == (8, 40)
    unpacked = _unpacked(packed, task.max_length)
    assert len(unpacked["inputs"]) > 2 * 8  # several pairs a row
    params = random_variables(task.model, *task.model_inputs(unpacked))["params"]

    def loss(params, batch):
        total, weight, sums = task.loss_fn(params, batch, jax.random.PRNGKey(0))
        return total, (weight, sums)

    grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (loss_p, (weight_p, sums_p)), grads_p = grad_fn(params, packed)
    (loss_u, (weight_u, sums_u)), grads_u = grad_fn(params, unpacked)
    assert weight_p == weight_u == (unpacked["targets"] != 0).sum()
    np.testing.assert_allclose(loss_p, loss_u, rtol=1e-5)
    for key in sums_u:
        np.testing.assert_allclose(sums_p[key], sums_u[key], rtol=1e-5)
    eval_p = jax.jit(task.predict)(params, packed)["sums"]
    eval_u = jax.jit(task.predict)(params, unpacked)["sums"]
    for key in eval_u:
        np.testing.assert_allclose(eval_p[key], eval_u[key], rtol=1e-5)
    for g_p, g_u in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_u)):
        np.testing.assert_allclose(g_p, g_u, rtol=1e-4, atol=1e-5)  # float32 sums

    # Without the segment ids the pairs would see each other: the loss changes.
    leaky = {key: value for key, value in packed.items() if "segmentation" not in key}
    assert abs(float(loss(params, leaky)[0]) - float(loss_p)) > 1e-3 * float(loss_p)


def test_batch_tokens_must_divide_into_rows(packed_task):
    config = packed_task.config.copy_and_resolve_references()
    config.data.batch_tokens = 100
    assert config_problems(config) == [   # a rule of the config: before any build
        "config.data.batch_tokens=100: make it a multiple of the row length 40 "
        "(data.pack_length or data.max_length)."]


@pytest.mark.slow
def test_a_packed_run_trains(packed_task, tmp_path):
    config = packed_task.config.copy_and_resolve_references()
    config.train.update(dict(num_steps=150, eval_every=150, checkpoint_every=150,
                             log_every=50))
    config.data.update(dict(batch_tokens=16 * 40, bleu_examples=0))
    logged = trainer.train_and_evaluate(config, str(tmp_path))
    assert logged["eval/accuracy"] > 0.6  # chance is 1/32; unpacked eval batches
