"""`session.conversation`: the conversation state of a session, built by the ingest reducer, paged.

The daemon folds the stored events through the same reducer the converters' tests and the Python client
use (memento_sessions.ingest), CHUNK events per Redis round trip, then returns one thread's blocks a page
at a time: the main conversation, or one subagent's. The rest of the reply is bounded too (subagents,
metadata, each text cut), so a reply stays under a quarter of the send buffer whatever the session holds.
The condensed view of a session (`session.get {condensed: true}`) gets its tools, prompts, todos and
tasks from `ConversationFold` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field

from memento_sessions import keys
from memento_sessions.errors import NotFound
from memento_sessions.ingest import Conversation
from memento_sessions.ingest.events import cut, encoded_size
from memento_sessions.metrics import REPLY_PAGES
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.models import ClientId
from memento_sessions.sessions.paging import CHUNK, Page, page_bytes, seq_of

if TYPE_CHECKING:
    from memento_sessions.sessions.manager import SessionManager

CONVERSATION_PAGE = 200  # blocks in a reply when the client gives no limit
MAX_SUBAGENTS = 100  # subagents a reply lists (their blocks are read with subagentId)
MAX_PROMPTS = 100  # the user's latest prompts a condensed view lists
MAX_ITEMS = 200  # tools, todos and tasks a condensed view lists
TEXT = 1000  # characters of a subagent's or a task's description, prompt or result in a summary
METADATA_BYTES = 8 * 1024  # encoded metadata in a reply; larger is replaced by its keys
CONVERSATION_TYPES = frozenset({"block:upsert", "block:delta", "subagent:spawned", "subagent:completed",
                                "session:idle", "metadata:update"})


class ConversationParams(BaseModel):
    """`session.conversation`'s params: which session, which thread, which page."""

    model_config = ConfigDict(extra="forbid", strict=True)  # as every method's params (methods.Params)

    sessionId: ClientId
    subagentId: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")] | None = None
    cursor: int = Field(default=0, ge=0, le=100_000_000)  # the index of the first block of the page
    limit: int = Field(default=CONVERSATION_PAGE, ge=1, le=1000)


class ConversationFold:
    """The reducer fed stored events chunk by chunk; `seen` tells whether the session has a conversation."""

    def __init__(self) -> None:
        self.state = Conversation()
        self.seen = False

    def add(self, events: list[dict[str, Any]]) -> None:
        """Fold the next stored events (seq order); other event types pass through."""
        for event in events:
            if event.get("type") in CONVERSATION_TYPES:
                self.seen = True
                self.state.apply(event)

    def condensed(self) -> dict[str, Any]:
        """Tools used, the latest prompts, the todo list and the tasks, each bounded; {} without a conversation."""
        if not self.seen:
            return {}
        view = self.state.condensed()
        return {"tools": view["tools"][:MAX_ITEMS],
                "prompts": view["prompts"][-MAX_PROMPTS:],
                "todos": [summary(todo) for todo in view["todos"][:MAX_ITEMS]],
                "tasks": [summary(task) for task in view["tasks"][:MAX_ITEMS]]}


def summary(value: Any) -> Any:
    """A todo, task or subagent with every string cut to TEXT characters (nested values dropped)."""
    if not isinstance(value, dict):
        return cut(value, TEXT)
    return {key: cut(item, TEXT) for key, item in value.items() if not isinstance(item, dict | list)}


async def fold(manager: SessionManager, namespace: str, session_id: str) -> tuple[dict[str, Any], ConversationFold]:
    """The session view and the reducer fed every stored event, read CHUNK at a time."""
    folder = ConversationFold()
    session, members = await manager.read(namespace, session_id, 0, CHUNK)
    events_key = keys.session_keys(namespace, session_id).events
    while members:
        folder.add([pydantic_core.from_json(member) for member in members])
        if len(members) < CHUNK:
            break
        members = await manager._events_after(events_key, seq_of(members[-1]), CHUNK)
    return session, folder


def bounded_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata the events set, or only its key names when it is larger than METADATA_BYTES."""
    if encoded_size(metadata) <= METADATA_BYTES:
        return metadata
    return {"truncated": True, "keys": sorted(metadata)[:MAX_ITEMS]}


def conversation_reply(state: Conversation, p: ConversationParams, budget: int) -> Result:
    """One page of a thread's blocks with the bounded rest of the state."""
    if p.subagentId is not None and p.subagentId not in state.threads:
        raise NotFound(f"subagent {p.subagentId!r} not found", {"sessionId": p.sessionId, "subagentId": p.subagentId})
    thread = state.main if p.subagentId is None else state.threads[p.subagentId]
    subagents = [{**summary(agent), "blockCount": len(state.threads[key].blocks)}
                 for key, agent in list(state.subagents.items())[:MAX_SUBAGENTS]]
    reply: Result = {"sessionId": p.sessionId, "subagentId": p.subagentId, "idle": state.idle,
                     "blockCount": len(thread.blocks), "subagents": subagents,
                     "subagentCount": len(state.subagents), "metadata": bounded_metadata(state.metadata)}
    page = Page(p.limit, max(budget - encoded_size(reply), 1))
    for block in thread.blocks[p.cursor:]:
        if not page.add(block):
            break
    reply["blocks"] = page.items
    if page.more:
        reply["nextCursor"] = p.cursor + len(page.items)
        REPLY_PAGES.labels("session.conversation").inc()
    return reply


class ConversationMethods:
    """`session.conversation` over the manager (declared in api/)."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager, self.budget = manager, page_bytes(manager.settings.ws_send_buffer)

    async def conversation(self, call: Call, p: ConversationParams) -> Result:
        _, folder = await fold(self.manager, call.identity.namespace, p.sessionId)
        return conversation_reply(folder.state, p, self.budget)
