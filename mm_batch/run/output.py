"""What the model reads of a command that ran: the echo, the exit code, output cut to 16 KiB.

Secrets are masked before any cut, so a secret straddling a cut leaks no prefix.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from mm_batch.config.secrets import Masker
from mm_batch.run.ports import Captured, ExecResult

MODEL_OUTPUT_LIMIT = 16 * 1024


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def echo(argv: Sequence[str]) -> str:
    return "$ " + shlex.join(argv)


def captured_text(captured: Captured, masker: Masker) -> str:
    """A stream as text, secrets masked (also one begun where the capture stopped)."""
    return masker.text(decode(captured.data), cut=captured.cut > 0)


def _stream(label: str, captured: Captured, masker: Masker) -> list[str]:
    if captured.total == 0:
        return []
    text = captured_text(captured, masker)
    data = text.encode("utf-8", "surrogatepass")
    shown = data[:MODEL_OUTPUT_LIMIT].decode("utf-8", "ignore")
    lines = [f"{label}:", shown.rstrip("\n")]
    if len(data) > MODEL_OUTPUT_LIMIT or captured.cut > 0:
        cut = captured.total - len(shown.encode("utf-8", "surrogatepass"))
        lines.append(f"[... {cut} more bytes of {label} cut; {captured.total} in all ...]")
    return lines


def model_result(argv: Sequence[str], result: ExecResult, timeout: float, masker: Masker) -> str:
    lines = [masker.text(echo(argv))]
    if result.error is not None:
        lines.append(f"could not run: {masker.text(result.error)}")
        return "\n".join(lines)
    if result.timed_out:
        lines.append(f"timed out after {timeout:g} s: the command was stopped")
    elif result.interrupted:
        lines.append("interrupted: the command was stopped")
    else:
        lines.append(f"exit code: {result.exit_code}")
    body = _stream("stdout", result.stdout, masker) + _stream("stderr", result.stderr, masker)
    lines.extend(body or ["(no output)"])
    return "\n".join(lines)
