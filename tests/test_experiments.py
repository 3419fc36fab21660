"""Every experiment config file and variant resolves to a valid model and run."""

import importlib.util
import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax.modeling import BertConfig, TransformerConfig
from bert_jax.auto_dtype import resolve_model_dtype
from bert_jax.config_schema import check_config

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
FINETUNE = ["sst2", "mrpc", "stsb", "cola", "rte", "qnli", "mnli", "upos", "ner", "squad"]
VARIANTS = {"translate.py": [None, "multi30k", "multi30k_en_de", "wmt_base", "wmt_big"],
            "tiny_translate.py": [None],
            "pretrain_bert.py": [None, "corpus", "corpus_phase1", "corpus_phase2", "cpu_phase1",
                                 "cpu_phase2", "cpu_bf16_phase1", "cpu_bf16_phase2", "cpu_wiki_phase1",
                                 "cpu_wiki_phase2", "cpu_wiki_imdb_phase1",
                                 "cpu_wiki_imdb_phase2", "in_task_mlm", "base_2018",
                                 "large_2018", "base_lamb_phase1", "base_lamb_phase2",
                                 "large_lamb_phase1", "large_lamb_phase2"],
            "finetune.py": [None] + FINETUNE + ["sst2,steps=600", "squad,epochs=1"]}


def load(name):
    spec = importlib.util.spec_from_file_location(name[:-3], EXPERIMENTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, variant", [(n, v) for n, vs in VARIANTS.items() for v in vs])
def test_config_is_consistent(name, variant):
    config = resolve_model_dtype(load(name).get_config(variant))  # 'auto' -> a dtype
    if config.task == "translation":
        model = TransformerConfig(**config.model.to_dict())  # validates every field
        assert config.data.max_length <= model.max_len
        assert config.decode.max_length <= model.max_len
    else:
        model = BertConfig(**{**config.model.to_dict(), "vocab_size": 30522})
        assert config.data.max_seq_length <= model.max_len
        assert config.task in ("bert_pretraining", "glue", "tagging", "squad")
    assert config.optimizer.warmup_steps <= config.train.num_steps
    assert config.train.batch_size % config.train.grad_accum_steps == 0
    assert load(name).__doc__ and "launch/train.py" in load(name).__doc__


def _leaves(config, prefix=""):
    for key, value in config.items():
        if hasattr(value, "items"):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("name, variant", [(n, v) for n, vs in VARIANTS.items() for v in vs])
def test_every_field_can_be_set_from_the_command_line(name, variant):
    """config_flags cannot override lists (or None): every field must be a
    scalar, a string or a tuple."""
    for key, value in _leaves(load(name).get_config(variant)):
        assert isinstance(value, (bool, int, float, str, tuple)), (
            f"{name}:{variant} config.{key} = {value!r} ({type(value).__name__}) "
            f"cannot be set with --config.{key}; use a tuple")


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags
def test_corpus_files_from_the_command_line():
    argv = ["train.py", f"--config={EXPERIMENTS / 'pretrain_bert.py'}:corpus",
            "--config.data.corpus_files=('a.txt', 'b.raw:wikitext')"]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    assert tuple(values.config.data.corpus_files) == ("a.txt", "b.raw:wikitext")


@pytest.mark.parametrize("phase", ["1", "2"])
def test_the_wikipedia_variants_change_only_the_corpus(phase):
    """cpu_wiki(_imdb)_phaseN is cpu_phaseN on the gzip Wikipedia (and IMDb)
    files, cut into sentences, sampled, with a limited alphabet, phase 1's
    positions from 0 and phase 2's copied from them (docs/RESULTS.md)."""
    module = load("pretrain_bert.py")
    reuters = module.get_config(f"cpu_phase{phase}").to_dict()
    assert reuters.pop("init_tile_positions") == 0
    changed = ("corpus_files", "dupe_factor", "documents_per_shard", "vocab_sample",
               "document_sample", "vocab_limit_alphabet", "random_position_offsets")
    for arm, names in (("wiki", ["enwiki_wikiextractor_docs.txt.gz"]),
                       ("wiki_imdb", ["enwiki_wikiextractor_docs.txt.gz",
                                      "imdb_unsup_docs.txt.gz"])):
        config = module.get_config(f"cpu_{arm}_phase{phase}").to_dict()
        assert [spec.rsplit("/", 1)[1] for spec in config["data"]["corpus_files"]] == [
            f"{name}:paragraphs" for name in names]
        assert config["data"]["vocab_limit_alphabet"] == 1000
        assert not config["data"]["random_position_offsets"]
        assert config.pop("init_tile_positions") == (32 if phase == "2" else 0)
        for section in reuters:
            expected = reuters[section]
            if section == "data":
                expected = {k: v for k, v in expected.items() if k not in changed}
                config[section] = {k: v for k, v in config[section].items()
                                   if k not in changed}
            assert config[section] == expected, section


def test_every_experiment_file_is_covered():
    # transfer_study.py is a study file (tests/test_transfer_study.py), not a config.
    assert sorted(p.name for p in EXPERIMENTS.glob("*.py")) == sorted(
        [*VARIANTS, "transfer_study.py"])


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown variant 'wmt_huge'"):
        load("translate.py").get_config("wmt_huge")
    with pytest.raises(ValueError, match="'sst2,lr=3': 'lr=3' "):
        load("finetune.py").get_config("sst2,lr=3")


def test_finetune_steps_follow_the_epochs():
    config = load("finetune.py").get_config("mrpc")
    assert config.train.num_steps == -(-3 * 3668 // 32)          # 3 epochs, batch 32
    assert config.optimizer.warmup_steps == config.train.num_steps // 10
    short = load("finetune.py").get_config("mrpc,steps=50")
    assert short.train.num_steps == short.train.eval_every == 50


POD_RECIPES = ["base_lamb_phase1", "base_lamb_phase2", "large_lamb_phase1", "large_lamb_phase2"]


@pytest.mark.parametrize("variant", POD_RECIPES)
def test_the_pod_recipes_pass_the_checks_before_training(variant):
    """LAMB, whole-word masking, and phase 2 able to start from phase 1 (the
    same model, positions to 512)."""
    from bert_jax.tasks import build_task
    from bert_jax.training.sharding import mesh_from_config
    from bert_jax.training.validation import check_training_config
    config = load("pretrain_bert.py").get_config(variant)
    check_config(config)  # raises ConfigError on a problem
    check_training_config(build_task(config, None), mesh_from_config(config.mesh))
    phase1 = load("pretrain_bert.py").get_config(variant[:-1] + "1")
    assert (config.optimizer.name, config.data.whole_word_masking) == ("lamb", True)
    assert config.model.to_dict() == phase1.model.to_dict()
    assert config.data.max_seq_length == (512 if variant.endswith("2") else 128)


@pytest.mark.parametrize("variant", ["multi30k", "multi30k_en_de"])
def test_multi30k_schedule_and_sizes_fit_together(variant):
    """The learning rate rises to its peak over the warmup and decays to 0 at the last
    step; the last step is checkpointed and the `keep_last` checkpoints that
    `evaluate.py --average_last` averages all come from the run; packed rows hold the
    longest pair and fit the model."""
    import numpy as np
    from bert_jax.training.optimizer import learning_rate_schedule
    config = load("translate.py").get_config(variant)
    train, optimizer, data = config.train, config.optimizer, config.data
    rate = learning_rate_schedule(optimizer.schedule, optimizer.learning_rate,
                                  optimizer.warmup_steps, train.num_steps)
    rates = np.array([float(rate(step)) for step in range(0, train.num_steps + 1, 50)])
    peak = optimizer.warmup_steps // 50
    assert optimizer.schedule != "rsqrt" and 0 < optimizer.warmup_steps < train.num_steps
    assert rates[peak] == pytest.approx(optimizer.learning_rate) and rates.max() == rates[peak]
    assert (np.diff(rates[:peak + 1]) > 0).all() and (np.diff(rates[peak:]) < 0).all()
    assert rates[-1] == pytest.approx(0.0, abs=1e-9)
    assert train.num_steps % train.checkpoint_every == 0
    assert 1 < train.keep_last <= train.num_steps // train.checkpoint_every
    assert data.max_length <= data.pack_length <= config.model.max_len
    assert config.decode.max_length <= config.model.max_len
