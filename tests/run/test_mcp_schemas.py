"""What the model is sent of an MCP tool whose parameters are arrays, objects or nested models:
JSON Schema a provider accepts (arrays with their items, no reference into a root it is not
sent with), what SPEC 2 says in text never as keywords, the server's words masked, and of
bounded size and depth whatever the server's schema (a hostile server's model may refer to
itself many times a level, or chain references deeper than the stack)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from mm_batch.config.secrets import Masker
from mm_batch.jsontypes import JsonValue
from mm_batch.run.ports import McpTool
from mm_batch.run.toolbox import mcp_tool_spec
from mm_batch.tools.coercion import Coerced, Invalid, coerce
from mm_batch.tools.schema import model_schema

SECRET = "S3CRETVALUE99"
TEXT_KEYWORDS = ("enum", "const", "default", "required", "title", "examples", "$defs")

NAMES = st.sampled_from(["A", "B", "C", "Missing"])


def _node(refs: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    scalar = st.sampled_from(
        [
            {"type": "string", "description": f"nested {SECRET}", "pattern": f"^{SECRET}$"},
            {"type": "integer", "enum": [1, 2], "default": 1},
            {"type": "string", "enum": [SECRET, "b"], "examples": [SECRET], "title": "T"},
            {"type": "array"},  # no items: a provider refuses it as it is
            {"type": "array", "items": [{"type": "string"}]},  # a draft-07 tuple
            {"type": 5},
            {"$ref": 5},
            {"const": {"$ref": "#/$defs/A"}},  # data, not schema
        ]
    )
    ref = refs.map(lambda name: {"$ref": f"#/$defs/{name}"})
    return st.one_of(scalar, ref, ref.map(lambda r: {"type": "array", "items": r}))


DEF = st.dictionaries(st.sampled_from([f"k{i}" for i in range(8)]), _node(NAMES), max_size=8).map(
    lambda props: {"type": "object", "properties": props, "required": list(props)[:1]}
)
SCHEMA = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(st.sampled_from(["p", "q"]), _node(NAMES), min_size=1),
        "$defs": st.dictionaries(st.sampled_from(["A", "B", "C"]), DEF),
    }
)


def _schemas(node: object) -> list[dict[str, Any]]:
    """Every schema in a sent schema (the values of `properties` are schemas, its keys names)."""
    if not isinstance(node, dict):
        return []
    found = [node]
    for key in ("items", "additionalProperties", "not"):
        found += _schemas(node.get(key))
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for option in node.get(key) or []:
            found += _schemas(option)
    for sub in (node.get("properties") or {}).values():
        found += _schemas(sub)
    return found


def _sent(schema: dict[str, Any]) -> Any:
    spec = mcp_tool_spec(McpTool("srv", "t", "A tool.", schema), Path())
    sent: Any = model_schema(spec, Masker([SECRET]))
    return sent["function"]["parameters"]


@settings(max_examples=300, deadline=None)
@given(SCHEMA)
def test_any_mcp_schema_is_sent_as_json_schema_a_provider_takes(schema: dict[str, Any]) -> None:
    parameters = _sent(schema)
    Draft202012Validator.check_schema(parameters)
    text = json.dumps(parameters)
    assert SECRET not in text  # the server's words are masked, however deep
    assert len(text) < 64 * 1024  # 64 references written out at most: never exponential
    for each in _schemas(parameters)[1:]:
        assert "$ref" not in each, "a reference into a root the parameters are sent without"
        assert not set(TEXT_KEYWORDS) & set(each), "said in text (SPEC 2), never as keywords"
        if each.get("type") == "array":
            assert isinstance(each.get("items"), dict), "an array without its items"


def test_a_model_that_refers_to_itself_ten_times_a_level_stays_small() -> None:
    tree: dict[str, Any] = {
        "type": "object",
        "properties": {f"k{i}": {"$ref": "#/$defs/T"} for i in range(10)},
    }
    schema: dict[str, Any] = {"properties": {"t": {"$ref": "#/$defs/T"}}, "$defs": {"T": tree}}
    sent = json.dumps(_sent(schema))
    assert len(sent) < 64 * 1024 and "$ref" not in sent


def test_a_long_chain_of_nesting_behind_a_reference_never_exhausts_the_stack() -> None:
    chain: dict[str, Any] = {"$ref": "#/$defs/A"}
    for _ in range(150):
        chain = {"type": "array", "items": chain}
    schema: dict[str, Any] = {"properties": {"x": {"$ref": "#/$defs/A"}}, "$defs": {"A": chain}}
    Draft202012Validator.check_schema(_sent(schema))


def test_a_small_schema_that_writes_out_large_is_sent_as_its_type() -> None:
    wide = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(1000)}}
    refs = {"type": "object", "properties": {f"p{j}": {"$ref": "#/$defs/A"} for j in range(64)}}
    schema: dict[str, Any] = {
        "properties": {f"x{k}": refs for k in range(20)},
        "$defs": {"A": wide},
    }
    parameters = _sent(schema)
    assert len(json.dumps(parameters)) < 20 * 1024
    assert parameters["properties"]["x0"]["type"] == "object"


def test_a_union_of_nothing_but_null_is_any_value() -> None:
    nulls: dict[str, Any] = {"anyOf": [{"type": "null"}, {"type": "null"}]}
    (param,) = mcp_tool_spec(McpTool("s", "t", "", {"properties": {"x": nulls}}), Path()).params
    assert param.type == "json"


def test_a_scalar_behind_a_reference_or_optional_is_that_scalar() -> None:
    """How pydantic writes an enum (a reference) and an optional integer (anyOf with null)."""
    colour = {"type": "string", "enum": ["red", "green"], "title": "Colour"}
    optional = {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    schema: dict[str, Any] = {
        "properties": {"colour": {"$ref": "#/$defs/Colour"}, "n": optional},
        "$defs": {"Colour": colour},
    }
    spec = mcp_tool_spec(McpTool("srv", "t", "", schema), Path())
    colour_param, n_param = spec.params
    assert (colour_param.type, colour_param.enum) == ("string", ("red", "green"))
    assert n_param.type == "integer"
    assert isinstance(coerce(n_param, "3"), Coerced)  # coerced as a declared integer is
    parameters = _sent(schema)
    assert parameters["properties"]["colour"]["type"] == "string"
    assert "enum" not in parameters["properties"]["colour"]  # in its text (SPEC 2)


def test_an_array_parameter_takes_an_array_or_the_text_of_one() -> None:
    schema: dict[str, Any] = {
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}}
    }
    (tags,) = mcp_tool_spec(McpTool("srv", "t", "", schema), Path()).params
    assert coerce(tags, ["a", "b"]) == Coerced(["a", "b"])
    assert coerce(tags, '["a", "b"]') == Coerced(["a", "b"])  # as the server would read it
    wrongs: list[JsonValue] = ["a", 3, {"a": 1}, '["a", ', '{"a": 1}']
    for wrong in wrongs:
        assert wrong is not None
        result = coerce(tags, wrong)
        assert isinstance(result, Invalid) and "expected a JSON array" in result.problem
