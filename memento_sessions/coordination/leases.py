"""Entity leases: acquire (exclusive all-or-nothing, or shared and advisory), renew, release, list, and the
reaper that ends expired and orphaned leases. Each operation is one Function call on the namespace's
lease keys (coordination.lua), so every daemon sees the same leases and no two grant one entity twice; a
lease covering more than MEMENTO_LEASE_CALL_ENTITIES entities goes in bounded parts (parts.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import Any

import anyio
import pydantic_core

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.coordination.coverage import NO_GRAPH, Coverage, Pairs
from memento_sessions.coordination.parts import Parts, flat_pairs
from memento_sessions.coordination.store import CoordStore
from memento_sessions.errors import BackendUnavailable, Conflict, Reason
from memento_sessions.kg.graph import Graphs
from memento_sessions.limits import Pacer
from memento_sessions.logs import get_logger, one_pass
from memento_sessions.metrics import LEASE_ACQUIRES, LEASE_ENDS, PACED_SECONDS
from memento_sessions.sessions.manager import iso, now_ms
from memento_sessions.sessions.paging import Page, page_bytes
from memento_sessions.settings import Settings

log = get_logger(__name__)
Result = dict[str, Any]
REAP_EVERY = 1.0  # seconds between two reaper passes of one daemon (each pass is idempotent)
OUTAGES: tuple[type[BaseException], ...] = (*UNAVAILABLE, BackendUnavailable)  # Redis or FalkorDB away
GRANTED, REFUSED = LEASE_ACQUIRES.labels("granted"), LEASE_ACQUIRES.labels("refused")  # bound once, not per call
STALE_RETRIES = 2  # grants refused for a changed graph before an acquire reads its own entities' contents
LIST_CHUNK = 100  # leases read per HMGET while filling a lease.list page
HOLDS_CHUNK = 256  # entities whose holds one read-only call returns
TRUNCATION = ("conflictsTruncated", "conflictingEntities")  # an acquire reply's fields when conflicts were left out


def lease_view(raw: str, now: int) -> Result | None:
    """A stored lease as clients see it (None once it has ended): `covers` names what it holds through the
    graph, at most MEMENTO_LEASE_REPLY_MAX of them, and `coversOmitted` how many more when there are more."""
    lease: Result = dict(pydantic_core.from_json(raw))
    if lease.get("pending") or lease["expiresAt"] <= now:  # pending: being granted in parts, not yet granted
        return None
    lease["expiresAt"] = iso(lease["expiresAt"])
    if not lease.get("coversOmitted"):
        lease.pop("coversOmitted", None)
    return lease


def hold_of(entity: str, mode: str, holder: str, lease_id: str, via: str) -> Result:
    """One live hold as replies show it: `{entityId, heldBy, leaseId, mode, via?}`."""
    item = {"entityId": str(entity), "heldBy": str(holder), "leaseId": str(lease_id), "mode": str(mode)}
    if via:
        item["via"] = str(via)
    return item


class Leases:
    """Leases of every namespace, over the coordination Functions and the knowledge graph."""

    def __init__(self, store: CoordStore, graphs: Graphs | None, settings: Settings) -> None:
        self.store = store
        self.coverage = Coverage(graphs, store, settings.lease_coverage_edges, settings.lease_max_covered)
        self.settings = settings
        self.parts = Parts(store, settings)
        self._indexed: set[str] = set()  # namespaces this daemon has added to the reaper's set
        # Each write's Redis work is per covered entity: a namespace's go at MEMENTO_LEASE_PACE a second (limits.py)
        self.pacer = Pacer(settings.lease_pace, PACED_SECONDS.labels("lease"))

    async def acquire(self, who: Identity, entity_ids: Sequence[str], ttl: int, mode: str,
                      session_id: str | None = None, reason: str | None = None) -> Result:
        """Grant a lease on the entities and what they contain, or (exclusive, any conflict) nothing."""
        lease_id, now = f"lease-{os.urandom(10).hex()}", now_ms()
        tail = pydantic_core.to_json({"leaseId": lease_id, "agentId": who.agent_id, "mode": mode,
                                      "entityIds": list(entity_ids), "sessionId": session_id, "reason": reason,
                                      "acquiredAt": iso(now)}).decode()[:-1]
        # Once per namespace and process, before any write: the reaper finds what a crash leaves (a grant's
        # pending parts); it keeps the set's TTL.
        if who.namespace not in self._indexed:
            await self.store.command("SADD", keys.coord_namespaces(), who.namespace)
            self._indexed.add(who.namespace)
        if mode == "intent":  # what it names, no coverage: it holds nothing and conflicts with nobody
            reply = await self._grant(who, lease_id, mode, ttl, tail, NO_GRAPH, [(e, "") for e in entity_ids], [])
            pairs: Pairs = []
        else:
            reply, pairs = await self._granted(who, lease_id, mode, ttl, tail, entity_ids)
        (GRANTED if reply["granted"] else REFUSED).inc()
        return self._reply(reply, lease_id, pairs)

    async def _granted(self, who: Identity, lease_id: str, mode: str, ttl: int, tail: str,
                       entity_ids: Sequence[str]) -> tuple[Result, Pairs]:
        """The grant over the coverage at the graph's current version (expanded again while the graph changes)."""
        version, pairs, above = await self._covered(who.namespace, entity_ids)
        for attempt in range(STALE_RETRIES + 1):
            reply = await self._grant(who, lease_id, mode, ttl, tail, version, pairs, above)
            if not reply.get("stale"):
                break
            if attempt < STALE_RETRIES:  # the graph changed since the cache was loaded: load it again
                await self.coverage.reload(who.namespace, version)
                version, pairs, above = await self._covered(who.namespace, entity_ids)
            else:  # it keeps changing (a bulk load): this grant reads its own entities' contents
                pairs = self._bounded(await self.coverage.read(who.namespace, entity_ids))
                above = self._bounded(await self.coverage.containers(who.namespace, NO_GRAPH, pairs))  # read now
                version = NO_GRAPH
        return reply, pairs

    async def _covered(self, namespace: str, entity_ids: Sequence[str]) -> tuple[str, Pairs, Pairs]:
        """The graph version, the pairs the lease holds, and the containers of those it checks but does not hold."""
        version, pairs = await self.coverage.covered(namespace, entity_ids)
        pairs = self._bounded(pairs)
        return version, pairs, self._bounded(await self.coverage.containers(namespace, version, pairs))

    def _bounded(self, pairs: Pairs) -> Pairs:
        """The pairs, or -32009 `lease_too_large` when they are more than one lease may cover."""
        cap = self.settings.lease_max_covered
        if len(pairs) > cap:
            LEASE_ACQUIRES.labels("lease_too_large").inc()
            raise Conflict(f"lease too large: the entities and what they contain are more than {cap} "
                           "(MEMENTO_LEASE_MAX_COVERED); lease fewer at a time",
                           {"reason": Reason.LEASE_TOO_LARGE, "field": "entityIds", "max": cap})
        return pairs

    def _reply(self, reply: Result, lease_id: str, pairs: Pairs) -> Result:
        """The client's reply: at most MEMENTO_LEASE_REPLY_MAX conflicts and covered entities listed, and
        how many were left out."""
        conflicts = reply["conflicts"] if isinstance(reply.get("conflicts"), list) else []
        cut: Result = {key: reply[key] for key in TRUNCATION if key in reply}
        if not reply["granted"]:
            return {"leaseId": None, "granted": False, "conflicts": conflicts, **cut, "fencingToken": None,
                    "expiresAt": None}
        covers, room = [entity for entity, via in pairs if via], self.settings.lease_reply_max
        result = {"leaseId": lease_id, "granted": True, "conflicts": conflicts, **cut,
                  "fencingToken": reply.get("fencingToken"),  # none for an intent
                  "expiresAt": iso(reply["expiresAt"]), "covers": covers[:room]}
        if len(covers) > room:
            result["coversOmitted"] = len(covers) - room
        return result

    async def _grant(self, who: Identity, lease_id: str, mode: str, ttl: int, tail: str, version: str,
                     pairs: Pairs, above: Pairs) -> Result:
        """The Function call of an acquire (calls, past MEMENTO_LEASE_CALL_ENTITIES): `{granted, conflicts, ...}`
        or `{stale: true}`."""
        await self.pacer.take(who.namespace, len(pairs) + len(above))
        flat, checked = flat_pairs(pairs), flat_pairs(above)
        try:
            if mode != "intent" and not self.parts.fits(pairs, above):  # an intent names at most 64
                return await self.parts.grant(who, lease_id, mode, ttl, tail, version, pairs, above)
            raw = await self.store.call("mc_acquire", keys.lease_keys(who.namespace).all(), now_ms(), who.agent_id,
                                        lease_id, mode, ttl * 1000, self.settings.lease_max, tail, version,
                                        self.settings.lease_max_holds, self.settings.lease_reply_max, len(flat),
                                        *flat, *checked)
        except Conflict as exc:
            LEASE_ACQUIRES.labels(exc.data["reason"] if isinstance(exc.data, dict) else "lease_limit").inc()
            raise
        return dict(pydantic_core.from_json(raw))

    async def renew(self, who: Identity, lease_id: str, ttl: int) -> Result:
        """Move the lease's end to now + ttl (its fencing token stays)."""
        await self.pacer.take(who.namespace)
        expires, covered = await self.parts.renew(who, lease_id, ttl)
        self.pacer.charge(who.namespace, covered)
        return {"leaseId": lease_id, "expiresAt": iso(expires)}

    async def release(self, who: Identity, lease_id: str) -> Result:
        """End the lease now."""
        await self.pacer.take(who.namespace)
        self.pacer.charge(who.namespace, await self.parts.release(who, lease_id))
        LEASE_ENDS.labels("released").inc()
        return {"leaseId": lease_id, "released": True}

    async def listed(self, namespace: str, entity_id: str | None = None, agent_id: str | None = None,
                     cursor: str | None = None, limit: int = 100) -> Result:
        """A page of the live leases, by leaseId, filtered by entity (what covers it) or agent; it stops at
        `limit` leases or a quarter of the send buffer, whichever comes first (then `nextCursor`)."""
        ids = sorted(i for i in await self._candidates(namespace, entity_id, agent_id) if cursor is None or i > cursor)
        page = Page(limit, page_bytes(self.settings.ws_send_buffer))
        for start in range(0, len(ids), LIST_CHUNK):  # a chunk at a time: never every lease read at once
            if not all(page.add(view) for view in await self.views(namespace, ids[start:start + LIST_CHUNK])):
                break
        result: Result = {"leases": page.items}
        if page.more:
            result["nextCursor"] = page.items[-1]["leaseId"]
        return result

    async def views(self, namespace: str, lease_ids: Sequence[str]) -> list[Result]:
        """The live leases of `lease_ids` (at most LIST_CHUNK of them), as lease.list shows them: one read."""
        raws = await self.store.command("HMGET", keys.lease_keys(namespace).leases, *lease_ids[:LIST_CHUNK])
        now = now_ms()
        return [view for view in (lease_view(raw, now) for raw in raws if raw) if view is not None]

    async def _candidates(self, namespace: str, entity_id: str | None, agent_id: str | None) -> list[str]:
        lkeys = keys.lease_keys(namespace)
        if entity_id is not None:
            return [hold["leaseId"] for hold in await self.holds(namespace, [entity_id])]
        if agent_id is not None:
            members = await self.store.command("ZRANGEBYLEX", lkeys.byagent, f"[{agent_id}/", f"[{agent_id}/\xff")
            return [str(member).partition("/")[2] for member in members]
        return [str(i) for i in await self.store.command("HKEYS", lkeys.leases)]

    async def holds(self, namespace: str, entity_ids: Sequence[str]) -> list[Result]:
        """The live holds on `entity_ids` (directly or through what a lease contains), each entity's exclusive
        ones first; at most MEMENTO_LEASE_MAX_HOLDS per entity. One read-only Function call per HOLDS_CHUNK."""
        lkeys, now, found = keys.lease_keys(namespace).all(), now_ms(), []
        for start in range(0, len(entity_ids), HOLDS_CHUNK):
            flat = await self.store.call("mc_holds", lkeys, now, *entity_ids[start:start + HOLDS_CHUNK])
            found += [hold_of(*flat[i:i + 5]) for i in range(0, len(flat), 5)]
        return found

    async def conflicts(self, namespace: str, agent: str, entity_ids: Sequence[str]) -> list[Result]:
        """Other agents' live leases on `entity_ids` (directly or through what their leases contain)."""
        return [hold for hold in await self.holds(namespace, entity_ids) if hold["heldBy"] != agent]

    async def fences(self, namespace: str, entity_ids: Sequence[str]) -> list[tuple[str, int]]:
        """The newest exclusive grant's fencing token of each entity that has one."""
        raws = await self.store.command("HMGET", keys.lease_keys(namespace).fence, *entity_ids)
        return [(entity, int(raw)) for entity, raw in zip(entity_ids, raws, strict=True) if raw]

    async def sync_fences(self, namespace: str, session_id: str, entity_ids: Sequence[str]) -> None:
        """Raise the session's fencing marks to the entities' newest grants, before an emit that carries a token."""
        found = await self.fences(namespace, entity_ids)
        if found:
            skeys = keys.session_keys(namespace, session_id)
            flat = [str(item) for pair in found for item in pair]
            await self.store.call("mc_fence_sync", [skeys.session, skeys.ids], *flat)

    async def reap_once(self) -> None:
        """End every namespace's expired leases and those of agents gone for MEMENTO_LEASE_ORPHAN_GRACE. One
        namespace that fails (a key of the wrong type) is logged and the others are still reaped."""
        grace_ms = int(self.settings.lease_orphan_grace * 1000)
        await self.store.command("EXPIRE", keys.coord_namespaces(), 7200)
        for namespace in await self.store.command("SMEMBERS", keys.coord_namespaces()):
            await one_pass(partial(self._reap_namespace, str(namespace), grace_ms), "lease reaper", OUTAGES)

    async def _reap_namespace(self, namespace: str, grace_ms: int) -> None:
        """One call per bounded slice of the work (each removes about MEMENTO_LEASE_CALL_ENTITIES holds), until
        none is left: other clients' commands run between two slices."""
        more = True
        while more:
            expired, orphaned, left = await self.store.call("mc_reap", keys.lease_keys(namespace).all(), now_ms(),
                                                            grace_ms, self.settings.lease_call_entities)
            if int(expired):
                LEASE_ENDS.labels("expired").inc(int(expired))
            if int(orphaned):
                LEASE_ENDS.labels("orphaned").inc(int(orphaned))
                log.info("orphaned leases released", namespace=namespace, count=int(orphaned))
            more = bool(int(left))

    async def reaper(self) -> None:
        """Run reap_once and refresh the coverage caches forever; an outage only delays them, and a pass that
        fails otherwise (a bug, a key of the wrong type) is logged with its traceback: the next pass runs."""
        while True:
            await one_pass(self._reap_pass, "lease reaper", OUTAGES)
            await anyio.sleep(REAP_EVERY)

    async def _reap_pass(self) -> None:
        await self.reap_once()
        await self.coverage.refresh()
