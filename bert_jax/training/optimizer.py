"""AdamW or LAMB with BERT's weight-decay exclusions, learning-rate schedules, clipping.

Weight decay applies to kernels and embedding tables only: never to biases or
LayerNorm parameters (google-research/bert `AdamWeightDecayOptimizer`).

Schedules (peak `learning_rate` reached after `warmup_steps` of linear warmup):
  constant  lr
  linear    lr * (1 - (step - warmup) / (total - warmup))      (Hugging Face's)
  cosine    lr * 0.5 * (1 + cos(pi * (step - warmup) / (total - warmup)))
  rsqrt     lr * sqrt(warmup / step)                           (Vaswani et al.)
  poly      lr * (1 - step / total) ** decay_power             (BERT, NVIDIA's LAMB)

`linear` decays from the peak, as Hugging Face's `get_linear_schedule_with_warmup`.
google-research/bert's decay is `poly` with `decay_power=1.0`: optimization.py
`create_optimizer` decays over all `num_train_steps` (`tf.train.polynomial_decay(init_lr,
global_step, num_train_steps, end_learning_rate=0.0, power=1.0)`), and its warmup
replaces the first `num_warmup_steps` of that decay.

`poly` is NVIDIA DeepLearningExamples@729963d's `PolyWarmUpScheduler`
(PyTorch/LanguageModeling/BERT/schedulers.py:133-136, degree 0.5 by default at
line 114, which run_pretraining.py:431-435 keeps): progress = step / total,
warmup lr * progress / warmup_fraction, then lr * (1 - progress) ** degree.
Its decay starts at lr * (1 - warmup / total) ** degree, not lr: a drop after
the warmup that is NVIDIA's too. Its `step` is 1 at the first update
(schedulers.py:123-128); here `step` is optax's count of updates done (0 at the
first), as for every schedule above.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax

from bert_jax.modeling.layers import SCANNED_LAYERS

NO_DECAY = ("bias", "scale", "output_bias")


def learning_rate_schedule(name: str, learning_rate: float, warmup_steps: int,
                           total_steps: int, decay_power: float = 0.5) -> optax.Schedule:
    if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
        raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps "
                         f"({total_steps}) and total_steps > 0.")
    warmup = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
    decay_steps = max(total_steps - warmup_steps, 1)
    after = {  # `name`: checked by config_schema (SCHEDULES) at the command's start
        "constant": optax.constant_schedule(learning_rate),
        "linear": optax.linear_schedule(learning_rate, 0.0, decay_steps),
        "cosine": optax.cosine_decay_schedule(learning_rate, decay_steps),
        # lr * (1 - (count + warmup) / total) ** power, count from the join
        "poly": optax.polynomial_schedule(
            learning_rate * (1 - warmup_steps / total_steps) ** decay_power, 0.0,
            decay_power, decay_steps),
        "rsqrt": lambda count: learning_rate * jax.numpy.sqrt(
            max(warmup_steps, 1) / jax.numpy.maximum(count + warmup_steps, 1)),
    }[name]
    if warmup_steps == 0:
        return after
    return optax.join_schedules([warmup, after], [warmup_steps])


def decay_mask(params: Any, scanned: bool | None = None) -> Any:
    """True where weight decay applies; `scanned` True/False: only inside/outside
    an `nn.scan` stack ('layers')."""
    def decays(path, _):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return names[-1] not in NO_DECAY and scanned in (None, SCANNED_LAYERS in names)
    return jax.tree_util.tree_map_with_path(decays, params)


def _per_layer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """A stateless `tx` applied to each layer of a scanned stack (leading axis)."""
    def update(updates, state, params=None):
        if jax.tree.leaves(updates):  # (vmap needs an array: a model without a stack)
            updates = jax.vmap(lambda u, p: tx.update(u, state, p)[0])(updates, params)
        return updates, state
    return optax.GradientTransformation(tx.init, update)


def make_optimizer(name: str, learning_rate: optax.ScalarOrSchedule, *,
                   weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-6, max_grad_norm: float | None = 1.0
                   ) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW or LAMB, both with `decay_mask`.

    LAMB (You et al. 2019) is `optax.lamb`'s chain with the layer-wise trust
    ratio on the decayed parameters only: biases and LayerNorm get Adam's update
    (eps outside the square root in both), as the references agree. NVIDIA's
    FusedLAMB applies the trust ratio only where weight decay != 0, unless
    use_nvlamb (DeepLearningExamples@729963d,
    PyTorch/LanguageModeling/BERT/lamb_amp_opt/csrc/multi_tensor_lamb.cu:274-282),
    and run_pretraining.py:423-427 gives biases and LayerNorm decay 0. The
    paper's code (tensorflow_addons optimizers/lamb.py; albert@b772393
    lamb_optimizer.py:61-64) excludes from the trust ratio what it excludes from
    decay, and ALBERT (optimization.py:82-90) excludes LayerNorm and bias. We
    follow the paper's code: one mask by name, so weight_decay=0 keeps the trust
    ratio (NVIDIA's kernel would drop it everywhere). NVIDIA's defaults are ours:
    betas (0.9, 0.999), eps 1e-6, clipping to global norm 1.0 before the moments
    (fused_lamb.py:13-17, multi_tensor_lamb.cu:79,137). One trust ratio per
    tensor, and per layer of an `nn.scan` stack, so scanning does not change the
    update; one moment tree serves both groups (optax.multi_transform would keep two).
    """
    parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
    if name == "adamw":
        return optax.chain(*parts, optax.adamw(
            learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask))
    assert name == "lamb", name  # config_schema.OPTIMIZERS: checked at the command's start
    trust = optax.scale_by_trust_ratio()
    return optax.chain(*parts, optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        optax.masked(trust, lambda p: decay_mask(p, scanned=False)),
        optax.masked(_per_layer(trust), lambda p: decay_mask(p, scanned=True)),
        optax.scale_by_learning_rate(learning_rate)))


def optimizer_from_config(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """`make_optimizer` of `config.optimizer` over `config.train.num_steps`;
    warmup_fraction > 0 overrides warmup_steps."""
    opt, train = config.optimizer, config.train
    fraction = opt.get("warmup_fraction", 0.0)
    warmup = round(fraction * train.num_steps) if fraction > 0 else opt.warmup_steps
    schedule = learning_rate_schedule(
        opt.schedule, opt.learning_rate, warmup, train.num_steps, opt.get("decay_power", 0.5))
    return make_optimizer(
        opt.get("name", "adamw"), schedule, weight_decay=opt.weight_decay, b1=opt.b1,
        b2=opt.b2, eps=opt.eps, max_grad_norm=opt.max_grad_norm)
