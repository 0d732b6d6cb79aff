"""Which session produced a commit: `commit` events (the hook records a Bash `git commit`, cli/gitstate.py) noted
per namespace as they are stored, and `bridge.commit {sha}` to look one up by its SHA or a prefix of it.

The index keeps at most MEMENTO_COMMITS_MAX commits per namespace (the oldest noted dropped first) for 30 days
after its last write; the first session to report a commit keeps it. Three keys under one hash tag.
"""

from __future__ import annotations

import time
from typing import Any

import pydantic_core

from memento_sessions import keys
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.errors import InvalidParams, NotFound
from memento_sessions.logs import get_logger
from memento_sessions.sessions.manager import iso, now_ms
from memento_sessions.sessions.models import EventIn

log = get_logger(__name__)
Result = dict[str, Any]
COMMIT_TYPE = "commit"  # the hook's event type (gitstate.COMMIT_TYPE)
KEEP = 30 * 86400


def commit_sha(event: EventIn) -> str | None:
    """The SHA a `commit` event names (None for any other event)."""
    sha = (event.data or {}).get("sha") if event.type == COMMIT_TYPE else None
    return sha if isinstance(sha, str) and 7 <= len(sha) <= 64 and all(c in "0123456789abcdef" for c in sha) else None


class Commits:
    """The namespace's commit index over the daemon's Redis."""

    def __init__(self, redis: Any, max_commits: int) -> None:
        self.redis = redis
        self.max_commits = max_commits

    async def note(self, namespace: str, session_id: str, seq: int, sha: str, agent: str) -> None:
        """Record that `session_id` produced `sha` (unless a session did already). The event is stored: a
        Redis failure here is logged, not returned (the emit's retry would be a duplicate, noted by nobody)."""
        try:
            await self._note(namespace, session_id, seq, sha, agent)
        except UNAVAILABLE as exc:
            log.warning("commit not noted: Redis unavailable", sha=sha, session_id=session_id, error=repr(exc))

    async def _note(self, namespace: str, session_id: str, seq: int, sha: str, agent: str) -> None:
        records, by_sha, by_time = keys.commit_keys(namespace)
        record = {"sha": sha, "sessionId": session_id, "seq": seq, "agentId": agent, "recordedAt": iso(now_ms())}
        if not await self.redis.hsetnx(records, sha, pydantic_core.to_json(record).decode()):
            return
        await self.redis.zadd(by_sha, {sha: 0})
        await self.redis.zadd(by_time, {sha: time.time()})
        excess = await self.redis.zcard(by_time) - self.max_commits
        if excess > 0:
            gone = [member for member, _ in await self.redis.zpopmin(by_time, excess)]
            await self.redis.hdel(records, *gone)
            await self.redis.zrem(by_sha, *gone)
        for key in (records, by_sha, by_time):
            await self.redis.expire(key, KEEP)

    async def find(self, namespace: str, sha: str) -> Result:
        """The session that produced the commit `sha` (a full SHA or a prefix of one)."""
        records, by_sha, _ = keys.commit_keys(namespace)
        found = await self.redis.zrangebylex(by_sha, f"[{sha}", f"[{sha}\xff", start=0, num=2)
        if not found:
            raise NotFound(f"no session recorded commit {sha}", {"sha": sha})
        if len(found) > 1:
            raise InvalidParams("invalid params", [{"field": "sha", "message": f"{sha} names more than one "
                                                                                "commit: give more digits"}])
        raw = await self.redis.hget(records, found[0])
        if raw is None:
            raise NotFound(f"no session recorded commit {sha}", {"sha": sha})
        result: Result = pydantic_core.from_json(raw)
        return result
