"""Errors a user can act on: a `UserError`'s message is the whole report (what is wrong
with something the user gave, and what to do); the launch scripts print it without a
traceback (`launch/cli.py`). The project's error classes derive from it and keep their
older bases (`ValueError`, `RuntimeError`). This module imports nothing: every layer may
use it."""


def chain(error: BaseException | None):
    """`error`, then its causes and contexts, outermost first (each once)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


class UserError(Exception):
    """`rerun_with`: flags (name -> value) that get past the problem, e.g.
    `{"restore_step": 10}`; the launch scripts print the user's command with them."""

    def __init__(self, *args, rerun_with: dict | None = None):
        super().__init__(*args)
        self.rerun_with = rerun_with


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class SettingsMismatchError(UserError, ValueError):
    """Something saved (a workdir's vocabulary) was made with other settings than the
    config asks for."""


class DamagedFileError(UserError, RuntimeError):
    """A file written earlier (a workdir's config.json) cannot be read. (Not a
    ValueError: config files raise it, and absl would bury those in a flag error.)"""
