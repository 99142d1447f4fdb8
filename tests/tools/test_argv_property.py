"""Property: any string without NUL given for a parameter reaches the program as one argv entry."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_batch.config.model import ParamSpec, ToolSpec
from mm_batch.effects.host import HostExecutor
from mm_batch.tools.coercion import MAX_VALUE_BYTES
from mm_batch.tools.declared import ValidCall, validate_call

# Anything a JSON string can carry into argv: no NUL (argv cannot hold one), no lone surrogate.
VALUES = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    max_size=200,
) | st.sampled_from(
    [
        "",
        " ",
        "1.4.2; rm -rf ~",
        "$(id)",
        "`id`",
        "a b\tc\nd",
        "*",
        "~",
        "'\"",
        "--channel=stable",
        "{{value}}",
        "\\",
        "é漢🙂",
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=VALUES)
def test_value_reaches_the_program_as_exactly_one_argv_entry(tmp_path: Path, value: str) -> None:
    # printf writes each argument it received followed by NUL: an unambiguous view of argv.
    tool = ToolSpec(
        name="echo_value",
        description="",
        params=(ParamSpec("value", "string", "", required=True, allow_dash=True),),
        command=("/bin/sh", "-c", 'printf "%s\\0" "$@"', "sh", "before", "{{value}}", "after"),
        workdir=tmp_path,
    )
    call = validate_call(tool, json.dumps({"value": value}))
    assert isinstance(call, ValidCall)
    assert len(value.encode()) <= MAX_VALUE_BYTES
    result = HostExecutor().execute(call.argv, tool.workdir, {}, 30)
    assert result.exit_code == 0, result.stderr.data
    assert result.stdout.data.split(b"\0") == [b"before", value.encode(), b"after", b""]
