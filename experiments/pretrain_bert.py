r"""BERT pretraining: masked-LM + next-sentence prediction (Devlin et al. 2018).

  python launch/train.py --config=experiments/pretrain_bert.py[:VARIANT] --workdir=DIR
  python launch/evaluate.py --workdir=DIR

Fine-tuning starts from the result with `--config.init_from=DIR` (the `bert/`
encoder is restored, the task head initialised; see experiments/finetune.py).

Variants:
  (default)  built-in synthetic documents (`synthetic_documents`: an invented
             language with topical documents), a tiny BERT; runs anywhere in a
             few minutes.
  corpus     ../shared/data/pretrain (Reuters-21578 newswire + WikiText-2
             valid/test articles; 500 documents held out for evaluation), a
             BERT-mini (4 layers, 256 wide) with an 8k uncased WordPiece
             vocabulary trained on the corpus, sequence 128, bfloat16 compute.
             Stays on the masked-LM unigram plateau (MLM accuracy 0.15) for
             a 60-minute CPU budget: see docs/RESULTS.md.
  corpus_phase1, corpus_phase2
             the same corpus and model in two phases, which leave the plateau
             within the 60 minutes. Phase 1: sequence 32 (attention spread
             over 32 tokens, not 128, learns to read the neighbours several
             times sooner), batch 128, random position offsets so that every
             row of the 128-position table is trained, pre-LayerNorm, no
             dropout. Phase 2: sequence 128, batch 32, from phase 1:
               python launch/train.py --config=experiments/pretrain_bert.py:corpus_phase1 --workdir=P1
               python launch/train.py --config=experiments/pretrain_bert.py:corpus_phase2 \
                   --config.init_from=P1 --workdir=P2
             Result: held-out MLM accuracy 0.371 and NSP accuracy 0.871 at
             sequence 128, 47.9 minutes for both on the 2-core CPU (docs/RESULTS.md).
  cpu_phase1, cpu_phase2
             the two phases sized for two hours on a 2-core CPU without bfloat16
             in hardware (AVX2 only, float32 compute), data build included: 2,000
             steps of phase 1, then 1,000 of phase 2, each schedule decaying to 0 at
             its last step. The backbone of the transfer study (docs/RESULTS.md,
             launch/transfer_study.py): fine-tune it with
             `--config.init_from=P2`.
               python launch/train.py --config=experiments/pretrain_bert.py:cpu_phase1 --workdir=P1
               python launch/train.py --config=experiments/pretrain_bert.py:cpu_phase2 \
                   --config.init_from=P1 --workdir=P2
             Result: held-out MLM accuracy 0.321 and NSP accuracy 0.830 at sequence
             128, 84.1 minutes for both on a 2-core AMD EPYC with AVX2 only, shared
             with test runs (docs/RESULTS.md, "Transfer"). AdamW, not LAMB: chosen
             by measurement there (LAMB ties on held-out MLM, fine-tunes worse).
             NSP on, chosen by measurement there: without it
             (`--config.data.next_sentence_prediction=False`) held-out MLM ties,
             UPOS and SST-2 fine-tune a little better, STS-B much worse.
  cpu_bf16_phase1, cpu_bf16_phase2
             the same two phases sized for two hours on a 2-core CPU that computes
             bfloat16 (`avx512_bf16`, which `model.dtype='auto'` picks): 5,000 steps
             of phase 1, then 2,500 of phase 2, 2.5 times the tokens of cpu_phase1/2.
             Result: held-out MLM accuracy 0.411 and NSP accuracy 0.890 at sequence
             128, 85.7 minutes for both on a 2-core AMD EPYC with avx512_bf16, alone
             (docs/RESULTS.md, "Transfer"). Without bfloat16 in hardware it would take
             about two and a half hours: use cpu_phase1/2 there.
  cpu_wiki_phase1, cpu_wiki_phase2
             cpu_phase1/2 (the same model, vocabulary size, phases and steps) on
             English Wikipedia instead of Reuters: ../shared/data/pretrain/
             enwiki_wikiextractor_docs.txt.gz (52.0M words, 20,755 articles, read
             as a gzip stream, one paragraph a line cut into sentences: format
             'paragraphs'), 500 articles held out. Two hours see about 12M of
             its 65M tokens, and cutting all of it into instances would take a
             third of them (the build writes about 0.5 MB/s here), so each phase
             cuts an eighth of the articles into instances (`data.document_sample`,
             chosen by hash, spread over the file, another eighth for each
             sequence length): enough instances for the phase's rows (phase 1
             reads its 234k about once, phase 2 a third of its 99k), each article
             once (dupe_factor 1: masks are drawn afresh every step
             anyway), in shards of 1,000 articles. The vocabulary (8,192
             WordPiece tokens) is trained on a fifth of the articles
             (`data.vocab_sample`; about 10M words, 3.5 times the Reuters corpus),
             its alphabet the 1,000 most frequent characters
             (`data.vocab_limit_alphabet`, as `tokenizers`' BertWordPieceTokenizer
             default): Wikipedia's rare scripts took a third of it otherwise.
             Phase 1 reads positions 0-31 without random offsets (with them it
             stayed on the unigram plateau for all 2,000 steps); phase 2 starts
             positions 32-127 as copies of them (`init_tile_positions=32`,
             Longformer's copy initialization, Beltagy et al. 2020, section 5).
             Result: held-out MLM accuracy 0.231 after phase 1 (sequence 32), 0.248
             and NSP 0.651 after phase 2 (sequence 128), 116.3 minutes for both on
             a 2-core AMD EPYC with AVX2 only, shared with other work
             (docs/RESULTS.md, "Pretrained on breadth").
               python launch/train.py --config=experiments/pretrain_bert.py:cpu_wiki_phase1 --workdir=W1
               python launch/train.py --config=experiments/pretrain_bert.py:cpu_wiki_phase2 \
                   --config.init_from=W1 --workdir=W2
  cpu_wiki_imdb_phase1, cpu_wiki_imdb_phase2
             the same with the 50,000 unlabelled IMDb reviews beside Wikipedia
             (imdb_unsup_docs.txt.gz, 11.5M words): both files whole, so the mix
             is their sizes, 82% Wikipedia and 18% reviews by words; the
             vocabulary's sample is a fifth of each. A domain-adaptive arm for
             movie-review tasks, reported beside cpu_wiki, never instead of it.
  in_task_mlm
             in-task masked-LM pretraining (task-adaptive pretraining, Gururangan
             et al. 2020, arXiv 2004.10964): the masked LM continues from a
             checkpoint (`init_from`, whose architecture and vocabulary it keeps)
             on a task's training text without labels. launch/transfer_study.py
             runs it for a backbone `NAME=in_task_mlm:PATH`, giving the text as
             `corpus_files`. Phase 2's shape (sequence 128, batch 32), masked LM
             only (no NSP: consecutive examples packed into one segment), 400
             steps at lr 2e-4 (phase 2's peak is 5e-4: the checkpoint is
             trained already), 20 documents of 16 examples held out; the time on
             this CPU is in docs/RESULTS.md.
  base_2018, large_2018
             the paper's recipe (Devlin et al. 2018, section A.2): batch 256,
             AdamW lr 1e-4, warmup 10k, 1M steps, sequence 128 (90% of the steps;
             set `--config.data.max_seq_length=512 --config.data.max_predictions_per_seq=80
             --config.init_from=PHASE1_WORKDIR` for the last 10%). On a pod slice it
             keeps one sequence per chip busy: use the LAMB recipes below.
  base_lamb_phase1, base_lamb_phase2, large_lamb_phase1, large_lamb_phase2
             large-batch LAMB in two phases (You et al. 2019, arXiv 1904.00962),
             with NVIDIA's published figures (DeepLearningExamples
             PyTorch/LanguageModeling/BERT/scripts/configs/pretrain_config.sh,
             `dgxa100_8gpu_fp16`: 8192 sequences per GPU x 8 GPUs): phase 1
             global batch 65,536 at sequence 128 with 20 predictions, 7,038 steps,
             lr 6e-3, warmup 28.43% of the steps; phase 2 global batch 32,768 at
             512 with 80 predictions, 1,563 steps, lr 4e-3, warmup 12.8%;
             polynomial decay of power 0.5 after the warmup (NVIDIA's
             PolyWarmUpScheduler), weight decay 0.01, clipping at norm 1.0.
             NVIDIA's TensorFlow recipe (TensorFlow/LanguageModeling/BERT/scripts/
             run_pretraining_lamb.sh, `bert_model` base or large) runs base on the
             same schedule, and so does base here. Whole-word masking (google-research/
             bert's whole-word-masking models: +1-2 F1 on SQuAD). Phase 2 starts from
             phase 1's parameters with a fresh optimizer state (`init_from`).
             The recipe fixes the global batch; size the per-device micro-batch
             and `train.grad_accum_steps` for a slice by compiling, which prints
             the command to run and what the run costs (docs/ACCELERATORS.md):
               python launch/compile.py --config=experiments/pretrain_bert.py:large_lamb_phase1 \
                   --topology=v5e-256 --fit_global_batch --config.data.vocab_file=VOCAB \
                   --config.data.corpus_files="('CORPUS',)"
             then phase 2 the same way, adding --config.init_from=PHASE1_WORKDIR.
  The pod recipes take the bert-base-uncased vocabulary size (30522: give its
  `vocab.txt` as `--config.data.vocab_file`, or a corpus to train one on).
  Continue pretraining an imported checkpoint: `--config.init_from=HF_FOLDER`
  (a Hugging Face BERT folder or one written by launch/convert.py), with
  `--config.data.vocab_file=HF_FOLDER/vocab.txt` and `config.model` matching it.
"""

import os

import ml_collections

from bert_jax.errors import ConfigError  # a user error: `error: ...`, no traceback

SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                           "shared", "data")
# Steps of the two phases that fill two hours of a 2-core CPU, data build included
# (the module docstring): float32 compute (AVX2 only) or bfloat16 (avx512_bf16).
CPU_STEPS = {"cpu_phase1": 2000, "cpu_phase2": 1000, "cpu_bf16_phase1": 5000,
             "cpu_bf16_phase2": 2500, "cpu_wiki_phase1": 2000, "cpu_wiki_phase2": 1000,
             "cpu_wiki_imdb_phase1": 2000, "cpu_wiki_imdb_phase2": 1000}
# The larger corpora of the cpu_wiki variants (../shared/data/README.md), gzip.
WIKIPEDIA, IMDB = "enwiki_wikiextractor_docs.txt.gz", "imdb_unsup_docs.txt.gz"
VARIANTS = ("default", "corpus", "corpus_phase1", "corpus_phase2", *CPU_STEPS, "in_task_mlm",
            "base_2018", "large_2018",
            "base_lamb_phase1", "base_lamb_phase2", "large_lamb_phase1", "large_lamb_phase2")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "default"
    if variant not in VARIANTS:
        raise ConfigError(f"unknown variant {variant!r}; choose one of {VARIANTS}.")
    config = ml_collections.ConfigDict()
    config.task = "bert_pretraining"
    config.seed = 0
    config.init_from = ""          # continue from a checkpoint: HF folder, pretrained, workdir
    config.init_tile_positions = 0  # > 0: position rows from N on start as copies of 0..N-1
    config.evals = ()              # evaluators by name (evaluation/evaluators.py); (): the task's
    config.peak_flops = 0.0

    config.model = ml_collections.ConfigDict(dict(
        hidden_size=128, num_heads=2, mlp_dim=512, num_layers=2, max_len=128,
        vocab_size=1,              # replaced by the vocabulary's size
        norm_position="post", dropout_rate=0.1, attention_dropout_rate=0.1,
        dtype="auto",
        # Run-time choices (any value restores the same checkpoints, except
        # scan_layers, which stacks them): attention kernel ('einsum', 'flash'
        # = the platform's, 'xla', 'cudnn', 'splash'), rematerialisation
        # policy, layers as one nn.scan; compute dtype ('auto': bfloat16 where
        # the hardware computes it natively, else float32; see
        # bert_jax/auto_dtype.py).
        attention_impl="einsum", remat="none", scan_layers=False))

    config.data = ml_collections.ConfigDict(dict(
        corpus_files=(),           # 'path' or 'path:wikitext'; on the command line
                                   # --config.data.corpus_files="('a.txt', 'b.raw:wikitext')"
        synthetic_documents=3000,  # > 0: use built-in documents instead
        data_dir="",
        documents_per_shard=10_000,  # the Beam build's unit of work; random "B"s stay in a shard
        beam_options="",           # Beam flags of the dataset build ('' = local, one worker a core)
        vocab_file="",             # '' = train a WordPiece vocabulary on the corpus
        vocab_size=1000, lowercase=True,
        vocab_sample=1.0,          # the fraction of documents the vocabulary is trained on
        vocab_limit_alphabet=0,    # > 0: only the most frequent characters (others: [UNK])
        document_sample=1.0,       # the fraction of training documents cut into instances
        max_seq_length=128, short_seq_prob=0.1, dupe_factor=5,
        next_sentence_prediction=True,  # False: single segments, masked LM only
        eval_documents=200, eval_split="validation", eval_examples=1024,
        masked_lm_prob=0.15, max_predictions_per_seq=20, whole_word_masking=False,
        train_masked_lm_prob=0.0,  # > 0: training masks this fraction, evaluation 15%
        random_position_offsets=False,  # training rows read positions o..o+length-1
        static_masking=False))     # True: the original's fixed masks per instance

    config.train = ml_collections.ConfigDict(dict(
        batch_size=32, num_steps=600, grad_accum_steps=1,
        input_workers=0,           # > 0: processes reading and masking the training rows
                                   # (the same batches); docs/RESULTS.md sizes them
        log_every=50, eval_every=200, checkpoint_every=200,
        keep_last=2, keep_best=0, best_metric="eval/mlm_accuracy", best_mode="max",
        async_saves=True, device_prefetch=2,
        dropout_prng="threefry",   # or 'rbg'/'unsafe_rbg': XLA's RngBitGenerator draws
                                   # the dropout bits (bert_jax/training/train_step.py);
                                   # 'rbg' pays on TPUs, not on GPUs (docs/ACCELERATORS.md)
        profile_steps=()))  # (START, END): a jax.profiler trace into WORKDIR/profile

    config.optimizer = ml_collections.ConfigDict(dict(
        name="adamw",              # or 'lamb' (bert_jax/training/optimizer.py)
        learning_rate=1e-3, schedule="linear", warmup_steps=60, weight_decay=0.01,
        warmup_fraction=0.0,       # > 0: warmup is this fraction of train.num_steps
        decay_power=0.5,           # schedule 'poly': lr * (1 - step / num_steps) ** power
        b1=0.9, b2=0.999, eps=1e-6, max_grad_norm=1.0))

    # shape: (data, fsdp, tensor) within a slice; dcn_shape: across slices (TPU
    # multi-slice), data-parallel by default. -1 takes the remaining devices.
    config.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1, 1), dcn_shape=(-1, 1, 1)))

    if variant == "in_task_mlm":   # corpus_files: the task's text (the module docstring)
        config = get_config("corpus_phase2")
        config.data.update(dict(corpus_files=(), next_sentence_prediction=False,
                                dupe_factor=1, eval_documents=20, eval_examples=512))
        config.train.update(dict(num_steps=400, log_every=50, eval_every=200,
                                 checkpoint_every=200))
        config.optimizer.update(dict(learning_rate=2e-4, warmup_steps=40))
        return config
    if variant in CPU_STEPS:  # corpus_phase1/2, shorter (the module docstring)
        phase2 = variant.endswith("2")
        config = get_config("corpus_phase2" if phase2 else "corpus_phase1")
        config.train.update(dict(num_steps=CPU_STEPS[variant],
                                 eval_every=500 if phase2 else 1000,
                                 checkpoint_every=500 if phase2 else 1000))
        if "_wiki" in variant:
            names = (WIKIPEDIA, IMDB) if "_imdb" in variant else (WIKIPEDIA,)
            config.data.update(dict(
                corpus_files=tuple(os.path.join(SHARED_DATA, "pretrain", n) + ":paragraphs"
                                   for n in names),
                dupe_factor=1, documents_per_shard=1000, vocab_sample=0.2,
                vocab_limit_alphabet=1000, document_sample=0.125))
            # Phase 1 trains positions 0-31 only (no offsets: it leaves the
            # plateau sooner); phase 2 starts positions 32-127 as their copies.
            if phase2:
                config.init_tile_positions = 32
            else:
                config.data.random_position_offsets = False
        return config
    if variant.startswith("corpus"):
        pretrain = os.path.join(SHARED_DATA, "pretrain")
        config.data.update(dict(
            corpus_files=(os.path.join(pretrain, "reuters21578_docs.txt"),
                          os.path.join(pretrain, "wiki.valid.raw") + ":wikitext",
                          os.path.join(pretrain, "wiki.test.raw") + ":wikitext"),
            synthetic_documents=0, vocab_size=8192, dupe_factor=3, eval_documents=500,
            eval_examples=2048))
        config.model.update(dict(hidden_size=256, num_heads=4, mlp_dim=1024,
                                 num_layers=4))
        config.train.update(dict(batch_size=64, num_steps=2000, log_every=100,
                                 eval_every=500, checkpoint_every=500))
        config.optimizer.update(dict(learning_rate=1e-3, warmup_steps=200))
    if variant in ("corpus_phase1", "corpus_phase2"):
        config.model.update(dict(norm_position="pre", dropout_rate=0.0,
                                 attention_dropout_rate=0.0))
    if variant == "corpus_phase1":
        config.data.update(dict(max_seq_length=32, max_predictions_per_seq=5,
                                random_position_offsets=True))
        config.train.update(dict(batch_size=128, num_steps=3000))
    elif variant == "corpus_phase2":
        config.train.update(dict(batch_size=32, num_steps=2000, eval_every=250))
        config.optimizer.update(dict(learning_rate=5e-4, warmup_steps=100))
    elif variant.startswith(("base_", "large_")):
        size, recipe = variant.split("_", 1)
        config.data.update(dict(synthetic_documents=0, vocab_size=30522, dupe_factor=10,
                                eval_documents=1000, eval_examples=8192))
        hidden, layers, heads = (768, 12, 12) if size == "base" else (1024, 24, 16)
        config.model.update(dict(hidden_size=hidden, num_layers=layers, num_heads=heads,
                                 mlp_dim=4 * hidden, max_len=512))
        config.train.update(dict(batch_size=256, num_steps=1_000_000, log_every=1000,
                                 eval_every=10_000, checkpoint_every=10_000))
        config.optimizer.update(dict(learning_rate=1e-4, warmup_steps=10_000))
        if recipe != "2018":   # the figures of the module docstring
            phase2 = recipe.endswith("2")
            config.data.update(dict(max_seq_length=512 if phase2 else 128,
                                    max_predictions_per_seq=80 if phase2 else 20,
                                    whole_word_masking=True))
            config.train.update(dict(batch_size=32_768 if phase2 else 65_536,
                                     num_steps=1563 if phase2 else 7038, log_every=10,
                                     eval_every=500, checkpoint_every=200))
            config.optimizer.update(dict(
                name="lamb", learning_rate=4e-3 if phase2 else 6e-3, schedule="poly",
                warmup_steps=0, warmup_fraction=0.128 if phase2 else 0.2843))
    return config
