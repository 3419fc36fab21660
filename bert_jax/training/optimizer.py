"""AdamW with BERT's weight-decay exclusions, learning-rate schedules, clipping.

Weight decay applies to kernels and embedding tables only: never to biases or
LayerNorm parameters (google-research/bert `AdamWeightDecayOptimizer`).

Schedules (peak `learning_rate` reached after `warmup_steps` of linear warmup):
  constant  lr
  linear    lr * (1 - (step - warmup) / (total - warmup))      (BERT)
  cosine    lr * 0.5 * (1 + cos(pi * (step - warmup) / (total - warmup)))
  rsqrt     lr * sqrt(warmup / step)                           (Vaswani et al.)
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from bert_jax.modeling.configs import ConfigError

SCHEDULES = ("constant", "linear", "cosine", "rsqrt")
NO_DECAY = ("bias", "scale", "output_bias")


def learning_rate_schedule(name: str, learning_rate: float, warmup_steps: int,
                           total_steps: int) -> optax.Schedule:
    """The named schedule; see the module docstring for the formulas."""
    if name not in SCHEDULES:
        raise ConfigError(f"schedule={name!r}: unknown; choose one of {list(SCHEDULES)}.")
    if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
        raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps "
                         f"({total_steps}) and total_steps > 0.")
    warmup = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
    decay_steps = max(total_steps - warmup_steps, 1)
    if name == "constant":
        after = optax.constant_schedule(learning_rate)
    elif name == "linear":
        after = optax.linear_schedule(learning_rate, 0.0, decay_steps)
    elif name == "cosine":
        after = optax.cosine_decay_schedule(learning_rate, decay_steps)
    else:
        def after(count):
            return learning_rate * jax.numpy.sqrt(
                max(warmup_steps, 1) / jax.numpy.maximum(count + warmup_steps, 1))
    if warmup_steps == 0:
        return after
    return optax.join_schedules([warmup, after], [warmup_steps])


def decay_mask(params: Any) -> Any:
    """True for parameters that take weight decay (not biases, not LayerNorm)."""
    def decays(path, _):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return names[-1] not in NO_DECAY
    return jax.tree_util.tree_map_with_path(decays, params)


def adamw(learning_rate: optax.ScalarOrSchedule, *, weight_decay: float = 0.01,
          b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
          max_grad_norm: float | None = 1.0) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with `decay_mask`."""
    parts = []
    if max_grad_norm:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps,
                             weight_decay=weight_decay, mask=decay_mask))
    return optax.chain(*parts)
