"""What the model reads of a command that ran: the echo, the exit code, output cut to 16 KiB.

Secrets are masked before any cut, so a secret straddling a cut leaks no prefix.
"""

from __future__ import annotations

import codecs
import shlex
from collections.abc import Sequence

from mm_batch.config.secrets import Masked, Masker, head_bytes
from mm_batch.run.ports import Captured, ExecResult

MODEL_OUTPUT_LIMIT = 16 * 1024


def decode(data: bytes, cut: int = 0) -> str:
    """Bytes a command wrote as text; when the capture was `cut` short, without the character
    the cut split (its first bytes would decode as U+FFFD and hide a secret's begun tail)."""
    if not cut:
        return data.decode("utf-8", errors="replace")
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)


def echo(argv: Sequence[str]) -> str:
    return "$ " + shlex.join(argv)


def captured_text(captured: Captured, masker: Masker) -> Masked:
    """A stream as text, secrets masked (also one begun where the capture stopped, even inside
    one of its characters)."""
    return masker.captured(captured.data, cut=captured.cut > 0)


def _stream(label: str, captured: Captured, masker: Masker) -> list[str]:
    if captured.total == 0:
        return []
    shown, left_out = head_bytes(captured_text(captured, masker), MODEL_OUTPUT_LIMIT)
    lines = [f"{label}:", shown.rstrip("\n")]
    if left_out or captured.cut > 0:
        cut = captured.total - len(shown.encode("utf-8", "surrogatepass"))
        lines.append(f"[... {cut} more bytes of {label} cut; {captured.total} in all ...]")
    return lines


def model_result(argv: Sequence[str], result: ExecResult, timeout: float, masker: Masker) -> str:
    lines: list[str] = [masker.text(echo(masker.argv(argv)))]
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
