"""Reading the project's local text files: UTF-8, line by line, with errors
that name the file, the line and the column."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def utf8_lines(path: str, error: type[Exception], prefix: str = ""
               ) -> Iterator[tuple[int, str]]:
    """(1-based line number, text with its line break) of each line of `path`.

    Lines end at '\\n' only; a byte-order mark at the start of the file is
    dropped. A line that is not valid UTF-8 raises `error` with the message
    `{prefix}{path}:{line}:{column}: invalid UTF-8 ...`, saying how to convert
    the file.
    """
    for _, lineno, text in utf8_lines_from(path, error, prefix):
        yield lineno, text


def utf8_lines_from(path: str, error: type[Exception], prefix: str = "",
                    start: tuple[int, int] = (0, 1)) -> Iterator[tuple[int, int, str]]:
    """(byte offset, 1-based line number, text) of each line of `path` from
    `start`, the (byte offset, line number) of a line's beginning; as
    `utf8_lines` otherwise."""
    offset, first_line = start
    with open(path, "rb") as f:
        f.seek(offset)
        for lineno, raw in enumerate(f, start=first_line):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(
                    f"{prefix}{path}:{lineno}:{e.start + 1}: invalid UTF-8 ({e.reason} at "
                    f"byte {e.start + 1} of line {lineno}); convert the file to UTF-8 "
                    f"(e.g. `iconv -f latin1 -t utf-8`) or fix that line.") from None
            yield offset, lineno, text.removeprefix("\ufeff") if offset == 0 else text
            offset += len(raw)


def char_column(fields: list[str], index: int) -> int:
    """1-based character column where field `index` of a tab-split line starts."""
    return 1 + sum(len(field) + 1 for field in fields[:index])


def as_text(value) -> str:
    """A tfds text feature (bytes, or a 0-d array of bytes) or any value as str."""
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
