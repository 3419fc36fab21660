"""A BERT encoder to analyse (attention maps, features), from wherever it lives.

`load_encoder(path)` takes a Hugging Face BERT folder (casing from
`tokenizer_config.json`, `wordpiece.declared_casings`), a bert_jax pretrained
folder (`launch/convert.py` output), or the workdir of a BERT training run,
restored as `launch/evaluate.py` restores it (the checkpoint must hold exactly
the model's arrays), with the run's vocabulary. It returns an `Encoder`: the
`BertConfig` (einsum attention, no dropout), the `BertModel` parameter pytree
(unboxed, task heads left out) and the WordPiece vocabulary (None when none
was found). `features.FeatureExtractor.from_pretrained` and
`launch/visualize_attention.py` load their encoder here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn

from bert_jax.convert import load_hf_bert, load_pretrained
from bert_jax.convert.pretrained import CONFIG_FILE as PRETRAINED_CONFIG
from bert_jax.data.wordpiece import WordPiece, declared_casings
from bert_jax.errors import CheckpointError, MissingFileError
from bert_jax.modeling.configs import BertConfig
from bert_jax.training.workdir import CONFIG_FILE
from bert_jax.workdir_layout import CHECKPOINT_DIR


@dataclasses.dataclass
class Encoder:
    """config: the encoder's BertConfig (einsum attention, no dropout);
    params: `BertModel` parameters (unboxed; task heads left out);
    vocab: its WordPiece vocabulary, None when none was found."""

    config: BertConfig
    params: Any
    vocab: WordPiece | None


def load_encoder(path: str, *, vocab_file: str | None = None,
                 lowercase: bool | None = None, step: int | None = None) -> Encoder:
    """The BERT encoder at `path` (see the module docstring); `step`: the
    checkpoint of a workdir (default: the latest); `vocab_file`, `lowercase`
    replace the vocabulary found beside the weights."""
    path = os.path.abspath(path)
    vocab = None
    if (os.path.isfile(os.path.join(path, CONFIG_FILE))
            and os.path.isdir(os.path.join(path, CHECKPOINT_DIR))):
        from bert_jax.training import evaluation   # tasks, data builders: heavy imports

        task, _, params, _ = evaluation.restore_for_inference(
            evaluation.saved_config(path), path, step)
        config, vocab = task.model_config, getattr(task, "vocab", None)
    elif os.path.isfile(os.path.join(path, PRETRAINED_CONFIG)):
        config, params = load_pretrained(path)
    else:
        config, params = load_hf_bert(path)
    if not isinstance(config, BertConfig):
        raise CheckpointError(f"{path} holds a {type(config).__name__}, not a BERT model.")
    params = nn.meta.unbox(params)
    params = params.get("bert", params)
    beside = os.path.join(path, "vocab.txt")
    if vocab_file is None and vocab is None and os.path.isfile(beside):
        vocab_file = beside
    if vocab_file:
        if not os.path.isfile(vocab_file):
            raise MissingFileError(f"{vocab_file} does not exist: give the encoder's "
                                   "vocabulary (--vocab_file, --vocab)")
        casing = (next((d for *_, d in declared_casings(os.path.dirname(vocab_file))), True)
                  if lowercase is None else lowercase)
        vocab = WordPiece.from_vocab_file(vocab_file, lowercase=casing)
    config = config.replace(attention_impl="einsum", dropout_rate=0.0,
                            attention_dropout_rate=0.0)
    return Encoder(config, params, vocab)
