"""The MCP tool of ingested agents' conversations: get_conversation, over `session.conversation`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, cast

from mcp_types import ToolAnnotations
from pydantic import ConfigDict, Field, StrictInt, with_config

from memento_sessions.mcp.models import Bounds, Noticed, SessionId
from memento_sessions.sessions.conversation import CONVERSATION_PAGE, ConversationParams

if TYPE_CHECKING:
    from memento_sessions.mcp.tools import Tools

Json = dict[str, Any]
SubagentId = Annotated[str | None, Bounds(ConversationParams, "subagentId"), Field(
    description="Omit for the main conversation; a subagent's id (from `subagents`) for that subagent's blocks.")]
BlockCursor = Annotated[StrictInt, Bounds(ConversationParams, "cursor"), Field(
    description="0 for the first page, then the previous reply's nextCursor.")]
BlockLimit = Annotated[StrictInt | None, Bounds(ConversationParams, "limit"), Field(
    description=f"At most this many blocks in this reply; omit for up to {CONVERSATION_PAGE}. A page may hold "
                "fewer when blocks are large: keep paging while the reply has nextCursor.")]


@with_config(ConfigDict(extra="allow"))
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


class ConversationTools:
    """The tool, calling its method through the shared `Tools` (caller, rate limit, error format)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools

    async def get_conversation(self, sessionId: SessionId, subagentId: SubagentId = None, cursor: BlockCursor = 0,
                               limit: BlockLimit = None) -> Conversation:
        """Read what an agent said and did in a session recorded from its transcript or hooks (Claude Code,
        the Agent SDK, OpenCode): the conversation as ordered blocks (user_message, assistant_text, thinking,
        tool_use with its input and result, system), each with its status (pending while streaming,
        complete), and the subagents it spawned with their status and result. A reply holds one page of
        blocks of the main conversation, or of one subagent's when you pass its subagentId; when it has
        nextCursor, call again with cursor=nextCursor. blockCount is the thread's total. For the tools
        used, the user's prompts, the todo list and the tasks in one summary, call get_session with
        condensed=true. Fails with not found (-32004) when the session (or subagent) does not exist in
        your namespace."""
        params = {"sessionId": sessionId, "subagentId": subagentId, "cursor": cursor, "limit": limit}
        return cast(Conversation, await self.tools.call("session.conversation", params))


def registrations(tools: Tools) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
    """The ingest tools with their annotations (read-only)."""
    read = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    return [(ConversationTools(tools).get_conversation, read)]
