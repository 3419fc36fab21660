"""Everything that turns a model's outputs into reported numbers: decoding and
the metrics, with the evaluators that run them during and after training.

  evaluators              the evaluators `config.evals` names (loss,
                          classification, regression, tagging, entity_f1,
                          squad, bleu), run by `bert_jax.training.evaluation`
  decoding                greedy and beam search over an incremental decoder
  classification_metrics  GLUE and tagging metrics on host numpy arrays
  squad                   the official SQuAD v1.1 scoring and the span search
  translation_metrics     sacreBLEU and chrF of detokenized translations
"""
