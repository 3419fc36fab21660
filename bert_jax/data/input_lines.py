"""The screening of the lines a user feeds a command-line tool (e.g.
launch/translate.py) before any of them is processed.

    kept = screen_lines(lines, task.source_problems, on_error="warn", name="in.txt")

`screen_lines` takes the lines and a callback `problems_of(line)`, the task's
list of what is wrong with a line (quoting it `shorten`ed); bytes that are not
UTF-8 (read with errors="surrogateescape") are a problem too. It returns one
entry per input line, the line without its newline or None. `on_error` says
what a bad line does: `fail` reports every bad line (up to MAX_REPORTED, each
as `name:line: what`) in one `DataError` whose `path` is `name`, processing
nothing; `skip` warns and makes the line None (its output line is empty, so
output line i still answers input line i); `warn` warns and keeps the line
as it is, to be processed.
"""

from __future__ import annotations

import re
import sys
from typing import Callable, Iterable

from bert_jax.config_schema import choice
from bert_jax.errors import DataError, where

ON_ERROR = ("fail", "skip", "warn")
NOT_UTF8 = re.compile("[\udc80-\udcff]")  # a byte read with errors="surrogateescape"
MAX_REPORTED = 10


def shorten(text: str, limit: int = 40) -> str:
    """`text` cut to its first `limit` characters and "..." when longer: what an error
    message quotes of the user's input (a line may be megabytes)."""
    return text if len(text) <= limit else text[:limit] + "..."


def screen_lines(lines: Iterable[str], problems_of: Callable[[str], list[str]],
                 on_error: str, name: str) -> list[str | None]:
    """The lines (without newlines), bad ones handled per `on_error` (see module doc)."""
    choice("on_error", on_error, ON_ERROR)
    kept, reports = [], []
    for number, line in enumerate(lines, 1):
        line, byte = line.rstrip("\n"), NOT_UTF8.search(line)
        problems = ([f"byte {ord(byte[0]) - 0xdc00:#x} at column {byte.start() + 1} is not "
                     "UTF-8"] if byte else problems_of(line))
        if byte:  # processed (warn) with U+FFFD in its place
            line = line.encode(errors="surrogateescape").decode(errors="replace")
        if problems:
            reports.append(f"{where(name, number)}: {'; '.join(problems)}")
            if on_error != "fail":
                action = "skipped" if on_error == "skip" else "processed as it is"
                print(f"warning: {reports[-1]} ({action})", file=sys.stderr, flush=True)
        kept.append(None if problems and on_error == "skip" else line)
    if reports and on_error == "fail":
        more = len(reports) - MAX_REPORTED
        raise DataError(name, f"{len(reports)} bad input line(s) (fix them, or pass "
                        "--on_error=skip (an empty output line for each) or --on_error=warn "
                        "(process them as they are)):\n  " + "\n  ".join(reports[:MAX_REPORTED])
                        + (f"\n  ... and {more} more" if more > 0 else ""))
    return kept
