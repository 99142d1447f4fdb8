"""What the model is sent of a declared tool: its schema, and the description that carries
required-ness, allowed values and defaults in text (SPEC §2: never as `required` or `enum`)."""

from __future__ import annotations

from mm_batch.config.model import ParamSpec, ToolSpec, render_value
from mm_batch.config.secrets import NO_SECRETS, Masker
from mm_batch.jsontypes import JsonObject
from mm_batch.tools.mcp_schema import types_of

CLOSING_SENTENCE = "Give each parameter as its own field."


def _type_word(param: ParamSpec) -> str:
    """A parameter's type as the text says it: JSON Schema's word ("array", "object") for an
    MCP parameter of mm-batch's type "json", never "json"."""
    if param.type != "json":
        return param.type
    named = types_of(param.schema or {})  # one name, or a list of several (`mcp_schema`)
    return named[0] if len(named) == 1 else "any JSON value"


def _param_facts(param: ParamSpec) -> list[str]:
    facts = [_type_word(param), "required" if param.required else "optional"]
    if param.enum is not None:
        facts.append("one of: " + ", ".join(render_value(v) for v in param.enum))
    if param.default is not None:
        facts.append(f"default {render_value(param.default)}")
    return facts


def parameter_line(param: ParamSpec) -> str:
    """One line per parameter, for the tool description and for invalid-call answers."""
    text = f"- {param.name} ({', '.join(_param_facts(param))})"
    return f"{text}: {param.description}" if param.description else text


def _property_description(param: ParamSpec) -> str:
    parts = [param.description.rstrip()] if param.description else []
    parts.append("Required." if param.required else "Optional.")
    if param.enum is not None:
        parts.append("One of: " + ", ".join(render_value(v) for v in param.enum) + ".")
    if param.default is not None:
        parts.append(f"Default: {render_value(param.default)}.")
    return " ".join(parts)


def tool_description(tool: ToolSpec) -> str:
    lines = [tool.description.rstrip()] if tool.description else []
    lines.extend(parameter_line(p) for p in tool.params)
    lines.append(CLOSING_SENTENCE)
    return "\n".join(lines)


def _type_schema(param: ParamSpec, masker: Masker) -> JsonObject:
    """The JSON Schema of a parameter's type: a scalar's name, or what an MCP parameter's own
    schema makes (`tools.mcp_schema`; none: any JSON value), masked: its texts and allowed
    values are the server's words. "json" is mm-batch's word, never JSON Schema's."""
    if param.type == "json":
        return masker.data(dict(param.schema or {}), keys=False)
    return {"type": param.type}


def model_schema(tool: ToolSpec, masker: Masker = NO_SECRETS) -> JsonObject:
    """The OpenAI tool entry: types and descriptions only, never `required` or `enum` keywords.
    The descriptions are masked by `masker` (a secret can stand in one, where a parameter's
    example is written); names and types are structure, never touched."""
    properties: JsonObject = {
        p.name: {**_type_schema(p, masker), "description": masker.text(_property_description(p))}
        for p in tool.params
    }
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": masker.text(tool_description(tool)),
            "parameters": {"type": "object", "properties": properties},
        },
    }
