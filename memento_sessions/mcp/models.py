"""What the MCP tools take and return, in the wire's camelCase.

Inputs reuse the field types of the JSON-RPC params models, and take their bounds from those models'
fields (`Bounds`), so a tool and its method accept the same values and a bound changed on a method is
changed on its tool. Outputs are TypedDicts that allow extra keys: a tool returns exactly the JSON-RPC
result, key for key, and each one's outputSchema documents the keys an agent can rely on.

Each output declares every key its method returns, required when the method always returns it, and
NotRequired when only some replies carry it (a page's `nextSince`, a condensed view's `truncated`);
tests/test_mcp.py checks each declaration against real replies. Extra keys stay allowed so that a key
a method gains later reaches agents at once instead of failing the tool's output check.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, with_config
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

from memento_sessions.bridge.methods import IsolateParams, OutcomesParams
from memento_sessions.sessions.methods import CreateParams, GetParams, LabelKey, LabelValue, ListCursor, ListParams
from memento_sessions.sessions.models import ClientId, EntityId, EventIn, SessionState
from memento_sessions.sessions.paging import PAGE


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

Json = dict[str, Any]
_OPEN = ConfigDict(extra="allow")


@with_config(_OPEN)
class Noticed(TypedDict):
    """What every tool's result may add: the caller's messages and conflict alerts not surfaced to it yet."""

    notices: NotRequired[list[Json]]


@with_config(_OPEN)
class Created(Noticed):
    sessionId: str
    state: SessionState
    seq: int
    agentIds: list[str]
    expiresAt: str
    epoch: str


@with_config(_OPEN)
class Joined(Noticed):
    sessionId: str
    agentIds: list[str]
    state: SessionState
    seq: int


@with_config(_OPEN)
class Emitted(Noticed):
    seq: int
    duplicate: bool


@with_config(_OPEN)
class SessionView(TypedDict):
    sessionId: str
    state: SessionState
    agentIds: list[str]
    seq: int
    epoch: str
    createdAt: str
    updatedAt: str
    expiresAt: str
    lastCheckpoint: Json | None
    labels: dict[str, str]
    status: Literal["active", "suspended", "completed", "archived"]
    compactedSeq: NotRequired[int]
    onIdle: NotRequired[Literal["expire", "suspend"]]
    parentSessionId: NotRequired[str]
    forkedAtSeq: NotRequired[int]


@with_config(_OPEN)
class SessionDetail(Noticed):
    """A page of events (`events`, `nextSince` when more exist), or the condensed view (the other keys)."""

    session: SessionView
    events: NotRequired[list[Json]]
    nextSince: NotRequired[int]
    counts: NotRequired[dict[str, int]]
    entities: NotRequired[dict[str, int]]
    transitions: NotRequired[list[Json]]
    perfDelta: NotRequired[float | None]  # null when the sum is not a finite number
    truncated: NotRequired[list[str]]  # the condensed lists that were cut
    lastCheckpoint: NotRequired[Json | None]
    usage: NotRequired[Json]  # condensed: the session's usage totals (usage.get)


@with_config(_OPEN)
class SessionList(Noticed):
    sessions: list[SessionView]
    nextCursor: NotRequired[str]


@with_config(_OPEN)
class Checkpoint(Noticed):
    checkpointId: str
    outcome: str
    brokeDuring: bool
    keyImpacts: list[Any]
    perfDelta: float
    actors: list[str]
    entityIds: list[str]
    snapshotId: NotRequired[int]  # a broken outcome's failure snapshot, stored
    snapshotPending: NotRequired[bool]  # ... or kept in Redis until Postgres takes it


Source = Literal["live", "archive"]  # read from Redis, or rebuilt from anchors and snapshots after expiry


@with_config(_OPEN)
class Transition(TypedDict):
    fromSeq: int
    toSeq: int
    changeInfo: Json | None
    impact: Json | None
    kgContext: NotRequired[Json]  # specs, clusters and benchmarks around the window, when the graph knows any
    checkpointId: NotRequired[str]  # archived: the transition is known from this checkpoint's anchor only


@with_config(_OPEN)
class Transitions(Noticed):
    transitions: list[Transition]
    source: Source


@with_config(_OPEN)
class EntityImpact(TypedDict):
    entityId: str
    anchors: list[Json]
    count: int


@with_config(_OPEN)
class Isolated(Noticed):
    agentId: str
    events: list[Json]
    nextSince: NotRequired[int]
    impacts: list[EntityImpact]
    totalPerfDelta: float
    source: Source
    usage: Json | None  # the agent's share of the session's usage totals; null when the session keeps none for it


@with_config(_OPEN)
class Handoff(Noticed):
    sessionId: str
    state: str
    agentIds: list[str]
    recentChanges: list[Json]
    kgContext: list[Json]
    joiningAdvice: str
    source: Source
    leases: list[Json]  # live leases on the handoff's entities (coordination)
    openConflicts: list[Json]  # those held by agents outside the session
    usage: Json  # the session's usage totals (usage.get)
    freshness: Json | None  # the agent's last recorded git state (bridge/freshness.py); null when none


@with_config(_OPEN)
class Outcomes(Noticed):
    clusterName: str | None
    specTitles: list[str]
    recentSessions: list[Any]
    avgPerfDelta: float | None
    brokenCount: int
