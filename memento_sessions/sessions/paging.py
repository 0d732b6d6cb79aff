"""Bounded replies: a page stops at a count and at a byte budget, whichever comes first.

A reply larger than the connection's send buffer would close it (4008), and decoding a huge one would
hold the event loop; so every list a client can ask for is cut into pages it fetches with a cursor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
import redis.asyncio as aioredis

from memento_sessions.keys import SessionKeys
from memento_sessions.sessions.frames import MEMBER_HEAD, member_seq
from memento_sessions.sessions.models import MAX_EVENT_BYTES

PAGE = 1000  # items in a reply when the client gives no limit
CHUNK = 200  # events read from Redis per round trip while filling a page


def page_bytes(send_buffer: int) -> int:
    """The byte budget of one page's items: a quarter of the send buffer, room for the rest of the reply
    and for frames already queued on the connection."""
    return send_buffer // 4


def size_of(item: Any) -> int:
    """Encoded size in bytes of a raw stored member (str/bytes) or of a value."""
    if isinstance(item, bytes):
        return len(item)
    if isinstance(item, str):
        return len(item.encode())
    return len(pydantic_core.to_json(item))


@dataclass
class Page:
    """Items taken until `limit` items or `budget` bytes; `more` once something had to be left out.

    The first item is always taken, so a page never comes back empty while items remain.
    """

    limit: int
    budget: int
    items: list[Any] = field(default_factory=list)
    used: int = 0
    more: bool = False

    def add(self, item: Any, size: int | None = None) -> bool:
        """Take `item` if it fits; False (and `more`) when the page is done."""
        size = size_of(item) if size is None else size
        if len(self.items) >= self.limit or (self.items and self.used + size > self.budget):
            self.more = True
            return False
        self.items.append(item)
        self.used += size
        return True

    def room(self) -> int:
        """How many more items the count allows."""
        return self.limit - len(self.items)


def seq_of(member: str | bytes) -> int:
    """The seq of a stored event member: the Function writes it first, `{"seq":N,...`."""
    text = member.decode() if isinstance(member, bytes) else member
    if text.startswith(MEMBER_HEAD):
        return member_seq(text)
    return int(pydantic_core.from_json(text)["seq"])


def per_read(chunk_bytes: int) -> int:
    """Events read from Redis per round trip: as many as fit a chunk at the largest event size."""
    return max(1, chunk_bytes // MAX_EVENT_BYTES)


async def redis_events(redis: aioredis.Redis, skeys: SessionKeys, after: int, upto: int | None,
                       count: int) -> AsyncIterator[list[str]]:
    """The session's stored events with `after` < seq (<= `upto`), `count` per round trip."""
    top = "+inf" if upto is None else str(upto)
    while True:
        members: list[Any] = await redis.zrangebyscore(skeys.events, f"({after}", top, start=0, num=count)
        if not members:
            return
        yield members
        after = seq_of(members[-1])
        if len(members) < count:
            return
