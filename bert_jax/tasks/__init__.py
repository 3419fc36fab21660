"""Experiment families: each binds a model, its inputs, its loss and its evaluation."""

from bert_jax.tasks.base import Task, build_task, register
from bert_jax.tasks import bert_pretraining, finetune, translation  # noqa: F401  (register)

__all__ = ["Task", "build_task", "register"]
