"""Hugging Face BERT weights in and out (safetensors only, never pickles).

A Hugging Face BERT folder holds `config.json` and `model.safetensors`. Tensor
names are those of `transformers.BertModel` (`embeddings.*`, `encoder.*`,
`pooler.*`), prefixed with `bert.` when task heads are saved too
(`cls.predictions.*` and `cls.seq_relationship.*` for pretraining, `classifier.*`,
`qa_outputs.*`).

    config, params = load_hf_bert("path/to/folder")   # -> BertConfig, {'bert': ...}
    save_hf_bert("out/folder", config, params)        # the reverse

Layouts: torch Linear weights are `[out, in]`; bert_jax kernels are `[in, out]`,
with attention projections split per head: query/key/value `[embed, heads, kv]`,
output `[heads, kv, embed]`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

import flax.linen as nn
import numpy as np
from flax import traverse_util

from bert_jax.errors import CheckpointError, DataError, MissingFileError
from bert_jax.modeling.configs import BertConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# Buffers (not parameters) that Hugging Face checkpoints may carry.
IGNORED_TENSORS = ("embeddings.position_ids",)

_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh",
                   "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_TO_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def _same(x):
    return x


def _transpose(x):
    return np.ascontiguousarray(x.T)


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One Hugging Face tensor and where it lives in bert_jax's parameter tree."""

    hf_name: str
    path: tuple[str, ...]
    hf_shape: tuple[int, ...]
    to_jax: Callable[[np.ndarray], np.ndarray] = _same
    to_hf: Callable[[np.ndarray], np.ndarray] = _same


def _linear(hf: str, path: tuple[str, ...], out_dim: int, in_dim: int) -> list[_Tensor]:
    return [_Tensor(f"{hf}.weight", path + ("kernel",), (out_dim, in_dim), _transpose,
                    _transpose),
            _Tensor(f"{hf}.bias", path + ("bias",), (out_dim,))]


def _layer_norm(hf: str, path: tuple[str, ...], dim: int) -> list[_Tensor]:
    return [_Tensor(f"{hf}.weight", path + ("scale",), (dim,)),
            _Tensor(f"{hf}.bias", path + ("bias",), (dim,))]


def _attention(hf: str, path: tuple[str, ...], config: BertConfig) -> list[_Tensor]:
    """torch `[heads*kv, embed]` query/key/value <-> `[embed, heads, kv]`, and the
    output torch `[embed, heads*kv]` <-> `[heads, kv, embed]`."""
    d, h, k = config.hidden_size, config.num_heads, config.head_dim
    tensors = []
    for name in ("query", "key", "value"):
        tensors += [
            _Tensor(f"{hf}.self.{name}.weight", path + (name, "kernel"), (d, d),
                    lambda w: np.ascontiguousarray(w.T.reshape(d, h, k)),
                    lambda w: np.ascontiguousarray(w.reshape(d, h * k).T)),
            _Tensor(f"{hf}.self.{name}.bias", path + (name, "bias"), (d,),
                    lambda b: b.reshape(h, k), lambda b: b.reshape(h * k))]
    return tensors + [
        _Tensor(f"{hf}.output.dense.weight", path + ("out", "kernel"), (d, d),
                lambda w: np.ascontiguousarray(w.T.reshape(h, k, d)),
                lambda w: np.ascontiguousarray(w.reshape(h * k, d).T)),
        _Tensor(f"{hf}.output.dense.bias", path + ("out", "bias"), (d,))]


def _encoder_tensors(config: BertConfig) -> list[_Tensor]:
    """The `BertModel` tensors (no prefix)."""
    d, m = config.hidden_size, config.mlp_dim
    emb = ("bert", "embeddings")
    tensors = [
        _Tensor("embeddings.word_embeddings.weight", emb + ("word_embeddings", "embedding"),
                (config.vocab_size, d)),
        _Tensor("embeddings.position_embeddings.weight",
                emb + ("position_embeddings", "embedding"), (config.max_len, d)),
        _Tensor("embeddings.token_type_embeddings.weight",
                emb + ("token_type_embeddings", "embedding"), (config.type_vocab_size, d)),
        *_layer_norm("embeddings.LayerNorm", emb + ("norm",), d),
    ]
    for i in range(config.num_layers):
        hf, ours = f"encoder.layer.{i}", ("bert", "encoder", f"layer_{i}")
        tensors += _attention(f"{hf}.attention", ours + ("attention",), config)
        tensors += _layer_norm(f"{hf}.attention.output.LayerNorm",
                               ours + ("attention_norm",), d)
        tensors += _linear(f"{hf}.intermediate.dense", ours + ("mlp", "intermediate"), m, d)
        tensors += _linear(f"{hf}.output.dense", ours + ("mlp", "output"), d, m)
        tensors += _layer_norm(f"{hf}.output.LayerNorm", ours + ("mlp_norm",), d)
    return tensors + _linear("pooler.dense", ("bert", "pooler"), d, d)


def _head_groups(config: BertConfig, num_labels: int | None) -> dict[str, list[_Tensor]]:
    """Optional task heads, each all-or-nothing, keyed by bert_jax module name."""
    d = config.hidden_size
    groups = {
        "mlm": [
            *_linear("cls.predictions.transform.dense", ("mlm", "transform"), d, d),
            *_layer_norm("cls.predictions.transform.LayerNorm", ("mlm", "transform_norm"), d),
            _Tensor("cls.predictions.bias", ("mlm", "output_bias"), (config.vocab_size,)),
        ],
        "nsp": _linear("cls.seq_relationship", ("nsp",), 2, d),
        "qa_outputs": _linear("qa_outputs", ("qa_outputs",), 2, d),
    }
    if num_labels is not None:
        groups["classifier"] = _linear("classifier", ("classifier",), num_labels, d)
    return groups


def config_from_hf(hf: Mapping[str, Any], source: str = CONFIG_FILE) -> BertConfig:
    """A BertConfig from a Hugging Face BERT `config.json` dictionary."""
    def need(key):
        if key not in hf:
            raise DataError(source, f"missing field {key!r}", "is it a Hugging Face BERT "
                            "config.json?")
        return hf[key]

    # bert_jax's BERT is an encoder with absolute (learned) positions.
    for key, default, supported in (("model_type", "bert", ("bert",)),
                                    ("position_embedding_type", "absolute", ("absolute",)),
                                    ("is_decoder", False, (False, None)),
                                    ("add_cross_attention", False, (False, None)),
                                    ("hidden_act", None, tuple(_HF_ACTIVATIONS))):
        value = need(key) if default is None else hf.get(key, default)
        if value not in supported:
            raise DataError(source, f"{key}={value!r} is not supported",
                            f"bert_jax's BERT takes {list(supported)}")
    return BertConfig(
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=need("num_attention_heads"),
        mlp_dim=need("intermediate_size"),
        activation=_HF_ACTIVATIONS[hf["hidden_act"]],
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        max_len=need("max_position_embeddings"),
        type_vocab_size=hf.get("type_vocab_size", 2),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        initializer="normal",
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id", 0) or 0,
    )


def config_to_hf(config: BertConfig, architecture: str = "BertModel") -> dict[str, Any]:
    """A Hugging Face `config.json` dictionary for `config`."""
    if config.norm_position != "post":
        raise CheckpointError(f"config.model.norm_position={config.norm_position!r}: Hugging "
                              "Face BERT has no pre-norm; export needs 'post'.")
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": _TO_HF_ACTIVATIONS[config.activation],
        "hidden_dropout_prob": config.dropout_rate,
        "attention_probs_dropout_prob": config.attention_dropout_rate,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
    }


def _canonical_name(name: str) -> str:
    """Strips the `bert.` prefix and maps TF-era LayerNorm gamma/beta names."""
    if name.startswith("bert."):
        name = name[len("bert."):]
    return name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(
        ".LayerNorm.beta", ".LayerNorm.bias")


def params_from_hf(tensors: Mapping[str, np.ndarray], config: BertConfig,
                   source: str = WEIGHTS_FILE) -> dict[str, Any]:
    """bert_jax parameters `{'bert': ..., [heads]}` from Hugging Face tensors.

    Raises a DataError (its `path`: `source`) listing every unknown, missing or
    mis-shaped tensor by name.
    """
    named = {_canonical_name(k): np.asarray(v) for k, v in tensors.items()}
    classifier = named.get("classifier.weight")
    num_labels = classifier.shape[0] if classifier is not None else None
    expected = {t.hf_name: t for t in _encoder_tensors(config)}
    for group in _head_groups(config, num_labels).values():
        if any(t.hf_name in named for t in group):
            expected.update({t.hf_name: t for t in group})

    unknown = set(named) - set(expected) - set(IGNORED_TENSORS) - _tied_decoder(named, source)
    problems = [f"unknown tensor {n!r} {named[n].shape}" for n in sorted(unknown)]
    problems += [f"missing tensor {n!r} (expected shape {expected[n].hf_shape})"
                 for n in sorted(set(expected) - set(named))]
    problems += [f"tensor {n!r} has shape {named[n].shape}, expected {t.hf_shape} for this "
                 "config" for n, t in expected.items() if n in named
                 and named[n].shape != t.hf_shape]
    if problems:
        raise DataError(source, f"does not match the BERT config ({config.num_layers} layers, "
                        f"hidden {config.hidden_size}, vocab {config.vocab_size}):\n  "
                        + "\n  ".join(problems))

    flat = {spec.path: spec.to_jax(named[name].astype(np.float32))
            for name, spec in expected.items()}
    return traverse_util.unflatten_dict(flat)


def _tied_decoder(named: Mapping[str, np.ndarray], path: str) -> set[str]:
    """The MLM decoder must be tied to the word embeddings (and its bias to
    `cls.predictions.bias`); returns those tensor names, which need no import."""
    tied = set()
    pairs = (("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),
             ("cls.predictions.decoder.bias", "cls.predictions.bias"))
    for name, source in pairs:
        if name not in named:
            continue
        tied.add(name)
        if source in named and (named[name].shape != named[source].shape
                                or not np.array_equal(named[name], named[source])):
            raise DataError(path, f"tensor {name!r} differs from {source!r}", "bert_jax ties "
                            "the MLM decoder and cannot import an untied one")
    return tied


def params_to_hf(params: Mapping[str, Any], config: BertConfig) -> dict[str, np.ndarray]:
    """Hugging Face tensors from bert_jax parameters (boxed or not).

    Raises a CheckpointError listing every missing, mis-shaped or unmapped
    parameter by path.
    """
    flat = traverse_util.flatten_dict(nn.meta.unbox(dict(params)))
    classifier = flat.get(("classifier", "kernel"))
    num_labels = classifier.shape[-1] if classifier is not None else None
    heads = [spec for name, group in _head_groups(config, num_labels).items()
             if name in params for spec in group]
    prefix = "bert." if heads else ""
    specs = [(prefix + s.hf_name, s) for s in _encoder_tensors(config)]
    specs += [(s.hf_name, s) for s in heads]

    problems = []
    for name, spec in specs:
        want = spec.to_jax(np.zeros(spec.hf_shape, np.float32)).shape
        if spec.path not in flat:
            problems.append(f"missing parameter {'/'.join(spec.path)} (for {name!r})")
        elif np.shape(flat[spec.path]) != want:
            problems.append(f"parameter {'/'.join(spec.path)} has shape "
                            f"{np.shape(flat[spec.path])}, expected {want}")
    mapped = {spec.path for _, spec in specs}
    problems += [f"parameter {'/'.join(p)} has no Hugging Face BERT name"
                 for p in sorted(set(flat) - mapped)]
    if problems:
        raise CheckpointError("cannot export to Hugging Face BERT:\n  " + "\n  ".join(problems))
    return {name: spec.to_hf(np.asarray(flat[spec.path], np.float32))
            for name, spec in specs}


def load_hf_bert(folder: str) -> tuple[BertConfig, dict[str, Any]]:
    """Reads `folder/config.json` and `folder/model.safetensors`."""
    from safetensors.numpy import load_file

    config_path = os.path.join(folder, CONFIG_FILE)
    weights_path = os.path.join(folder, WEIGHTS_FILE)
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            hint = ("; a pickled pytorch_model.bin is there, which bert_jax never unpickles: "
                    "convert it to safetensors" if os.path.exists(
                        os.path.join(folder, "pytorch_model.bin")) else "")
            raise MissingFileError(f"{path} does not exist{hint}.")
    try:
        with open(config_path) as f:
            hf_config = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(config_path, f"not valid JSON ({e.msg})", "fix or replace the file",
                        line=e.lineno, column=e.colno) from e
    config = config_from_hf(hf_config, config_path)
    try:
        tensors = load_file(weights_path)
    except Exception as e:  # safetensors raises its own error types
        raise DataError(weights_path, f"not a readable safetensors file ({e})",
                        "convert the weights again") from e
    return config, params_from_hf(tensors, config, weights_path)


_ARCHITECTURES = {"mlm": "BertForPreTraining", "classifier": "BertForSequenceClassification",
                  "qa_outputs": "BertForQuestionAnswering"}


def save_hf_bert(folder: str, config: BertConfig, params: Mapping[str, Any]) -> None:
    """Writes `folder/config.json` and `folder/model.safetensors`."""
    from safetensors.numpy import save_file

    architecture = next((a for k, a in _ARCHITECTURES.items() if k in params), "BertModel")
    hf_config = config_to_hf(config, architecture)
    tensors = params_to_hf(params, config)
    if "classifier.weight" in tensors:
        hf_config["num_labels"] = tensors["classifier.weight"].shape[0]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2)
    save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": "pt"})
