"""The auto-pipelined connection of the hot path, against the real embedded Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio
import pytest
import redis
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memento_sessions.endpoints import Endpoints
from memento_sessions.sessions.pipe import Pipe

pytestmark = pytest.mark.anyio


@pytest.fixture
def plain(backend_urls: Endpoints) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(backend_urls.redis_url)
    yield client
    client.close()


async def test_calls_of_one_loop_turn_share_a_write_and_get_their_own_replies(backend_urls: Endpoints,
                                                                            namespace: str) -> None:
    pipe = Pipe(backend_urls.redis_url)
    key = f"{namespace}:counter"
    replies = await asyncio.gather(*(pipe.call("INCR", key) for _ in range(200)))
    assert sorted(replies) == list(range(1, 201)) and replies == list(range(1, 201)), "in order, one each"
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await pipe.call("HGET", key, "field")
    assert await pipe.call("GET", key) == "200", "an error reply leaves the connection usable"
    pipe.close()
    pipe.close()


async def test_a_killed_connection_fails_pending_calls_and_the_next_call_reconnects(
        backend_urls: Endpoints, plain: redis.Redis, namespace: str) -> None:
    pipe = Pipe(backend_urls.redis_url)
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
    from memento_sessions.sessions import pipe as pipe_module

    monkeypatch.setattr(pipe_module, "CALL_TIMEOUT", 0.5)
    pipe = Pipe(backend_urls.redis_url)
    started = anyio.current_time()
    with pytest.raises(RedisTimeoutError, match="no reply"):
        await pipe.call("BLPOP", f"{namespace}:never", 0)
    assert 0.5 < anyio.current_time() - started < 3.0
    assert await pipe.call("PING") == "PONG"
    pipe.close()
