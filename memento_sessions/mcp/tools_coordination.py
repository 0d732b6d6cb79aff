"""The MCP tools of coordination: who_is_here, the lease tools, and the mailbox tools.

Like every tool, each one runs its JSON-RPC method through the shared registry (`call` is the owning
Tools' call), so validation, scopes, namespaces and results are the method's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, cast

from mcp_types import ToolAnnotations
from pydantic import ConfigDict, Field, JsonValue, StrictBool, StrictInt, with_config

from memento_sessions.coordination.methods import (
    AcquireParams,
    ListLeasesParams,
    ReadParams,
    Recipient,
    RenewParams,
)
from memento_sessions.mcp.models import Bounds, Noticed
from memento_sessions.sessions.models import ClientId, EntityId, ShortText

if TYPE_CHECKING:
    from memento_sessions.mcp.tools import Tools

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
Json = dict[str, Any]
_OPEN = ConfigDict(extra="allow")
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                             open_world_hint=False)

SessionId = Annotated[ClientId, Field(description="The session's id.")]
EntityIds = Annotated[list[EntityId], Bounds(AcquireParams, "entityIds"), Field(
    description="The codebase entities to lease, e.g. ['file:src/auth.py'] or ['sym:src/auth.py:login'].")]
LeaseTtl = Annotated[StrictInt, Bounds(AcquireParams, "ttl"),
                     Field(description="Seconds the lease lasts unless renewed.")]
Mode = Annotated[Literal["exclusive", "shared", "intent"], Field(
    description="'exclusive' (granted only if nobody else holds any of them), 'shared' (advisory: always "
                "granted, conflicts reported) or 'intent' (a plan, holding nothing: always granted, with the "
                "'overlaps' of other agents' leases and intents up to two graph relationships away, each with "
                "its path 'via'; they are told too).")]
LeaseSession = Annotated[ClientId | None, Field(description="The session you work in, if any.")]
Reason = Annotated[ShortText | None, Field(description="Why you take it, shown to other agents.")]
LeaseId = Annotated[ClientId, Field(description="The leaseId returned by acquire_lease.")]
TaskId = Annotated[ClientId, Field(description="The task's id: the lease is on the entity 'task:<taskId>'.")]
RenewTtl = Annotated[StrictInt, Bounds(RenewParams, "ttl"), Field(description="Seconds from now the lease lasts.")]
LeaseEntity = Annotated[EntityId | None, Field(description="Only leases covering this entity.")]
LeaseAgent = Annotated[ClientId | None, Field(description="Only leases held by this agent.")]
LeaseCursor = Annotated[ClientId | None, Field(description="Omit first; then the previous reply's nextCursor.")]
LeaseLimit = Annotated[StrictInt, Bounds(ListLeasesParams, "limit"), Field(description="At most this many leases.")]
To = Annotated[Recipient, Field(description="An agent id (one seen in this namespace), 'role:<name>' (the agents "
                                            "whose token grants the role, or that declared it) or 'session:<id>' "
                                            "(every agent of that session but you).")]
MessageSubject = Annotated[ShortText | None, Field(description="A short subject line.")]
Body = Annotated[JsonValue, Field(description="The message: any JSON, at most 16 KiB encoded.")]
MessageTtl = Annotated[StrictInt | None, Field(ge=60, le=30 * 86400, description="Seconds an unread message is kept.")]
MessageId = Annotated[ClientId | None, Field(description="Your id for the message: sending it again is harmless.")]
InboxSince = Annotated[StrictInt, Bounds(ReadParams, "since"), Field(
    description="Only messages with seq greater than this: 0 first, then the previous reply's nextSince.")]
InboxLimit = Annotated[StrictInt, Bounds(ReadParams, "limit"), Field(description="At most this many messages.")]
UnreadOnly = Annotated[StrictBool, Field(description="True to skip messages you acknowledged.")]
SentId = Annotated[ClientId, Field(description="The messageId send_message returned.")]
MessageIds = Annotated[list[ClientId], Field(min_length=1, max_length=1000, description="The messageIds to mark read.")]


@with_config(_OPEN)
class Here(Noticed):
    agents: list[Json]


@with_config(_OPEN)
class Lease(Noticed):
    leaseId: str | None
    granted: bool
    conflicts: list[Json]
    fencingToken: int | None
    expiresAt: str | None
    covers: NotRequired[list[str]]


@with_config(_OPEN)
class Renewed(Noticed):
    leaseId: str
    expiresAt: str


@with_config(_OPEN)
class Released(Noticed):
    leaseId: str
    released: bool


@with_config(_OPEN)
class LeaseList(Noticed):
    leases: list[Json]
    nextCursor: NotRequired[str]


@with_config(_OPEN)
class Sent(Noticed):
    messageId: str
    recipients: list[str]


@with_config(_OPEN)
class Inbox(Noticed):
    messages: list[Json]
    nextSince: NotRequired[int]


@with_config(_OPEN)
class Acked(Noticed):
    acked: int


@with_config(_OPEN)
class Receipt(Noticed):
    messageId: str
    recipients: list[Json]


class CoordinationTools:
    """The nine coordination tools over one `call`."""

    def __init__(self, call: Call) -> None:
        self.call = call

    async def who_is_here(self, sessionId: SessionId) -> Here:
        """See which agents are in a session right now before you start work in it: each agent's id, whether
        it is 'active' (made a request lately) or 'idle', when it was last seen and how many connections it
        has (0 for an agent working through these tools, the hook or ingest: it is listed for a while after it
        joined or emitted there, until it leaves). An agent whose connections all closed or whose daemon died is
        not listed."""
        return cast(Here, await self.call("presence.get", {"sessionId": sessionId}))

    async def acquire_lease(self, entityIds: EntityIds, ttl: LeaseTtl, mode: Mode = "exclusive",
                            sessionId: LeaseSession = None, reason: Reason = None) -> Lease:
        """Acquire a lease before editing a file, symbol or cluster that other agents may touch. A lease on a
        file also covers the symbols it defines, a cluster its members. Exclusive is all or nothing: if
        another agent holds any of them, granted is false and conflicts names each holder, its leaseId and
        'via' (the file or cluster the conflict came through); wait, pick other work or message the holder.
        Shared is advisory. Keep the fencingToken and put it on the events you emit for those entities:
        an event with an older token than a newer grant is refused (stale_lease). Renew before expiresAt."""
        params = {"entityIds": entityIds, "ttl": ttl, "mode": mode, "sessionId": sessionId, "reason": reason}
        return cast(Lease, await self.call("lease.acquire", params))

    async def claim_task(self, taskId: TaskId, ttl: LeaseTtl, sessionId: LeaseSession = None,
                         reason: Reason = None) -> Lease:
        """Claim a task before you start it, so no other agent takes it too: an exclusive lease on
        'task:<taskId>'. Exactly one of any agents racing for it gets granted true; the others get granted false
        and conflicts naming the holder: pick another task. Keep the fencingToken: the task's completion event
        (type 'task_done', changeInfo.entityIds ['task:<taskId>']) must carry it as fencingToken, or it is
        refused (stale_lease). Renew before expiresAt while you work; release it if you give the task up."""
        params = {"entityIds": [f"task:{taskId}"], "ttl": ttl, "mode": "exclusive", "sessionId": sessionId,
                  "reason": reason}
        return cast(Lease, await self.call("lease.acquire", params))

    async def renew_lease(self, leaseId: LeaseId, ttl: RenewTtl) -> Renewed:
        """Extend a lease you hold while you are still working on its entities; it then ends ttl seconds from
        now. Fails with not found (-32004) when it already ended (expired, released, or you were gone too long)."""
        return cast(Renewed, await self.call("lease.renew", {"leaseId": leaseId, "ttl": ttl}))

    async def release_lease(self, leaseId: LeaseId) -> Released:
        """Release a lease as soon as you are done with its entities, so other agents can take them. Do it
        when your edit is committed or abandoned, not at the end of your whole task: an exclusive lease you
        forget blocks everyone else until its TTL runs out. Only the agent that acquired the lease can
        release it."""
        return cast(Released, await self.call("lease.release", {"leaseId": leaseId}))

    async def list_leases(self, entityId: LeaseEntity = None, agentId: LeaseAgent = None,
                          cursor: LeaseCursor = None, limit: LeaseLimit = 100) -> LeaseList:
        """List live leases: those covering one entity, those of one agent, or all of your namespace. Each has
        its leaseId, agentId, mode, entityIds, covers (entities held through the graph), fencingToken and
        expiresAt. When the reply has nextCursor, call again with cursor=nextCursor for the rest."""
        params = {"entityId": entityId, "agentId": agentId, "cursor": cursor, "limit": limit}
        return cast(LeaseList, await self.call("lease.list", params))

    async def send_message(self, to: To, body: Body, subject: MessageSubject = None, ttl: MessageTtl = None,
                           id: MessageId = None) -> Sent:
        """Send a message to another agent, to every agent with a role, or to every agent of a session: a
        follow-up, a question to a lease holder, a handoff note. A connected recipient gets it at once; an
        absent one finds it in its inbox. Returns the messageId and the recipients."""
        params = {"to": to, "body": body, "subject": subject, "ttl": ttl, "id": id}
        return cast(Sent, await self.call("mailbox.send", params))

    async def read_inbox(self, since: InboxSince = 0, limit: InboxLimit = 100, unreadOnly: UnreadOnly = False) -> Inbox:
        """Read your messages, oldest first, including lease conflict alerts (subject 'lease.conflict'): call it
        when you start or resume work. Each has seq, messageId, from, subject, body, sentAt and read. When the
        reply has nextSince, call again with since=nextSince. Acknowledge what you handled with ack_messages."""
        params = {"since": since, "limit": limit, "unreadOnly": unreadOnly}
        return cast(Inbox, await self.call("mailbox.read", params))

    async def ack_messages(self, messageIds: MessageIds) -> Acked:
        """Mark messages as read once you handled them, so read_inbox with unreadOnly skips them. Pass the
        messageIds you got from read_inbox or from a mailbox notification; acking is idempotent, and an id
        you do not have is ignored. Unacked messages stay until their TTL, so ack what you acted on."""
        return cast(Acked, await self.call("mailbox.ack", {"messageIds": messageIds}))

    async def message_status(self, messageId: SentId) -> Receipt:
        """See how far a message you sent has got, per recipient: when it was stored in their mailbox, pushed
        to a live connection of theirs, surfaced in their context (a hook or a tool's notices) and acked. A
        stage not reached yet is null. Fails with not found (-32004) for a message you did not send or that
        expired."""
        return cast(Receipt, await self.call("mailbox.status", {"messageId": messageId}))

    def registrations(self) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
        """Every coordination tool with its annotations."""
        return [(self.who_is_here, READ), (self.acquire_lease, WRITE), (self.claim_task, WRITE),
                (self.renew_lease, IDEMPOTENT),
                (self.release_lease, IDEMPOTENT), (self.list_leases, READ), (self.send_message, WRITE),
                (self.read_inbox, READ), (self.ack_messages, IDEMPOTENT), (self.message_status, READ)]


def registrations(tools: Tools) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
    """The coordination tools, each running its method through `tools.call`."""
    return CoordinationTools(tools.call).registrations()


NAMES = frozenset({"who_is_here", "acquire_lease", "claim_task", "renew_lease", "release_lease", "list_leases",
                   "send_message", "read_inbox", "ack_messages", "message_status"})
