"""Messages speak to the user's machine, never to the machines mm-batch was developed on."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mm_batch

PACKAGE = Path(mm_batch.__file__).parent
# Words that only make sense on the developers' machines: a user reads them on theirs.
DEVELOPERS_WORDS = re.compile(r"\b(these|our) machines?\b|\bthis session\b", re.IGNORECASE)


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def test_no_message_speaks_of_the_developers_machines() -> None:
    hits = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text[:80]!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _strings(path)
        if DEVELOPERS_WORDS.search(text)
    ]
    assert hits == []
