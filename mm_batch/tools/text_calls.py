"""Rescue tool calls that small models write as JSON text instead of real tool calls.

Qwen2.5-Coder and its kin answer `{"name": "release", "arguments": {...}}` — bare, fenced in
```json, or in <tool_call> tags. Every JSON object in the text is tried; one that names a tool
of the agent becomes a call, anything else stays text.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class TextCall:
    name: str
    raw_arguments: str


def _as_call(data: Any, known: Collection[str]) -> TextCall | None:
    if not isinstance(data, dict):
        return None
    name = data.get("name")
    if not isinstance(name, str) or name not in known:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        return TextCall(name, arguments)
    return TextCall(name, json.dumps(arguments, ensure_ascii=False))


def recover_tool_calls(text: str, known: Collection[str]) -> list[TextCall]:
    """The calls of known tools written as JSON objects anywhere in the text, in order."""
    calls: list[TextCall] = []
    index = text.find("{")
    while index != -1:
        try:
            data, end = _DECODER.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        call = _as_call(data, known)
        if call is not None:
            calls.append(call)
            index = text.find("{", end)
        else:
            index = text.find("{", index + 1)
    return calls
