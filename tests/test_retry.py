"""memento_sessions.retry: the one backoff policy every backend retry and reconnect loop goes through."""

from __future__ import annotations

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from memento_sessions.embedded.process import free_port
from memento_sessions.errors import BackendUnavailable, NotFound
from memento_sessions.redisio.pipe import Pipe
from memento_sessions.retry import RECONNECT, Backoff, Failures, backoff_delay, exponential, retry

pytestmark = pytest.mark.anyio


class Flaky:
    """Fails `failures` times with `error`, then returns the number of calls."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0
        self.pauses: list[float] = []

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls

    def retrying(self, exc: BaseException, pause: float) -> None:
        assert exc is self.error
        self.pauses.append(pause)


async def test_retries_until_the_call_succeeds_with_doubling_capped_pauses() -> None:
    flaky = Flaky(5, BackendUnavailable("falkordb: away"))
    assert await retry(flaky, (BackendUnavailable,), first=0.001, cap=0.006, jitter=False,
                       retrying=flaky.retrying) == 6
    assert flaky.pauses == [0.001, 0.002, 0.004, 0.006, 0.006]


async def test_the_last_error_is_raised_after_the_attempts() -> None:
    flaky = Flaky(10, BackendUnavailable("falkordb: away"))
    with pytest.raises(BackendUnavailable) as raised:
        await retry(flaky, (BackendUnavailable,), attempts=3, first=0.001, jitter=False, retrying=flaky.retrying)
    assert raised.value is flaky.error
    assert flaky.calls == 3
    assert flaky.pauses == [0.001, 0.002]


async def test_an_error_not_named_is_raised_at_once() -> None:
    flaky = Flaky(1, NotFound("gone"))
    with pytest.raises(NotFound):
        await retry(flaky, (BackendUnavailable,), retrying=flaky.retrying)
    assert (flaky.calls, flaky.pauses) == (1, [])


async def test_jittered_pauses_lie_in_the_upper_half() -> None:
    flaky = Flaky(4, OSError("refused"))
    assert await retry(flaky, (OSError,), first=0.002, cap=0.01, retrying=flaky.retrying) == 5
    assert [0.001 <= p <= 0.002 for p in flaky.pauses[:1]] == [True]
    for attempt, pause in enumerate(flaky.pauses):
        assert exponential(attempt, 0.002, 0.01) / 2 <= pause <= exponential(attempt, 0.002, 0.01)


def test_backoff_delay_is_the_upper_half_of_min_cap_first_times_two_to_the_attempt() -> None:
    for attempt in range(8):
        ceiling = exponential(attempt, 0.1, 5.0)
        assert ceiling == min(5.0, 0.1 * 2**attempt)
        assert all(ceiling / 2 <= backoff_delay(attempt, 0.1, 5.0) <= ceiling for _ in range(50))


async def test_retry_takes_its_pauses_from_the_policy_it_is_given() -> None:
    flaky = Flaky(4, OSError("refused"))
    assert await retry(flaky, (OSError,), policy=Backoff(first=0.001, cap=0.003, jitter=False),
                       retrying=flaky.retrying) == 5
    assert flaky.pauses == [0.001, 0.002, 0.003, 0.003]


def test_a_reconnect_loops_pauses_grow_to_the_cap_and_start_over_after_a_success() -> None:
    failures = Failures(Backoff(first=0.05, cap=2.0))
    pauses = [failures.failed() for _ in range(10)]
    for attempt, pause in enumerate(pauses):
        assert exponential(attempt, 0.05, 2.0) / 2 <= pause <= exponential(attempt, 0.05, 2.0)
    assert all(1.0 <= pause <= 2.0 for pause in pauses[6:])  # capped: never more than 2 s, never a hot loop
    failures.succeeded()
    assert 0.025 <= failures.failed() <= 0.05
    assert (RECONNECT.first, RECONNECT.cap, RECONNECT.jitter) == (0.05, 2.0, True)


async def test_a_pipe_does_not_reconnect_before_its_policys_pause() -> None:
    # Nothing listens on the port: the first call's connect is refused; a call within the pause fails at once, saying
    # why and when the next connect goes (no connect of its own); after the pause a connect is tried again.
    pipe = Pipe(f"redis://127.0.0.1:{free_port()}", backoff=Backoff(first=0.5, cap=0.5, jitter=False))
    with pytest.raises(RedisConnectionError) as first:
        await pipe.call("PING")
    assert "cannot connect to Redis" in str(first.value) and "next try" not in str(first.value)
    with pytest.raises(RedisConnectionError) as within:
        await pipe.call("PING")
    assert str(within.value).startswith(f"{first.value} (next try in 0.")
    await anyio.sleep(0.55)
    with pytest.raises(RedisConnectionError) as after:
        await pipe.call("PING")
    assert str(after.value) == str(first.value)  # a real connect, refused again: the next pause starts now
    with pytest.raises(RedisConnectionError, match="next try in"):
        await pipe.call("PING")
    pipe.close()
