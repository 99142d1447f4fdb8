"""The agent file's `sandbox`: where the tools run, and within which limits."""

from __future__ import annotations

import re

import yaml

from mm_batch.config.fields import (
    Fields,
    HasReader,
    Key,
    choice,
    or_default,
    read_fields,
    scalar,
)
from mm_batch.config.model import NETWORK_MODES, SANDBOX_KINDS, WORKSPACE_MODES, SandboxSpec
from mm_batch.config.problems import excerpt
from mm_batch.config.yamlnodes import At, Reader

SIZE_RE = re.compile(r"([0-9]{1,30})([bkmg]?)")
_INTEGER_RE = re.compile(r"[0-9]{1,30}")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
MAX_SIZE = 1024 * 1024**3  # 1024g: beyond it a size is a typo, not a machine
MIN_MEMORY = 6 * 1024**2  # Docker refuses a smaller memory limit
MAX_ID = 2**31 - 1  # uids and gids: 1 to 2147483647
_DEFAULT = SandboxSpec()


def size_bytes(reader: Reader, at: At, *, minimum: int = 1) -> str | None:
    """A size such as 512m or 1g, normalised to lower case; zero and absurd sizes refused."""
    node = at.node
    plain_number = isinstance(node, yaml.ScalarNode) and node.style is None
    if plain_number and _INTEGER_RE.fullmatch(str(node.value)):
        text: str | None = str(node.value)  # bytes, as Docker reads a bare number
    else:
        text = reader.string(at, non_empty=True)
    if text is None:
        return None
    match = SIZE_RE.fullmatch(text.lower())
    if match is None:
        reader.problem(at, f"expected a size such as 512m or 1g, got '{excerpt(text)}'")
        return None
    size = int(match[1]) * _SIZE_UNITS[match[2]]
    if size < minimum:
        smallest = f"{minimum // 1024**2}m" if minimum >= 1024**2 else "1 byte"
        reader.problem(at, f"must be at least {smallest}, got '{text}'")
        return None
    if size > MAX_SIZE:
        reader.problem(at, f"must be at most 1024g, got '{text}'")
        return None
    return text.lower()


def _user(reader: Reader, at: At) -> str | None:
    """UID or UID:GID, each 1 to 2147483647 however written ("00" is 0), as "UID:GID"."""
    text = reader.string(at, non_empty=True)
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,30}(:[0-9]{1,30})?", text):
        reader.problem(at, f"expected UID or UID:GID in digits, got '{excerpt(text)}'")
        return None
    uid_text, _, gid_text = text.partition(":")
    uid = int(uid_text)
    gid = int(gid_text) if gid_text else uid
    if uid == 0:
        reader.problem(at, "commands never run as root (uid 0) in the sandbox")
        return None
    if gid == 0:
        reader.problem(at, "commands never run in the root group (gid 0) in the sandbox")
        return None
    if uid > MAX_ID or gid > MAX_ID:
        reader.problem(at, f"UID and GID are 1 to {MAX_ID}, got '{text}'")
        return None
    return f"{uid}:{gid}"


PIDS = scalar("pids", lambda r, at: r.integer(at, minimum=1, maximum=4_194_304))
MEMORY = scalar("memory", lambda r, at: size_bytes(r, at, minimum=MIN_MEMORY))
CPUS = scalar("cpus", lambda r, at: r.number(at, positive=True, maximum=1024))
WORKSPACE_SIZE = scalar("workspace", size_bytes)
LIMITS: tuple[Key[HasReader, object], ...] = (PIDS, MEMORY, CPUS, WORKSPACE_SIZE)

KIND = choice("kind", SANDBOX_KINDS)
IMAGE = scalar("image", lambda r, at: r.string(at, non_empty=True))
NETWORK = choice("network", NETWORK_MODES)
LIMITS_KEY: Key[HasReader, Fields] = Key("limits", lambda ctx, at, _: read_fields(ctx, at, LIMITS))
USER = scalar("user", _user)
WORKSPACE = choice("workspace", WORKSPACE_MODES)
SANDBOX: tuple[Key[HasReader, object], ...] = (KIND, IMAGE, NETWORK, WORKSPACE, LIMITS_KEY, USER)


def _sandbox(ctx: HasReader, at: At, _: Fields) -> SandboxSpec | None:
    fields = read_fields(ctx, at, SANDBOX)
    if fields is None:
        return None
    limits = fields[LIMITS_KEY]
    if limits is None:  # no `limits`: every limit its default
        limits = Fields(at)
    mode = or_default(fields[WORKSPACE], _DEFAULT.workspace)
    size_at = limits.given(WORKSPACE_SIZE)
    if size_at is not None and mode != "copy":
        ctx.reader.problem(
            size_at,
            f"sizes the copied workspace, so it applies to workspace: copy alone "
            f"(this sandbox has workspace: {mode})",
        )
    return SandboxSpec(
        kind=or_default(fields[KIND], _DEFAULT.kind),
        image=or_default(fields[IMAGE], _DEFAULT.image),
        network=or_default(fields[NETWORK], _DEFAULT.network),
        pids=or_default(limits[PIDS], _DEFAULT.pids),
        memory=or_default(limits[MEMORY], _DEFAULT.memory),
        cpus=or_default(limits[CPUS], _DEFAULT.cpus),
        user=or_default(fields[USER], _DEFAULT.user),
        workspace=mode,
        workspace_size=or_default(limits[WORKSPACE_SIZE], _DEFAULT.workspace_size),
    )


SANDBOX_KEY: Key[HasReader, SandboxSpec] = Key("sandbox", _sandbox)
