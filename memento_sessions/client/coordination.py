"""The typed coordination methods (presence.*, lease.*, mailbox.*); `Client` inherits them with `Methods`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from memento_sessions.client.results import (
    Acked,
    Here,
    HookAnswer,
    Inbox,
    Lease,
    LeaseList,
    Notices,
    Receipt,
    Released,
    Renewed,
    Roles,
    Sent,
)
from memento_sessions.client.wire import Result, compact


class CoordinationMethods:
    """Presence, leases and the mailbox by name, over `call`."""

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, retry: bool = False) -> Result:
        """Send `method` and await its result; `Client` implements it."""
        raise NotImplementedError

    async def presence(self, session_id: str) -> Here:
        """`presence.get`: {agents}, who is in the session now."""
        return cast(Here, await self.call("presence.get", {"sessionId": session_id}, retry=True))

    async def set_roles(self, roles: Sequence[str]) -> Roles:
        """`presence.set`: {agentId, roles}, the roles this agent declares (with its token's)."""
        return cast(Roles, await self.call("presence.set", {"roles": roles}, retry=True))

    async def acquire_lease(self, entity_ids: Sequence[str], ttl: int, *, mode: str = "exclusive",
                            session_id: str | None = None, reason: str | None = None) -> Lease:
        """`lease.acquire`: {leaseId, granted, conflicts, fencingToken, expiresAt, covers}."""
        params = compact(entityIds=entity_ids, ttl=ttl, mode=mode, sessionId=session_id, reason=reason)
        return cast(Lease, await self.call("lease.acquire", params))

    async def renew_lease(self, lease_id: str, ttl: int) -> Renewed:
        """`lease.renew`: {leaseId, expiresAt}."""
        return cast(Renewed, await self.call("lease.renew", {"leaseId": lease_id, "ttl": ttl}))

    async def release_lease(self, lease_id: str) -> Released:
        """`lease.release`: {leaseId, released}; releasing twice is harmless, so retried."""
        return cast(Released, await self.call("lease.release", {"leaseId": lease_id}, retry=True))

    async def list_leases(self, *, entity_id: str | None = None, agent_id: str | None = None,
                          cursor: str | None = None, limit: int | None = None) -> LeaseList:
        """`lease.list`: {leases, nextCursor?}."""
        params = compact(entityId=entity_id, agentId=agent_id, cursor=cursor, limit=limit)
        return cast(LeaseList, await self.call("lease.list", params, retry=True))

    async def send_message(self, to: str, body: Any, *, subject: str | None = None, ttl: int | None = None,
                           message_id: str | None = None) -> Sent:
        """`mailbox.send`: {messageId, recipients}; retried across a reconnect only with an `id` (idempotent)."""
        params = compact(to=to, body=body, subject=subject, ttl=ttl, id=message_id)
        return cast(Sent, await self.call("mailbox.send", params, retry=message_id is not None))

    async def read_inbox(self, *, since: int | None = None, limit: int | None = None,
                         unread_only: bool = False) -> Inbox:
        """`mailbox.read`: {messages, nextSince?}, oldest first."""
        params = compact(since=since, limit=limit, unreadOnly=unread_only or None)
        return cast(Inbox, await self.call("mailbox.read", params, retry=True))

    async def ack_messages(self, message_ids: Sequence[str]) -> Acked:
        """`mailbox.ack`: {acked}; idempotent, so retried."""
        return cast(Acked, await self.call("mailbox.ack", {"messageIds": message_ids}, retry=True))

    async def message_status(self, message_id: str) -> Receipt:
        """`mailbox.status`: {messageId, recipients: [{agentId, stored, pushed, surfaced, acked}]} (ISO times or
        None) of a message this agent sent."""
        return cast(Receipt, await self.call("mailbox.status", {"messageId": message_id}, retry=True))

    async def surface(self, limit: int | None = None) -> Notices:
        """`mailbox.surface`: {notices}, the messages and alerts not surfaced to this agent yet, each once (not
        retried: a lost reply's notices are not given again)."""
        return cast(Notices, await self.call("mailbox.surface", compact(limit=limit)))

    async def hook_answer(self, hook_input: Any, *, root: str | None = None, leases: str | None = None,
                          claim_ttl: int | None = None) -> HookAnswer:
        """`hook.answer`: {output}, the answer to one of the agent's hooks (docs/hooks.md)."""
        params = {"input": hook_input, **compact(root=root, leases=leases, claimTtl=claim_ttl)}
        return cast(HookAnswer, await self.call("hook.answer", params))
