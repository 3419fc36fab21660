"""Every experiment config file and variant resolves to a valid model and run."""

import importlib.util
import pathlib

import pytest

from bert_jax.modeling import TransformerConfig

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
VARIANTS = {"translate.py": [None, "multi30k", "multi30k_en_de", "wmt_base", "wmt_big"],
            "tiny_translate.py": [None]}


def load(name):
    spec = importlib.util.spec_from_file_location(name[:-3], EXPERIMENTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, variant", [(n, v) for n, vs in VARIANTS.items() for v in vs])
def test_config_is_consistent(name, variant):
    config = load(name).get_config(variant)
    assert config.task == "translation"
    model = TransformerConfig(**config.model.to_dict())  # validates every field
    assert config.data.max_length <= model.max_len
    assert config.decode.max_length <= model.max_len
    assert config.optimizer.warmup_steps <= config.train.num_steps
    assert config.train.batch_size % config.train.grad_accum_steps == 0
    assert load(name).__doc__ and "launch/train.py" in load(name).__doc__


def test_every_experiment_file_is_covered():
    assert sorted(p.name for p in EXPERIMENTS.glob("*.py")) == sorted(VARIANTS)


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown variant 'wmt_huge'"):
        load("translate.py").get_config("wmt_huge")
