"""`mm-batch compare BASE HEAD`: is HEAD's drop in passes a regression, or noise?"""

from __future__ import annotations

import math
from pathlib import Path

import click

from mm_batch.errors import ExitCode
from mm_batch.report.compare import compare, compare_json, compare_markdown, compare_table
from mm_batch.report.files import ResultsFolder, unwritable
from mm_batch.report.readback import ResultsError, read_summary, refusing

DEFAULT_OUT = Path("mm-batch-compare")
COMPARE_MD = "compare.md"
COMPARE_JSON = "compare.json"


def compare_folders(base: Path, head: Path, out_dir: Path, alpha: float) -> int:
    """Exit 1 when any task and model dropped significantly, else 0; unusable input is 2."""
    with refusing("nothing compared"):
        if not (math.isfinite(alpha) and 0 < alpha < 1):
            raise ResultsError(f"--alpha {alpha}: must lie between 0 and 1")
        comparison = compare(read_summary(base), read_summary(head), alpha)
        problem = unwritable(out_dir, (COMPARE_MD, COMPARE_JSON))
        if problem is not None:
            raise ResultsError(problem)
    folder = ResultsFolder(out_dir)
    try:
        folder.write(COMPARE_MD, compare_markdown(comparison))
        folder.write(COMPARE_JSON, compare_json(comparison))
    finally:
        folder.close()
    click.echo(compare_table(comparison), err=True)
    click.echo(f"mm-batch: comparison in {out_dir}", err=True)
    return ExitCode.FAILED if comparison.regressions else ExitCode.PASSED
