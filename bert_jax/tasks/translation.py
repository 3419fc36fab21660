"""Translation: the encoder-decoder Transformer on parallel text.

Batches are `{'inputs': [batch, length], 'targets': [batch, length]}` int32,
padded with 0; `targets` end with EOS. The loss is (label-smoothed)
cross-entropy over real target tokens; evaluation reports the unsmoothed
negative log-likelihood per token (`nll`) and token accuracy.
"""

from __future__ import annotations

import numpy as np

from bert_jax.data import pipeline, sources
from bert_jax.modeling import Transformer, TransformerConfig
from bert_jax.tasks.base import Batch, Task, register
from bert_jax.training.flops import transformer_train_flops
from bert_jax.training.losses import cross_entropy_sums


@register("translation")
class TranslationTask(Task):

    def __init__(self, config):
        super().__init__(config)
        self.model_config = TransformerConfig(**config.model.to_dict())
        self.model = Transformer(self.model_config)
        self.max_length = config.data.max_length
        self.model_config.check_length(self.max_length, "config.data.max_length")

    def _source(self, split: str):
        data = self.config.data
        return sources.load_source(data.builder, split, data.data_dir or None,
                                   **data.builder_kwargs.to_dict())

    def dummy_batch(self) -> Batch:
        zeros = np.zeros((1, self.max_length), np.int32)
        return {"inputs": zeros, "targets": zeros}

    def model_inputs(self, batch: Batch) -> tuple:
        return batch["inputs"], batch["targets"]

    def train_iterator(self, process_index: int, process_count: int):
        return pipeline.train_iterator(
            self._source("train"), global_batch_size=self.config.train.batch_size,
            seed=self.config.seed, process_index=process_index,
            process_count=process_count, preprocess=pipeline.translation_preprocess,
            max_length=self.max_length)

    def eval_batches(self, process_index: int, process_count: int):
        return pipeline.eval_batches(
            self._source("validation"), global_batch_size=self.config.train.batch_size,
            process_index=process_index, process_count=process_count,
            preprocess=pipeline.translation_preprocess, max_length=self.max_length)

    def _sums(self, params, batch, rng=None, label_smoothing=0.0):
        deterministic = rng is None
        logits = self.model.apply(
            {"params": params}, batch["inputs"], batch["targets"],
            deterministic=deterministic, rngs=None if deterministic else {"dropout": rng})
        weights = batch["targets"] != self.model_config.pad_id
        return cross_entropy_sums(logits, batch["targets"], weights, label_smoothing)

    def loss_fn(self, params, batch, rng):
        sums = self._sums(params, batch, rng, self.config.data.label_smoothing)
        loss, weight = sums.pop("loss"), sums.pop("weight")
        return loss, weight, sums

    def eval_sums(self, params, batch):
        sums = self._sums(params, batch)
        del sums["loss"]
        return sums

    def flops_per_step(self) -> float:
        return transformer_train_flops(self.model_config, self.config.train.batch_size,
                                       self.max_length, self.max_length)

    def tokens_per_step(self) -> float:
        return 2.0 * self.config.train.batch_size * self.max_length
