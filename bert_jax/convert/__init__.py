"""Conversions of model parameters to and from other formats, and the project's
own pretrained folders.

`hf_bert` maps a Hugging Face BERT folder (`config.json`, `model.safetensors`)
to a `BertConfig` and a bert_jax parameter pytree, and back (`load_hf_bert`,
`save_hf_bert`); `pretrained` writes and reads a bert_jax pretrained folder
(`save_pretrained`, `load_pretrained`: a model config and an Orbax checkpoint
of its parameters). `launch/convert.py` converts between the two; fine-tuning
(`config.init_from`) and `bert_jax.analysis.encoders` read both.
"""

from bert_jax.convert.hf_bert import load_hf_bert, save_hf_bert
from bert_jax.convert.pretrained import load_pretrained, save_pretrained

__all__ = ["load_hf_bert", "save_hf_bert", "load_pretrained",
           "save_pretrained"]
