"""`mm-batch run`: validate, plan, run every task run, write the reports, map to an exit code."""

from __future__ import annotations

import platform
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import click

from mm_batch import __version__
from mm_batch.commands.effects import default_effects
from mm_batch.config.load import display_path, load_tasks
from mm_batch.config.local_catalog import local_model
from mm_batch.config.paths import report_path
from mm_batch.config.secrets import Masker, masker_of
from mm_batch.effects.litellm import knows_price, litellm_version, price_model
from mm_batch.effects.mcp import MCP_EXTRA_HINT
from mm_batch.effects.mcp import installed as mcp_installed
from mm_batch.effects.signals import cancel_on_signals
from mm_batch.errors import ExitCode
from mm_batch.plan import Overrides, Plan, PlanError, make_plan
from mm_batch.report.calls_log import JsonlRecorder
from mm_batch.report.files import (
    CALLS,
    JUNIT,
    REPORT_HTML,
    SUMMARY_JSON,
    SUMMARY_MD,
    ResultsFolder,
    unwritable,
)
from mm_batch.report.html import records_of, report_html
from mm_batch.report.junit import junit_xml, run_ends
from mm_batch.report.rerun import (
    Previous,
    kept_records,
    read_previous,
    rerun_junit,
    rerun_plan,
    warn_if_changed,
    with_previous,
)
from mm_batch.report.summary import (
    Coverage,
    ProvenanceValue,
    exit_code,
    summary_json,
    summary_markdown,
    task_verdicts,
    terminal_table,
)
from mm_batch.report.terminal import Progress, publish_to_github, short_summary, show_warnings
from mm_batch.run.batch import Effects, run_batch
from mm_batch.run.pristine import Pristine
from mm_batch.run.records import RunResult

DEFAULT_OUT = Path("mm-batch-results")


def _check_supported(plan: Plan) -> None:
    """Refuse what this installation cannot honour, rather than run without it."""
    if any(run.task.agent.mcp for run in plan.runs) and not mcp_installed():
        raise PlanError(f"the agent uses MCP servers, which need the mcp extra: {MCP_EXTRA_HINT}")


def _resolved(folder: Path) -> Path:
    """The folder's real path; one that has none (a symbolic link loop) is a usage error."""
    try:
        return folder.resolve()
    except (OSError, RuntimeError) as exc:  # Python 3.11 raises RuntimeError on a loop
        raise PlanError(f"{folder}: no real path ({exc})") from None


def _check_outside_mounts(plan: Plan, out_dir: Path) -> None:
    """A results or cache folder inside a read-write mounted workspace could be swapped (or
    the cache filled with replies of a command's making) by a command."""
    folders = [(f"--out {out_dir}", _resolved(out_dir), "write the results elsewhere")]
    if plan.cache is not None:
        where = f"the cache {display_path(plan.cache.folder)}"
        folders.append((where, _resolved(plan.cache.folder), "keep the cache elsewhere"))
    for run in plan.runs:
        sandbox = run.sandbox
        if sandbox.kind != "docker" or sandbox.workspace != "mount":
            continue
        mounted = run.task.agent.directory.resolve()
        for what, resolved, fix in folders:
            if resolved == mounted or mounted in resolved.parents:
                raise PlanError(
                    f"{what} lies inside {display_path(mounted)}, which the sandbox mounts "
                    f"read-write (workspace: mount): a command could replace it; {fix}, or use "
                    "workspace: copy"
                )


def _unpriced(plan: Plan, masker: Masker) -> frozenset[str]:
    """With a cost limit, the models (masked) litellm knows no price for, each said once (its
    calls count 0) before the first run, so that the live progress line does not cut it.
    Without one, none is looked up: nothing counts."""
    if plan.max_cost is None:
        return frozenset()
    # A run is priced as its `base_model` where it names one (an Azure deployment).
    unpriced = frozenset(
        masker.text(r.model)
        for r in plan.runs
        if not knows_price(price_model(r.model, r.model_options))
    )
    for model in sorted(unpriced):
        click.echo(
            f"mm-batch: warning: litellm knows no price for {model}: its calls cannot "
            "be counted against --max-cost",
            err=True,
        )
    return unpriced


def provenance(plan: Plan) -> dict[str, ProvenanceValue]:
    """What made the reports: versions, models, seeds, the sha256 of each config file and of
    each local model's GGUF (`sha256:<file>`, `sha256:local/<name>`)."""
    files = {display_path(plan.tasks_file.path): plan.tasks_file.sha256}
    files.update({display_path(a.path): a.sha256 for a in plan.tasks_file.agents})
    seeds = {r.model: r.model_options.get("seed") for r in plan.runs}
    data: dict[str, ProvenanceValue] = {
        "mm_batch_version": __version__,
        "litellm_version": litellm_version(),
        "python_version": platform.python_version(),
        "models": ",".join(plan.models),
        "seeds": ",".join(f"{m}={s}" for m, s in seeds.items() if s is not None) or "none",
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    data.update({f"sha256:{name}": digest for name, digest in files.items()})
    local = (entry for model in plan.models if (entry := local_model(model)) is not None)
    data.update({f"sha256:{entry.model}": entry.sha256 for entry in local})
    return data


def run(
    tasks_path: Path,
    overrides: Overrides,
    out_dir: Path = DEFAULT_OUT,
    effects: Effects | None = None,
    *,
    rerun_from: Path | None = None,
) -> int:
    """With `rerun_from`, only the runs that did not pass in that results folder run again;
    its other runs are kept in the new one."""
    tasks_file = load_tasks(tasks_path)
    show_warnings(tasks_file.warnings)
    plan = make_plan(tasks_file, overrides)
    _check_supported(plan)
    problem = unwritable(out_dir)  # before any server starts or any result is replaced
    if problem is not None:
        raise PlanError(problem)
    _check_outside_mounts(plan, out_dir)
    # The command line's model options too: `--model-option api_key=...` is a secret.
    masker = masker_of(tasks_file.agents, [overrides.model_options])
    cancel = threading.Event()
    received: list[int] = []
    # A secret can hide anywhere, the names of files included (SPEC 7: every string written).
    facts: dict[str, ProvenanceValue] = {
        masker.text(k): masker.data(v) for k, v in provenance(plan).items()
    }
    previous = None if rerun_from is None else read_previous(rerun_from).masked(masker)
    in_place = rerun_from is not None and _resolved(rerun_from) == _resolved(out_dir)
    if previous is not None:  # read whole now: it may be the folder about to be replaced
        plan = rerun_plan(plan, previous, masker)
        warn_if_changed(previous, facts)
        facts["rerun_of"] = masker.text(
            "unknown" if previous.started_at is None else previous.started_at
        )
    kept = "" if previous is None else f" ({len(previous.results) - len(plan.runs)} kept)"
    click.echo(
        masker.text(
            f"mm-batch {__version__}: {len(plan.runs)} run(s){kept} of "
            f"{display_path(tasks_path)}, {plan.jobs} in parallel"
        ),
        err=True,
    )
    # Hooks and check programs are read now: nothing a command does later changes what runs.
    pristine = Pristine.take({r.task.id: r.task for r in plan.runs}.values())
    # Until the process exits, any further SIGINT or SIGTERM only sets what is set already.
    with cancel_on_signals(cancel, received):
        try:
            # A missing local extra or model stops here, before any result is replaced.
            effects = effects or default_effects(plan, out_dir, masker)
            unpriced = _unpriced(plan, masker)  # litellm is imported by now
            folder = ResultsFolder(out_dir)
            try:
                # A rerun into DIR itself keeps DIR's verdicts until the new ones replace them:
                # killed meanwhile, it leaves a folder that can be rerun again.
                folder.clear(keep=(SUMMARY_JSON, JUNIT) if in_place else ())
                recorder = JsonlRecorder(folder.open_log(CALLS))
                try:
                    if previous is not None:
                        again = {masker.text(r.run_id) for r in plan.runs}
                        for record in kept_records(previous, again):
                            recorder.write_line(record.line())
                    # Leaving it ends the live line, so that what follows starts a line of its own.
                    with Progress(len(plan.runs)) as progress:
                        results = run_batch(
                            plan,
                            effects,
                            recorder,
                            masker,
                            cancel,
                            progress,
                            pristine,
                            unpriced,
                            on_start=progress.run_started,
                            warn=lambda line: click.echo(line, err=True),
                        )
                finally:
                    recorder.close()
                    effects.shutdown()
                everything = results if previous is None else with_previous(previous, results)
                verdicts = task_verdicts(everything, plan.min_pass_rate)
                code = ExitCode.INTERRUPTED if received else exit_code(verdicts)
                summary_md = _write_reports(
                    folder,
                    plan,
                    results,
                    everything,
                    facts,
                    code,
                    masker,
                    previous,
                    recorder,
                    out_dir,
                )
            finally:
                folder.close()
        finally:
            pristine.close()
        publish_to_github(
            everything,
            summary_md,
            tasks_file=masker.text(report_path(plan.tasks_file.path)),
            min_pass_rate=plan.min_pass_rate,
            out_dir=out_dir.as_posix(),
        )
        click.echo(terminal_table(everything), err=True)
        for line in short_summary(everything, plan.min_pass_rate):
            click.echo(line, err=True)
        if received:
            name = signal.Signals(received[0]).name
            click.echo(f"mm-batch: interrupted by {name}; reports written to {out_dir}", err=True)
        else:
            click.echo(f"mm-batch: reports in {out_dir}", err=True)
        sys.stderr.flush()
    return ExitCode.INTERRUPTED if received else code


def _write_reports(
    folder: ResultsFolder,
    plan: Plan,
    results: Sequence[RunResult],
    everything: Sequence[RunResult],
    facts: dict[str, ProvenanceValue],
    code: ExitCode,
    masker: Masker,
    previous: Previous | None,
    recorder: JsonlRecorder,
    out_dir: Path,
) -> str:
    """Write every report that can be written; a bug in one does not keep the others back.
    `results` are this run's; `everything` adds the runs kept from `previous` (a rerun's).
    calls.jsonl is written again only when a command replaced it during the run."""
    log = recorder.text()
    records = records_of(log)
    suite = masker.text(plan.suite)
    rate = plan.min_pass_rate
    summary_md = summary_markdown(
        masker.text(report_path(plan.tasks_file.path)),
        everything,
        rate,
        report=masker.text(f"{out_dir.as_posix()}/{REPORT_HTML}"),
        interrupted=code == ExitCode.INTERRUPTED,
    )

    def junit() -> str:
        text = junit_xml(plan, results, facts, masker, ends=run_ends(records))
        return text if previous is None else rerun_junit(previous, results, text, rate, folder.path)

    reports: list[tuple[str, Callable[[], str]]] = [
        *([] if folder.holds(CALLS, recorder.inode) else [(CALLS, lambda: log)]),
        (JUNIT, junit),
        (
            SUMMARY_JSON,
            lambda: summary_json(suite, rate, everything, facts, code, Coverage.of(plan)),
        ),
        (SUMMARY_MD, lambda: summary_md),
        (REPORT_HTML, lambda: report_html(suite, everything, records)),
    ]
    failure: BaseException | None = None
    for name, render in reports:
        try:
            folder.write(name, render())
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure  # a bug of mm-batch: exit 4 with its traceback, the rest written
    return summary_md
