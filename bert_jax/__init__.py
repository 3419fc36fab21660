"""bert_jax: pure-function Flax Transformers and BERT for research."""

__version__ = "0.1.0"
