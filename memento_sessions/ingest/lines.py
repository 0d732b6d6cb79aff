"""JSON Lines to events: parse each line, pick the converter by format, count what could not be read.

No I/O: the caller reads the file (or stdin) and passes its lines; a truncated or non-JSON line is
counted as `bad_json` and skipped, never the end of the ingest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from memento_sessions.ingest.claude_code import ClaudeCodeTranscript
from memento_sessions.ingest.claude_hooks import ClaudeHooks
from memento_sessions.ingest.events import Converter, Event, Stats
from memento_sessions.ingest.opencode import OpenCode
from memento_sessions.ingest.stream_json import StreamJson

FORMATS: dict[str, type[Converter]] = {"claude-code": ClaudeCodeTranscript, "stream-json": StreamJson,
                                       "opencode": OpenCode, "hook": ClaudeHooks}
_TRANSCRIPT_ONLY = frozenset({"file-history-snapshot", "queue-operation", "progress", "summary"})


@dataclass
class Conversion:
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


def parse(line: str) -> tuple[bool, Any]:
    """(True, value) for a line of JSON, (False, None) for a line that is not (truncated, garbage)."""
    try:
        return True, json.loads(line)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return False, None


def convert_lines(lines: Iterable[str | bytes], fmt: str = "auto", project_root: str | None = None) -> Conversion:
    """Every event of a JSON Lines input; `fmt` "auto" picks the format from the first record that tells."""
    events: list[Event] = []
    pending: list[Any] = []  # records read before the format is known
    stats, active = Stats(), None if fmt == "auto" else converter(fmt, project_root)
    for line in lines:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        if not text.strip():
            continue
        ok, record = parse(text)
        if not ok:
            stats.records += 1
            stats.skip("bad_json")
        elif active is None:
            pending.append(record)
            found = detect(record)
            active = converter(found, project_root) if found else None
            events += _drain(active, pending) if active else []
        else:
            events += active.feed(record)
    if active is None and pending:  # nothing told the format
        stats.records += len(pending)
        stats.skipped["unknown_format"] += len(pending)
    return Conversion(events, _merge(stats, active.stats if active else None))


def _drain(active: Converter, pending: list[Any]) -> list[Event]:
    events = [event for record in pending for event in active.feed(record)]
    pending.clear()
    return events


def _merge(outer: Stats, inner: Stats | None) -> Stats:
    if inner is None:
        return outer
    inner.records += outer.records
    inner.skipped.update(outer.skipped)
    return inner
