"""calls.jsonl: one JSON object a line, flushed as it happens.

One writer and one reader of its lines (SPEC 7): a record is written with every non-ASCII
character escaped, so that no character any reader takes for a line break (U+2028, U+2029,
U+0085, the \\x1c-\\x1e separators, \\v, \\f) is ever inside a line, and the text is split on
`\\n` only, never with `str.splitlines`, which breaks a line at each of those.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TextIO


def record_line(record: Mapping[str, object]) -> str:
    """One record as calls.jsonl holds it: pure ASCII JSON (a lone surrogate from a model is
    its escape, so the file stays valid UTF-8 and valid JSON), then `\\n`."""
    return json.dumps(record, ensure_ascii=True, default=str) + "\n"


def record_lines(text: str) -> Iterator[tuple[int, str]]:
    """calls.jsonl's non-blank lines with their 1-based numbers, split on `\\n` only; a line
    written by an older mm-batch, raw non-ASCII characters and all, reads as it was meant."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield number, line


class JsonlRecorder:
    """Thread-safe writer; each record is one line, flushed to the OS at once.

    Records arrive masked (each text field, by the run stage).
    """

    def __init__(self, handle: TextIO) -> None:
        self._lock = threading.Lock()
        self._handle: TextIO | None = handle
        # The file as opened: a command may replace the name meanwhile (see `text`).
        self.inode = os.fstat(handle.fileno()).st_ino
        self._lines: list[str] = []

    def write(self, record: Mapping[str, object]) -> None:
        self.write_line(record_line(record))

    def write_line(self, line: str) -> None:
        """A record's line as written before (`record_line`): a record kept by a rerun."""
        with self._lock:
            if self._handle is None:
                return
            self._handle.write(line)
            self._handle.flush()
            self._lines.append(line)

    def text(self) -> str:
        """Every line written, as written: what the reports read, never the file again (its
        name may hold a link or another file by now)."""
        with self._lock:
            return "".join(self._lines)

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.flush()
                os.fsync(self._handle.fileno())
                self._handle.close()
                self._handle = None
