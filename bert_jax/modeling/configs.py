"""Model hyperparameters: frozen dataclasses validated at construction.

A bad value fails at once, naming the field (`config.model.<field>`, where the
launchers set it), by the rules `bert_jax.config_schema` declares for the model
fields (`MODEL_FIELDS`, `MODEL_CHOICES` and the rules across fields: `check_model`).
`dataclasses.replace(config, field=value)` validates again, so train, eval and
decode variants of one config stay consistent.

Presets follow the google-research/bert table (BERT tiny ... large) and Vaswani
et al. 2017, Table 3 (Transformer base and big).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import config_schema
from bert_jax.errors import DamagedFileError

ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
}
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "attention": None,   # no layer remat: attention.py recomputes the probabilities
}


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

    def __post_init__(self):   # the rules: config_schema.MODEL_FIELDS and on
        config_schema.check_model(vars(self), {"activation": ACTIVATIONS,
                                               "remat": REMAT_POLICIES})

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
        config_schema.check_length(length, self.max_len, what)

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


def bert_preset(name: str, **overrides: Any) -> BertConfig:
    """BertConfig for a named size (`tiny` ... `large`), with overrides."""
    layers, hidden = BERT_PRESETS[config_schema.choice("BERT preset", name, BERT_PRESETS)]
    return BertConfig(**{"num_layers": layers, "hidden_size": hidden,
                         "num_heads": hidden // 64, "mlp_dim": 4 * hidden, **overrides})


def transformer_preset(name: str, **overrides: Any) -> TransformerConfig:
    """TransformerConfig for `base` or `big` (Vaswani et al.), with overrides."""
    preset = config_schema.choice("Transformer preset", name, TRANSFORMER_PRESETS)
    return TransformerConfig(**{**TRANSFORMER_PRESETS[preset], **overrides})
