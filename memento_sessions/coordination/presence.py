"""Presence: which agents are in a session, active or idle, across every daemon on one Redis.

An agent is present in a session while one of its connections has joined or subscribed to it, and for
MEMENTO_PRESENCE_VISIT seconds after it joined or emitted there any other way (an MCP tool call, the Claude Code
hook's or ingest's short connections: a visit, ended early by session.leave). Each
daemon writes, per session, one field per agent it serves (`<agentId>/<daemonId>`: connections, last
request, heartbeat) and refreshes it every heartbeat; a field whose heartbeat is older than STALE_BEATS
heartbeats belongs to a daemon that died and counts as gone. The same heartbeat keeps each connected
agent's `alive` score fresh, which is what keeps its leases from being orphaned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pydantic_core
from redis.exceptions import ResponseError

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE, out_of_memory
from memento_sessions.coordination.store import CoordStore
from memento_sessions.errors import Forbidden
from memento_sessions.logs import get_logger, one_pass
from memento_sessions.rpc import Call, Peer, encode_notification
from memento_sessions.sessions.manager import iso, now_ms
from memento_sessions.settings import Settings

log = get_logger(__name__)
Result = dict[str, Any]
STALE_BEATS = 3  # heartbeats missed before another daemon's field counts as gone
MAX_VISITS = 100_000  # visits one daemon keeps (the oldest made dropped past it)
ALIVE_BATCH = 1000  # agents per ZADD of the heartbeat: one call stays short for Redis's other clients
WRITE_BATCH = 256  # presence fields a beat writes at once (their commands share the pipelined connection's writes)
POOLED_BATCH = 8  # at once without that connection (each concurrent command takes a pooled connection)
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]



@dataclass
class Conn:
    """One local connection that made a request: its agent and the sessions it is present in."""

    namespace: str
    agent: str
    peer: Peer
    last_request: int
    sessions: set[str] = field(default_factory=set)
    idle: bool = False


class Presence:
    """This daemon's side of presence, and presence.get over every daemon's fields."""

    def __init__(self, store: CoordStore, settings: Settings, daemon_id: str) -> None:
        self.store = store
        self.daemon = daemon_id
        self.idle_ms = int(settings.presence_idle * 1000)
        # A beat well inside both the idle time and the orphan grace, so neither is judged on stale data.
        self.beat = min(5.0, settings.presence_idle / 3, settings.lease_orphan_grace / 3)
        self.conns: dict[str, Conn] = {}
        self.seen: set[tuple[str, str]] = set()  # agents that called without a connection (MCP) since the last beat
        self._token_roles: dict[tuple[str, str], tuple[frozenset[str], float]] = {}  # written: roles, until when
        self.visit_ms = int(settings.presence_visit * 1000)
        self.visits: dict[tuple[str, str, str], int] = {}  # (namespace, session, agent) -> its last visit (ms)
        self.spawn: Spawn | None = None

    def touch(self, call: Call) -> Conn | None:
        """A request: the caller is active (again); returns its connection's state (None over MCP)."""
        who, peer = call.identity, call.peer
        if peer is None:
            self.seen.add((who.namespace, who.agent_id))
            return None
        conn = self.conns.get(peer.conn_id)
        if conn is None:
            return None
        conn.last_request = now_ms()
        if conn.idle:
            conn.idle = False
            self._later(lambda: self._publish_all(conn, "active"))
        return conn

    def connect(self, call: Call) -> Conn:
        """A new connection: track it until it closes."""
        assert call.peer is not None
        conn = Conn(call.identity.namespace, call.identity.agent_id, call.peer, now_ms())
        self.conns[call.peer.conn_id] = conn
        call.peer.on_close(lambda: self._closed(conn))
        return conn

    async def enter(self, conn: Conn, session_id: str) -> None:
        """The connection joined or subscribed to the session."""
        if session_id in conn.sessions:
            return
        before = await self._present(conn.namespace, session_id, conn.agent)
        conn.sessions.add(session_id)
        self.visits.pop((conn.namespace, session_id, conn.agent), None)  # the connection stands for it from now
        await self._write(conn.namespace, session_id, conn.agent)
        if not before:
            await self._publish(conn.namespace, session_id, conn.agent, "joined")

    async def visit(self, namespace: str, session_id: str, agent: str) -> None:
        """The agent joined or emitted in the session without a connection staying there: present for
        MEMENTO_PRESENCE_VISIT seconds from now. Only a new visit costs Redis calls; the beat refreshes the rest."""
        key = (namespace, session_id, agent)
        new = key not in self.visits
        self.visits[key] = now_ms()
        if len(self.visits) > MAX_VISITS:
            self.visits.pop(next(iter(self.visits)))  # the oldest visit made (its field expires by itself)
        if new:
            before = await self._present(namespace, session_id, agent)
            await self._write(namespace, session_id, agent)
            if not before:
                await self._publish(namespace, session_id, agent, "joined")

    async def unvisit(self, namespace: str, session_id: str, agent: str) -> None:
        """The agent left the session: its visit ends now."""
        if self.visits.pop((namespace, session_id, agent), None) is not None:
            await self._gone(namespace, session_id, agent)

    async def _end_visits(self, now: int) -> None:
        """Visits older than MEMENTO_PRESENCE_VISIT end (`left` when nothing else keeps the agent there)."""
        for key in [key for key, at in self.visits.items() if now - at >= self.visit_ms]:
            del self.visits[key]
            await self._gone(*key)

    async def exit(self, conn: Conn, session_id: str) -> None:
        """The connection left or unsubscribed from the session."""
        if session_id in conn.sessions:
            conn.sessions.discard(session_id)
            await self._gone(conn.namespace, session_id, conn.agent)

    def _closed(self, conn: Conn) -> None:
        if self.conns.pop(conn.peer.conn_id, None) is None:
            return
        sessions, conn.sessions = conn.sessions, set()
        self._later(lambda: self._leave_all(conn, sessions))

    async def _leave_all(self, conn: Conn, sessions: set[str]) -> None:
        await self.store.command("ZADD", keys.lease_keys(conn.namespace).alive, "GT", now_ms(), conn.agent)
        for session_id in sessions:
            await self._gone(conn.namespace, session_id, conn.agent)

    async def _gone(self, namespace: str, session_id: str, agent: str) -> None:
        await self._write(namespace, session_id, agent)
        if not await self._present(namespace, session_id, agent):
            await self._publish(namespace, session_id, agent, "left")

    def _local(self, namespace: str, session_id: str, agent: str, among: Iterable[Conn] | None = None) -> list[Conn]:
        """The agent's open connections in the session: among all of this daemon's, or among `among` (a beat's
        grouping, so a beat is one pass over the connections, not one per field)."""
        if among is None:
            return [c for c in self.conns.values()
                    if c.agent == agent and c.namespace == namespace and session_id in c.sessions]
        return [c for c in among if session_id in c.sessions]  # a closed connection's sessions are emptied

    async def _write(self, namespace: str, session_id: str, agent: str, among: Iterable[Conn] | None = None) -> None:
        """This daemon's field of the agent in the session: written while it has connections there, else removed."""
        key, name, local = keys.presence_key(namespace, session_id), f"{agent}/{self.daemon}", \
            self._local(namespace, session_id, agent, among)
        visit = self.visits.get((namespace, session_id, agent))
        if not local and visit is None:
            await self.store.command("HDEL", key, name)
            return
        last = max([c.last_request for c in local] + [visit or 0])
        value = pydantic_core.to_json({"c": len(local), "r": last, "h": now_ms()})
        await self.store.command("HSET", key, name, value.decode())
        await self.store.command("PEXPIRE", key, int(self.beat * 1000 * STALE_BEATS * 4))

    async def _present(self, namespace: str, session_id: str, agent: str) -> bool:
        """Whether the agent has a live field in the session on any daemon. Only its own fields are read (HSCAN
        MATCH `<agent>/*`): reading and decoding the whole hash made each of 1,000 subscribes to one session
        cost in proportion to the subscribers before it. An agent id holds no glob character and no '/' (auth.py)."""
        key, pattern, cursor, now = keys.presence_key(namespace, session_id), f"{agent}/*", 0, now_ms()
        while True:
            cursor, fields = scanned(await self.store.command("HSCAN", key, cursor, "MATCH", pattern, "COUNT", 1000))
            if any(self._live(pydantic_core.from_json(raw), now) for raw in fields.values()):
                return True
            if cursor == 0:
                return False

    def _live(self, value: dict[str, Any], now: int) -> bool:
        """A field is live while its daemon beats: gone once STALE_BEATS heartbeats old."""
        return bool(value["h"] >= now - self.beat * 1000 * STALE_BEATS)

    async def agents(self, namespace: str, session_id: str) -> list[Result]:
        """presence.get: every agent with a live field, its connections summed and its last request."""
        fields = await self.store.command("HGETALL", keys.presence_key(namespace, session_id))
        pairs = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) else dict(fields)
        now, merged = now_ms(), dict[str, dict[str, Any]]()
        for name, raw in pairs.items():
            value = pydantic_core.from_json(raw)
            if not self._live(value, now):
                continue
            agent = str(name).rpartition("/")[0]
            seen = merged.setdefault(agent, {"agentId": agent, "connections": 0, "r": 0})
            seen["connections"] += value["c"]
            seen["r"] = max(seen["r"], value["r"])
        return [{"agentId": a["agentId"], "status": "active" if now - a["r"] < self.idle_ms else "idle",
                 "lastSeen": iso(a["r"]), "connections": a["connections"]} for a in sorted(merged.values(),
                                                                                     key=lambda a: a["agentId"])]

    async def _publish(self, namespace: str, session_id: str, agent: str, status: str) -> None:
        frame = encode_notification("session.presence", {"sessionId": session_id, "agentId": agent, "status": status})
        await self.store.command(self.store.session_publish, keys.session_channel(namespace, session_id),
                                 frame.decode())

    async def _publish_all(self, conn: Conn, status: str) -> None:
        for session_id in list(conn.sessions):
            await self._publish(conn.namespace, session_id, conn.agent, status)

    def _later(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work()` in the coordination task group. The coroutine is made only once a task runs it: with no
        task group (before run, after it ends at shutdown) the update is dropped, never left unawaited."""
        async def run() -> None:
            try:
                await work()
            except UNAVAILABLE as exc:
                log.warning("presence update lost: Redis unavailable", error=repr(exc))
            except ResponseError as exc:  # a Redis at its maxmemory refuses the write: lost, not fatal
                if not out_of_memory(exc):
                    raise
                log.warning("presence update lost: Redis out of memory", error=repr(exc))
        if self.spawn is not None:
            self.spawn(run)

    async def heartbeat(self) -> None:
        """Forever: refresh this daemon's fields and its agents' liveness, and announce agents gone idle."""
        while True:
            await anyio.sleep(self.beat)
            await one_pass(self.beat_once, "presence heartbeat", UNAVAILABLE)

    async def beat_once(self) -> None:
        """One heartbeat."""
        now = now_ms()
        alive = {(c.namespace, c.agent) for c in self.conns.values()} | self.seen
        self.seen = set()
        await self._keep_alive(alive, now)
        await self._end_visits(now)
        await self._write_fields(self._fields())
        for conn in list(self.conns.values()):
            if not conn.idle and now - conn.last_request >= self.idle_ms:
                conn.idle = True
                if conn.sessions:
                    await self._publish_all(conn, "idle")

    def _fields(self) -> dict[tuple[str, str, str], list[Conn]]:
        """Each (namespace, session, agent) field this daemon keeps, with its connections: one pass, no await
        (so no subscribe changes a set while it is read); most of 10,000 idle connections are in no session."""
        fields: dict[tuple[str, str, str], list[Conn]] = {}
        for conn in self.conns.values():
            for session_id in conn.sessions:
                fields.setdefault((conn.namespace, session_id, conn.agent), []).append(conn)
        for key in self.visits:
            fields.setdefault(key, [])
        return fields

    async def _write_fields(self, fields: dict[tuple[str, str, str], list[Conn]]) -> None:
        """Refresh the fields WRITE_BATCH at a time, concurrently: their commands go out together on the
        pipelined connection instead of two round trips each, one after the other (1,000 connections in
        sessions: a beat of 230-390 ms became 27-35 ms). Each field is computed when its write goes out, so a
        connection closed meanwhile is not counted. A Redis outage is raised once."""
        items, failed = list(fields.items()), []
        batch = WRITE_BATCH if self.store.pipe is not None else POOLED_BATCH

        async def write(field_key: tuple[str, str, str], conns: list[Conn]) -> None:
            try:
                await self._write(*field_key, among=conns)
            except UNAVAILABLE as exc:
                failed.append(exc)

        for start in range(0, len(items), batch):
            async with anyio.create_task_group() as tg:
                for field_key, conns in items[start:start + batch]:
                    tg.start_soon(write, field_key, conns)
            if failed:
                raise failed[0]

    async def _keep_alive(self, alive: Iterable[tuple[str, str]], now: int) -> None:
        """Refresh every live agent's `alive` score: one ZADD per namespace and ALIVE_BATCH agents, not one per
        agent (10,000 connected agents made 20,000 Redis calls a beat)."""
        by_namespace: dict[str, list[str]] = {}
        for namespace, agent in alive:
            by_namespace.setdefault(namespace, []).append(agent)
        for namespace, agents in by_namespace.items():
            key = keys.lease_keys(namespace).alive
            for start in range(0, len(agents), ALIVE_BATCH):
                pairs = [item for agent in agents[start:start + ALIVE_BATCH] for item in (now, agent)]
                await self.store.command("ZADD", key, "GT", *pairs)
            await self.store.command("EXPIRE", key, 7200)

    async def set_roles(self, who: Identity, roles: list[str]) -> Result:
        """Declare the caller's roles (replacing those it declared before; its token's roles stay): mailbox.send
        to `role:<name>` reaches it. A role some token grants is the tokens' alone: declaring it without holding
        it is Forbidden, naming it."""
        namespace, agent = who.namespace, who.agent_id
        declared = [role for role in dict.fromkeys(roles) if role not in who.roles]
        if declared:
            granted = await self.store.command("SMISMEMBER", keys.token_roles(namespace), *declared)
            taken = [role for role, by_token in zip(declared, granted, strict=True) if by_token]
            if taken:
                raise Forbidden("roles granted by tokens cannot be declared", [
                    {"field": f"roles.{roles.index(role)}", "message": f"{role!r} is granted by tokens and this "
                     "token does not grant it"} for role in taken])
        old = await self.store.command("HGET", keys.agent_roles(namespace), agent)
        gone = [role for role in (old or "").split(",") if role and role not in declared]
        await asyncio.gather(
            *(self.store.command("SREM", keys.declared_members(namespace, role), agent) for role in gone),
            *(call for role in declared for call in (
                self.store.command("SADD", keys.declared_members(namespace, role), agent),
                self.store.command("EXPIRE", keys.declared_members(namespace, role), ROLE_TTL))),
            self.store.command("HSET", keys.agent_roles(namespace), agent, ",".join(declared)),
            self.store.command("EXPIRE", keys.agent_roles(namespace), ROLE_TTL))
        return {"agentId": agent, "roles": sorted(set(roles) | who.roles)}

    async def token_roles(self, who: Identity) -> None:
        """Make the agent a member of its token's roles, and those roles the tokens' (no presence.set claims them);
        written once per process and agent (again when its roles differ or ROLE_REFRESH has passed), so a
        connect or an MCP call costs no Redis call after that."""
        if not who.roles:
            return
        agent, now = (who.namespace, who.agent_id), time.monotonic()
        known = self._token_roles.get(agent)
        if known is not None and known[0] == who.roles and known[1] > now:
            return
        await asyncio.gather(self._add_roles(who.namespace, who.agent_id, who.roles),
                             self.store.command("SADD", keys.token_roles(who.namespace), *sorted(who.roles)),
                             self.store.command("EXPIRE", keys.token_roles(who.namespace), ROLE_TTL))
        if len(self._token_roles) >= MAX_REMEMBERED:
            self._token_roles.clear()
        self._token_roles[agent] = (who.roles, now + ROLE_REFRESH)

    async def _add_roles(self, namespace: str, agent: str, roles: Iterable[str]) -> None:
        await asyncio.gather(*(call for role in roles for call in (
            self.store.command("SADD", keys.role_members(namespace, role), agent),
            self.store.command("EXPIRE", keys.role_members(namespace, role), ROLE_TTL))))


def scanned(reply: Any) -> tuple[int, dict[Any, Any]]:
    """An HSCAN reply as (next cursor, {field: value}): a flat list over the pipe, a dict from redis-py."""
    cursor, found = reply
    pairs = dict(zip(found[::2], found[1::2], strict=True)) if isinstance(found, list) else dict(found)
    return int(cursor), pairs


ROLE_TTL = 7 * 86400  # seconds a role is kept after it was last declared (or its token last seen)
ROLE_REFRESH = 3600.0  # seconds between two writes of one agent's token roles by one daemon
MAX_REMEMBERED = 100_000  # agents whose token roles one daemon remembers as written (cleared past it)
