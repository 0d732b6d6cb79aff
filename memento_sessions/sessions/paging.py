"""Bounded replies: a page stops at a count and at a byte budget, whichever comes first.

A reply larger than the connection's send buffer would close it (4008), and decoding a huge one would
hold the event loop; so every list a client can ask for is cut into pages it fetches with a cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from memento_sessions.sessions.frames import MEMBER_HEAD, member_seq

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
