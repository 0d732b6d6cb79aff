"""The coordination service: presence, leases, mailboxes and alerts over one daemon's Redis and graph."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from anyio.abc import TaskStatus

from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.coordination.alerts import Alerts
from memento_sessions.coordination.intents import Intents
from memento_sessions.coordination.leases import Leases
from memento_sessions.coordination.mailbox import Mailbox
from memento_sessions.coordination.outcomes import Outcomes
from memento_sessions.coordination.presence import Conn, Presence
from memento_sessions.coordination.store import CoordStore
from memento_sessions.kg.graph import Graphs
from memento_sessions.logs import get_logger
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.manager import SessionManager, replica_acks
from memento_sessions.settings import Settings

log = get_logger(__name__)


class Coordination:
    """Everything coordination keeps per daemon; `run` keeps its heartbeat and reaper going."""

    def __init__(self, manager: SessionManager, fanout: Fanout | None, graphs: Graphs | None, settings: Settings,
                 daemon_id: str) -> None:
        self.manager, self.settings = manager, settings
        self.store = CoordStore(manager.redis, manager.store.pipe, replica_acks(settings))
        self.presence = Presence(self.store, settings, daemon_id)
        self.leases = Leases(self.store, graphs, settings)
        self.mailbox = Mailbox(self.store, settings, fanout)
        self.alerts = Alerts(self.leases, self.mailbox, manager)
        self.outcomes = Outcomes(self.leases, self.mailbox, manager)
        self.intents = Intents(self.leases, self.mailbox, graphs, settings.intent_max_expanded)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load the library, then beat and reap until cancelled."""
        try:
            await self.store.load()
        except UNAVAILABLE as exc:
            log.warning("coordination library not loaded yet; Redis unavailable", error=repr(exc))
        try:
            async with anyio.create_task_group() as tg:
                self.presence.spawn = self.mailbox.spawn = lambda work: tg.start_soon(work)
                tg.start_soon(self.presence.heartbeat)
                tg.start_soon(self.leases.reaper)
                task_status.started()
        finally:
            # connections closing after this (shutdown) start no task in a dead group
            self.presence.spawn = self.mailbox.spawn = None

    async def connect(self, call: Call) -> None:
        """A new connection (the gateway runs this connect hook of the registry before it accepts the WebSocket):
        from now on its agent is present and live (presence, lease liveness), gets its mailbox messages and
        lease conflicts pushed, and is reached by messages to its token's roles; it need not send anything."""
        if call.peer is None or call.peer.conn_id in self.presence.conns:
            return
        self.presence.connect(call)
        try:
            await self.presence.token_roles(call.identity)
        except UNAVAILABLE as exc:  # written again at the agent's next connect or MCP call
            log.warning("token roles not written: Redis unavailable", agent_id=call.identity.agent_id, error=repr(exc))
        try:
            await self.mailbox.attach(call.identity.namespace, call.identity.agent_id, call.peer)
        except UNAVAILABLE as exc:
            # Redis is away: the connection goes on (a request that needs Redis fails on its own); the listener
            # stays attached, so push resumes when the fan-out resubscribes, and messages wait in the mailbox.
            log.warning("mailbox push not confirmed yet", agent_id=call.identity.agent_id, error=repr(exc))

    async def seen(self, call: Call) -> Conn | None:
        """Note a request. A connection not announced at connect (a transport without the hook) connects now;
        an MCP caller's token roles are registered (once per process and agent)."""
        conn = self.presence.touch(call)
        if call.peer is None:
            if call.identity.roles:
                await self.presence.token_roles(call.identity)
        elif conn is None and call.peer.conn_id not in self.presence.conns:
            await self.connect(call)
            conn = self.presence.conns.get(call.peer.conn_id)
        return conn

    async def acquire(self, who: Identity, entity_ids: Sequence[str], ttl: int, mode: str,
                      session_id: str | None = None, reason: str | None = None) -> Result:
        """lease.acquire: an intent (intents.py) or a lease (leases.py)."""
        if mode == "intent":
            return await self.intents.declare(who, entity_ids, ttl, session_id, reason)
        return await self.leases.acquire(who, entity_ids, ttl, mode, session_id, reason)

    async def handoff_leases(self, namespace: str, handoff: Result) -> Result:
        """The live leases on the handoff's entities, and those held by agents outside the session (open
        conflicts for whoever takes it over)."""
        entities = sorted(handoff_entities(handoff))
        if not entities:
            return {"leases": [], "openConflicts": []}
        leases = await self.leases.holds(namespace, entities)
        agents = set(handoff.get("agentIds") or ())
        return {"leases": leases, "openConflicts": [lease for lease in leases if lease["heldBy"] not in agents]}


def handoff_entities(handoff: Result) -> set[str]:
    """Every entity a handoff context names: its KG context and its recent changes."""
    found = {str(item.get("entityId")) for item in handoff.get("kgContext") or () if item.get("entityId")}
    for change in handoff.get("recentChanges") or ():
        found.update((change.get("changeInfo") or {}).get("entityIds") or ())
    return found
