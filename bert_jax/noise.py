"""Library noise, in one place: what Orbax, asyncio, grain, tfds, JAX and Beam print that
tells a bert_jax user nothing, and the filters that keep it off the terminal.

Every filter is keyed on where a report comes from (a logger's name, the library module
whose code logged or raised it, the function, the level), never on its text: a library
that rewords a message cannot make a filter drop something else, and a filter never
parses a message.

- `quiet_library_logs()` (the launch scripts, at start-up): the log handlers drop the
  libraries' INFO records (their warnings and errors stay), the warning of Orbax's metadata
  readers that a checkpoint item has no `_CHECKPOINT_METADATA` (the step folder holds it;
  every restore of the parameters alone would print it), and the tracebacks Orbax logs
  from its threads (a failed save: hundreds of lines; the error reaches the caller too).
- `drop_unraisable_io_errors()` (once a checkpoint is read or written) and
  `drop_reports_of_abandoned_io()` (once one failed): what Orbax's abandoned reads and
  writes report later, from its threads or at exit, after the caller got the error.
- `importing_beam()`: Beam's import-time warning that its Google Cloud clients are
  missing (bert_jax runs no Google Cloud transform).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
import warnings

from bert_jax.errors import chain

# Parts of the paths of library modules whose INFO records are dropped.
NOISY_LIBRARIES = ("/orbax/", "/grain/", "/tensorflow_datasets/", "/jax/_src/",
                   "/apache_beam/")
# Orbax's readers of a checkpoint item's metadata, each a function `read` that warns
# when the item has none (the v1 API's reader is the second).
ORBAX_METADATA_READERS = ("/orbax/checkpoint/_src/metadata/checkpoint.py",
                          "/orbax/checkpoint/experimental/v1/_src/metadata/serialization.py")
BEAM_GCP_CLIENTS = "/apache_beam/io/gcp/"  # warns at import when apitools is missing


class _QuietLibraries(logging.Filter):
    """The filter of `quiet_library_logs` (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "/orbax/" in record.pathname and (record.exc_info or (
                record.levelno == logging.WARNING and record.funcName == "read"
                and record.pathname.endswith(ORBAX_METADATA_READERS))):
            return False
        return record.levelno >= logging.WARNING or not any(
            part in record.pathname for part in NOISY_LIBRARIES)


def quiet_library_logs() -> None:
    """Keeps the progress lines readable; call once at start-up, after the log
    handlers exist."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietLibraries())


def _through_orbax(error: BaseException | None) -> bool:
    """Whether `error`, or one of its causes, was raised through Orbax's or asyncio's code."""
    return any(part in frame.f_code.co_filename for cause in chain(error)
               for frame, _ in traceback.walk_tb(cause.__traceback__)
               for part in ("/orbax/", "/asyncio/"))


def drop_unraisable_io_errors() -> None:
    """Orbax reports a failed save or restore to the caller, but the reads and writes it
    abandons on an event loop it closes raise again, unraisable: hundreds of ~70-line
    reports from its threads while training goes on (a failed async save), or at exit.
    From the first call on, this process drops unraisable errors raised through Orbax's
    or asyncio's code (other code's are still reported)."""
    if getattr(sys.unraisablehook, "drops_orbax_io", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable):  # never a KeyboardInterrupt (`launch/cli.py` raises it again)
        if not (isinstance(unraisable.exc_value, Exception)
                and _through_orbax(unraisable.exc_value)):
            previous(unraisable)
    hook.drops_orbax_io = True
    sys.unraisablehook = hook


def drop_reports_of_abandoned_io() -> None:
    """After a failed save or restore, also the exceptions the `asyncio` logger reports
    ('never retrieved') and the RuntimeWarnings of the abandoned coroutines, collected
    unawaited."""
    drop_unraisable_io_errors()
    asyncio_logger = logging.getLogger("asyncio")
    if _no_exceptions not in asyncio_logger.filters:
        asyncio_logger.addFilter(_no_exceptions)
    warnings.simplefilter("ignore", RuntimeWarning)


def _no_exceptions(record: logging.LogRecord) -> bool:
    return not record.exc_info


def _not_beam_gcp(record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.WARNING and BEAM_GCP_CLIENTS in record.pathname
                and record.funcName == "<module>")


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
