"""Conflict alerts: after an emit whose entities another agent leases, tell the holder and record it.

The emit itself has succeeded; this adds, for each conflicting lease: a `lease.conflict` message in the
holder's mailbox, pushed at once to its connections on any daemon, and one `conflict` event in the
emitting session. Every id derives from the emitted event's seq, so a retried emit (a duplicate, which
is never alerted anyway) or a retried alert writes nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.coordination.leases import Leases
from memento_sessions.coordination.mailbox import Encoded, Mailbox
from memento_sessions.limits import Pacer
from memento_sessions.metrics import LEASE_CONFLICT_ALERTS, PACED_SECONDS
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import SYSTEM, EventIn

Result = dict[str, Any]
PART = 16  # events (at most 256 ids each) gathered or matched between two turns of the event loop


class Alerts:
    """Finds the conflicts of emitted events and sends their alerts."""

    def __init__(self, leases: Leases, mailbox: Mailbox, manager: SessionManager) -> None:
        self.leases = leases
        self.mailbox = mailbox
        self.manager = manager
        self.batches = Pacer(manager.settings.batch_ids_pace, PACED_SECONDS.labels("batch"))

    async def after_batch(self, who: Identity, session_id: str, stored: Sequence[tuple[int, EventIn]]) -> list[Result]:
        """The conflicts of a batch's stored (seq, event) pairs, each with its `seq`, and every conflicting
        event alerted once. One read of the holds for all the batch's entities, not one per event: an
        ingested batch of 500 edits would otherwise wait on 500 round trips one after the other. The ids are
        gathered and matched PART events at a time, with a turn for the daemon's other work between parts
        (a batch may name 128,000 ids)."""
        if not any(touched(event) for _, event in stored) or not await self.any_holds(who.namespace):
            return []
        union: dict[str, None] = {}
        for start in range(0, len(stored), PART):
            union.update((entity, None) for _, event in stored[start:start + PART] for entity in touched(event))
            await anyio.lowlevel.checkpoint()
        held: dict[str, list[Result]] = {}
        for conflict in await self.leases.conflicts(who.namespace, who.agent_id, list(union)):
            held.setdefault(conflict["entityId"], []).append(conflict)
        return await self._alert_held(who, session_id, stored, held) if held else []

    async def _alert_held(self, who: Identity, session_id: str, stored: Sequence[tuple[int, EventIn]],
                          held: dict[str, list[Result]]) -> list[Result]:
        """Alert each stored event that touches a held entity; the conflicts found, each with its `seq`."""
        found: list[Result] = []
        for start in range(0, len(stored), PART):
            for seq, event in stored[start:start + PART]:
                conflicts = [conflict for entity in touched(event) for conflict in held.get(entity, ())]
                if conflicts:
                    await self.alert(who, session_id, seq, event, conflicts)
                    found += [{**conflict, "seq": seq} for conflict in conflicts]
            await anyio.lowlevel.checkpoint()
        return found

    async def any_holds(self, namespace: str) -> bool:
        """Whether any entity of the namespace has a hold (live or not yet reaped): one HLEN, so a batch in a
        namespace without leases skips reading the holds of each of its (up to 128,000) ids."""
        return bool(await self.leases.store.command("HLEN", keys.lease_keys(namespace).counts))

    async def check(self, who: Identity, event: EventIn) -> list[Result]:
        """Other agents' live leases on the event's entities (no Redis call when it names none)."""
        entity_ids = touched(event)
        return await self.leases.conflicts(who.namespace, who.agent_id, entity_ids) if entity_ids else []

    async def alert(self, who: Identity, session_id: str, seq: int, event: EventIn,
                     conflicts: Sequence[Result]) -> None:
        for conflict in conflicts:
            body = {**conflict, "sessionId": session_id, "seq": seq, "eventType": event.type, "by": who.agent_id}
            message = {"messageId": f"conflict:{session_id}:{seq}:{conflict['leaseId']}",
                       "from": who.agent_id, "to": conflict["heldBy"], "subject": "lease.conflict", "body": body}
            encoded = Encoded.of(message, self.mailbox.settings.mailbox_ttl)
            if await self.mailbox.deliver(who.namespace, conflict["heldBy"], encoded, "lease.conflict"):
                LEASE_CONFLICT_ALERTS.inc()
        record = EventIn.model_validate({"id": f"conflict-{seq}", "type": "conflict",
                                         "data": {"seq": seq, "conflicts": list(conflicts)}}, context=SYSTEM)
        await self.manager.emit(who, session_id, record)


def touched(event: EventIn) -> list[str]:
    """The entities an event touches for conflicts: its changeInfo's, none for a `conflict` record itself."""
    return event.changeInfo.entityIds if event.changeInfo and event.type != "conflict" else []
