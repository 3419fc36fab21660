"""Model hyperparameters: frozen dataclasses validated at construction.

A bad value fails at once with a message that names the field and says how to
fix it. `dataclasses.replace(config, field=value)` validates again, so train,
eval and decode variants of one config stay consistent.

Presets follow the google-research/bert table (BERT tiny ... large) and Vaswani
et al. 2017, Table 3 (Transformer base and big).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax.numpy as jnp

from bert_jax.errors import UserError
from bert_jax.modeling.fused_attention import IMPLS as ATTENTION_IMPLS

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
NORM_POSITIONS = ("post", "pre")
INITIALIZERS = ("truncated_normal", "normal", "xavier_uniform")
POSITION_KINDS = ("learned", "sinusoidal")
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")


class ConfigError(UserError, ValueError):
    """A hyperparameter has an invalid value; the message names the field."""


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
      layer_norm_eps: LayerNorm epsilon.
      initializer: kernel initializer family.
      initializer_range: standard deviation for the (truncated) normal family.
      dtype: compute dtype ('float32' or 'bfloat16'); softmax and LayerNorm
        statistics stay in float32 whatever it is.
      param_dtype: dtype parameters are stored in.
      attention_impl: 'einsum' (explicit scores, probabilities available,
        attention dropout), 'flash' (the platform's flash kernel: cuDNN on
        GPU, splash on TPU, XLA's attention on CPU), or one kernel by name:
        'xla', 'cudnn', 'splash' (see `bert_jax.modeling.fused_attention`).
      remat: rematerialisation of each layer in the backward pass: 'none'
        (keep every activation), 'full' (keep only the layer inputs),
        'dots' (keep matmul outputs) or 'dots_no_batch' (keep matmul outputs
        without batch dimensions: the weight-like ones).
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

    def __post_init__(self):
        name = type(self).__name__
        for field in self._positive_ints:
            value = getattr(self, field)
            if value is None and field in getattr(self, "_optional_ints", ()):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(
                    f"{name}.{field}={value!r}: must be a positive integer.")
        if self.hidden_size % self.num_heads:
            divisors = [h for h in range(1, self.hidden_size + 1)
                        if self.hidden_size % h == 0]
            nearest = min(divisors, key=lambda h: (abs(h - self.num_heads), h))
            raise ConfigError(
                f"{name}.hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}: choose num_heads dividing "
                f"hidden_size (the nearest is {nearest}; BERT uses hidden_size // 64 "
                "heads) or change hidden_size.")
        _check_choice(name, "activation", self.activation, ACTIVATIONS)
        _check_choice(name, "norm_position", self.norm_position, NORM_POSITIONS)
        if self.attention_impl == "fused":
            raise ConfigError(
                f"{name}.attention_impl='fused' was renamed: 'xla' is what it computed "
                "(XLA's attention on every platform), 'flash' the platform's flash "
                "kernel (cuDNN on GPU, splash on TPU).")
        _check_choice(name, "attention_impl", self.attention_impl, ATTENTION_IMPLS)
        _check_choice(name, "initializer", self.initializer, INITIALIZERS)
        _check_choice(name, "dtype", self.dtype, DTYPES)
        _check_choice(name, "param_dtype", self.param_dtype, DTYPES)
        _check_choice(name, "remat", self.remat, REMAT_POLICIES)
        if not isinstance(self.scan_layers, bool):
            raise ConfigError(f"{name}.scan_layers={self.scan_layers!r}: must be "
                              "True or False.")
        for field in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, field)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ConfigError(
                    f"{name}.{field}={value!r}: must be in [0, 1).")
        if not _is_number(self.layer_norm_eps) or not self.layer_norm_eps > 0:
            raise ConfigError(
                f"{name}.layer_norm_eps={self.layer_norm_eps!r}: must be > 0.")
        if not _is_number(self.initializer_range) or not self.initializer_range > 0:
            raise ConfigError(
                f"{name}.initializer_range={self.initializer_range!r}: must be > 0.")

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
                f"{what} length {length} exceeds {type(self).__name__}."
                f"{self.max_len_field}={self.max_len}: truncate the input or "
                f"raise {self.max_len_field} (learned position embeddings then "
                "need retraining).")

    max_len_field: ClassVar[str] = "max_len"

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"{cls.__name__}: unknown field(s) {unknown}; known fields are "
                f"{sorted(known)}.")
        return cls(**values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_token_id(name: str, field: str, value: Any, vocab_size: int, vocab: str):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
        raise ConfigError(
            f"{name}.{field}={value!r}: must be an integer token id in [0, {vocab_size}) "
            f"({vocab}).")


def _check_choice(name: str, field: str, value: Any, choices: tuple[str, ...]):
    if value not in choices:
        raise ConfigError(
            f"{name}.{field}={value!r}: unknown; choose one of {list(choices)}.")


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
    max_len_field: ClassVar[str] = "max_len (max_position_embeddings)"

    def __post_init__(self):
        super().__post_init__()
        _check_token_id("BertConfig", "pad_token_id", self.pad_token_id, self.vocab_size,
                        "the vocabulary")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(StackConfig):
    """Encoder-decoder Transformer (Vaswani et al. 2017). Defaults: base.

    Attributes (beyond StackConfig):
      vocab_size: source vocabulary (and target, when `target_vocab_size` is None).
      target_vocab_size: target vocabulary when it differs from the source.
      num_decoder_layers: decoder depth; None means `num_layers`.
      position: 'sinusoidal' (the paper's fixed table) or 'learned'.
      share_embeddings: one embedding table for source and target.
      tie_output: the output projection reuses the target embedding table.
      scale_embeddings: multiply embeddings by sqrt(hidden_size) (the paper).
      pad_id, bos_id, eos_id: special token ids; `pad_id` marks padding.
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
    _optional_ints: ClassVar[tuple[str, ...]] = (
        "target_vocab_size", "num_decoder_layers")

    def __post_init__(self):
        super().__post_init__()
        _check_choice("TransformerConfig", "position", self.position, POSITION_KINDS)
        if (self.share_embeddings and self.target_vocab_size is not None
                and self.target_vocab_size != self.vocab_size):
            raise ConfigError(
                f"TransformerConfig.share_embeddings=True needs one vocabulary, "
                f"but vocab_size={self.vocab_size} and target_vocab_size="
                f"{self.target_vocab_size}: set share_embeddings=False or use a "
                "joint vocabulary.")
        # pad_id marks padding on both sides; bos/eos are target tokens.
        _check_token_id("TransformerConfig", "pad_id", self.pad_id,
                        min(self.vocab_size, self.output_vocab_size),
                        "both vocabularies")
        for field in ("bos_id", "eos_id"):
            _check_token_id("TransformerConfig", field, getattr(self, field),
                            self.output_vocab_size, "the target vocabulary")

    @property
    def output_vocab_size(self) -> int:
        return self.target_vocab_size or self.vocab_size

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers


# google-research/bert README: (layers, hidden) for the released model sizes;
# heads = hidden / 64, feed-forward = 4 * hidden.
BERT_PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

# Vaswani et al. 2017, Table 3.
TRANSFORMER_PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(hidden_size=512, num_heads=8, mlp_dim=2048, num_layers=6,
                 dropout_rate=0.1),
    "big": dict(hidden_size=1024, num_heads=16, mlp_dim=4096, num_layers=6,
                dropout_rate=0.3),
}


def bert_preset(name: str, **overrides: Any) -> BertConfig:
    """BertConfig for a named size (`tiny` ... `large`), with overrides."""
    if name not in BERT_PRESETS:
        raise ConfigError(
            f"unknown BERT preset {name!r}; choose one of {list(BERT_PRESETS)}.")
    layers, hidden = BERT_PRESETS[name]
    values = dict(num_layers=layers, hidden_size=hidden,
                  num_heads=hidden // 64, mlp_dim=4 * hidden)
    values.update(overrides)
    return BertConfig(**values)


def transformer_preset(name: str, **overrides: Any) -> TransformerConfig:
    """TransformerConfig for `base` or `big` (Vaswani et al.), with overrides."""
    if name not in TRANSFORMER_PRESETS:
        raise ConfigError(
            f"unknown Transformer preset {name!r}; choose one of "
            f"{list(TRANSFORMER_PRESETS)}.")
    return TransformerConfig(**{**TRANSFORMER_PRESETS[name], **overrides})
