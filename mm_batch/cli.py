"""The command line: parse options, call one command function, map errors to exit codes.

Heavy imports (litellm, the run stage) happen inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from mm_batch import __version__
from mm_batch.config.model import CACHE_MODES, SANDBOX_KINDS, CacheMode, SandboxKind
from mm_batch.errors import ExitCode, UsageError
from mm_batch.jsontypes import JsonObject, JsonValue

if TYPE_CHECKING:
    from mm_batch.plan import Overrides

Command = Callable[..., None]

_EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


# Within the files' bounds (SPEC 1): a value sits two levels down in an agent file (the file's
# mapping, then model_options), and nothing may nest deeper than 64; integers of at most 30
# digits; finite numbers; text that can be encoded.
_OPTION_DEPTH = 62
_OPTION_DIGITS = 30


class _OptionValueError(Exception):
    """A `--model-option` value JSON reads, but not within the bounds a file's value has."""


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > _OPTION_DIGITS:
        raise _OptionValueError(f"an integer of more than {_OPTION_DIGITS} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OptionValueError(f"{text[:40]} is not a finite number")
    return value


def _no_constant(name: str) -> NoReturn:
    raise _OptionValueError(f"{name} is not a finite number")


def _bounded_data(value: JsonValue) -> None:
    """Nesting and text of a parsed value, walked without recursion."""
    stack: list[tuple[JsonValue, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth + 1 > _OPTION_DEPTH:
                raise _OptionValueError(f"nested deeper than {_OPTION_DEPTH}")
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _OptionValueError("text with a character that cannot be encoded") from None


def _parse_option_value(text: str) -> JsonValue:
    """`--model-option KEY=VALUE`: numbers, true/false, objects and lists as JSON reads them
    (`extra_headers={"X-Team": "ci"}`), else a string. Raises _OptionValueError for JSON a
    file could not hold (NaN, 1e999, a 31-digit integer, deep nesting)."""
    try:
        value = json.loads(
            text,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_no_constant,
        )
    except RecursionError:
        raise _OptionValueError(f"nested deeper than {_OPTION_DEPTH}") from None
    except ValueError:
        return text
    if not isinstance(value, int | float | bool | dict | list):
        return text
    _bounded_data(value)
    return value


def _model_options(pairs: Sequence[str]) -> JsonObject:
    options: JsonObject = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY=VALUE, got '{pair[:120]}'", param_hint="--model-option"
            )
        try:
            options[key] = _parse_option_value(value)
        except _OptionValueError as exc:
            from mm_batch.config.secrets import MASK, secret_name

            if secret_name(key):  # a secret's value is never shown, not even in an error
                raise click.BadParameter(
                    f"'{key}={MASK}': its value is not one a model option can be",
                    param_hint="--model-option",
                ) from None
            shown = pair if len(pair) <= 120 else pair[:117] + "..."
            raise click.BadParameter(
                f"'{shown}': {exc}, which a model option cannot be",
                param_hint="--model-option",
            ) from None
    return options


def plan_options(command: Command) -> Command:
    """Options shared by `run` and `plan`: they override the files, and reach the command as
    one `overrides`."""

    @functools.wraps(command)
    def with_overrides(
        *,
        models: tuple[str, ...],
        model_options: tuple[str, ...],
        repeat: int | None,
        jobs: int | None,
        yolo: bool | None,
        sandbox: SandboxKind | None,
        image: str | None,
        filters: tuple[str, ...],
        excludes: tuple[str, ...],
        exitfirst: bool,
        shard: str | None,
        **given: object,
    ) -> None:
        from mm_batch.plan import Overrides, parse_shard

        overrides = Overrides(
            models=models,
            model_options=_model_options(model_options),
            repeat=repeat,
            jobs=jobs,
            yolo=yolo,
            sandbox=sandbox,
            image=image,
            filters=filters,
            excludes=excludes,
            exitfirst=exitfirst,
            shard=parse_shard(shard) if shard else None,
        )
        command(overrides=overrides, **given)

    decorators = [
        click.option("--model", "models", multiple=True, help="Model to run on (repeatable)."),
        click.option(
            "--model-option",
            "model_options",
            multiple=True,
            metavar="KEY=VALUE",
            help="Passed to litellm for every model (repeatable).",
        ),
        click.option("--repeat", type=click.IntRange(min=1), help="Runs of every task per model."),
        click.option("--jobs", type=click.IntRange(min=1), help="Task runs in parallel."),
        click.option(
            "--yolo/--allowlist",
            "yolo",
            default=None,
            help="Run every call, or only calls the allowlist preapproves.",
        ),
        click.option(
            "--sandbox", type=click.Choice(SANDBOX_KINDS), help="Where tool commands run."
        ),
        click.option("--image", help="Sandbox image (with --sandbox docker)."),
        click.option(
            "--filter",
            "filters",
            multiple=True,
            metavar="GLOB",
            help="Only task ids matching GLOB (repeatable: any of them).",
        ),
        click.option(
            "--exclude",
            "excludes",
            multiple=True,
            metavar="GLOB",
            help="Leave out task ids matching GLOB (repeatable), after --filter.",
        ),
        click.option(
            "-x",
            "--exitfirst",
            is_flag=True,
            default=False,
            help="Start no run after the first that failed or erred; those not started are errors.",
        ),
        click.option("--shard", metavar="K/N", help="Run only shard K of N (K from 1)."),
    ]
    decorated: Command = with_overrides
    for decorator in reversed(decorators):
        decorated = decorator(decorated)
    return decorated


def _positive_usd(
    _ctx: click.Context, _param: click.Parameter, value: float | None
) -> float | None:
    """`--max-cost`: a finite amount above 0 (click's float also reads `nan` and `inf`)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(
            f"a number of USD above 0 is needed, got {value}", param_hint="--max-cost"
        )
    return value


RERUN_OPTION = click.option(
    "--rerun-failed",
    "rerun_from",
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Run only the runs that failed or erred in the results folder DIR; keep its others.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mm-batch")
def cli() -> None:
    """Run LLM agent prompts as CI steps, judged by what really ran."""


RUN_EXIT_CODES = """\b
Exit codes:
  0    every task passed (with repeats: its pass rate >= min_pass_rate)
  1    at least one task failed
  2    usage or configuration error; nothing ran
  3    none failed, but at least one task run could not be judged (error)
  4    mm-batch itself failed (a bug); the reports are written if possible
  130  interrupted by SIGINT, SIGTERM or SIGHUP; the reports are written
"""


@cli.command(epilog=RUN_EXIT_CODES)
@click.argument("tasks_file", type=_EXISTING_FILE)
@plan_options
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("mm-batch-results"),
    show_default=True,
    help="Results folder; its previous results are replaced.",
)
@click.option(
    "--cache",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Cache model responses in DIR, keyed by the exact request: a rerun with the same "
    "requests asks no model (tools still run). Overrides cache: in the tasks file.",
)
@click.option(
    "--cache-mode",
    type=click.Choice(CACHE_MODES),
    help="read: use hits, store nothing new; write: never read, store; readwrite (default): both.",
)
@click.option(
    "--max-cost",
    metavar="USD",
    type=float,
    callback=_positive_usd,
    help="Start no new run once the batch has spent this much (litellm's prices); "
    "the runs not started are errors.",
)
@RERUN_OPTION
def run(
    tasks_file: Path,
    out_dir: Path,
    rerun_from: Path | None,
    overrides: Overrides,
    cache: Path | None,
    cache_mode: CacheMode | None,
    max_cost: float | None,
) -> None:
    """Run every task of TASKS_FILE and write junit.xml, calls.jsonl and summaries."""
    # litellm is imported once the plan shows a model that needs it (none for `local/` ones):
    # see `commands.effects.default_effects`.
    from mm_batch.commands import run as command

    overrides = replace(overrides, cache=cache, cache_mode=cache_mode, max_cost=max_cost)
    sys.exit(command.run(tasks_file, overrides, out_dir, rerun_from=rerun_from))


@cli.command()
@click.argument("tasks_file", type=_EXISTING_FILE)
@plan_options
@RERUN_OPTION
def plan(tasks_file: Path, rerun_from: Path | None, overrides: Overrides) -> None:
    """List the runs that `run` would do with the same options; run nothing."""
    from mm_batch.commands import inspect

    sys.exit(inspect.plan(tasks_file, overrides, rerun_from))


@cli.command()
@click.argument("file", type=_EXISTING_FILE)
def validate(file: Path) -> None:
    """Check a tasks file (and every agent file it names) or an agent file."""
    from mm_batch.commands import inspect

    sys.exit(inspect.validate(file))


@cli.command()
@click.argument("agent_file", type=_EXISTING_FILE)
def tools(agent_file: Path) -> None:
    """Print exactly the tool definitions the model is sent."""
    from mm_batch.commands import inspect

    sys.exit(inspect.tools(agent_file))


@cli.command()
@click.argument(
    "folders",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where the merged results go; previous results are replaced.",
)
def merge(folders: tuple[Path, ...], out_dir: Path) -> None:
    """Merge the results folders of shards into one, as if one machine had run them all."""
    from mm_batch.commands import merge as command

    sys.exit(command.merge(folders, out_dir))


@cli.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("head", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--alpha",
    type=float,
    default=0.05,
    show_default=True,
    help="A drop is a regression when its one-sided Fisher exact p-value is at most this.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("mm-batch-compare"),
    show_default=True,
    help="Where compare.md and compare.json go.",
)
def compare(base: Path, head: Path, alpha: float, out_dir: Path) -> None:
    """Compare two results folders task by task: is HEAD's drop in passes a regression?

    Exit codes: 0 no significant regression, 1 at least one, 2 unusable input.
    """
    from mm_batch.commands.compare import compare_folders

    sys.exit(compare_folders(base, head, out_dir, alpha))


@cli.command()
def models() -> None:
    """List the local models: installed or not, size, where they are cached."""
    from mm_batch.commands import models as command

    sys.exit(command.models())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: each known error becomes a clear message and an exit code, no traceback.

    Anything else is a bug of mm-batch: its traceback is shown and the exit code is 4, never 1,
    which CI reads as "a task failed". Called without `argv` (the `mm-batch` program, `python -m
    mm_batch`), it owns the process and ends it itself: see `leave`.
    """
    code = _command(argv)
    if argv is None:
        leave(code)
    return code


def leave(code: int) -> NoReturn:
    """End the process at once with `code`, skipping the interpreter's teardown.

    With litellm loaded, the teardown takes most of a second (its modules freed one by one, its
    exit handlers flushing loggers and async clients mm-batch does not use) and changes nothing
    mm-batch wrote: when a command returns, its reports are written and closed, its effects shut
    down. What is left is done here: the watchdog's goodbye (so that it exits without cleaning
    up after a death) and the flush of stdout and stderr.
    """
    from mm_batch.effects.signals import CANCELLING
    from mm_batch.effects.watchdog import current_watchdog

    for sig in CANCELLING:  # nothing is left to cancel: the code stands
        signal.signal(sig, signal.SIG_IGN)
    watchdog = current_watchdog()
    if watchdog is not None:
        watchdog.close()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more can reach it anyway
            stream.flush()
    os._exit(code)


def _command(argv: Sequence[str] | None) -> int:
    """Run the command; every way out becomes an exit code."""
    from mm_batch.config.problems import ConfigError

    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        click.echo(f"mm-batch: {len(exc.problems)} configuration error(s); nothing ran", err=True)
        return ExitCode.USAGE
    except UsageError as exc:
        click.echo(f"mm-batch: {exc}; {exc.consequence}", err=True)
        return ExitCode.USAGE
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return ExitCode.USAGE
    except click.Abort:
        click.echo("mm-batch: aborted", err=True)
        return ExitCode.INTERRUPTED
    except SystemExit as exc:
        if exc.code is None:
            return ExitCode.PASSED
        return exc.code if isinstance(exc.code, int) else ExitCode.BUG
    except Exception:
        traceback.print_exc()
        click.echo("mm-batch: internal error (a bug of mm-batch; please report it)", err=True)
        return ExitCode.BUG
    return ExitCode.PASSED
