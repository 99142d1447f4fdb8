"""The local models of a plan: one llama-server each (`effects.llama`), started before the runs
and stopped after, taking turns on the CPU, each asked by mm-batch's own client
(`effects.llama_client`): no litellm."""

from __future__ import annotations

import dataclasses
import time

import click

from mm_batch.config.local_catalog import local_model
from mm_batch.config.model import OWN_MODEL_OPTIONS
from mm_batch.config.secrets import Masker
from mm_batch.effects.gguf import ensure_gguf
from mm_batch.effects.llama import MAX_TOKENS, CpuTurns, LlamaServer, ServerError, SlotLease
from mm_batch.effects.llama_client import LlamaClient, grammar_of
from mm_batch.effects.model_calls import DEADLINE_REASON, Messages, ToolSchemas
from mm_batch.plan import Plan, RunSpec
from mm_batch.run.ports import ModelDeadlineError, ModelError, ModelReply


def local_slots(plan: Plan) -> dict[str, int]:
    """Slots per local model: as many as its runs can be in flight at once."""
    counts: dict[str, int] = {}
    for run in plan.runs:
        if local_model(run.model) is not None:
            counts[run.model] = counts.get(run.model, 0) + 1
    limits = plan.parallel_limits
    return {m: max(1, min(n, plan.jobs, limits.get(m, n))) for m, n in counts.items()}


class LocalClient:
    """A run's client of a local server, asked in its server's turn on the CPU, in the slot the
    run holds (`lease`, for as long as this client lives): when the server died, say so
    instead of retrying.

    `request_model` and `request_options` are the turn's request as litellm was given it when
    it asked the server (`hosted_vllm/<name>`): what a response cache keys it by."""

    def __init__(
        self,
        client: LlamaClient,
        server: LlamaServer,
        turns: CpuTurns,
        options: dict[str, object],
        lease: SlotLease,
    ) -> None:
        self._client = client
        self._server = server
        self._turns = turns
        self._lease = lease
        self.request_model = f"hosted_vllm/{server.model.name}"
        self.request_options = {k: v for k, v in options.items() if k not in OWN_MODEL_OPTIONS}

    def complete(self, messages: Messages, tools: ToolSchemas, timeout: float) -> ModelReply:
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
            if not self._turns.warm(name):
                self._warm_up(messages, tools, deadline)
            waited = time.monotonic() - asked  # for the turn, and for its prompt computed first
            reply = self._client.complete(messages, tools, deadline - time.monotonic())
        except ModelError as exc:
            died = self._server.died()
            if died is None:
                raise
            raise ModelError(died) from exc
        finally:
            self._turns.release(name)
        return dataclasses.replace(reply, latency_s=reply.latency_s + waited)

    def _warm_up(self, messages: Messages, tools: ToolSchemas, deadline: float) -> None:
        """The server's first request: its prompt computed alone (the agent's system prompt and
        tools, which the other runs share), copied into every slot, and then the requests
        waiting for it go on beside it."""
        try:
            left = min(self._client.timeout, deadline - time.monotonic())
            slot = self._lease.slot
            if left > 0 and self._client.prefill(messages, tools, left) and slot is not None:
                self._server.share(slot)
        finally:
            self._turns.warmed(self._server.model.name)


class LocalServers:
    """One llama-server per local model of the plan, started before the runs, stopped after;
    they take turns on the CPU. A model file or a server that is missing stops the
    command here, before anything ran."""

    def __init__(self, plan: Plan, masker: Masker) -> None:
        self.masker = masker
        self.servers: dict[str, LlamaServer] = {}
        self.failures: dict[str, str] = {}
        self.turns = CpuTurns()
        for name, slots in local_slots(plan).items():
            model = local_model(name)
            assert model is not None  # the plan refused unknown local models
            build = LlamaServer.check_installed(model)  # a missing extra stops here
            gguf = ensure_gguf(model)  # so does a missing or corrupt model: nothing ran
            self.servers[name] = LlamaServer(model, slots, build, gguf)

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

    def client(self, spec: RunSpec) -> LocalClient:
        """The run's client of its model's server; a `ModelError` when that server failed."""
        if spec.model in self.failures:
            raise ModelError(self.failures[spec.model])
        server = self.servers[spec.model]
        options: dict[str, object] = {
            "max_tokens": MAX_TOKENS,
            **spec.model_options,
            "api_base": server.url,
        }
        agent = spec.task.agent
        lease = server.leases.lease()
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
                shell="bash" in agent.builtins,
            ),
            slot=lease.slot,
        )
        return LocalClient(client, server, self.turns, options, lease)

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()
