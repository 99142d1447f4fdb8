"""Judge a task run from what really ran (the tool records), never from the answer alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mm_batch.config.model import CallExpectation, Expect, Value


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def as_record(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail}


def _args_match(expected: dict[str, Value], actual: dict[str, Any]) -> bool:
    for key, want in expected.items():
        if key not in actual:
            return False
        got = actual[key]
        if isinstance(want, bool) != isinstance(got, bool) or got != want:
            return False
    return True


def _show_call(record: dict[str, Any]) -> str:
    return f"{record['tool']} {json.dumps(record.get('arguments'), ensure_ascii=False)}"


def _ran(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("outcome") == "ran"]


def _expected_call(index: int, want: CallExpectation, ran: list[dict[str, Any]]) -> Check:
    matching = [
        r
        for r in ran
        if r["tool"] == want.tool and _args_match(dict(want.args or {}), r["arguments"] or {})
    ]
    args = json.dumps(dict(want.args or {}), ensure_ascii=False)
    wanted = f"{want.tool} {args}" + (f" {want.times} time(s)" if want.times is not None else "")
    ok = len(matching) == want.times if want.times is not None else bool(matching)
    ran_text = "; ".join(_show_call(r) for r in ran) or "nothing"
    detail = f"expected {wanted}; ran {len(matching)} matching call(s); all that ran: {ran_text}"
    return Check(f"calls[{index}]", ok, detail)


def judge(
    expect: Expect | None,
    records: Sequence[dict[str, Any]],
    answer: str | None,
    check_exit: tuple[int | None, str] | None,
) -> list[Check]:
    """The checks of `expect`, plus the standing rule that a refusal must be expected."""
    ran = _ran(records)
    checks: list[Check] = []
    expect = expect or Expect()
    for i, want in enumerate(expect.calls):
        checks.append(_expected_call(i, want, ran))
    for name in expect.no_calls:
        hits = [r for r in ran if r["tool"] == name]
        checks.append(
            Check(
                f"no_calls:{name}",
                not hits,
                f"{name} ran {len(hits)} time(s)" if hits else f"{name} did not run",
            )
        )
    refused = [r for r in records if r.get("outcome") == "refused"]
    for name in expect.refused:
        hits = [r for r in refused if r["tool"] == name]
        checks.append(
            Check(f"refused:{name}", bool(hits), f"{name} was refused {len(hits)} time(s)")
        )
    unexpected = [r for r in refused if r["tool"] not in expect.refused]
    if unexpected:
        shown = "; ".join(str(r.get("reason")) for r in unexpected)
        checks.append(Check("no_unexpected_refusal", False, shown))
    if expect.exit_code is not None:
        wrong = [r for r in ran if r.get("exit_code") != expect.exit_code]
        detail = (
            "; ".join(f"{_show_call(r)} exited {r.get('exit_code')}" for r in wrong)
            or f"every call that ran exited {expect.exit_code}"
        )
        checks.append(Check("exit_code", not wrong, detail))
    for text in expect.answer_contains:
        found = answer is not None and text in answer
        checks.append(
            Check(
                f"answer_contains:{text}",
                found,
                "found in the answer" if found else "not in the final answer",
            )
        )
    if check_exit is not None:
        code, output = check_exit
        detail = f"exited {code}" if code is not None else "could not complete"
        if output:
            detail += f": {output}"
        checks.append(Check("check", code == 0, detail))
    return checks
