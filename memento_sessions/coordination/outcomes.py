"""Breaks and fixes: an agent's test or build run failed (or passed again) after it changed entities other
agents lease; each of those holders is told, in its mailbox, so it surfaces in their context.

Only outcome events do any work here (`broke`, `test_pass`, or a stateTransition to broken or working): the
session's last RECENT events give what it changed, one read of the holds gives who leases it. A pass is a
fix only when the session's previous outcome was a break. The message id derives from the session and the
event's seq, so a retried emit tells nobody twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic_core

from memento_sessions.auth import Identity
from memento_sessions.coordination.leases import Leases
from memento_sessions.coordination.mailbox import Encoded, Mailbox
from memento_sessions.errors import NotFound
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import STATE_OF_TYPE, EventIn

Result = dict[str, Any]
RECENT = 50  # events of the session read for what it changed
MAX_ENTITIES = 64  # entities one outcome checks for holders


def outcome_state(event: EventIn) -> str | None:
    """`broken` or `working` when the event is an outcome, else None."""
    state = event.stateTransition.to if event.stateTransition else STATE_OF_TYPE.get(event.type)
    return state if state in ("broken", "working") else None


def changed_before(raws: Sequence[str], seq: int) -> tuple[list[str], str | None]:
    """The entities changed by the events before `seq`, newest first, and the previous outcome's state."""
    entities: dict[str, None] = {}
    previous = None
    for raw in reversed(raws):
        event = pydantic_core.from_json(raw)
        if event.get("seq", 0) >= seq:
            continue
        transition = event.get("stateTransition") or {}
        state = transition.get("to") or STATE_OF_TYPE.get(event.get("type"))
        if previous is None and state in ("broken", "working"):
            previous = state
        entities.update(dict.fromkeys((event.get("changeInfo") or {}).get("entityIds") or ()))
    return list(entities)[:MAX_ENTITIES], previous


class Outcomes:
    """Tells the holders of what a session changed when its agent breaks or fixes the build."""

    def __init__(self, leases: Leases, mailbox: Mailbox, manager: SessionManager) -> None:
        self.leases = leases
        self.mailbox = mailbox
        self.manager = manager

    async def after(self, who: Identity, session_id: str, stored: Sequence[tuple[int, EventIn]]) -> None:
        """For each stored outcome event, a message to every other agent leasing what the session changed."""
        for seq, event in stored:
            state = outcome_state(event)
            if state is not None:
                await self._tell(who, session_id, seq, event, state)

    async def _tell(self, who: Identity, session_id: str, seq: int, event: EventIn, state: str) -> None:
        try:
            _, raws = await self.manager.tail(who.namespace, session_id, RECENT)
        except NotFound:
            return
        entities, previous = changed_before(raws, seq)
        if not entities or (state == "working" and previous != "broken"):
            return
        held: dict[str, list[str]] = {}
        for conflict in await self.leases.conflicts(who.namespace, who.agent_id, entities):
            held.setdefault(conflict["heldBy"], []).append(conflict["entityId"])
        subject = "session.broke" if state == "broken" else "session.fixed"
        data = event.data if isinstance(event.data, dict) else {}
        for agent, yours in held.items():
            body = {"sessionId": session_id, "seq": seq, "by": who.agent_id, "state": state,
                    "entityIds": sorted(set(yours)), "command": data.get("command")}
            message = {"messageId": f"outcome:{session_id}:{seq}", "from": who.agent_id, "to": agent,
                       "subject": subject, "body": body}
            await self.mailbox.deliver(who.namespace, agent, Encoded.of(message, self.mailbox.settings.mailbox_ttl))
