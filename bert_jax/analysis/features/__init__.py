r"""The feature-based approach of BERT (Devlin et al. 2018, section 5.3, Table 7).

Instead of fine-tuning, the pretrained encoder is frozen and its hidden states
are fed as fixed contextual features to a small task model. The paper compares
which layers to use (on CoNLL-2003 NER, with a BiLSTM on top); here the task
model is a linear softmax probe, and the task any word-level tagging corpus
the project reads (UD UPOS tags, CoNLL-2003 NER tags scored by entity F1).

    extractor = FeatureExtractor.from_pretrained("path/to/hf_or_bert_jax_folder")
    states = extractor.hidden_states([["The", "U.S.", "economy"], ["Hi", "!"]])
    states[0].shape                        # [layers + 1, 3 words, hidden]
    combine_layers(states[0], "concat_last_four").shape   # [3, 4 * hidden]
    result = fit_probe(train_states, train_ids, eval_states, eval_ids,
                       num_classes=17, strategy="sum_last_four", steps=300)
    result.accuracy, tag_scores(result.eval_predictions, eval_tags, tags)

Each module does one job: `strategies` holds the layer strategies
(`combine_layers`), `extraction` the first-sub-token features of a frozen
BERT (`FeatureExtractor`), `probe` the linear probe (`fit_probe`) and its
tagging scores. `launch/extract_features.py` runs the comparison.
"""

from bert_jax.analysis.features.strategies import (  # noqa: F401
    STRATEGIES, check_strategy, combine_layers, feature_dim)
from bert_jax.analysis.features.extraction import FeatureExtractor  # noqa: F401
from bert_jax.analysis.features.probe import (  # noqa: F401
    ProbeResult, fit_probe, probe, stack_words, tag_ids, tag_scores)
