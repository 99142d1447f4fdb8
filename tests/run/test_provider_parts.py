"""A turn's provider-specific parts go back into the history as they came, masked (SPEC 6, 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.run.ports import ModelReply, ToolCallRequest
from tests.helpers import write, yolo_agent
from tests.run.scripted import answer, run_tasks

SECRET = "hunter2-secret-value"
TASKS = """
agent: agent.yaml
tasks:
  - id: t
    prompt: Take a note.
"""
AGENT = yolo_agent("note", "Write a note.", '["echo", "{{text}}"]', "{text: {type: string}}")

# JSON-like parts as a provider may send them: keys are structure, strings are text.
_leaves = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=12)
_json = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


def _turn(parts: dict[str, Any], call_fields: dict[str, Any]) -> ModelReply:
    call = ToolCallRequest("c0", "note", '{"text": "hi"}', provider_fields=call_fields)
    return ModelReply(None, (call,), "tool_calls", 10, 5, 0.0, provider_parts=parts)


def test_signed_thinking_goes_back_unchanged(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", AGENT)
    tasks = write(tmp_path, "tasks.yaml", TASKS)
    block = {"type": "thinking", "thinking": "call note", "signature": "c2lnbmVk=="}
    signature = {"thought_signature": "Z2VtaW5p"}
    parts = {"thinking_blocks": [block], "reasoning_content": "call note"}
    out = run_tasks(tasks, [_turn(parts, {"provider_specific_fields": signature}), answer("ok")])
    assistant = out.client.requests[1][1]
    assert assistant["thinking_blocks"] == [block]
    assert assistant["reasoning_content"] == "call note"
    assert assistant["tool_calls"][0]["provider_specific_fields"] == signature
    assert assistant["tool_calls"][0]["function"]["name"] == "note"


@settings(max_examples=60, deadline=None)
@given(
    parts=st.dictionaries(st.sampled_from(["thinking_blocks", "provider_specific_fields"]), _json)
)
def test_a_secret_in_any_part_is_masked_and_the_structure_kept(
    tmp_path_factory: Any, parts: dict[str, Any]
) -> None:
    tmp_path = tmp_path_factory.mktemp("parts")
    write(tmp_path, "agent.yaml", AGENT)
    tasks = write(tmp_path, "tasks.yaml", TASKS)
    salted = {k: [v, f"x{SECRET}y"] for k, v in parts.items()}
    out = run_tasks(tasks, [_turn(salted, {}), answer("ok")], secrets=[SECRET])
    assistant = out.client.requests[1][1]
    sent = {k: assistant[k] for k in salted}
    assert all(SECRET not in s for s in _strings(sent))
    assert _shape(sent) == _shape(salted)
