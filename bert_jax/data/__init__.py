"""The data of every experiment: datasets, tokenizers and the grain input
pipelines that turn examples into static-shape batches.

A dataset is a random-access source of examples by name (`load_source`):
built-in corpora generated in memory, local files read directly, or tfds
builders in `array_record` format read without TensorFlow. An example is a
dict of text, numbers or 1-D numpy arrays of token ids. The pipelines
(`train_iterator`, `eval_batches`) make batches, dicts of numpy arrays
`[local_batch, max_length]` (scalar features `[local_batch]`), with
checkpointable state; the tasks (`bert_jax.tasks`) say how to tokenize and
which features a batch holds. Nothing here imports from `bert_jax.modeling` or
`bert_jax.training`.

  sources, splits          datasets by name and their splits
  pipeline, concurrency    the input pipelines, and the threads and worker
                           processes that run them ahead
  vocabulary, wordpiece    SentencePiece (translation) and WordPiece (BERT)
  synthetic_reverse, synthetic_translation, synthetic_documents
                           built-in corpora that let every experiment run anywhere
  parallel_text            a tfds builder of local parallel text (Multi30k, ...)
  pretraining_data, bert_pretraining
                           BERT's pretraining examples and their tfds builder
  glue, conllu, squad_json, squad_windows
                           the fine-tuning data: GLUE TSVs, CoNLL tagging files,
                           SQuAD questions and their BERT windows
  text_files, input_lines, builder_configs
                           shared reading of local files, the screening of a
                           command-line tool's input lines, the builders' base
"""

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
