"""The production effects of a run: model clients (litellm's, and the local models' own,
which never imports litellm), and host or Docker executors."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from mm_batch.config.local_catalog import local_model
from mm_batch.config.secrets import Masker, masker_of
from mm_batch.effects.cache import FolderCache, cache_use, install, open_folder, uninstall
from mm_batch.effects.docker import DockerSandboxes
from mm_batch.effects.gguf import ensure_gguf
from mm_batch.effects.host import HostExecutor
from mm_batch.effects.litellm import LiteLLMClient, load_litellm, start_litellm_import
from mm_batch.effects.llama import MAX_TOKENS, CpuTurns, LlamaServer, ServerError
from mm_batch.effects.llama_client import CachedClient, LlamaClient, check_entry, grammar_of
from mm_batch.effects.mcp import McpHttpClient
from mm_batch.effects.model_calls import DEADLINE_REASON
from mm_batch.effects.providers import check_providers
from mm_batch.effects.watchdog import start_watchdog
from mm_batch.plan import Plan, RunSpec
from mm_batch.report.files import ResultsFolder
from mm_batch.run.batch import Effects
from mm_batch.run.ports import (
    Executor,
    ModelClient,
    ModelDeadlineError,
    ModelError,
    ModelReply,
)


class _LocalServers:
    """One llama-server per local model of the plan, started before the runs, stopped after;
    they take turns on the CPU. Each is asked by mm-batch's own client (`LlamaClient`), with
    the response cache around it when the run has one (`CachedClient`): no litellm."""

    def __init__(self, plan: Plan, masker: Masker, cache_folder: ResultsFolder | None) -> None:
        self.cache = plan.cache
        self.masker = masker
        # The folder litellm's cache uses too, when other models are in the plan: one format.
        self.store = (
            None if cache_folder is None else FolderCache(cache_folder, check_entry, masker)
        )
        self.servers: dict[str, LlamaServer] = {}
        self.failures: dict[str, str] = {}
        self.turns = CpuTurns()
        for name, slots in _local_slots(plan).items():
            model = local_model(name)
            assert model is not None  # the plan refused unknown local models
            binary = LlamaServer.check_installed(model)  # a missing extra stops here
            gguf = ensure_gguf(model)  # so does a missing or corrupt model: nothing ran
            self.servers[name] = LlamaServer(model, slots, binary, gguf)

    def start_all(self) -> None:
        """Launch every server, then wait for each: they load their models side by side."""
        started = time.monotonic()
        for name, server in self.servers.items():
            click.echo(
                f"mm-batch: starting llama-server for {name} ({server.slots} slot(s))", err=True
            )
            server.launch()
        for name, server in self.servers.items():
            try:
                server.wait_ready()
            except ServerError as exc:
                self.failures[name] = str(exc)
                click.echo(f"mm-batch: {exc}", err=True)
                continue
            click.echo(f"mm-batch: {name} ready in {time.monotonic() - started:.1f} s", err=True)

    def client(self, spec: RunSpec) -> ModelClient:
        if spec.model in self.failures:
            raise ModelError(self.failures[spec.model])
        server = self.servers[spec.model]
        options = {"max_tokens": MAX_TOKENS, **spec.model_options, "api_base": server.url}
        agent = spec.task.agent
        client = LlamaClient(
            server.url,
            server.model.name,
            options,
            masker=self.masker,
            timeout=spec.settings.timeout,
            grammar=grammar_of(
                options,
                agent.tools,
                rescue=spec.settings.recover_text_tool_calls,
                # A skill's name written as a call is taken too (`Toolbox.text_call_names`).
                also=[s.name for s in agent.skills] if "read_skill" in agent.builtins else [],
            ),
        )
        local = _LocalClient(client, server, self.turns)
        use = cache_use(self.cache, spec.repeat)
        if self.store is None or use is None:
            return local
        # Keyed as when litellm asked the server (`hosted_vllm/`): a folder written then is
        # read now. A hit waits for no turn on the CPU.
        return CachedClient(local, self.store, use, f"hosted_vllm/{server.model.name}", options)

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()


class _LocalClient:
    """A client of a local server, asked in its server's turn on the CPU: when the server
    died, say so instead of retrying."""

    def __init__(self, client: ModelClient, server: LlamaServer, turns: CpuTurns) -> None:
        self._client = client
        self._server = server
        self._turns = turns

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
    ) -> ModelReply:
        """The wait for the turn counts against `timeout` (the task's deadline), and into the
        reply's latency: it is time the run waited for the model."""
        died = self._server.died()
        if died is not None:
            raise ModelError(died)
        asked = time.monotonic()
        deadline = asked + timeout
        name = self._server.model.name
        if not self._turns.acquire(name, deadline):
            raise ModelDeadlineError(DEADLINE_REASON)
        try:
            waited = time.monotonic() - asked
            reply = self._client.complete(messages, tools, deadline - time.monotonic())
        except ModelError as exc:
            died = self._server.died()
            if died is None:
                raise
            raise ModelError(died) from exc
        finally:
            self._turns.release(name)
        return dataclasses.replace(reply, latency_s=reply.latency_s + waited)


def _local_slots(plan: Plan) -> dict[str, int]:
    """Slots per local model: as many as its runs can be in flight at once."""
    counts: dict[str, int] = {}
    for run in plan.runs:
        if local_model(run.model) is not None:
            counts[run.model] = counts.get(run.model, 0) + 1
    limits = plan.parallel_limits
    return {m: max(1, min(n, plan.jobs, limits.get(m, n))) for m, n in counts.items()}


def needs_litellm(plan: Plan) -> bool:
    """Whether a run of the plan asks a model through litellm: any but a `local/` one."""
    return any(local_model(run.model) is None for run in plan.runs)


def default_effects(plan: Plan, out_dir: Path, masker: Masker | None = None) -> Effects:
    """Model clients (litellm's, one per model and options; local models through their own
    server and client, and litellm imported only when another model needs it); the host
    executor or a Docker sandbox (whose copied workspace leaves `out_dir` out); the response
    cache, when the plan has one (a folder it cannot use is a `UsageError` here)."""
    # A provider litellm cannot use (unknown, its SDK missing) stops here: nothing has started.
    check_providers(plan)
    if masker is None:  # what `run` masks: its agents' secrets, and every run's options'
        masker = masker_of(plan.tasks_file.agents, (r.model_options for r in plan.runs))
    litellm_used = needs_litellm(plan)
    if litellm_used:  # its seconds of import overlap all that follows
        start_litellm_import()
    # A cache folder is checked first: before any server starts.
    cache_folder = open_folder(plan.cache) if plan.cache is not None else None
    # Before any command or container exists: nothing of this run may outlive a killed mm-batch.
    start_watchdog(containers=any(run.sandbox.kind == "docker" for run in plan.runs))
    clients: dict[str, ModelClient] = {}
    lock = threading.Lock()
    sandboxes = DockerSandboxes(out_dir)
    local = _LocalServers(plan, masker, cache_folder)

    def client_for(spec: RunSpec) -> ModelClient:
        if spec.model in local.servers:
            return local.client(spec)
        use = cache_use(plan.cache, spec.repeat)
        options = sorted(spec.model_options.items())
        key = f"{spec.model}\0{options!r}\0{spec.settings.timeout}\0{use}"
        with lock:
            if key not in clients:
                clients[key] = LiteLLMClient(
                    spec.model,
                    spec.model_options,
                    masker=masker,
                    timeout=spec.settings.timeout,
                    cache=use,
                )
            return clients[key]

    def executor_for(spec: RunSpec) -> Executor:
        if spec.sandbox.kind == "docker":
            return sandboxes.open(spec)  # raises SandboxError: the run ends as an error
        return HostExecutor()

    def shutdown() -> None:
        sandboxes.close_all()
        local.stop_all()
        if cache_folder is not None and litellm_used:
            uninstall(load_litellm(), cache_folder)
        elif cache_folder is not None:
            cache_folder.close()

    # Import litellm (seconds of CPU), where a model needs it, and connect to the Docker engine
    # while the local servers load their models (seconds of waiting), all before the first run,
    # so that no run's time includes them.
    with ThreadPoolExecutor(2, thread_name_prefix="mm-batch-start") as pool:
        imported = pool.submit(load_litellm) if litellm_used else None
        if any(run.sandbox.kind == "docker" for run in plan.runs):
            pool.submit(sandboxes.prepare)
        local.start_all()
        if imported is not None:
            imported.result()
    if cache_folder is not None and litellm_used:
        install(load_litellm(), cache_folder, masker)
    return Effects(client_for, executor_for, HostExecutor(), McpHttpClient(), shutdown)
