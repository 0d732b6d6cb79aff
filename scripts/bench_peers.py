#!/usr/bin/env python3
"""The peers users would pick instead of memento, measured on a Redis and a Postgres given to it.

Runs inside the peers' own virtualenv (`scripts/bench.py --peers` creates it and calls this script
against its embedded servers); it imports neither memento_sessions nor anything of the project.
Prints one JSON line: for each peer its version, what was measured and the appends per second.

- OpenAI Agents SDK, `agents.extensions.memory.RedisSession.add_items([item])`: sequential on one
  session, and 64 concurrent agents each on its own session (one RedisSession per session id, the
  SDK's intended use; a shared session id would add WATCH retries, so this is the peer's best case).
- Google ADK, `google.adk.sessions.DatabaseSessionService.append_event` on Postgres through
  SQLAlchemy's `postgresql+asyncpg` driver, sequential on one session, in a database of its own.

The payload is the JSON object given with --payload (bench.py's PAYLOAD): the RedisSession item is
that object itself (the SDK stores any JSON item as is); the ADK Event carries it as
`custom_metadata`, with `author` set, which ADK stores inside the event's JSON row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any

ADK_DATABASE = "memento_bench_adk"
REDIS_PREFIX = "memento-bench-peers:agents"
WARM_UP = 10


async def rate(count: int, work: Callable[[int], Awaitable[Any]]) -> float:
    """Calls per second of `count` sequential calls of `work`."""
    start = time.perf_counter()
    for i in range(count):
        await work(i)
    return count / (time.perf_counter() - start)


async def redis_commands(client: Any) -> int:
    """Commands the server has run so far, less INFO (this probe's own)."""
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def concurrently(agents: int, per_agent: int, work: Callable[[int], Awaitable[Any]]) -> float:
    """Calls per second of `agents` tasks, each calling `work(agent)` `per_agent` times, timed together."""
    async def agent(n: int) -> None:
        for _ in range(per_agent):
            await work(n)

    start = time.perf_counter()
    await asyncio.gather(*(agent(n) for n in range(agents)))
    return agents * per_agent / (time.perf_counter() - start)


# --- OpenAI Agents SDK: RedisSession ----------------------------------------------------------------------


async def agents_sdk(redis_url: str, payload: dict[str, Any], sequential: int, agents: int,
                     per_agent: int) -> dict[str, Any]:
    import redis.asyncio as aioredis
    from agents.extensions.memory import RedisSession

    client = aioredis.Redis.from_url(redis_url)
    run = uuid.uuid4().hex[:8]
    try:
        one = RedisSession(f"{run}-seq", redis_client=client, key_prefix=REDIS_PREFIX)
        await rate(WARM_UP, lambda _: one.add_items([payload]))
        seq = await rate(sequential, lambda _: one.add_items([payload]))
        before = await redis_commands(client)  # untimed: what one add_items costs the server
        await rate(WARM_UP, lambda _: one.add_items([payload]))
        per_append = (await redis_commands(client) - before) / WARM_UP
        many = [RedisSession(f"{run}-agent{n}", redis_client=client, key_prefix=REDIS_PREFIX)
                for n in range(agents)]
        conc = await concurrently(agents, per_agent, lambda n: many[n].add_items([payload])) if agents else None
        stored = len(await one.get_items())
    finally:
        await client.aclose()
    if stored != 2 * WARM_UP + sequential:
        raise RuntimeError(f"RedisSession holds {stored} items, expected {2 * WARM_UP + sequential}")
    return {"version": version("openai-agents"), "api": "RedisSession.add_items([item])",
            "client": f"redis-py {version('redis')} with hiredis {version('hiredis')}",
            "payload_as": "the item itself", "sequential_per_s": seq, "sequential_count": sequential,
            "redis_commands_per_append": per_append,
            "concurrent_per_s": conc, "concurrent_agents": agents, "concurrent_per_agent": per_agent,
            "concurrent_shape": "one session per agent"}


# --- Google ADK: DatabaseSessionService ---------------------------------------------------------------------


async def fresh_database(dsn: str) -> str:
    """Create an empty database for ADK on the same Postgres; its SQLAlchemy asyncpg URL."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {ADK_DATABASE}")
        await conn.execute(f"CREATE DATABASE {ADK_DATABASE}")
    finally:
        await conn.close()
    base = dsn.split("://", 1)[1].rsplit("/", 1)[0]
    return f"postgresql+asyncpg://{base}/{ADK_DATABASE}"


async def adk(postgres_dsn: str, payload: dict[str, Any], sequential: int) -> dict[str, Any]:
    from google.adk.events import Event
    from google.adk.sessions import DatabaseSessionService

    url = await fresh_database(postgres_dsn)
    async with DatabaseSessionService(db_url=url) as service:
        session = await service.create_session(app_name="bench", user_id="bench")

        def append(_: int) -> Awaitable[Event]:
            appended: Awaitable[Event] = service.append_event(session, Event(author="bench", custom_metadata=payload))
            return appended

        await rate(WARM_UP, append)
        seq = await rate(sequential, append)
        statements = await sql_statements(service, lambda: rate(WARM_UP, append)) / WARM_UP
        stored = await service.get_session(app_name="bench", user_id="bench", session_id=session.id)
    if stored is None or len(stored.events) != 2 * WARM_UP + sequential:
        raise RuntimeError(f"ADK session holds {stored and len(stored.events)} events, "
                           f"expected {2 * WARM_UP + sequential}")
    return {"version": version("google-adk"), "api": "DatabaseSessionService.append_event(session, Event)",
            "payload_as": "Event.custom_metadata", "driver": "postgresql+asyncpg",
            "sequential_per_s": seq, "sequential_count": sequential, "sql_statements_per_append": statements}


async def sql_statements(service: Any, work: Callable[[], Awaitable[Any]]) -> int:
    """SQL statements the driver executes during `work` (counted untimed: the hook costs a call each)."""
    from sqlalchemy import event

    count = 0

    def counted(*_: Any) -> None:
        nonlocal count
        count += 1

    event.listen(service.db_engine.sync_engine, "before_cursor_execute", counted)
    try:
        await work()
    finally:
        event.remove(service.db_engine.sync_engine, "before_cursor_execute", counted)
    return count


async def main(args: argparse.Namespace) -> None:
    payload = json.loads(args.payload)
    result = {
        "agents_sdk": await agents_sdk(args.redis_url, payload, args.sequential, args.agents, args.per_agent),
        "adk": await adk(args.postgres_dsn, payload, args.adk_sequential),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--postgres-dsn", required=True, help="postgresql://user@host:port/db")
    parser.add_argument("--payload", required=True, help="the event payload, a JSON object")
    parser.add_argument("--sequential", type=int, default=300, help="RedisSession sequential appends")
    parser.add_argument("--agents", type=int, default=64, help="RedisSession concurrent agents (0: none)")
    parser.add_argument("--per-agent", type=int, default=5, help="RedisSession appends per concurrent agent")
    parser.add_argument("--adk-sequential", type=int, default=300, help="ADK sequential appends")
    asyncio.run(main(parser.parse_args()))
