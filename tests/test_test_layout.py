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


# -- no wall-clock bounds ------------------------------------------------------------------------

_CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
# The one place that reads the clock against a bound: the give-up of a wait, never a claim of
# speed (a test passes it a deadline the product promises, its own constant plus slack).
_ALLOWED = {("helpers.py", "wait_for")}


def _is_clock(node: ast.expr) -> bool:
    """`time.monotonic()`, `perf_counter()` and the like: a reading of a clock."""
    if not isinstance(node, ast.Call) or node.args:
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in _CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in _CLOCKS - {"time"}


def _clock_bounds(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of each elapsed time taken (`time.monotonic() - started`) and
    each clock reading compared to a sum (`time.monotonic() < killed_at + 5`)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        elapsed = (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Sub)
            and (_is_clock(node.left) or _is_clock(node.right))
        )
        within = isinstance(node, ast.Compare) and (
            any(_is_clock(e) for e in [node.left, *node.comparators])
            and any(
                isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add)
                for e in [node.left, *node.comparators]
            )
        )
        if elapsed or within:
            found.append((getattr(node, "lineno", 0), function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "")
    return found


def test_the_clock_scan_sees_elapsed_time_and_inline_deadlines() -> None:
    source = (
        "import time\n"
        "from time import perf_counter\n"
        "def a():\n    started = time.monotonic()\n    assert time.monotonic() - started < 2\n"
        "def b():\n    spent = perf_counter() - t0\n"
        "def c():\n    assert time.time() < killed_at + 5\n"
        "def d():\n    deadline = time.monotonic() + 60\n    while time.monotonic() < deadline:\n"
        "        pass\n"
    )
    assert _clock_bounds(source) == [(5, "a"), (7, "b"), (9, "c")]


def test_no_test_compares_elapsed_time_to_a_bound() -> None:
    """A speed goal is a benchmark under benchmarks/ that prints its figures; a test asserts the
    order of events or counts the work (a leftover's marker not yet there, characters scanned,
    lines run), or waits with `helpers.wait_for`, whose give-up only turns a hang into a
    failure."""
    found = [
        f"{path.relative_to(TESTS.parent)}:{line} (in {function or 'the module'})"
        for path in _sources()
        for line, function in _clock_bounds(path.read_text(encoding="utf-8"))
        if (path.relative_to(TESTS).as_posix(), function) not in _ALLOWED
    ]
    assert found == [], "elapsed time compared to a bound: " + ", ".join(found)
