"""JSON Lines to events: parse each line, pick the converter by format, count what could not be read.

No I/O: the caller reads the file (or stdin) and passes its lines; a truncated or non-JSON line is
counted as `bad_json` and skipped, never the end of the ingest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from memento_sessions.ingest.claude_code import ClaudeCodeTranscript
from memento_sessions.ingest.claude_hooks import ClaudeHooks
from memento_sessions.ingest.events import Converter, Encoder, Event, Stats, strict_json
from memento_sessions.ingest.opencode import OpenCode
from memento_sessions.ingest.stream_json import StreamJson

FORMATS: dict[str, type[Converter]] = {"claude-code": ClaudeCodeTranscript, "stream-json": StreamJson,
                                       "opencode": OpenCode, "hook": ClaudeHooks}
_TRANSCRIPT_ONLY = frozenset({"file-history-snapshot", "queue-operation", "progress", "summary"})


class Conversion(NamedTuple):
    """The events of a whole input and the counts of what was read, made, skipped and capped."""

    events: list[Event]
    stats: Stats


def converter(fmt: str, project_root: str | None = None) -> Converter:
    """A fresh converter for a format name (claude-code, stream-json, opencode, hook)."""
    kind = FORMATS.get(fmt)
    if kind is None:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    return kind(project_root)


def detect(record: Any) -> str | None:
    """The format a first record belongs to, or None when it tells nothing."""
    if not isinstance(record, dict):
        return None
    kind = record.get("type")
    if "hook_event_name" in record:
        return "hook"
    if isinstance(kind, str) and "." in kind and ("properties" in record or "payload" in record):
        return "opencode"
    if "payload" in record and isinstance(record["payload"], dict) and "." in str(record["payload"].get("type")):
        return "opencode"
    if kind in _TRANSCRIPT_ONLY or "sessionId" in record or "parentUuid" in record:
        return "claude-code"
    if "session_id" in record or kind in ("stream_event", "result"):
        return "stream-json"
    return None


def parse(line: str | bytes) -> tuple[bool, Any]:
    """(True, value) for a line of JSON, (False, None) for a line that is not (truncated, garbage, not UTF-8)."""
    try:
        return True, json.loads(line.decode() if isinstance(line, bytes) else line)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return False, None


def convert_lines(lines: Iterable[str | bytes], fmt: str = "auto", project_root: str | None = None) -> Conversion:
    """Every event of a JSON Lines input; `fmt` "auto" picks the format from the first record that tells."""
    reader = LineReader(fmt, project_root)
    events = [event for line in lines for event in reader.feed(line)]
    return Conversion(events, reader.finish())


class LineReader:
    """JSON Lines converted one line at a time (a caller can send events while it reads the rest).

    `parse` turns a line (str, or bytes of UTF-8 that it refuses when they are not) into (ok, value) and
    `encode` (see `Converter`) checks each event's data: the standard library's by default; a caller may
    pass faster ones with the same contracts.
    """

    def __init__(self, fmt: str = "auto", project_root: str | None = None,
                 parse: Callable[[str | bytes], tuple[bool, Any]] = parse, encode: Encoder = strict_json) -> None:
        self.root, self.parse, self.encode = project_root, parse, encode
        self.outer = Stats()  # lines no converter saw: bad JSON, records before the format was known
        self.active = None if fmt == "auto" else self.start(fmt)
        self.pending: list[Any] = []  # records read before the format is known

    def start(self, fmt: str) -> Converter:
        """The converter of the format, with this reader's encoder."""
        active = converter(fmt, self.root)
        active.encode = self.encode
        return active

    def feed(self, line: str | bytes) -> list[Event]:
        """The events of one line (those of earlier lines too, once the format became known)."""
        ready = self._ready(line)
        active = self.active
        return [event for record in ready for event in active.feed(record)] if active else []

    def feed_encoded(self, line: str | bytes) -> list[bytes]:
        """`feed`'s events as compact JSON (see `Converter.feed_encoded`), ready to be joined into a request."""
        ready = self._ready(line)
        active = self.active
        return [event for record in ready for event in active.feed_encoded(record)] if active else []

    def _ready(self, line: str | bytes) -> list[Any]:
        """The records the active converter may take now: this line's, with those read before the format
        became known; none for a blank or bad line, or while the format is unknown."""
        ok, record = self.parse(line)  # bytes parsed as they are: decoding each line first costs as much
        if not ok:
            ok, record = self._reread(line)
            if not ok:
                return []
        if self.active is not None:
            return [record]
        self.pending.append(record)
        found = detect(record)
        if not found:
            return []
        self.active = self.start(found)
        ready, self.pending = self.pending, []
        return ready

    def _reread(self, line: str | bytes) -> tuple[bool, Any]:
        """A line the parser refused, read as text: nothing for a blank one, the record of one whose bytes
        were not all UTF-8 (each bad byte read as U+FFFD), else a line counted as `bad_json`."""
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        if not text.strip():
            return False, None
        ok, record = self.parse(text) if isinstance(line, bytes) else (False, None)
        if not ok:
            self.outer.records += 1
            self.outer.skip("bad_json")
        return ok, record

    def finish(self) -> Stats:
        """The counts of the whole input; records whose format nothing told are skipped as unknown_format."""
        if self.active is None and self.pending:
            self.outer.records += len(self.pending)
            self.outer.skipped["unknown_format"] += len(self.pending)
            self.pending.clear()
        if self.active is None:
            return self.outer
        inner = self.active.stats
        inner.records += self.outer.records
        inner.skipped.update(self.outer.skipped)
        self.outer = Stats()  # counted once, even if finish is called again
        return inner
