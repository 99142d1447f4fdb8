"""What the model is sent of an MCP tool's parameter that is no scalar (an array, an object, a
union): a JSON Schema a provider accepts, built from the server's own by a whitelist.

An MCP server's input schema is untrusted input. What is sent of it:

- the structure of values: `type` (JSON Schema's names only), `items`, `prefixItems`,
  `properties`, `additionalProperties`, `anyOf` / `oneOf` / `allOf`, and the bounds (`minimum`,
  `maxLength`, `format`...; no `pattern`) where they have their type; an array always has its
  `items` (a provider refuses an array schema without: any value, where the server gave none or
  a draft-07 list);
- what SPEC 2 says in text, in text: a nested `description`, with the allowed values (`enum`,
  `const`), the default and the required members written into it, never as keywords;
- references to the schema's `$defs` (how pydantic writes nested models) written out, since the
  parameter is sent without the root they point into: at most `REFS` in all and `DEPTH` levels
  of nesting, past which a value is any value (a schema that refers to itself several times a
  level would grow exponentially, a long chain would exhaust the stack);
- nothing else: no `title`, `examples`, `$defs`, `$id`, unknown keywords; data (`enum`, `const`,
  `default`) is never read as schema. A result over `MAX_BYTES` of JSON is sent as its top
  level's type alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mm_batch.jsontypes import JsonObject, JsonValue

REFS = 64
DEPTH = 32
MAX_BYTES = 16 * 1024
JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNT_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties")
# No `pattern`: a regular expression holding a masked secret is no longer one, and dialects differ.
_TEXT_BOUNDS = ("format",)
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


@dataclass
class _Budget:
    defs: JsonObject
    refs_left: int = REFS


def resolved(schema: JsonValue, defs: JsonValue) -> JsonObject:
    """A parameter's schema with a reference at its top written out (its own description and
    default kept beside the definition's), and `Optional[X]` (`anyOf` of X and null) read as
    X: what tells a scalar behind a reference (a pydantic enum) from an array or an object."""
    own = schema if isinstance(schema, dict) else {}
    table = defs if isinstance(defs, dict) else {}
    target = _target(own.get("$ref"), table)
    if target is not None:
        own = {**target, **{k: v for k, v in own.items() if k != "$ref"}}
    options = own.get("anyOf", own.get("oneOf"))
    others = [o for o in options if o != {"type": "null"}] if isinstance(options, list) else []
    if isinstance(options, list) and len(options) == 2 and len(others) == 1:
        rest = {k: v for k, v in own.items() if k not in ("anyOf", "oneOf")}
        inner = resolved(others[0], table) if isinstance(others[0], dict) else {}
        own = {**inner, **rest}
    return own


def _target(ref: JsonValue, defs: JsonObject) -> JsonObject | None:
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return None
    target = defs.get(ref.removeprefix("#/$defs/"))
    return target if isinstance(target, dict) else None


def sent_schema(schema: JsonObject, defs: JsonValue) -> JsonObject:
    """The schema sent for a parameter whose own schema is `schema` (its description and what
    goes in text left to the caller), `defs` the input schema's `$defs`."""
    budget = _Budget(defs if isinstance(defs, dict) else {})
    top = {k: v for k, v in schema.items() if k not in ("description", "enum", "const", "default")}
    sent = _schema(top, budget, DEPTH)
    if len(json.dumps(sent)) <= MAX_BYTES:
        return sent
    kind = sent.get("type")
    return {"type": kind, "items": {}} if kind == "array" else {"type": kind} if kind else {}


def _schema(node: JsonValue, budget: _Budget, depth: int) -> JsonObject:
    if not isinstance(node, dict) or depth <= 0:
        return {}
    ref = node.get("$ref")
    if ref is not None:
        target = _target(ref, budget.defs)
        if target is None or budget.refs_left <= 0:
            return {}
        budget.refs_left -= 1
        return _schema(target, budget, depth - 1)
    out: JsonObject = {}
    kinds = _types(node.get("type"))
    if kinds:
        out["type"] = kinds[0] if len(kinds) == 1 else list(kinds)
    properties = node.get("properties")
    if isinstance(properties, dict):
        out["properties"] = {
            str(name): _schema(sub, budget, depth - 1) for name, sub in properties.items()
        }
    extra = node.get("additionalProperties")
    if isinstance(extra, bool):
        out["additionalProperties"] = extra
    elif isinstance(extra, dict):
        out["additionalProperties"] = _schema(extra, budget, depth - 1)
    items = node.get("items")
    if isinstance(items, dict):
        out["items"] = _schema(items, budget, depth - 1)
    for key in _LISTS:
        options = node.get(key)
        if isinstance(options, list) and options:
            out[key] = [_schema(option, budget, depth - 1) for option in options]
    if "array" in kinds and "items" not in out:
        out["items"] = {}
    for key in _NUMBER_BOUNDS:
        value = node.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
    for key in _COUNT_BOUNDS:
        value = node.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = value
    for key in _TEXT_BOUNDS:
        value = node.get(key)
        if isinstance(value, str):
            out[key] = value
    text = _text(node)
    if text:
        out["description"] = text
    return out


def _types(kind: JsonValue) -> tuple[str, ...]:
    """JSON Schema's type names in a `type` (one, or a list of them); none for anything else."""
    listed = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    if not listed or not all(isinstance(k, str) and k in JSON_TYPES for k in listed):
        return ()
    return tuple(dict.fromkeys(str(k) for k in listed))


def types_of(schema: JsonObject) -> tuple[str, ...]:
    """The JSON types a schema's top level admits (none: any)."""
    return _types(schema.get("type"))


def _text(node: JsonObject) -> str:
    """A nested schema's description, with what SPEC 2 says in text rather than as keywords."""
    description = node.get("description")
    parts = [description.strip()] if isinstance(description, str) and description.strip() else []
    enum = node.get("enum")
    if isinstance(enum, list) and enum:
        parts.append("One of: " + ", ".join(_shown(v) for v in enum) + ".")
    if "const" in node:
        parts.append(f"Always {_shown(node['const'])}.")
    if "default" in node:
        parts.append(f"Default: {_shown(node['default'])}.")
    required = node.get("required")
    if isinstance(required, list) and required:
        parts.append("Required: " + ", ".join(str(r) for r in required) + ".")
    return " ".join(parts)


def _shown(value: JsonValue) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
