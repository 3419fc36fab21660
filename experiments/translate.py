r"""Translation with the encoder-decoder Transformer.

  python launch/train.py --config=experiments/translate.py[:VARIANT] --workdir=DIR
  python launch/evaluate.py --workdir=DIR \
      --config.data.eval_split=test --config.data.bleu_examples=1000

Variants:
  (default)  the built-in synthetic corpus (`synthetic_translation`: reordering,
             gender/number agreement; 50k training pairs), a small model that
             learns it on a laptop CPU. Result: see docs/RESULTS.md.
  multi30k   Multi30k de->en from ../shared/data/multi30k (`multi30k_en_de` for
             en->de); a small Transformer for 29k pairs, sized for an hour of a
             2-core CPU: 3,000 steps of 64 packed rows of 64 pieces, learning
             rate 2e-3 after 400 warmup steps, cosine decay to 0; checkpoints
             every 250 steps, the last 5 kept for
               python launch/evaluate.py --workdir=DIR --average_last=5 \
                   --save_average=DIR_avg --config.data.eval_split=test
             Result: test_2016_flickr sacreBLEU 41.9 (mean of seeds 0 and 1, the
             last checkpoint; the average of the last 5: 41.8), 64-70 min of
             training each on a shared 2-core CPU (docs/RESULTS.md).
  wmt_base, wmt_big
             WMT'14 en->de from the tfds catalog with Vaswani et al. (2017)
             hyperparameters, for accelerators.
"""

import os

import ml_collections

from bert_jax.errors import ConfigError  # a user error: `error: ...`, no traceback

SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                           "shared", "data")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "default"
    config = ml_collections.ConfigDict()
    config.task = "translation"
    config.seed = 0
    config.init_from = ""
    config.evals = ()              # evaluators by name (evaluation/evaluators.py); (): the task's
    config.peak_flops = 0.0

    config.model = ml_collections.ConfigDict(dict(
        vocab_size=512,   # replaced by the trained vocabulary's size
        hidden_size=128, num_heads=4, mlp_dim=512, num_layers=3, max_len=64,
        dropout_rate=0.1, attention_dropout_rate=0.0, norm_position="pre",
        position="sinusoidal", share_embeddings=True, tie_output=True,
        # Run-time choices (any value restores the same checkpoints, except
        # scan_layers, which stacks them): attention kernel ('einsum', 'flash'
        # = the platform's, 'xla', 'cudnn', 'splash'), rematerialisation
        # policy, layers as one nn.scan; compute dtype ('auto': bfloat16 where
        # the hardware computes it natively, else float32; see
        # bert_jax/auto_dtype.py).
        attention_impl="einsum", remat="none", scan_layers=False, dtype="auto"))

    config.data = ml_collections.ConfigDict(dict(
        builder="synthetic_translation",
        builder_kwargs=dict(max_clauses=2, num_train=50000, num_validation=1000,
                            num_test=1000),
        data_dir="",
        source_key="source", target_key="target",
        vocab_size=512, vocab_type="unigram", vocab_sample=200_000,
        eval_split="validation",
        bleu_examples=200,
        max_length=64,     # longer pairs are dropped from training (and counted)
        pack_length=0,     # > 0: training rows this long, each packing several pairs
        batch_tokens=0,    # > 0: training rows = batch_tokens // (pack or max) length
        label_smoothing=0.1))

    config.decode = ml_collections.ConfigDict(dict(
        beam_size=4, alpha=0.6, max_length=64, batch_size=100))

    config.train = ml_collections.ConfigDict(dict(
        batch_size=64, num_steps=1400, grad_accum_steps=1,
        log_every=100, eval_every=700, checkpoint_every=700,
        keep_last=2, keep_best=1, best_metric="eval/bleu", best_mode="max",
        async_saves=True, device_prefetch=2, dropout_prng="threefry",
        profile_steps=()))  # (START, END): a jax.profiler trace into WORKDIR/profile

    config.optimizer = ml_collections.ConfigDict(dict(
        learning_rate=2e-3, schedule="rsqrt", warmup_steps=400, weight_decay=0.0,
        b1=0.9, b2=0.98, eps=1e-9, max_grad_norm=1.0))

    # shape: (data, fsdp, tensor) within a slice; dcn_shape: across slices (TPU
    # multi-slice), data-parallel by default. -1 takes the remaining devices.
    config.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1, 1), dcn_shape=(-1, 1, 1)))

    if variant in ("multi30k", "multi30k_en_de"):
        source, target = ("de", "en") if variant == "multi30k" else ("en", "de")
        config.data.builder_kwargs = ml_collections.ConfigDict(dict(
            path=os.path.join(SHARED_DATA, "multi30k"), source_language=source,
            target_language=target))
        # Training rows of 64 slots, each packing several pairs (of at most 40
        # pieces a side): more pairs a step than 128 padded rows of 40, at
        # fewer slots (1.0 steps/s against 0.8 measured on the 2-core CPU).
        config.data.update(dict(
            builder="parallel_text",
            source_key="source", target_key="target", vocab_size=8000,
            bleu_examples=1014, max_length=40, pack_length=64))
        config.model.update(dict(hidden_size=256, num_heads=4, mlp_dim=1024,
                                 num_layers=3, dropout_rate=0.2))
        config.decode.update(dict(max_length=40))
        # Sized for an hour of a 2-core CPU: 3,000 steps, the learning rate
        # decayed to 0 by the last; the last 5 checkpoints (250 apart) for
        # `evaluate.py --average_last=5`, the best by validation BLEU kept too.
        config.train.update(dict(batch_size=64, num_steps=3000, eval_every=500,
                                 checkpoint_every=250, keep_last=5))
        config.optimizer.update(dict(learning_rate=2e-3, schedule="cosine",
                                     warmup_steps=400))
    elif variant in ("wmt_base", "wmt_big"):
        big = variant == "wmt_big"
        config.data.builder_kwargs = ml_collections.ConfigDict()
        config.data.update(dict(
            builder="wmt14_translate/de-en", source_key="en",
            target_key="de", vocab_size=32000, bleu_examples=3000,
            eval_split="validation", max_length=256,
            # Packed rows; 128 rows x 256 slots hold about 25k tokens a side,
            # the paper's batch.
            pack_length=256, batch_tokens=32768))
        config.model.update(dict(
            hidden_size=1024 if big else 512, num_heads=16 if big else 8,
            mlp_dim=4096 if big else 2048, num_layers=6, max_len=256,
            dropout_rate=0.3 if big else 0.1, norm_position="post",
            # dtype 'auto' gives bfloat16 compute (float32 parameters) on
            # accelerators; the flash kernels: splash on TPU; on GPU, cuDNN
            # cannot take packed rows: add --config.data.pack_length=0 or
            # --config.model.attention_impl=xla.
            attention_impl="flash"))
        config.decode.update(dict(max_length=256, batch_size=256))
        config.train.update(dict(batch_size=128,  # evaluation rows
                                 num_steps=300000 if big else 100000,
                                 eval_every=5000, checkpoint_every=5000))
        config.optimizer.update(dict(learning_rate=1e-3, warmup_steps=4000))
    elif variant != "default":
        raise ConfigError(f"experiments/translate.py: unknown variant {variant!r}; use "
                          "'' (default), multi30k, multi30k_en_de, wmt_base or wmt_big.")
    return config


def get_sweep() -> list[dict]:
    """Heads x layers of the default experiment (8 runs), the sweep of
    docs/RESULTS.md; `launch/sweep.py` uses it when `--sweep` is not given:

      python launch/sweep.py --config=experiments/translate.py --workdir=DIR \
          --metric=eval/bleu --config.train.num_steps=200
    """
    from bert_jax.analysis import sweeps
    return sweeps.product(sweeps.sweep("model.num_heads", [1, 2, 4, 8]),
                          sweeps.sweep("model.num_layers", [1, 2]))
