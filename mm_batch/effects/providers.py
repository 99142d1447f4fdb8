"""Whether litellm can use a model's provider at all, found without importing litellm.

`run`, `plan` and `validate` ask this before anything runs (SPEC 6): a provider litellm does
not know, or one whose SDK is not installed, is a usage error (exit 2), not a network failure
retried three times a run. Importing litellm takes seconds, and a provider's SDK more: this
reads litellm's own files (its provider enum, its JSON-configured providers, its model map) and
asks `importlib.util.find_spec` for the SDK module, importing neither. It refuses only what
litellm's `get_llm_provider` refuses too (a test holds the two to that); anything it cannot
decide is left to litellm at run time.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mm_batch.config.local_catalog import local_model
from mm_batch.errors import UsageError
from mm_batch.plan import Plan


@dataclass(frozen=True)
class Sdk:
    """A module litellm imports for a provider, and the package a user installs to get it."""

    module: str
    package: str


# The providers whose litellm code needs a package mm-batch does not install (litellm 1.110):
# Bedrock and SageMaker sign requests with boto3 (`llms/bedrock/base_aws_llm.py`); Vertex AI
# gets its credentials from google-auth (`llms/vertex_ai/vertex_llm_base.py`), which litellm
# tells users to get with google-cloud-aiplatform. Every other provider speaks HTTP through
# litellm's own client.
SDKS: Mapping[str, Sdk] = {
    "bedrock": Sdk("boto3", "boto3"),
    "sagemaker": Sdk("boto3", "boto3"),
    "sagemaker_chat": Sdk("boto3", "boto3"),
    "vertex_ai": Sdk("google.auth", "google-cloud-aiplatform"),
    "vertex_ai_beta": Sdk("google.auth", "google-cloud-aiplatform"),
}

_ENUM = re.compile(r"^class LlmProviders\(str, Enum\):\n((?:[ \t]+.*\n|\n)+)", re.MULTILINE)
_MEMBER = re.compile(r"""^[ \t]+[A-Z0-9_]+\s*=\s*["']([^"']+)["']""", re.MULTILINE)


@functools.cache
def _litellm_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return Path(origin).parent if origin else None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@functools.cache
def known_providers() -> frozenset[str] | None:
    """The provider prefixes litellm knows (its `LlmProviders` enum, which is its
    `provider_list`, and its JSON-configured providers); None where its files cannot be read
    (a litellm that moved them): then no provider is refused as unknown."""
    folder = _litellm_dir()
    if folder is None:
        return None
    try:
        source = (folder / "types" / "utils.py").read_text(encoding="utf-8")
    except OSError:
        return None
    enum = _ENUM.search(source)
    if enum is None:
        return None
    names = set(_MEMBER.findall(enum.group(1)))
    if not names:
        return None
    configured = _read_json(folder / "llms" / "openai_like" / "providers.json")
    if isinstance(configured, dict):
        names.update(str(k) for k in configured)
    return frozenset(names)


@functools.cache
def _mapped_models() -> frozenset[str]:
    """The model strings of litellm's bundled model map: litellm finds their provider there."""
    folder = _litellm_dir()
    models = _read_json(folder / "model_prices_and_context_window_backup.json") if folder else None
    return frozenset(models) if isinstance(models, dict) else frozenset()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package (`google` of `google.auth`)
        return False


def provider_of(model: str, options: Mapping[str, object]) -> str | None:
    """The provider litellm would use, where its prefix or `custom_llm_provider` says it."""
    given = options.get("custom_llm_provider")
    if isinstance(given, str) and given:
        return given
    prefix, slash, _ = model.partition("/")
    return prefix if slash else None


def provider_problem(model: str, options: Mapping[str, object]) -> str | None:
    """Why litellm cannot use `model` at all, or None (also where this cannot tell)."""
    if local_model(model) is not None:
        return None  # asked by mm-batch's own client
    provider = provider_of(model, options)
    if provider is None:
        return None  # a bare name: litellm looks it up in its lists at run time
    sdk = SDKS.get(provider)
    if sdk is not None and not _installed(sdk.module):
        return (
            f"model '{model}': litellm needs the package {sdk.package} for {provider}/ models, "
            f"and it is not installed on this machine (pip install {sdk.package})"
        )
    known = known_providers()
    unknown = (
        known is not None
        and provider not in known
        and "custom_llm_provider" not in options
        and "api_base" not in options  # litellm may tell the provider from the address
        and model not in _mapped_models()
    )
    if unknown:
        return (
            f"model '{model}': litellm {_litellm_version()} knows no provider '{provider}' "
            "(write the model as <provider>/<name>, e.g. openai/gpt-4o-mini, "
            "anthropic/claude-sonnet-4-5, hosted_vllm/<name> with api_base)"
        )
    return None


def _litellm_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def provider_problems(models: Iterable[tuple[str, Mapping[str, object]]]) -> list[str]:
    """Each distinct problem of the plan's models, in plan order."""
    seen: dict[str, None] = {}
    for model, options in models:
        problem = provider_problem(model, options)
        if problem is not None:
            seen.setdefault(problem)
    return list(seen)


class ProviderError(UsageError):
    """A model of the plan names a provider litellm cannot use on this machine."""


def check_providers(plan: Plan) -> None:
    """Raise `ProviderError` naming every model of the plan litellm cannot use, before any run
    (in `run`, `plan` and `validate` alike)."""
    problems = provider_problems((r.model, r.model_options) for r in plan.runs)
    if problems:
        raise ProviderError("; ".join(problems))
