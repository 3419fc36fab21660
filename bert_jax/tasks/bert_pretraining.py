"""BERT pretraining: masked-LM + next-sentence prediction from raw documents.

The corpus (`data.corpus_files`, `path` or `path:format`, or
`data.synthetic_documents` built-in ones) becomes instances through the
`bert_pretraining` tfds builder (google-research/bert's
`create_pretraining_data`; `eval_documents` held out). Model and vocabulary:
`bert_backbone` (from scratch, or `config.init_from` to continue pretraining).

Masking (`pretraining_data.Masker`: 15% of the non-special tokens, 80% [MASK] /
10% random / 10% unchanged, optionally whole words) is done in the input
pipeline. Dynamic (`data.static_masking=False`): row r of global batch k is
masked from (seed, k, r), so every epoch sees new masks and a resumed run the
same ones; static: an instance from (seed, its index), as the original files
were. Held-out instances are always masked from (seed, index), so every
evaluation scores the same predictions. `data.train_masked_lm_prob > 0` masks
that fraction in training only (e.g. 0.4: Wettig et al. 2023, "Should You Mask
15% in Masked Language Modeling?"), with `max(max_predictions_per_seq,
ceil(prob * max_seq_length))` predictions a row; evaluation keeps
`masked_lm_prob`, so its figures stay comparable.

`data.random_position_offsets=True` shifts a training row's position ids by an
offset from (seed, step, row), uniform in `[0, model.max_len - max_seq_length]`
(Ruoss et al. 2023): a short first phase then trains every row of the position
table, so a full-length second phase starts from positions it knows.
Evaluation reads positions `0..max_seq_length-1`. `train.input_workers=N` reads
and masks the training rows in N processes (docs/RESULTS.md, "Input pipeline
at pod speed").

Batches: `input_ids`, `token_type_ids` (and with offsets `position_ids`)
`[batch, max_seq_length]`; `masked_lm_positions`, `masked_lm_ids`,
`masked_lm_weights` `[batch, max_predictions_per_seq]`; `next_sentence_labels`
`[batch]`. The MLM head runs only at the masked positions. Evaluation:
`mlm_accuracy`, `mlm_nll`, `mlm_perplexity` per masked token; `nsp_accuracy`,
`nsp_nll` per sequence.

`data.next_sentence_prediction=False` drops NSP: single segments (see
`pretraining_data`), the masked-LM loss alone, no `nsp_*` metric.
Evaluation may set it either way, to score a model's masked LM on the other
kind of held-out instances (`launch/evaluate.py --config.data.next_sentence_prediction=...`).
"""

from __future__ import annotations

import functools
import math
import os
import types

import jax
import numpy as np

from bert_jax.data import (
    pipeline, pretraining_data, sources, synthetic_documents, wordpiece)
from bert_jax.data.bert_pretraining import BertPretraining, corpus_lines
from bert_jax.modeling.bert import BertForPreTraining
from bert_jax.errors import DataError
from bert_jax.modeling.configs import BertConfig
from bert_jax.tasks.base import Batch, Task, cached_method, register, written_by_process_zero
from bert_jax.tasks.bert_backbone import Backbone, resolve_backbone
from bert_jax.modeling.flops import bert_train_flops
from bert_jax.modeling.losses import bert_pretraining_sums

_EVAL_MASKING = 1 << 20   # key of held-out masking: (seed, _EVAL_MASKING, index)
_STATIC_MASKING = 1 << 21  # key of static training masking: (seed, _STATIC_MASKING, index)
_POSITION_OFFSETS = 1 << 22  # key of position offsets: (seed, _POSITION_OFFSETS, step, row)
SYNTHETIC_CORPUS = os.path.join("corpus", "synthetic_documents.txt")


@register("bert_pretraining")
class BertPretrainingTask(Task):

    model_config_class = BertConfig
    supports_abstract = True
    evaluation_overrides = ("data.eval_examples", "data.next_sentence_prediction")
    saved_defaults = types.MappingProxyType({"data.next_sentence_prediction": True,
                                             "data.vocab_sample": 1.0,
                                             "data.vocab_limit_alphabet": 0,
                                             "init_tile_positions": 0,
                                             "data.document_sample": 1.0})
    model_keywords = ("position_ids",)

    def __init__(self, config, workdir, abstract=False):
        super().__init__(config, workdir, abstract)
        data = config.data
        self.max_length = data.max_seq_length
        self.max_predictions = data.max_predictions_per_seq
        self.next_sentence = bool(data.get(
            "next_sentence_prediction", self.saved_defaults["data.next_sentence_prediction"]))
        self.train_prob = data.get("train_masked_lm_prob", 0.0)
        self.train_predictions = (max(self.max_predictions,
                                      math.ceil(self.train_prob * self.max_length))
                                  if self.train_prob else self.max_predictions)

    def declared_model_config(self) -> BertConfig:
        model_config = BertConfig(**{**self.config.model.to_dict(),
                                     "vocab_size": self.config.data.vocab_size})
        model_config.check_length(self.max_length, "config.data.max_seq_length")
        return model_config

    @functools.cached_property
    def model_config(self) -> BertConfig:  # abstract: the vocabulary size configured
        return self.declared_model_config() if self.abstract else self.backbone.config

    def make_model(self):
        return BertForPreTraining(self.model_config)

    vocab = property(lambda self: None if self.abstract else self.backbone.vocab)
    pad_id = property(lambda self: 0 if self.abstract else self.vocab.pad_id)

    @functools.cached_property
    def masker(self) -> pretraining_data.Masker:  # held-out rows
        return self._masker(self.config.data.masked_lm_prob, self.max_predictions)

    @functools.cached_property
    def train_masker(self) -> pretraining_data.Masker:  # data.train_masked_lm_prob if > 0
        held_out = self.masker  # made first: its problem is named first
        return (self._masker(self.train_prob, self.train_predictions) if self.train_prob
                else held_out)

    def _masker(self, masked_lm_prob: float, max_predictions: int) -> pretraining_data.Masker:
        vocab_tokens = self.vocab.convert_ids_to_tokens(range(self.vocab.size))
        return pretraining_data.Masker(
            pretraining_data.MaskingConfig(
                masked_lm_prob=masked_lm_prob, max_predictions_per_seq=max_predictions,
                whole_word=self.config.data.whole_word_masking),
            vocab_size=self.vocab.size, mask_id=self.vocab.mask_id,
            special_ids=self.vocab.special_ids,
            continuation_ids=[i for i, t in enumerate(vocab_tokens)
                              if t.startswith(wordpiece.CONTINUATION)])

    # -- corpus and vocabulary --------------------------------------------------

    @functools.cached_property
    def corpus_files(self) -> list[str]:
        data = self.config.data
        if data.synthetic_documents:
            path = os.path.join(self.workdir, SYNTHETIC_CORPUS)
            written_by_process_zero(
                lambda is_writer: synthetic_documents.write_corpus(
                    path, data.synthetic_documents, self.config.seed) if is_writer else path,
                "synthetic corpus")
            return [path]
        files = list(data.corpus_files)
        if not files:  # read when the data is (recipes leave it to the command line)
            raise DataError("the pretraining corpus", "config.data.corpus_files is empty",
                            "give text files ('path' or 'path:wikitext') or "
                            "config.data.synthetic_documents.")
        return files

    @functools.cached_property
    def backbone(self) -> Backbone:
        """Architecture and vocabulary (`resolve_backbone`). The corpus comes first,
        on every process (its barrier before the vocabulary's); a vocabulary trained
        here reads it, or `data.vocab_sample` of its documents (`corpus_lines`)."""
        files = self.corpus_files
        sample = self.config.data.get("vocab_sample", self.saved_defaults["data.vocab_sample"])
        backbone = resolve_backbone(self.config, self.workdir,
                                    lambda: corpus_lines(files, sample, self.config.seed))
        backbone.config.check_length(self.max_length, "config.data.max_seq_length")
        return backbone

    def dataset_builder(self) -> BertPretraining:
        data = self.config.data
        return BertPretraining(
            files=self.corpus_files, vocab_file=self.vocab.path, lowercase=data.lowercase,
            max_seq_length=data.max_seq_length, short_seq_prob=data.short_seq_prob,
            dupe_factor=data.dupe_factor, eval_documents=data.eval_documents,
            seed=self.config.seed, documents_per_shard=data.documents_per_shard,
            next_sentence_prediction=self.next_sentence,
            document_sample=data.get("document_sample", self.saved_defaults[
                "data.document_sample"]),
            beam_options=data.beam_options, data_dir=data.data_dir or None)

    @cached_method
    def _source(self, split: str):
        return sources.load_source(self.dataset_builder(), split)

    # -- examples ----------------------------------------------------------------

    def _row(self, example) -> Batch:
        return {"input_ids": np.asarray(example["tokens"], np.int32),
                "token_type_ids": np.asarray(example["segment_ids"], np.int32),
                "next_sentence_labels": np.int32(example["next_sentence_label"])}

    def _masked_row(self, example, purpose: int, masker) -> Batch:
        row = self._row(example)
        rng = pretraining_data.masking_rng(self.config.seed, purpose, int(example["index"]))
        row.update(masker(row["input_ids"], rng))
        return row

    def _mask_batch(self, batch: Batch, step: int, first_row: int) -> Batch:
        """Dynamic masking: global row r of batch `step` from (seed, step, r)."""
        rngs = [pretraining_data.masking_rng(self.config.seed, step, first_row + i)
                for i in range(len(batch["input_ids"]))]
        return {**batch, **self.train_masker.mask_batch(batch["input_ids"], rngs)}

    def _offset_positions(self, batch: Batch, step: int, first_row: int) -> Batch:
        """Global row r of batch `step` reads positions from an offset drawn from
        (seed, _POSITION_OFFSETS, step, r)."""
        room = self.model_config.max_len - self.max_length
        offsets = np.array([
            pretraining_data.masking_rng(self.config.seed, _POSITION_OFFSETS, step,
                                         first_row + i).integers(0, room + 1)
            for i in range(len(batch["input_ids"]))], np.int32)
        return {**batch, "position_ids": offsets[:, None] + np.arange(self.max_length,
                                                                      dtype=np.int32)}

    def _train_transform(self, batch: Batch, step: int, first_row: int) -> Batch:
        if not self.config.data.static_masking:
            batch = self._mask_batch(batch, step, first_row)
        if self.config.data.get("random_position_offsets", False):
            batch = self._offset_positions(batch, step, first_row)
        return batch

    def _lengths(self, predictions: int) -> dict[str, int]:
        n, p = self.max_length, predictions
        return {"input_ids": n, "token_type_ids": n, "masked_lm_positions": p,
                "masked_lm_ids": p, "masked_lm_weights": p}

    def dummy_batch(self) -> Batch:
        n, p = self.max_length, self.max_predictions
        return {"input_ids": np.zeros((1, n), np.int32),
                "token_type_ids": np.zeros((1, n), np.int32),
                "masked_lm_positions": np.zeros((1, p), np.int32)}

    def model_inputs(self, batch: Batch) -> tuple:
        return (batch["input_ids"], batch["input_ids"] != self.pad_id,
                batch["token_type_ids"], batch["masked_lm_positions"])

    def batch_spec(self, train=True):
        batch = self.config.train.batch_size
        spec = {key: jax.ShapeDtypeStruct((batch, length),
                                          np.float32 if key == "masked_lm_weights"
                                          else np.int32)
                for key, length in self._lengths(self.train_predictions if train
                                                 else self.max_predictions).items()}
        spec["next_sentence_labels"] = jax.ShapeDtypeStruct((batch,), np.int32)
        if train and self.config.data.get("random_position_offsets", False):
            spec["position_ids"] = jax.ShapeDtypeStruct((batch, self.max_length), np.int32)
        return spec

    def train_iterator(self, process_index: int, process_count: int):
        data = self.config.data
        static = data.static_masking
        masker = self.train_masker  # made now (both maskers), before the data is built
        return pipeline.train_iterator(
            self._source("train"), global_batch_size=self.config.train.batch_size,
            seed=self.config.seed, process_index=process_index, process_count=process_count,
            preprocess=(functools.partial(self._masked_row, purpose=_STATIC_MASKING,
                                          masker=masker)
                        if static else self._row),
            max_length=self._lengths(self.train_predictions),
            batch_transform=self._train_transform,
            workers=self.config.train.get("input_workers", 0))

    def _eval_source(self):
        data = self.config.data
        source = self._source(data.eval_split)
        if data.eval_examples and len(source) > data.eval_examples:
            source = self._source(f"{data.eval_split}[:{data.eval_examples}]")
        return source

    def eval_batches(self, process_index: int, process_count: int):
        return pipeline.eval_batches(
            self._eval_source(),
            global_batch_size=self.config.train.batch_size, process_index=process_index,
            process_count=process_count,
            preprocess=functools.partial(self._masked_row, purpose=_EVAL_MASKING,
                                         masker=self.masker),
            max_length=self._lengths(self.max_predictions))

    # -- loss and evaluation -------------------------------------------------------

    def loss_fn(self, params, batch, rng):
        out = self._outputs(params, batch, rng)
        sums = bert_pretraining_sums(out.mlm_logits, out.nsp_logits, batch,
                                     next_sentence=self.next_sentence)
        return sums.pop("loss"), sums.pop("weight"), sums

    def predict(self, params, batch, model_kwargs=None):
        """Sums per masked token: mlm_*; with NSP, per real sequence (`nsp_weight`): nsp_*."""
        out = self._outputs(params, batch, model_kwargs=model_kwargs)
        sums = bert_pretraining_sums(out.mlm_logits, out.nsp_logits, batch,
                                     sequence_weights=batch["input_ids"][:, 0] != 0,
                                     next_sentence=self.next_sentence)
        del sums["loss"]
        return {"sums": sums}

    # -- throughput ------------------------------------------------------------------

    def flops_per_step(self) -> float:
        return bert_train_flops(self.model_config, self.config.train.batch_size,
                                self.max_length, self.train_predictions)

    def tokens_per_step(self) -> float:
        return float(self.config.train.batch_size * self.max_length)

