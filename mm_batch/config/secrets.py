"""Secrets: masked as *** in everything mm-batch writes or sends, the model included.

Text from outside (a provider's error, a model's reply, a command's output, a config value)
becomes `Masked` where it enters, by `Masker.text`; what cuts, folds or quotes a text for a
report or a request takes `Masked` only (`head`, `head_bytes`, `tail`, `folded` here), so that
mypy proves the order SPEC 7 asks for: masking before any change to a text. A change made
after masking cannot show part of a secret: no character of one is left.

The masker finds a secret however another party wrote it (any case, white space folded,
escaped): `config.spellings` has the rules.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NewType, TypeVar, cast

from mm_batch.config.model import AgentConfig
from mm_batch.config.spellings import (
    SpanMap,
    case_folded,
    composed,
    identity,
    readings,
    secret_pattern,
    unescaped,
    written_forms,
)

T = TypeVar("T")

MIN_SECRET_LENGTH = 6
MASK = "***"
# A provider that redacts a key itself still quotes its ends (`sk-live-ab****...ijkl`): an end
# of a secret this long, next to such a redaction, is masked too.
FRAGMENT = 4
# Where a word may begin or end: next to a space or a sign that is no part of a key's
# characters in a provider's message (a sentence's end, brackets, quotes, `=`, `:`).
_BOUNDARY = re.compile(r"(?<=[\s\"'`<>(),;:=\[\]{}.!?])|^|$|(?=[\s\"'`<>(),;:=\[\]{}.!?])")
_REDACTION = re.compile(r"\*{2,}|\.{3,}|\u2026+|\u2022{2,}")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
# Model options only: a header that carries a credential, and keys that count tokens.
_AUTH_NAME = re.compile(r"AUTHORIZATION|COOKIE", re.IGNORECASE)
_COUNT_NAME = re.compile(r"TOKENS$", re.IGNORECASE)
_SCHEME = re.compile(r"^\s*(?:Bearer|Basic|Token|Digest)\s+(\S.*?)\s*$", re.IGNORECASE)
_REPLACEMENT = "\ufffd"  # what decoding leaves of a character a capture's cut split

# Text whose secrets are masked. Only `Masker.text` (and the cuts below, from a `Masked`) make
# one: a test keeps `Masked(` out of every other module.
Masked = NewType("Masked", str)


def secret_name(name: str) -> bool:
    """Whether a name (an env var's, a model option's) says its value is a secret."""
    return _SECRET_NAME.search(name) is not None


class Masker:
    """Replaces every known secret value by *** in text; keys and structure are never touched."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # A secret pasted with a line break or spaces at its ends is also found without them.
        given = {t for s in secrets for t in (s, s.strip()) if len(t) >= MIN_SECRET_LENGTH}
        # A secret may come back escaped by someone else: a provider's error quoting the
        # request's JSON, an HTTP library's repr of a header, a URL's query.
        forms = {form for s in given for form in written_forms(s)}
        values = sorted({f for f in forms if len(f) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._secrets = tuple(values)
        self._folded = tuple(case_folded(v)[0] for v in values)
        self._patterns = tuple(secret_pattern(v) for v in self._folded)
        # Every run of FRAGMENT characters of a secret: what a redaction's neighbour must hold to
        # be worth a closer look (see `_fragment_spans`).
        self._grams = frozenset(
            v[i : i + FRAGMENT] for v in values for i in range(len(v) - FRAGMENT + 1)
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        return self._secrets

    def argv(self, argv: Sequence[str]) -> list[Masked]:
        """Each entry masked, and every entry of a run of them that holds a secret only
        together (`hunter two` in two entries: a report that joins them with a space would show
        it) masked whole. A run is at most as long as a secret has words."""
        masked = [self.text(entry) for entry in argv]
        longest = max((len(s.split()) for s in self._secrets), default=1)
        for size in range(2, min(longest, len(masked)) + 1):
            for start in range(len(masked) - size + 1):
                joined = " ".join(masked[start : start + size])
                if self.text(joined) != joined:
                    masked[start : start + size] = [Masked(MASK)] * size
        return masked

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], extra: Iterable[str] = ()) -> Masker:
        named = (v for k, v in environ.items() if secret_name(k))
        return cls([*named, *extra])

    def text(self, value: str, *, cut: bool = False) -> Masked:
        """Mask every secret. `cut`: the text was cut short (a capture limit), so a tail that
        begins a secret is masked too: a secret straddling the cut leaks no prefix, also when
        the cut split one of its characters (decoded as U+FFFD, or left out)."""
        if not self._secrets:
            return Masked(value)
        masked = self._masked(value)
        if cut:
            tail = max(self._open_tail(masked), self._open_tail_read(masked))
            if tail:
                masked = self._masked(masked[:-tail] + MASK)
        return Masked(masked)

    def quoted_by_others(self, value: str) -> Masked:
        """Text of a party that may quote a key in part, its own way (a provider's error:
        `sk-live-ab[REDACTED]0123`, `sk-live-abXXXX0123`, in any case): masked as `text` masks,
        and wherever a word begins as a secret begins, or ends as it ends, for FRAGMENT or more
        characters, that whole stretch of text up to a space is masked. Only for such text:
        elsewhere a word like `passed` stays itself whatever a secret begins with."""
        masked = self.text(value)
        if not self._secrets:
            return masked
        probe, to_masked = case_folded(masked)
        spans: list[tuple[int, int]] = []
        for boundary in _BOUNDARY.finditer(probe):
            at = boundary.start()
            here = to_masked(at, at + 1)[0]  # where the probe's position lies in the text
            for key in self._folded:
                if _common_start(probe[at : at + len(key)], key) >= FRAGMENT:
                    spans.append((here, _space_after(masked, here)))
                before = probe[max(at - len(key), 0) : at]
                if _common_start(before[::-1], key[::-1]) >= FRAGMENT:
                    spans.append((_space_before(masked, here), here))
        if not spans:
            return masked
        pieces: list[str] = []
        position = 0
        for begin, end in sorted(spans):
            if end <= position:
                continue
            pieces.extend((masked[position : max(begin, position)], MASK))
            position = end
        pieces.append(masked[position:])
        return self.text("".join(pieces))

    def data(self, value: T, *, keys: bool = True) -> T:
        """Mask the strings inside JSON-like data, its keys too (a provider's parts are its own
        text, keys included); with `keys` false, data sent on (the history of a request, a
        hook's input, a cached reply replayed) keeps its structure: a key is masked only where
        it is wholly a secret (`_key`). The copy has the value's shape: a string becomes a
        `Masked` string, a dict a dict, a list a list and a tuple a tuple; anything else is kept
        as it is. Two keys that mask alike keep the later value."""
        if not self._secrets:
            return value
        return cast(T, self._masked_data(value, keys))

    def _key(self, key: object, keys: bool) -> object:
        """A key masked, or (`keys` false) masked only where it is wholly a secret: then it is
        the provider's text, not a name its format gives a field (`reasoning_content` stays
        itself with a secret `reasoning`, as a role stays `assistant`)."""
        if not isinstance(key, str):
            return key
        masked = self.text(key)
        return masked if keys or masked == MASK else key

    def _masked_data(self, value: object, keys: bool = True) -> object:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self._key(k, keys): self._masked_data(v, keys) for k, v in value.items()}
        if isinstance(value, list):
            return [self._masked_data(v, keys) for v in value]
        if isinstance(value, tuple):
            return tuple(self._masked_data(v, keys) for v in value)
        return value

    def json_text(self, value: object) -> Masked:
        """JSON-like data as JSON text to quote in a reason or an answer: every string in it,
        keys too, masked before JSON escapes it (an escaped secret would no longer match). The
        text is masked again as a whole, since an escape can make a secret of what was none; where
        that cuts into an escape (`\\u0000` beside a redaction), the quote would be no JSON any
        more, and is the mask alone instead."""
        text = json.dumps(self._masked_data(value), ensure_ascii=False)
        masked = self.text(text)
        if masked != text:
            try:
                json.loads(masked)
            except ValueError:
                return self.text(json.dumps(MASK))
        return masked

    def captured(self, data: bytes, *, cut: bool) -> Masked:
        """Bytes a command wrote, as text with its secrets masked. A capture cut short may end
        inside a character: that character is left out, and a tail that begins a secret is
        masked (see `text`)."""
        if not cut:
            return self.text(data.decode("utf-8", errors="replace"))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return self.text(decoder.decode(data, final=False), cut=True)

    def _masked(self, text: str) -> str:
        """Every character that lies in an occurrence of a secret, overlapping ones included,
        replaced: one *** per run of such characters; again until none is left, since joining
        the text around a *** can make a secret of what was not one."""
        while True:
            spans = self._spans(text)
            if not spans:
                return text
            pieces: list[str] = []
            position = 0
            for start, end in spans:
                pieces.extend((text[position:start], MASK))
                position = end
            pieces.append(text[position:])
            text = "".join(pieces)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """The runs of characters covered by an occurrence of any secret, merged, in order: in
        the text itself and in each reading of its escapes (`unescaped`), an escape's match
        covering the whole escape."""
        found = self._found(text)
        # The readings are made plainly first (most texts with escapes hide no secret in them);
        # only one that holds a secret is made again with the map back to the text.
        for steps in readings(text):
            if self._found(steps[-1][1]):
                found.extend(self._found_through_escapes(text, [way for way, _ in steps]))
        found.extend(self._fragment_spans(text))
        if not found:
            return []
        found.sort()
        merged = [found[0]]
        for start, end in found[1:]:
            last_start, last_end = merged[-1]
            if start <= last_end:
                merged[-1] = (last_start, max(last_end, end))
            else:
                merged.append((start, end))
        return merged

    def _found(self, text: str) -> list[tuple[int, int]]:
        """Every occurrence of every secret in `text`, in any case, overlapping ones included."""
        view, to_text = case_folded(text)
        found: list[tuple[int, int]] = []
        for pattern in self._patterns:
            match = pattern.search(view)
            while match is not None:
                found.append(to_text(*match.span()))
                match = pattern.search(view, match.start() + 1)
        return found

    def _found_through_escapes(
        self, text: str, ways: Sequence[re.Pattern[str]]
    ) -> list[tuple[int, int]]:
        """The occurrences in a reading of the text's escapes (read `ways`, one after the
        other), as spans of the text."""
        view = text
        to_text: SpanMap = identity
        for way in ways:
            view, to_view = unescaped(view, way)
            to_text = composed(to_text, to_view)
        return [to_text(start, end) for start, end in self._found(view)]

    def _fragment_spans(self, text: str) -> list[tuple[int, int]]:
        """The beginning of a secret just before a redaction, and its end just after one, when
        FRAGMENT or more characters long: what a provider's own masking leaves of a key. A run
        of them (`sk-psk-p***`) is taken whole, in one pass over the text, not one a pass."""
        found: list[tuple[int, int]] = []
        for redaction in _REDACTION.finditer(text):
            start, end = redaction.span()
            at = start
            while text[max(at - FRAGMENT, 0) : at] in self._grams:
                longest = max(_overlap(text, s, FRAGMENT, at) for s in self._secrets)
                if not longest:
                    break
                at -= longest
            if at < start:
                found.append((at, start))
            at = end
            while text[at : at + FRAGMENT] in self._grams:
                longest = max(_underlap(text, s, FRAGMENT, at) for s in self._secrets)
                if not longest:
                    break
                at += longest
            if at > end:
                found.append((end, at))
        return found

    def _open_tail(self, text: str) -> int:
        """How many last characters of a cut text may begin a secret: the longest end that is a
        proper beginning of one, also when the cut split a character (decoded as U+FFFD)."""
        whole = max(_overlap(text, s) for s in self._secrets)
        bare = text.rstrip(_REPLACEMENT)
        broken = len(text) - len(bare)
        split = max(_overlap(bare, s) for s in self._secrets) if broken else 0
        return max(whole, split + broken if split else 0)

    def _tail_begin(self, view: str) -> int | None:
        """Where, in a reading of a cut text, its end may begin a secret: the longest end that
        begins one (in any case), with what the cut left unfinished after it; None if none."""
        core = _finished(view)  # `&%` of `%26%23`: one begun in another
        # Only its last characters can begin a secret (folding changes a length at most 3-fold).
        offset = max(len(core) - 3 * max(map(len, self._folded)), 0)
        folded, to_view = case_folded(core[offset:])
        longest = max(_overlap(folded, s) for s in self._folded)
        if longest:
            return offset + to_view(len(folded) - longest, len(folded))[0]
        return len(core) if len(core) < len(view) else None

    def _open_tail_read(self, text: str) -> int:
        """How many last characters of a cut text may begin a secret in another case or
        through its escapes (`%53%75`, `\\u0053`, `&#x53;`, in any mix): read as `_spans`
        reads a text, each reading's longest end that begins a secret mapped back, and an
        escape the cut left unfinished taken with it. Only the last TAIL_WINDOW characters are
        read: a cut is where a capture limit was reached."""
        window = text[max(len(text) - TAIL_WINDOW, 0) :]
        whole = _finished(window)  # `&#4` would read as a whole reference, and it may go on
        ends = [len(window) - len(whole)]
        # Each reading is made plainly first (most hold no secret's beginning at their end);
        # only one that does is made again with the map back to the text.
        # Each text is read without what the cut left unfinished at its end (`_finished`): the
        # `&#4` of `%26%234` must not be read as a whole reference one reading deeper.
        steps_of: list[list[tuple[re.Pattern[str], str]]] = [[], *readings(whole, _finished)]
        for steps in steps_of:
            view = steps[-1][1] if steps else whole
            begin = self._tail_begin(view)
            if begin is None:
                continue
            back: SpanMap = identity
            mapped = whole
            for way, _ in steps:
                mapped, to_view = unescaped(_finished(mapped), way)  # read as `readings` reads
                back = composed(back, to_view)
            ends.append(len(window) - back(begin, len(view))[0])
        return max(ends, default=0)


# Where a cut text's tail is read for a secret's beginning (`Masker._open_tail_read`).
TAIL_WINDOW = 64 * 1024
# An escape the cut left unfinished at the very end: a backslash one (or the first half of a
# surrogate pair, `\ud800`), a percent one (or the first bytes of a character's UTF-8, `%C3`
# of `%C3%A9`), an HTML numeric or named reference.
_UNFINISHED_ESCAPE = re.compile(
    r"(?:\\(?:u[0-9a-fA-F]{0,3}|U[0-9a-fA-F]{0,7}|x[0-9a-fA-F]?)?|%[0-9a-fA-F]?"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\(?:u[0-9a-fA-F]{0,3})?)?"
    r"|%[cCdD][0-9a-fA-F]|%[eE][0-9a-fA-F](?:%[89abAB][0-9a-fA-F])?"
    r"|%[fF][0-7](?:%[89abAB][0-9a-fA-F]){0,2}"
    r"|&(?:#[xX]?[0-9a-fA-F]*|[A-Za-z][A-Za-z0-9]*)?)\Z"
)


def _finished(text: str) -> str:
    """The text without the escapes left unfinished at its end, one begun inside another too,
    and without the U+FFFD a reading made of a character's first bytes (`%C2` read alone)."""
    while True:
        unfinished = _UNFINISHED_ESCAPE.search(text)
        shorter = text[: unfinished.start()] if unfinished else text.rstrip(_REPLACEMENT)
        if shorter == text:
            return text
        text = shorter


def _overlap(text: str, secret: str, least: int = 1, end: int | None = None) -> int:
    """The length of the longest end of `text` (of its first `end` characters) that is a proper
    beginning of `secret` (0 when shorter than `least`)."""
    end = len(text) if end is None else end
    for n in range(min(len(secret) - 1, end), least - 1, -1):
        if text.endswith(secret[:n], 0, end):
            return n
    return 0


def _space_after(text: str, at: int) -> int:
    found = re.compile(r"\s").search(text, at)
    return found.start() if found else len(text)


def _space_before(text: str, at: int) -> int:
    return max(text.rfind(" ", 0, at), text.rfind("\n", 0, at), text.rfind("\t", 0, at)) + 1


def _common_start(text: str, secret: str) -> int:
    """How many first characters `text` and `secret` share."""
    shared = 0
    for mine, theirs in zip(text, secret, strict=False):
        if mine != theirs:
            break
        shared += 1
    return shared


def _underlap(text: str, secret: str, least: int, start: int = 0) -> int:
    """The length of the longest beginning of `text` (from `start`) that is a proper end of
    `secret` (0 when shorter than `least`)."""
    for n in range(min(len(secret) - 1, len(text) - start), least - 1, -1):
        if text.startswith(secret[-n:], start):
            return n
    return 0


def option_secrets(options: Mapping[str, object]) -> list[str]:
    """The values of model options whose key names a key, token, secret or password (`api_key`),
    or an authorization header, at any depth (`extra_headers: {x-api-key: ...}`): secrets
    wherever the options come from (SPEC 7). A number is one too (`--model-option
    api_key=98765432101234` reads as an integer), except under a key that counts tokens
    (`max_tokens`): a limit, not a credential. A header's scheme (`Bearer sk-...`) is kept apart,
    so that the credential alone is masked wherever it shows."""
    found: list[str] = []
    stack: list[tuple[object, str | None]] = [(options, None)]
    while stack:
        value, named = stack.pop()
        if isinstance(value, str):
            if named is not None:
                found.append(value)
                scheme = _SCHEME.match(value)
                if scheme:
                    found.append(scheme.group(1))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if named is not None and not _COUNT_NAME.search(named):
                found.append(str(value))
        elif isinstance(value, Mapping):
            stack.extend(
                (v, named if named is not None else _option_secret_name(str(k)))
                for k, v in value.items()
            )
        elif isinstance(value, list | tuple):
            stack.extend((v, named) for v in value)
    return found


def _option_secret_name(key: str) -> str | None:
    return key if secret_name(key) or _AUTH_NAME.search(key) else None


def masker_of(
    agents: Iterable[AgentConfig], model_options: Iterable[Mapping[str, object]] = ()
) -> Masker:
    """What a run masks: mm-batch's secret-named env vars, every agent's `${VAR}` values, and
    the secret-named model options of every agent and of `model_options` (the command line's)."""
    agents = list(agents)
    options = [a.model_options for a in agents] + list(model_options)
    return Masker.from_environment(
        os.environ,
        [
            *(s for a in agents for s in a.secrets),
            *(s for o in options for s in option_secrets(o)),
        ],
    )


NO_SECRETS = Masker(())  # for what knows no secrets (a tool's description checked alone)


def head(text: Masked, limit: int) -> Masked:
    """The first `limit` characters of a masked text (it holds no secret, so no part of one)."""
    return Masked(text[: max(limit, 0)])


def tail(text: Masked, limit: int) -> Masked:
    """The last `limit` characters of a masked text."""
    return Masked(text[-limit:]) if limit > 0 else Masked("")


def head_bytes(text: Masked, limit: int) -> tuple[Masked, int]:
    """The longest beginning of a masked text that is at most `limit` bytes of UTF-8 (never half
    a character), and how many bytes are left out."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, 0
    kept = data[: max(limit, 0)].decode("utf-8", "ignore")
    return Masked(kept), len(data) - len(kept.encode("utf-8", "surrogatepass"))


def folded(text: Masked) -> Masked:
    """A masked text with each run of whitespace as one space, and none at either end."""
    return Masked(" ".join(text.split()))
