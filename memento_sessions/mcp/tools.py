"""The MCP tools: each one calls its JSON-RPC method through the shared registry.

One implementation, two transports: a tool builds the same params a WebSocket client would send and
runs them through `Registry.call`, so validation, scopes, namespaces and results are the method's
own. The caller is the token of the HTTP request (set by `streamable.BearerAuth`) or, on stdio, the
MEMENTO_TOKEN verified at start.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import ValidationError

from memento_sessions import __version__
from memento_sessions.auth import Identity
from memento_sessions.errors import InvalidParams, MethodNotFound, RpcError
from memento_sessions.mcp import tools_coordination, tools_ingest, tools_lifecycle, tools_usage
from memento_sessions.mcp.models import (
    AgentFilter,
    AgentId,
    Checkpoint,
    ClusterId,
    Condensed,
    Created,
    Cursor,
    Days,
    Emitted,
    EntityFilter,
    EntityIds,
    Event,
    Final,
    Handoff,
    Isolated,
    IsolateLimit,
    IsolateSince,
    Joined,
    Labels,
    Limit,
    ListLimit,
    NewSessionId,
    Outcomes,
    SessionDetail,
    SessionId,
    SessionList,
    Since,
    StateFilter,
    Transitions,
    Ttl,
)
from memento_sessions.ratelimit import Buckets
from memento_sessions.rpc import Call, Registry, Result, field_errors
from memento_sessions.sessions.condense import KEEP
from memento_sessions.sessions.methods import ListParams
from memento_sessions.sessions.paging import PAGE

NOTICES = "mailbox.surface"  # the method a tool's notices come from (coordination's; absent in some tests)
CALLER: ContextVar[Identity | None] = ContextVar("memento_mcp_caller", default=None)
# The MCP request id of the tool call being run, for the log line of a failure.
REQUEST_ID: ContextVar[str | None] = ContextVar("memento_mcp_request_id", default=None)

INSTRUCTIONS = (
    "memento-sessions is the shared, live record of a swarm of agents' work sessions. Create or join a "
    "session, emit an event for every meaningful change (what changed, whether the code still works), and "
    "before taking over someone else's work read get_handoff_context. Everything you see is limited to "
    "your token's namespace."
)

# The numbers a description quotes ({page} in a docstring), taken from the code that enforces them.
FACTS = {"page": f"{PAGE:,}", "kept": f"{KEEP:,}", "list_page": str(ListParams.model_fields["limit"].default)}

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                             open_world_hint=False)


def describe(error: RpcError) -> str:
    """`invalid params (-32602); event.type: String should match ...`: message, code and each field."""
    return "; ".join([f"{error.message} ({error.code})", *_details(error.data)])


def _details(data: Any) -> list[str]:
    if isinstance(data, list):
        return [_field(item) for item in data]
    if isinstance(data, dict):
        return [f"{key}: {value}" for key, value in data.items()]
    return [] if data is None else [str(data)]


def _field(item: Any) -> str:
    if isinstance(item, dict) and "field" in item and "message" in item:
        return f"{item['field']}: {item['message']}"
    return str(item)


class Tools:
    """The ten tools, bound to one registry and one way of knowing the caller."""

    def __init__(self, registry: Registry, identity: Identity | None = None, rate_limit: float = 0.0) -> None:
        self.registry = registry
        self.identity = identity
        self.limits = Buckets(rate_limit) if rate_limit > 0 else None

    def caller(self) -> Identity:
        """The fixed stdio identity, else the one the HTTP middleware set for this request."""
        who = self.identity or CALLER.get()
        if who is None:
            raise ToolError("unauthenticated (-32001): no verified token for this request")
        return who

    async def call(self, method: str, params: dict[str, Any]) -> Result:
        """Run `method` as the caller; a JSON-RPC error becomes the tool's error result."""
        given = {name: value for name, value in params.items() if value is not None}
        who = self.caller()
        try:
            if self.limits is not None:
                self.limits.take((who.namespace, who.agent_id))
            result = await self.registry.call(Call(who), method, given, REQUEST_ID.get())
        except RpcError as exc:
            raise ToolError(describe(exc)) from None
        return await self.noticed(who, result)

    async def noticed(self, who: Identity, result: Result) -> Result:
        """The result with `notices` when the caller has messages or conflict alerts not surfaced yet: clients
        drop MCP notifications, a tool result reaches the model. Failing to read them fails nothing."""
        if NOTICES not in self.registry.methods:
            return result
        try:
            found = (await self.registry.call(Call(who), NOTICES, {}, REQUEST_ID.get()))["notices"]
        except RpcError:
            return result
        return {**result, "notices": found} if found else result

    async def create_session(self, entityIds: EntityIds = None, sessionId: NewSessionId = None, ttl: Ttl = None,
                             labels: Labels = None) -> Created:
        """Start a new shared work session with you as its first agent. Call it when you begin a task that
        other agents may watch or take over. Pass the codebase entity ids you are about to work on
        (a 'start' event naming them becomes seq 1) and optional labels. Returns the sessionId to use in
        every other tool, its state ('working'), its current seq, its agentIds and when it expires."""
        result = await self.call("session.create", {"entityIds": entityIds, "sessionId": sessionId,
                                                    "ttl": ttl, "labels": labels})
        return cast(Created, result)

    async def join_session(self, sessionId: SessionId) -> Joined:
        """Add yourself to an existing session's agents, before emitting into it or taking it over.
        Joining twice is harmless. Returns the sessionId, every agent in it, its state ('working',
        'broken', 'coordinating' or 'completed') and its current seq (the number of events so far)."""
        return cast(Joined, await self.call("session.join", {"sessionId": sessionId}))

    async def emit_event(self, sessionId: SessionId, event: Event) -> Emitted:
        """Record one thing that happened in a session: call it after every meaningful change. Give the event
        a type ('modified', 'broke', 'test_pass', 'checkpoint', 'handoff' or your own), and where it
        applies changeInfo (entityIds, operation), stateTransition (from/to working|broken), impact
        (severity, testsFailed, perfDelta) and free-form data. 'broke' marks the session broken, 'test_pass'
        working. Set event.id to make retries safe: the same id returns the same seq with duplicate=true
        and writes nothing. The actor is always you. Returns the event's seq and whether it was a duplicate."""
        params = {"sessionId": sessionId, "event": event.model_dump(mode="json", by_alias=True, exclude_unset=True)}
        return cast(Emitted, await self.call("event.emit", params))

    async def get_session(self, sessionId: SessionId, condensed: Condensed = False, since: Since = 0,
                          limit: Limit = None) -> SessionDetail:
        """Read a session: its state, agents, seq, labels and last checkpoint, plus a page of its events in seq
        order (at most {page}, fewer when events are large). When the reply has nextSince, more events exist:
        call again with since=nextSince, and repeat until a reply has no nextSince. To read only what is new,
        pass the last seq you saw as since. Or ask condensed=true for a summary of every event in one reply:
        event counts by type, the entities touched with their counts, every working/broken transition, the
        summed perfDelta and the last checkpoint (truncated names any list that was cut to its first {kept}).
        Fails with not found (-32004) when the session does not exist in your namespace or has expired."""
        params = {"sessionId": sessionId, "condensed": condensed, "since": since, "limit": limit}
        return cast(SessionDetail, await self.call("session.get", params))

    async def list_sessions(self, state: StateFilter = None, agentId: AgentFilter = None,
                            limit: ListLimit = None, cursor: Cursor = None) -> SessionList:
        """List the live sessions of your namespace, newest first, to find work to join or check on. Filter by
        state ('working', 'broken', 'coordinating', 'completed') or by an agent that joined them. Returns
        each session's id, state, agents, seq, labels, timestamps and last checkpoint. A reply holds one page
        ({list_page} sessions unless you pass limit); when it has nextCursor, more may follow: call again with
        cursor=nextCursor and the same filters, until a reply has no nextCursor. A page can be short, even
        empty, and still have a nextCursor when a filter skipped many sessions."""
        params = {"state": state, "agentId": agentId, "limit": limit, "cursor": cursor}
        return cast(SessionList, await self.call("session.list", params))

    async def checkpoint_session(self, sessionId: SessionId, final: Final = False) -> Checkpoint:
        """Summarise the events since the previous checkpoint and anchor the summary on the knowledge graph;
        call it at a milestone, and with final=true when the task is done (the session is then completed).
        A broken outcome also keeps every event of the session for later debugging. Returns the checkpoint
        id, its outcome (the session state), whether it broke during the window, the key impacts, the
        summed perfDelta, the actors and the entity ids touched."""
        params = {"sessionId": sessionId, "final": final}
        return cast(Checkpoint, await self.call("session.checkpoint", params))

    async def get_transitions(self, sessionId: SessionId, entityId: EntityFilter = None) -> Transitions:
        """Find when a session's code went from working to broken and back, to see which change broke
        something and which fixed it. Optionally restrict to one entity. Returns each transition's
        fromSeq and toSeq, the changeInfo and impact of the events involved, and, when known, the
        surrounding knowledge-graph context. Works after the session expired, from its checkpoint anchors."""
        params = {"sessionId": sessionId, "entityId": entityId}
        return cast(Transitions, await self.call("bridge.transitions", params))

    async def isolate_session(self, sessionId: SessionId, agentId: AgentId, since: IsolateSince = 0,
                              limit: IsolateLimit = None) -> Isolated:
        """Separate one agent's contribution from the rest of a shared session, e.g. to judge or undo its
        work. Returns a page of that agent's events (at most {page}, fewer when events are large), the entities
        it touched with their recent anchors and counts, and the total perfDelta it caused (those two always
        cover all its events). When the reply has nextSince, the agent has more events: call again with
        since=nextSince, until a reply has no nextSince."""
        params = {"sessionId": sessionId, "agentId": agentId, "since": since, "limit": limit}
        return cast(Isolated, await self.call("bridge.isolate", params))

    async def get_handoff_context(self, sessionId: SessionId) -> Handoff:
        """Everything you need before taking over or joining someone else's session: call it first, then
        join_session. Returns the session's state and agents, its last 10 changes, the knowledge-graph
        context of the entities involved (related entities and their latest anchor) and a few sentences of
        advice (e.g. fix the breakage first when it is broken). Works after the session expired, rebuilt from
        its checkpoint anchors and failure snapshot."""
        return cast(Handoff, await self.call("bridge.handoff", {"sessionId": sessionId}))

    async def session_outcomes(self, clusterId: ClusterId, days: Days = None) -> Outcomes:
        """How work on one semantic cluster of the codebase has gone lately, to estimate the risk of
        touching it. Returns the cluster's name, the titles of the specs it implements, the recent
        sessions anchored on it, their average perfDelta and how many ended broken."""
        params = {"clusterId": clusterId, "days": days}
        return cast(Outcomes, await self.call("bridge.outcomes", params))

    def registrations(self) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
        """Every tool with its annotations, in the order clients list them."""
        return [
            (self.create_session, WRITE), (self.join_session, IDEMPOTENT), (self.emit_event, WRITE),
            (self.get_session, READ), (self.list_sessions, READ), (self.checkpoint_session, WRITE),
            (self.get_transitions, READ), (self.isolate_session, READ), (self.get_handoff_context, READ),
            (self.session_outcomes, READ), *tools_ingest.registrations(self),
            *tools_coordination.registrations(self),
            *tools_lifecycle.registrations(self), *tools_usage.registrations(self),
        ]


class Server(MCPServer):
    """The SDK's server, with every tool error in the one format of `describe`.

    The SDK checks a call's arguments against the tool's inputSchema before the tool runs and reports a
    mismatch as pydantic's own text (with a documentation URL); here it becomes `invalid params (-32602)`
    with each field, as the method's own check would say it.
    """

    names: frozenset[str] = frozenset()  # the tools registered by build_server

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> CallToolResult | InputRequiredResult:
        """Run one tool as the SDK would, with its request id known to the log and errors reworded."""
        if name not in self.names:
            raise ToolError(f"Error executing tool {name}: {describe(MethodNotFound('unknown tool', {'tool': name}))}")
        reset = REQUEST_ID.set(_request_id(context))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            error = InvalidParams("invalid params", field_errors(cause))
            raise ToolError(f"Error executing tool {name}: {describe(error)}") from cause
        finally:
            REQUEST_ID.reset(reset)


def _request_id(context: Context[Any, Any] | None) -> str | None:
    try:
        return context.request_id if context is not None else None
    except ValueError:  # a call outside an MCP request (in-process) has none
        return None


def description(tool: Callable[..., Any]) -> str:
    """A tool's description: its docstring on one line, with the FACTS it quotes filled in."""
    return " ".join((tool.__doc__ or "").split()).format_map(FACTS)


def build_server(registry: Registry, identity: Identity | None = None, rate_limit: float = 0.0) -> MCPServer:
    """The MCP server with every tool; `identity` fixes the caller (stdio), else each request's token does.

    With `rate_limit`, each agent may make that many tool calls a second (bursts as many); a call over it
    is refused with -32029 and its retryAfterMs, and runs nothing.
    """
    server = Server("memento-sessions", version=__version__, instructions=INSTRUCTIONS)
    tools = Tools(registry, identity, rate_limit).registrations()
    for tool, hints in tools:
        server.add_tool(tool, description=description(tool), annotations=hints)
    server.names = frozenset(tool.__name__ for tool, _ in tools)
    return server
