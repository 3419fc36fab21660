"""Translation: the encoder-decoder Transformer on parallel text.

Examples: the dataset `data.builder` with `data.builder_kwargs`
(`sources.load_source`), as text (`data.source_key`, `data.target_key`)
tokenized with the workdir's SentencePiece vocabulary (`data.vocab_size`
pieces, trained on first use), or as token ids (`data.vocab_size = 0`).

Batches: `{'inputs', 'targets'}` `[batch, data.max_length]` int32, 0-padded,
ending with EOS. With `data.pack_length > 0`, training rows pack several pairs,
with `*_segmentation` and `*_positions` (`bert_jax.data.pipeline`);
`data.batch_tokens > 0` makes a training batch `batch_tokens // row_length`
rows (evaluation batches stay `train.batch_size` unpacked rows). Evaluation:
per-token NLL and accuracy, and with `data.bleu_examples > 0` sacreBLEU and
chrF of beam-search translations (`decode.*`) into `WORKDIR/samples/<step>.jsonl`.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.data import pipeline, sources, vocabulary
from bert_jax.data.text_files import as_text
from bert_jax.data.input_lines import shorten
from bert_jax.errors import DataError
from bert_jax.evaluation.decoding import transformer_search
from bert_jax.modeling import Transformer, TransformerConfig
from bert_jax.modeling.flops import transformer_train_flops
from bert_jax.modeling.losses import cross_entropy_sums
from bert_jax.tasks.base import (
    Batch, Task, cached_method, holds_checkpoints, register, written_by_process_zero)


_PACKING_FEATURES = ("inputs_segmentation", "targets_segmentation",
                     "inputs_positions", "targets_positions")
MAX_ID_DIGITS = 9  # an id written as text: below 10**9, an int32 (and no huge int())


def _is_id(token: str) -> bool:
    """Whether `token` is an id written in ASCII digits (not '²', not 10**200000)."""
    return token.isascii() and token.isdigit() and len(token) <= MAX_ID_DIGITS


@register("translation")
class TranslationTask(Task):

    model_config_class = TransformerConfig
    supports_abstract = True
    evaluation_overrides = ("data.bleu_examples", "data.builder_kwargs.path", "decode.")
    model_keywords = _PACKING_FEATURES

    def __init__(self, config, workdir, abstract=False):
        super().__init__(config, workdir, abstract)
        self.max_length = config.data.max_length
        self.pack_length = config.data.get("pack_length", 0)
        self.row_length = self.pack_length or self.max_length

    def declared_model_config(self) -> TransformerConfig:
        values = self.config.model.to_dict()
        if self.config.data.vocab_size:  # the size the vocabulary is trained to
            values["vocab_size"] = self.config.data.vocab_size
        model_config = TransformerConfig(**values)
        model_config.check_length(self.max_length, "config.data.max_length")
        return model_config

    @functools.cached_property
    def model_config(self) -> TransformerConfig:
        declared = self.declared_model_config()
        return declared.replace(vocab_size=self.vocab.size) if self.vocab else declared

    def make_model(self):
        return Transformer(self.model_config)

    @functools.cached_property
    def batch_rows(self) -> int:
        """`train.batch_size`, or `data.batch_tokens // row_length`."""
        tokens = self.config.data.get("batch_tokens", 0)
        if not tokens:
            return self.config.train.batch_size
        return tokens // self.row_length  # whole rows: `config_schema`

    # -- data ------------------------------------------------------------------

    @functools.cached_property
    def vocab(self) -> vocabulary.Vocabulary | None:
        """The workdir's vocabulary, trained on first use; None: the examples are
        ids (`data.vocab_size=0`), or the task is abstract."""
        data = self.config.data
        if not data.vocab_size or self.abstract:
            return None
        return written_by_process_zero(
            lambda is_writer: vocabulary.load_or_train(
                self.workdir, self._training_texts(), data.vocab_size,
                model_type=data.vocab_type, is_writer=is_writer,
                checkpointed=holds_checkpoints(self.workdir)),
            "vocabulary")

    @cached_method
    def _source(self, split: str):
        data = self.config.data
        return sources.load_source(data.builder, split, data.data_dir or None,
                                   **data.builder_kwargs.to_dict())

    def _training_texts(self):
        source = self._source("train")
        data = self.config.data
        count = min(len(source), data.vocab_sample)
        for index in np.linspace(0, len(source) - 1, count).astype(int):
            example = source[int(index)]
            yield as_text(example[data.source_key])
            yield as_text(example[data.target_key])

    def _encode(self, value) -> np.ndarray:
        if self.vocab is None:  # ids, or ids written as text ("5 3 7")
            if isinstance(value, (str, bytes)):
                tokens = as_text(value).split()
                if not all(_is_id(token) for token in tokens):
                    raise DataError(repr(shorten(as_text(value))), "not ids: this model "
                                    "reads ids written as numbers", "e.g. '5 3 7'")
                value = [int(token) for token in tokens]
            return np.asarray(value, np.int32)
        return np.array(self.vocab.encode(as_text(value)) + [vocabulary.EOS_ID], np.int32)

    def preprocess(self, example) -> Batch:
        data = self.config.data
        return {"inputs": self._encode(example[data.source_key]),
                "targets": self._encode(example[data.target_key])}

    def encode_sources(self, texts: list[str]) -> np.ndarray:
        """Source sentences -> `[n, max_length]` padded ids ending with EOS (kept
        last when a sentence is cut)."""
        inputs = np.zeros((len(texts), self.max_length), np.int32)
        for i, text in enumerate(texts):
            ids = self._encode(text)
            if len(ids) > self.max_length:
                ids = np.append(ids[:self.max_length - 1], ids[-1])
            inputs[i, :len(ids)] = ids
        return inputs

    def source_problems(self, text: str) -> list[str]:
        """What `encode_sources` would do silently to `text`: an empty line,
        ids or pieces the model does not know, a sentence cut at data.max_length."""
        if not text.strip():
            return ["empty line"]
        if self.vocab is None:  # ids written as text
            size = self.model_config.vocab_size
            unknown = [shorten(token) for token in text.split()
                       if not _is_id(token) or int(token) >= size]
            if unknown:
                return [f"unknown ids {' '.join(unknown[:5])} (ids are 0..{size - 1})"]
        ids = self._encode(text)
        problems = []
        if self.vocab is not None and vocabulary.UNK_ID in ids:
            problems.append(f"{int(np.sum(ids == vocabulary.UNK_ID))} piece(s) unknown to "
                            "the vocabulary")
        if len(ids) > self.max_length:
            problems.append(f"{len(ids)} tokens, more than data.max_length="
                            f"{self.max_length}: it would be cut")
        return problems

    def dummy_batch(self) -> Batch:
        zeros = np.zeros((1, self.max_length), np.int32)
        return {"inputs": zeros, "targets": zeros}

    def model_inputs(self, batch: Batch) -> tuple:
        return batch["inputs"], batch["targets"]

    def batch_spec(self, train=True):
        """Training: `batch_rows` rows of `row_length` (packed rows with their
        segmentation and positions); evaluation: `train.batch_size` unpacked rows."""
        rows, length = ((self.batch_rows, self.row_length) if train
                        else (self.config.train.batch_size, self.max_length))
        keys = ("inputs", "targets") + (_PACKING_FEATURES if train and self.pack_length
                                        else ())
        return {key: jax.ShapeDtypeStruct((rows, length), np.int32) for key in keys}

    def train_iterator(self, process_index: int, process_count: int):
        return pipeline.train_iterator(
            self._source("train"), global_batch_size=self.batch_rows,
            seed=self.config.seed, process_index=process_index,
            process_count=process_count, preprocess=self.preprocess,
            max_length=self.max_length, pack_length=self.pack_length)

    def eval_batches(self, process_index: int, process_count: int):
        return pipeline.eval_batches(
            self._source(self.config.data.eval_split),
            global_batch_size=self.config.train.batch_size,
            process_index=process_index, process_count=process_count,
            preprocess=self.preprocess, max_length=self.max_length)

    # -- loss and evaluation ---------------------------------------------------

    def _sums(self, params, batch, rng=None, label_smoothing=0.0, model_kwargs=None):
        logits = self._outputs(params, batch, rng, model_kwargs)
        weights = batch["targets"] != self.model_config.pad_id
        return cross_entropy_sums(logits, batch["targets"], weights, label_smoothing)

    def loss_fn(self, params, batch, rng):
        sums = self._sums(params, batch, rng, self.config.data.label_smoothing)
        return sums.pop("loss"), sums.pop("weight"), sums

    def predict(self, params, batch, model_kwargs=None):
        """Per-token sums: nll (unsmoothed), accuracy; BLEU comes from `generator`."""
        sums = self._sums(params, batch, model_kwargs=model_kwargs)
        del sums["loss"]
        return {"sums": sums}

    def default_evals(self):
        return {"loss": {}, "bleu": {"examples": self.config.data.bleu_examples}}

    def detokenize(self, ids) -> str:
        if self.vocab is not None:
            return self.vocab.decode(ids)
        words = []
        for i in ids:
            if int(i) == self.model_config.eos_id:
                break
            if int(i) != self.model_config.pad_id:
                words.append(str(int(i)))
        return " ".join(words)

    @cached_method
    def _search(self, mesh):
        """Beam search, its output replicated (activations are batch-sharded)."""
        decode = self.config.decode
        model = Transformer(self.model_config, incremental=True)
        return jax.jit(lambda params, inputs: transformer_search(
            model, params, inputs, max_length=decode.max_length,
            beam_size=decode.beam_size, alpha=decode.alpha)[0],
            out_shardings=NamedSharding(mesh, PartitionSpec()))

    def translate(self, params, inputs: np.ndarray, mesh) -> np.ndarray:
        """Best translations `[n, decode.max_length]` of `inputs` `[n, max_length]`
        (every process passes and gets all rows)."""
        batch_size = self.config.decode.batch_size
        replicated = NamedSharding(mesh, PartitionSpec())
        outputs = []
        for start in range(0, len(inputs), batch_size):
            chunk = inputs[start:start + batch_size]
            rows = len(chunk)
            chunk = np.pad(chunk, ((0, batch_size - rows), (0, 0)))  # one compiled shape
            chunk = jax.make_array_from_process_local_data(replicated, chunk)
            outputs.append(np.asarray(jax.device_get(self._search(mesh)(params, chunk)))[:rows])
        return np.concatenate(outputs)

    def generator(self, params, mesh):
        def generate(count: int):
            source = self._source(self.config.data.eval_split)
            examples = [source[i] for i in range(min(count, len(source)))]
            data = self.config.data
            inputs = self.encode_sources([e[data.source_key] for e in examples])
            hypotheses = [self.detokenize(t) for t in self.translate(params, inputs, mesh)]
            text = self.detokenize if self.vocab is None else as_text
            return ([text(e[data.source_key]) for e in examples],
                    [text(e[data.target_key]) for e in examples], hypotheses)
        return generate

    # -- throughput --------------------------------------------------------------

    def flops_per_step(self) -> float:
        return transformer_train_flops(self.model_config, self.batch_rows,
                                       self.row_length, self.row_length)

    def tokens_per_step(self) -> float:
        return 2.0 * self.batch_rows * self.row_length
