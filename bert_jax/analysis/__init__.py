"""Analysis of trained BERT encoders, one study a module (e.g.
`bert_jax.analysis.features`: contextual features of a frozen encoder and
linear probes over its layers); see each module's docstring."""
