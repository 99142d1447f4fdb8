"""The call grammar: every text it admits is a plain answer or one call of a declared tool with
arguments as the level binds them, read by the text rescue as that call; and llama.cpp's own
grammar reader admits what the tree admits (the GBNF says what the tree says).

Texts are drawn by walking the grammar's tree (`Node`) with hypothesis: each choice, count and
character is a draw, so every text drawn is one the grammar admits."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mm_batch.config.model import ParamSpec, ToolSpec, Value
from mm_batch.effects.gguf import source_build
from mm_batch.jsontypes import JsonObject
from mm_batch.tools.call_grammar import (
    CALL_END,
    CALL_OPENINGS,
    FENCE_CLOSE,
    FENCE_OPEN,
    LEVELS,
    Alt,
    Chars,
    Grammar,
    Level,
    Lit,
    Node,
    ParamShape,
    Ref,
    Repeat,
    Seq,
    ToolShape,
    call_grammar,
    forced_rest,
    tool_shapes,
)
from mm_batch.tools.schema import model_schema
from mm_batch.tools.text_calls import recover_tool_calls
from tests.helpers import SOURCE_BUILD_REQUIRED

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEEPEST = 4  # rule references followed before a walk takes the shortest way out
TYPES = ("string", "integer", "number", "boolean")

# Names and values with what JSON and GBNF must escape: quotes, backslashes, newlines, accents.
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
_VALUES: dict[str, st.SearchStrategy[Value]] = {
    "string": _TEXT,
    "integer": st.integers(-(10**6), 10**6),
    "number": st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3)),
    "boolean": st.booleans(),
}


@st.composite
def params(draw: st.DrawFn) -> ParamShape:
    kind = draw(st.sampled_from((*TYPES, None)))
    enum: tuple[Value, ...] | None = None
    if kind is not None and draw(st.booleans()):
        enum = tuple(draw(st.lists(_VALUES[kind], min_size=1, max_size=3, unique=True)))
    return ParamShape(draw(_TEXT), kind, draw(st.booleans()), enum)


TOOLS = st.lists(
    st.builds(
        ToolShape,
        st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,8}", fullmatch=True),
        st.lists(params(), max_size=4, unique_by=lambda p: p.name).map(tuple),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda t: t.name,
)


def walk(data: st.DataObject, grammar: Grammar, node: Node, depth: int = 0) -> str:
    """A text the grammar admits from `node`, each choice drawn."""
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Chars):
        return data.draw(st.sampled_from(node.sample))
    if isinstance(node, Seq):
        return "".join(walk(data, grammar, item, depth) for item in node.items)
    if isinstance(node, Alt):
        # Past DEEPEST, the first option: a string, for a value (never a way back in).
        chosen = node.options[0] if depth > DEEPEST else data.draw(st.sampled_from(node.options))
        return walk(data, grammar, chosen, depth)
    if isinstance(node, Repeat):
        most = node.least if depth > DEEPEST else node.least + 3
        if node.most is not None:
            most = min(most, node.most)
        count = data.draw(st.integers(node.least, most))
        return "".join(walk(data, grammar, node.item, depth) for _ in range(count))
    return walk(data, grammar, grammar.rules[node.rule], depth + 1)


def _typed(value: Any, kind: str | None) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return True


def check_admitted(
    text: str, tools: list[ToolShape], level: Level, also: list[str] | None = None
) -> None:
    """A text the grammar admits: a plain answer, or one call (bare or fenced) as `level` binds
    it; a call of a name of `also` with any arguments."""
    also = also or []
    if not text.startswith(CALL_OPENINGS):
        assert text[:1] not in ("<", "") and text[0] > " ", text
        return
    line = text.removeprefix(FENCE_OPEN).removesuffix(FENCE_CLOSE)
    assert text in (line, f"{FENCE_OPEN}{line}{FENCE_CLOSE}")
    assert "\n" not in line  # one line
    call = json.loads(line)
    assert list(call) == ["name", "arguments"]
    arguments = call["arguments"]
    assert isinstance(arguments, dict)
    # The rescue reads it as exactly this call.
    [found] = recover_tool_calls(text, [*(t.name for t in tools), *also])
    assert (found.name, json.loads(found.raw_arguments)) == (call["name"], arguments)
    tool = next((t for t in tools if t.name == call["name"]), None)
    if tool is None:
        assert call["name"] in also
        return
    if level == "names":
        return
    order = [p.name for p in tool.params]
    assert list(arguments) == [name for name in order if name in arguments]  # declared, in order
    for param in tool.params:
        if param.name not in arguments:
            assert level in ("names", "types") or not param.required, param
            continue
        value = arguments[param.name]
        assert _typed(value, param.type), (param, value)
        if level == "enum" and param.enum:
            assert value in param.enum and type(value) in {type(v) for v in param.enum}


SKILLS = st.lists(st.from_regex(r"[a-z][a-z-]{0,8}", fullmatch=True), max_size=2)


@EXAMPLES
@given(tools=TOOLS, level=st.sampled_from(LEVELS), also=SKILLS, data=st.data())
def test_what_the_grammar_admits_is_an_answer_or_one_declared_call(
    tools: list[ToolShape], level: Level, also: list[str], data: st.DataObject
) -> None:
    grammar = call_grammar(tools, level, also)
    check_admitted(walk(data, grammar, grammar.rules["root"]), tools, level, also)


@EXAMPLES
@given(tools=TOOLS, level=st.sampled_from(LEVELS), also=SKILLS, data=st.data())
def test_every_declared_tool_and_skill_can_be_called(
    tools: list[ToolShape], level: Level, also: list[str], data: st.DataObject
) -> None:
    """The grammar never shuts a name out: each has a call of its own among the options."""
    grammar = call_grammar(tools, level, also)
    calls = grammar.rules["call"]
    assert isinstance(calls, Alt)
    names = list(dict.fromkeys([*(t.name for t in tools), *also]))
    assert len(calls.options) == len(names)
    for option, name in zip(calls.options, names, strict=True):
        text = walk(data, grammar, option)
        assert json.loads(text)["name"] == name
        check_admitted(text, tools, level, also)


@EXAMPLES
@given(tools=TOOLS, level=st.sampled_from(LEVELS), also=SKILLS, data=st.data())
def test_a_turn_cut_where_it_first_writes_a_call_end_is_rebuilt_as_written_or_asked_again(
    tools: list[ToolShape], level: Level, also: list[str], data: st.DataObject
) -> None:
    """The server stops a bound turn where it writes `}}` (CALL_END): what the grammar forces
    after a whole call is added back, exactly as the model would have written it; a `}}` that
    ended no call (in a string, in an answer) is never taken for one."""
    grammar = call_grammar(tools, level, also)
    text = walk(data, grammar, grammar.rules["root"])
    at = text.find(CALL_END)
    if at < 0:
        return  # the server is never stopped: the turn comes as written
    head = text[: at + len(CALL_END)]
    rest = forced_rest(head)
    if rest is not None:
        assert head + rest == text
    event(f"rebuilt {rest is not None}")
    call = text.removesuffix(FENCE_CLOSE) if text.startswith(FENCE_OPEN) else text
    if text.startswith(CALL_OPENINGS) and len(head) == len(call):
        assert rest is not None, text  # the call's own end: rebuilt, never asked again


def ends(grammar: Grammar, node: Node, text: str, at: int) -> set[int]:
    """Where a match of `node` in `text` from `at` may end: the tree read as a recogniser."""
    if isinstance(node, Lit):
        return {at + len(node.text)} if text.startswith(node.text, at) else set()
    if isinstance(node, Chars):
        return {at + 1} if at < len(text) and _in_class(node.gbnf, text[at]) else set()
    if isinstance(node, Ref):
        return ends(grammar, grammar.rules[node.rule], text, at)
    if isinstance(node, Alt):
        return {end for option in node.options for end in ends(grammar, option, text, at)}
    if isinstance(node, Seq):
        here = {at}
        for item in node.items:
            here = {end for start in here for end in ends(grammar, item, text, start)}
        return here
    found, here, count = set(), {at}, 0
    while here and (node.most is None or count <= node.most):
        if count >= node.least:
            found |= here
        if node.most is not None and count == node.most:
            break
        here = {end for start in here for end in ends(grammar, node.item, text, start)} - found
        count += 1
    return found


def _in_class(gbnf: str, char: str) -> bool:
    """A character of a GBNF class as call_grammar writes them: `[^...]` with escapes and
    ranges (`\\x00-\\x20`)."""
    assert gbnf.startswith("[") and gbnf.endswith("]")
    body, negated = gbnf[1:-1], gbnf.startswith("[^")
    body = body[1:] if negated else body
    decoded = body.encode().decode("unicode_escape") if "\\" in body else body
    members: list[tuple[str, str]] = []
    i = 0
    while i < len(decoded):
        if i + 2 < len(decoded) and decoded[i + 1] == "-":
            members.append((decoded[i], decoded[i + 2]))
            i += 3
        else:
            members.append((decoded[i], decoded[i]))
            i += 1
    inside = any(low <= char <= high for low, high in members)
    return inside != negated


# What a model may want to answer that begins with a call's first character: JSON written as
# `json.dumps` writes it, a code block of another language, inline code, prose.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
ANSWERS = st.one_of(
    _JSON.map(json.dumps),
    st.dictionaries(_TEXT, _JSON, min_size=1, max_size=3).map(json.dumps),
    st.tuples(st.from_regex(r"[a-z]{1,8}", fullmatch=True), _TEXT).map(
        lambda lang_code: f"```{lang_code[0]}\n{lang_code[1]}\n```"
    ),
    _TEXT.map(lambda code: f"`{code}`"),
    _TEXT,
).filter(lambda t: t[:1] not in ("", "<") and t[0] > " ")  # no space or control first


@st.composite
def answers(draw: st.DrawFn, tools: list[ToolShape]) -> str:
    """What a model may want to answer, JSON objects among them whose first key is "name":
    a tool's name or another, then any keys ("arguments" among them)."""
    names = st.sampled_from([t.name for t in tools]) if tools else _TEXT
    name = draw(st.one_of(names, _TEXT))
    keys = st.one_of(st.just("arguments"), st.just("parameters"), _TEXT)
    rest = draw(st.dictionaries(keys, _JSON, max_size=2))
    named = json.dumps({"name": name, **rest}, ensure_ascii=False)
    return draw(st.one_of(ANSWERS, st.just(named), st.just(f"{FENCE_OPEN}{named}")))


@EXAMPLES
@given(tools=TOOLS, level=st.sampled_from(LEVELS), data=st.data())
def test_an_answer_is_never_bound_to_become_a_call(
    tools: list[ToolShape], level: Level, data: st.DataObject
) -> None:
    """Whatever the model begins to answer, the grammar lets it finish as an answer, unless
    it begins as a call of a declared tool does, up to its arguments (bare or in a ```json
    fence). A JSON object of other keys, one whose "name" is no tool's or whose next key is
    not "arguments", or a ```bash block is never turned into a call of a declared tool."""
    answer = data.draw(answers(tools))
    grammar = call_grammar(tools, level)
    admitted = len(answer) in ends(grammar, grammar.rules["answer"], answer, 0)
    heads = [
        '{"name": ' + json.dumps(t.name, ensure_ascii=False) + ', "arguments": ' for t in tools
    ]
    bound = answer.startswith((*heads, *(FENCE_OPEN + head for head in heads)))
    event(f"bound {bound}")
    assert admitted != bound, answer


def test_the_shapes_take_required_and_enum_from_the_declared_tools_not_the_schema() -> None:
    spec = ToolSpec(
        name="release",
        description="Release.",
        params=(
            ParamSpec("version", "string", "The version.", required=True),
            ParamSpec("channel", "string", "", required=True, enum=("beta", "stable")),
            ParamSpec("dry", "boolean", "", required=False, default=False),
        ),
        command=("./release.sh", "{{version}}"),
        workdir=Path("."),
    )
    schema: dict[str, Any] = model_schema(spec)  # JSON, read loosely
    assert "required" not in schema["function"]["parameters"]  # SPEC 2: never sent
    assert tool_shapes([schema], [spec]) == [
        ToolShape(
            "release",
            (
                ParamShape("version", "string", True),
                ParamShape("channel", "string", True, ("beta", "stable")),
                ParamShape("dry", "boolean", False),
            ),
        )
    ]
    # A tool mm-batch did not declare (MCP, a built-in): what its own schema says.
    other: JsonObject = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "enum": ["a"]}, "n": {}},
                "required": ["q"],
            },
        },
    }
    assert tool_shapes([other], [spec]) == [
        ToolShape("lookup", (ParamShape("q", "string", True, ("a",)), ParamShape("n", None)))
    ]


def _validator() -> Path | None:
    """llama.cpp's grammar validator, from a source build made with its tests (`.ci/run`)."""
    built = source_build()
    found = built.build.with_name("test-gbnf-validator") if built is not None else None
    return found if found is not None and found.is_file() else None


@pytest.mark.skipif(
    _validator() is None and not SOURCE_BUILD_REQUIRED,
    reason="llama.cpp's grammar validator is not installed (a source build with its tests)",
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tools=TOOLS, level=st.sampled_from(LEVELS), data=st.data())
def test_llama_cpp_reads_the_gbnf_as_the_tree(
    tools: list[ToolShape], level: Level, data: st.DataObject, tmp_path_factory: Any
) -> None:
    """llama.cpp's grammar admits what the tree admits and refuses what it refuses: a text
    the tree writes, an answer a model may want to write (JSON whose "name" is a tool's or
    not), and a call of a declared tool with a parameter it does not have."""
    validator = _validator()
    assert validator is not None, "MM_BATCH_REQUIRE_SOURCE_BUILD=1: the validator must be there"
    grammar = call_grammar(tools, level, ["a-skill"])
    folder = tmp_path_factory.mktemp("gbnf")
    (folder / "grammar.gbnf").write_text(grammar.gbnf())
    written = walk(data, grammar, grammar.rules["root"])
    answer = data.draw(answers(tools))
    name = tools[0].name if tools else "a-skill"
    extra = '{"name": ' + json.dumps(name) + ', "arguments": {"zz-undeclared": 1}}'
    for text in (written, answer, extra):
        valid = len(text) in ends(grammar, grammar.rules["root"], text, 0)
        (folder / "input.txt").write_text(text)
        done = subprocess.run(
            [str(validator), str(folder / "grammar.gbnf"), str(folder / "input.txt")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert ("Input string is valid" in done.stdout) is valid, (text, done.stdout)
