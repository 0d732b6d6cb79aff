"""The MCP tool of what the agents cost: usage, over `usage.get`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, cast

from mcp_types import ToolAnnotations
from pydantic import ConfigDict, Field, StrictInt, with_config
from typing_extensions import TypedDict

from memento_sessions.mcp.models import Bounds
from memento_sessions.usage.methods import PAGE, UsageParams

if TYPE_CHECKING:
    from memento_sessions.mcp.tools import Tools

Json = dict[str, Any]
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


@with_config(ConfigDict(extra="allow"))
class Usage(TypedDict):
    """Totals (the most trusted source's), totals by source, and one page of runs."""

    sessionId: NotRequired[str]  # one of the three: whose usage this is
    agentId: NotRequired[str]
    namespace: NotRequired[str]
    totals: Json
    bySource: Json
    runs: list[Json]
    nextCursor: NotRequired[str]


class UsageTools:
    """The tool, calling its method through the shared `Tools` (caller, rate limit, error format)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools

    async def usage(self, sessionId: UsageSession = None, agentId: UsageAgent = None, since: UsageSince = None,
                    cursor: UsageCursor = None, limit: UsageLimit = PAGE) -> Usage:
        """What agents cost: tokens (input, output, cache read, cache creation), tool calls, API calls, time and
        cost in USD, per run (one prompt's turn), for a session, an agent, or your whole namespace. costUsd is
        null where the source gave no cost (no price is guessed). totals are from the most trusted source
        (otel, the agent's own OpenTelemetry, then otel-metrics, then events from transcripts); bySource
        splits them. When the reply has nextCursor, call again with cursor=nextCursor for more runs."""
        params: Json = {"sessionId": sessionId, "agentId": agentId, "cursor": cursor, "limit": limit,
                        "since": since.isoformat() if since else None}
        return cast(Usage, await self.tools.call("usage.get", {k: v for k, v in params.items() if v is not None}))


def registrations(tools: Tools) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
    """The usage tool with its annotations (read-only)."""
    return [(UsageTools(tools).usage, ToolAnnotations(read_only_hint=True, open_world_hint=False))]
