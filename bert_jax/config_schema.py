"""The rules a config must satisfy, declared in one place.

A config (`experiments/*.py`, `ml_collections.ConfigDict`) is checked here field
by field: `CHOICES` (the names a field may take), `AT_LEAST` (the smallest value
of a count), and the rules a table cannot state (`RULES`: ranges and rules
across fields, small named functions). `config_problems(config)` lists every broken rule, one line each,
naming the field, its value and the fix; `check_config(config)` raises them
together as one `ConfigError`. The trainer runs them in `check_training_config`
(with the checks that need the task, the data paths or the devices), and
`launch/compile.py` before it compiles.

The modules that read a chosen name (the optimizer, the schedule, the dropout
generator, the attention kernel) name it through `choice`, so that a direct
caller gets the same one-line message. The name tuples live here, beside their
rules, and those modules import them from here. This module imports only
`bert_jax.errors`, so every layer may use it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from bert_jax.errors import ConfigError

DROPOUT_PRNGS = ("threefry", "rbg", "unsafe_rbg")   # jax.random's implementations
SCHEDULES = ("constant", "linear", "cosine", "rsqrt", "poly")
OPTIMIZERS = ("adamw", "lamb")
ATTENTION_IMPLS = ("einsum", "xla", "cudnn", "splash", "flash")  # modeling.fused_attention
MESH_AXES = ("data", "fsdp", "tensor")  # config.mesh.shape (training.sharding)

# field -> the names it may take (a field the config lacks is not checked).
CHOICES = {
    "train.dropout_prng": DROPOUT_PRNGS,
    "optimizer.schedule": SCHEDULES,
    "optimizer.name": OPTIMIZERS,
}
# field -> (its smallest value, what that value means).
AT_LEAST = {
    "train.num_steps": (1, ""), "train.log_every": (1, ""), "train.eval_every": (1, ""),
    "train.checkpoint_every": (1, ""), "train.grad_accum_steps": (1, ""),
    "data.max_length": (1, ""), "data.train_examples": (0, " (0: the whole training split)"),
}


def unknown(field: str, value: Any, choices: Sequence[str]) -> str:
    """The line for a name that is not among `choices`."""
    return f"{field}={value!r}: unknown; choose one of {list(choices)}."


def choice(field: str, value: Any, choices: Sequence[str]) -> Any:
    """`value` if it is one of `choices`, else a one-line `ConfigError` naming
    `field` (e.g. 'config.train.dropout_prng') and the choices."""
    if value not in choices:
        raise ConfigError(unknown(field, value, choices))
    return value


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """`config.mesh.shape` `(data, fsdp, tensor)` with its -1 replaced by the
    devices left, checked to use exactly `num_devices` (a fact of the run)."""
    shape = tuple(int(s) for s in shape)
    known = math.prod(s for s in shape if s != -1)
    problem = None
    if len(shape) != len(MESH_AXES):
        problem = f"mesh shape {shape} must give sizes for {MESH_AXES}."
    elif shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        problem = (f"mesh shape {shape}: sizes must be positive, with at most one -1 "
                   "(the rest of the devices).")
    elif -1 in shape and num_devices % known:
        problem = f"mesh shape {shape}: {num_devices} devices are not divisible by {known}."
    else:
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
        if math.prod(shape) != num_devices:
            problem = (f"mesh shape {shape} uses {math.prod(shape)} devices but "
                       f"{num_devices} are available; use -1 for one axis.")
    if problem:
        raise ConfigError(problem)
    return shape


def profile_range(steps: Sequence[int | str] | None, field: str
                  ) -> tuple[int, int] | None:
    """`(start, end)` of a config or flag value (numbers or text; `field` names
    it, e.g. 'config.train.profile_steps'); empty: None."""
    if not steps:
        return None
    try:
        start, end = (int(step) for step in steps)
    except ValueError:  # not two numbers
        start, end = 0, 0
    if not 1 <= start <= end:
        raise ConfigError(f"{field}={tuple(steps)}: give (START, END) with "
                          "1 <= START <= END, e.g. (10, 12).")
    return start, end


def _get(config, path: str) -> Any:
    """`config.A.B` for 'A.B', None where a section or field is missing."""
    for key in path.split("."):
        config = config.get(key) if hasattr(config, "get") else None
    return config


def _warmup(config) -> list[str]:
    """`optimizer.warmup_steps` within the run, unless `warmup_fraction` (> 0)
    replaces it; the fraction in [0, 1)."""
    optimizer, steps = config.optimizer, config.train.num_steps
    fraction = optimizer.get("warmup_fraction", 0.0)
    problems = []
    if not fraction and not 0 <= optimizer.warmup_steps <= max(steps, 0):
        problems.append(f"config.optimizer.warmup_steps={optimizer.warmup_steps} is outside "
                        f"0..config.train.num_steps={steps}: lower warmup_steps or raise "
                        "num_steps.")
    if not 0 <= fraction < 1:
        problems.append(f"config.optimizer.warmup_fraction={fraction}: must "
                        "be in [0, 1) (0: use warmup_steps).")
    return problems


def _learning_rate(config) -> list[str]:
    rate = config.optimizer.learning_rate
    return ([f"config.optimizer.learning_rate={rate}: must not be negative."]
            if rate < 0 else [])


def _length_buckets(config) -> list[str]:
    """Fine-tuning's row lengths (`data.length_buckets`), each positive."""
    buckets = _get(config, "data.length_buckets") or ()
    return ([f"config.data.length_buckets={tuple(buckets)} must be positive."]
            if any(int(b) <= 0 for b in buckets) else [])


RULES: tuple[Callable[[Any], list[str]], ...] = (
    _warmup, _learning_rate, _length_buckets)


def config_problems(config) -> list[str]:
    """Every rule of this module that `config` breaks, one line each."""
    problems = []
    for field, (least, meaning) in AT_LEAST.items():
        if isinstance(value := _get(config, field), int) and value < least:
            problems.append(f"config.{field}={value}: must be at least {least}{meaning}.")
    problems += [unknown(f"config.{field}", value, names) for field, names in CHOICES.items()
                 if (value := _get(config, field)) is not None and value not in names]
    for rule in RULES:
        problems += rule(config)
    return problems


def refuse(problems: Sequence[str], headline: str = "the config cannot train") -> None:
    """Raises one `ConfigError` of `headline` and `problems`, one a line (none:
    returns): the one report of every config check."""
    if problems:
        raise ConfigError(f"{headline}:\n  " + "\n  ".join(problems))


def check_config(config) -> None:
    """Raises one `ConfigError` listing every problem of `config_problems`."""
    refuse(config_problems(config))
