"""A grammar for a local model's turn: either a plain answer, or exactly one compact call of a
declared tool, written as the text rescue reads it (`tools.text_calls`):
`{"name": "<tool>", "arguments": {...}}` on one line, with JSON's usual `, ` and `: `, bare or
in a ```` ```json ```` fence.

llama-server takes no grammar alongside `tools`, and the packaged models never write a native
call anyway: their prompt is rendered with the model's own template (the tools as it lists them)
and the completion is bound by this grammar (llama.cpp's GBNF). What the model reads is
unchanged (SPEC 2: types and descriptions; required and enum only in the text); the grammar
only keeps the decoder from writing what cannot be a call, and it binds as much as `level` says:

- `names`: the name is a declared tool's (or another name the rescue takes: a skill's), the
  arguments any JSON object;
- `types`: the arguments hold only declared parameters (in declared order), each of its type;
- `required`: and every required parameter is there;
- `enum`: and a parameter with allowed values holds one of them.

A plain answer may be anything but the beginning of a call (`{"name"`, bare or fenced) and may
not start with `<` or white space: a JSON answer of other keys or a ```bash block is never bound
to become a call. The grammar is a small tree (`Node`) rendered as GBNF, so that tests can walk
the same tree for what it admits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from mm_batch.config.model import ToolSpec
from mm_batch.jsontypes import JsonValue

Level = Literal["names", "types", "required", "enum"]
LEVELS: tuple[Level, ...] = get_args(Level)
FENCE_OPEN = "```json\n"
FENCE_CLOSE = "\n```"
# Digits of a number the grammar admits: beyond them a value is no count a tool takes.
INTEGER_DIGITS = 16
FRACTION_DIGITS = 16


@dataclass(frozen=True)
class ParamShape:
    """What the grammar knows of a parameter; `type` None: any JSON value."""

    name: str
    type: str | None
    required: bool = False
    enum: tuple[JsonValue, ...] | None = None


@dataclass(frozen=True)
class ToolShape:
    name: str
    params: tuple[ParamShape, ...]


# -- the tree ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Chars:
    """One character of a GBNF class (`[^"\\\\]`); `sample` holds characters it admits."""

    gbnf: str
    sample: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    """`item` from `least` to `most` times (None: no bound)."""

    item: Node
    least: int = 0
    most: int | None = None


@dataclass(frozen=True)
class Ref:
    rule: str


Node = Lit | Chars | Seq | Alt | Repeat | Ref


@dataclass(frozen=True)
class Grammar:
    """Named rules; `root` is where a turn starts."""

    rules: Mapping[str, Node]

    def gbnf(self) -> str:
        return "\n".join(f"{name} ::= {_gbnf(node)}" for name, node in self.rules.items()) + "\n"


def _literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def _gbnf(node: Node) -> str:
    if isinstance(node, Lit):
        return _literal(node.text)
    if isinstance(node, Chars):
        return node.gbnf
    if isinstance(node, Ref):
        return node.rule
    if isinstance(node, Seq):
        return " ".join(_grouped(item) for item in node.items) if node.items else '""'
    if isinstance(node, Alt):
        return " | ".join(_gbnf(option) for option in node.options)
    item = _grouped(node.item)
    if (node.least, node.most) == (0, None):
        return f"{item}*"
    if (node.least, node.most) == (0, 1):
        return f"{item}?"
    most = "" if node.most is None else str(node.most)
    return f"{item}{{{node.least},{most}}}"


def _grouped(node: Node) -> str:
    return f"({_gbnf(node)})" if isinstance(node, Alt | Seq) else _gbnf(node)


# -- JSON values -------------------------------------------------------------------------------

_STRING_CHAR = Alt(
    (
        Chars(r'[^"\\\x7F\x00-\x1F]', "abc xyz1.-_/é"),
        Seq((Lit("\\"), Chars(r'["\\/bfnrt]', '"\\/bfnrt'))),
        Seq((Lit("\\u"), Repeat(Chars("[0-9a-fA-F]", "0aF9"), 4, 4))),
    )
)
_DIGIT = Chars("[0-9]", "0123456789")
_INTEGER = Seq(
    (
        Repeat(Lit("-"), 0, 1),
        Alt((Lit("0"), Seq((Chars("[1-9]", "123456789"), Repeat(_DIGIT, 0, INTEGER_DIGITS - 1))))),
    )
)
_TYPE_RULES: dict[str, Node] = {
    "string": Seq((Lit('"'), Repeat(Ref("char")), Lit('"'))),
    "integer": _INTEGER,
    "number": Seq((_INTEGER, Repeat(Seq((Lit("."), Repeat(_DIGIT, 1, FRACTION_DIGITS))), 0, 1))),
    "boolean": Alt((Lit("true"), Lit("false"))),
}


def _separated(item: Node) -> Node:
    """One or more `item`s, `, ` between them."""
    return Seq((item, Repeat(Seq((Lit(", "), item)))))


_ANY_VALUE = Alt(
    (
        Ref("string"),
        Ref("number"),
        Ref("boolean"),
        Lit("null"),
        Ref("object"),
        Seq((Lit("["), Repeat(_separated(Ref("value")), 0, 1), Lit("]"))),
    )
)
_ANY_OBJECT = Seq(
    (
        Lit("{"),
        Repeat(_separated(Ref("member")), 0, 1),
        Lit("}"),
    )
)
_JSON_RULES: dict[str, Node] = {
    "char": _STRING_CHAR,
    **_TYPE_RULES,
    "value": _ANY_VALUE,
    "object": _ANY_OBJECT,
    "member": Seq((Ref("string"), Lit(": "), Ref("value"))),
}

# A call begins with one of these: bare, or in the fence the models open most calls with.
CALL_OPENINGS = ('{"name"', FENCE_OPEN + '{"name"')
_REST = Repeat(Chars("[^\\x00]", 'ab {}`\n"<1'))


def _gbnf_char(char: str) -> str:
    return {"\n": "\\n", '"': '\\"', "`": "`", "\\": "\\\\", "]": "\\]", "^": "\\^"}.get(char, char)


def _leaving(opening: str, at: int) -> Node:
    """What may follow an answer's first `at` characters, which are `opening`'s: nothing, or a
    character that leaves the opening and then anything, or the opening's next character and
    on. White space leaves it only inside a key or a fence's opening backquotes: after `{`,
    after the fence's line or where its language begins, a call written over several lines (the
    models' own habit) would leave the grammar's binding by it."""
    expected = opening[at]
    binding = opening[at - 1] in "{\n" or opening[:at] == "```"
    excluded = _gbnf_char(expected) + ("\\x00-\\x20" if binding else "\\x00")
    sample = "ab1}[é" if binding else "ab1}[é \n"
    away = Seq((Chars(f"[^{excluded}]", sample.replace(expected, "")), _REST))
    if at + 1 == len(opening):
        return Repeat(away, 0, 1)
    return Repeat(Alt((away, Seq((Lit(expected), _leaving(opening, at + 1))))), 0, 1)


# A plain answer: anything but the beginning of a call (`CALL_OPENINGS`). It may begin with `{`
# or a backquote (a JSON object of other keys, a ```bash block), never with `<` (the <tool_call>
# tags the rescue reads as a call), white space or a control character; a JSON object it begins
# with opens `{"` (as `json.dumps` writes it). A JSON answer whose first key is "name" is a
# call: the one answer the grammar binds to become one.
_ANSWER = Alt(
    (
        Seq((Chars("[^{`<\\x00-\\x20]", "TLJ1é.!"), _REST)),
        *(Seq((Lit(opening[0]), _leaving(opening, 1))) for opening in CALL_OPENINGS),
    )
)


def _value_node(param: ParamShape, level: Level) -> Node:
    if level == "enum" and param.enum:
        return Alt(tuple(Lit(json.dumps(v, ensure_ascii=False)) for v in param.enum))
    if param.type in _TYPE_RULES:
        return Ref(param.type)
    return Ref("value")


def _members(tool: int, params: Sequence[ParamShape], level: Level) -> dict[str, Node]:
    """Rules `args-T-I`: the members of parameters I.. in declared order, each optional unless
    required (at `required` and above), comma-separated; `args-T-0` may be empty only when no
    parameter is required."""
    rules: dict[str, Node] = {}
    binding = level in ("required", "enum")
    n = len(params)
    # must[i]: some parameter from i on must be there.
    must = [any(p.required and binding for p in params[i:]) for i in range(n + 1)]
    for i in reversed(range(n)):
        param = params[i]
        member = Seq(
            (Lit(json.dumps(param.name, ensure_ascii=False) + ": "), _value_node(param, level))
        )
        if i + 1 < n:
            rest = Seq((Lit(", "), Ref(f"args-{tool}-{i + 1}")))
            after: Node = rest if must[i + 1] else Repeat(rest, 0, 1)
            with_it: Node = Seq((member, after))
        else:
            with_it = member
        if (param.required and binding) or i + 1 == n:
            rules[f"args-{tool}-{i}"] = with_it
        else:
            rules[f"args-{tool}-{i}"] = Alt((with_it, Ref(f"args-{tool}-{i + 1}")))
    return dict(reversed(rules.items()))


def call_grammar(tools: Sequence[ToolShape], level: Level, also: Sequence[str] = ()) -> Grammar:
    """A plain answer, or one compact call of one of `tools`, bound as `level` says, or of a
    name of `also` (names the rescue takes that are no tool: the skills', to be answered with
    how to read them), with any arguments."""
    rules: dict[str, Node] = {}
    calls: list[Node] = []
    names = {tool.name for tool in tools}
    others = [ToolShape(name, ()) for name in dict.fromkeys(also) if name not in names]
    for t, tool in enumerate([*tools, *others]):
        head = Lit('{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": ')
        if level == "names" or t >= len(tools):
            arguments: Node = Ref("object")
        elif not tool.params:
            arguments = Lit("{}")
        else:
            rules.update(_members(t, tool.params, level))
            first = Ref(f"args-{t}-0")
            binding = level in ("required", "enum")
            empty_ok = not any(p.required for p in tool.params) or not binding
            arguments = Seq((Lit("{"), Repeat(first, 0, 1) if empty_ok else first, Lit("}")))
        rules[f"call-{t}"] = Seq((head, arguments, Lit("}")))
        calls.append(Ref(f"call-{t}"))
    if not calls:
        return Grammar({"root": Ref("answer"), "answer": _ANSWER, **_JSON_RULES})
    # The fence the models open most calls with stays theirs to write (barred, the 1.5B wrote
    # prose instead of some calls); inside it, the call is one line all the same.
    fenced = Seq((Lit(FENCE_OPEN), Ref("call"), Lit(FENCE_CLOSE)))
    root = Alt((Ref("call"), fenced, Ref("answer")))
    return Grammar(
        {"root": root, "call": Alt(tuple(calls)), "answer": _ANSWER, **rules, **_JSON_RULES}
    )


# -- what the grammar knows of the tools sent --------------------------------------------------


def _schema_type(schema: object) -> str | None:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return kind if isinstance(kind, str) and kind in _TYPE_RULES else None


def tool_shapes(
    schemas: Iterable[Mapping[str, JsonValue]], declared: Iterable[ToolSpec]
) -> list[ToolShape]:
    """The shapes of the tools sent (`schemas`, as the model reads them): names and types from
    the schemas, required-ness and allowed values from the declared tools (`declared`), which
    the schemas never carry; a built-in's or MCP tool's from its schema's own keywords."""
    specs = {spec.name: spec for spec in declared}
    shapes: list[ToolShape] = []
    for schema in schemas:
        function = schema.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        required = parameters.get("required") if isinstance(parameters, dict) else None
        spec = specs.get(name)
        by_name = {p.name: p for p in spec.params} if spec is not None else {}
        params: list[ParamShape] = []
        for pname, pschema in (properties or {}).items() if isinstance(properties, dict) else ():
            declared_param = by_name.get(pname)
            enum: tuple[JsonValue, ...] | None
            if declared_param is not None:
                enum = declared_param.enum
                is_required = declared_param.required
            else:
                listed = pschema.get("enum") if isinstance(pschema, dict) else None
                enum = tuple(listed) if isinstance(listed, list) and listed else None
                is_required = isinstance(required, list) and pname in required
            params.append(ParamShape(pname, _schema_type(pschema), is_required, enum))
        shapes.append(ToolShape(name, tuple(params)))
    return shapes
