"""The unified conversation events every converter emits: blocks, deltas, subagents, queries, metadata.

A block is `{id, kind, status, ...}` with kind one of user_message, assistant_text, thinking, tool_use,
system; status pending or complete. `block:upsert` carries `{"block": {...}}` and merges into the block of
that id; `block:delta` carries `{"blockId", "delta"}` appended to its content. Either names
`subagentId` when the block belongs to a subagent's own conversation.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.ingest.events import Event, Stats, make_event

TASK_TOOLS = frozenset({"Task", "Agent", "task"})  # tools that start a subagent (Claude Code, OpenCode)


def with_sub(data: dict[str, Any], sub: str | None) -> dict[str, Any]:
    """`data` naming the subagent it belongs to, when it does."""
    if sub:
        data["subagentId"] = sub
    return data


def upsert(stats: Stats, eid: str, block: dict[str, Any], sub: str | None, timestamp: Any) -> Event:
    """A `block:upsert` event."""
    return make_event(stats, eid, "block:upsert", with_sub({"block": block}, sub), timestamp)


def delta(stats: Stats, eid: str, block_id: str, text: str, sub: str | None, timestamp: Any = None) -> Event:
    """A `block:delta` event appending `text` to a block's content."""
    return make_event(stats, eid, "block:delta", with_sub({"blockId": block_id, "delta": text}, sub), timestamp)


def spawned(stats: Stats, eid: str, sub_id: str, tool_input: Any, parent: str | None, timestamp: Any) -> Event:
    """A `subagent:spawned` event for a Task-like tool use."""
    args = tool_input if isinstance(tool_input, dict) else {}
    data = {"subagentId": sub_id, "agentType": args.get("subagent_type") or args.get("subagentType"),
            "description": args.get("description"), "prompt": args.get("prompt")}
    if parent:
        data["parentSubagentId"] = parent
    return make_event(stats, eid, "subagent:spawned", {k: v for k, v in data.items() if v is not None}, timestamp)


def completed(stats: Stats, eid: str, data: dict[str, Any], timestamp: Any) -> Event:
    """A `subagent:completed` event; `data` names `subagentId` or `agentId`, and `status`."""
    return make_event(stats, eid, "subagent:completed", {k: v for k, v in data.items() if v is not None}, timestamp)


def text_of(content: Any) -> str:
    """The text of a message or tool result content: a string, or the text items of a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append(item["text"])
            elif isinstance(item, dict) and item.get("type") == "image":
                parts.append("[image]")
        return "\n".join(parts)
    return ""
