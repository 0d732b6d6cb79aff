"""The MCP tools, built from the declared table (api/): each one calls its JSON-RPC method through the registry.

One implementation, two transports: a tool builds the same params a WebSocket client would send and
runs them through `Registry.call`, so validation, scopes, namespaces and results are the method's
own. The caller is the token of the HTTP request (set by `streamable.BearerAuth`) or, on stdio, the
MEMENTO_TOKEN verified at start.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import BaseModel, ValidationError

from memento_sessions import __version__
from memento_sessions.api.spec import Declared, Tool
from memento_sessions.api.table import tools as declared_tools
from memento_sessions.auth import Identity
from memento_sessions.errors import InvalidParams, MethodNotFound, RpcError
from memento_sessions.limits import Buckets
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

HINTS = {
    "read": ToolAnnotations(read_only_hint=True, open_world_hint=False),
    "write": ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                             open_world_hint=False),
    "idempotent": ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                                  open_world_hint=False),
    "destructive": ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                   open_world_hint=False),
}


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
    """The declared tools (api/), bound to one registry and one way of knowing the caller."""

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

    def function(self, declared: Declared, tool: Tool) -> Callable[..., Any]:
        """The tool as a function the SDK reads: its declared arguments as its signature, its result type as
        its return annotation; it runs the declared method with the arguments as params."""
        async def run(**arguments: Any) -> Result:
            given = {name: wire(value) for name, value in arguments.items()}
            return await self.call(declared.name, tool.params(given) if tool.params else given)

        run.__name__ = run.__qualname__ = tool.name
        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(arg.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=arg.default,
                               annotation=arg.annotation) for arg in tool.args],
            return_annotation=tool.result or declared.result)
        return run


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


def wire(value: Any) -> Any:
    """An argument as a WebSocket client would send it: a model as its JSON, a datetime in ISO 8601."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return value.isoformat() if isinstance(value, datetime) else value


def description(tool: Tool) -> str:
    """A tool's description: its declared text on one line, with the FACTS it quotes filled in."""
    return " ".join(tool.description.split()).format_map(FACTS)


def build_server(registry: Registry, identity: Identity | None = None, rate_limit: float = 0.0) -> MCPServer:
    """The MCP server with every declared tool; `identity` fixes the caller (stdio), else each request's token does.

    With `rate_limit`, each agent may make that many tool calls a second (bursts as many); a call over it
    is refused with -32029 and its retryAfterMs, and runs nothing.
    """
    server = Server("memento-sessions", version=__version__, instructions=INSTRUCTIONS)
    tools = Tools(registry, identity, rate_limit)
    for declared, tool in declared_tools():
        server.add_tool(tools.function(declared, tool), name=tool.name, description=description(tool),
                        annotations=HINTS[tool.hints])
    server.names = frozenset(tool.name for _, tool in declared_tools())
    return server
