"""Token buckets: each key has its own, a refused take says when to retry, the number of keys is bounded."""

from __future__ import annotations

import pytest

from memento_sessions.errors import RateLimited
from memento_sessions.limits import Buckets


def test_each_agent_has_its_own_bucket_and_a_refusal_says_when_to_retry() -> None:
    buckets = Buckets(rate=2.0)
    buckets.take("alice")
    buckets.take("alice")
    with pytest.raises(RateLimited) as refused:
        buckets.take("alice")
    assert refused.value.code == -32029
    assert 0 < refused.value.data["retryAfterMs"] <= 501 and refused.value.data["limit"] == 2.0
    buckets.take("bob")  # alice's empty bucket is not bob's


def test_at_most_keep_agents_are_held_least_recently_used_first() -> None:
    buckets = Buckets(rate=1.0, keep=2)
    buckets.take("alice")
    buckets.take("bob")
    with pytest.raises(RateLimited):
        buckets.take("alice")  # alice is now the most recently used
    buckets.take("carol")  # pushes out bob, the least recently used
    assert list(buckets._buckets) == ["alice", "carol"]
    with pytest.raises(RateLimited):
        buckets.take("alice")  # still held, still empty
