"""What the MCP tools take and return, in the wire's camelCase.

Inputs reuse the field types of the JSON-RPC params models, so a tool and its method accept the same
values. Outputs are TypedDicts that allow extra keys: a tool returns exactly the JSON-RPC result,
key for key, and each one's outputSchema documents the keys an agent can rely on.
"""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

from memento_sessions.sessions.methods import LabelKey, LabelValue
from memento_sessions.sessions.models import ClientId, EntityId, EventIn, SessionState

# Inputs: the params of SPEC section 6, one Annotated type per argument.
SessionId = Annotated[ClientId, Field(description="The session's id, as returned by create_session or "
                                                  "list_sessions (e.g. 'sess-3f2a...').")]
EntityIds = Annotated[list[EntityId] | None, Field(max_length=256, description="Codebase entity ids this "
                      "session works on (functions, files, clusters...), as in the knowledge graph.")]
NewSessionId = Annotated[ClientId | None, Field(description="Your own id for the session; omit it to get "
                                                            "'sess-<uuid>'.")]
Ttl = Annotated[int | None, Field(ge=60, le=86400, description="Seconds of inactivity before the session "
                                                                "expires; omit for the daemon's default.")]
Labels = Annotated[dict[LabelKey, LabelValue] | None, Field(max_length=32, description="Free key/value labels, "
                                                            "e.g. {\"task\": \"fix-login\"}.")]
Event = Annotated[EventIn, Field(description="The event: at least its type; the server adds seq, actor (you), "
                                            "sessionId and, when absent, timestamp.")]
Condensed = Annotated[bool, Field(description="True for a summary (counts, entities, transitions, perfDelta) "
                                              "instead of every event.")]
Since = Annotated[int, Field(ge=0, description="Return only events with seq greater than this.")]
Limit = Annotated[int | None, Field(ge=1, le=10_000, description="At most this many events.")]
StateFilter = Annotated[SessionState | None, Field(description="Only sessions in this state.")]
AgentFilter = Annotated[ClientId | None, Field(description="Only sessions this agent has joined.")]
ListLimit = Annotated[int, Field(ge=1, le=500, description="At most this many sessions, newest first.")]
Final = Annotated[bool, Field(description="True to complete the session: its state becomes 'completed' and "
                                          "its data expires after a short grace period.")]
EntityFilter = Annotated[EntityId | None, Field(description="Only transitions touching this entity id.")]
AgentId = Annotated[ClientId, Field(description="The agent whose work to isolate.")]
ClusterId = Annotated[EntityId, Field(description="Id of a SemanticCluster node of the knowledge graph.")]
Days = Annotated[int, Field(ge=1, le=365, description="How many days back to look.")]

Json = dict[str, Any]
_OPEN = ConfigDict(extra="allow")


@with_config(_OPEN)
class Created(TypedDict):
    sessionId: str
    state: SessionState
    seq: int
    agentIds: list[str]
    expiresAt: str
    epoch: NotRequired[str]


@with_config(_OPEN)
class Joined(TypedDict):
    sessionId: str
    agentIds: list[str]
    state: SessionState
    seq: int


@with_config(_OPEN)
class Emitted(TypedDict):
    seq: int
    duplicate: bool


@with_config(_OPEN)
class SessionView(TypedDict):
    sessionId: str
    state: SessionState
    agentIds: list[str]
    seq: int
    createdAt: str
    updatedAt: str
    expiresAt: str
    lastCheckpoint: Json | None
    labels: dict[str, str]
    epoch: NotRequired[str]
    parentSessionId: NotRequired[str]
    forkedAtSeq: NotRequired[int]


@with_config(_OPEN)
class SessionDetail(TypedDict):
    session: SessionView
    events: NotRequired[list[Json]]
    counts: NotRequired[dict[str, int]]
    entities: NotRequired[dict[str, int]]
    transitions: NotRequired[list[Json]]
    perfDelta: NotRequired[float]
    lastCheckpoint: NotRequired[Json | None]


@with_config(_OPEN)
class SessionList(TypedDict):
    sessions: list[SessionView]


@with_config(_OPEN)
class Checkpoint(TypedDict):
    checkpointId: str
    outcome: str
    brokeDuring: bool
    keyImpacts: list[Any]
    perfDelta: float
    actors: list[str]
    entityIds: list[str]
    snapshotId: NotRequired[Any]


@with_config(_OPEN)
class Transitions(TypedDict):
    transitions: list[Json]


@with_config(_OPEN)
class Isolated(TypedDict):
    agentId: str
    events: list[Json]
    impacts: list[Json]
    totalPerfDelta: float


@with_config(_OPEN)
class Handoff(TypedDict):
    sessionId: str
    state: str
    agentIds: list[str]
    recentChanges: list[Json]
    kgContext: list[Json]
    joiningAdvice: str


@with_config(_OPEN)
class Outcomes(TypedDict):
    clusterName: str | None
    specTitles: list[str]
    recentSessions: list[Any]
    avgPerfDelta: float | None
    brokenCount: int
