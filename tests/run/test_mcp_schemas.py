"""What the model is sent of an MCP tool whose parameters are arrays, objects or nested models:
JSON Schema without references into a root it is not sent with, and of bounded size whatever
the server's schema (a hostile server's model may refer to itself many times a level)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from mm_batch.run.ports import McpTool
from mm_batch.run.toolbox import mcp_tool_spec
from mm_batch.tools.schema import model_schema

NAMES = st.sampled_from(["A", "B", "C", "Missing"])


def _node(refs: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    scalar = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}])
    ref = refs.map(lambda name: {"$ref": f"#/$defs/{name}"})
    return st.one_of(scalar, ref, ref.map(lambda r: {"type": "array", "items": r}))


DEF = st.dictionaries(st.sampled_from([f"k{i}" for i in range(8)]), _node(NAMES), max_size=8).map(
    lambda props: {"type": "object", "properties": props}
)
SCHEMA = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(st.sampled_from(["p", "q"]), _node(NAMES), min_size=1),
        "$defs": st.dictionaries(st.sampled_from(["A", "B", "C"]), DEF),
    }
)


def _refs(node: object) -> int:
    if isinstance(node, dict):
        return ("$ref" in node) + sum(_refs(v) for v in node.values())
    return sum(_refs(v) for v in node) if isinstance(node, list) else 0


@settings(max_examples=200, deadline=None)
@given(SCHEMA)
def test_any_mcp_schema_is_sent_whole_valid_and_bounded(schema: dict[str, Any]) -> None:
    spec = mcp_tool_spec(McpTool("srv", "t", "A tool.", schema), Path())
    sent: Any = model_schema(spec)
    parameters = sent["function"]["parameters"]
    Draft202012Validator.check_schema(parameters)
    assert _refs(parameters) == 0
    # 64 references written out at most, each a model of 8 members: never exponential.
    assert len(json.dumps(parameters)) < 64 * 1024


def test_a_model_that_refers_to_itself_ten_times_a_level_stays_small() -> None:
    tree: dict[str, Any] = {
        "type": "object",
        "properties": {f"k{i}": {"$ref": "#/$defs/T"} for i in range(10)},
    }
    schema: dict[str, Any] = {"properties": {"t": {"$ref": "#/$defs/T"}}, "$defs": {"T": tree}}
    spec = mcp_tool_spec(McpTool("srv", "t", "", schema), Path())
    sent = json.dumps(model_schema(spec))
    assert len(sent) < 64 * 1024 and "$ref" not in sent
