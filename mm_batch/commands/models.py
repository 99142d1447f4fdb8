"""`mm-batch models`: the local models, whether installed, their size and where they are cached."""

from __future__ import annotations

import click

from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects.gguf import LOCAL_EXTRA_HINT, gguf_path, server_build, status
from mm_batch.errors import ExitCode


def models() -> int:
    rows = [("model", "installed", "size", "cache")]
    for model in CATALOG.values():
        state = status(model)
        cache = str(state.cached) if state.cached else f"(not assembled yet: {gguf_path(model)})"
        rows.append(
            (model.model, "yes" if state.installed else "no", f"{model.size / 1e6:.0f} MB", cache)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        click.echo(
            "  ".join(
                [*(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)), row[3]]
            ).rstrip()
        )
    server = server_build()
    click.echo(
        f"llama-server: {server.description() if server else 'not installed: ' + LOCAL_EXTRA_HINT}"
    )
    return ExitCode.PASSED
