"""The one reducer of conversation state: blocks, subagents with their own blocks, and a condensed view.

It folds the unified events (block:*, subagent:*, session:idle, metadata:update) in order, the same way
for a live stream (pending blocks, deltas appended, then completed) and for a loaded transcript (complete
blocks only); both give the same state for the same conversation. Other event types pass through it
untouched, so it can fold a whole stored session. Upserts merge into the block of the same id, so
replaying an event twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memento_sessions.ingest.events import cut, obj

TODO_TOOLS = frozenset({"TodoWrite", "todowrite"})
PROMPT_CAP = 1000


@dataclass
class Thread:
    """An ordered list of blocks with an index by id: the main conversation or one subagent's."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    by_id: dict[str, dict[str, Any]] = field(default_factory=dict)

    def upsert(self, block: dict[str, Any], timestamp: Any) -> dict[str, Any]:
        """The block merged in, created at the end when new; its timestamp is the first one any event gave."""
        current = self.by_id.get(block["id"])
        if current is None:
            current = {}
            self.by_id[block["id"]] = current
            self.blocks.append(current)
        current.update(block)
        if timestamp and not current.get("timestamp"):
            current["timestamp"] = timestamp
        return current


@dataclass
class Conversation:
    """The conversation state of a session, built by `apply` one event at a time."""

    main: Thread = field(default_factory=Thread)
    subagents: dict[str, dict[str, Any]] = field(default_factory=dict)
    threads: dict[str, Thread] = field(default_factory=dict)
    todos: list[Any] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    idle: bool = False

    def apply(self, event: dict[str, Any]) -> None:
        """Fold one event in; events of other types are ignored."""
        handler = _HANDLERS.get(str(event.get("type")))
        data = event.get("data")
        if handler is not None and isinstance(data, dict):
            handler(self, data, event.get("timestamp"))

    def thread(self, sub: Any) -> Thread:
        """The thread a block belongs to; a subagent first named by a block is created running."""
        if not isinstance(sub, str):
            return self.main
        if sub not in self.threads:
            self.subagent(sub)
        return self.threads[sub]

    def subagent(self, sub: str) -> dict[str, Any]:
        """The subagent of that id, created running if new."""
        if sub not in self.subagents:
            self.subagents[sub] = {"id": sub, "status": "running"}
            self.threads[sub] = Thread()
        return self.subagents[sub]

    def on_upsert(self, data: dict[str, Any], timestamp: Any) -> None:
        block = data.get("block")
        if not isinstance(block, dict) or not isinstance(block.get("id"), str):
            return
        merged = self.thread(data.get("subagentId")).upsert(block, timestamp)
        self.idle = False
        todos = obj(merged.get("input")).get("todos")
        if merged.get("toolName") in TODO_TOOLS and isinstance(todos, list):
            self.todos = todos

    def on_delta(self, data: dict[str, Any], timestamp: Any) -> None:
        block_id, text = data.get("blockId"), data.get("delta")
        if not isinstance(block_id, str) or not isinstance(text, str):
            return
        thread = self.thread(data.get("subagentId"))
        block = thread.by_id.get(block_id)
        if block is None:  # a delta before its block: the block starts pending with it
            block = thread.upsert({"id": block_id, "kind": "assistant_text", "status": "pending"}, timestamp)
        block["content"] = str(block.get("content") or "") + text
        self.idle = False

    def on_spawned(self, data: dict[str, Any], timestamp: Any) -> None:
        sub = data.get("subagentId")
        if isinstance(sub, str):
            agent = self.subagent(sub)
            agent.update({key: value for key, value in data.items() if key != "subagentId"})
            agent.setdefault("startedAt", timestamp)

    def on_completed(self, data: dict[str, Any], timestamp: Any) -> None:
        sub = data.get("subagentId")
        if not isinstance(sub, str):  # SubagentStop names only the agent id
            agent_id = data.get("agentId")
            sub = next((key for key, agent in self.subagents.items() if agent.get("agentId") == agent_id), agent_id)
        if isinstance(sub, str):
            agent = self.subagent(sub)
            agent.update({key: value for key, value in data.items() if key != "subagentId"})
            agent["completedAt"] = timestamp

    def on_idle(self, data: dict[str, Any], timestamp: Any) -> None:
        """Idle: nothing is streaming any more, every pending block is final."""
        for thread in (self.main, *self.threads.values()):
            for block in thread.blocks:
                if block.get("status") == "pending":
                    block["status"] = "complete"
        self.idle = True

    def on_metadata(self, data: dict[str, Any], timestamp: Any) -> None:
        if isinstance(data.get("todos"), list):
            self.todos = data["todos"]
        self.metadata.update({key: value for key, value in data.items() if key != "todos"})

    def view(self) -> dict[str, Any]:
        """The state as JSON: blocks, subagents with their blocks, idle, and the condensed view."""
        subagents = [{**agent, "blocks": self.threads[key].blocks} for key, agent in self.subagents.items()]
        return {"blocks": self.main.blocks, "subagents": subagents, "idle": self.idle,
                "metadata": self.metadata, "condensed": self.condensed()}

    def tools_used(self) -> list[dict[str, Any]]:
        """Each tool by name with how often it was used and when last, most used first (subagents' too)."""
        tools: dict[str, dict[str, Any]] = {}
        for thread in (self.main, *self.threads.values()):
            for block in thread.blocks:
                name = block.get("toolName")
                if block.get("kind") == "tool_use" and isinstance(name, str):
                    entry = tools.setdefault(name, {"name": name, "count": 0, "lastUsed": None})
                    entry["count"] += 1
                    entry["lastUsed"] = max(filter(None, (entry["lastUsed"], block.get("timestamp"))), default=None)
        return sorted(tools.values(), key=lambda tool: (-tool["count"], tool["name"]))

    def condensed(self) -> dict[str, Any]:
        """What a condensed view of the session carries: tools used, prompts, todos and tasks."""
        prompts = [{"prompt": cut(block.get("content"), PROMPT_CAP), "timestamp": block.get("timestamp")}
                   for block in self.main.blocks if block.get("kind") == "user_message"]
        tasks = [{"id": agent["id"], "text": agent.get("description") or agent.get("agentType") or agent["id"],
                  "status": agent["status"], **({"result": agent["result"]} if "result" in agent else {})}
                 for agent in self.subagents.values()]
        return {"tools": self.tools_used(), "prompts": prompts, "todos": self.todos, "tasks": tasks}


_HANDLERS: dict[str, Any] = {
    "block:upsert": Conversation.on_upsert, "block:delta": Conversation.on_delta,
    "subagent:spawned": Conversation.on_spawned, "subagent:completed": Conversation.on_completed,
    "session:idle": Conversation.on_idle, "metadata:update": Conversation.on_metadata,
}


def reduce(events: Any) -> Conversation:
    """The conversation state of a sequence of events."""
    state = Conversation()
    for event in events:
        if isinstance(event, dict):
            state.apply(event)
    return state
