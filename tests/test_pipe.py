"""The auto-pipelined connection of the hot path, against the real embedded Redis."""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Iterator

import anyio
import hiredis
import pytest
import redis
import uvloop
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memento_sessions.endpoints import Endpoints
from memento_sessions.redisio.pipe import LARGE_CALL, Pipe
from memento_sessions.redisio.resp import Address

pytestmark = pytest.mark.anyio


@pytest.fixture
def plain(backend_urls: Endpoints) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(backend_urls.redis_url)
    yield client
    client.close()


@pytest.mark.parametrize("spin_us", [0, 250])
async def test_calls_of_one_loop_turn_share_a_write_and_get_their_own_replies(backend_urls: Endpoints,
                                                                            namespace: str, spin_us: int) -> None:
    pipe = Pipe(backend_urls.redis_url, spin_us)
    key = f"{namespace}:counter"
    replies = await asyncio.gather(*(pipe.call("INCR", key) for _ in range(200)))
    assert sorted(replies) == list(range(1, 201)) and replies == list(range(1, 201)), "in order, one each"
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await pipe.call("HGET", key, "field")
    assert await pipe.call("GET", key) == "200", "an error reply leaves the connection usable"
    pipe.close()
    pipe.close()


@pytest.mark.parametrize("spin_us", [0, 250])
async def test_a_large_call_does_not_hold_up_the_small_calls_sent_after_it(backend_urls: Endpoints, namespace: str,
                                                                          spin_us: int) -> None:
    """A command of LARGE_CALL bytes or more (a batch of events) goes on a connection of its own: behind it on the
    shared one, a small call would wait for Redis to read and run it. Here the large call is a BLPOP that waits
    2 s on a 64 KiB key: a PING sent after it is answered meanwhile."""
    pipe = Pipe(backend_urls.redis_url, spin_us)
    assert await pipe.call("PING") == "PONG"
    large = asyncio.ensure_future(pipe.call("BLPOP", f"{namespace}:" + "k" * LARGE_CALL, 2))
    await anyio.sleep(0.1)
    with anyio.fail_after(1.0):
        assert await pipe.call("PING") == "PONG"
    assert not large.done()
    assert await large is None, "the large call answered in its turn"
    pipe.close()


@pytest.mark.parametrize("spin_us", [0, 500_000])
async def test_a_killed_connection_fails_pending_calls_and_the_next_call_reconnects(
        backend_urls: Endpoints, plain: redis.Redis, namespace: str, spin_us: int) -> None:
    pipe = Pipe(backend_urls.redis_url, spin_us)  # with a spin, the kill lands while the loop polls
    await pipe.call("CLIENT", "SETNAME", f"{namespace}-pipe")
    blocked = asyncio.ensure_future(pipe.call("BLPOP", f"{namespace}:never", 0))
    await anyio.sleep(0.1)
    for client in plain.client_list():
        if client["name"] == f"{namespace}-pipe":
            plain.client_kill_filter(_id=client["id"])
    with pytest.raises(RedisConnectionError, match="lost"):
        await blocked
    assert await pipe.call("PING") == "PONG"
    pipe.close()


def test_it_runs_on_uvloop_as_the_daemon_does(backend_urls: Endpoints) -> None:
    async def ping() -> str:
        pipe = Pipe(backend_urls.redis_url)
        try:
            reply: str = await pipe.call("PING")
            return reply
        finally:
            pipe.close()

    assert uvloop.run(ping()) == "PONG"


async def test_an_unreachable_redis_is_a_connection_error() -> None:
    with pytest.raises(RedisConnectionError, match="cannot connect"):
        await Pipe("redis://127.0.0.1:1/0").call("PING")


async def test_an_overdue_reply_fails_the_call_and_the_next_call_uses_a_new_connection(
        backend_urls: Endpoints, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from memento_sessions.redisio import pipe as pipe_module

    monkeypatch.setattr(pipe_module, "CALL_TIMEOUT", 0.5)
    pipe = Pipe(backend_urls.redis_url)
    started = anyio.current_time()
    with pytest.raises(RedisTimeoutError, match="no reply"):
        await pipe.call("BLPOP", f"{namespace}:never", 0)
    assert 0.5 < anyio.current_time() - started < 3.0
    assert await pipe.call("PING") == "PONG"
    pipe.close()


def spin_counts() -> tuple[float, float]:
    return (REGISTRY.get_sample_value("memento_redis_spins_total") or 0.0,
            REGISTRY.get_sample_value("memento_redis_spin_misses_total") or 0.0)


@pytest.fixture
def apart(plain: redis.Redis) -> Iterator[None]:
    """This thread on one CPU and Redis on another, as when both wait on each other across vCPUs (the
    scheduler may otherwise run them on one CPU, where Redis preempts the caller and no one sleeps)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    redis_pid = int(plain.info("server")["process_id"])
    try:
        redis_cpus = os.sched_getaffinity(redis_pid)
        os.sched_setaffinity(redis_pid, {cpus[1]})
    except OSError:  # a Redis of MEMENTO_TEST_REDIS_URL or in a container: not a process of this machine's
        pytest.skip("the test Redis is not a local process this test may pin")
    try:
        os.sched_setaffinity(0, {cpus[0]})
        yield
    finally:
        os.sched_setaffinity(0, cpus)
        os.sched_setaffinity(redis_pid, redis_cpus)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_spinning_pipe_catches_sequential_replies_while_the_loop_polls(backend_urls: Endpoints, namespace: str,
                                                                         loop: str, apart: None) -> None:
    """A thread that sleeps in the kernel (the loop's epoll_wait) makes a voluntary context switch: without
    the spin the loop sleeps until most replies, with it it never sleeps on these calls.

    Without the spin, a reply that is already in when the loop gets to epoll_wait costs no sleep: on a host
    that takes the vCPU between the write and the wait (seen in CI: 12 and 40 sleeps of 50, against 49-50
    here) most replies are. That count is the control showing the measure sees sleeps at all, so it is taken
    over up to three rounds, the best one counting, and asks for half the calls.
    """
    async def sequential(spin_us: int, key: str) -> tuple[list[int], int]:
        pipe = Pipe(backend_urls.redis_url, spin_us)
        try:
            await pipe.call("PING")  # connect
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            replies = [await pipe.call("INCR", f"{namespace}:{loop}:{key}") for _ in range(50)]
            return replies, resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
        finally:
            pipe.close()

    run = uvloop.run if loop == "uvloop" else asyncio.run
    spins, misses = spin_counts()
    rounds: list[int] = []
    while len(rounds) < 3 and (not rounds or max(rounds) < 45):
        replies, slept = run(sequential(0, f"off{len(rounds)}"))
        assert replies == list(range(1, 51))
        rounds.append(slept)
    assert max(rounds) >= 25, f"without the spin the loop sleeps until each reply (of 50, per round: {rounds})"
    assert spin_counts() == (spins, misses), "no spin counted with MEMENTO_REDIS_SPIN_US=0"
    replies, slept = run(sequential(5000, "on"))
    assert replies == list(range(1, 51))
    now_spins, now_misses = spin_counts()
    handshake = 2 if Address.parse(backend_urls.redis_url).auth else 1  # PING, after AUTH when Redis has a password
    assert now_spins - spins == 50 + handshake, "every call on the idle connection spun"
    assert now_misses - misses <= 5, "replies within 5 ms are caught while the loop polls"
    assert slept <= 5, f"the loop slept {slept} times in 50 calls while spinning"


async def test_a_reply_slower_than_the_spin_is_still_delivered_and_counted_as_a_miss(backend_urls: Endpoints,
                                                                                    namespace: str) -> None:
    pipe = Pipe(backend_urls.redis_url, 1000)
    await pipe.call("PING")
    spins, misses = spin_counts()
    assert await pipe.call("BLPOP", f"{namespace}:empty", 0.05) is None, "Redis answers nil after 50 ms"
    assert spin_counts() == (spins + 1, misses + 1), "the 1 ms spin ran out; the loop slept until the reply"
    assert await pipe.call("PING") == "PONG"
    pipe.close()


async def test_other_tasks_run_while_the_loop_polls_for_a_reply(backend_urls: Endpoints, namespace: str) -> None:
    pipe = Pipe(backend_urls.redis_url, 200_000)
    await pipe.call("PING")
    turns = 0
    replies: list[int] = []

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def incr_soon() -> None:
        await anyio.sleep(0.01)  # sent while the BLPOP below is outstanding: goes out after it, in order
        replies.append(await pipe.call("INCR", f"{namespace}:n"))

    task = asyncio.ensure_future(ticker())
    try:
        both = asyncio.gather(pipe.call("BLPOP", f"{namespace}:empty", 0.05), incr_soon())
        assert list(await both) == [None, None]
    finally:
        task.cancel()
    assert replies == [1]
    assert turns > 100, f"the loop ran the ticker {turns} times during the 50 ms spin"
    pipe.close()


async def test_a_reply_the_spin_cannot_parse_fails_the_call_and_the_next_call_reconnects(
        backend_urls: Endpoints) -> None:
    """Real Redis, our own parser made to reject what it is fed: the spin's read treats it as the
    transport treats a bad read, the end of that connection."""
    class Refusing:
        def feed(self, data: bytes) -> None:
            raise hiredis.ProtocolError("refused by the test")

    pipe = Pipe(backend_urls.redis_url, 200_000)
    await pipe.call("PING")
    assert pipe._protocol is not None
    pipe._protocol.reader = Refusing()  # type: ignore[assignment]
    with pytest.raises(RedisConnectionError, match=r"bad reply from Redis: .*refused by the test"):
        await pipe.call("PING")
    assert await pipe.call("PING") == "PONG", "a new connection, with a real parser"
    pipe.close()


@pytest.mark.parametrize("reply", ["LOADING Redis is loading the dataset in memory", "CLUSTERDOWN The cluster is down",
                                   "TRYAGAIN Multiple keys request during rehashing of slot"])
def test_a_redis_that_cannot_serve_now_raises_an_unavailability_error_from_the_pipe(reply: str) -> None:
    """Every background loop and the RPC layer treat these as 'backend unavailable, try again'; raised raw, a
    CLUSTERDOWN during a failover escaped the lease reaper and stopped the daemon."""
    from redis.exceptions import ResponseError

    from memento_sessions.backends import UNAVAILABLE
    from memento_sessions.redisio.pipe import not_answering

    assert isinstance(not_answering(ResponseError(reply)), UNAVAILABLE)
    assert not isinstance(not_answering(ResponseError("ERR unknown command")), UNAVAILABLE)
