"""The arguments of the MCP tools, one Annotated type each, with the description an agent reads.

They reuse the field types of the JSON-RPC params models and take their bounds from those models' fields
(`Bounds`), so a tool and its method accept the same values and a bound changed on a method is changed on
its tool. `api/table*.py` names them in each tool's declaration.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

import annotated_types
from pydantic import BaseModel, Field, JsonValue, StrictBool, StrictInt

from memento_sessions.bridge.methods import IsolateParams, OutcomesParams
from memento_sessions.coordination.methods import AcquireParams, ListLeasesParams, ReadParams, Recipient, RenewParams
from memento_sessions.sessions.conversation import CONVERSATION_PAGE, ConversationParams
from memento_sessions.sessions.methods import CreateParams, GetParams, LabelKey, LabelValue, ListCursor, ListParams
from memento_sessions.sessions.models import ClientId, EntityId, EventIn, Seq, SessionState, ShortText
from memento_sessions.sessions.paging import PAGE
from memento_sessions.usage.methods import UsageParams


@dataclass(frozen=True)
class Bounds(annotated_types.GroupedMetadata):
    """The constraints (ge, le, max_length, ...) of one field of a JSON-RPC params model."""

    model: type[BaseModel]
    name: str

    def __iter__(self) -> Iterator[object]:
        yield from self.model.model_fields[self.name].metadata


def since_text(events: str) -> str:
    """What a paged tool's `since` means, said once for every tool that pages `events`."""
    return (f"Return only {events} with seq greater than this: 0 for the first page, then the previous reply's "
            "nextSince.")


def limit_text(of_events: str) -> str:
    """What a paged tool's `limit` means, said once for every tool that pages events."""
    return (f"At most this many {of_events} in this reply; omit for up to {PAGE:,}. A page may hold fewer when "
            "events are large: keep paging while the reply has nextSince.")


# Inputs: the params of the JSON-RPC methods, one Annotated type per argument.
SessionId = Annotated[ClientId, Field(description="The session's id, as returned by create_session or "
                                                  "list_sessions (e.g. 'sess-3f2a...').")]
EntityIds = Annotated[list[EntityId] | None, Bounds(CreateParams, "entityIds"), Field(
    description="Codebase entity ids this session works on (functions, files, clusters...), as in the "
                "knowledge graph.")]
NewSessionId = Annotated[ClientId | None, Field(description="Your own id for the session; omit it to get "
                                                            "'sess-<uuid>'.")]
Ttl = Annotated[StrictInt | None, Bounds(CreateParams, "ttl"), Field(
    description="Seconds of inactivity before the session expires, at most the daemon's default; omit for "
                "that default.")]
Labels = Annotated[dict[LabelKey, LabelValue] | None, Bounds(CreateParams, "labels"), Field(
    description="Free key/value labels, e.g. {\"task\": \"fix-login\"}.")]
Event = Annotated[EventIn, Field(description="The event: at least its type; the server adds seq, actor (you), "
                                            "sessionId and, when absent, timestamp.")]
Condensed = Annotated[StrictBool, Field(description="True for a summary (counts, entities, transitions, perfDelta) "
                                              "instead of every event.")]
Since = Annotated[StrictInt, Bounds(GetParams, "since"), Field(description=since_text("events"))]
Limit = Annotated[StrictInt | None, Bounds(GetParams, "limit"), Field(description=limit_text("events"))]
StateFilter = Annotated[SessionState | None, Field(description="Only sessions in this state.")]
AgentFilter = Annotated[ClientId | None, Field(description="Only sessions this agent has joined.")]
ListLimit = Annotated[StrictInt | None, Bounds(ListParams, "limit"), Field(
    description=f"At most this many sessions, newest first; omit for {ListParams.model_fields['limit'].default}.")]
Cursor = Annotated[ListCursor | None, Field(
    description="Omit for the first page; then the previous reply's nextCursor, with the same state and agentId "
                "filters, to get the sessions that follow.")]
Final = Annotated[StrictBool, Field(description="True to complete the session: its state becomes 'completed' and "
                                          "its data expires after a short grace period.")]
EntityFilter = Annotated[EntityId | None, Field(description="Only transitions touching this entity id.")]
AgentId = Annotated[ClientId, Field(description="The agent whose work to isolate.")]
IsolateSince = Annotated[StrictInt, Bounds(IsolateParams, "since"), Field(description=since_text("the agent's events"))]
IsolateLimit = Annotated[StrictInt | None, Bounds(IsolateParams, "limit"), Field(
    description=limit_text("of the agent's events"))]
ClusterId = Annotated[EntityId, Field(description="Id of a SemanticCluster node of the knowledge graph.")]
Days = Annotated[StrictInt | None, Bounds(OutcomesParams, "days"), Field(
    description=f"How many days back to look; omit for {OutcomesParams.model_fields['days'].default}.")]

# The coordination tools
CoordinationSessionId = Annotated[ClientId, Field(description="The session's id.")]
LeaseEntityIds = Annotated[list[EntityId], Bounds(AcquireParams, "entityIds"), Field(
    description="The codebase entities to lease, e.g. ['file:src/auth.py'] or ['sym:src/auth.py:login'].")]
LeaseTtl = Annotated[StrictInt, Bounds(AcquireParams, "ttl"),
                     Field(description="Seconds the lease lasts unless renewed.")]
Mode = Annotated[Literal["exclusive", "shared", "intent"], Field(
    description="'exclusive' (granted only if nobody else holds any of them), 'shared' (advisory: always "
                "granted, conflicts reported) or 'intent' (a plan, holding nothing: always granted, with the "
                "'overlaps' of other agents' leases and intents up to two graph relationships away, each with "
                "its path 'via'; they are told too).")]
LeaseSession = Annotated[ClientId | None, Field(description="The session you work in, if any.")]
LeaseReason = Annotated[ShortText | None, Field(description="Why you take it, shown to other agents.")]
TaskId = Annotated[ClientId, Field(description="The task's id: the lease is on the entity 'task:<taskId>'.")]
LeaseId = Annotated[ClientId, Field(description="The leaseId returned by acquire_lease.")]
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

# The lifecycle tools
LifecycleSessionId = Annotated[ClientId, Field(description="The session's id, as returned by create_session or "
                                                           "list_sessions.")]
AtSeq = Annotated[Seq, Field(description="A seq of the session: the state right after that event.")]
FromSeq = Annotated[Seq, Field(description="The start of the range: the state right after this seq.")]
ToSeq = Annotated[Seq, Field(description="The end of the range, at least fromSeq and at most the session's seq.")]
BeforeSeq = Annotated[Seq | None, Field(default=None, ge=1, description="Remove events up to this seq; omit to "
                                                                       "keep the last 1,000 (MEMENTO_COMPACT_KEEP).")]
ForkSessionId = Annotated[ClientId | None, Field(default=None, description="The fork's id; omit for 'sess-<uuid>'.")]

# The conversation tool
SubagentId = Annotated[str | None, Bounds(ConversationParams, "subagentId"), Field(
    description="Omit for the main conversation; a subagent's id (from `subagents`) for that subagent's blocks.")]
BlockCursor = Annotated[StrictInt, Bounds(ConversationParams, "cursor"), Field(
    description="0 for the first page, then the previous reply's nextCursor.")]
BlockLimit = Annotated[StrictInt | None, Bounds(ConversationParams, "limit"), Field(
    description=f"At most this many blocks in this reply; omit for up to {CONVERSATION_PAGE}. A page may hold "
                "fewer when blocks are large: keep paging while the reply has nextCursor.")]

# The usage tool
UsageSession = Annotated[str | None, Bounds(UsageParams, "sessionId"), Field(
    description="A session's usage and its runs; omit (with agentId omitted too) for your namespace's totals.")]
UsageAgent = Annotated[str | None, Bounds(UsageParams, "agentId"), Field(
    description="An agent's usage and its runs across sessions (not together with sessionId).")]
UsageSince = Annotated[datetime | None, Field(
    description="Only runs started at or after this time (ISO 8601 with a zone).")]
UsageCursor = Annotated[str | None, Bounds(UsageParams, "cursor"), Field(
    description="Omit for the first page, then the previous reply's nextCursor.")]
UsageLimit = Annotated[StrictInt, Bounds(UsageParams, "limit"), Field(
    description="At most this many runs in this reply.")]
