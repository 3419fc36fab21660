"""Translation metrics: sacreBLEU (cased, 13a tokenization) and chrF on
detokenized text, and the sample file written at each evaluation."""

from __future__ import annotations

import json
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


def write_samples(path: str, sources: Sequence[str], references: Sequence[str],
                  hypotheses: Sequence[str]) -> None:
    """One JSON object per line: source, reference, hypothesis."""
    with open(path, "w") as f:
        for source, reference, hypothesis in zip(sources, references, hypotheses):
            f.write(json.dumps({"source": source, "reference": reference,
                                "hypothesis": hypothesis}, ensure_ascii=False) + "\n")
