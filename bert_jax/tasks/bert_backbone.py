"""The BERT a task starts from: its architecture and its vocabulary.

`config.init_from` (the train loop restores the weights:
`checkpoints.restore_params`) is a Hugging Face BERT folder (casing from
`tokenizer_config.json`), a bert_jax pretrained folder (`launch/convert.py`;
`vocab.txt` beside it or `data.vocab_file`), a bert_jax workdir (its model and
`vocab/`), `package:NAME` (`convert.pretrained.checkpoint_path`), or '' (from
scratch: `config.model`, and `data.vocab_file` or a vocabulary trained on the
task's texts into `WORKDIR/vocab/`). With a checkpoint only `RUNTIME_FIELDS`
of `config.model` apply; a vocabulary of another size than its embedding table
is refused before training.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

import ml_collections

from bert_jax.convert.hf_bert import config_from_hf
from bert_jax.convert.pretrained import CONFIG_FILE as PRETRAINED_CONFIG
from bert_jax.convert.pretrained import checkpoint_path
from bert_jax.data import vocabulary, wordpiece
from bert_jax.errors import CheckpointError, MissingFileError
from bert_jax.file_io import read_json
from bert_jax.modeling import BertConfig
from bert_jax.tasks.base import check_saved_config, holds_checkpoints, written_by_process_zero
from bert_jax.auto_dtype import resolve_model_dtype

RUNTIME_FIELDS = ("dropout_rate", "attention_dropout_rate", "dtype", "param_dtype",
                  "attention_impl", "remat", "scan_layers")
WORD_EMBEDDINGS = "bert/embeddings/word_embeddings/embedding"
_HF_WEIGHTS = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class Backbone:
    config: BertConfig
    vocab: wordpiece.WordPiece
    kind: str          # 'huggingface' | 'pretrained' | 'workdir' | 'scratch'


def checkpoint_kind(path: str) -> str:
    """What `init_from` points at: 'huggingface', 'pretrained' or 'workdir'."""
    if os.path.isfile(os.path.join(path, _HF_WEIGHTS)) and os.path.isfile(
            os.path.join(path, "config.json")):
        return "huggingface"
    if os.path.isfile(os.path.join(path, PRETRAINED_CONFIG)):
        return "pretrained"
    if os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(
            os.path.join(path, "checkpoints")):
        return "workdir"
    raise MissingFileError(f"config.init_from={path!r}: give a Hugging Face BERT folder, a "
                           "bert_jax pretrained folder or a bert_jax workdir.")


def checkpoint_model(path: str, kind: str) -> tuple[BertConfig, str, bool | None]:
    """(architecture, its vocab.txt ('' if none), its declared casing or None)."""
    if kind == "huggingface":
        config = config_from_hf(read_json(os.path.join(path, "config.json")))
        lowercase = next((d for *_, d in wordpiece.declared_casings(path)), None)
        vocab = os.path.join(path, "vocab.txt")
        return config, vocab if os.path.isfile(vocab) else "", lowercase
    if kind == "pretrained":
        meta = read_json(os.path.join(path, PRETRAINED_CONFIG))
        if meta.get("kind") != "bert":
            raise CheckpointError(f"config.init_from={path!r} holds a {meta.get('kind')} "
                                  "model, not BERT.")
        vocab = os.path.join(path, "vocab.txt")
        return BertConfig.from_dict(meta["config"]), vocab if os.path.isfile(vocab) else "", None
    saved_path = os.path.join(path, "config.json")
    saved = read_json(saved_path)
    check_saved_config(saved, saved_path)
    vocab = _workdir_vocabulary(path, saved)
    model = {**saved["model"], "vocab_size": vocab.size}
    return BertConfig.from_dict(model), vocab.path, vocab.lowercase


def _workdir_vocabulary(path: str, saved: dict) -> wordpiece.WordPiece:
    """A workdir's vocabulary: its `vocab/` (trained there), else the one its
    config was given (`data.vocab_file`), else that of the checkpoint it started
    from (`init_from`: phase 2 of a pretraining reads phase 1's). Without any, a
    `MissingFileError` names `vocab/vocab.txt` (its checkpoints were trained with it)."""
    vocab_dir = os.path.join(path, wordpiece.VOCAB_DIR)
    data = saved.get("data", {})
    if os.path.isdir(vocab_dir):
        return wordpiece.WordPiece.load(vocab_dir)
    if not (data.get("vocab_file") or saved.get("init_from")):
        raise vocabulary.missing_under_checkpoints(
            os.path.join(vocab_dir, wordpiece.VOCAB_FILE), path)
    if data.get("vocab_file"):
        return wordpiece.WordPiece.from_vocab_file(data["vocab_file"],
                                                   lowercase=data.get("lowercase", True))
    parent = checkpoint_path(saved["init_from"])
    _, vocab_file, lowercase = checkpoint_model(parent, checkpoint_kind(parent))
    if not vocab_file:
        raise CheckpointError(f"{path} has no {wordpiece.VOCAB_DIR}/ and its init_from "
                              f"{parent} no vocab.txt: set config.data.vocab_file to the one "
                              "it was trained with.")
    return wordpiece.WordPiece.from_vocab_file(
        vocab_file, lowercase=data.get("lowercase", True) if lowercase is None else lowercase)


def resolve_backbone(config: ml_collections.ConfigDict, workdir: str,
                     texts: Callable[[], Iterable[str]]) -> Backbone:
    """`texts()`: the training texts, streamed (twice) only to train a vocabulary."""
    data, model = config.data, resolve_model_dtype(config).model.to_dict()
    init_from = config.get("init_from", "")
    if not init_from:
        vocab = written_by_process_zero(
            lambda is_writer: wordpiece.load_or_train(
                workdir, texts, data.get("vocab_size", 30522), lowercase=data.lowercase,
                vocab_file=data.get("vocab_file", ""),
                limit_alphabet=data.get("vocab_limit_alphabet", 0), is_writer=is_writer,
                checkpointed=holds_checkpoints(workdir)),
            "vocabulary")
        return Backbone(BertConfig(**{**model, "vocab_size": vocab.size}), vocab, "scratch")
    init_from = checkpoint_path(init_from)
    kind = checkpoint_kind(init_from)
    architecture, vocab_file, declared_lowercase = checkpoint_model(init_from, kind)
    architecture = architecture.replace(
        **{k: v for k, v in model.items() if k in RUNTIME_FIELDS})
    vocab_file = data.get("vocab_file", "") or vocab_file
    if not vocab_file:
        raise CheckpointError(f"config.init_from={init_from!r} has no vocab.txt: set "
                              "config.data.vocab_file to the one it was trained with.")
    lowercase = data.lowercase if declared_lowercase is None else bool(declared_lowercase)
    vocab = wordpiece.WordPiece.from_vocab_file(vocab_file, lowercase=lowercase)
    if vocab.size != architecture.vocab_size:
        raise CheckpointError(f"{vocab_file}: {vocab.size} tokens, but {init_from} has "
                              f"{architecture.vocab_size} rows in {WORD_EMBEDDINGS}; use the "
                              "checkpoint's vocab.txt.")
    return Backbone(architecture, vocab, kind)
