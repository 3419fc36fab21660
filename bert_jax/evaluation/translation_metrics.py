"""The translation metrics: `bleu_and_chrf(hypotheses, references)` takes two
equally long lists of detokenized sentences (one reference per hypothesis) and
returns corpus sacreBLEU (cased, 13a tokenization) and chrF, on sacreBLEU's
0-100 scale. The `bleu` evaluator (`evaluators`) calls it on the translation
task's beam-search translations.
"""

from __future__ import annotations

from typing import Sequence

import sacrebleu


def bleu_and_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus sacreBLEU and chrF (sacrebleu defaults: mixed case, 13a)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    return {
        "bleu": sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score,
        "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score,
    }
