"""Translation metrics: sacreBLEU (cased, 13a tokenization) and chrF on
detokenized text."""

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
