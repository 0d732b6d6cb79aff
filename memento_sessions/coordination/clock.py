"""Coordination's clock: epoch milliseconds (what the Functions compare) and their ISO-8601 form for clients.

Every mailbox message carries two timestamps and every lease reply one, so the formatted second is cached:
within a second `iso` only appends the milliseconds (strftime once a second, not per call).
"""

from __future__ import annotations

import functools
import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC (`2026-01-02T03:04:05.678Z`)."""
    return f"{_second(ms // 1000)}.{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=8)
def _second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
