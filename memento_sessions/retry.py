"""The one backoff policy, as a value: every retry and reconnect loop pauses as its `Backoff` says.

A `Backoff` (first pause, cap, jitter) is passed to the loops that use it, as redis-py passes its `Retry`:
`retry(call, on, policy=...)` for a call tried again, `Backoff.delay(n)` for the pause after the n-th
failure in a row of a reconnect loop (the fan-out's pub/sub connection, each cluster shard's, the hot
path's connections), and `backoff_delay` for the clients' pause between reconnects (the async client's,
and the blocking one `ingest` sends through, which imports this module without anyio: that import is
made by `retry` itself). RECONNECT is the policy of the daemon's own connections to Redis.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
Retrying = Callable[[BaseException, float], None]  # told each failure and the pause before the next try


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: the pause after failure n (from 0) is min(cap, first * 2**n), in its upper
    half when `jitter` (so that daemons that lost Redis together do not come back in step)."""

    first: float = 0.05
    cap: float = 30.0
    jitter: bool = True

    def delay(self, attempt: int) -> float:
        """The pause after failure `attempt` (0 for the first)."""
        ceiling = exponential(attempt, self.first, self.cap)
        return random.uniform(ceiling / 2, ceiling) if self.jitter else ceiling


RECONNECT = Backoff(first=0.05, cap=2.0)  # the daemon's connections to Redis: back within 2 s of its return


def backoff_delay(attempt: int, first: float, cap: float) -> float:
    """Exponential backoff with jitter: somewhere in the upper half of min(cap, first * 2**attempt)."""
    return Backoff(first, cap).delay(attempt)


def exponential(attempt: int, first: float, cap: float) -> float:
    """min(cap, first * 2**attempt), without jitter."""
    return min(cap, first * float(2 ** min(attempt, 30)))


async def retry(call: Callable[[], Awaitable[T]], on: tuple[type[BaseException], ...], *,
                attempts: int | None = None, first: float = 0.05, cap: float = 30.0, jitter: bool = True,
                policy: Backoff | None = None, retrying: Retrying | None = None) -> T:
    """`call()`'s result, trying again after an error in `on` (at most `attempts` tries; None: until it
    succeeds). The pauses are `policy`'s (by default Backoff(first, cap, jitter)); the last error is raised
    as it is. Any other error ends the retries at once."""
    import anyio  # here: the blocking callers of backoff_delay start without it

    policy = policy or Backoff(first, cap, jitter)
    for attempt in itertools.count():
        try:
            return await call()
        except on as exc:
            if attempts is not None and attempt + 1 >= attempts:
                raise
            pause = policy.delay(attempt)
            if retrying is not None:
                retrying(exc, pause)
        await anyio.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


class Failures:
    """A reconnect loop's failures in a row, and the pause its policy gives after the latest.

    A loop sleeps the pause `failed()` returns; a connection opened on demand (by whichever call needs it)
    instead notes the failure with `refuse(error)` and fails the calls of the pause at once (`refusal()`).
    """

    def __init__(self, policy: Backoff = RECONNECT) -> None:
        self.policy = policy
        self.count = 0
        self.until = 0.0  # time.monotonic() before which `refusal` refuses a try
        self.reason = ""

    def failed(self) -> float:
        """Count one more failure; the pause before the next try."""
        self.count += 1
        return self.policy.delay(self.count - 1)

    def succeeded(self) -> None:
        """The connection held: the next failure starts the backoff over."""
        self.count, self.until = 0, 0.0

    def refuse(self, error: BaseException) -> None:
        """Count one more failure, and refuse tries until its pause has passed."""
        self.until, self.reason = time.monotonic() + self.failed(), str(error)

    def refusal(self) -> str | None:
        """Why a try now is refused (the last failure, and when the next try may go), or None."""
        wait = self.until - time.monotonic()
        return f"{self.reason} (next try in {wait:.2f}s)" if wait > 0 else None
