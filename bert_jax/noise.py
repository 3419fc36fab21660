"""Library noise, in one place: what Orbax, asyncio, grain, tfds, JAX and Beam print that
tells a bert_jax user nothing, and the filters that keep it off the terminal.

Every filter sits where the reports it means pass (a named logger, or the hook of
unraisable errors), never process-wide, and is keyed on where a report comes from (the
library module whose code logged or raised it, the function, the level), never on its
text: a library that rewords a message cannot make a filter drop something else, and a
filter never parses a message. A module is known by its dotted name; a record of absl's
one logger (`absl`, which Orbax, grain and tfds log through) by the installed folder of
the library its file is in. The one text matched is CPython's own fixed wording of
'coroutine ... was never awaited', a RuntimeWarning that names no module (it is
attributed to whatever code ran when the coroutine was collected).

- `quiet_library_logs()` (the launch scripts, at start-up): on the `absl` logger, drops
  the libraries' INFO records (their warnings and errors stay), the warning of Orbax's
  metadata readers that a checkpoint item has no `_CHECKPOINT_METADATA` (the step folder
  holds it; every restore of the parameters alone would print it), and the tracebacks
  Orbax logs from its threads (a failed save: hundreds of lines; the error reaches the
  caller too); the libraries' own loggers (`jax._src`, `apache_beam`) log from WARNING up.
- `drop_unraisable_io_errors()` (once a checkpoint is read or written) and
  `drop_reports_of_abandoned_io()` (once one failed): what Orbax's abandoned reads and
  writes report later, from its threads or at exit, after the caller got the error: the
  errors raised in Orbax's or asyncio's modules (unraisable, or logged on the `asyncio`
  logger) and the warnings that its coroutines were never awaited. Nothing else is muted:
  a NumPy RuntimeWarning, or an error raised in other code, is still reported.
- `importing_beam()`: Beam's import-time warning that its Google Cloud clients are
  missing (bert_jax runs no Google Cloud transform).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
import warnings

from bert_jax.errors import chain

# The libraries whose INFO records are dropped (dotted names: a package or a module).
NOISY_LIBRARIES = ("orbax", "grain", "tensorflow_datasets", "jax._src", "apache_beam")
# Orbax's readers of a checkpoint item's metadata, each a function `read` that warns
# when the item has none (the v1 API's reader is the second).
ORBAX_METADATA_READERS = ("orbax.checkpoint._src.metadata.checkpoint",
                          "orbax.checkpoint.experimental.v1._src.metadata.serialization")
BEAM_GCP_CLIENTS = "apache_beam.io.gcp"  # warns at import when apitools is missing
ABANDONED_IO = ("orbax", "asyncio")  # the packages that raise what abandoned reads report
UNAWAITED = r"coroutine '.*' was never awaited"  # CPython's RuntimeWarning, at collection


@functools.cache
def installed(modules: tuple[str, ...]) -> tuple[str, ...]:
    """Where the dotted `modules` are installed, as prefixes of their files' paths
    (`folder/` for a package, `file.py` for a module), found from their top-level
    packages' folders without importing anything (a library not installed has none)."""
    found = []
    for module in modules:
        top, *rest = module.split(".")
        spec = importlib.util.find_spec(top)
        for folder in (spec and spec.submodule_search_locations) or []:
            path = os.path.join(folder, *rest)
            found.append(os.path.join(path, "") if os.path.isdir(path) else path + ".py")
    return tuple(found)


def _quiet_libraries(record: logging.LogRecord) -> bool:
    """The filter `quiet_library_logs` installs on the `absl` logger (see the module
    docstring)."""
    if record.pathname.startswith(installed(("orbax",))) and (record.exc_info or (
            record.levelno == logging.WARNING and record.funcName == "read"
            and record.pathname.startswith(installed(ORBAX_METADATA_READERS)))):
        return False
    return record.levelno >= logging.WARNING or not record.pathname.startswith(
        installed(NOISY_LIBRARIES))


def quiet_library_logs() -> None:
    """Keeps the progress lines readable; call once at start-up (again: no change)."""
    logging.getLogger("absl").addFilter(_quiet_libraries)
    for name in NOISY_LIBRARIES:  # those that log through loggers of their own
        logging.getLogger(name).setLevel(logging.WARNING)


def _raised_in_io_libraries(error: BaseException | None) -> bool:
    """Whether `error`, or one of its causes, was raised in a module of Orbax or asyncio
    (the module of its innermost frame: where it was raised, not what it passed through)."""
    for cause in chain(error):
        tb = cause.__traceback__
        while tb and tb.tb_next:
            tb = tb.tb_next
        if tb and tb.tb_frame.f_globals.get("__name__", "").split(".")[0] in ABANDONED_IO:
            return True
    return False


def drop_unraisable_io_errors() -> None:
    """Orbax reports a failed save or restore to the caller, but the reads and writes it
    abandons on an event loop it closes raise again, unraisable: hundreds of ~70-line
    reports from its threads while training goes on (a failed async save), or at exit.
    From the first call on, this process drops unraisable errors raised in Orbax's or
    asyncio's modules (other code's are still reported)."""
    if getattr(sys.unraisablehook, "drops_orbax_io", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable):  # never a KeyboardInterrupt (`launch/cli.py` raises it again)
        if not (isinstance(unraisable.exc_value, Exception)
                and _raised_in_io_libraries(unraisable.exc_value)):
            previous(unraisable)
    hook.drops_orbax_io = True
    sys.unraisablehook = hook


def drop_reports_of_abandoned_io() -> None:
    """After a failed save or restore, also the exceptions raised in Orbax's or asyncio's
    modules that the `asyncio` logger reports ('Task exception was never retrieved'), and
    the RuntimeWarnings that a coroutine was never awaited (the abandoned ones, collected
    unawaited; CPython's warning does not say whose); other RuntimeWarnings still show."""
    drop_unraisable_io_errors()
    asyncio_logger = logging.getLogger("asyncio")
    if _not_abandoned_io not in asyncio_logger.filters:
        asyncio_logger.addFilter(_not_abandoned_io)
    warnings.filterwarnings("ignore", UNAWAITED, RuntimeWarning)


def _not_abandoned_io(record: logging.LogRecord) -> bool:
    return not (record.exc_info and _raised_in_io_libraries(record.exc_info[1]))


def _not_beam_gcp(record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.WARNING and record.funcName == "<module>"
                and record.pathname.startswith(installed((BEAM_GCP_CLIENTS,))))


@contextlib.contextmanager
def importing_beam():
    """Around `import apache_beam`: drops the warnings Beam's Google Cloud modules log
    while they are imported (on the root logger, before any handler of ours exists)."""
    root = logging.getLogger()
    root.addFilter(_not_beam_gcp)
    try:
        yield
    finally:
        root.removeFilter(_not_beam_gcp)
