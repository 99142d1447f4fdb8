"""calls.jsonl: one JSON object a line, masked, flushed as it happens."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, TextIO

from mm_batch.config.secrets import Masker


class JsonlRecorder:
    """Thread-safe writer; each record is one line, flushed and synced to the OS at once."""

    def __init__(self, path: Path, masker: Masker) -> None:
        self.path = path
        self._masker = masker
        self._lock = threading.Lock()
        self._handle: TextIO | None = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(self._masker.data(record), ensure_ascii=False, default=str)
        with self._lock:
            if self._handle is None:
                return
            self._handle.write(line + "\n")
            self._handle.flush()

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.flush()
                os.fsync(self._handle.fileno())
                self._handle.close()
                self._handle = None
