"""Secrets by transformations: no cut, fold, quote or escape shows 4 characters of a secret.

SPEC 7: a secret is masked before any change to a text. The secrets here are generated: any
characters (multibyte, whitespace, quotes, backslashes, `<`, `&`, `*`), 6 to 80 of them; the
text around them holds none of their characters, so that any 4 consecutive characters of a
secret found in what mm-batch writes or sends can only be a leak. The first properties hold the
masker to it at every cut position; the last drives whole runs through the real paths (litellm
against the fake provider, real commands, every report) with the secret known only from
`--model-option api_key=...`.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from mm_batch.config.secrets import (
    MASK,
    Masked,
    Masker,
    folded,
    head,
    head_bytes,
    masker_of,
    option_secrets,
    tail,
)
from mm_batch.effects.model_errors import short_reason
from mm_batch.report.summary import one_line

# Characters that make cuts, folds and escapes interesting, and a few whole alphabets.
_AWKWARD = " \t\n\r\"'\\<>&*%#=:;,.-_/é€𝄞😀\u00a0\u2028\u3000"
secret_text = st.one_of(
    st.text(min_size=6, max_size=80),
    st.text(alphabet=_AWKWARD + "abcXYZ019", min_size=6, max_size=80),
    st.text(alphabet="é€𝄞😀漢字", min_size=6, max_size=20),
)


# What a provider key looks like: printable ASCII, a valid HTTP header value (given as
# `--model-option api_key=...`, which only then reaches the fake provider).
api_keys = (
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=6, max_size=80)
    .map(str.strip)
    .filter(lambda key: len(key) >= 6)
)


PRINTABLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)


def grams(secret: str, n: int = 4) -> set[str]:
    return {secret[i : i + n] for i in range(len(secret) - n + 1)}


def leaked(secret: str, text: str) -> list[str]:
    """The 4-character pieces of `secret` that `text` holds."""
    return sorted(g for g in grams(secret) if g in text)


@st.composite
def text_around(draw: st.DrawFn, secret: str) -> str:
    """Text holding the secret whole a few times, between fillers made of none of its
    characters (so that nothing else in it is a piece of the secret)."""
    foreign = st.characters(exclude_categories=["Cs"], exclude_characters=secret + MASK[0])
    filler = st.text(alphabet=foreign, max_size=40)
    pieces = [draw(filler)]
    for _ in range(draw(st.integers(1, 3))):
        pieces += [secret, draw(filler)]
    return "".join(pieces)


# --- the masker, at every cut ---------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.data(), secret_text)
def test_masked_text_holds_no_piece_of_a_secret(data: st.DataObject, secret: str) -> None:
    text = data.draw(text_around(secret))
    masked = Masker([secret]).text(text)
    assert leaked(secret, masked) == []
    assert MASK in masked


@settings(max_examples=300, deadline=None)
@given(st.data(), secret_text)
def test_a_capture_cut_at_any_byte_leaks_no_prefix(data: st.DataObject, secret: str) -> None:
    """The capture stops at any byte, inside a character of the secret too: neither the text
    decoded by the masker nor one decoded with U+FFFD before it shows 4 of its characters."""
    encoded = data.draw(text_around(secret)).encode("utf-8")
    cut = data.draw(st.integers(0, len(encoded)))
    masker = Masker([secret])
    assert leaked(secret, masker.captured(encoded[:cut], cut=True)) == []
    replaced = encoded[:cut].decode("utf-8", errors="replace")
    assert leaked(secret, masker.text(replaced, cut=True)) == []


@settings(max_examples=300, deadline=None)
@given(st.data(), secret_text)
def test_cuts_folds_and_escapes_after_masking_leak_nothing(
    data: st.DataObject, secret: str
) -> None:
    masker = Masker([secret])
    masked = masker.text(data.draw(text_around(secret)))
    n = data.draw(st.integers(0, len(masked) + 2))
    shown = [
        head(masked, n),
        tail(masked, n),
        head_bytes(masked, n)[0],
        folded(masked),
    ]
    for text in shown:
        assert leaked(secret, text) == [], text
    # Escaped, then read back as a reader would: JSON, HTML, repr.
    assert leaked(secret, json.loads(json.dumps(masked))) == []
    assert leaked(secret, html.unescape(html.escape(masked))) == []
    assert leaked(secret, json.loads(masker.json_text({masked: [masked]}))) == []


def test_a_json_quote_whose_escape_touches_a_mask_stays_json() -> None:
    """`\\u0000` beside a redaction begins as the secret `000000` begins: masking the escape
    must not leave text that is no JSON (found by the property above)."""
    masker = Masker(["000000"])
    masked = masker.text("\x00000000")
    quoted = masker.json_text({masked: [masked]})
    assert leaked("000000", json.loads(quoted)) == []


@settings(max_examples=200, deadline=None)
@given(secret_text, st.sampled_from(["json", "json-ascii", "repr", "bytes", "url", "html"]))
def test_a_secret_escaped_by_someone_else_is_masked_too(secret: str, how: str) -> None:
    """A provider's error may quote the request's JSON; an HTTP library, a header's repr."""
    from urllib.parse import quote

    written = {
        "json": json.dumps(secret, ensure_ascii=False)[1:-1],
        "json-ascii": json.dumps(secret)[1:-1],
        "repr": repr(secret)[1:-1],
        "bytes": repr(secret.encode("utf-8"))[2:-1],
        "url": quote(secret, safe=""),
        "html": html.escape(secret),
    }[how]
    masked = Masker([secret]).text(f"error: {{{written}}} refused")
    assert written not in masked and MASK in masked


# Each character of a secret as another party may write it: itself, or one escape of a family
# the masker reads, chosen per character (mixing families, escaping some characters and not
# others: no encoder's output, so no list of encoders' outputs can hold it).
def _escapes(char: str) -> list[str]:
    code = ord(char)
    ways = [
        # A character that begins an escape is escaped itself, as every encoder does: written
        # bare before an escape it would be read as part of one (`\\` then `\\u0030`).
        *(() if char in "\\%&" else (char,)),
        "".join(f"%{b:02X}" for b in char.encode("utf-8")),
        "".join(f"%{b:02x}" for b in char.encode("utf-8")),
        f"&#{code};",
        f"&#x{code:x};",
        f"\\U{code:08x}",
    ]
    if code <= 0xFFFF:
        ways.append(f"\\u{code:04x}")
        ways.append(f"\\u{code:04X}")
    else:
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        ways.append(f"\\u{high:04x}\\u{low:04x}")
    if code < 0x100:
        ways.append(f"\\x{code:02x}")
    return ways


@st.composite
def escaped(draw: st.DrawFn, secret: str) -> str:
    """The secret written with a drawn escape for each character, then perhaps escaped once
    more as a whole (quoted in JSON, or in a URL) as a text quoted inside another is."""
    written = "".join(draw(st.sampled_from(_escapes(char))) for char in secret)
    again = draw(st.sampled_from(["", "json", "url"]))
    if again == "json":
        written = json.dumps(written)[1:-1]
    elif again == "url":
        from urllib.parse import quote

        written = quote(written, safe="")
    return written


@settings(max_examples=300, deadline=None)
@given(st.data(), secret_text)
def test_a_secret_escaped_character_by_character_any_way_is_masked(
    data: st.DataObject, secret: str
) -> None:
    """JSON's, Python's, percent and HTML escapes, mixed within one secret and nested: the
    masker reads each escape as what it stands for (SPEC 7, "quoted")."""
    written = data.draw(escaped(secret))
    around = data.draw(st.text(max_size=20))
    masked = Masker([secret]).text(f"{around}{written} {around}")
    assert written not in masked and MASK in masked, (written, masked)


@settings(max_examples=300, deadline=None)
@given(st.data(), secret_text)
def test_a_secret_in_another_case_is_masked_whatever_else_the_text_holds(
    data: st.DataObject, secret: str
) -> None:
    """Case changed character by character, in a text holding characters whose lower case is
    longer (`İ`) or shorter, before or after it."""
    changed = "".join(
        data.draw(st.sampled_from([c, c.upper(), c.lower()]))
        if len(c.upper()) == 1 and len(c.lower()) == 1
        else c
        for c in secret
    )
    around = data.draw(st.text(alphabet="İßŉǰΐ abc", max_size=6))
    masked = Masker([secret]).text(f"{around}{changed}{around}")
    assert changed not in masked and MASK in masked, (changed, masked)


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    st.lists(st.text(alphabet=PRINTABLE, min_size=3, max_size=8), min_size=2, max_size=4).map(
        " ".join
    ),
)
def test_a_secret_split_by_other_white_space_is_masked_before_a_fold_joins_it(
    data: st.DataObject, secret: str
) -> None:
    """A passphrase written over lines (`correct\\nhorse   battery`): no text holds it whole
    until a report folds the white space; the masker matches each of its spaces to any run."""
    runs = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2028\u3000", min_size=1, max_size=4)
    written = "".join(data.draw(runs) if char == " " else char for char in secret)
    masker = Masker([secret])
    masked = masker.text(f"no: {written} end")
    assert secret not in folded(masked), masked
    assert secret not in one_line(masked), masked
    assert secret not in short_reason(ValueError(f"no: {written} end"), masker)


def test_overlapping_secrets_are_masked_whole() -> None:
    """Masked one after the other, the second's tail would stay: `ijkl` of `efghijkl`."""
    masker = Masker(["abcdefgh", "efghijkl"])
    assert masker.text("x abcdefghijkl y") == f"x {MASK} y"


def test_a_secret_made_by_masking_another_is_masked_too() -> None:
    masker = Masker(["abcdef", "***xyz"])
    assert masker.text("abcdefxyz") == MASK


def test_a_cut_inside_a_multibyte_character_of_a_secret_leaks_no_prefix() -> None:
    secret = "ключ-секрет-42"
    data = ("x" * 10 + secret).encode("utf-8")
    for cut in range(len(data)):
        masker = Masker([secret])
        assert leaked(secret, masker.captured(data[:cut], cut=True)) == []
        broken = data[:cut].decode("utf-8", errors="replace")
        assert leaked(secret, masker.text(broken, cut=True)) == [], cut


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=9, max_size=80
    ),
    st.sampled_from(["*" * 16, "****", "...", "\u2026", "\u2022\u2022\u2022"]),
)
def test_what_a_provider_leaves_of_a_key_it_redacted_itself_is_masked(
    data: st.DataObject, secret: str, redaction: str
) -> None:
    """`Incorrect API key provided: sk-live-ab****ijkl`: the key's two ends, each 4 characters
    or more, quoted around the provider's own redaction, are masked too."""
    assume("*" not in secret and "." not in secret and "\u2026" not in secret)
    shown_head = data.draw(st.integers(4, len(secret) - 4))
    shown_tail = data.draw(st.integers(4, len(secret) - shown_head))
    quoted = f"{secret[:shown_head]}{redaction}{secret[-shown_tail:]}"
    prose = ("Incorrect API key provided: ", ". You can find your key at the console.")
    # A secret whose piece is a word of the message itself (`00000rect`, in "Incorrect") would
    # be seen leaking where only the provider's own words are left.
    assume(all(leaked(secret, words) == [] for words in prose))
    message = quoted.join(prose)
    assert leaked(secret, Masker([secret]).text(message)) == []


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=9, max_size=80
    ),
    st.text(alphabet=PRINTABLE, max_size=12),
    st.sampled_from([str, str.upper, str.lower]),
)
def test_a_provider_quoting_a_key_in_part_its_own_way_leaks_no_piece_of_it(
    data: st.DataObject, secret: str, redaction: str, case: Any
) -> None:
    """A provider's error may show a key's two ends around any redaction of its own
    (`sk-live-ab[REDACTED]0123`, `abXXXX0123`, one `*`, nothing), in any case: no 4
    characters of the key survive in what mm-batch makes of that error."""
    shown_head = data.draw(st.integers(0, len(secret) - 1))
    shown_tail = data.draw(st.integers(0, len(secret) - shown_head))
    quoted = case(f"{secret[:shown_head]}{redaction}{secret[len(secret) - shown_tail :]}")
    assume(not leaked(case(secret), case(redaction)))  # the redaction itself shows nothing
    around = "Incorrect API key provided: {}. You can find your key at the console."
    # A piece of the key that is also a piece of the provider's own words (`PROV` of
    # "provided") is no leak of the key: such keys say nothing here.
    assume(not leaked(secret.lower(), around.lower()))
    message = around.format(quoted)
    masked = Masker([secret]).quoted_by_others(message)
    assert leaked(secret.lower(), masked.lower()) == [], masked


def test_a_providers_error_becomes_a_reason_with_no_piece_of_the_key() -> None:
    masker = Masker(["sk-live-abcdefghij0123"])
    error = RuntimeError("Incorrect API key provided: sk-live-ab[REDACTED]0123.")
    assert "0123" not in short_reason(error, masker)
    assert "sk-live-ab" not in short_reason(error, masker)


def test_a_redaction_next_to_text_of_no_secret_is_left_alone() -> None:
    masker = Masker(["sk-live-abcdefghijkl"])
    text = "rating ***** stars... and more*** of it"
    assert masker.text(text) == text


# --- which values are secrets ---------------------------------------------------------------


def test_model_options_named_as_secrets_are_secrets_at_any_depth() -> None:
    options = {
        "api_key": "sk-live-123456",
        "api_base": "http://localhost:1234",
        "max_tokens": 100000,  # a limit, not a credential
        "extra_headers": {"X-Api-Key": "hdr-secret-9", "X-Team": "ci-team-7"},
        "vertex_credentials": {"private_key_id": ["kid-0001"]},
        "aws_secret_access_key": "AKIA-SECRET-1",
        "password": "hunter22",
    }
    found = set(option_secrets(options))
    assert found == {"sk-live-123456", "hdr-secret-9", "kid-0001", "AKIA-SECRET-1", "hunter22"}


def test_a_number_given_as_a_key_is_a_secret_and_a_token_count_is_not() -> None:
    """`--model-option api_key=98765432101234` reads as an integer: still the key."""
    options = {"api_key": 98765432101234, "max_tokens": 100000, "max_completion_tokens": 4096}
    assert option_secrets(options) == ["98765432101234"]
    masker = masker_of([], [options])
    assert masker.text("dynamic_api_key=98765432101234 max_tokens=100000") == (
        f"dynamic_api_key={MASK} max_tokens=100000"
    )


def test_an_authorization_header_and_its_credential_alone_are_secrets() -> None:
    options = {"extra_headers": {"Authorization": "Bearer abcdef123456", "Cookie": "sid=xyz987"}}
    assert set(option_secrets(options)) == {"Bearer abcdef123456", "abcdef123456", "sid=xyz987"}
    assert Masker(option_secrets(options)).text("token abcdef123456 seen") == f"token {MASK} seen"


def test_a_run_masks_the_command_lines_model_options() -> None:
    masker = masker_of([], [{"api_key": "cli-key-123456"}])
    assert masker.text("refused cli-key-123456") == f"refused {MASK}"


def test_masked_is_made_in_config_secrets_only() -> None:
    """The one way to a `Masked` text is through the masker (or a cut of a `Masked`): no other
    module of mm-batch calls `Masked(...)`."""
    root = Path(__file__).resolve().parents[2] / "mm_batch"
    makers = [
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if re.search(r"\bMasked\(", path.read_text(encoding="utf-8"))
    ]
    assert makers == ["config/secrets.py"]


def test_masked_is_a_plain_string_at_run_time() -> None:
    assert Masker(["abcdef"]).text("abcdef") == MASK
    assert isinstance(Masked("x"), str)


# --- whole runs through the real paths ---------------------------------------------------------

_AGENT = """\
yolo: true
tools:
  - name: leak
    description: Print the deploy log.
    parameters:
      before: {type: integer, description: "How much log comes before the line."}
      after: {type: integer, description: "How much log comes after the line."}
    command: ["python3", "./leak.py", "{{before}}", "{{after}}"]
"""
_LEAK = """\
import pathlib, sys
here = pathlib.Path(__file__).parent
secret, fill = (here / "secret.txt").read_bytes(), (here / "fill.txt").read_bytes()
line = fill * int(sys.argv[1]) + secret + fill * int(sys.argv[2])
sys.stdout.buffer.write(line)
sys.stderr.buffer.write(line)
sys.exit(1)
"""
_TASKS = """\
agent: agent.yaml
tasks:
  - id: leaky
    prompt: Show the log.
    expect: {answer_contains: [never said]}
  - id: refused
    prompt: Be refused.
"""
_LOG_CUT = 1024 * 1024  # what the log keeps of a stream (the host's capture)
_MODEL_CUT = 16 * 1024  # what the model reads of a stream, and of its own invalid arguments
_HEADER_SAFE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
_VARYING = set("0123456789.:-+TZe ")  # times, ports and counts: they differ from run to run


def _views(text: str) -> Iterator[str]:
    """A written text as its readers see it: raw, HTML/XML unescaped, markdown and control
    escapes undone (`\\!`, `\\x1b`, the word joiner)."""
    yield text
    yield html.unescape(text)
    unescaped = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text).replace("\u2060", "")
    yield unescaped
    yield re.sub(
        r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})",
        lambda m: chr(int(m.group(1) or m.group(2), 16)),
        unescaped,
    )


def _strings(data: Any) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from _strings(value)


def _written(path: Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    yield from _views(text)
    if path.suffix in (".json", ".jsonl"):
        for line in text.split("\n") if path.suffix == ".jsonl" else [text]:
            if line.strip():
                for value in _strings(json.loads(line)):
                    yield from _views(value)
    if path.suffix == ".xml":
        for element in ET.parse(path).getroot().iter():
            for value in (element.text or "", element.tail or "", *element.attrib.values()):
                yield from _views(value)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every example: its path is the same in each run's reports."""
    directory = tmp_path_factory.mktemp("secret-runs")
    (directory / "agent.yaml").write_text(_AGENT)
    (directory / "leak.py").write_text(_LEAK)
    (directory / "tasks.yaml").write_text(_TASKS)
    return directory


def _run(
    project: Path, secret: str, cuts: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> tuple[list[str], int]:
    """Run both tasks with the secret everywhere a run meets outside text; return every text
    mm-batch wrote or sent (files, terminal, annotations, step summary, model requests)."""
    from mm_batch.cli import main
    from mm_batch.testing.fake_openai import FakeOpenAI, HttpFailure, by_prompt, text, tool_call

    fill = next(c for c in "~^|!?;" + "ghjkmnpqrvwy" if c not in secret)
    (project / "secret.txt").write_bytes(secret.encode("utf-8"))
    (project / "fill.txt").write_text(fill)
    quoted = json.dumps(secret, ensure_ascii=False)[1:-1]
    sent = '{"note": "' + fill * (_MODEL_CUT - 10 - cuts["quote"]) + quoted + '"}'
    script = by_prompt(
        {
            "Show the log.": [
                tool_call(
                    "leak", {"before": _MODEL_CUT - cuts["model"], "after": 2048 - cuts["tail"]}
                ),
                tool_call("leak", {"before": _LOG_CUT - cuts["log"], "after": 3}),
                tool_call("leak", {"before": fill * (77 - cuts["shown"]) + secret, "after": 1}),
                tool_call("leak", sent),
                text(f"All done {secret} here."),
            ],
            "Be refused.": [
                HttpFailure(400, f"bad key {fill * (230 - cuts['reason'])} {secret}  {secret} end")
            ],
        }
    )
    out = project / "out"
    shutil.rmtree(out, ignore_errors=True)
    summary = project / "step-summary.md"
    summary.write_text("")
    header_safe = _HEADER_SAFE.fullmatch(secret) is not None
    with FakeOpenAI(script) as fake:
        options = ["--model-option", f"api_base={fake.url}"]
        if header_safe:  # the only place the run learns it: the command line
            options += ["--model-option", f"api_key={secret}"]
        capsys.readouterr()
        code = main(
            [
                "run",
                str(project / "tasks.yaml"),
                "--model",
                "hosted_vllm/fake",
                *options,
                "--out",
                str(out),
                "--jobs",
                "1",
            ]
        )
        captured = capsys.readouterr()
        assert code in (1, 3), captured.err[-3000:]
        requests = [json.dumps(r, ensure_ascii=False) for r in fake.requests]
    texts = [captured.out, captured.err, *requests]
    texts += [t for p in sorted(out.iterdir()) for t in _written(p)]
    texts += list(_written(summary))
    return texts, code


_BASELINE: list[str] = []  # what a run writes of its own, found once (see `_background`)
_RUNES = "ᚠᚢᚦᚨᚱᚲᚷᚹᚺᚾ"  # in no report, whatever else it holds


def _background(project: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What a run writes when its secret is made of characters no report holds: a piece of a
    generated secret found in it is mm-batch's own text (or the fillers'), not a leak."""
    if not _BASELINE:
        cuts = dict.fromkeys(("model", "tail", "log", "shown", "quote", "reason"), 3)
        texts, _ = _run(project, _RUNES, cuts, capsys)
        _BASELINE.append("\n".join(texts))
    return _BASELINE[0]


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), secret=st.one_of(secret_text, api_keys))
@example(data=None, secret="sk-Qz9  Wq8@x7Ve6")  # two spaces: folded, it would not match
def test_no_run_writes_or_sends_a_piece_of_a_secret(
    data: st.DataObject | None,
    secret: str,
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(project / "step-summary.md"))
    assume("\x00" not in secret)  # no environment variable holds a NUL
    pieces = grams(secret)
    assume(not any(set(p) <= _VARYING for p in pieces))
    monkeypatch.setenv("RT_API_TOKEN", _RUNES)
    background = _background(project, capsys)
    assume(not any(p in background for p in pieces))
    if _HEADER_SAFE.fullmatch(secret) is None:
        monkeypatch.setenv("RT_API_TOKEN", secret)  # mm-batch's own env var named *TOKEN*
    else:
        monkeypatch.delenv("RT_API_TOKEN", raising=False)
        from mm_batch.cli import _parse_option_value

        assume(isinstance(_parse_option_value(secret), str))
    size = len(secret.encode("utf-8"))
    quoted = json.dumps(secret)  # as the provider's JSON error body carries it

    def cut(name: str, top: int) -> int:
        return data.draw(st.integers(0, top), label=name) if data is not None else top // 2

    cuts = {
        "model": cut("model", size),
        "tail": cut("tail", len(secret)),
        "log": cut("log", size),
        "shown": cut("shown", min(len(secret), 70)),
        "quote": cut("quote", len(json.dumps(secret, ensure_ascii=False)) - 2),
        # litellm's error says about 80 characters before the message: the reason's cut at 300
        # characters falls inside the secret, or near it.
        "reason": cut("reason", len(quoted) + 30),
    }
    texts, code = _run(project, secret, cuts, capsys)
    assert code in (1, 3), texts[:2]
    found = {g for t in texts for g in pieces if g in t}
    assert not found, (sorted(found), [t[:300] for t in texts if any(g in t for g in found)][:3])


@settings(max_examples=300, deadline=None)
@given(st.data(), secret_text)
def test_a_cut_inside_a_secret_in_another_case_or_escaped_leaks_no_prefix(
    data: st.DataObject, secret: str
) -> None:
    """The capture stops inside the secret written in another case, or escaped any way: what
    is left of it is masked whole (found by the fifth attack: only exact spellings were)."""
    spelled = data.draw(
        st.one_of(escaped(secret), st.sampled_from([secret.upper(), secret.lower()]))
    )
    cut = data.draw(st.integers(1, len(spelled) - 1))
    filler = next((c for c in "~^|" if c not in secret.casefold()), None)
    assume(filler is not None)
    before = str(filler) * data.draw(st.integers(0, 5))  # no piece of the secret
    masked = Masker([secret]).text(before + spelled[:cut], cut=True)
    # Nothing of what was written of it is left before the mask; after it, at most the rest
    # of an escape whose meaning the cut left unknown (`%2` of `%25`), no piece of the secret.
    head = masked.split(MASK)[0]  # white space a secret begins with is no piece of it
    assert MASK in masked and head.startswith(before) and not head[len(before) :].strip(), (
        spelled[:cut],
        masked,
    )
    assert leaked(secret, masked) == [], (spelled[:cut], masked)
