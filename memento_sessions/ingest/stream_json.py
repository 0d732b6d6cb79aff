"""Claude Agent SDK / `claude -p --output-format stream-json` NDJSON to unified events.

Records: system (init), assistant, user, result, and with `--include-partial-messages` stream_event
records (content_block_start / content_block_delta), which become pending blocks and deltas that the
finished assistant records then complete. `parent_tool_use_id` names the subagent a message belongs to.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.ingest import blocks
from memento_sessions.ingest.anthropic import AnthropicConverter, Bounded
from memento_sessions.ingest.events import Event, cut, digest, event_id, make_event

_INIT_KEYS = ("session_id", "model", "cwd", "tools", "claude_code_version", "permissionMode", "mcp_servers")
_RESULT_KEYS = {"duration_ms": "durationMs", "num_turns": "numTurns", "total_cost_usd": "totalCostUsd",
                "usage": "usage", "subtype": "subtype"}
_DELTA_FIELD = {"text_delta": "text", "thinking_delta": "thinking"}


class StreamJson(AnthropicConverter):
    """Stateful converter of one stream-json output, in order."""

    def __init__(self, project_root: str | None = None) -> None:
        super().__init__(project_root)
        self.current: dict[str, str] = {}  # subagent id ('' for the main agent) -> message being streamed
        self.deltas = Bounded()  # block id -> deltas seen

    def convert(self, record: dict[str, Any]) -> list[Event]:
        """The events of one stream-json record."""
        kind, sub = record.get("type"), record.get("parent_tool_use_id")
        sub = sub if isinstance(sub, str) else None
        if kind == "assistant":
            return self.assistant(record, sub)
        if kind == "user":
            return self.user(record, sub, record.get("tool_use_result"))
        if kind == "system":
            return self.system(record)
        if kind == "result":
            return self.result(record)
        if kind == "stream_event" and isinstance(record.get("event"), dict):
            return self.partial(record["event"], sub)
        return self.stats.skip(f"unknown_type:{kind}")

    def system(self, record: dict[str, Any]) -> list[Event]:
        """`system/init` starts a query and names the session's model, tools and directory."""
        if record.get("subtype") != "init":
            return self.stats.skip(f"system:{record.get('subtype')}")
        if self.root is None and isinstance(record.get("cwd"), str):
            self.root = record["cwd"]
        uid = record.get("uuid") or digest(record)
        init = {key: record[key] for key in _INIT_KEYS if key in record}
        query = {"sessionId": record.get("session_id")}
        return [make_event(self.stats, event_id(uid), "metadata:update", {"init": init}),
                make_event(self.stats, event_id(uid, "query"), "query:started", query)]

    def result(self, record: dict[str, Any]) -> list[Event]:
        """The end of a query: completed or failed, then idle."""
        uid = record.get("uuid") or digest(record)
        ok = record.get("subtype") == "success" and record.get("is_error") is not True
        data = {name: record[key] for key, name in _RESULT_KEYS.items() if key in record}
        if isinstance(record.get("result"), str):
            data["result"] = cut(record["result"], 2000)
        if not ok and "errors" in record:
            data["errors"] = record["errors"]
        return [make_event(self.stats, event_id(uid), "query:completed" if ok else "query:failed", data),
                make_event(self.stats, event_id(uid, "idle"), "session:idle", {})]

    def partial(self, event: dict[str, Any], sub: str | None) -> list[Event]:
        """A streaming event: a block starts pending, deltas append to it; the rest says nothing new."""
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.current[sub or ""] = str(event["message"].get("id"))
            return []
        message_id = self.current.get(sub or "")
        index = event.get("index")
        if message_id is None or not isinstance(index, int):
            return self.stats.skip(f"stream_event:{kind}")
        if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            return self.block_start(event["content_block"], f"{message_id}:{index}", sub)
        if kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            return self.block_delta(event["delta"], f"{message_id}:{index}", sub)
        return self.stats.skip(f"stream_event:{kind}")

    def block_start(self, content: dict[str, Any], block_id: str, sub: str | None) -> list[Event]:
        """A text or thinking block opens pending and empty (a tool use waits for its finished input)."""
        kind = content.get("type")
        if kind not in ("text", "thinking"):
            return self.stats.skip(f"stream_event:start:{kind}")
        block = {"id": block_id, "kind": "assistant_text" if kind == "text" else "thinking", "status": "pending",
                 "content": ""}
        return [blocks.upsert(self.stats, event_id(block_id, "start"), block, sub, None)]

    def block_delta(self, delta: dict[str, Any], block_id: str, sub: str | None) -> list[Event]:
        """Text or thinking appended to its block."""
        field = _DELTA_FIELD.get(str(delta.get("type")))
        text = delta.get(field) if field else None
        if not isinstance(text, str):
            return self.stats.skip(f"stream_event:delta:{delta.get('type')}")
        count: int = self.deltas.get(block_id, 0)
        self.deltas[block_id] = count + 1
        return [blocks.delta(self.stats, event_id(block_id, f"d{count}"), block_id, text, sub)]
