"""`mm-batch merge DIR... --out DIR`: shards' results into one, as if one machine ran them all."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from mm_batch.errors import ExitCode
from mm_batch.report.files import ResultsFolder, unwritable
from mm_batch.report.merge import merge_folders
from mm_batch.report.readback import MergeError, refusing
from mm_batch.report.summary import terminal_table
from mm_batch.report.terminal import short_summary


def merge(directories: Sequence[Path], out_dir: Path) -> int:
    with refusing("nothing merged"):
        merged = merge_folders(directories)
        problem = unwritable(out_dir)
        if problem is not None:
            raise MergeError(problem)
        folder = ResultsFolder(out_dir)
        try:
            folder.clear()
            for name, text in merged.reports:
                folder.write(name, text)
        finally:
            folder.close()
    click.echo(terminal_table(merged.results), err=True)
    for line in short_summary(merged.results, merged.min_pass_rate):
        click.echo(line, err=True)
    click.echo(
        f"mm-batch: {len(merged.results)} run(s) of {len(directories)} folder(s) merged into "
        f"{out_dir}; as one run it would exit {merged.code}",
        err=True,
    )
    return ExitCode.PASSED
