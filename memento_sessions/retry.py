"""The one retry-with-backoff helper: a call tried again after an exponentially growing, capped pause.

Used wherever a backend may be briefly away (an anchor write, the snapshot schema's migration, a snapshot
store) so that every such loop backs off the same way; `backoff_delay` is also the clients' pause
between reconnects (the async client's, and the blocking one `ingest` sends through, which imports this
module without anyio: that import is made by `retry` itself).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
Retrying = Callable[[BaseException, float], None]  # told each failure and the pause before the next try


def backoff_delay(attempt: int, first: float, cap: float) -> float:
    """Exponential backoff with jitter: somewhere in the upper half of min(cap, first * 2**attempt)."""
    ceiling = exponential(attempt, first, cap)
    return random.uniform(ceiling / 2, ceiling)


def exponential(attempt: int, first: float, cap: float) -> float:
    """min(cap, first * 2**attempt), without jitter."""
    return min(cap, first * float(2 ** min(attempt, 30)))


async def retry(call: Callable[[], Awaitable[T]], on: tuple[type[BaseException], ...], *,
                attempts: int | None = None, first: float = 0.05, cap: float = 30.0, jitter: bool = True,
                retrying: Retrying | None = None) -> T:
    """`call()`'s result, trying again after an error in `on` (at most `attempts` tries; None: until it
    succeeds). The pause after try n (from 0) is min(cap, first * 2**n), in its upper half when `jitter`;
    the last error is raised as it is. Any other error ends the retries at once."""
    import anyio  # here: the blocking callers of backoff_delay start without it

    for attempt in itertools.count():
        try:
            return await call()
        except on as exc:
            if attempts is not None and attempt + 1 >= attempts:
                raise
            pause = backoff_delay(attempt, first, cap) if jitter else exponential(attempt, first, cap)
            if retrying is not None:
                retrying(exc, pause)
        await anyio.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover
