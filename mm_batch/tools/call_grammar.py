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

A plain answer may be anything but the beginning of a call of a declared name, up to its
arguments (`{"name": "release", "arguments": `, bare or fenced), and may not start with `<` or
white space: a JSON answer of other keys, or whose "name" is no tool's, or a ```bash block is
never bound to become a call. The grammar is a small tree (`Node`) rendered as GBNF, so that
tests can walk the same tree for what it admits.
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


def _head(name: str) -> str:
    """How a call of `name` begins, up to its arguments."""
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


def _call_openings(names: Iterable[str]) -> frozenset[str]:
    """How a call of each name begins, up to its arguments: bare and in the fence."""
    heads = [_head(name) for name in names]
    return frozenset([*heads, *(FENCE_OPEN + head for head in heads)])


def _answer(openings: frozenset[str], prefix: str = "") -> Node:
    """A plain answer from `prefix` on (`prefix`: the start of some opening, none whole):
    anything but the beginning of a call (`openings`, a declared name's, up to its arguments).
    So a JSON object of other keys, one whose "name" is no tool's (`{"name": "billing", ...}`)
    or whose second key is not "arguments", a ```bash block, inline code or prose stays an
    answer; the one answer the grammar binds to become a call is one that has written a whole
    opening. An answer never begins with `<` (the <tool_call> tags the rescue reads as a
    call), white space or a control character. White space leaves an opening only where JSON
    would not skip it (inside a string, a fence's opening backquotes): after `{`, `:`, `,`, a
    space or the fence's line, a call written over several lines (the models' own habit)
    would leave the grammar's binding by it."""
    nexts = sorted({o[len(prefix)] for o in openings if o.startswith(prefix)})
    binding = prefix[-1:] in ("", "{", ":", ",", " ", "\n") or prefix == "```"
    excluded = "".join(_gbnf_char(c) for c in nexts) + ("<" if not prefix else "")
    excluded += "\\x00-\\x20" if binding else "\\x00"
    sample = "".join(c for c in ("ab1}[é" if binding else "ab1}[é \n") if c not in nexts)
    options: list[Node] = [Seq((Chars(f"[^{excluded}]", sample), _REST))]
    for char in nexts:
        if prefix + char not in openings:
            options.append(Seq((Lit(char), _answer(openings, prefix + char))))
    return Alt(tuple(options)) if not prefix else Repeat(Alt(tuple(options)), 0, 1)


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
        head = Lit(_head(tool.name))
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
    answer = _answer(_call_openings([*names, *(other.name for other in others)]))
    if not calls:
        return Grammar({"root": Ref("answer"), "answer": answer, **_JSON_RULES})
    # The fence the models open most calls with stays theirs to write (barred, the 1.5B wrote
    # prose instead of some calls); inside it, the call is one line all the same.
    fenced = Seq((Lit(FENCE_OPEN), Ref("call"), Lit(FENCE_CLOSE)))
    root = Alt((Ref("call"), fenced, Ref("answer")))
    return Grammar(
        {"root": root, "call": Alt(tuple(calls)), "answer": answer, **rules, **_JSON_RULES}
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


# -- where a call ends -------------------------------------------------------------------------

# Every call the grammar admits ends its arguments and itself with `}}`: the server is asked to
# stop there, so that the decoder does not spend a step on each token the grammar forces after
# it (the fence's close, the end of the turn).
CALL_END = "}}"


def forced_rest(text: str) -> str | None:
    """What the grammar forces after `text` (a turn cut where it wrote `CALL_END`, that string
    included) when `text` is a whole call: nothing, or the fence's close. None when it is no
    whole call: a `}}` inside a string, or an answer."""
    fenced = text.startswith(FENCE_OPEN)
    line = text.removeprefix(FENCE_OPEN)
    if not line.startswith(CALL_OPENINGS[0]) or not line.endswith(CALL_END):
        return None
    try:
        call = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return None
    return FENCE_CLOSE if fenced else ""
