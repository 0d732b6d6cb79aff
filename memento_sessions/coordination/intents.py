"""Intents: `lease.acquire {mode: "intent"}`, a declaration of planned work that overlaps are predicted from.

An intent is always granted and never blocks nor is blocked: it is a lease that holds nothing (leases.py;
coordination.lua's `intend`). What it adds is the prediction: the entities within two relationships of the
named ones in the knowledge graph (every relationship between codebase entities: DEFINES, MEMBER_OF_CLUSTER,
IMPACTS, TESTS, REQUIRES, PERFORMS_FOR and any calls or imports edges a graph carries), at most
MEMENTO_INTENT_MAX_EXPANDED of them, are read with one Cypher read; then the other agents' leases and intents
on those entities and the named ones with one read-only Function call (mc_overlaps). Each overlap names the
path it came through (`via`). Both sides are told: the declaring agent in its reply and, like every other agent
it overlaps, by an `intent.overlap` message in its mailbox, pushed at once to its connections. Hooks and tool
notices surface these messages from the mailbox like any other (`OVERLAP_SUBJECT`, `overlap_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.coordination.leases import Leases, hold_of
from memento_sessions.coordination.mailbox import Encoded, Mailbox
from memento_sessions.kg.graph import Graphs, neighbours
from memento_sessions.metrics import LEASE_ACQUIRES
from memento_sessions.sessions.manager import now_ms

Result = dict[str, Any]
OVERLAP_SUBJECT = "intent.overlap"  # the mailbox subject and the notification's method
TRUNCATED = LEASE_ACQUIRES.labels("intent_expansion_truncated")


class Intents:
    """Grants intents and tells every agent whose work they overlap."""

    def __init__(self, leases: Leases, mailbox: Mailbox, graphs: Graphs | None, max_expanded: int) -> None:
        self.leases = leases
        self.mailbox = mailbox
        self.graphs = graphs
        self.max_expanded = max_expanded

    async def declare(self, who: Identity, entity_ids: Sequence[str], ttl: int, session_id: str | None = None,
                      reason: str | None = None) -> Result:
        """Grant the intent; reply with its overlaps (each with `via`), and how far the graph was expanded."""
        named = list(dict.fromkeys(entity_ids))
        near, truncated = await self._near(who.namespace, named)
        overlaps = await self.overlaps(who, named, near)
        reply = await self.leases.acquire(who, named, ttl, "intent", session_id, reason)
        room = self.leases.settings.lease_reply_max
        reply.update({"overlaps": overlaps[:room], "expanded": len(near), "expandedMax": self.max_expanded,
                      "expansionTruncated": truncated})
        if len(overlaps) > room:
            reply["overlapsOmitted"] = len(overlaps) - room
        if truncated:
            TRUNCATED.inc()
        if overlaps:
            await self.tell(who, reply["leaseId"], named, overlaps[:room], reason)
        return reply

    async def _near(self, namespace: str, named: list[str]) -> tuple[list[tuple[str, int, str]], bool]:
        if self.graphs is None or self.max_expanded == 0:
            return [], False
        return await neighbours(self.graphs, namespace, named, self.max_expanded)

    async def overlaps(self, who: Identity, named: list[str], near: list[tuple[str, int, str]]) -> list[Result]:
        """Other agents' live leases and intents on the named entities (depth 0) and the ones near them."""
        paths = {entity: (0, "") for entity in named} | {entity: (depth, path) for entity, depth, path in near}
        flat = await self.leases.store.call("mc_overlaps", keys.lease_keys(who.namespace).all(), now_ms(), *paths)
        found, seen = [], set()
        for i in range(0, len(flat), 5):
            hold = hold_of(*flat[i:i + 5])
            if hold["heldBy"] == who.agent_id or (hold["leaseId"], hold["entityId"]) in seen:
                continue
            seen.add((hold["leaseId"], hold["entityId"]))
            depth, path = paths[hold["entityId"]]
            held = f" (held via {hold.pop('via')})" if "via" in hold else ""
            found.append({**hold, "depth": depth, **({"via": path + held} if path or held else {})})
        return nearest(found)

    async def tell(self, who: Identity, lease_id: str, named: list[str], overlaps: list[Result],
                   reason: str | None) -> None:
        """An `intent.overlap` message to each agent overlapped (its own overlaps) and one to the declarer (all of
        them), each stored in its mailbox and pushed to its connections (the declarer's reply says the same; the
        push also tells its other connections)."""
        intent = {"leaseId": lease_id, "agentId": who.agent_id, "entityIds": named, "reason": reason}
        ttl = self.mailbox.settings.mailbox_ttl
        by_agent: dict[str, list[Result]] = {}
        for overlap in overlaps:
            by_agent.setdefault(overlap["heldBy"], []).append(overlap)
        for agent, theirs in [*by_agent.items(), (who.agent_id, overlaps)]:
            message = {"messageId": f"intent:{lease_id}:{agent}", "from": who.agent_id, "to": agent,
                       "subject": OVERLAP_SUBJECT, "body": {"intent": intent, "overlaps": theirs}}
            await self.mailbox.deliver(who.namespace, agent, Encoded.of(message, ttl), OVERLAP_SUBJECT)


def nearest(found: list[Result]) -> list[Result]:
    """One overlap per lease or intent: the one at the least depth (a lease reached on several entities)."""
    kept: dict[str, Result] = {}
    for item in sorted(found, key=lambda item: item["depth"]):
        kept.setdefault(item["leaseId"], item)
    return list(kept.values())


def overlap_text(message: Result, agent_id: str) -> str:
    """One `intent.overlap` mailbox message as a line of plain text for an agent (`agent_id`, its reader)."""
    body = message.get("body") or {}
    intent, overlaps = body.get("intent") or {}, body.get("overlaps") or []
    mine = intent.get("agentId") == agent_id
    parts = [f"{item.get('heldBy')}'s {item.get('mode')} on {item.get('entityId')}"
             + (f" via {item['via']}" if item.get("via") else "") for item in overlaps[:5]]
    more = f" and {len(overlaps) - 5} more" if len(overlaps) > 5 else ""
    if mine:
        return f"Your planned work on {', '.join(intent.get('entityIds') or [])} overlaps " + "; ".join(parts) + more
    why = f" ({intent['reason']})" if intent.get("reason") else ""
    return (f"{intent.get('agentId')} plans work on {', '.join(intent.get('entityIds') or [])}{why}, overlapping "
            + "; ".join(parts) + more)
