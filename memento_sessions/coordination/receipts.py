"""Delivery receipts: for each message and recipient, when it was stored, pushed, surfaced and acked.

`stored`: in the recipient's mailbox. `pushed`: a live connection of the recipient got it (its daemon's
fan-out). `surfaced`: the recipient's context got it (a hook's answer, an MCP tool's notices). `acked`: the
recipient acknowledged it (mailbox.ack). Each stage keeps its first time, in one hash per message beside
its body (keys.mail_receipts), kept as long as the message; every new stage but `stored` is pushed to the
sender's connections as a `mailbox.receipt` notification. A conflict alert has no receipts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic_core

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.coordination.store import CoordStore
from memento_sessions.errors import NotFound
from memento_sessions.sessions.manager import iso, now_ms

Result = dict[str, Any]
STAGES = ("stored", "pushed", "surfaced", "acked")


class Receipts:
    """Writes and reads the receipts of the namespace's messages."""

    def __init__(self, store: CoordStore) -> None:
        self.store = store

    async def note(self, namespace: str, agent: str, stage: str, message_ids: Sequence[str],
                   sender: str | None = None, until: int = 0) -> int:
        """Record `stage` now for `agent` on each message (that has receipts; `sender` and `until` create
        them at `stored`); how many were new."""
        if not message_ids:
            return 0
        channel = keys.agent_channel(namespace, sender) if sender else ""
        names = [keys.mail_receipts(namespace, message_id) for message_id in message_ids]
        return int(await self.store.call("mc_receipt", names, agent, stage, iso(now_ms()), channel, until,
                                         *message_ids))

    async def status(self, who: Identity, message_id: str) -> Result:
        """mailbox.status: each recipient's stages of a message the caller sent (NotFound for any other)."""
        raw = await self.store.command("GET", keys.mail_body(who.namespace, message_id))
        if raw is None or pydantic_core.from_json(raw).get("from") != who.agent_id:
            raise NotFound(f"no message {message_id!r} sent by you is kept", {"messageId": message_id})
        fields = await self.store.command("HGETALL", keys.mail_receipts(who.namespace, message_id))
        pairs = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) else dict(fields)
        return {"messageId": message_id, "recipients": recipients(pairs)}


def recipients(pairs: dict[Any, Any]) -> list[Result]:
    """`<agent>|<stage>` -> time fields as one entry per recipient, every stage named (null: not yet)."""
    found: dict[str, Result] = {}
    for name, at in pairs.items():
        agent, bar, stage = str(name).rpartition("|")
        if bar and stage in STAGES:
            found.setdefault(agent, {"agentId": agent, **dict.fromkeys(STAGES)})[stage] = str(at)
    return [found[agent] for agent in sorted(found)]
