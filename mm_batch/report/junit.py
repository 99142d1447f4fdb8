"""junit.xml: one <testsuite> per tasks file and model, one <testcase> per task run."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from junit_xml import TestCase, TestSuite

from mm_batch.plan import Plan, classname
from mm_batch.run.records import RunResult

# Characters XML 1.0 cannot carry at all; anything a process or a model prints may hold them.
_ILLEGAL_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """Show illegal characters as #xNN, as pytest's junitxml does, instead of breaking the file."""
    return _ILLEGAL_XML.sub(lambda m: f"#x{ord(m.group()):02X}", text)


SYSTEM_OUT_LIMIT = 64 * 1024  # characters of <system-out> per test case
DETAILS_LIMIT = 64 * 1024  # characters of the text of <failure> / <error>
MESSAGE_LIMIT = 1024  # characters of `message`


def _bounded(text: str, limit: int) -> str:
    """At most `limit` characters, the cut said: a 10 MiB answer must not make a 10 MiB report."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} more characters cut ...]"
    return text[: max(limit - len(marker), 0)] + marker


def _case(plan: Plan, result: RunResult) -> TestCase:
    name = result.task if plan.repeat == 1 else f"{result.task}#{result.repeat}"
    out = "\n".join(result.calls) or "(no tool calls)"
    if result.answer is not None:
        out += f"\n\nfinal answer:\n{result.answer}"
    case = TestCase(
        name=xml_safe(name),
        classname=xml_safe(classname(plan.suite, result.model)),
        elapsed_sec=round(result.duration_s, 3),
        stdout=xml_safe(_bounded(out, SYSTEM_OUT_LIMIT)),
    )
    details = "\n".join(
        f"[{'ok' if c.ok else 'FAILED'}] {c.name}: {c.detail}" for c in result.checks
    )
    message = xml_safe(_bounded(result.reason, MESSAGE_LIMIT))
    output = xml_safe(_bounded(details or result.reason, DETAILS_LIMIT))
    if result.status == "failed":
        case.add_failure_info(message=message, output=output, failure_type="failed")
    elif result.status == "error":
        case.add_error_info(message=message, output=output, error_type="error")
    return case


def junit_xml(plan: Plan, results: Sequence[RunResult], provenance: Mapping[str, Any]) -> str:
    properties = {xml_safe(k): xml_safe(str(v)) for k, v in provenance.items()}
    root = ET.Element("testsuites")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    elapsed = 0.0
    for model in dict.fromkeys(r.model for r in results):
        cases = [_case(plan, r) for r in results if r.model == model]
        suite = TestSuite(xml_safe(f"{plan.suite}[{model}]"), cases, properties=properties)
        element = suite.build_xml_doc()
        # junit-xml always writes `disabled`, which the common JUnit XSD rejects.
        element.attrib.pop("disabled", None)
        for key in totals:
            totals[key] += int(element.get(key, "0"))
        elapsed += float(element.get("time", "0") or 0)
        root.append(element)
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{elapsed:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
