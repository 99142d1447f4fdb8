"""Writes the generated parts of docs/reference/cli.md from mm-batch's click commands.

    python docs/gen_cli.py           # rewrite the page
    python docs/gen_cli.py --check   # exit 1 when the page is not what the commands say

Each command's section (its usage, description, options and epilog) stands between
`<!-- cli: NAME -->` and `<!-- /cli: NAME -->` and is rewritten from the command itself; the text
around those marks is written by hand and kept as it is. A command that has no section yet gets
one at the end of the page; a section of a command that no longer exists is an error.
tests/test_docs_links.py checks that the committed page is what this script writes.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from mm_batch.cli import cli

PAGE = Path(__file__).resolve().parent / "reference" / "cli.md"
PROGRAM = "mm-batch"

_SECTION = re.compile(
    r"<!-- cli: (?P<name>[^>]*?) -->\n.*?<!-- /cli: (?P=name) -->\n", re.DOTALL | re.MULTILINE
)
_START = re.compile(r"<!-- cli: ([^>]*?) -->")


class StalePageError(Exception):
    """The page cannot be brought in line with the commands by rewriting its sections."""


def commands() -> dict[str, tuple[click.Command, click.Context]]:
    """Every command by its full name (`mm-batch`, `mm-batch run`, ...), in the group's order,
    each with the context its help is written in."""
    assert isinstance(cli, click.Group)
    root = click.Context(cli, info_name=PROGRAM, **cli.context_settings)
    found: dict[str, tuple[click.Command, click.Context]] = {PROGRAM: (cli, root)}
    for name, command in cli.commands.items():
        context = click.Context(command, info_name=name, parent=root)
        found[context.command_path] = (command, context)
    return found


def _inline(text: str) -> str:
    """Help text as markdown prose: one line, its backquoted code kept, an option's name made
    code (`--filter`), nothing else active."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(part if part.startswith("`") else _prose(part) for part in parts)


def _prose(text: str) -> str:
    text = re.sub(r"[\\*<]|(?<!\w)_|_(?!\w)", lambda m: "\\" + m.group(0), text)
    return re.sub(r"(?<![\w-])(--[a-z][a-z-]*)", r"`\1`", text)


def _option(record: tuple[str, str]) -> str:
    """One option as a list item: each of its names in code (`-x`, `--exitfirst`), its metavar
    with the last name (`--model TEXT`), then its help."""
    names, help_text = record
    groups = [", ".join(f"`{name}`" for name in group.split(", ")) for group in names.split(" / ")]
    return f"- {' / '.join(groups)}: {_inline(help_text)}"


def _paragraphs(text: str) -> Iterator[str]:
    """Click's help text as markdown: a `\\b` paragraph (kept as written) becomes a text block."""
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(text)):
        if paragraph.startswith("\b"):
            yield "```text\n" + paragraph.removeprefix("\b").strip("\n") + "\n```"
        elif paragraph.strip():
            yield _inline(paragraph)


def section(name: str, command: click.Command, context: click.Context) -> str:
    """The generated section of one command, marks included."""
    usage = " ".join([context.command_path, *command.collect_usage_pieces(context)])
    parts = [f"## `{name}`", "```text\n" + usage + "\n```", *_paragraphs(command.help or "")]
    params = command.get_params(context) if command is cli else command.params
    options = [p.get_help_record(context) for p in params if isinstance(p, click.Option)]
    if options:
        parts.append("\n".join(_option(record) for record in options if record is not None))
    parts.extend(_paragraphs(command.epilog or ""))
    body = "\n\n".join(parts)
    return f"<!-- cli: {name} -->\n\n{body}\n\n<!-- /cli: {name} -->\n"


def render(page: str) -> str:
    """The page with every command's section rewritten from the commands, and sections added
    for commands it lacks."""
    found = commands()
    unknown = [name for name in _START.findall(page) if name not in found]
    if unknown:
        raise StalePageError(f"sections of commands that do not exist: {', '.join(unknown)}")
    seen: set[str] = set()

    def rewrite(match: re.Match[str]) -> str:
        name = match.group("name")
        if name in seen:
            raise StalePageError(f"two sections of {name}")
        seen.add(name)
        command, context = found[name]
        return section(name, command, context)

    text = _SECTION.sub(rewrite, page)
    if len(seen) != len(_START.findall(page)):
        raise StalePageError("a `<!-- cli: NAME -->` mark without its `<!-- /cli: NAME -->`")
    missing = [section(n, c, ctx) for n, (c, ctx) in found.items() if n not in seen]
    if missing:
        text = text.rstrip("\n") + "\n\n" + "\n".join(missing)
    return text


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__, file=sys.stderr)
        return 2
    page = PAGE.read_text(encoding="utf-8")
    try:
        wanted = render(page)
    except StalePageError as exc:
        print(f"{PAGE.name}: {exc}", file=sys.stderr)
        return 1
    if wanted == page:
        return 0
    if check:
        print(f"{PAGE.name} is stale: run python docs/gen_cli.py", file=sys.stderr)
        return 1
    PAGE.write_text(wanted, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
