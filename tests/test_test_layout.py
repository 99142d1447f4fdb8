"""The tests' own layout: what tests share lives in tests/helpers.py or in a support module
beside its family of tests; no file under tests/ imports a test module or a conftest.py."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(module: str) -> bool:
    """A dotted name under tests/ that pytest collects (test_*.py) or loads itself (conftest)."""
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def _imported(path: Path) -> set[str]:
    """The modules a file imports (absolute names, and relative ones resolved), at any depth."""
    package = list(path.relative_to(TESTS.parent).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            # `from tests.report import test_junit` imports a module, not a name.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "node_modules" not in p.parts)


def test_the_scan_sees_the_tests() -> None:
    importers = {p.relative_to(TESTS).as_posix(): _imported(p) for p in _sources()}
    assert "tests.helpers" in importers["conftest.py"]
    assert "tests.run.scripted" in importers["run/test_loop.py"]


def test_the_rule_tells_test_modules_from_support_modules() -> None:
    assert _is_test_module("tests.report.test_junit")
    assert _is_test_module("tests.consumers.conftest")
    assert not _is_test_module("tests.helpers")
    assert not _is_test_module("tests.run.scripted")
    assert not _is_test_module("mm_batch.testing.fake_openai")


def test_no_file_imports_a_test_module_or_a_conftest() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for path in _sources()
        for module in sorted(_imported(path))
        if _is_test_module(module)
    ]
    assert found == [], "move what is shared to tests/helpers.py or a support module"
