"""calls.jsonl: one JSON object a line, flushed as it happens."""

from __future__ import annotations

import json
import os
import threading
from typing import Any, TextIO


class JsonlRecorder:
    """Thread-safe writer; each record is one line, flushed to the OS at once.

    Records arrive masked (each text field, by the run stage). A lone surrogate from a model is
    written as its JSON escape, so that the file stays valid UTF-8 and valid JSON.
    """

    def __init__(self, handle: TextIO) -> None:
        self._lock = threading.Lock()
        self._handle: TextIO | None = handle
        # The file as opened: a command may replace the name meanwhile (see `text`).
        self.inode = os.fstat(handle.fileno()).st_ino
        self._lines: list[str] = []

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
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
