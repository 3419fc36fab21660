"""`bert_pretraining`: a tfds builder of BERT pretraining examples from raw text.

The examples of google-research/bert `create_pretraining_data.py`, built once
per corpus and vocabulary (the algorithm is `bert_jax.data.pretraining_data`):

    builder = BertPretraining(files=["docs.txt", "wiki.valid.raw:wikitext"],
                              vocab_file="vocab.txt", lowercase=True,
                              max_seq_length=128, eval_documents=500,
                              data_dir=data_dir)
    train = load_source(builder, "train")   # train[i]["tokens"], ...

Each example: `tokens` `[n]` int32 (`[CLS] A [SEP] B [SEP]`, `n <=
max_seq_length`, unmasked), `segment_ids` `[n]` int32 (0 for `[CLS] A [SEP]`,
1 for `B [SEP]`), `next_sentence_label` (1 when B is a random segment of
another document, 0 when it is the actual continuation) and `index` (the
example's position in its split, the key of static masking). Masking is not
stored: the input pipeline applies it (`Masker`), from (seed, step) for
dynamic masking, from (seed, index) for static masking.

Splits: `validation` holds every instance of `eval_documents` documents drawn
at random (with `seed`) and held out (their random "B" segments come from
held-out documents too, so nothing of them is seen in training); `train`
holds `dupe_factor` passes over all other documents, each pass with new
random segmentations, shuffled (as the original).

Files: `path` or `path:format`, format `blank_lines` (the original's: one
sentence or paragraph a line, a blank line between documents) or `wikitext`
(WikiText `.raw`: ` = Title = ` lines start articles). Corpus problems are
handled as the original handles them, or rejected before anything is written
with a message naming the file and line (see `pretraining_data`):
empty files are skipped and recorded; documents of one line are kept (they
give random-next pairs); a line longer than the sequence is truncated by
`truncate_seq_pair`; invalid UTF-8 is an error naming the file and the line.
The statistics are in `builder.info.metadata["corpus"]`.

The config name is the first file's stem plus a 12-hex-digit SHA-256 of every
parameter, the vocabulary file's contents and each corpus file's name, size
and modification time, so a changed corpus or vocabulary is built afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from bert_jax.data.builder_configs import ConfigRegistry, LocalFilesBuilder

from bert_jax.data import pretraining_data
from bert_jax.data.wordpiece import WordPiece
from bert_jax.errors import UserError

FORMATS = ("blank_lines", "wikitext")
_EVAL_SEED_OFFSET = 1  # the validation instances use seed + 1


class BertPretrainingError(UserError, ValueError):
    """Parameters or a corpus that cannot be built (the message says why)."""


@dataclasses.dataclass(eq=False)
class BertPretrainingConfig(tfds.core.BuilderConfig):
    """A corpus, a vocabulary and the instance parameters; see `pretraining_config`."""

    files: tuple[tuple[str, str], ...] = ()        # (absolute path, format)
    vocab_file: str = ""
    lowercase: bool = True
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    eval_documents: int = 0
    seed: int = 12345


_CONFIGS: ConfigRegistry[BertPretrainingConfig] = ConfigRegistry()


def parse_file_spec(spec: str) -> tuple[str, str]:
    """`'path'` or `'path:format'` -> (absolute path, format)."""
    path, _, fmt = spec.rpartition(":") if re.search(r":[a-z_]+$", spec) else (spec, "", "")
    fmt = fmt or "blank_lines"
    if fmt not in FORMATS:
        raise BertPretrainingError(f"bert_pretraining: file {spec!r} has format {fmt!r}; "
                                   f"use one of {FORMATS}.")
    path = os.path.realpath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"bert_pretraining: corpus file {path} does not exist "
                                f"(from {spec!r}).")
    return path, fmt


def pretraining_config(files: Sequence[str], vocab_file: str, *, lowercase: bool = True,
                       max_seq_length: int = 128, short_seq_prob: float = 0.1,
                       dupe_factor: int = 5, eval_documents: int = 0,
                       seed: int = 12345) -> BertPretrainingConfig:
    """The validated, fingerprinted, interned config (see module docstring)."""
    if isinstance(files, str) or not files:
        raise BertPretrainingError("bert_pretraining: files must be a non-empty list of "
                                   "'path' or 'path:format' strings.")
    parsed = tuple(parse_file_spec(spec) for spec in files)
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"bert_pretraining: vocab_file {vocab_file} does not exist.")
    if max_seq_length < 8:
        raise BertPretrainingError(f"bert_pretraining: max_seq_length={max_seq_length} "
                                   "leaves no room for two segments; use at least 8.")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise BertPretrainingError(f"bert_pretraining: short_seq_prob={short_seq_prob} "
                                   "is not a probability.")
    if dupe_factor < 1 or eval_documents < 0:
        raise BertPretrainingError("bert_pretraining: need dupe_factor >= 1 and "
                                   f"eval_documents >= 0, got {dupe_factor}, {eval_documents}.")
    fingerprint = {
        "files": [(os.path.basename(p), fmt, os.stat(p).st_size, os.stat(p).st_mtime_ns)
                  for p, fmt in parsed],
        "paths": [p for p, _ in parsed],
        "vocab": hashlib.sha256(epath.Path(vocab_file).read_bytes()).hexdigest(),
        "lowercase": bool(lowercase), "max_seq_length": max_seq_length,
        "short_seq_prob": short_seq_prob, "dupe_factor": dupe_factor,
        "eval_documents": eval_documents, "seed": seed,
        "version": str(BertPretraining.VERSION)}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.basename(parsed[0][0]).split(".")[0])
    name = f"{stem.strip('_').lower() or 'corpus'}_{digest[:12]}"
    return _CONFIGS.intern(name, lambda: BertPretrainingConfig(
        name=name, description=f"BERT pretraining examples of {len(parsed)} file(s)",
        files=parsed, vocab_file=os.path.realpath(vocab_file),
        lowercase=bool(lowercase), max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
        eval_documents=eval_documents, seed=seed))


def split_documents(num_documents: int, eval_documents: int, seed: int
                    ) -> tuple[list[int], list[int]]:
    """(train, held-out) document indices: `eval_documents` drawn with `seed`."""
    if eval_documents and num_documents - eval_documents < 2:
        raise BertPretrainingError(
            f"bert_pretraining: eval_documents={eval_documents} leaves "
            f"{num_documents - eval_documents} of {num_documents} documents for "
            "training; next-sentence pairs need at least 2.")
    if eval_documents == 1:
        raise BertPretrainingError("bert_pretraining: eval_documents=1 cannot give "
                                   "random-next pairs; use 0 or at least 2.")
    held_out = set(random.Random(seed).sample(range(num_documents), eval_documents))
    train = [i for i in range(num_documents) if i not in held_out]
    return train, sorted(held_out)


def tokenize_documents(documents: Sequence[Sequence[str]], vocab: WordPiece
                       ) -> list[list[list[int]]]:
    """Documents of lines -> documents of segments (token ids); lines that
    tokenize to nothing are dropped."""
    lines = [line for document in documents for line in document]
    ids = iter(vocab.encode_batch(lines))
    out = []
    for document in documents:
        segments = [next(ids) for _ in document]
        out.append([s for s in segments if s])
    return out


class BertPretraining(LocalFilesBuilder):
    """Pretraining examples of a text corpus (see module docstring)."""

    CONFIGS = _CONFIGS

    def __init__(self, *, files: Sequence[str] | None = None, vocab_file: str | None = None,
                 config=None, lowercase: bool = True, max_seq_length: int = 128,
                 short_seq_prob: float = 0.1, dupe_factor: int = 5,
                 eval_documents: int = 0, seed: int = 12345, **kwargs):
        """The corpus (`files`, `vocab_file`, options) or `config`, not both."""
        if config is None:
            if files is None or vocab_file is None:
                raise ValueError("bert_pretraining needs files= and vocab_file= (or config=).")
            config = pretraining_config(
                files, vocab_file, lowercase=lowercase, max_seq_length=max_seq_length,
                short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
                eval_documents=eval_documents, seed=seed)
        elif files is not None or vocab_file is not None:
            raise ValueError("bert_pretraining: pass either config= or files=/vocab_file=.")
        super().__init__(config=config, **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        ids = tfds.features.Tensor(shape=(None,), dtype=np.int32)
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "tokens": ids, "segment_ids": ids,
                "next_sentence_label": tfds.features.Scalar(dtype=np.int64),
                "index": tfds.features.Scalar(dtype=np.int64)}),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True,   # source[i] is instance i (index == i)
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        cfg: BertPretrainingConfig = self.builder_config
        documents, empty_files = [], []
        for path, fmt in cfg.files:
            docs = pretraining_data.read_documents(path, fmt)
            if not docs:
                empty_files.append(path)
                logging.warning("bert_pretraining: %s has no text; skipped.", path)
            documents += docs
        if len(documents) < 2:
            raise BertPretrainingError(
                f"bert_pretraining: the corpus {[p for p, _ in cfg.files]} has "
                f"{len(documents)} document(s); next-sentence pairs need at least 2.")
        vocab = WordPiece.from_vocab_file(cfg.vocab_file, lowercase=cfg.lowercase)
        segments = tokenize_documents(documents, vocab)
        train_ids, eval_ids = split_documents(len(segments), cfg.eval_documents, cfg.seed)
        options = dict(max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob,
                       cls_id=vocab.cls_id, sep_id=vocab.sep_id)
        splits = {"train": pretraining_data.create_instances(
            [segments[i] for i in train_ids], dupe_factor=cfg.dupe_factor, seed=cfg.seed,
            **options)}
        if eval_ids:
            splits["validation"] = pretraining_data.create_instances(
                [segments[i] for i in eval_ids], dupe_factor=1,
                seed=cfg.seed + _EVAL_SEED_OFFSET, **options)
        self.info.metadata["corpus"] = {
            "files": [p for p, _ in cfg.files], "empty_files": empty_files,
            "documents": len(documents),
            "one_line_documents": sum(len(d) < 2 for d in documents),
            "lines": sum(len(d) for d in documents),
            "train_documents": len(train_ids), "eval_documents": len(eval_ids),
            "instances": {k: len(v) for k, v in splits.items()},
            "random_next": {k: float(np.mean([x.is_random_next for x in v]))
                            for k, v in splits.items()}}
        logging.info("bert_pretraining %s: %s", cfg.name, self.info.metadata["corpus"])
        return {split: self._generate_examples(instances)
                for split, instances in splits.items()}

    def _generate_examples(self, instances):
        for index, instance in enumerate(instances):
            yield index, {"tokens": np.asarray(instance.tokens, np.int32),
                          "segment_ids": np.asarray(instance.segment_ids, np.int32),
                          "next_sentence_label": int(instance.is_random_next),
                          "index": index}
