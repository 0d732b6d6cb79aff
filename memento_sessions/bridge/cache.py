"""Where each live session's breakages stand, kept between calls: `bridge.transitions` reads and decodes
only the events stored since its last call on the session.

A stored event never changes: one Redis Function call gives each event the next seq, and a session
re-created under the same id gets a new epoch. So the breakages found over a session's first N events
of an epoch stay true, and the fold that found them (timeline.BreakageFold) resumes at event N + 1
(a snapshot plus the events after it, as in event sourcing). Only the fold is kept, not the events:
holding thousands of decoded events made every full garbage collection walk them (100 ms pauses in
the bench). Bounded twice, least recently used session out first: by the breaking events held in all
(MEMENTO_BRIDGE_CACHE_EVENTS; each entry counts one more, so it bounds the sessions held too) and by
the bytes the entries hold (MEMENTO_BRIDGE_CACHE_BYTES: a breakage keeps its event's changeInfo and
impact, up to 64 KiB each, so a count alone bounds nothing). 0 in either turns the cache off.
docs/bridge.md has the figures.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from memento_sessions.bridge.timeline import Breakage, BreakageFold, Event
from memento_sessions.errors import NotFound
from memento_sessions.metrics import BRIDGE_CACHE_BYTES, BRIDGE_CACHE_EVICTIONS
from memento_sessions.sessions.manager import SessionManager

Hint = Callable[[list[tuple[str, ...]]], bool]  # given new breakages' windows: whether it started a query
CHUNK = 250  # events decoded and folded between two hints
DEFAULT_BYTES = 64 * 1024 * 1024
# Measured with sys.getsizeof on CPython 3.11: an Entry, its fold, the fold's window dict and the cache's
# key tuple and OrderedDict slot come to about 700 bytes; a held str costs 49 + its length (ASCII).
ENTRY_BYTES = 768
STR_BYTES = 56


@dataclass
class Entry:
    """One session's epoch, the last seq folded in, and the fold."""

    epoch: str
    last_seq: int = 0
    fold: BreakageFold = field(default_factory=BreakageFold)
    found_bytes: int = 0  # the held breakages' bytes, kept as they are found

    @property
    def size(self) -> int:
        """What the entry holds, counted in events: the breaking ones, plus one for the rest."""
        return len(self.fold.found) + 1

    def nbytes(self, key: tuple[str, str]) -> int:
        """What the entry holds under `key`, in bytes (an estimate a little above CPython's own count)."""
        window = sum(STR_BYTES + len(entity) for entity in self.fold.window)  # at most SUSPECTS entities
        return ENTRY_BYTES + self.found_bytes + window + sum(STR_BYTES + len(part) for part in (*key, self.epoch))

    def extend(self, fresh: list[Event]) -> None:
        """Fold in the events after the last one folded (a concurrent call may have folded some already)."""
        new = [event for event in fresh if int(event["seq"]) > self.last_seq]
        if new:
            held = len(self.fold.found)
            self.fold.feed(new)
            self.found_bytes += sum(STR_BYTES + len(item) for item in self.fold.found[held:])
            self.last_seq = int(new[-1]["seq"])


def decode(members: list[str]) -> list[Event]:
    """Stored event JSON to dicts, in one parser call (keys repeat across events, so only keys are cached)."""
    events: list[Event] = pydantic_core.from_json(f"[{','.join(members)}]", cache_strings="keys")
    return events


class EventCache:
    """Breakage folds by (namespace, session id), holding at most `limit` events and `max_bytes` bytes in all."""

    def __init__(self, limit: int, max_bytes: int = DEFAULT_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        # entry, and the events and bytes it was counted at
        self._entries: OrderedDict[tuple[str, str], tuple[Entry, int, int]] = OrderedDict()
        self.size = 0
        self.nbytes = 0

    async def read(self, manager: SessionManager, ns: str, session_id: str,
                   hint: Hint | None = None) -> tuple[dict[str, Any], Entry]:
        """The live session's view and its entry, brought up to date; NotFound once it expired.

        With `hint`, the new events are folded CHUNK at a time and the windows of the breakages each chunk
        found (the entry's earlier ones first) are handed to it; when it started a query, the loop gets a
        turn to send it before the next chunk (bridge/context.py).
        """
        key = (ns, session_id)
        held = self._get(key)
        session, members = await self._fetch(manager, key, held)
        entry = self._entry_for(key, held, session["epoch"])
        await fold(entry, members, hint)
        self._keep(key, entry)
        return session, entry

    async def _fetch(self, manager: SessionManager, key: tuple[str, str],
                     held: Entry | None) -> tuple[dict[str, Any], list[str]]:
        """The session and its raw events after `held`'s last seq; every event when it was re-created since."""
        ns, session_id = key
        try:
            session, members = await manager.read(ns, session_id, held.last_seq if held else 0)
            if held is not None and session["epoch"] != held.epoch:  # re-created since: start over
                session, members = await manager.read(ns, session_id)
        except NotFound:
            self._forget(key)
            raise
        return session, members

    def _entry_for(self, key: tuple[str, str], held: Entry | None, epoch: str) -> Entry:
        """The entry the fetched events continue: the one held now when it is of this epoch (another call may
        have replaced or evicted it meanwhile), else `held` when of this epoch, else a new one (a full read)."""
        entry = self._get(key)
        if entry is None or entry.epoch != epoch:
            entry = held if held is not None and held.epoch == epoch else Entry(epoch)
        return entry

    def _get(self, key: tuple[str, str]) -> Entry | None:
        held = self._entries.get(key)
        return held[0] if held else None

    def _keep(self, key: tuple[str, str], entry: Entry) -> None:
        self._forget(key)
        size, nbytes = entry.size, entry.nbytes(key)
        if size > self.limit or nbytes > self.max_bytes:
            BRIDGE_CACHE_EVICTIONS.inc()  # too big to keep at all: the next call reads the session afresh
            return
        self._entries[key] = (entry, size, nbytes)
        self.size += size
        self.nbytes += nbytes
        while self.size > self.limit or self.nbytes > self.max_bytes:
            _, (_, counted, counted_bytes) = self._entries.popitem(last=False)
            self.size -= counted
            self.nbytes -= counted_bytes
            BRIDGE_CACHE_EVICTIONS.inc()
        BRIDGE_CACHE_BYTES.set(self.nbytes)

    def _forget(self, key: tuple[str, str]) -> None:
        held = self._entries.pop(key, None)
        if held is not None:
            self.size -= held[1]
            self.nbytes -= held[2]


async def fold(entry: Entry, members: list[str], hint: Hint | None) -> None:
    """Decode and fold `members` into `entry` CHUNK at a time, handing each chunk's new breakage windows to
    `hint` and yielding to the loop when it started a query."""
    reported = 0
    for start in range(0, max(len(members), 1), CHUNK):
        entry.extend(decode(members[start:start + CHUNK]))
        if hint is None:
            continue
        found = entry.fold.found
        asked = hint([Breakage.load(item).window for item in found[reported:]])
        reported = len(found)
        if asked and start + CHUNK < len(members):
            await asyncio.sleep(0)  # the loop sends the query while this call folds on
