"""The reports' provenance names what made them, the local model's checksum included (SPEC §8)."""

from pathlib import Path

from mm_batch.commands.run import provenance
from mm_batch.config.load import load_tasks
from mm_batch.config.local_catalog import CATALOG
from mm_batch.plan import Overrides, make_plan
from tests.helpers import write, yolo_agent

LOCAL = "local/qwen2.5-coder-0.5b"
HOSTED = "openai/gpt-4o-mini"


def _provenance(tmp_path: Path, *models: str) -> dict[str, object]:
    write(tmp_path, "agent.yaml", yolo_agent("ok", "Succeed."))
    tasks = write(
        tmp_path,
        "tasks.yaml",
        """
        tasks:
          - id: t
            agent: agent.yaml
            prompt: Succeed.
            expect: {calls: [{tool: ok}]}
        """,
    )
    plan = make_plan(load_tasks(tasks, environ={}), Overrides(models=models))
    return dict(provenance(plan))


def test_a_local_model_is_named_with_the_checksum_of_its_gguf(tmp_path: Path) -> None:
    facts = _provenance(tmp_path, LOCAL, HOSTED)
    assert facts[f"sha256:{LOCAL}"] == CATALOG["qwen2.5-coder-0.5b"].sha256
    files = sorted(Path(k.removeprefix("sha256:")).name for k in facts if k.startswith("sha256:"))
    assert files == ["agent.yaml", "qwen2.5-coder-0.5b", "tasks.yaml"]


def test_a_hosted_model_has_no_checksum(tmp_path: Path) -> None:
    facts = _provenance(tmp_path, HOSTED)
    assert [k for k in facts if k.startswith("sha256:local/")] == []
    assert facts["models"] == HOSTED
