"""Parameter maps to and from other formats, and bert_jax pretrained folders."""

from bert_jax.convert.hf_bert import load_hf_bert, save_hf_bert
from bert_jax.convert.pretrained import load_pretrained, save_pretrained

__all__ = ["load_hf_bert", "save_hf_bert", "load_pretrained",
           "save_pretrained"]
