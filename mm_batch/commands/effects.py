"""The production effects of a run: model clients (litellm's, and the local models' own,
which never imports litellm), with the response cache around them when the run has one, and
host or Docker executors."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mm_batch.config.local_catalog import local_model
from mm_batch.config.secrets import Masker, masker_of
from mm_batch.effects.cache import CachedClient, ResponseStore, cache_use, open_folder
from mm_batch.effects.docker import DockerSandboxes
from mm_batch.effects.host import HostExecutor
from mm_batch.effects.litellm import LiteLLMClient, load_litellm, start_litellm_import
from mm_batch.effects.local_models import LocalServers
from mm_batch.effects.mcp import McpHttpClient
from mm_batch.effects.model_calls import TurnClient
from mm_batch.effects.providers import check_providers
from mm_batch.effects.watchdog import start_watchdog
from mm_batch.plan import Plan, RunSpec
from mm_batch.run.batch import Effects
from mm_batch.run.ports import Executor, ModelClient


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
    store = None if cache_folder is None else ResponseStore(cache_folder, masker)
    # Before any command or container exists: nothing of this run may outlive a killed mm-batch.
    start_watchdog(containers=any(run.sandbox.kind == "docker" for run in plan.runs))
    clients: dict[str, ModelClient] = {}
    lock = threading.Lock()
    sandboxes = DockerSandboxes(out_dir)
    local = LocalServers(plan, masker)

    def cached(
        client: TurnClient, spec: RunSpec, model: str, options: Mapping[str, object]
    ) -> ModelClient:
        """The client, with the response cache around it when the run has one; keyed by the
        request as litellm is (or was, for a local model's server) given it."""
        use = cache_use(plan.cache, spec.repeat)
        if store is None or use is None:
            return client
        return CachedClient(client, store, use, model, options)

    def client_for(spec: RunSpec) -> ModelClient:
        if spec.model in local.servers:
            own = local.client(spec)
            # A hit waits for no turn on the CPU.
            return cached(own, spec, own.request_model, own.request_options)
        use = cache_use(plan.cache, spec.repeat)
        options = sorted(spec.model_options.items())
        key = f"{spec.model}\0{options!r}\0{spec.settings.timeout}\0{use}"
        with lock:
            if key not in clients:
                hosted = LiteLLMClient(
                    spec.model, spec.model_options, masker=masker, timeout=spec.settings.timeout
                )
                clients[key] = cached(hosted, spec, hosted.model, hosted.options)
            return clients[key]

    def executor_for(spec: RunSpec) -> Executor:
        if spec.sandbox.kind == "docker":
            return sandboxes.open(spec)  # raises SandboxError: the run ends as an error
        return HostExecutor()

    def shutdown() -> None:
        sandboxes.close_all()
        local.stop_all()
        if cache_folder is not None:
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
    return Effects(client_for, executor_for, HostExecutor(), McpHttpClient(), shutdown)
