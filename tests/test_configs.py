"""Hyperparameter validation, presets and the max_len guard."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import pytest

from bert_jax.errors import ConfigError, DamagedFileError
from bert_jax.modeling import BertModel, Transformer
from bert_jax.modeling.configs import (
    BertConfig,
    TransformerConfig,
    bert_preset,
    transformer_preset,
)

TINY_BERT = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, max_len=8,
                 vocab_size=50)
TINY_TRANSFORMER = dict(hidden_size=32, num_heads=4, mlp_dim=64, num_layers=1,
                        max_len=8, vocab_size=50)

CONFIGS = [
    pytest.param(BertConfig, TINY_BERT, id="bert"),
    pytest.param(TransformerConfig, TINY_TRANSFORMER, id="transformer"),
]


def test_tiny_configs_are_valid():
    bert = BertConfig(**TINY_BERT)
    assert bert.head_dim == 16
    transformer = TransformerConfig(**TINY_TRANSFORMER)
    assert transformer.head_dim == 8
    assert transformer.output_vocab_size == 50
    assert transformer.decoder_layers == 1


# ----------------------------------------------------------------------------
# Field validation.


@pytest.mark.parametrize("cls, base", CONFIGS)
def test_hidden_size_not_divisible_by_heads(cls, base):
    with pytest.raises(ConfigError, match=r"config\.model\.num_heads=4: .*hidden_size=30"):
        cls(**{**base, "hidden_size": 30, "num_heads": 4})
    # The suggested head count (the nearest divisor) really divides hidden_size.
    with pytest.raises(ConfigError, match=r"num_heads=7: .*\b8\b"):
        cls(**{**base, "hidden_size": 200, "num_heads": 7})


@pytest.mark.parametrize("cls, base", CONFIGS)
@pytest.mark.parametrize("field", ["hidden_size", "num_heads", "mlp_dim", "num_layers",
                                   "max_len", "vocab_size"])
@pytest.mark.parametrize("value", [0, -4, 32.0, True], ids=["zero", "negative",
                                                             "float", "bool"])
def test_non_positive_or_non_int_sizes(cls, base, field, value):
    with pytest.raises(ConfigError, match=rf"config\.model\.{field}={re.escape(repr(value))}:"):
        cls(**{**base, field: value})


@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_bert_type_vocab_size_must_be_positive_int(value):
    with pytest.raises(ConfigError, match=r"type_vocab_size="):
        BertConfig(**{**TINY_BERT, "type_vocab_size": value})


@pytest.mark.parametrize("field", ["target_vocab_size", "num_decoder_layers"])
def test_transformer_optional_sizes(field):
    # None means "same as the encoder side"; any given value must be a positive int.
    cfg = TransformerConfig(**{**TINY_TRANSFORMER, "share_embeddings": False,
                               field: None})
    assert cfg.output_vocab_size == 50 and cfg.decoder_layers == 1
    for bad in (0, -2, 1.5):
        with pytest.raises(ConfigError, match=rf"{field}={bad}:"):
            TransformerConfig(**{**TINY_TRANSFORMER, "share_embeddings": False,
                                 field: bad})
    cfg = TransformerConfig(**{**TINY_TRANSFORMER, "share_embeddings": False,
                               field: 3})
    assert (cfg.output_vocab_size, cfg.decoder_layers) == (
        (3, 1) if field == "target_vocab_size" else (50, 3))


@pytest.mark.parametrize("cls, base", CONFIGS)
@pytest.mark.parametrize("field, bad, a_valid_choice", [
    ("activation", "swish", "gelu_tanh"),
    ("norm_position", "sandwich", "pre"),
    ("attention_impl", "fused_kernel", "flash"),
    ("initializer", "orthogonal", "xavier_uniform"),
    ("dtype", "int8", "bfloat16"),
    ("param_dtype", "float64", "bfloat16"),
])
def test_unknown_choice(cls, base, field, bad, a_valid_choice):
    # The message names the field and offers the valid choices.
    with pytest.raises(ConfigError, match=rf"{field}='{bad}':.*'{a_valid_choice}'"):
        cls(**{**base, field: bad})
    assert getattr(cls(**{**base, field: a_valid_choice}), field) == a_valid_choice


def test_unknown_position_kind():
    with pytest.raises(ConfigError, match=r"position='rotary':.*'learned'"):
        TransformerConfig(**TINY_TRANSFORMER, position="rotary")


@pytest.mark.parametrize("cls, base", CONFIGS)
@pytest.mark.parametrize("field", ["dropout_rate", "attention_dropout_rate"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_dropout_outside_unit_interval(cls, base, field, value):
    with pytest.raises(ConfigError, match=rf"config\.model\.{field}={value!r}:"):
        cls(**{**base, field: value})


@pytest.mark.parametrize("cls, base", CONFIGS)
@pytest.mark.parametrize("field", ["dropout_rate", "attention_dropout_rate"])
def test_dropout_boundaries_accepted(cls, base, field):
    assert getattr(cls(**{**base, field: 0.0}), field) == 0.0
    assert getattr(cls(**{**base, field: 0.999}), field) == 0.999


@pytest.mark.parametrize("field", ["layer_norm_eps", "initializer_range"])
@pytest.mark.parametrize("value", [0.0, -1e-6])
def test_positive_floats(field, value):
    with pytest.raises(ConfigError, match=rf"{field}={value!r}:"):
        BertConfig(**TINY_BERT, **{field: value})


def test_share_embeddings_needs_one_vocabulary():
    with pytest.raises(ConfigError, match=r"share_embeddings=True:.*target_vocab_size=60"):
        TransformerConfig(**TINY_TRANSFORMER, target_vocab_size=60)
    # The fixes the message suggests both work.
    cfg = TransformerConfig(**TINY_TRANSFORMER, target_vocab_size=60,
                            share_embeddings=False)
    assert cfg.output_vocab_size == 60
    TransformerConfig(**TINY_TRANSFORMER, target_vocab_size=50)


@pytest.mark.parametrize("field", ["pad_id", "bos_id", "eos_id"])
def test_special_token_ids_must_be_in_target_vocabulary(field):
    token_id = rf"{field}=%s: .*\[0, %d\)"  # the field and the range it must lie in
    with pytest.raises(ConfigError, match=token_id % ("-1", 50)):
        TransformerConfig(**TINY_TRANSFORMER, **{field: -1})
    with pytest.raises(ConfigError, match=token_id % ("50", 50)):
        TransformerConfig(**TINY_TRANSFORMER, **{field: 50})
    for not_an_int in (True, 0.5):
        with pytest.raises(ConfigError, match=rf"{field}={not_an_int!r}:"):
            TransformerConfig(**TINY_TRANSFORMER, **{field: not_an_int})
    # bos/eos live in the target vocabulary; pad marks padding on both sides.
    with pytest.raises(ConfigError, match=rf"{field}=12: .*\[0, 12\)"):
        TransformerConfig(**TINY_TRANSFORMER, share_embeddings=False,
                          target_vocab_size=12, **{field: 12})
    if field == "pad_id":
        with pytest.raises(ConfigError, match=r"pad_id=15: .*\[0, 10\) \(both vocab"):
            TransformerConfig(**{**TINY_TRANSFORMER, "vocab_size": 10},
                              share_embeddings=False, target_vocab_size=20, pad_id=15)
    assert getattr(TransformerConfig(**TINY_TRANSFORMER, **{field: 49}), field) == 49


def test_bert_pad_token_id_is_validated():
    with pytest.raises(ConfigError, match=r"config\.model\.pad_token_id=-7:"):
        BertConfig(**TINY_BERT, pad_token_id=-7)


def test_non_numeric_rates_are_config_errors():
    with pytest.raises(ConfigError, match=r"dropout_rate='0.1':"):
        TransformerConfig(**TINY_TRANSFORMER, dropout_rate="0.1")
    with pytest.raises(ConfigError, match=r"layer_norm_eps=None:"):
        BertConfig(**TINY_BERT, layer_norm_eps=None)


def test_unknown_presets():
    with pytest.raises(ConfigError, match=r"'huge'.*'tiny'.*'large'"):  # and the choices
        bert_preset("huge")
    with pytest.raises(ConfigError, match=r"'small'.*'base'.*'big'"):
        transformer_preset("small")


def test_from_dict_rejects_unknown_key():
    with pytest.raises(DamagedFileError, match=r"\['hidden_sise'\]"):
        BertConfig.from_dict({**TINY_BERT, "hidden_sise": 32})
    with pytest.raises(DamagedFileError, match=r"^/m/config\.json: .*\['d_model'\].*'hidden_size'"):
        TransformerConfig.from_dict({"d_model": 512}, "/m/config.json")


@pytest.mark.parametrize("cls, base", CONFIGS)
def test_dict_round_trip(cls, base):
    cfg = cls(**base, activation="gelu_tanh", dropout_rate=0.25)
    assert cls.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"num_heads=4:"):
        cls.from_dict({**cfg.to_dict(), "hidden_size": 30, "num_heads": 4})


# ----------------------------------------------------------------------------
# Presets.

# google-research/bert README: the 24 smaller models and BERT-base/large.
# name: (layers L, hidden H, heads A = H/64, feed-forward 4H)
GOOGLE_BERT_TABLE = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@pytest.mark.parametrize("name", sorted(GOOGLE_BERT_TABLE))
def test_bert_presets(name):
    cfg = bert_preset(name)
    layers, hidden, heads, mlp = GOOGLE_BERT_TABLE[name]
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.mlp_dim) == (
        layers, hidden, heads, mlp)
    assert cfg.head_dim == 64
    # BERT's released checkpoints: uncased WordPiece vocabulary, 512 positions.
    assert (cfg.vocab_size, cfg.max_len, cfg.type_vocab_size) == (30522, 512, 2)
    assert cfg.activation == "gelu" and cfg.norm_position == "post"


def test_bert_defaults_are_base():
    assert BertConfig() == bert_preset("base")


def test_bert_preset_overrides_are_validated():
    cfg = bert_preset("tiny", vocab_size=100, max_len=64)
    assert (cfg.vocab_size, cfg.max_len, cfg.hidden_size) == (100, 64, 128)
    with pytest.raises(ConfigError, match=r"num_heads=5: .*hidden_size=768"):
        bert_preset("base", num_heads=5)


# Vaswani et al. 2017, Table 3: N, d_model, d_ff, h, P_drop.
VASWANI_TABLE_3 = {
    "base": (6, 512, 2048, 8, 0.1),
    "big": (6, 1024, 4096, 16, 0.3),
}


@pytest.mark.parametrize("name", sorted(VASWANI_TABLE_3))
def test_transformer_presets(name):
    cfg = transformer_preset(name)
    n, d_model, d_ff, h, p_drop = VASWANI_TABLE_3[name]
    assert (cfg.num_layers, cfg.hidden_size, cfg.mlp_dim, cfg.num_heads) == (
        n, d_model, d_ff, h)
    assert cfg.dropout_rate == pytest.approx(p_drop)
    assert cfg.decoder_layers == n
    assert cfg.head_dim == 64  # d_k = d_v = d_model / h = 64 in both rows
    # The paper's model: ReLU, post-norm, sinusoidal positions, shared and tied
    # embeddings scaled by sqrt(d_model).
    assert cfg.activation == "relu" and cfg.norm_position == "post"
    assert cfg.position == "sinusoidal"
    assert cfg.share_embeddings and cfg.tie_output and cfg.scale_embeddings


def test_transformer_defaults_are_base():
    assert TransformerConfig() == transformer_preset("base")
    assert transformer_preset("big", dropout_rate=0.1).dropout_rate == 0.1


# ----------------------------------------------------------------------------
# replace() re-validates; configs are frozen.


@pytest.mark.parametrize("cls, base", CONFIGS)
def test_replace_revalidates(cls, base):
    cfg = cls(**base)
    with pytest.raises(ConfigError, match=r"num_heads=3: .*hidden_size=32"):
        cfg.replace(num_heads=3)
    with pytest.raises(ConfigError, match=r"activation='tanh':"):
        dataclasses.replace(cfg, activation="tanh")
    with pytest.raises(ConfigError, match=r"dropout_rate=1\.0:"):
        cfg.replace(dropout_rate=1.0)
    new = cfg.replace(num_heads=8, dropout_rate=0.0)
    assert (new.num_heads, new.head_dim, new.dropout_rate) == (8, 4, 0.0)
    assert cfg.num_heads == base["num_heads"]  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_heads = 8


def test_transformer_replace_revalidates_cross_field_rules():
    cfg = TransformerConfig(**TINY_TRANSFORMER, share_embeddings=False,
                            target_vocab_size=60)
    with pytest.raises(ConfigError, match=r"share_embeddings=True:"):
        cfg.replace(share_embeddings=True)
    with pytest.raises(ConfigError, match=r"eos_id=55: .*\[0, 50\)"):
        cfg.replace(eos_id=55, target_vocab_size=None)


# ----------------------------------------------------------------------------
# Sequences longer than max_len.


def test_bert_model_rejects_sequences_longer_than_max_len():
    cfg = BertConfig(**TINY_BERT)  # max_len 8
    model = BertModel(cfg)
    rng = jax.random.PRNGKey(0)
    ids = jnp.full((1, 8), 5, jnp.int32)
    # Shapes only (jax.eval_shape): the check happens while tracing.
    variables = jax.eval_shape(model.init, rng, ids)  # exactly max_len is fine
    out = jax.eval_shape(model.apply, variables, ids)
    assert out.sequence_output.shape == (1, 8, 32)
    with pytest.raises(ConfigError, match=r"\b9\b.*config\.model\.max_len=8"):
        jax.eval_shape(model.apply, variables, jnp.full((1, 9), 5, jnp.int32))
    with pytest.raises(ConfigError, match=r"max_len"):
        jax.eval_shape(model.init, rng, jnp.full((1, 9), 5, jnp.int32))


def test_transformer_rejects_sequences_longer_than_max_len():
    cfg = TransformerConfig(**TINY_TRANSFORMER)  # max_len 8
    model = Transformer(cfg)
    src = jnp.full((1, 8), 5, jnp.int32)
    tgt = jnp.full((1, 8), 6, jnp.int32)
    variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), src, tgt)
    encode = functools.partial(model.apply, method=model.encode)
    assert jax.eval_shape(encode, variables, src).shape == (1, 8, 32)
    with pytest.raises(ConfigError, match=r"source length 9 .*config\.model\.max_len=8"):
        jax.eval_shape(encode, variables, jnp.full((1, 9), 5, jnp.int32))
    with pytest.raises(ConfigError, match=r"target length 9 .*config\.model\.max_len=8"):
        jax.eval_shape(model.apply, variables, src, jnp.full((1, 9), 6, jnp.int32))
