"""The experiment a workdir was trained with: `--config=launch/workdir_config.py:WORKDIR`.

The entry points that restore a workdir (evaluate, translate, ablate,
visualize_attention, extract_features) put this in front of their arguments when
no `--config` is given (`common_flags.workdir_argv`), so `--config.KEY=VALUE`
overrides the workdir's own `config.json`.
"""

from bert_jax.training.evaluation import saved_config


def get_config(workdir: str):
    return saved_config(workdir)
