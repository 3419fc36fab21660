"""Fine-tuning BERT: GLUE classification and regression, token tagging, SQuAD.

One mechanism (`FinetuneTask`) for the three: the backbone of
`bert_backbone.resolve_backbone`, rows of token ids made once per split, the
one input pipeline with length bucketing, the loss as sums. The task metrics
need every prediction of the split (F1, Matthews, correlations, EM/F1), so
`predict` returns each row's prediction, `decode_predictions` maps them back to
examples, and `bert_jax.evaluation.evaluators` scores and writes them
(`WORKDIR/predictions/<split>_<step>.json`; SQuAD: the official file).

  glue     `data.glue_task` (`glue.GLUE_TASKS`) from the TSV folder `data.path`
           or ('') the tfds catalog; `[CLS] A [SEP] (B [SEP])`, the pair cut
           longest first; a classifier, or a regression (`num_labels=1`) on
           `head.pooling` 'cls' (BERT's pooler) or 'mean' (Sentence-BERT's).
  tagging  CoNLL-U or CoNLL-2003 (`data.format`) files of `data.path`; a word's
           label sits on its first sub-token; accuracy over words, and entity
           F1 when the tags are BIO.
  squad    SQuAD v1.1 JSON `data.path` split by articles (`data.train_articles`,
           `data.eval_articles`, e.g. '0:38', '38:') or ('') the catalog's
           `squad/v1.1`; windows every `doc_stride` tokens, n-best span search.

Labelled-data size: `data.train_examples` (0: all) replaces the training split
by `training_subset`, a sample without replacement seeded by `data.subset_seed`
alone, so identical for every backbone and `config.seed`, and nested across
sizes (learning curves); SQuAD samples questions, their windows follow. The
evaluation splits stay whole. `data.eval_split='heldout'` evaluates on
`data.heldout_fraction` of that subset instead, held out of training
(`carve_heldout`): a split to choose hyperparameters on that is neither dev nor
test, from the same labelled examples a run may use. A vocabulary trained from scratch sees the
subset's texts only (k labelled examples and nothing else; a vocabulary shared
by every size is `data.vocab_file`).

Length bucketing (`data.length_buckets`): a batch is cut to the smallest bucket
holding its longest row (one compiled step per bucket); off with several
processes (each sees only its rows).

Batches are dicts of numpy arrays: `input_ids` and `token_type_ids` int32
`[batch, length]` (`length` is `data.max_seq_length`, or the bucket), `row`
int32 `[batch]` (the row's index in its split, through which predictions map
back to examples), and the targets: GLUE `label` `[batch]` (int32 classes,
float32 for regression); tagging `labels` int32 `[batch, length]` (the tag id
+ 1 on a word's first sub-token, 0 on the positions not scored); SQuAD
`start_positions` and `end_positions` int32 `[batch]`.
"""

from __future__ import annotations

import abc
import functools
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax.data import conllu, glue, pipeline, sources, squad_json, squad_windows
from bert_jax.data.splits import select
from bert_jax.evaluation import classification_metrics
from bert_jax.modeling.bert import (
    BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification)
from bert_jax.config_schema import HELDOUT  # the evaluation split carved from the training subset
from bert_jax.errors import DataError
from bert_jax.modeling.configs import BertConfig
from bert_jax.modeling.flops import bert_train_flops
from bert_jax.modeling.losses import cross_entropy_sums
from bert_jax.tasks.base import Batch, Task, cached_method, register
from bert_jax.tasks.bert_backbone import Backbone, resolve_backbone

ROW = "row"  # the row's index in its split's rows: predictions map back through it


def _buckets(buckets: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The row lengths, ascending, up to `max_length` (positive: `config_schema`)."""
    return tuple(sorted({int(b) for b in buckets if int(b) < max_length})) + (max_length,)


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """BERT's `_truncate_seq_pair`: pops from the longer one until both fit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def training_subset(examples: Sequence[Any], size: int, seed: int,
                    dataset: str = "the training split") -> Sequence[Any]:
    """`size` of `examples` drawn without replacement, in their order (0: all).
    They are the first `size` of `seed`'s permutation of the split: the subset
    depends on the split and `seed` only (not on the backbone or config.seed),
    and for one seed a smaller subset lies inside a larger one. A size beyond the
    split is a `DataError` naming `dataset` (negative sizes: `config_schema`)."""
    if not 0 <= size <= len(examples):
        raise DataError(dataset, f"config.data.train_examples={size}: the training split has "
                        f"{len(examples)} examples", f"use 1 to {len(examples)}, or 0 for all.")
    if not size:
        return examples
    chosen = np.sort(np.random.default_rng(seed).permutation(len(examples))[:size])
    return [examples[i] for i in chosen]


def carve_heldout(examples: Sequence[Any], fraction: float, seed: int,
                  dataset: str = "the training subset") -> tuple[Sequence[Any], Sequence[Any]]:
    """(training, held out): `fraction` of `examples` (at least one) drawn by
    `seed`, both in their order. The fraction is in (0, 1) (`config_schema`); one
    that holds out every example is a `DataError` naming `dataset`."""
    count = max(1, round(fraction * len(examples)))
    if count >= len(examples):
        raise DataError(dataset, f"config.data.heldout_fraction={fraction}: it must leave "
                        f"examples of the {len(examples)} for training and hold out at least "
                        "one", "use more training examples (config.data.train_examples)")
    held = set(np.random.default_rng([seed, 1]).permutation(len(examples))[:count].tolist())
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


def tag_set(sentences: Iterable[dict], tag_column: str, fmt: str) -> tuple[str, ...]:
    """UPOS's fixed 17 tags for CoNLL-U's `upos` column, else every tag of `sentences`."""
    if fmt == "conllu" and (tag_column or "upos") == "upos":
        return conllu.UPOS_TAGS
    return tuple(conllu.tag_vocabulary(sentences))


class FinetuneTask(Task):
    """The shared fine-tuning mechanism; subclasses give examples, rows, a
    model head, its loss sums and its scoring."""

    model_config_class = BertConfig
    evaluation_overrides = ("data.path",)
    saved_defaults = types.MappingProxyType({"data.heldout_fraction": 0.1})

    def __init__(self, config, workdir):
        super().__init__(config, workdir)
        self.max_length = config.data.max_seq_length
        self.buckets = _buckets(config.data.get("length_buckets", ()), self.max_length)

    @functools.cached_property
    def backbone(self) -> Backbone:
        """Architecture and vocabulary (`resolve_backbone`); a vocabulary trained
        here reads the training examples."""
        backbone = resolve_backbone(self.config, self.workdir, self.training_texts)
        backbone.config.check_length(self.max_length, "config.data.max_seq_length")
        logging.info("%s: %s backbone, %d-token vocabulary %s, %s", type(self).__name__,
                     backbone.kind, backbone.vocab.size, backbone.vocab.path, backbone.config)
        return backbone

    vocab = property(lambda self: self.backbone.vocab)
    # what the examples are read from, as a `DataError` names it
    dataset = property(lambda self: self.config.data.get("path") or f"{self.config.task} catalog")
    model_config = property(lambda self: self.backbone.config)

    # -- what a subclass provides --------------------------------------------------

    @abc.abstractmethod
    def read_examples(self, split: str) -> Sequence[Any]:
        """The split's examples, all of them (`examples` takes the training subset)."""

    @abc.abstractmethod
    def training_texts(self) -> Iterator[str]:
        """Texts of `examples('train')` (to train a vocabulary from scratch)."""

    def unlabelled_texts(self) -> list[list[str]]:
        """The texts of every example of the whole training split (not only the
        `data.train_examples` subset), read without their labels, one list an
        example (a sentence, or a pair's two): the text of in-task masked-LM
        pretraining (`analysis.transfer`, Gururangan et al. 2020; the tasks that give
        them: `config_schema.IN_TASK_TASKS`, which the study checks)."""
        raise NotImplementedError(f"task {self.config.task!r} gives no unlabelled texts")

    @abc.abstractmethod
    def featurize(self, split: str) -> list[Batch]:
        """The split's examples -> rows: `input_ids`, `token_type_ids`, labels."""

    @abc.abstractmethod
    def head_sums(self, outputs, batch: Batch, real: jax.Array) -> dict[str, jax.Array]:
        """Loss sums of the head's outputs: loss and weight at least."""

    @abc.abstractmethod
    def head_predictions(self, outputs) -> Any:
        """Device-side predictions of a batch (arrays with a leading row axis)."""

    # -- examples, rows and batches ------------------------------------------------------

    @cached_method
    def examples(self, split: str) -> Sequence[Any]:
        """The split's examples; for 'train', its subset of `data.train_examples`
        (less the held-out part when `data.eval_split` is 'heldout'); for
        'heldout', that part."""
        data = self.config.data
        if split not in ("train", HELDOUT):
            return self.read_examples(split)
        examples = self.read_examples("train")
        size, seed = data.get("train_examples", 0), data.get("subset_seed", 0)
        subset = training_subset(examples, size, seed, self.dataset)
        if size and split == "train":
            logging.info("%s: training on %d of the %d training examples "
                         "(config.data.train_examples, subset_seed=%d)",
                         type(self).__name__, len(subset), len(examples), seed)
        if data.eval_split != HELDOUT:
            if split == HELDOUT:  # a caller's bug: the config names its evaluation split
                raise ValueError("no 'heldout' split unless config.data.eval_split='heldout'")
            return subset
        train, heldout = carve_heldout(subset, data.get(
            "heldout_fraction", self.saved_defaults["data.heldout_fraction"]), seed, self.dataset)
        return train if split == "train" else heldout

    @cached_method
    def rows(self, split: str) -> list[Batch]:
        rows = self.featurize(split)
        for index, row in enumerate(rows):
            row[ROW] = np.int32(index)
        logging.info("%s %s: %d rows", type(self).__name__, split, len(rows))
        if split == "train" and rows:  # epochs=E variants set num_steps from an estimate
            train = self.config.train
            logging.info("%s: %d steps of %d rows are %.2f epochs", type(self).__name__,
                         train.num_steps, train.batch_size,
                         train.num_steps * train.batch_size / len(rows))
        return rows

    @property
    def sequence_keys(self) -> tuple[str, ...]:  # features of length max_seq_length
        return ("input_ids", "token_type_ids")

    def _lengths(self) -> dict[str, int]:
        return {key: self.max_length for key in self.sequence_keys}

    def trim(self, batch: Batch, *unused) -> Batch:
        if jax.process_count() > 1 or len(self.buckets) == 1:
            return batch
        used = np.flatnonzero((batch["input_ids"] != 0).any(axis=0))
        longest = int(used[-1]) + 1 if used.size else 1
        bucket = next(b for b in self.buckets if b >= longest)
        return {k: v[:, :bucket] if k in self.sequence_keys else v for k, v in batch.items()}

    def dummy_batch(self) -> Batch:
        zeros = np.zeros((1, self.max_length), np.int32)
        return {"input_ids": zeros, "token_type_ids": zeros}

    def model_inputs(self, batch: Batch) -> tuple:
        return batch["input_ids"], batch["input_ids"] != self.vocab.pad_id, batch[
            "token_type_ids"]

    def train_iterator(self, process_index: int, process_count: int):
        return pipeline.train_iterator(
            self.rows("train"), global_batch_size=self.config.train.batch_size,
            seed=self.config.seed, process_index=process_index, process_count=process_count,
            preprocess=dict, max_length=self._lengths(), batch_transform=self.trim)

    def eval_batches(self, process_index: int, process_count: int):
        batches = pipeline.eval_batches(
            self.rows(self.config.data.eval_split),
            global_batch_size=self.config.train.batch_size, process_index=process_index,
            process_count=process_count, preprocess=dict, max_length=self._lengths())
        return map(self.trim, batches)

    # -- loss and evaluation -------------------------------------------------------------

    def loss_fn(self, params, batch, rng):
        sums = self.head_sums(self._outputs(params, batch, rng), batch,
                              batch["input_ids"][:, 0] != 0)
        return sums.pop("loss"), sums.pop("weight"), sums

    def predict(self, params, batch, model_kwargs=None):
        outputs = self._outputs(params, batch, model_kwargs=model_kwargs)
        real = batch["input_ids"][:, 0] != 0
        sums = self.head_sums(outputs, batch, real)
        return {"sums": {"loss": sums["loss"], "weight": sums["weight"]},
                "prediction": self.head_predictions(outputs), "row": batch[ROW], "real": real}

    # -- throughput --------------------------------------------------------------------

    @functools.cached_property
    def mean_batch_length(self) -> float:
        """Expected training batch length after bucketing (256 random batches)."""
        if len(self.buckets) == 1:
            return float(self.max_length)
        lengths = np.array([len(row["input_ids"]) for row in self.rows("train")])
        draws = np.random.default_rng(0).integers(
            0, len(lengths), (256, self.config.train.batch_size))
        return float(np.mean([next(b for b in self.buckets if b >= n)
                              for n in lengths[draws].max(axis=1)]))

    def flops_per_step(self) -> float:
        return bert_train_flops(self.model_config, self.config.train.batch_size,
                                self.mean_batch_length, None, 2)

    def tokens_per_step(self) -> float:
        return self.config.train.batch_size * self.mean_batch_length


# ------------------------------------------------------------------------ GLUE --

@register("glue")
class GlueTask(FinetuneTask):
    """A GLUE task (`data.glue_task`): `[CLS] A [SEP] (B [SEP])` rows with a
    `label` each (an int32 class, or a float32 score for regression, trained
    with the squared error)."""

    def __init__(self, config, workdir):
        self.spec = glue.get_task(config.data.glue_task)
        super().__init__(config, workdir)

    def read_examples(self, split: str) -> list[dict]:
        data = self.config.data
        if data.path:
            return glue.read_split(data.path, self.spec, split)
        source = sources.load_source(self.spec.catalog, split, data.data_dir or None)
        return [glue.from_catalog(self.spec, source[i]) for i in range(len(source))]

    def training_texts(self):
        for example in self.examples("train"):
            yield example["text_a"]
            if example["text_b"]:
                yield example["text_b"]

    def unlabelled_texts(self):
        data = self.config.data
        if data.path:
            examples = glue.read_split(data.path, self.spec, "train", text_only=True)
        else:   # the catalog's examples carry their label: dropped here
            source = sources.load_source(self.spec.catalog, "train", data.data_dir or None)
            examples = [glue.from_catalog(self.spec, source[i]) for i in range(len(source))]
        return [[e["text_a"], e["text_b"]] if e["text_b"] else [e["text_a"]]
                for e in examples]

    def featurize(self, split):
        examples = self.examples(split)
        a_ids = self.vocab.encode_batch([e["text_a"] for e in examples])
        b_ids = self.vocab.encode_batch([e["text_b"] for e in examples])
        cls, sep = self.vocab.cls_id, self.vocab.sep_id
        rows = []
        for example, a, b in zip(examples, a_ids, b_ids):
            a, b = truncate_pair(a, b, self.max_length - (3 if b else 2))
            ids = [cls] + a + [sep] + (b + [sep] if b else [])
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1 if b else 0)
            label = (np.float32(example["label"]) if self.spec.is_regression
                     else np.int32(example["label"]))
            rows.append({"input_ids": np.asarray(ids, np.int32),
                         "token_type_ids": np.asarray(types, np.int32), "label": label})
        return rows

    def make_model(self):
        return BertForSequenceClassification(
            self.model_config, num_labels=self.spec.num_labels,
            pooling=self.config.get("head", {}).get("pooling", "cls"))

    def head_sums(self, logits, batch, real):
        if self.spec.is_regression:
            error = (logits[:, 0] - batch["label"]) ** 2
            weight = real.astype(jnp.float32)
            return {"loss": (error * weight).sum(), "weight": weight.sum()}
        sums = cross_entropy_sums(logits, batch["label"].astype(jnp.int32), real)
        del sums["accuracy"]   # reported from the predictions, in percent
        return sums

    def head_predictions(self, logits):
        return logits[:, 0] if self.spec.is_regression else logits.argmax(-1)

    def default_evals(self):
        kind = "regression" if self.spec.is_regression else "classification"
        return {"loss": {}, kind: {"metrics": tuple(self.spec.metrics)}}

    def decode_predictions(self, split, rows):
        examples, order = self.examples(split), sorted(rows)
        return {"index": order,
                "predicted": np.array([rows[i]["prediction"] for i in order]),
                "labels": np.array([examples[i]["label"] for i in order])}


# --------------------------------------------------------------------- tagging --

@register("tagging")
class TaggingTask(FinetuneTask):
    """`labels`: tag id + 1 on a word's first sub-token, 0 (not scored) elsewhere."""

    @functools.cached_property
    def _sentences(self) -> dict[str, list[dict]]:
        data = self.config.data
        files = conllu.split_files(data.path, dict(data.get("splits") or {}) or None)
        return conllu.read_splits(files, data.tag_column or None,
                                  data.get("format", "conllu"), data.get("word_column", 0))

    @functools.cached_property
    def tags(self) -> tuple[str, ...]:
        data = self.config.data
        return tag_set((s for split in self._sentences.values() for s in split),
                       data.tag_column, data.get("format", "conllu"))

    def read_examples(self, split: str) -> Sequence[dict]:
        return select(f"conllu {self.config.data.path}", self._sentences, split)

    def training_texts(self):
        for example in self.examples("train"):
            yield " ".join(example["words"])

    def unlabelled_texts(self):
        return [[" ".join(sentence["words"])] for sentence in self.read_examples("train")]

    @property
    def sequence_keys(self):
        return ("input_ids", "token_type_ids", "labels")

    def featurize(self, split):
        tag_ids = {tag: i for i, tag in enumerate(self.tags)}
        rows, truncated = [], 0
        for example in self.examples(split):
            ids, word_of = self.vocab.encode_words(example["words"])
            ids, word_of = ids[:self.max_length - 2], word_of[:self.max_length - 2]
            labels, seen = [0], set()
            for w in word_of:
                first = w is not None and w not in seen
                seen.add(w)
                labels.append(tag_ids[example["tags"][w]] + 1 if first else 0)
            truncated += len(example["words"]) - len(seen)
            ids = [self.vocab.cls_id] + ids + [self.vocab.sep_id]
            rows.append({"input_ids": np.asarray(ids, np.int32),
                         "token_type_ids": np.zeros(len(ids), np.int32),
                         "labels": np.asarray(labels + [0], np.int32)})
        if truncated:
            logging.warning("tagging: %d words lie beyond max_seq_length=%d sub-tokens "
                            "(or normalize to nothing); they count as errors.", truncated,
                            self.max_length)
        return rows

    def make_model(self):
        return BertForTokenClassification(self.model_config, num_labels=len(self.tags))

    def head_sums(self, logits, batch, real):
        labels = batch["labels"]
        sums = cross_entropy_sums(logits, jnp.maximum(labels - 1, 0), labels > 0)
        del sums["accuracy"]
        return sums

    def head_predictions(self, logits):
        return logits.argmax(-1)

    def default_evals(self):
        evals = {"loss": {}, "tagging": {}}
        if classification_metrics.is_bio(self.tags):
            evals["entity_f1"] = {}
        return evals

    def decode_predictions(self, split, rows):
        """A word beyond the sequence length is predicted as None (wrong)."""
        examples, featurized = self.examples(split), self.rows(split)
        predicted_tags, gold_tags = [], []
        for index in sorted(rows):
            first = np.flatnonzero(featurized[index]["labels"])
            tags = [self.tags[int(t)] for t in rows[index]["prediction"][first]]
            gold = examples[index]["tags"]
            predicted_tags.append(tags + [None] * (len(gold) - len(tags)))
            gold_tags.append(gold)
        return {"index": sorted(rows), "predicted_tags": predicted_tags,
                "gold_tags": gold_tags}


# ----------------------------------------------------------------------- SQuAD --

@register("squad")
class SquadTask(FinetuneTask):
    """Span QA on windows of long contexts; EM/F1 by the official evaluator."""

    evaluation_overrides = FinetuneTask.evaluation_overrides + (
        "data.eval_articles", "data.n_best", "data.max_answer_length")

    def __init__(self, config, workdir):
        data = config.data
        self.window_config = squad_windows.WindowConfig(
            max_seq_length=data.max_seq_length, doc_stride=data.doc_stride,
            max_query_length=data.max_query_length)
        super().__init__(config, workdir)

    def read_examples(self, split: str) -> list[squad_windows.QAExample]:
        data = self.config.data
        articles = {"train": data.train_articles, "validation": data.eval_articles}
        if data.path:  # the split and, from the catalog, whole ones: `config_schema`
            return squad_json.read_split(data.path, articles[split])
        source = sources.load_source(squad_json.CATALOG, split, data.data_dir or None)
        return [squad_json.from_features(source[i]) for i in range(len(source))]

    def training_texts(self):
        for example in self.examples("train"):
            yield example.question
            yield example.context

    @cached_method
    def windows(self, split: str) -> list[dict]:
        return squad_windows.windows_for(self.examples(split), self.vocab, self.window_config)

    def featurize(self, split):
        return [{"input_ids": w["input_ids"], "token_type_ids": w["token_type_ids"],
                 "start_positions": w["start_position"], "end_positions": w["end_position"]}
                for w in self.windows(split)]

    def make_model(self):
        return BertForQuestionAnswering(self.model_config)

    def head_sums(self, logits, batch, real):
        start, end = logits
        padding = batch["input_ids"] == 0
        sums = [cross_entropy_sums(jnp.where(padding, -1e9, x), batch[key], real)
                for x, key in ((start, "start_positions"), (end, "end_positions"))]
        return {"loss": (sums[0]["loss"] + sums[1]["loss"]) / 2, "weight": sums[0]["weight"]}

    def head_predictions(self, logits):
        return logits

    def default_evals(self):
        return {"loss": {}, "squad": {}}

    def decode_predictions(self, split, rows):
        """Each question's best answer over its windows, and the official JSON."""
        examples, windows = self.examples(split), self.windows(split)
        if len(rows) != len(windows):
            raise RuntimeError(f"squad: {len(rows)} predicted windows of {len(windows)}.")
        start = [rows[i]["prediction"][0] for i in range(len(windows))]
        end = [rows[i]["prediction"][1] for i in range(len(windows))]
        answers = squad_windows.predict_answers(
            examples, windows, start, end, n_best=self.config.data.n_best,
            max_answer_length=self.config.data.max_answer_length)
        return {"answers": answers, "dataset": squad_windows.squad_json(examples)}
