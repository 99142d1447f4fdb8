"""The reports in their five shapes, made once a test session, and what a consumer must show."""

from __future__ import annotations

import pytest

from tests.consumers.shapes import MODEL_CLASS, Failing, Reports, build, consumers_required


@pytest.fixture(scope="session")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    return build(tmp_path_factory.mktemp("checkout"))


def require(what: str, found: bool, how: str) -> None:
    """Skip when a consumer is not installed (a fresh clone), fail under
    MM_BATCH_REQUIRE_CONSUMERS=1 (CI, where it must have been installed)."""
    if found:
        return
    message = f"{what} is not installed; install it with: {how}"
    if consumers_required():
        pytest.fail(f"{message} (MM_BATCH_REQUIRE_CONSUMERS=1: it must run)", pytrace=False)
    pytest.skip(message)


def missing_from(shown: str, failing: Failing, tasks_file: str) -> list[str]:
    """What a CI user must see of a run that did not pass and that `shown` lacks: the task, the
    model (as given, or as its classname spells it), the reason, every check, the stderr of the
    command that failed, and the task's line."""
    wanted = {
        f"the task ({failing.case})": failing.case in shown,
        f"the model ({failing.model})": failing.model in shown or MODEL_CLASS in shown,
        f"the reason ({failing.reason!r})": failing.reason in shown,
        f"the task's line ({tasks_file}:{failing.line})": (
            f"task defined at {tasks_file}:{failing.line}" in shown
        ),
    }
    for name, detail in failing.checks:
        wanted[f"the check {name} ({detail!r})"] = name in shown and detail in shown
    if failing.stderr is not None:
        wanted[f"the command's stderr ({failing.stderr!r})"] = failing.stderr in shown
    return [what for what, ok in wanted.items() if not ok]


def assert_shows(consumer: str, shown: str, failing: Failing, tasks_file: str) -> None:
    missing = missing_from(shown, failing, tasks_file)
    assert not missing, (
        f"{consumer} does not show {'; '.join(missing)} for {failing.case}; it shows:\n{shown}"
    )
