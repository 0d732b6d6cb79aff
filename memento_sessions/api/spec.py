"""What one method's declaration holds, and the services its handler and steps are bound to at start."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from memento_sessions.bridge.methods import BridgeMethods
from memento_sessions.checkpoints.methods import CheckpointMethods
from memento_sessions.coordination.methods import CoordinationMethods
from memento_sessions.coordination.service import Coordination
from memento_sessions.history.methods import HistoryMethods
from memento_sessions.kg.methods import GraphMethods
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.rpc import Call, Handler, Result
from memento_sessions.sessions.conversation import ConversationMethods
from memento_sessions.sessions.methods import Params, SessionMethods, SessionParams, SubscribeParams
from memento_sessions.usage.methods import UsageMethods

READ, WRITE, KG_WRITE, ADMIN = "sessions:read", "sessions:write", "kg:write", "admin"
REQUIRED = inspect.Parameter.empty
Hints = Literal["read", "write", "idempotent", "destructive"]  # the MCP tool annotations (mcp/tools.py)


class Subscribing(Protocol):
    """The subscription methods (ws/subscriptions.py: they deliver over a WebSocket connection)."""

    async def subscribe(self, call: Call, p: SubscribeParams) -> Result: ...
    async def unsubscribe(self, call: Call, p: SessionParams) -> Result: ...
    async def watch(self, call: Call, p: Params) -> Result: ...


@dataclass(frozen=True)
class Parts:
    """The services the handlers and steps are bound to; server/services.py builds them once."""

    sessions: SessionMethods
    lifecycle: LifecycleService
    history: HistoryMethods
    conversation: ConversationMethods
    subscriptions: Subscribing
    checkpoints: CheckpointMethods
    graph: GraphMethods
    bridge: BridgeMethods
    coordination: CoordinationMethods
    coord: Coordination
    usage: UsageMethods


Bind = Callable[[Parts], Handler]  # a handler, from the services
StepOf = Callable[[Parts, Handler], Handler]  # a step around a handler, from the services


@dataclass(frozen=True)
class Arg:
    """One argument of an MCP tool: its name (the params field it fills), its Annotated type, its default."""

    name: str
    annotation: Any
    default: Any = REQUIRED


@dataclass(frozen=True)
class Tool:
    """The MCP tool of a method: its name, the place it is listed at, its hints, its arguments, and the
    description an agent reads (`{page}`-style facts filled in by mcp/tools.py); `params`, when set, turns
    its arguments into the method's params (claim_task: a taskId into a lease on 'task:<taskId>')."""

    name: str
    listed: int
    hints: Hints
    args: tuple[Arg, ...]
    description: str
    result: Any = None  # the method's result type unless the tool narrows it (get_session_at)
    params: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # arguments -> params, when not the same


@dataclass(frozen=True)
class Declared:
    """One JSON-RPC method: name, params, result, scope, handler, the steps around it in the order they run
    (outermost first, after the steps around every method), and its MCP tools."""

    name: str
    params: type[BaseModel]
    result: Any
    scope: str
    handler: Bind
    summary: str
    steps: tuple[StepOf, ...] = ()
    tools: tuple[Tool, ...] = ()
