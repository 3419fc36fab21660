"""The experiment families: each binds a model, its inputs, its loss and its
evaluation, behind the `Task` interface of `base` that the train loop drives.

  translation       the encoder-decoder Transformer on parallel text
  bert_pretraining  BERT's masked LM and next-sentence prediction on raw documents
  finetune          BERT fine-tuning: GLUE classification and regression,
                    token tagging, SQuAD span question answering
  bert_backbone     the BERT a task starts from: its architecture and vocabulary

`build_task(config, workdir)` returns the task `config.task` names.
"""

from bert_jax.tasks.base import Task, build_task, register
from bert_jax.tasks import bert_pretraining, finetune, translation  # noqa: F401  (register)

__all__ = ["Task", "build_task", "register"]
