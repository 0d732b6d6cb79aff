"""Reading usage: a session's, an agent's or a namespace's totals, and a page of runs oldest first.

Runs are listed by the time they started; `since` (epoch ms) skips those started before it and `cursor`
(`<start ms>:<member>` of the last row of a page) continues after that row.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.usage.store import COUNTS, SOURCES, totals_of

ROW_FIELDS = ("runId", "source", "model", "durationMs", "inputTokens", "outputTokens", "cacheReadTokens",
              "cacheCreationTokens", "toolCalls", "apiCalls")


def iso_ms(ms: float) -> str:
    """An ISO-8601 UTC time of epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def row_of(raw: str | bytes, session_id: str | None) -> dict[str, Any]:
    """A stored run as clients see it: cost null where the source gave none."""
    stored = json.loads(raw)
    row: dict[str, Any] = {name: stored.get(name) for name in ROW_FIELDS}
    if session_id is not None:
        row["sessionId"] = session_id
    row["startedAt"] = iso_ms(stored.get("startedAt", 0))
    cost = stored.get("costUsd")
    row["costUsd"] = round(float(cost), 9) if cost is not None else None
    row["ended"] = bool(stored.get("ended"))
    return row


async def session_totals(redis: aioredis.Redis, ns: str, session_id: str) -> dict[str, Any]:
    """A session's `{totals, bySource}`."""
    return totals_of(await redis.hgetall(keys.usage_keys(ns, session_id).totals))


async def agent_share(redis: aioredis.Redis, ns: str, session_id: str, agent_id: str,
                      kept: int) -> dict[str, Any] | None:
    """An agent's share of a session's totals (what its own emits and telemetry added), or None when the
    session keeps no share for it: `kept` (MEMENTO_USAGE_AGENTS_PER_SESSION) other agents came first."""
    names = [f"{source}:{name}" for source in SOURCES for name in (*COUNTS, "costUsd")]
    values = await redis.hmget(keys.usage_keys(ns, session_id).agents,
                               [f"{agent_id} {name}" for name in names] + [f"{agent_id} seen", "#agents"])
    *counts, seen, count = values
    if seen is None and int(count or 0) >= kept:
        return None
    return totals_of({name: value for name, value in zip(names, counts, strict=True) if value is not None})


async def namespace_totals(redis: aioredis.Redis, ns: str) -> dict[str, Any]:
    """The namespace's `{totals, bySource}`."""
    return totals_of(await redis.hgetall(keys.namespace_usage(ns)))


async def page_members(redis: aioredis.Redis, order: str, since: int, cursor: str | None,
                       limit: int) -> tuple[list[tuple[str, float]], str | None]:
    """Up to `limit` (member, start ms) of an order ZSET after `since` and `cursor`, and the next cursor."""
    low, after = since, None
    if cursor is not None:
        ms, _, after = cursor.partition(":")
        low = max(low, int(ms))
    tied = await redis.zcount(order, low, low) if after is not None else 0
    found: list[tuple[str, float]] = await redis.zrangebyscore(  # type: ignore[assignment]
        order, low, "+inf", start=0, num=limit + 1 + tied, withscores=True)
    if after is not None:
        found = [(member, score) for member, score in found if score > low or member > after]
    more = len(found) > limit
    found = found[:limit]
    return found, (f"{int(found[-1][1])}:{found[-1][0]}" if more else None)


async def session_usage(redis: aioredis.Redis, ns: str, session_id: str, since: int, cursor: str | None,
                        limit: int) -> dict[str, Any]:
    """A session's totals and a page of its runs."""
    ukeys = keys.usage_keys(ns, session_id)
    members, next_cursor = await page_members(redis, ukeys.order, since, cursor, limit)
    raws = await redis.hmget(ukeys.runs, [member for member, _ in members]) if members else []
    runs = [row_of(raw, session_id) for raw in raws if raw is not None]
    result = {"sessionId": session_id, **await session_totals(redis, ns, session_id), "runs": runs}
    return {**result, "nextCursor": next_cursor} if next_cursor else result


async def agent_usage(redis: aioredis.Redis, ns: str, agent_id: str, since: int, cursor: str | None,
                      limit: int) -> dict[str, Any]:
    """An agent's totals and a page of its runs across sessions (a run its session dropped is left out)."""
    totals_key, order = keys.agent_usage_keys(ns, agent_id)
    members, next_cursor = await page_members(redis, order, since, cursor, limit)
    pairs = [member.partition(" ")[::2] for member, _ in members]
    async with redis.pipeline(transaction=False) as pipe:
        for session_id, run_id in pairs:
            pipe.hget(keys.usage_keys(ns, session_id).runs, run_id)
        raws = await pipe.execute() if pairs else []
    runs = [row_of(raw, sid) for (sid, _), raw in zip(pairs, raws, strict=True) if raw is not None]
    result = {"agentId": agent_id, **totals_of(await redis.hgetall(totals_key)), "runs": runs}
    return {**result, "nextCursor": next_cursor} if next_cursor else result
