"""Skills: `<dir>/<name>/SKILL.md` with front matter, read once, at load."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mm_batch.config.fields import HasReader, Key, read_fields, scalar
from mm_batch.config.model import Skill
from mm_batch.config.paths import display_path, path_kind, unusable
from mm_batch.config.problems import Problem, excerpt
from mm_batch.config.yamlnodes import At, Reader

SKILL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")

NAME = scalar("name", lambda r, at: r.string(at, non_empty=True), required=True)
DESCRIPTION = scalar("description", lambda r, at: r.string(at, non_empty=True), required=True)
KEYWORDS = scalar("keywords", Reader.string_list)
FRONT_MATTER: tuple[Key[HasReader, object], ...] = (NAME, DESCRIPTION, KEYWORDS)


class _SkillFile:
    """A SKILL.md being read."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader


def read_skill_folders(reader: Reader, at: At, directory: Path) -> tuple[Skill, ...] | None:
    """Skills from <dir>/<name>/SKILL.md in each listed folder; links out of one are refused."""
    items = reader.sequence(at)
    if items is None:
        return None
    skills: list[Skill] = []
    seen: dict[str, Path] = {}
    for item in items:
        rel = reader.string(item, non_empty=True)
        if rel is None:
            continue
        folder = (directory / rel).resolve()
        kind = path_kind(folder)
        if isinstance(kind, OSError):
            reader.problem(item, unusable(kind))
            continue
        if kind != "folder":
            found = "not found" if kind == "missing" else "not a folder"
            reader.problem(item, f"skills folder {found}: {excerpt(rel)}")
            continue
        for path in _skill_files(folder):
            if folder not in path.resolve().parents:
                reader.problem(
                    item,
                    f"{display_path(path)} links out of the skills folder: a skill is read "
                    "from inside its folder",
                )
                continue
            skill = _skill(path, reader.problems)
            if skill is None:
                continue
            if skill.name in seen:
                reader.problem(
                    item,
                    f"skill '{skill.name}' is defined twice: {seen[skill.name]} "
                    f"and {display_path(path)}",
                )
                continue
            seen[skill.name] = Path(display_path(path))
            skills.append(skill)
    return tuple(skills)


def _skill_files(folder: Path) -> list[Path]:
    """Each `<name>/SKILL.md` of a skills folder, whatever it is: a FIFO, a folder or a link to
    nothing is named by its reader, never skipped or read."""
    try:
        names = sorted(entry.name for entry in folder.iterdir())
    except OSError:
        return []
    return [
        folder / name / "SKILL.md" for name in names if os.path.lexists(folder / name / "SKILL.md")
    ]


def _skill(path: Path, problems: list[Problem]) -> Skill | None:
    reader = Reader(display_path(path), problems)
    text = reader.read_text(path)
    if text is None:
        return None
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        reader.problem(None, "a SKILL.md starts with front matter between --- lines")
        return None
    end = next((i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---"), None)
    if end is None:
        reader.problem(None, "the front matter has no closing --- line")
        return None
    before = len(problems)
    # A leading newline keeps the node lines equal to the file's.
    root = reader.compose("\n" + "".join(lines[1:end]))
    fields = read_fields(_SkillFile(reader), root, FRONT_MATTER) if root else None
    if fields is None:
        return None
    name, description = fields[NAME], fields[DESCRIPTION]
    name_at = fields.given(NAME)
    if name is not None and name_at is not None and not SKILL_NAME_RE.fullmatch(name):
        reader.problem(name_at, f"invalid skill name '{excerpt(name)}'")
    if len(problems) > before or name is None or description is None:
        return None
    body = "".join(lines[end + 1 :]).strip()
    keywords = fields[KEYWORDS]
    return Skill(name, description, tuple(keywords or ()), body, path)
