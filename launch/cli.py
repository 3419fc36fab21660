"""Runs a launch script's `main`: user errors as a few lines, bugs with a traceback.

    cli.run(main)   # in place of absl's app.run(main)

What the user sees, on stderr:
  - a bad flag (unknown, missing, wrong type), including config overrides
    (`--config.no_such=1`, `--config.train.num_steps=many`), and a
    `bert_jax.errors.UserError` or `app.UsageError` raised by `main`:
    `error: <message>` and exit status 2, no traceback; when the error carries
    `rerun_with` flags this script has, the user's command with them follows;
  - anything else is a bug: Python's traceback, as before;
  - `--debug` (or `BERT_JAX_DEBUG=1` in the environment) shows the traceback of
    user errors too.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import sys
from typing import Callable

from absl import app, flags
from ml_collections import config_flags

from bert_jax.errors import UserError

EXIT_USER_ERROR = 2
DEBUG_ENV = "BERT_JAX_DEBUG"

DEBUG = flags.DEFINE_bool("debug", False, "Show the Python traceback of user errors "
                          f"too (also: {DEBUG_ENV}=1 in the environment).")


def run(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    """`app.run(main, argv)`, with user errors reported as `error: ...` (exit 2)."""
    sys.unraisablehook = _without_closed_loop_reports
    app.run(functools.partial(_report_user_errors, main), argv=argv,
            flags_parser=parse_flags)


_user_error_reported = False


def _without_closed_loop_reports(unraisable) -> None:
    """Drops what a failed Orbax restore (a damaged checkpoint) leaves behind:
    'Event loop is closed' errors of TensorStore reads still in flight, and,
    once the user error is reported, the read errors of its abandoned
    coroutines at exit: thousands of traceback lines around the error line."""
    closed_loop = (isinstance(unraisable.exc_value, RuntimeError)
                   and str(unraisable.exc_value) == "Event loop is closed")
    if not (closed_loop or _user_error_reported):
        sys.__unraisablehook__(unraisable)


def debugging(argv: list[str] | None = None) -> bool:
    """Whether user errors should show their traceback: `--debug` (read from
    `argv` when the flags could not be parsed) or BERT_JAX_DEBUG=1."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return True
    if flags.FLAGS.is_parsed():
        return DEBUG.value
    return any(arg in ("--debug", "--debug=true", "--debug=1") for arg in argv or ())


def fail(message: str) -> None:
    """Prints `error: message` on stderr and exits with status 2."""
    global _user_error_reported
    _user_error_reported = True
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
    """absl's flag parsing, with its errors, those ml_collections raises for an
    unknown config field, a config file that cannot be loaded and a `UserError`
    its `get_config` raises reported as `error: ...`."""
    try:
        try:
            remaining = flag_values(argv)
        except (AttributeError, KeyError) as e:  # ml_collections: no such config field
            if not any(arg.startswith("--config.") for arg in argv):
                raise
            raise flags.Error(unknown_config_field(e, argv)) from e
        except (OSError, SyntaxError) as e:  # a config file: missing (with --config.*
            # overrides), or a syntax error in it
            flag = next((a for a in argv if a.split("=")[0] == "--config"), "--config")
            raise _unloadable(flag, e) from e
        _load_config_files(flag_values)
    except flags.Error as e:
        if debugging(argv):
            raise
        fail(f"{_without_config_traceback(e)}\n(--helpshort lists this script's flags)")
    except UserError as e:  # a config file's get_config, e.g. a --workdir without a run
        if debugging(argv):
            raise
        fail(str(e))
    return remaining


def _without_config_traceback(error: flags.Error) -> str:
    """absl's message, but for a `UserError` raised by a config file's
    `get_config` (e.g. an unknown variant) its message instead of the traceback
    ml_collections puts in (other errors in a config file keep it)."""
    text = str(error)
    flag, found, _ = text.partition(": Error whilst parsing config file:")
    causes = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(causes) < 10:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    user_errors = [c for c in causes if isinstance(c, UserError)]
    return f"{flag}: {user_errors[-1]}" if found and user_errors else text


def _load_config_files(flag_values: flags.FlagValues) -> None:
    """ml_collections defers a config file's load error until the config is
    first used, deep inside `main`; this raises it now, naming the flag."""
    for name in flag_values:
        flag = flag_values[name]
        if not config_flags.config_flags.is_config_flag(flag) or flag.value is None:
            continue
        try:
            flag.value.keys()
        except OSError as e:
            raise _unloadable(f"--{name}={config_flags.get_config_filename(flag)}", e) from e


def _unloadable(flag: str, error: Exception) -> flags.Error:
    """The error for a config file that cannot be loaded: missing, or a syntax
    error ('invalid syntax (FILE, line N)')."""
    reason = (str(error) if isinstance(error, SyntaxError)
              else str(error).strip().splitlines()[-1].strip())
    return flags.IllegalFlagValueError(f"{flag}: cannot load the config file: {reason}")


def unknown_config_field(error: Exception, argv: list[str]) -> str:
    """The message for a `--config.a.b=v` override of a field the config lacks.

    ml_collections raises `AttributeError(KeyError("'b'\\nDid you mean ..."))`
    (the hint only for nested fields); this names the override instead.
    """
    while error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    text = str(error.args[0]) if error.args else str(error)
    first, _, hint = text.partition("\n")
    key = first.strip("'\"")
    overrides = [arg for arg in argv if arg.startswith("--config.")
                 and key in re.split(r"[.=]", arg.split("=", 1)[0])]
    flag = overrides[0] if overrides else "a --config override"
    message = f"{flag}: the config has no field {key!r}."
    return message + (f" {hint.strip()}" if hint else
                      " Check the spelling and the section (config.json in a workdir "
                      "lists every field).")


def _report_user_errors(main: Callable[[list[str]], int | None], argv: list[str]
                        ) -> int | None:
    try:
        return main(argv)  # absl exits with what main returns
    except (UserError, app.UsageError) as e:
        if debugging():
            raise
        rerun_with = getattr(e, "rerun_with", None) or {}
        runnable = rerun_with and all(name in flags.FLAGS for name in rerun_with)
        fail(str(e) + (f"\n  {command_with(rerun_with)}" if runnable else ""))


def command_with(new_flags: dict, argv: list[str] | None = None) -> str:
    """The command line that started this script, with `new_flags` set (replacing
    any earlier value), quoted for a POSIX shell."""
    argv = list(sys.argv if argv is None else argv)
    names = {f"--{name}" for name in new_flags}
    kept = [arg for arg in argv[1:] if arg.split("=", 1)[0] not in names]
    added = [f"--{name}={value}" for name, value in new_flags.items()]
    return shlex.join(["python", argv[0], *kept, *added])
