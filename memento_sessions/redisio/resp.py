"""Where a Redis URL points, and a raw asyncio connection to it (for sessions/pipe.py and pubsub.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote, urlparse

import anyio
import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError

CONNECT_TIMEOUT = 2.0
P = TypeVar("P", bound=asyncio.Protocol)


def pack(args: tuple[str | int | float, ...]) -> bytes:
    """A RESP command (hiredis packs it in C; its stub types the tuple as one element)."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]
    return packed


@dataclass(frozen=True)
class Address:
    """A `redis://`, `rediss://` or `unix://` URL, taken apart."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    tls: bool = False
    db: int = 0
    auth: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, url: str) -> Address:
        parsed = urlparse(url)
        auth = tuple(unquote(x) for x in (parsed.username, parsed.password) if x)
        if parsed.scheme == "unix":
            return cls(path=parsed.path, auth=auth)
        db = int(parsed.path.strip("/") or 0)
        return cls(parsed.hostname or "127.0.0.1", parsed.port or 6379, None, parsed.scheme == "rediss", db, auth)

    def __str__(self) -> str:
        return self.path or f"{self.host}:{self.port}"


async def connect(address: Address, factory: Callable[[], P]) -> P:
    """Open the connection (TLS or unix socket as the URL says) within CONNECT_TIMEOUT."""
    loop = asyncio.get_running_loop()
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            if address.path:
                _, protocol = await loop.create_unix_connection(factory, address.path)
            else:
                context = ssl.create_default_context() if address.tls else None
                _, protocol = await loop.create_connection(factory, address.host, address.port, ssl=context)
    except (OSError, TimeoutError) as exc:
        raise RedisConnectionError(f"cannot connect to Redis at {address}: {exc}") from None
    return protocol
