"""Token buckets: a client over its rate gets -32029, and nothing it asked for runs.

A WebSocket connection has its own bucket (gateway.py); MCP tool calls, which arrive as separate HTTP
requests, share one bucket per agent (`Buckets`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable

from memento_sessions.errors import RateLimited


class TokenBucket:
    """`rate` requests a second on average, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> None:
        """Spend one token, or raise RateLimited saying when the next one comes."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            wait_ms = int((1.0 - self.tokens) / self.rate * 1000) + 1
            raise RateLimited("rate limited", {"retryAfterMs": wait_ms, "limit": self.rate})
        self.tokens -= 1.0


class Buckets:
    """One TokenBucket per key (an agent), for at most `keep` keys: the least recently used goes first.

    An agent pushed out starts again with a full bucket, so the bound can let one extra burst through;
    it keeps a daemon's memory flat whatever the number of agents.
    """

    def __init__(self, rate: float, keep: int = 10_000) -> None:
        self.rate, self.keep = rate, keep
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def take(self, key: Hashable) -> None:
        """Spend one of `key`'s tokens, or raise RateLimited."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.rate)
            if len(self._buckets) > self.keep:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        bucket.take()
