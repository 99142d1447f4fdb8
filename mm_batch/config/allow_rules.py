"""The agent file's `allow` rules: which calls run without asking, and which globs to warn of."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping

from mm_batch.config.entries import BUILTINS, MCP, AgentContext
from mm_batch.config.fields import Fields, HasReader, Key, read_fields, scalar
from mm_batch.config.model import KNOWN_BUILTINS, AllowRule, McpServerSpec, ToolSpec, render_value
from mm_batch.config.problems import Problem, excerpt
from mm_batch.config.tool_entries import TOOLS, typed_value
from mm_batch.config.yamlnodes import At, Reader

# Programs that run other programs through their options: a glob over them allows anything.
RUNS_PROGRAMS = (
    *("git", "find", "env", "xargs", "sudo", "sh", "bash"),
    *("python*", "perl", "ruby", "node", "awk"),
)


def names_a_tool(
    name: str,
    tools: Mapping[str, ToolSpec],
    builtins: tuple[str, ...],
    mcp: tuple[McpServerSpec, ...],
) -> bool:
    if name in tools or name in builtins:
        return True
    # MCP tools are only known once the server answered: accept its prefix here.
    return any(name.startswith(f"{s.name}_") and len(name) > len(s.name) + 1 for s in mcp)


def unknown_tool(name: str, tools: Mapping[str, ToolSpec], builtins: tuple[str, ...]) -> str:
    if name in KNOWN_BUILTINS:
        return f"built-in '{name}' is not enabled (add it to builtins)"
    known = sorted(set(tools) | set(builtins))
    return f"no tool named '{excerpt(name)}' (declared: {', '.join(known) or 'none'})"


def _arg_patterns(reader: Reader, at: At, tool: ToolSpec | None) -> dict[str, str]:
    patterns: dict[str, str] = {}
    for pname, pat in reader.free_mapping(at) or []:
        param = tool.param(pname) if tool is not None else None
        if tool is not None and param is None:
            reader.problem(pat, f"tool '{tool.name}' has no parameter '{excerpt(pname)}'")
            continue
        if param is None or param.type == "string":
            text = reader.string(pat)
        elif getattr(pat.node, "style", None) is not None and "*" in str(pat.node.value):
            text = str(pat.node.value)  # a glob over a typed value is written as a string
        else:
            value = typed_value(reader, pat, param.type)
            text = None if value is None else render_value(value)
        if text is not None and param is not None and param.enum is not None:
            allowed = [render_value(v) for v in param.enum]
            # `*` is the only wildcard, and never covers a `/` (SPEC 4).
            pattern = re.compile("[^/]*".join(re.escape(part) for part in text.split("*")))
            if not any(pattern.fullmatch(v) for v in allowed):
                reader.problem(
                    pat,
                    f"'{excerpt(text)}' can never match: '{param.name}' is one of "
                    f"{', '.join(allowed)}",
                )
                continue
        if text is not None:
            patterns[pname] = text
    return patterns


RULE_TOOL = scalar("tool", lambda r, at: r.string(at, non_empty=True))
RULE_BASH = scalar("bash", lambda r, at: r.string(at, non_empty=True))
RULE_ARGS: Key[HasReader, At] = Key("args", lambda ctx, at, _: at)  # read once the tool is known
RULE: tuple[Key[HasReader, object], ...] = (RULE_TOOL, RULE_BASH, RULE_ARGS)


def _allow_rules(ctx: AgentContext, at: At, agent: Fields) -> tuple[AllowRule, ...] | None:
    reader = ctx.reader
    tools = {t.name: t for t in agent[TOOLS] or ()}
    builtins, mcp = agent[BUILTINS] or (), agent[MCP] or ()
    rules: list[AllowRule] = []
    for index, item in enumerate(reader.sequence(at) or []):
        fields = read_fields(ctx, item, RULE)
        if fields is None:
            continue
        tool_at, bash_at, args_at = (fields.given(k) for k in RULE)
        if (tool_at is None) == (bash_at is None):
            reader.problem(item, "a rule names either a tool or a bash command")
            continue
        if bash_at is not None:
            if args_at is not None:
                reader.problem(args_at, "a bash rule takes no args: the command is the rule")
            command = fields[RULE_BASH]
            if command is not None:
                rules.append(AllowRule(index, bash=command))
            continue
        name = fields[RULE_TOOL]
        if name is None or tool_at is None:
            continue
        if name == "bash":
            reader.problem(
                tool_at,
                "the built-in bash is consented only through bash rules: write "
                '`bash: "<command>"` (an exact command, or a glob)',
            )
            continue
        if not names_a_tool(name, tools, builtins, mcp):
            if name not in ctx.broken_tools:  # else its cause is reported, in the tool
                reader.problem(tool_at, unknown_tool(name, tools, builtins))
            continue
        patterns = _arg_patterns(reader, args_at, tools.get(name)) if args_at else None
        rules.append(AllowRule(index, tool=name, args=patterns))
    return tuple(rules)


def glob_warnings(reader: Reader, allow_at: At, rules: tuple[AllowRule, ...]) -> list[Problem]:
    """Warnings about `bash:` globs over programs that run other programs through options."""
    items = allow_at.node.value
    warnings: list[Problem] = []
    for rule in rules:
        if rule.bash is None or "*" not in rule.bash:
            continue
        program = (rule.bash.split() or [""])[0].rsplit("/", 1)[-1]
        risky = [p for p in RUNS_PROGRAMS if fnmatch.fnmatchcase(program, p)]
        if "*" in program:
            examples = [p.rstrip("*") for p in RUNS_PROGRAMS]
            risky = [p for p in examples if fnmatch.fnmatchcase(p, program)]
        if not risky:
            continue
        at = At(items[rule.index], f"{allow_at.path}[{rule.index}]")
        runs = program if "*" not in program else f"any program, {', '.join(risky)} among them"
        warnings.append(
            Problem(
                reader.file,
                at.line,
                at.key("bash"),
                f"warning: the glob '{excerpt(rule.bash)}' runs {runs}, which can run any other "
                "program through its options or arguments: prefer exact rules",
            )
        )
    return warnings


ALLOW: Key[AgentContext, tuple[AllowRule, ...]] = Key("allow", _allow_rules)
