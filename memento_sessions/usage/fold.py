"""A batch of stored events as usage ops for the `mu_fold` Function (library.py). Pure code.

A run is one prompt's turn: it opens at a `query:started` event and takes every `usage` event and finished
tool call stored after it, until the next run opens. `query:completed` or `query:failed` ends it and may
carry what the source counted for the whole run (stream-json: `totalCostUsd`, `durationMs`, `usage`), which
replaces what its messages added up to. A run's duration runs from its prompt to its end, or to its last
usage report or finished tool call. Ops name the event's seq, so a batch folded after a later one still
lands in its own run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from memento_sessions.ingest.usage import ANTHROPIC, FIELDS, USAGE

Op = dict[str, Any]
SHORT = dict(zip(FIELDS, ("in", "out", "cr", "cc"), strict=True))
ENDS = frozenset({"query:completed", "query:failed"})
MAX_COUNT = 10**9  # per op: no one report can push a Redis counter near its 64-bit end
MAX_MODEL = 128


class Stored(Protocol):
    """What the fold reads of an event (sessions.models.EventIn has it)."""

    id: str | None
    type: str
    timestamp: datetime | None
    data: dict[str, Any] | None


def relevant(event: Stored) -> bool:
    """Whether an event says anything about usage (most do not: they cost the emit nothing more)."""
    kind = event.type
    return kind in ENDS or kind == "query:started" or kind == USAGE or (kind == "block:upsert" and tool_done(event))


def tool_done(event: Stored) -> bool:
    """A tool-use block upserted as complete: one finished tool call."""
    block = (event.data or {}).get("block")
    return isinstance(block, dict) and block.get("kind") == "tool_use" and block.get("status") == "complete"


def ops_of(stored: Iterable[tuple[int, Stored]], now_ms: int) -> list[Op]:
    """The ops of the stored (not duplicate) events of one emit, as (seq, event), in order."""
    ops = []
    for seq, event in stored:
        op = op_of(seq, event, now_ms)
        if op is not None:
            ops.append(op)
    return ops


def op_of(seq: int, event: Stored, now_ms: int) -> Op | None:
    """One event's op, or None when it says nothing about usage."""
    at = millis(event.timestamp)
    data = event.data or {}
    if event.type == "query:started" and not data.get("subagentId"):
        return {"op": "start", "seq": seq, "run": event.id or f"seq{seq}", "at": now_ms if at is None else at}
    if event.type == USAGE:
        return reported(seq, at, data)
    if event.type in ENDS:
        return ended(seq, at, data)
    if event.type == "block:upsert" and tool_done(event):
        return with_at({"op": "add", "seq": seq, "tools": 1}, at)
    return None


def reported(seq: int, at: int | None, data: Mapping[str, Any]) -> Op:
    """A `usage` event: tokens (and cost) added to its run."""
    op: Op = {"op": "add", "seq": seq}
    for field, short in SHORT.items():
        op[short] = count(data.get(field), signed=True)
    op["calls"] = count(data.get("apiCalls"))
    if model := model_of(data.get("model")):
        op["model"] = model
    if (cost := money(data.get("costUsd"), signed=True)) is not None:
        op["cost"] = cost
    return with_at(op, at)


def ended(seq: int, at: int | None, data: Mapping[str, Any]) -> Op:
    """The end of a run, with what the source counted for the whole of it."""
    op: Op = {"op": "end", "seq": seq}
    if (cost := money(data.get("totalCostUsd"))) is not None:
        op["cost"] = cost
    if isinstance(data.get("durationMs"), int | float) and not isinstance(data.get("durationMs"), bool):
        op["dur"] = count(data["durationMs"])
    usage = data.get("usage")
    if isinstance(usage, dict):
        op["set"] = {short: count(usage.get(name)) for short, name in zip(SHORT.values(), ANTHROPIC, strict=True)
                     if name in usage}
    return with_at(op, at)


def with_at(op: Op, at: int | None) -> Op:
    """The op with its time, when the event has one (an event without one never stretches a run)."""
    if at is not None:
        op["at"] = at
    return op


def millis(stamp: datetime | None) -> int | None:
    """Epoch milliseconds of a timestamp."""
    return None if stamp is None else int(stamp.timestamp() * 1000)


def count(value: Any, *, signed: bool = False) -> int:
    """A whole count within ±MAX_COUNT (0 for anything else); negative only where `signed` (a correction)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return int(max(min(value, MAX_COUNT), -MAX_COUNT if signed else 0))


def money(value: Any, *, signed: bool = False) -> float | None:
    """A cost in USD within ±MAX_COUNT, or None where the source gives none."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(max(min(value, MAX_COUNT), -MAX_COUNT if signed else 0.0))


def model_of(value: Any) -> str | None:
    """A model name, cut to MAX_MODEL characters; None for anything else."""
    return value[:MAX_MODEL] if isinstance(value, str) and value else None
