"""How long the client waits before reconnecting, and how often a retried call is sent again."""

from __future__ import annotations

import random

RETRIES = 5  # times `Client.call(..., retry=True)` is sent again after losing its connection


def backoff_delay(attempt: int, first: float, cap: float) -> float:
    """Exponential backoff with jitter: somewhere in the upper half of min(cap, first * 2**attempt)."""
    ceiling = min(cap, first * 2 ** min(attempt, 30))
    return random.uniform(ceiling / 2, ceiling)
