"""Datasets (built-in corpora generated in memory, local files read directly,
tfds builders in `array_record` format read without TensorFlow) and grain
input pipelines with static shapes and checkpointable state."""

from bert_jax.data.parallel_text import ParallelText, parallel_text_config
from bert_jax.data.pipeline import (
    EvalBatches,
    eval_batches,
    num_filtered,
    train_iterator,
)
from bert_jax.data.sources import load_source

__all__ = [
    "EvalBatches",
    "ParallelText",
    "eval_batches",
    "load_source",
    "num_filtered",
    "parallel_text_config",
    "train_iterator",
]
