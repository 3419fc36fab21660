"""LAMB: optax.lamb on decayed parameters, Adam on biases and LayerNorm (no
weight decay, no trust ratio), a trust ratio per layer of a scanned stack; the
'poly' schedule is NVIDIA's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.training.optimizer import learning_rate_schedule, make_optimizer
from bert_jax.training.sharding import make_mesh
from bert_jax.training.train_step import create_train_state, jit_train_step, make_train_step


def _tree(rng, scale=1.0):
    leaf = lambda *shape: jnp.asarray(scale * rng.normal(size=shape), jnp.float32)  # noqa: E731
    return {"embeddings": {"embedding": leaf(6, 4)},
            "dense": {"kernel": leaf(4, 3), "bias": leaf(3)},
            "norm": {"scale": 1 + leaf(3), "bias": leaf(3)}}


def _steps(tx, params, grads):
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params


@pytest.mark.slow
def test_lamb_is_optax_lamb_with_bias_and_layer_norm_excluded():
    rng = np.random.default_rng(0)
    params, grads = _tree(rng), [_tree(rng, 10.0) for _ in range(3)]  # 10: clipping acts
    ours = _steps(make_optimizer("lamb", 1e-2, weight_decay=0.1), params, grads)
    clip = optax.clip_by_global_norm(1.0)
    lamb = _steps(optax.chain(clip, optax.lamb(1e-2, weight_decay=0.1)), params, grads)
    adam = _steps(optax.chain(clip, optax.adam(1e-2, eps=1e-6)), params, grads)
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # noqa: E731
    close(ours["embeddings"]["embedding"], lamb["embeddings"]["embedding"])
    close(ours["dense"]["kernel"], lamb["dense"]["kernel"])
    for module, name in [("dense", "bias"), ("norm", "scale"), ("norm", "bias")]:
        close(ours[module][name], adam[module][name])
        assert np.abs(ours[module][name] - lamb[module][name]).max() > 1e-4  # LAMB differs


@pytest.mark.slow
def test_lamb_trust_ratio_is_per_layer_in_a_scanned_stack():
    rng = np.random.default_rng(1)
    layers, grads = [_tree(rng), _tree(rng, 3.0)], [_tree(rng), _tree(rng)]
    stack = lambda trees: {"layers": {"layer": jax.tree.map(  # noqa: E731
        lambda *xs: jnp.stack(xs), *trees)}}
    tx = make_optimizer("lamb", 1e-2)
    unscanned = _steps(tx, {"layer_0": layers[0], "layer_1": layers[1]},
                       [{"layer_0": g, "layer_1": g2} for g, g2 in [grads, grads[::-1]]])
    scanned = _steps(tx, stack(layers), [stack(grads), stack(grads[::-1])])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 stack([unscanned["layer_0"], unscanned["layer_1"]]), scanned)


class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(nn.LayerNorm()(nn.gelu(nn.Dense(8)(x))))


@pytest.mark.slow
def test_lamb_accumulation_equals_one_batch():
    """The trust ratio sees the accumulated gradient: 4 micro-batches give the
    full batch's update, over two steps."""
    rng = np.random.default_rng(2)
    batch = {"x": rng.normal(size=(16, 5)).astype(np.float32),
             "y": rng.normal(size=(16, 2)).astype(np.float32)}

    def loss_fn(params, batch, rng):
        error = Tiny().apply({"params": params}, batch["x"]) - batch["y"]
        return (error ** 2).sum(), jnp.float32(error.size), {}

    def train(grad_accum_steps):
        mesh, tx = make_mesh((1, 1, 1), jax.devices()[:1]), make_optimizer("lamb", 1e-1)
        state, shardings = create_train_state(lambda r: Tiny().init(r, batch["x"]),
                                              Tiny().apply, tx, mesh, jax.random.PRNGKey(0))
        step = jit_train_step(make_train_step(loss_fn, grad_accum_steps), shardings, mesh)
        with jax.set_mesh(mesh):
            for _ in range(2):
                state, metrics = step(state, batch, jax.random.PRNGKey(1))
        return jax.device_get((state.params, metrics))

    (params, metrics), (accumulated, metrics4) = train(1), train(4)
    np.testing.assert_allclose(metrics4["loss"], metrics["loss"], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 accumulated, params)


def test_poly_schedule_is_nvidias():
    """schedulers.py PolyWarmUpScheduler: progress = step / total; warmup
    lr * progress / warmup_fraction, then lr * (1 - progress) ** degree."""
    lr, warmup, total, degree = 6e-3, 0.2843, 1000, 0.5
    schedule = learning_rate_schedule("poly", lr, round(warmup * total), total, degree)
    for step in (0, 100, 283, 285, 500, 999, 1000):  # warmup: 284 steps
        progress = step / total
        nvidia = lr * progress / warmup if progress < warmup else lr * (1 - progress) ** degree
        assert float(schedule(step)) == pytest.approx(nvidia, rel=2e-3, abs=1e-9), step
    linear = learning_rate_schedule("poly", 1.0, 0, 10, decay_power=1.0)
    assert [float(linear(s)) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
