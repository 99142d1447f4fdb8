"""How another party may have written a secret, for the masker (`config.secrets`) to find it
by one rule each, never by a list of spellings: in any case (`case_folded`), with any run of white
space where the secret has one (`secret_pattern`), and through escapes (`readings`: JSON's
`\u0073`, `%73`, `&#115;`, one inside another), each read as what it stands for, with a map
back to the text (`unescaped`) so that the whole escape is masked.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import html
import itertools
import json
import re
from collections.abc import Callable, Iterator
from urllib.parse import quote, quote_plus


def written_forms(secret: str) -> set[str]:
    """A secret as itself and as others may have escaped it before mm-batch reads their text."""
    forms = {secret, html.escape(secret), quote(secret, safe=""), quote_plus(secret, safe="")}
    forms.add(json.dumps(secret)[1:-1])
    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    forms.add(repr(secret)[1:-1])
    with contextlib.suppress(UnicodeEncodeError):
        forms.add(repr(secret.encode("utf-8"))[2:-1])
    return forms


def case_folded(text: str) -> tuple[str, SpanMap]:
    """`text` in one case, whole (`ß` and `SS` both as `ss`, `ﬁ` as `fi`), and the map from a
    span of it back to the text's (a character that grew maps whole)."""
    whole = text.upper().casefold()
    if len(whole) == len(text):  # no mapping grew (none shrinks), so each kept its place
        return whole, identity
    pieces = [_folded_character(char) for char in text]
    starts = list(itertools.accumulate((len(piece) for piece in pieces), initial=0))

    def to_text(start: int, end: int) -> Span:
        return bisect.bisect_right(starts, start) - 1, bisect.bisect_right(starts, end - 1)

    return "".join(pieces), to_text


@functools.lru_cache(maxsize=4096)
def _folded_character(char: str) -> str:
    return char.upper().casefold()


def secret_pattern(secret: str) -> re.Pattern[str]:
    """A (folded) secret with each run of white space in it matching any run (a fold makes
    one space of a line break and the indent after it)."""
    return re.compile(r"\s+".join(re.escape(piece) for piece in _WHITESPACE.split(secret)))


_WHITESPACE = re.compile(r"\s+")
# Escapes a secret's characters may be written in by another party before mm-batch reads the
# text: JSON's and Python's backslash escapes (a surrogate pair as one), percent-encoding (a
# run of bytes, read as UTF-8) and HTML's character references, numeric or named.
_BACKSLASH_ESCAPE = (
    r"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}"
    r"|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|[\"'\\/bfnrt])"
)
_PERCENT_ESCAPE = r"(?:%[0-9a-fA-F]{2})+"
# A numeric reference may carry any number of leading zeros (`&#00000115;` is an `s`).
_HTML_ESCAPE = r"&(?:#0*[0-9]{1,7};?|#[xX]0*[0-9a-fA-F]{1,6};?|[A-Za-z][A-Za-z0-9]{1,31};)"
# One way of reading escapes: one family, or all at once (an encoder that mixes them); each
# with the character its escapes begin with (no such character: nothing to read).
_WAYS = (
    (re.compile(f"{_BACKSLASH_ESCAPE}|{_PERCENT_ESCAPE}|{_HTML_ESCAPE}"), "\\%&"),
    (re.compile(_BACKSLASH_ESCAPE), "\\"),
    (re.compile(_PERCENT_ESCAPE), "%"),
    (re.compile(_HTML_ESCAPE), "&"),
)
_BACKSLASHED = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
# Escapes inside escapes (JSON quoted in a JSON string, a URL in JSON): read in every order of
# the ways above, this many deep, each reading made once (most texts make one or none).
_ESCAPE_LEVELS = 3
_MOST_READINGS = 32
Span = tuple[int, int]
SpanMap = Callable[[int, int], Span]


def identity(start: int, end: int) -> Span:
    return start, end


def composed(outer: SpanMap, inner: SpanMap) -> SpanMap:
    return lambda start, end: outer(*inner(start, end))


@functools.lru_cache(maxsize=4096)
def _decoded(escape: str) -> str:
    """The characters an escape stands for (an escape that stands for none: itself)."""
    if escape[0] == "%":
        return bytes.fromhex(escape.replace("%", "")).decode("utf-8", errors="replace")
    if escape.startswith("&#"):
        # Read as written, not as a browser would (which drops or swaps a control's).
        digits = escape[2:].rstrip(";")
        hexadecimal = digits[:1] in ("x", "X")
        return _character(int(digits[1:] if hexadecimal else digits, 16 if hexadecimal else 10))
    if escape[0] == "&":
        return html.unescape(escape)
    kind = escape[1]
    if kind in "uUx":
        codes = [int(part[:4] if kind == "u" else part, 16) for part in escape[2:].split("\\u")]
        if len(codes) == 2:  # a surrogate pair
            return chr(0x10000 + ((codes[0] - 0xD800) << 10) + (codes[1] - 0xDC00))
        return _character(codes[0]) or escape
    return _BACKSLASHED.get(kind, kind)


def _character(code: int) -> str:
    """The character of a code point; U+FFFD for what is none (a lone surrogate, past the
    last code point), as browsers read such a reference."""
    return chr(code) if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"


def readings(
    text: str, end: Callable[[str], str] | None = None
) -> Iterator[list[tuple[re.Pattern[str], str]]]:
    """The readings of a text's escapes, shallow ones first: each as its steps (the way read
    and the text it made), the last step's text the reading. `end`, when given, cuts each text
    before it is read further (at its end only: what it keeps is the text's beginning)."""
    trim = end or (lambda view: view)
    seen = {text}
    frontier: list[list[tuple[re.Pattern[str], str]]] = [[]]
    made = 0
    for _level in range(_ESCAPE_LEVELS):
        deeper: list[list[tuple[re.Pattern[str], str]]] = []
        for steps in frontier:
            view = trim(steps[-1][1] if steps else text)
            for way, begins in _WAYS:
                if made >= _MOST_READINGS or not any(c in view for c in begins):
                    continue
                read, count = way.subn(_read, view)
                made += 1
                if count and read not in seen:
                    seen.add(read)
                    deeper.append([*steps, (way, read)])
                    yield deeper[-1]
        frontier = deeper


def _read(match: re.Match[str]) -> str:
    return _decoded(match.group())


def unescaped(text: str, way: re.Pattern[str]) -> tuple[str, SpanMap]:
    """The text with every escape read as what it stands for, and the map from a span of that
    reading back to the text's: an escape's characters map to the whole escape."""
    pieces: list[str] = []
    # (start in the reading, start in the text, end in the text, an escape or not)
    parts: list[tuple[int, int, int, bool]] = []
    at = done = 0
    for match in way.finditer(text):
        start, end = match.span()
        if start > done:
            parts.append((at, done, start, False))
            pieces.append(text[done:start])
            at += start - done
        decoded = _decoded(match.group())
        parts.append((at, start, end, True))
        pieces.append(decoded)
        at += len(decoded)
        done = end
    parts.append((at, done, len(text), False))
    pieces.append(text[done:])
    starts = [part[0] for part in parts]

    def position(index: int, *, end: bool) -> int:
        view_start, text_start, text_end, escape = parts[bisect.bisect_right(starts, index) - 1]
        if escape:
            return text_end if end else text_start
        return text_start + (index - view_start) + (1 if end else 0)

    def to_text(start: int, end: int) -> Span:
        return position(start, end=False), position(end - 1, end=True)

    return "".join(pieces), to_text
