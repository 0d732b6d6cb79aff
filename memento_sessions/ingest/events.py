"""Building daemon events from source records: deterministic ids, size caps, values every backend can store.

Every converter builds its events here, so the rules of the daemon's event format live in one place:
an id of 1..128 characters `[A-Za-z0-9._:-]` derived from the source record (re-ingesting writes nothing
new), `data` at most 16 KiB encoded (a huge tool result is cut, marked and counted), no NaN, Infinity,
number beyond 1e12 or NUL character that Postgres or FalkorDB could not store.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

Event = dict[str, Any]
T = TypeVar("T")
Encoder = Callable[[Any], bytes]  # a value as compact UTF-8 JSON; ValueError or TypeError for what has no JSON form

MAX_DATA_BYTES = 16 * 1024
# Below the daemon's 16 KiB so the keys it adds and JSON escaping differences never push an event over.
DATA_BUDGET = MAX_DATA_BYTES - 512
TEXT_CAP = 4096  # a tool result or message longer than this is cut first, with a marker
MARKER = "…[truncated {} chars]"
MAX_NUMBER = 1e12
MAX_REASONS = 100

_ID_OK = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")  # \Z: `$` would also pass a trailing newline
_ID_BAD_CHARS = re.compile(r"[^A-Za-z0-9._:-]")
# In compact JSON, a value follows `:`, `,` or `[`: 13 digits or an exponent there may be a number beyond 1e12, and
# NaN or Infinity is what an encoder that allows them writes (inside a string the same text only sends the data
# down the slow, exact path).
# One pattern per character a value follows: a literal first character lets the regex engine skip ahead about
# 1.6 times faster over an event's text than the character class [:,\[] does.
_SUSPECT_COLON, _SUSPECT_COMMA, _SUSPECT_BRACKET = (
    re.compile(re.escape(lead) + rb"(?:-?(?:\d(?:\d{12}|[\d.]*[eE])|Infinity)|NaN)") for lead in (b":", b",", b"["))
_STRICT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # built once: not per event
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def strict_json(value: Any) -> bytes:
    """The standard library's compact JSON of a value, refusing NaN and Infinity (ValueError)."""
    return _STRICT.encode(value).encode()


class Stats:
    """What a converter did: records read, events made, records skipped by reason, payloads capped.

    A plain class, not a dataclass: importing dataclasses (and inspect with it) costs the hook's start.
    """

    def __init__(self) -> None:
        self.records = 0
        self.events = 0
        self.skipped: Counter[str] = Counter()
        self.capped = 0

    def __repr__(self) -> str:
        return f"Stats({self.as_dict()})"

    def skip(self, reason: str) -> list[Event]:
        """Count a skipped record (or part of one) and return no events."""
        # Reasons name source types; past MAX_REASONS distinct ones a hostile source cannot grow the counter.
        reason = reason[:80] if reason in self.skipped or len(self.skipped) < MAX_REASONS else "other"
        self.skipped[reason] += 1
        return []

    def cap(self, text: str, limit: int = 4096) -> str:
        """A tool result or message cut to `limit` characters with the marker, counted when cut."""
        if len(text) <= limit:
            return text
        self.capped += 1
        return text[:limit] + MARKER.format(len(text) - limit)

    def as_dict(self) -> dict[str, Any]:
        """The counts as plain JSON."""
        return {"records": self.records, "events": self.events, "skipped": dict(self.skipped),
                "capped": self.capped}


class Converter:
    """A converter of one source's records; `feed` never raises, whatever the record holds.

    `encode` is what checks each event's `data` (see `checked`): the standard library's by default; a
    caller may set a faster one with the same contract.
    """

    def __init__(self, project_root: str | None = None) -> None:
        self.stats = Stats()
        self.root = project_root  # file paths are made relative to it (else to the root the source names)
        self.encode: Encoder = strict_json

    def feed(self, record: Any) -> list[Event]:
        """The unified events of one source record (a parsed JSON value), counted in `stats`."""
        return self._each(record, self._checked)

    def feed_encoded(self, record: Any) -> list[bytes]:
        """`feed`'s events as compact JSON by `encode` (a sender joins these bytes into its request as they are)."""
        return self._each(record, self._encoded)

    def _each(self, record: Any, finish: Callable[[Event], T]) -> list[T]:
        """`finish` of each event of one record; none for a record that is not an object or that fails to
        convert (counted as skipped)."""
        self.stats.records += 1
        if not isinstance(record, dict):
            self.stats.skip("not_an_object")
            return []
        try:
            out = [finish(event) for event in self.convert(record)]
        except (TypeError, ValueError, AttributeError, KeyError) as error:
            # A field of an unexpected type deep in a record: that record is skipped, never the stream.
            self.stats.skip(f"malformed:{type(error).__name__}")
            return []
        self.stats.events += len(out)
        return out

    def _checked(self, event: Event) -> Event:
        """The event with its `data` checked (see `checked_text`)."""
        if "data" in event:
            event["data"] = checked(self.stats, event["data"], self.encode)
        return event

    def _encoded(self, event: Event) -> bytes:
        """The event as compact JSON, encoded once in the usual case.

        It is encoded whole first: when that text shows nothing `checked_text` would change (see `plain`), its
        data needs no check of its own. Otherwise the data is checked and the encoding that check made is
        spliced in, not encoded again.
        """
        try:
            text = self.encode(event)
        except (TypeError, ValueError):  # NaN to a strict encoder, or a value JSON has no form for
            text = b""
        if "data" not in event or plain(text):
            return text
        event["data"], data_text = checked_text(self.stats, event.pop("data"), self.encode)
        return self.encode({**event, "data": None})[:-len(b"null}")] + data_text + b"}"

    def convert(self, record: dict[str, Any]) -> list[Event]:
        """The events of one record; subclasses dispatch on the record's type."""
        raise NotImplementedError


def obj(value: Any) -> dict[str, Any]:
    """The value when it is a JSON object, else an empty one: a record's optional parts read safely."""
    return value if isinstance(value, dict) else {}


def digest(value: Any) -> str:
    """A short stable hash of any JSON value (keys sorted), for ids of records that carry none."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return sha256_hex(text)[:16]


def sha256_hex(text: str) -> str:
    """SHA-256 of the text; hashlib (which loads OpenSSL) is imported on first use, not at the hook's start."""
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def event_id(*parts: object) -> str:
    """An event id from the source record's own ids, valid for the daemon whatever the source sent."""
    text = ":".join(map(str, parts))
    if _ID_OK.match(text):
        return text
    # Foreign characters or a long id: keep a readable prefix and make it unique with a hash of the whole.
    return f"{_ID_BAD_CHARS.sub('_', text)[:90]}:{sha256_hex(text)[:32]}"


def iso_time(value: Any) -> str | None:
    """An ISO-8601 timestamp with a zone from a source's ISO string or epoch milliseconds; None if neither."""
    if isinstance(value, str) and _ISO.match(value):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        from datetime import UTC, datetime  # only epoch times need it: not imported at the hook's start

        seconds = value / 1000 if value > 1e11 else value
        try:
            return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="milliseconds")
        except (OverflowError, OSError, ValueError):
            return None
    return None


def make_event(stats: Stats, eid: str, etype: str, data: dict[str, Any] | None = None,
               timestamp: Any = None, **extra: Any) -> Event:
    """One daemon event; `extra` holds changeInfo, stateTransition or impact. `Converter.feed` checks `data`."""
    event: Event = {"id": eid, "type": etype}
    stamp = iso_time(timestamp)
    if stamp:
        event["timestamp"] = stamp
    if extra:
        event.update({key: value for key, value in extra.items() if value is not None})
    if data is not None:
        event["data"] = data
    return event


def checked(stats: Stats, data: dict[str, Any], encode: Encoder = strict_json) -> dict[str, Any]:
    """`data` as `fit(clean(data))` makes it, without walking it when one encoding shows nothing to do."""
    return checked_text(stats, data, encode)[0]


def checked_text(stats: Stats, data: dict[str, Any], encode: Encoder = strict_json) -> tuple[dict[str, Any], bytes]:
    """`checked`'s data and its encoding by `encode`.

    The fast path is most events: encoded once, nothing that could be a NUL, NaN, Infinity or a number
    beyond 1e12 in the text (13 digits in a row, or an exponent), and within the budget.
    """
    try:
        text = encode(data)
    except (TypeError, ValueError):  # NaN or Infinity (to a strict encoder), or a value JSON has no form for
        text = b""
    if not plain(text):
        data = fit(stats, clean(data))
        return data, encode(data)
    return data, text


def plain(text: bytes) -> bool:
    """True when a value's encoding shows nothing `clean` or `fit` would change: not empty (it encoded), no
    NUL, nothing that may be NaN, Infinity or a number beyond 1e12, within DATA_BUDGET bytes."""
    return (bool(text) and len(text) <= DATA_BUDGET and b"\\u0000" not in text and not _SUSPECT_COLON.search(text)
            and not _SUSPECT_COMMA.search(text) and not _SUSPECT_BRACKET.search(text))


def clean(value: Any) -> Any:
    """The value with what a backend cannot store replaced: NUL characters, NaN/Infinity, numbers over 1e12."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value if abs(value) <= MAX_NUMBER else str(value)
    if isinstance(value, dict):
        return {str(key): clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean(item) for item in value]
    return str(value)


def encoded_size(value: Any) -> int:
    """Bytes of the value as compact UTF-8 JSON, as the daemon measures `data`."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def fit(stats: Stats, data: dict[str, Any]) -> dict[str, Any]:
    """`data` within the budget: long strings cut with a marker, then ever shorter, then only scalars."""
    if encoded_size(data) <= DATA_BUDGET:
        return data
    stats.capped += 1
    for text_cap, items_cap in ((TEXT_CAP, 256), (1024, 64), (256, 16), (64, 8)):
        shrunk = shrink(data, text_cap, items_cap)
        if encoded_size(shrunk) <= DATA_BUDGET:
            return dict(shrunk)
    return {"truncated": True, **{key: cut(value, 64) for key, value in data.items() if _scalar(value)}}


def shrink(value: Any, text_cap: int, items_cap: int, depth: int = 0) -> Any:
    """Strings cut to `text_cap`, lists and objects to `items_cap` entries, nesting to 6 levels, each marked."""
    if isinstance(value, str):
        return cut(value, text_cap)
    if depth >= 6 and isinstance(value, dict | list):
        return "…[nested value dropped]"
    if isinstance(value, dict):
        items = list(value.items())
        out = {key: shrink(item, text_cap, items_cap, depth + 1) for key, item in items[:items_cap]}
        if len(items) > items_cap:
            out["…"] = f"{len(items) - items_cap} more keys"
        return out
    if isinstance(value, list):
        kept = [shrink(item, text_cap, items_cap, depth + 1) for item in value[:items_cap]]
        return kept + ([f"…[{len(value) - items_cap} more items]"] if len(value) > items_cap else [])
    return value


def cut(value: Any, cap: int) -> Any:
    """A string cut to `cap` characters with the truncation marker; other values unchanged."""
    if isinstance(value, str) and len(value) > cap:
        return value[:cap] + MARKER.format(len(value) - cap)
    return value


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
