"""What every stored event must be, read back from Redis: the rules of the door, checked after the fact.

A stored event is strict JSON (no NaN/Infinity words), every number in it is finite and at most 1e12
in magnitude, no id in it (session, event, entity, test, actor) holds a control character, no string
holds NUL or an unpaired surrogate, and its client fields still pass the event model (so no stored
event can poison a later checkpoint or query).
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterator
from typing import Any

import pydantic

from memento_sessions.keys import session_index, session_keys
from memento_sessions.sessions.models import EventIn

MAX_NUMBER = 1e12
SERVER_FIELDS = ("seq", "sessionId", "epoch")


def _no_constants(word: str) -> float:
    raise ValueError(f"stored JSON holds {word}")


def numbers(value: Any) -> Iterator[float]:
    """Every number anywhere inside `value`."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers(item)


def strings(value: Any) -> Iterator[str]:
    """Every string anywhere inside `value`, object keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def unstorable(text: str) -> bool:
    """NUL (Postgres JSONB refuses it) or an unpaired surrogate (no UTF-8 for it) anywhere in a string."""
    return "\x00" in text or any(0xD800 <= ord(char) <= 0xDFFF for char in text)


def has_control(text: str) -> bool:
    """True when `text` holds a control character (Unicode category Cc: C0, DEL, C1)."""
    return any(unicodedata.category(char) == "Cc" for char in text)


def ids_of(event: dict[str, Any]) -> list[str]:
    """The ids an event carries."""
    change = event.get("changeInfo") or {}
    impact = event.get("impact") or {}
    found = [event.get("id"), event.get("actor"), event.get("sessionId")]
    return [str(i) for i in [*found, *change.get("entityIds", []), *impact.get("testsFailed", [])] if i is not None]


def problems(raw: str | bytes) -> list[str]:
    """What is wrong with one stored event's JSON (empty when it is fine)."""
    try:
        event = json.loads(raw, parse_constant=_no_constants)
    except ValueError as exc:
        return [f"not strict JSON: {exc}"]
    found = [f"number {n!r} out of bounds" for n in numbers(event) if not math.isfinite(n) or abs(n) > MAX_NUMBER]
    found += [f"control character in id {i!r}" for i in ids_of(event) if has_control(i)]
    found += [f"unstorable string {text[:40]!r}" for text in strings(event) if unstorable(text)]
    client = {name: value for name, value in event.items() if name not in SERVER_FIELDS}
    try:
        EventIn.model_validate(client)
    except pydantic.ValidationError as exc:
        found.append(f"fails the event rules: {exc.errors(include_url=False)[:3]}")
    return found


async def stored_events(redis: Any, namespace: str) -> dict[str, list[bytes]]:
    """Every stored event of every session in the namespace's index, by session id."""
    sessions = [sid.decode() for sid in await redis.zrange(session_index(namespace), 0, -1)]
    return {sid: await redis.zrange(session_keys(namespace, sid).events, 0, -1) for sid in sessions}
