"""The tests' own layout: what tests share lives in tests/helpers.py or in a support module
beside its family of tests; no file under tests/ imports a test module or a conftest.py."""

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    """`time.monotonic()`, `perf_counter()`, `datetime.now(UTC)` and the like: a reading of a
    clock."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ("now", "utcnow"):
        return ast.unparse(func.value) in ("datetime", "datetime.datetime")
    if node.args:
        return False
    if isinstance(func, ast.Attribute):
        return func.attr in _CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in _CLOCKS - {"time"}


def _is_reading(node: ast.expr | None) -> bool:
    """A clock reading, or one moved by an offset (`time.monotonic() + 120`)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        return _is_reading(node.left) or _is_reading(node.right)
    return node is not None and _is_clock(node)


@dataclass
class _Readings:
    """What holds clock readings in a function (and the functions in it): names assigned one
    (`asked = time.monotonic()`), containers filled with them (`started[k] = ...`,
    `answered.append(...)`), loop names walking such a container, and names assigned the
    difference of two readings (`spent = b_in - asked`)."""

    names: set[str] = field(default_factory=set)
    containers: set[str] = field(default_factory=set)
    spans: set[str] = field(default_factory=set)

    def holds(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names
        return isinstance(node, ast.Subscript) and self._container(node.value)

    def _container(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Subscript):  # answered[1:]
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.containers

    def is_span(self, node: ast.AST) -> bool:
        """`b_in - asked`: the time between two readings."""
        return (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Sub)
            and self.holds(node.left)
            and self.holds(node.right)
        )

    def learn(self, scope: ast.AST) -> None:
        """Everything the scope assigns, until nothing new is learnt (a loop name may walk a
        container filled further down): a function's own lines and those of the functions in
        it (a callback fills a list its test reads), a module's own lines only."""
        nodes = list(_walk(scope, into_functions=not isinstance(scope, ast.Module)))
        before = None
        while before != (len(self.names), len(self.containers), len(self.spans)):
            before = (len(self.names), len(self.containers), len(self.spans))
            for node in nodes:
                self._learn(node)

    def _learn(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and _is_reading(node.value):
                    self.names.add(target.id)
                elif isinstance(target, ast.Name) and node.value and self.is_span(node.value):
                    self.spans.add(target.id)
                elif (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and _is_reading(node.value)
                ):
                    self.containers.add(target.value.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "add", "insert")
            and isinstance(node.func.value, ast.Name)
            and any(_is_reading(a) for a in node.args)
        ):
            self.containers.add(node.func.value.id)
        elif (
            isinstance(node, ast.For | ast.comprehension)
            and isinstance(node.target, ast.Name)
            and self._container(node.iter)
        ):
            self.names.add(node.target.id)


def _walk(node: ast.AST, into_functions: bool) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        definition = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if into_functions or not definition:
            yield from _walk(child, into_functions)


def _span_compared(node: ast.AST, readings: _Readings) -> bool:
    """A comparison one of whose sides takes the time between two readings: `b_in - asked <
    0.2`, `0.3 < t - answered[0] < 1.0`, or `spent < 0.2` after `spent = b_in - asked`."""
    if not isinstance(node, ast.Compare):
        return False
    return any(
        readings.is_span(part) or (isinstance(part, ast.Name) and part.id in readings.spans)
        for side in [node.left, *node.comparators]
        for part in ast.walk(side)
    )


def _clock_bounds(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of each elapsed time taken (`time.monotonic() - started`),
    each clock reading compared to a sum (`time.monotonic() < killed_at + 5`), and each
    comparison of the time between two readings held in names (`b_in - asked < 0.2`)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str, outer: _Readings) -> None:
        readings = outer
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            function = getattr(node, "name", function)
            readings = _Readings(set(outer.names), set(outer.containers), set(outer.spans))
            readings.learn(node)
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
        where = (getattr(node, "lineno", 0), function)
        if (elapsed or within or _span_compared(node, readings)) and where not in found:
            found.append(where)
        for child in ast.iter_child_nodes(node):
            visit(child, function, readings)

    visit(ast.parse(source), "", _Readings())
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
        "def e():\n    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 120\n"  # 14
        "def f():\n    before = datetime.now(UTC)\n    after = datetime.datetime.now()\n"
        "    assert before <= stamp <= after\n"  # an order, not a bound
    )
    assert _clock_bounds(source) == [(5, "a"), (7, "b"), (9, "c"), (15, "e")]


def test_the_clock_scan_sees_the_time_between_two_readings_held_in_names() -> None:
    source = (
        "import time\n"
        "def a():\n    asked = time.monotonic()\n    b_in = time.monotonic()\n"
        "    assert b_in - asked < 0.2\n"  # 5
        "def b():\n    started = time.monotonic()\n    middle = time.perf_counter()\n"
        "    ended = time.time()\n"
        "    assert middle - started >= 0.5 and ended - middle < 0.3\n"  # 10
        "def c():\n    answered = []\n"
        "    def once():\n        answered.append(time.monotonic())\n"
        "    late = [t - answered[0] for t in answered[1:] if 0.3 < t - answered[0] < 1.0]\n"  # 15
        "def d():\n    started = {}\n"
        "    def call(k):\n        started[k] = time.monotonic()\n"
        "    assert started['fine'] - started['hang'] >= 0.3\n"  # 20
        "def e():\n    t0 = time.monotonic()\n    t1 = time.monotonic()\n"
        "    spent = t1 - t0\n    assert spent < 2\n"  # 25
        "def f():\n    asked = time.monotonic()\n    b_out = time.monotonic()\n"
        "    give_up = time.monotonic() + 120\n    a_ran = [time.monotonic()]\n"  # 30
        "    assert not [t for t in a_ran if asked < t < b_out]\n"  # an order, not a bound
        "    assert give_up > asked\n"
        "    spans = [(1.0, 2.0)]\n    assert spans[0][1] - spans[0][0] < 1\n"  # not readings
    )
    assert _clock_bounds(source) == [(5, "a"), (10, "b"), (15, "c"), (20, "d"), (25, "e")]


# Record fields that hold a time the product measured on its own clock (SPEC: `duration_s`,
# `latency_s`; a JUnit element's `time`), and the names the tests give such a time.
_TIME_FIELDS = {"duration_s", "latency_s", "time"}
_TIME_NAMES = {"duration_s", "latency_s", "waited", "elapsed"}
# What a test wraps a time in, keeping it a time: a number of it, its size, the largest of many.
_KEEPING = {"float", "int", "round", "abs", "max", "min", "sum"}


def _is_literal(node: ast.expr) -> bool:
    """A number written in the test (`2.0`, `-1`, `1e3 * 60`), not a constant of the product."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    return isinstance(node, ast.BinOp) and _is_literal(node.left) and _is_literal(node.right)


@dataclass
class _Times:
    """What holds a measured time in a function (and the functions in it): names assigned one
    (`took = reply.latency_s`), lists of them (`runs = [float(c.get("time")) ...]`) and loop
    names walking those."""

    names: set[str] = field(default_factory=set)

    def measured(self, node: ast.expr) -> bool:
        """A time read from a record's field or a name holding one, as it is or moved or scaled
        by numbers written in the test (`float(case.get("time") or 0) * 1000`); not its
        difference from a value the test computed (`abs(duration - wall) < 0.002`)."""
        if isinstance(node, ast.Name):
            return node.id in _TIME_NAMES or node.id in self.names
        if isinstance(node, ast.Attribute):
            return node.attr in _TIME_FIELDS - {"time"}  # `time.time` is a clock, not a field
        if isinstance(node, ast.Subscript):
            key = node.slice
            return (isinstance(key, ast.Constant) and key.value in _TIME_FIELDS) or self.measured(
                node.value
            )
        if isinstance(node, ast.Call):
            func, args = node.func, node.args
            if isinstance(func, ast.Attribute) and func.attr == "get" and args:
                return isinstance(args[0], ast.Constant) and args[0].value in _TIME_FIELDS
            return isinstance(func, ast.Name) and func.id in _KEEPING and self._keeps(args)
        if isinstance(node, ast.BoolOp):  # `case.get("time") or 0`
            return self._keeps(node.values)
        if isinstance(node, ast.BinOp):
            return self._keeps([node.left, node.right])
        if isinstance(node, ast.UnaryOp):
            return self.measured(node.operand)
        if isinstance(node, ast.ListComp | ast.GeneratorExp | ast.SetComp):
            return self.measured(node.elt)
        return isinstance(node, ast.List | ast.Tuple | ast.Set) and self._keeps(node.elts)

    def _keeps(self, parts: list[ast.expr]) -> bool:
        """Some of `parts` a time, the others numbers written in the test."""
        return any(self.measured(p) for p in parts) and all(
            self.measured(p) or _is_literal(p) for p in parts
        )

    def learn(self, scope: ast.AST) -> None:
        nodes = list(_walk(scope, into_functions=not isinstance(scope, ast.Module)))
        before = None
        while before != len(self.names):
            before = len(self.names)
            for node in nodes:
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if self.measured(node.value):
                        self.names.update(t.id for t in targets if isinstance(t, ast.Name))
                elif (
                    isinstance(node, ast.For | ast.comprehension)
                    and isinstance(node.target, ast.Name)
                    and self.measured(node.iter)
                ):
                    self.names.add(node.target.id)


def _time_field_bounds(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of each time a record holds (its `duration_s`, `latency_s`,
    a JUnit `time`, a test's `waited`) bounded above by a number written in the test
    (`waited <= 2.0`, `0.4 <= duration < 5`): under load such a time only grows. A test that
    sets the clock asserts the exact time instead (`== 352.0`); a lower bound is a behaviour
    (it waited at least the Retry-After) and passes."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str, outer: _Times) -> None:
        times = outer
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            function = getattr(node, "name", function)
            times = _Times(set(outer.names))
            times.learn(node)
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(
                (isinstance(op, ast.Lt | ast.LtE) and times.measured(a) and _is_literal(b))
                or (isinstance(op, ast.Gt | ast.GtE) and _is_literal(a) and times.measured(b))
                for a, op, b in zip(sides, node.ops, sides[1:], strict=False)
            ):
                found.append((node.lineno, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function, times)

    visit(ast.parse(source), "", _Times())
    return found


def test_the_time_field_scan_sees_upper_bounds_on_measured_times() -> None:
    source = (
        "def a():\n    (waited,) = slept\n    assert 0.9 <= waited <= 2.0\n"  # 3
        "def b():\n    assert record['duration_s'] < 5\n"  # 5
        "def c():\n    assert float(case.get('time') or 0) * 1000 <= 2500\n"  # 7
        "def d():\n    took = reply.latency_s\n    assert took < 0.5\n"  # 10
        "def e():\n    assert 5 > max(r.duration_s for r in results)\n"  # 12
        "def f():\n    runs = [float(c.get('time')) for c in cases]\n"
        "    for run in runs:\n        assert run < 3\n"  # 16
        "def g():\n    assert record['duration_s'] >= 0.5\n"  # a lower bound: a behaviour
        "    assert reply.latency_s == 352.0\n"  # the exact time of a clock the test set
        "    assert abs(float(suite.get('time') or 0) - wall) < 0.002\n"  # the test's value
        "    assert waited <= paused[0]\n"  # an order of two values
        "    assert record['duration_s'] < TIMEOUT_S + SLACK_S\n"  # a promise, with slack
        "    assert record['exit_code'] < 2 and len(records) < 5 and time.time() > 0\n"
    )
    assert _time_field_bounds(source) == [
        (3, "a"),
        (5, "b"),
        (7, "c"),
        (10, "d"),
        (12, "e"),
        (16, "f"),
    ]


def test_no_test_compares_elapsed_time_to_a_bound() -> None:
    """A speed goal is a benchmark under benchmarks/ that prints its figures; a test asserts the
    order of events or counts the work (a leftover's marker not yet there, characters scanned,
    lines run), asserts the exact time of a clock it sets, or waits with `helpers.wait_for`,
    whose give-up only turns a hang into a failure."""
    found = [
        f"{path.relative_to(TESTS.parent)}:{line} (in {function or 'the module'})"
        for path in _sources()
        for text in [path.read_text(encoding="utf-8")]
        for line, function in [*_clock_bounds(text), *_time_field_bounds(text)]
        if (path.relative_to(TESTS).as_posix(), function) not in _ALLOWED
    ]
    assert found == [], "elapsed time compared to a bound: " + ", ".join(found)
