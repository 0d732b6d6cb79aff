"""A namespace of its own for the isolation sections: its tokens and connections, and heavy sessions in it.

A heavy session is filled in this process (the SessionManager writes Redis as the daemon would), so the
daemon under measurement has done none of the work before the request that is timed or weighed. The
bench removes what it made with UNLINK, which frees a large value off Redis's main thread: the clean-up
of one load never stalls the next measurement.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from websockets.asyncio.client import connect

from bench.harness import SECRET, Env, Rpc
from memento_sessions import keys
from memento_sessions.auth import Identity, issue_token
from memento_sessions.history.views import History
from memento_sessions.sessions.models import EventIn

SCOPES = "sessions:read sessions:write kg:write"
BLOB = 15_000  # characters of an event's data: under the 16 KB a `data` may hold encoded
BATCH, SNAPSHOT_EVERY = 100, 1000
MB = 1_000_000


@dataclass(frozen=True)
class Tenant:
    """A namespace and what acting in it takes."""

    namespace: str

    @classmethod
    def new(cls, role: str) -> Tenant:
        """A namespace no earlier run used: `<role>-<8 hex>`."""
        return cls(f"{role}-{uuid.uuid4().hex[:8]}")

    def token(self, agent: str) -> str:
        """A token for `agent` in this namespace."""
        return issue_token(SECRET, agent, self.namespace, SCOPES, 3600)

    def who(self, agent: str = "tenant") -> Identity:
        """The identity in-process calls act as."""
        return Identity(agent, self.namespace, frozenset({"sessions:read", "sessions:write"}))


@asynccontextmanager
async def tenant_ws(env: Env, tenant: Tenant, agent: str, port: int = 0) -> AsyncIterator[Rpc]:
    """A WebSocket connection to the daemon (the run's, or the one on `port`) as `agent` of `tenant`."""
    url = f"ws://127.0.0.1:{port or env.port}/ws?token={tenant.token(agent)}"
    async with connect(url, max_size=2**26, max_queue=None, compression=None, ping_interval=None,
                       close_timeout=2) as conn:
        yield Rpc(conn)


def heavy_event(n: int) -> EventIn:
    """An event of about BLOB bytes (its data), on one of 64 files."""
    return EventIn.model_validate({"type": "modified", "changeInfo": {"entityIds": [f"file:{n % 64}"]},
                                   "data": {"blob": "x" * BLOB}})


async def heavy_session(env: Env, tenant: Tenant, megabytes: float) -> tuple[str, int]:
    """A new session of about `megabytes` MB of events, a snapshot every SNAPSHOT_EVERY; its id and seq."""
    manager = env.manager()
    history = History(manager, postgres=False)
    sid = str((await manager.create(tenant.who()))["sessionId"])
    count = max(1, int(megabytes * MB / BLOB))
    for done in range(0, count, BATCH):
        await manager.emit_batch(tenant.who(), sid, [heavy_event(done + n) for n in range(min(BATCH, count - done))])
        if (done + BATCH) % SNAPSHOT_EVERY == 0:
            await history.snapshot(tenant.namespace, sid)
    return sid, count


async def session_mb(env: Env, tenant: Tenant, sid: str) -> float:
    """MB Redis holds for the session's events and ids (snapshots included), by MEMORY USAGE."""
    skeys = keys.session_keys(tenant.namespace, sid)
    sizes = [await env.redis.memory_usage(key, samples=0) for key in (skeys.events, skeys.ids)]
    return sum(size or 0 for size in sizes) / MB


async def unlink_session(env: Env, tenant: Tenant, sid: str) -> None:
    """Remove a session the bench made (its keys and its place in the index), freed off Redis's main thread."""
    await env.redis.unlink(*keys.session_keys(tenant.namespace, sid).all())
    await env.redis.zrem(keys.session_index(tenant.namespace), sid)
