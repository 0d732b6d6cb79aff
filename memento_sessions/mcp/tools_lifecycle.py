"""The MCP tools of time travel, diff, snapshots, compaction, fork and the lifecycle.

Like the other tools, each one runs its JSON-RPC method through the shared registry (by way of
`Tools.call`), so validation, scopes, namespaces and results are the method's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, NotRequired, Protocol, cast

from mcp_types import ToolAnnotations
from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from memento_sessions.mcp.models import Noticed
from memento_sessions.sessions.models import ClientId, Seq

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                             open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                              open_world_hint=False)

SessionId = Annotated[ClientId, Field(description="The session's id, as returned by create_session or list_sessions.")]
AtSeq = Annotated[Seq, Field(description="A seq of the session: the state right after that event.")]
FromSeq = Annotated[Seq, Field(description="The start of the range: the state right after this seq.")]
ToSeq = Annotated[Seq, Field(description="The end of the range, at least fromSeq and at most the session's seq.")]
BeforeSeq = Annotated[Seq | None, Field(default=None, ge=1, description="Remove events up to this seq; omit to "
                                                                       "keep the last 1,000 (MEMENTO_COMPACT_KEEP).")]
NewSessionId = Annotated[ClientId | None, Field(default=None, description="The fork's id; omit for 'sess-<uuid>'.")]
Open = ConfigDict(extra="allow")


@with_config(Open)
class View(TypedDict):
    sessionId: str
    state: str
    seq: int
    agentIds: list[str]


@with_config(Open)
class AtView(Noticed):
    session: View
    atSeq: int
    events: int
    counts: dict[str, int]
    entities: dict[str, int]
    transitions: list[dict[str, Any]]
    perfDelta: float | None
    truncated: NotRequired[list[str]]


@with_config(Open)
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


@with_config(Open)
class Snapshotted(Noticed):
    snapshotId: str
    seq: int
    createdAt: str


@with_config(Open)
class Compacted(Noticed):
    snapshotId: str | None
    seq: int
    compactedSeq: int
    removed: int
    requestedSeq: int


@with_config(Open)
class Forked(Noticed):
    sessionId: str
    parentSessionId: str
    forkedAtSeq: int
    seq: int
    state: str
    epoch: str
    agentIds: list[str]
    expiresAt: str


@with_config(Open)
class Moved(Noticed):
    sessionId: str
    status: Literal["active", "suspended", "archived"]
    seq: int
    epoch: str


class Caller(Protocol):
    """What these tools need of `mcp.tools.Tools`: run a method as the caller, errors as tool errors."""

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Run `method` with `params` as the tool's caller."""


class LifecycleTools:
    """The event-sourcing and lifecycle tools over one caller."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    async def get_session_at(self, sessionId: SessionId, atSeq: AtSeq) -> AtView:
        """See a session as it was right after one event (time travel): its state (working or broken), the
        agents that had emitted, event counts by type, entities touched, transitions and summed perfDelta,
        exactly as the live condensed view would have shown them then. Use it to find out what the session
        looked like before a change broke it. Fails with invalid params (-32602) when atSeq is beyond the
        session's seq, and with conflict (-32009, reason compacted) when those events were compacted away."""
        return cast(AtView, await self.caller.call("session.get", {"sessionId": sessionId, "atSeq": atSeq}))

    async def diff_session(self, sessionId: SessionId, fromSeq: FromSeq, toSeq: ToSeq) -> Diff:
        """Compare a session at two points: what happened after fromSeq up to toSeq. Returns the state at each
        end, how many events and of which types, the entities changed, the agents that joined in between,
        the working/broken transitions and the summed perfDelta. Use it to review a stretch of someone's
        work or to see what a range of changes did. fromSeq after toSeq is invalid params (-32602)."""
        params = {"sessionId": sessionId, "fromSeq": fromSeq, "toSeq": toSeq}
        return cast(Diff, await self.caller.call("session.diff", params))

    async def snapshot_session(self, sessionId: SessionId) -> Snapshotted:
        """Save the session's condensed state at its current seq, so later reads and time travel to this point
        are quick. Returns the snapshot's id, its seq and when it was made. Safe to repeat."""
        return cast(Snapshotted, await self.caller.call("session.snapshot", {"sessionId": sessionId}))

    async def compact_session(self, sessionId: SessionId, beforeSeq: BeforeSeq = None) -> Compacted:
        """Free room in a long session: snapshot its state at beforeSeq and remove the events up to it, keeping
        the recent ones. Reads below that point then return the snapshot instead of the events. Compaction
        never removes events a pending checkpoint still needs, so it may stop earlier than asked: the reply's
        compactedSeq says where it stopped and removed how many events went."""
        params = {"sessionId": sessionId, "beforeSeq": beforeSeq}
        return cast(Compacted, await self.caller.call("session.compact", params))

    async def fork_session(self, sessionId: SessionId, atSeq: AtSeq, newSessionId: NewSessionId = None) -> Forked:
        """Branch a session: a new session whose history is the original's events 1..atSeq (same seqs, same
        content) and whose next event is atSeq+1, to try another approach from a known point. The original
        is not changed; a suspended session can be forked too. Returns the fork's id, its state at atSeq and
        its parentSessionId and forkedAtSeq."""
        params = {"sessionId": sessionId, "atSeq": atSeq, "newSessionId": newSessionId}
        return cast(Forked, await self.caller.call("session.fork", params))

    async def suspend_session(self, sessionId: SessionId) -> Moved:
        """Put a session you are pausing into long-term storage, whole and exact, instead of letting it expire.
        Nobody can emit into it while it is suspended; resume_session brings it back as it was. Safe to
        repeat. A completed session is not suspended (conflict -32009)."""
        return cast(Moved, await self.caller.call("session.suspend", {"sessionId": sessionId}))

    async def resume_session(self, sessionId: SessionId) -> Moved:
        """Bring a suspended session back to life with the same seqs and epoch, so agents and subscribers carry
        on where they were. Fails with conflict (-32009, reason active) when the session is not suspended."""
        return cast(Moved, await self.caller.call("session.resume", {"sessionId": sessionId}))

    def registrations(self) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
        """Every tool with its annotations."""
        return [(self.get_session_at, READ), (self.diff_session, READ), (self.snapshot_session, IDEMPOTENT),
                (self.compact_session, DESTRUCTIVE), (self.fork_session, WRITE), (self.suspend_session, IDEMPOTENT),
                (self.resume_session, IDEMPOTENT)]


def registrations(tools: Caller) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
    """The event-sourcing and lifecycle tools with their annotations."""
    return LifecycleTools(tools).registrations()


NAMES = frozenset({"get_session_at", "diff_session", "snapshot_session", "compact_session", "fork_session",
                   "suspend_session", "resume_session"})
