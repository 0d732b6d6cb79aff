"""What every JSON-RPC method returns, as TypedDicts in the wire's camelCase: the typed results of the client's
methods, and the results api/ declares for each method (the daemon imports them from here, the client being
the leaf both sides may import).

Each result declares every key its method returns, required when the method always returns it, and
NotRequired when only some replies carry it (a page's `nextSince`, a condensed view's `truncated`);
tests/test_mcp.py checks the tools' declarations against real replies. They allow extra keys, so that a
key a method gains later reaches agents at once instead of failing an MCP tool's output check. The MCP
tools publish them as their outputSchema and `rpc.discover` as each method's result schema.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

SessionState = Literal["working", "broken", "coordinating", "completed"]  # sessions.models.SessionState
Json = dict[str, Any]
_OPEN = ConfigDict(extra="allow")


@with_config(_OPEN)
class Noticed(TypedDict):
    """What every MCP tool's result may add (the usage tool's aside): the caller's messages and conflict alerts
    not surfaced to it yet (mailbox.surface). A JSON-RPC reply never carries it."""

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


# coordination
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
    recipients: list[Json]  # {agentId, stored, pushed, surfaced, acked}: each stage's first time, null until then


@with_config(_OPEN)
class Notices(TypedDict):
    notices: list[Json]  # {kind: message|conflict|broke|fixed, messageId, from, subject, sentAt, body, truncated?}


@with_config(_OPEN)
class HookAnswer(TypedDict):
    output: Json  # the hook's JSON output for the agent (docs/hooks.md)


@with_config(_OPEN)
class Commit(TypedDict):
    sha: str
    sessionId: str
    seq: int
    agentId: str
    recordedAt: str


# event sourcing and the lifecycle
@with_config(_OPEN)
class View(TypedDict):
    sessionId: str
    state: str
    seq: int
    agentIds: list[str]


@with_config(_OPEN)
class AtView(Noticed):
    session: View
    atSeq: int
    events: int
    counts: dict[str, int]
    entities: dict[str, int]
    transitions: list[dict[str, Any]]
    perfDelta: float | None
    truncated: NotRequired[list[str]]


@with_config(_OPEN)
class Diff(Noticed):
    fromSeq: int
    toSeq: int
    stateFrom: str
    stateTo: str
    events: int
    byType: dict[str, int]
    entitiesChanged: list[str]
    agentsJoined: list[str]
    agentsLeft: list[str]
    transitions: list[dict[str, Any]]
    perfDelta: float | None


@with_config(_OPEN)
class Snapshotted(Noticed):
    snapshotId: str
    seq: int
    createdAt: str


@with_config(_OPEN)
class Compacted(Noticed):
    snapshotId: str | None
    seq: int
    compactedSeq: int
    removed: int
    requestedSeq: int


@with_config(_OPEN)
class Forked(Noticed):
    sessionId: str
    parentSessionId: str
    forkedAtSeq: int
    seq: int
    state: str
    epoch: str
    agentIds: list[str]
    expiresAt: str


@with_config(_OPEN)
class Moved(Noticed):
    sessionId: str
    status: Literal["active", "suspended", "archived"]
    seq: int
    epoch: str


# ingested conversations
@with_config(_OPEN)
class Conversation(Noticed):
    """One page of a thread's blocks and the bounded rest of the conversation state."""

    sessionId: str
    subagentId: str | None
    blocks: list[Json]
    blockCount: int
    nextCursor: NotRequired[int]
    subagents: list[Json]
    subagentCount: int
    idle: bool
    metadata: Json


# usage
@with_config(_OPEN)
class Usage(TypedDict):
    """Totals (the most trusted source's), totals by source, and one page of runs."""

    sessionId: NotRequired[str]  # one of the three: whose usage this is
    agentId: NotRequired[str]
    namespace: NotRequired[str]
    totals: Json
    bySource: Json
    runs: list[Json]
    nextCursor: NotRequired[str]


# the methods no MCP tool calls
@with_config(_OPEN)
class Empty(TypedDict):
    """`{}`: session.leave, session.unsubscribe, sessions.watch."""


@with_config(_OPEN)
class EmittedBatch(TypedDict):
    seqs: list[int]
    duplicates: NotRequired[list[int]]  # the seqs of events stored before (same id)
    conflicts: NotRequired[list[Json]]  # leases of other agents the events touched


@with_config(_OPEN)
class Subscribed(TypedDict):
    seq: int
    epoch: str
    recovered: bool
    snapshot: NotRequired[Json]  # the compacted state a replay starts from


@with_config(_OPEN)
class Upserted(TypedDict):
    nodes: int
    edges: int


@with_config(_OPEN)
class Cleared(TypedDict):
    sessionId: str
    cleared: bool


@with_config(_OPEN)
class Roles(TypedDict):
    agentId: str
    roles: list[str]


@with_config(_OPEN)
class Discovered(TypedDict):
    """The OpenRPC 1.3 document of the whole API."""

    openrpc: str
    info: Json
    methods: list[Json]
