r"""Tiny encoder-decoder on the built-in `synthetic_reverse` corpus.

A smoke test of the whole engine (data, sharded step, checkpoints, evaluation)
that trains on a laptop CPU in well under a minute:

  python launch/train.py --config=experiments/tiny_translate.py --workdir=/tmp/tiny
  python launch/evaluate.py --workdir=/tmp/tiny

Learning to reverse sequences needs attention; after the default 300 steps the
validation token accuracy is far above chance (1/32), and `eval/bleu` (token
BLEU of beam-search outputs on 64 validation examples) is reported too.
"""

import ml_collections

from bert_jax.errors import ConfigError


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ConfigError(f"unknown variant {arg!r}; tiny_translate.py has none.")
    config = ml_collections.ConfigDict()
    config.task = "translation"
    config.seed = 0
    config.init_from = ""          # params-only restore: pretrained folder or workdir
    config.evals = ()              # evaluators by name (evaluation/evaluators.py); (): the task's
    config.peak_flops = 0.0        # per-device peak FLOP/s for MFU; 0 = table/measured

    config.model = ml_collections.ConfigDict(dict(
        vocab_size=32, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=2,
        max_len=16, dropout_rate=0.0, attention_dropout_rate=0.0,
        position="sinusoidal", norm_position="pre",
        # Run-time choices (any value restores the same checkpoints, except
        # scan_layers, which stacks them): attention kernel ('einsum', 'flash'
        # = the platform's, 'xla', 'cudnn', 'splash'), rematerialisation
        # policy, layers as one nn.scan; compute dtype: float32 here, unlike the
        # other experiments' 'auto' (bfloat16 where the hardware computes it
        # natively): the tests reproduce this run's metrics on another number
        # of devices to 1e-6, which bfloat16's reductions do not.
        attention_impl="einsum", remat="none", scan_layers=False, dtype="float32"))

    config.data = ml_collections.ConfigDict(dict(
        builder="synthetic_reverse",   # built in, or a tfds name (bert_jax/data/sources.py)
        builder_kwargs=dict(vocab_size=32, min_length=4, max_length=12,
                            num_train=4096, num_validation=256),
        data_dir="",                    # tfds datasets only; '' = the tfds default
        source_key="inputs", target_key="targets",
        vocab_size=0,                   # 0: examples are token ids already
        vocab_type="unigram", vocab_sample=1_000_000,
        eval_split="validation",
        bleu_examples=64,               # beam-search BLEU on this many eval examples
        max_length=16,                  # padded length; longer examples are dropped
        pack_length=0,                  # > 0: pack training pairs into rows this long
        batch_tokens=0,                 # > 0: training rows = batch_tokens // row length
        label_smoothing=0.0))

    config.decode = ml_collections.ConfigDict(dict(
        beam_size=4, alpha=0.6, max_length=16, batch_size=64))

    config.train = ml_collections.ConfigDict(dict(
        batch_size=64, num_steps=300, grad_accum_steps=1,
        log_every=25, eval_every=100, checkpoint_every=100,
        keep_last=2, keep_best=1, best_metric="eval/nll", best_mode="min",
        async_saves=True, dropout_prng="threefry",
        device_prefetch=2,             # batches transferred to the devices ahead
        profile_steps=()))             # (START, END): a jax.profiler trace in WORKDIR/profile

    config.optimizer = ml_collections.ConfigDict(dict(
        learning_rate=3e-3, schedule="rsqrt", warmup_steps=50, weight_decay=0.0,
        b1=0.9, b2=0.98, eps=1e-9, max_grad_norm=1.0))

    # (data, fsdp, tensor); -1 takes the remaining devices.
    # shape: (data, fsdp, tensor) within a slice; dcn_shape: across slices (TPU
    # multi-slice), data-parallel by default. -1 takes the remaining devices.
    config.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1, 1), dcn_shape=(-1, 1, 1)))
    return config
