"""The import rules of docs/architecture.md, checked on the source: stages import one way only."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mm_batch"

# The stages in the order data flows; a module may import only its own stage or earlier ones.
# `effects` and `report` are siblings: neither imports the other.
ORDER = ("root", "config", "plan", "tools", "run", "effects|report", "commands", "cli", "__main__")
ROOT_MODULES = {"errors", "jsontypes", "schemas", "testing", "__init__"}
ONLY_IN_EFFECTS = {"litellm", "docker", "subprocess"}
COMPOSITION_ROOT = "mm_batch.commands.effects"


def _stage(module: str) -> str:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    if name == "__main__":
        return name
    is_module = (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()
    if name in ROOT_MODULES or not is_module:  # not a module: a name of mm_batch/__init__.py
        return "root"
    return name


def _rank(stage: str) -> int:
    for index, names in enumerate(ORDER):
        if stage in names.split("|"):
            return index
    raise AssertionError(f"no stage for {stage!r}: add it to ORDER and to docs/architecture.md")


def _imports() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update((module, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(
                    (module, f"{node.module}.{alias.name}")
                    if node.module == "mm_batch"
                    else (module, node.module)
                    for alias in node.names
                )
    return found


IMPORTS = _imports()


def test_the_scan_sees_the_package() -> None:
    importers = {module for module, _ in IMPORTS}
    assert "mm_batch.cli" in importers
    assert any(imported.startswith("mm_batch.run") for _, imported in IMPORTS)


def test_no_module_imports_a_later_stage() -> None:
    backwards = [
        f"{module} imports {imported}"
        for module, imported in IMPORTS
        if imported.startswith("mm_batch.") and _rank(_stage(imported)) > _rank(_stage(module))
    ]
    assert sorted(backwards) == []


def test_effects_and_report_do_not_import_each_other() -> None:
    across = [
        f"{module} imports {imported}"
        for module, imported in IMPORTS
        if imported.startswith("mm_batch.")
        and {_stage(module), _stage(imported)} == {"effects", "report"}
    ]
    assert sorted(across) == []


def test_a_command_imports_no_other_command() -> None:
    crossing = [
        f"{module} imports {imported}"
        for module, imported in IMPORTS
        if module.startswith("mm_batch.commands.")
        and imported.startswith("mm_batch.commands.")
        and imported != COMPOSITION_ROOT
        and not imported.startswith(module)
    ]
    assert sorted(crossing) == []


@pytest.mark.parametrize("library", sorted(ONLY_IN_EFFECTS))
def test_only_effects_import_the_outside_world(library: str) -> None:
    outside = [
        module
        for module, imported in IMPORTS
        if imported.split(".")[0] == library and _stage(module) != "effects"
    ]
    assert sorted(outside) == []


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}


ANY = re.compile(r"\bAny\b")
# Issue 29 halved the `Any` of the day it was filed (237): JSON is JsonValue, shapes are typed.
MOST_ANY = 118


def test_any_is_rare() -> None:
    count = sum(
        len(ANY.findall(path.read_text(encoding="utf-8"))) for path in PACKAGE.rglob("*.py")
    )
    assert count <= MOST_ANY


def test_records_are_read_back_in_one_module() -> None:
    untyped = sorted(
        str(path.relative_to(PACKAGE.parent))
        for stage in ("report", "commands")
        for path in (PACKAGE / stage).rglob("*.py")
        if path.name != "readback.py" and "dict[str, Any]" in path.read_text(encoding="utf-8")
    )
    assert untyped == []
