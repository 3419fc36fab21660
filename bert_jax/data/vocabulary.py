"""SentencePiece subword vocabularies of the translation task (one joint
vocabulary for source and target).

A `Vocabulary` maps text to a list of int ids (`encode`) and ids back to text
(`decode`, which stops at the first EOS). Ids: 0 pad, 1 BOS, 2 EOS, 3
unknown, as the Transformer's; `encode` adds no BOS/EOS (the input pipeline
appends EOS). `load_or_train` trains the vocabulary on the training split the
first time a workdir is used and saves it there (`WORKDIR/vocab/`), so ids
never change under a checkpoint: once the workdir holds checkpoints, a missing
or damaged vocabulary file is an error naming it, never trained again.
`bert_jax.tasks.translation` calls it; BERT's vocabulary is `wordpiece`.
"""

from __future__ import annotations

import io
import itertools
import os
from typing import Iterable

import sentencepiece as spm

from bert_jax.errors import DataError, MissingFileError
from bert_jax.file_io import damaged_file, read_json, write_atomically, write_json

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe")
VOCAB_DIR = "vocab"
MODEL_FILE = "spm.model"
SETTINGS_FILE = "spm.json"  # the requested size and type (small corpora give fewer pieces)


class Vocabulary:
    """A trained SentencePiece model: text <-> ids."""

    def __init__(self, model_proto: bytes, path: str | None = None):
        self.path = path
        self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
        if (self._processor.pad_id(), self._processor.bos_id(),
                self._processor.eos_id()) != (PAD_ID, BOS_ID, EOS_ID):
            raise DataError(path or "the SentencePiece model", "does not use pad/bos/eos "
                            f"ids {PAD_ID}/{BOS_ID}/{EOS_ID}",
                            "train it with bert_jax.data.vocabulary.train.")

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        if not os.path.isfile(path):
            raise MissingFileError(f"{path}: no SentencePiece model there.")
        with open(path, "rb") as f:
            model_proto = f.read()
        try:
            return cls(model_proto, path)
        except RuntimeError as e:  # SentencePiece's: the file is no model (cut short?)
            raise damaged_file(path, "SentencePiece cannot read it") from e

    @property
    def size(self) -> int:
        return self._processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self._processor.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenizes ids, stopping at the first EOS and ignoring pad and BOS."""
        ids = itertools.takewhile(lambda i: i != EOS_ID, map(int, ids))
        return self._processor.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])


def train(texts: Iterable[str], vocab_size: int, *, model_type: str = "unigram",
          character_coverage: float = 1.0, max_sentences: int = 2_000_000) -> Vocabulary:
    """Trains a SentencePiece model on `texts` (one sentence each)."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type={model_type!r}: choose one of {list(MODEL_TYPES)}.")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        hard_vocab_limit=False, minloglevel=2)
    return Vocabulary(model.getvalue())


def missing_under_checkpoints(path: str, workdir: str) -> MissingFileError:
    """The error for a vocabulary file `path` missing from a workdir with checkpoints."""
    return MissingFileError(f"{path} is missing, and the checkpoints in {workdir} were "
                            "trained with it: restore it from a copy of the workdir (a "
                            "vocabulary trained again could give other ids).")


def load_or_train(workdir: str, texts: Iterable[str], vocab_size: int, *,
                  model_type: str = "unigram", is_writer: bool = True,
                  checkpointed: bool = False) -> Vocabulary:
    """The workdir's vocabulary, trained on `texts` (read lazily) if absent by
    the writer (process 0; the others wait behind a barrier). `checkpointed`: the
    workdir holds checkpoints trained with it, so an absent one is an error."""
    path = os.path.join(workdir, VOCAB_DIR, MODEL_FILE)
    settings_path = os.path.join(workdir, VOCAB_DIR, SETTINGS_FILE)
    settings = {"vocab_size": vocab_size, "model_type": model_type}
    if os.path.isfile(path):
        if not os.path.isfile(settings_path):
            raise MissingFileError(f"{settings_path} is missing (the settings {path} was "
                                   "trained with): restore it from a copy of the workdir.")
        saved = read_json(settings_path)
        if saved != settings:
            raise DataError(path, f"trained with {saved}, config.data asks for {settings}",
                            "use the workdir's config or a new one")
        return Vocabulary.load(path)
    if checkpointed:
        raise missing_under_checkpoints(path, workdir)
    if not is_writer:
        raise FileNotFoundError(f"{path}: missing; process 0 trains it first")
    vocab = train(texts, vocab_size, model_type=model_type)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(settings_path, settings)
    write_atomically(path, vocab._processor.serialized_model_proto())  # last, complete
    vocab.path = path
    return vocab
