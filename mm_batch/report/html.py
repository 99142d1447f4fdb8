"""report.html: one self-contained page to read a batch by, with no network and no CDN.

The per-model table, then every task run, failing ones first: its verdict and checks, the
prompt, and its time line (every model turn; every tool call with argv, outcome, rule, exit
code, stdout and stderr). Filters by status, model and task run in a few lines of inline script;
a link can set them (`report.html#status=failed&model=...&task=...`).

Everything that came from a model, a command or the configuration is escaped text: it is put
into the page by `html.escape` alone and never read back as markup by the script (the filters
compare `data-` attributes, set with escaped values). A Content-Security-Policy allows only the
page's own script, by its hash: even a hole in the escaping could not run a model's script.
"""

from __future__ import annotations

import base64
import hashlib
import html
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from mm_batch.report.readback import LoggedRecord, log_records
from mm_batch.report.summary import human_duration, model_lines, printable
from mm_batch.run.records import ModelRecord, RunResult, TaskRecord, ToolRecord

# Each text a page shows is cut here: calls.jsonl keeps up to 1 MiB, a page of 500 runs must open.
HTML_TEXT_LIMIT = 16 * 1024
_STATUS_ORDER = {"error": 0, "failed": 1, "passed": 2}

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;
text-align:left;vertical-align:top}pre{white-space:pre-wrap;word-break:break-all;margin:2px 0;
background:#f6f6f6;padding:4px;max-height:24em;overflow:auto}
details.run{border:1px solid #ccc;margin:4px 0;padding:2px 8px}
.passed{color:#176f2c}.failed{color:#b00020}.error{color:#9a6700}
.badge{font-weight:bold;text-transform:uppercase;margin-right:.5em}
#filters{margin:1em 0}#filters>*{margin-right:1em}.hidden{display:none}
"""

_SCRIPT = """
(function(){
  var status=document.getElementById('f-status'),model=document.getElementById('f-model'),
      task=document.getElementById('f-task'),shown=document.getElementById('shown');
  function apply(){
    var runs=document.querySelectorAll('details.run'),n=0;
    for(var i=0;i<runs.length;i++){
      var d=runs[i].dataset,ok=(!status.value||d.status===status.value)&&
        (!model.value||d.model===model.value)&&
        (!task.value||d.task.toLowerCase().indexOf(task.value.toLowerCase())>=0);
      runs[i].classList.toggle('hidden',!ok);if(ok){n++;}
    }
    shown.textContent=String(n);
  }
  var wanted=new URLSearchParams(location.hash.slice(1));
  status.value=wanted.get('status')||'';model.value=wanted.get('model')||'';
  task.value=wanted.get('task')||'';
  status.addEventListener('change',apply);model.addEventListener('change',apply);
  task.addEventListener('input',apply);apply();
})();
"""


def _e(value: object) -> str:
    """A value of any kind as escaped, printable text (control characters spelled out)."""
    return html.escape(printable(str(value)), quote=True)


def _block(text: str | None) -> str:
    """A multi-line text as an escaped <pre>, cut at HTML_TEXT_LIMIT characters."""
    value = "" if text is None else text
    cut = ""
    if len(value) > HTML_TEXT_LIMIT:
        cut = f"\n[... {len(value) - HTML_TEXT_LIMIT} more characters: see calls.jsonl ...]"
        value = value[:HTML_TEXT_LIMIT]
    shown = "\n".join(printable(line) for line in value.split("\n")) + cut
    return f"<pre>{html.escape(shown, quote=True)}</pre>"


def _seconds(value: float | None) -> str | None:
    """A number of seconds from a record as a person reads it; None when the record has none."""
    return None if value is None else human_duration(value)


def _facts(*pairs: tuple[str, object]) -> list[str]:
    """`label value` for each value a record holds: a field it leaves out (null) is not shown."""
    return [f"{label}{_e(value)}" for label, value in pairs if value is not None]


def _moment(stamp: str) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def _model_row(turn: ModelRecord) -> str:
    calls = "".join(
        f"<div>asks for <code>{_e(c.name)}</code></div>{_block(c.arguments)}"
        for c in turn.tool_calls
    )
    facts = ", ".join(
        _facts(
            ("", _seconds(turn.latency_s)),
            ("tokens in ", turn.prompt_tokens),
            ("tokens out ", turn.completion_tokens),
            ("finish ", turn.finish_reason),
        )
    )
    content = _block(turn.content) if turn.content else ""
    return f"<td>model turn</td><td>{facts}{content}{calls}</td>"


def _tool_row(call: ToolRecord) -> str:
    shown_argv = shlex.join(call.argv) if call.argv is not None else "(not run)"
    facts = [
        f"<code>{_e(call.tool)}</code> {_e(call.outcome)}",
        *_facts(
            ("exit ", call.exit_code),
            ("rule ", call.rule),
            ("", _seconds(call.duration_s)),
            ("on ", call.where),
        ),
    ]
    if call.recovered_from_text:
        facts.append("rescued from text")
    parts = [" · ".join(facts), _block(f"$ {shown_argv}")]
    if call.reason:
        parts.append(f"<div>reason: {_e(call.reason)}</div>")
    for stream, text in (("stdout", call.stdout), ("stderr", call.stderr)):
        if text:
            parts.append(f"<div>{stream}</div>{_block(text)}")
    return f"<td>tool call</td><td>{''.join(parts)}</td>"


def _run_section(result: RunResult, records: Sequence[LoggedRecord]) -> str:
    final = next((r.record for r in reversed(records) if isinstance(r.record, TaskRecord)), None)
    checks = () if final is None else final.checks
    check_rows = "".join(
        f"<tr><td class={'passed' if c.ok else 'failed'}>"
        f"{'ok' if c.ok else 'not met'}</td><td>{_e(c.name)}</td>"
        f"<td>{_block(c.detail) if c.detail else ''}</td></tr>"
        for c in checks
    )
    start = next((m for m in (_moment(r.ts) for r in records) if m), None)
    timeline = []
    for logged in records:
        moment = _moment(logged.ts)
        offset = (
            ""
            if moment is None or start is None
            else human_duration(max((moment - start).total_seconds(), 0.0))
        )
        record = logged.record
        if isinstance(record, ModelRecord):
            timeline.append(f"<tr><td>{offset}</td>{_model_row(record)}</tr>")
        elif isinstance(record, ToolRecord):
            timeline.append(f"<tr><td>{offset}</td>{_tool_row(record)}</tr>")
        else:
            answer = None if final is None else final.answer
            # The reason says what ended the run: for a timeout, what was in flight then (a
            # model turn or a call that never finished has no record of its own above).
            why = record.reason if record.status != "passed" else None
            timeline.append(
                f"<tr><td>{offset}</td><td>verdict</td><td>{_e(record.status)}"
                f"{f': {_e(why)}' if why else ''}{_block(answer) if answer else ''}</td></tr>"
            )
    prompt = None if final is None else final.prompt
    return (
        f'<details class="run" data-status="{_e(result.status)}" data-model="{_e(result.model)}" '
        f'data-task="{_e(result.task)}"{" open" if result.status != "passed" else ""}>'
        f'<summary><span class="badge {_e(result.status)}">{_e(result.status)}</span>'
        f"<code>{_e(result.run_id)}</code>{' (rerun)' if result.rerun else ''} "
        f"{human_duration(result.duration_s)}{f': {_e(result.reason)}' if result.reason else ''}"
        "</summary>"
        + (f"<h4>Prompt</h4>{_block(prompt)}" if prompt else "")
        + (f"<h4>Checks</h4><table>{check_rows}</table>" if check_rows else "")
        + "<h4>Time line (since the first record)</h4><table>"
        + "".join(timeline)
        + "</table></details>"
    )


def group_records(records: Iterable[LoggedRecord]) -> dict[str, list[LoggedRecord]]:
    """calls.jsonl's records per run id, in their `seq` order."""
    runs: dict[str, list[LoggedRecord]] = {}
    for record in records:
        runs.setdefault(record.run, []).append(record)
    for found in runs.values():
        found.sort(key=lambda r: r.seq)
    return runs


def report_html(
    suite: str,
    results: Sequence[RunResult],
    records: Mapping[str, Sequence[LoggedRecord]],
) -> str:
    """The page for one results folder: `records` are calls.jsonl's, grouped by run id."""
    lines = model_lines(results)
    model_rows = "".join(
        f"<tr><td>{_e(m.model)}</td><td>{m.passed}/{m.runs}</td><td>{m.failed}</td>"
        f"<td>{m.errors}</td><td>{human_duration(m.mean_s)}</td></tr>"
        for m in lines
    )
    counts = {s: sum(r.status == s for r in results) for s in _STATUS_ORDER}
    ordered = sorted(results, key=lambda r: (_STATUS_ORDER.get(r.status, 3), r.index))
    runs = "".join(_run_section(r, records.get(r.run_id, ())) for r in ordered)
    options = "".join(f'<option value="{_e(m.model)}">{_e(m.model)}</option>' for m in lines)
    digest = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    policy = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        f"<title>mm-batch: {_e(suite)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>mm-batch: {_e(suite)}</h1>"
        f'<p id="counts"><span id="n-runs">{len(results)}</span> runs: '
        f'<span id="n-passed">{counts["passed"]}</span> passed, '
        f'<span id="n-failed">{counts["failed"]}</span> failed, '
        f'<span id="n-error">{counts["error"]}</span> errors</p>'
        "<table><tr><th>Model</th><th>Passes/runs</th><th>Failed</th><th>Errors</th>"
        f"<th>Mean time per task</th></tr>{model_rows}</table>"
        '<div id="filters"><label>Status <select id="f-status"><option value="">all</option>'
        '<option value="failed">failed</option><option value="error">error</option>'
        '<option value="passed">passed</option></select></label>'
        f'<label>Model <select id="f-model"><option value="">all</option>{options}</select>'
        '</label><label>Task <input id="f-task" type="search"></label>'
        '<span><span id="shown"></span> shown</span></div>'
        f"{runs}<script>{_SCRIPT}</script></body></html>\n"
    )


def records_of(calls_text: str) -> dict[str, list[LoggedRecord]]:
    """calls.jsonl's text read for the page, grouped by run id."""
    return group_records(log_records(calls_text))
