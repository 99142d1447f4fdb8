"""The threads that run task runs' model calls: reused, yet each job on its own."""

from __future__ import annotations

import contextvars
import functools
import threading

import pytest

from mm_batch.run import threads

FLAG: contextvars.ContextVar[str] = contextvars.ContextVar("flag", default="unset")


def test_a_job_s_result_and_its_exception_come_back() -> None:
    ok = threads.start(lambda: 42, "t")
    assert ok.wait(5) and ok.result() == 42

    def fails() -> int:
        raise KeyError("boom")

    bad = threads.start(fails, "t")
    assert bad.wait(5)
    with pytest.raises(KeyError, match="boom"):
        bad.result()


def test_a_thread_whose_job_ended_runs_the_next_one() -> None:
    first = threads.start(threading.get_ident, "t")
    assert first.wait(5)
    ident = first.result()
    for _ in range(50):  # the worker may not be back among the idle ones yet
        second = threads.start(threading.get_ident, "t")
        assert second.wait(5)
        if second.result() == ident:
            return
    pytest.fail("no thread was used twice")


def test_what_a_job_sets_in_its_context_never_reaches_the_next_job() -> None:
    def sets() -> int:
        FLAG.set("set by an earlier job")
        return threading.get_ident()

    def reads() -> tuple[int, str]:
        return threading.get_ident(), FLAG.get()

    setter = threads.start(sets, "t")
    assert setter.wait(5)
    seen = []
    for _ in range(50):
        reader = threads.start(reads, "t")
        assert reader.wait(5)
        seen.append(reader.result())
    assert any(ident == setter.result() for ident, _ in seen)  # the same thread ran them
    assert {flag for _, flag in seen} == {"unset"}


def test_a_job_that_never_ends_holds_up_no_other_job() -> None:
    release = threading.Event()
    stuck = threads.start(release.wait, "t")
    try:
        others = [threads.start(functools.partial(pow, n, 2), "t") for n in range(20)]
        assert all(o.wait(5) for o in others)
        assert [o.result() for o in others] == [n**2 for n in range(20)]
        assert not stuck.wait(0.05)
    finally:
        release.set()
    assert stuck.wait(5)
