"""Model hyperparameters: frozen dataclasses validated at construction.

A bad value fails at once, naming the field (`config.model.<field>`, where the
launchers set it). `dataclasses.replace(config, field=value)` validates again,
so train, eval and decode variants of one config stay consistent.

Presets follow the google-research/bert table (BERT tiny ... large) and Vaswani
et al. 2017, Table 3 (Transformer base and big).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config_schema import ATTENTION_IMPLS
from bert_jax.errors import ConfigError, DamagedFileError, UserError

ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
}
NORM_POSITIONS = ("post", "pre")
INITIALIZERS = ("truncated_normal", "normal", "xavier_uniform")
POSITION_KINDS = ("learned", "sinusoidal")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "attention": None,   # no layer remat: attention.py recomputes the probabilities
}


def _invalid(field: str, value: Any, problem: str) -> ConfigError:
    return ConfigError(f"config.model.{field}={value!r}: {problem}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_token_id(field: str, value: Any, vocab_size: int, vocab: str) -> None:
    if not (_is_int(value) and 0 <= value < vocab_size):
        raise _invalid(field, value, f"must be a token id in [0, {vocab_size}) ({vocab}).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackConfig:
    """Hyperparameters shared by every encoder or decoder stack.

    Attributes:
      hidden_size: width of the residual stream (d_model).
      num_heads: attention heads; must divide `hidden_size`.
      mlp_dim: inner width of the position-wise feed-forward block.
      num_layers: number of encoder layers.
      max_len: longest sequence the position embeddings cover.
      activation: feed-forward nonlinearity: 'gelu' (exact erf form, BERT),
        'gelu_tanh' (tanh approximation) or 'relu' (original Transformer).
      norm_position: 'post' (LayerNorm after the residual add: Transformer,
        BERT) or 'pre' (LayerNorm before each sublayer, plus a final one).
      dropout_rate: dropout on embeddings and sublayer outputs.
      attention_dropout_rate: dropout on attention probabilities.
      initializer_range: standard deviation for the (truncated) normal family.
      dtype: compute dtype; softmax and LayerNorm statistics stay in float32.
      param_dtype: dtype parameters are stored in.
      attention_impl: 'einsum' (explicit scores, probabilities available,
        attention dropout), 'flash' (the platform's flash kernel: cuDNN on
        GPU, splash on TPU, XLA's attention on CPU), or one kernel by name:
        'xla', 'cudnn', 'splash' (see `bert_jax.modeling.fused_attention`).
      remat: what each layer keeps for the backward pass: 'none' (every
        activation), 'full' (only the layer inputs), 'dots' (matmul outputs),
        'dots_no_batch' (matmul outputs without batch dimensions) or
        'attention' (every activation but the `[batch, heads, q_len, kv_len]`
        attention probabilities, recomputed from the queries and keys:
        `bert_jax.modeling.lean_attention`; einsum and xla attention).
      scan_layers: run the layers of a stack as one `nn.scan` (one compiled
        layer however deep the stack); parameters are then stacked under
        `layers/layer` with a leading `[num_layers]` axis (see
        `bert_jax.modeling.layers.scan_params` / `unscan_params`).
    """

    hidden_size: int
    num_heads: int
    mlp_dim: int
    num_layers: int
    max_len: int
    activation: str = "gelu"
    norm_position: str = "post"
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer: str = "truncated_normal"
    initializer_range: float = 0.02
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "einsum"
    remat: str = "none"
    scan_layers: bool = False

    _positive_ints: ClassVar[tuple[str, ...]] = (
        "hidden_size", "num_heads", "mlp_dim", "num_layers", "max_len")
    _optional_ints: ClassVar[tuple[str, ...]] = ()  # may also be None
    _choices: ClassVar[dict[str, Any]] = {
        "activation": ACTIVATIONS, "norm_position": NORM_POSITIONS,
        "attention_impl": ATTENTION_IMPLS, "initializer": INITIALIZERS,
        "dtype": DTYPES, "param_dtype": DTYPES, "remat": REMAT_POLICIES}

    def __post_init__(self):
        for field in self._positive_ints:
            value = getattr(self, field)
            if value is None and field in self._optional_ints:
                continue
            if not (_is_int(value) and value > 0):
                raise _invalid(field, value, "must be a positive integer.")
        if self.hidden_size % self.num_heads:
            divisors = [h for h in range(1, self.hidden_size + 1)
                        if self.hidden_size % h == 0]
            nearest = min(divisors, key=lambda h: (abs(h - self.num_heads), h))
            raise _invalid("num_heads", self.num_heads,
                           f"does not divide hidden_size={self.hidden_size}; the nearest "
                           f"that does is {nearest} (BERT uses hidden_size // 64).")
        if self.attention_impl == "fused":
            raise _invalid("attention_impl", "fused", "renamed 'xla' (what it computed); "
                           "'flash' is the platform's flash kernel.")
        for field, choices in self._choices.items():
            if getattr(self, field) not in choices:
                raise _invalid(field, getattr(self, field),
                               f"unknown; choose one of {list(choices)}.")
        if not isinstance(self.scan_layers, bool):
            raise _invalid("scan_layers", self.scan_layers, "must be True or False.")
        for field in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, field)
            if not (_is_number(value) and 0.0 <= value < 1.0):
                raise _invalid(field, value, "must be in [0, 1).")
        for field in ("layer_norm_eps", "initializer_range"):
            value = getattr(self, field)
            if not (_is_number(value) and value > 0):
                raise _invalid(field, value, "must be > 0.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def check_length(self, length: int, what: str = "input") -> None:
        """Raises if a sequence of `length` tokens exceeds `max_len`."""
        if length > self.max_len:
            raise ConfigError(
                f"{what} length {length} exceeds config.model.max_len={self.max_len}: "
                "shorten it, or raise max_len (learned positions then need training).")

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], path: str = ""):
        """The config of `values`, read from the file `path` (a checkpoint's): a key
        that is no field raises `DamagedFileError` (an edited file, or one another
        version of bert_jax wrote), naming `path` when given."""
        if unknown := cls.unknown_fields(values):
            raise DamagedFileError(f"{path + ': ' if path else ''}{cls.__name__}: unknown "
                                   f"field(s) {unknown}; known fields are {cls.field_names()}.")
        return cls(**values)

    @classmethod
    def field_names(cls) -> list[str]:
        return sorted(f.name for f in dataclasses.fields(cls))

    @classmethod
    def unknown_fields(cls, values: Mapping[str, Any]) -> list[str]:
        """The keys of `values` that are no field of this class, sorted."""
        return sorted(set(values) - set(cls.field_names()))

    @classmethod
    def check_saved(cls, values: Mapping[str, Any], path: str, section: str = "model"
                    ) -> None:
        """Raises a `DamagedFileError` naming the file `path` and `section.KEY` when
        `values` (its `section`, read from it) holds a key that is no field of this
        class: an edited file, or one another version wrote."""
        unknown = cls.unknown_fields(values)
        if not unknown:
            return
        named = ", ".join(f"{section}.{key}" for key in unknown)
        close = difflib.get_close_matches(unknown[0], cls.field_names(), n=1)
        hint = f" (did you mean {section}.{close[0]}?)" if close else ""
        raise DamagedFileError(
            f"{path}: {named} {'is not a field' if len(unknown) == 1 else 'are not fields'} "
            f"of {cls.__name__}{hint}; the file was edited or written by another version "
            f"of bert_jax: correct or remove {named} in {path}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig(StackConfig):
    """BERT (Devlin et al. 2018). Defaults are BERT-base, uncased vocabulary.

    `max_len` is BERT's `max_position_embeddings`.
    """

    hidden_size: int = 768
    num_heads: int = 12
    mlp_dim: int = 3072
    num_layers: int = 12
    max_len: int = 512
    vocab_size: int = 30522
    type_vocab_size: int = 2
    pad_token_id: int = 0

    _positive_ints: ClassVar[tuple[str, ...]] = StackConfig._positive_ints + (
        "vocab_size", "type_vocab_size")

    def __post_init__(self):
        super().__post_init__()
        _check_token_id("pad_token_id", self.pad_token_id, self.vocab_size, "the vocabulary")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(StackConfig):
    """Encoder-decoder Transformer (Vaswani et al. 2017). Defaults: base.

    Attributes (beyond StackConfig):
      vocab_size: source vocabulary (and target, when `target_vocab_size` is None).
      num_decoder_layers: decoder depth; None means `num_layers`.
      position: 'sinusoidal' (the paper's fixed table) or 'learned'.
      tie_output: the output projection reuses the target embedding table.
      scale_embeddings: multiply embeddings by sqrt(hidden_size) (the paper).
      pad_id, bos_id, eos_id: special token ids; `pad_id` marks padding on
        both sides, `bos_id` and `eos_id` are target tokens.
    """

    hidden_size: int = 512
    num_heads: int = 8
    mlp_dim: int = 2048
    num_layers: int = 6
    max_len: int = 256
    activation: str = "relu"
    attention_dropout_rate: float = 0.0
    layer_norm_eps: float = 1e-6
    initializer: str = "xavier_uniform"
    vocab_size: int = 32000
    target_vocab_size: int | None = None
    num_decoder_layers: int | None = None
    position: str = "sinusoidal"
    share_embeddings: bool = True
    tie_output: bool = True
    scale_embeddings: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    _positive_ints: ClassVar[tuple[str, ...]] = StackConfig._positive_ints + (
        "vocab_size", "target_vocab_size", "num_decoder_layers")
    _optional_ints: ClassVar[tuple[str, ...]] = ("target_vocab_size", "num_decoder_layers")
    _choices: ClassVar[dict[str, Any]] = {
        **StackConfig._choices, "position": POSITION_KINDS}

    def __post_init__(self):
        super().__post_init__()
        if self.share_embeddings and self.output_vocab_size != self.vocab_size:
            raise _invalid("share_embeddings", True,
                           f"needs one vocabulary, but vocab_size={self.vocab_size} and "
                           f"target_vocab_size={self.target_vocab_size}; set it False.")
        _check_token_id("pad_id", self.pad_id, min(self.vocab_size, self.output_vocab_size),
                        "both vocabularies")
        for field in ("bos_id", "eos_id"):
            _check_token_id(field, getattr(self, field), self.output_vocab_size,
                            "the target vocabulary")

    @property
    def output_vocab_size(self) -> int:
        return self.target_vocab_size or self.vocab_size

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers


# google-research/bert README: (layers, hidden) for the released model sizes;
# heads = hidden / 64, feed-forward = 4 * hidden.
BERT_PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512),
    "base": (12, 768), "large": (24, 1024),
}

# Vaswani et al. 2017, Table 3.
TRANSFORMER_PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(hidden_size=512, num_heads=8, mlp_dim=2048, num_layers=6,
                 dropout_rate=0.1),
    "big": dict(hidden_size=1024, num_heads=16, mlp_dim=4096, num_layers=6,
                dropout_rate=0.3),
}


def _preset(presets: Mapping[str, Any], name: str, kind: str):
    if name not in presets:
        raise ConfigError(f"unknown {kind} preset {name!r}; choose one of {list(presets)}.")
    return presets[name]


def bert_preset(name: str, **overrides: Any) -> BertConfig:
    """BertConfig for a named size (`tiny` ... `large`), with overrides."""
    layers, hidden = _preset(BERT_PRESETS, name, "BERT")
    return BertConfig(**{"num_layers": layers, "hidden_size": hidden,
                         "num_heads": hidden // 64, "mlp_dim": 4 * hidden, **overrides})


def transformer_preset(name: str, **overrides: Any) -> TransformerConfig:
    """TransformerConfig for `base` or `big` (Vaswani et al.), with overrides."""
    return TransformerConfig(**{**_preset(TRANSFORMER_PRESETS, name, "Transformer"),
                                **overrides})
