"""Stage 3: the plan — tasks x models x repeats, with the CLI's overrides applied."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from mm_batch.config.local_catalog import CATALOG, LOCAL_PREFIX, local_model
from mm_batch.config.model import (
    DEFAULT_MODEL,
    MAX_PARALLEL,
    OWN_MODEL_OPTIONS,
    SET_BY_MM_BATCH,
    WEEK_S,
    CacheMode,
    CacheSettings,
    SandboxKind,
    SandboxSpec,
    TasksFile,
    TaskSpec,
)
from mm_batch.config.tasks import MAX_JOBS, MAX_REPEAT
from mm_batch.errors import UsageError
from mm_batch.jsontypes import JsonObject, JsonValue

# Local models run deterministic unless the agent says otherwise, so that a CI run repeats.
LOCAL_MODEL_DEFAULTS: JsonObject = {"temperature": 0, "seed": 42}


class PlanError(UsageError):
    """A usage error found while planning (a filter that matches nothing, a bad shard)."""


@dataclass(frozen=True)
class Overrides:
    """What the command line says; it wins over the files (CLI > task > tasks file > agent)."""

    models: tuple[str, ...] = ()
    model_options: Mapping[str, JsonValue] = field(default_factory=dict)
    repeat: int | None = None
    jobs: int | None = None
    yolo: bool | None = None
    sandbox: SandboxKind | None = None
    image: str | None = None
    filters: tuple[str, ...] = ()  # `--filter`: task ids matching any of these globs
    excludes: tuple[str, ...] = ()  # `--exclude`: then leave out those matching any of these
    exitfirst: bool = False  # `--exitfirst`: start no run after the first that did not pass
    shard: tuple[int, int] | None = None
    max_cost: float | None = None  # USD; `run --max-cost`
    cache: Path | None = None  # `run --cache DIR`: the folder, as given
    cache_mode: CacheMode | None = None  # `run --cache-mode`


DEFAULT_MODEL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ModelSettings:
    """mm-batch's own model options, typed once at plan time and never passed to litellm."""

    max_parallel: int | None = None
    recover_text_tool_calls: bool = False
    timeout: float = DEFAULT_MODEL_TIMEOUT_S  # seconds for one model call


@dataclass(frozen=True)
class RunSpec:
    """One task run: a task, on a model, for the n-th time."""

    task: TaskSpec
    model: str
    repeat: int
    model_options: Mapping[str, JsonValue]  # what litellm gets: mm-batch's own keys taken out
    yolo: bool
    sandbox: SandboxSpec
    settings: ModelSettings = ModelSettings()
    index: int = 0  # position in the whole plan, every shard together: the reports' order
    rerun: bool = False  # run again by `--rerun-failed`, since it did not pass before

    @property
    def run_id(self) -> str:
        return f"{self.task.id}[{self.model}]#{self.repeat}"


@dataclass(frozen=True)
class Plan:
    tasks_file: TasksFile
    runs: tuple[RunSpec, ...]
    jobs: int
    repeat: int
    min_pass_rate: float
    shard: tuple[int, int] | None
    whole_runs: int  # runs of the whole plan, every shard together
    max_cost: float | None = None  # USD the batch may spend before it starts no more runs
    cache: CacheSettings | None = None  # the model response cache; None: off
    exitfirst: bool = False  # start no run after the first that failed or erred

    @property
    def coverage(self) -> dict[str, str | int | None]:
        """Which part of the whole plan these runs are: what `merge` checks for completeness."""
        shard = f"{self.shard[0]}/{self.shard[1]}" if self.shard else None
        return {"shard": shard, "whole_runs": self.whole_runs}

    @property
    def suite(self) -> str:
        """The tasks file's name without extension: the first part of every JUnit classname."""
        return self.tasks_file.path.stem

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.model for r in self.runs))

    @property
    def parallel_limits(self) -> dict[str, int]:
        """Each model's `max_parallel` (the smallest given for it), for the models that set one."""
        limits: dict[str, int] = {}
        for run in self.runs:
            value = run.settings.max_parallel
            if value is not None:
                limits[run.model] = min(limits.get(run.model, value), value)
        return limits


# As a file's integers (SPEC 1): ASCII digits, at most 30 of them; `int` alone would also take
# " 2", "+2", "2_0" and other scripts' digits.
_SHARD_RE = re.compile(r"([0-9]{1,30})/([0-9]{1,30})")


def parse_shard(text: str) -> tuple[int, int]:
    found = _SHARD_RE.fullmatch(text)
    if found is None:
        raise PlanError(f"--shard takes K/N with whole numbers, got '{_shown(text)}'")
    k, n = int(found[1]), int(found[2])
    if n < 1 or not 1 <= k <= n:
        raise PlanError(f"--shard K/N needs 1 <= K <= N, got '{text}'")
    return k, n


def _shown(text: str) -> str:
    """A value from the command line as a message quotes it: at most 120 characters."""
    return text if len(text) <= 120 else text[:117] + "..."


def check_overrides(overrides: Overrides) -> None:
    """The command line's values within the bounds of the files' own (SPEC 1), before anything
    is planned: `--repeat 3000000` is refused as `repeat: 3000000` is, never run."""
    bounds = (("--repeat", overrides.repeat, MAX_REPEAT), ("--jobs", overrides.jobs, MAX_JOBS))
    for option, value, most in bounds:
        if value is not None and not 1 <= value <= most:
            raise PlanError(f"{option} takes 1 to {most}, got {value}")
    if any(not model for model in overrides.models):
        raise PlanError("--model must not be empty")
    if overrides.image is not None and not overrides.image:
        raise PlanError("--image must not be empty")
    if overrides.max_cost is not None and not (
        math.isfinite(overrides.max_cost) and overrides.max_cost > 0
    ):
        raise PlanError(f"--max-cost takes a number of USD above 0, got {overrides.max_cost}")


def _model_settings(model: str, options: Mapping[str, JsonValue]) -> ModelSettings:
    """Read mm-batch's own keys (the files were checked at load; `--model-option` is not)."""
    max_parallel = options.get("max_parallel")
    if max_parallel is not None and (
        not isinstance(max_parallel, int)
        or isinstance(max_parallel, bool)
        or not 1 <= max_parallel <= MAX_PARALLEL
    ):
        raise PlanError(
            f"model option max_parallel must be a whole number from 1 to {MAX_PARALLEL}, "
            f"got {_shown(repr(max_parallel))}"
        )
    recover = options.get("recover_text_tool_calls", model.startswith(LOCAL_PREFIX))
    if not isinstance(recover, bool):
        raise PlanError(
            "model option recover_text_tool_calls must be true or false, "
            f"got {_shown(repr(recover))}"
        )
    timeout = options.get("timeout", DEFAULT_MODEL_TIMEOUT_S)
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not math.isfinite(timeout)
        or not 0 < timeout <= WEEK_S
    ):
        raise PlanError(
            f"model option timeout must be a number of seconds > 0 and at most {WEEK_S:g}, "
            f"got {_shown(repr(timeout))}"
        )
    return ModelSettings(max_parallel, recover, float(timeout))


def classname(suite: str, model: str) -> str:
    """The JUnit classname of a model's test cases: `.` and `/` in the model become `_`."""
    return f"{suite}.{model.replace('.', '_').replace('/', '_')}"


def _check_classnames(suite: str, models: Iterable[str]) -> None:
    """Two models sharing a classname would merge their test cases in every JUnit reader."""
    first: dict[str, str] = {}
    for model in dict.fromkeys(models):
        name = classname(suite, model)
        if name in first:
            raise PlanError(
                f"the models '{first[name]}' and '{model}' would share the JUnit classname "
                f"'{name}' ('.' and '/' become '_'): run them in separate plans or rename one"
            )
        first[name] = model


def _chosen(
    tasks: tuple[TaskSpec, ...], filters: tuple[str, ...], excludes: tuple[str, ...]
) -> tuple[TaskSpec, ...]:
    """The tasks whose id matches any `--filter` (all without one), less those matching any
    `--exclude`. A glob that matches no task id at all is a typo, not a choice: a usage error."""
    for option, globs in (("--filter", filters), ("--exclude", excludes)):
        for glob in globs:
            if not any(fnmatch.fnmatchcase(t.id, glob) for t in tasks):
                raise PlanError(f"{option} '{_shown(glob)}' matches no task id")
    chosen = tuple(
        t
        for t in tasks
        if (not filters or any(fnmatch.fnmatchcase(t.id, g) for g in filters))
        and not any(fnmatch.fnmatchcase(t.id, g) for g in excludes)
    )
    if not chosen:
        raise PlanError("--filter and --exclude leave no task to run")
    return chosen


def _cache_settings(tasks_file: TasksFile, overrides: Overrides) -> CacheSettings | None:
    """The cache's folder and mode, each from the CLI or else the tasks file (CLI > tasks file)."""
    folder = overrides.cache.absolute() if overrides.cache is not None else tasks_file.cache
    if folder is None:
        if overrides.cache_mode is not None:
            raise PlanError("--cache-mode needs a cache: --cache DIR, or cache: in the tasks file")
        return None
    return CacheSettings(folder, overrides.cache_mode or tasks_file.cache_mode or "readwrite")


def make_plan(tasks_file: TasksFile, overrides: Overrides) -> Plan:
    check_overrides(overrides)
    clashing = sorted(set(overrides.model_options) & SET_BY_MM_BATCH)
    if clashing:  # the files are checked at load; the command line here
        raise PlanError(
            f"--model-option {clashing[0]}: mm-batch sets '{clashing[0]}' itself: it is not a "
            "model option"
        )
    tasks = _chosen(tasks_file.tasks, overrides.filters, overrides.excludes)
    repeat = overrides.repeat or tasks_file.repeat
    runs: list[RunSpec] = []
    for task in tasks:
        agent = task.agent
        models = overrides.models or tasks_file.models or (agent.model or DEFAULT_MODEL,)
        sandbox = agent.sandbox
        if overrides.sandbox is not None:
            sandbox = replace(sandbox, kind=overrides.sandbox)
        if overrides.image is not None:
            sandbox = replace(sandbox, image=overrides.image)
        options = {**agent.model_options, **overrides.model_options}
        yolo = agent.yolo if overrides.yolo is None else overrides.yolo
        for model in models:
            model_options = options
            if model.startswith(LOCAL_PREFIX):
                if local_model(model) is None:
                    known = ", ".join(LOCAL_PREFIX + name for name in CATALOG)
                    raise PlanError(f"unknown local model '{model}' (known: {known})")
                model_options = {**LOCAL_MODEL_DEFAULTS, **options}
            settings = _model_settings(model, model_options)
            passed_on = {k: v for k, v in model_options.items() if k not in OWN_MODEL_OPTIONS}
            for n in range(1, repeat + 1):
                runs.append(RunSpec(task, model, n, passed_on, yolo, sandbox, settings, len(runs)))
    _check_classnames(tasks_file.path.stem, (r.model for r in runs))
    whole_runs = len(runs)
    if overrides.shard is not None:
        k, n = overrides.shard
        runs = [r for i, r in enumerate(runs) if i % n == k - 1]
    return Plan(
        tasks_file=tasks_file,
        runs=tuple(runs),
        jobs=overrides.jobs or tasks_file.jobs,
        repeat=repeat,
        min_pass_rate=tasks_file.min_pass_rate,
        shard=overrides.shard,
        whole_runs=whole_runs,
        max_cost=overrides.max_cost,
        cache=_cache_settings(tasks_file, overrides),
        exitfirst=overrides.exitfirst,
    )
