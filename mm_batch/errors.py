"""Exit codes, and the one type of error that means "the user's input is wrong, nothing ran"."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What `mm-batch` exits with (SPEC §8). No uncaught exception may ever exit 1."""

    PASSED = 0
    FAILED = 1  # at least one task failed: the verdict CI reads
    USAGE = 2  # usage or configuration error: nothing ran (or nothing merged)
    ERROR = 3  # none failed, at least one task run could not be judged
    BUG = 4  # mm-batch itself failed outside any one task run
    INTERRUPTED = 130  # SIGINT, SIGTERM or SIGHUP; the reports were written


class UsageError(Exception):
    """What the user gave cannot be used: the message says what, `consequence` what followed."""

    consequence = "nothing ran"
