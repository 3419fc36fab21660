"""The errors a user can act on, all in this module.

A `UserError`'s message is the whole report: what is wrong with something the user
gave (a flag, a config field, a data file, a checkpoint, a workdir) and what to do
about it. The launch scripts print it as one `error:` line and exit 2, without a
traceback (`launch/cli.py`); any other exception is a bug and keeps its traceback.
A library error that is a bug propagates as it is (with `add_note` for context),
never wrapped in a `UserError`.

The classes say which kind of thing is wrong; what used to be one class per data
format is now a field (`DataError.path`, `.line`, ...). Each keeps the built-in base
that callers catch (`ValueError`, `RuntimeError`, `FileNotFoundError`). This module
imports nothing, so every layer may use it."""


def chain(error: BaseException | None):
    """`error`, then its causes and contexts, outermost first (each once)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


class UserError(Exception):
    """The base of every user error. `rerun_with`: flags (name -> value) that get past
    the problem, e.g. `{"restore_step": 10}`; the launch scripts print the user's
    command with them."""

    def __init__(self, *args, rerun_with: dict | None = None):
        super().__init__(*args)
        self.rerun_with = rerun_with


class ConfigError(UserError, ValueError):
    """A config field, flag or argument has a value that cannot work (a bad
    hyperparameter, a topology the devices cannot form, an attention kernel the
    backend lacks, a sweep or study spec, settings that disagree with what a workdir
    saved); the message names the field and the refused value."""


def where(path: str, line: int | None = None, column: int | None = None) -> str:
    """`path`, `path:line` or `path:line:column` (1-based; the column counts
    characters), the prefix every data error's report starts with."""
    return path + (f":{line}" if line else "") + (f":{column}" if line and column else "")


class DataError(UserError, ValueError):
    """A data file or dataset the user gave is malformed or empty: `path` (a file, or
    the dataset's name when no one file is at fault), the 1-based `line` and `column`
    when known, `what` is wrong (naming the bad value) and the `fix`. The report is
    `path[:line[:column]]: what; fix`."""

    def __init__(self, path: str, what: str, fix: str = "", *, line: int | None = None,
                 column: int | None = None, rerun_with: dict | None = None):
        super().__init__(f"{where(path, line, column)}: {what}" + (f"; {fix}" if fix else ""),
                         rerun_with=rerun_with)
        self.path, self.line, self.column, self.what, self.fix = path, line, column, what, fix


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class DamagedFileError(UserError, RuntimeError):
    """A file written earlier (a workdir's config.json) cannot be read. (Not a
    ValueError: config files raise it, and absl would bury those in a flag error.)"""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be written, read or used; the message names its folder.
    `damaged`: its files cannot be read or fail their checksums (an earlier step may
    still serve, which `rerun_with` then names)."""

    def __init__(self, *args, damaged: bool = False, rerun_with: dict | None = None):
        super().__init__(*args, rerun_with=rerun_with)
        self.damaged = damaged


class WorkdirError(UserError, RuntimeError):
    """A workdir cannot be used: not writable, an object-store URL, or locked by
    another run."""


class TrainingDiverged(UserError, FloatingPointError):
    """The loss or gradients became NaN/Inf; nothing after the last good step
    was saved."""


class DoesNotFit(UserError, RuntimeError):
    """A step needs more memory per device than the chip has (`launch/compile.py`'s
    ahead-of-time plan)."""
