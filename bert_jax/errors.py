"""The base class of errors a user can act on.

A `UserError` says what is wrong with something the user gave (a flag or
config value, a data file, a checkpoint, a workdir) and what to do about it.
Its message is the whole report: the launch scripts print it as
`error: <message>` and exit with status 2, without a traceback
(`launch/cli.py`; `--debug` or `BERT_JAX_DEBUG=1` shows the traceback). Any
other exception is a bug and keeps its traceback.

The project's error classes derive from it and keep their older bases
(`ValueError`, `RuntimeError`), so `except ValueError` still catches them.
This module imports nothing, so every layer (modeling included) may use it.
"""


class UserError(Exception):
    """A mistake in the user's flags, config, data, checkpoint or workdir.

    `rerun_with`: flags (name -> value) that get past the problem, e.g.
    `{"restore_step": 10}`; the launch scripts print the user's command with them.
    """

    def __init__(self, *args, rerun_with: dict | None = None):
        super().__init__(*args)
        self.rerun_with = rerun_with


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named (a data path, a vocabulary, a checkpoint
    folder) does not exist; the message names it and what was expected."""


class SettingsMismatchError(UserError, ValueError):
    """Something already saved (a workdir's vocabulary, a vocabulary folder's
    casing) was made with other settings than the config asks for; the message
    names both and what to do."""


class DamagedFileError(UserError, RuntimeError):
    """A file written earlier (a workdir's config.json) cannot be read: a write
    cut short, or overwritten; the message names it. (Not a ValueError: config
    files raise it, and absl would bury those in a flag error.)"""
