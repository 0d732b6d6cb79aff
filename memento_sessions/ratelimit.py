"""A token bucket per connection: a client over its rate gets -32029, and nothing it asked for runs."""

from __future__ import annotations

import time

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
