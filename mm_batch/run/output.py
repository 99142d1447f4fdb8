"""What the model reads of a command that ran: the echo, the exit code, output cut to 16 KiB."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from mm_batch.run.ports import Captured, ExecResult

MODEL_OUTPUT_LIMIT = 16 * 1024


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def echo(argv: Sequence[str]) -> str:
    return "$ " + shlex.join(argv)


def _stream(label: str, captured: Captured) -> list[str]:
    if captured.total == 0:
        return []
    shown = captured.data[:MODEL_OUTPUT_LIMIT]
    lines = [f"{label}:", decode(shown).rstrip("\n")]
    cut = captured.total - len(shown)
    if cut > 0:
        lines.append(f"[... {cut} more bytes of {label} cut; {captured.total} in all ...]")
    return lines


def model_result(argv: Sequence[str], result: ExecResult, timeout: float) -> str:
    lines = [echo(argv)]
    if result.error is not None:
        lines.append(f"could not run: {result.error}")
        return "\n".join(lines)
    if result.timed_out:
        lines.append(f"timed out after {timeout:g} s: the command was stopped")
    elif result.interrupted:
        lines.append("interrupted: the command was stopped")
    else:
        lines.append(f"exit code: {result.exit_code}")
    body = _stream("stdout", result.stdout) + _stream("stderr", result.stderr)
    lines.extend(body or ["(no output)"])
    return "\n".join(lines)
