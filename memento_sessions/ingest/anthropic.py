"""Anthropic messages (assistant content blocks, user prompts and tool results) to unified events.

Claude Code transcripts and the Agent SDK's stream-json carry the same `message` objects; this base
converter turns them into blocks and coding signals, and remembers what it must between records: each
tool use until its result, the next block index of each message, which subagent an agent id is.
Block ids: a tool use is its `tool_use` id; a text or thinking block is `<message id>:<index>`, the
index the streaming API gives it, so a live stream and the finished messages name the same block.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.ingest import blocks
from memento_sessions.ingest.events import Converter, Event, cut, digest, event_id, make_event
from memento_sessions.ingest.signals import SHELL_TOOLS, edit_event, exit_code_of, outcome_event
from memento_sessions.ingest.usage import anthropic_totals, reported

MEMORY = 4096  # tool uses awaiting a result and messages with an index remembered; the oldest are forgotten
_SYSTEM_PREFIXES = ("<local-command", "<command-", "<system-reminder>", "Caveat:")
_INTERRUPTED = "[Request interrupted by user"


class Bounded(dict[str, Any]):
    """A dict that forgets its oldest entry past MEMORY entries, so a converter's state stays bounded."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if len(self) > MEMORY:
            del self[next(iter(self))]


class AnthropicConverter(Converter):
    """Shared by the transcript and stream-json converters; subclasses dispatch records by `type`."""

    def __init__(self, project_root: str | None = None) -> None:
        super().__init__(project_root)
        self.tools = Bounded()  # tool_use id -> (name, input, subagent id)
        self.next_index = Bounded()  # message id -> index of its next content block
        self.agents = Bounded()  # agent id -> subagent id (the Task tool use that started it)
        self.usage = Bounded()  # message id -> its usage last reported (ingest/usage.py)

    def block_index(self, message_id: str) -> int:
        """The index of the next content block of a message (records may carry one block each)."""
        index: int = self.next_index.get(message_id, 0)
        self.next_index[message_id] = index + 1
        return index

    def assistant(self, record: dict[str, Any], sub: str | None) -> list[Event]:
        """Blocks of an assistant message: text, thinking and tool uses (a Task tool use spawns a subagent)."""
        message = record.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            return self.stats.skip("assistant:bad_message")
        message_id = str(message.get("id") or record.get("uuid") or digest(record))
        events: list[Event] = []
        for item in message["content"]:
            events += self.content_block(item, message_id, self.block_index(message_id), sub, record)
        totals = anthropic_totals(message.get("usage"))
        if totals is not None:
            events += reported(self.stats, self.usage, message_id, totals, message.get("model"), sub,
                               record.get("timestamp"))
        return events

    def content_block(self, item: Any, message_id: str, index: int, sub: str | None,
                      record: dict[str, Any]) -> list[Event]:
        """One assistant content block as a complete block (and a subagent for a Task tool use)."""
        kind = item.get("type") if isinstance(item, dict) else None
        stamp = record.get("timestamp")
        if kind in ("text", "thinking"):
            block_id = f"{message_id}:{index}"
            text = item.get(kind)
            block = {"id": block_id, "kind": "assistant_text" if kind == "text" else kind, "status": "complete",
                     "content": text if isinstance(text, str) else ""}
            return [blocks.upsert(self.stats, event_id(block_id), block, sub, stamp)]
        if kind == "tool_use" and isinstance(item.get("id"), str) and isinstance(item.get("name"), str):
            return self.tool_use(item["id"], item["name"], item.get("input"), sub, stamp)
        return self.stats.skip(f"content:{kind}")

    def tool_use(self, tool_id: str, name: str, tool_input: Any, sub: str | None, stamp: Any) -> list[Event]:
        """A pending tool-use block; the tool is remembered until its result arrives."""
        self.tools[tool_id] = (name, tool_input, sub)
        block = {"id": tool_id, "kind": "tool_use", "status": "pending", "toolName": name, "input": tool_input}
        events = [blocks.upsert(self.stats, event_id(tool_id, "use"), block, sub, stamp)]
        if name in blocks.TASK_TOOLS:
            events.append(blocks.spawned(self.stats, event_id(tool_id, "spawned"), tool_id, tool_input, sub, stamp))
        return events

    def user(self, record: dict[str, Any], sub: str | None, result: Any) -> list[Event]:
        """A user message: a prompt (string or text items) or tool results, with the tool's structured `result`."""
        message = record.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            return self.prompt(record, content, sub, f"{record.get('uuid') or digest(record)}")
        if not isinstance(content, list):
            return self.stats.skip("user:bad_message")
        events: list[Event] = []
        base = str(record.get("uuid") or digest(record))
        for index, item in enumerate(content):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "tool_result":
                events += self.tool_result(item, result, record.get("timestamp"), sub)
            elif kind in ("text", "image"):
                events += self.prompt(record, blocks.text_of([item]), sub, f"{base}:{index}")
            else:
                self.stats.skip(f"content:{kind}")
        return events

    def prompt(self, record: dict[str, Any], text: str, sub: str | None, block_id: str) -> list[Event]:
        """A user prompt (and its query), or a system line when Claude Code wrote it (commands, interrupts)."""
        stamp = record.get("timestamp")
        system = bool(record.get("isMeta")) or text.startswith(_SYSTEM_PREFIXES) or text.startswith(_INTERRUPTED)
        block = {"id": block_id, "kind": "system" if system else "user_message", "status": "complete", "content": text}
        events = [blocks.upsert(self.stats, event_id(block_id), block, sub, stamp)]
        if text.startswith(_INTERRUPTED) and not sub:
            events.append(make_event(self.stats, event_id(block_id, "query"), "query:failed",
                                     {"reason": "interrupted"}, stamp))
        elif not system and not sub:
            events.append(make_event(self.stats, event_id(block_id, "query"), "query:started",
                                     {"prompt": cut(text, 1000)}, stamp))
        return events

    def tool_result(self, item: dict[str, Any], result: Any, stamp: Any, sub: str | None) -> list[Event]:
        """The tool-use block completed with its output, and the signals the finished tool gives."""
        tool_id = item.get("tool_use_id")
        if not isinstance(tool_id, str):
            return self.stats.skip("tool_result:no_id")
        name, tool_input, tool_sub = self.tools.pop(tool_id, (None, None, sub))
        output = blocks.text_of(item.get("content"))
        is_error = item.get("is_error") is True
        block = {"id": tool_id, "kind": "tool_use", "status": "complete", "output": self.stats.cap(output),
                 "isError": is_error}
        events = [blocks.upsert(self.stats, event_id(tool_id, "result"), block, tool_sub, stamp)]
        if name is None:
            return events
        return events + self.signals(name, tool_id, tool_input, is_error, output, result, stamp, tool_sub)

    def signals(self, name: str, tool_id: str, tool_input: Any, is_error: bool, output: str, result: Any,
                stamp: Any, sub: str | None) -> list[Event]:
        """`modified` for a successful edit, `test_pass`/`broke` for a test run, `subagent:completed` for a Task."""
        extra = result if isinstance(result, dict) else {}
        if name in blocks.TASK_TOOLS:
            return [self.subagent_done(tool_id, extra, is_error, output, stamp)]
        if name in SHELL_TOOLS:
            failed = None if extra.get("interrupted") is True else is_error
            return outcome_event(self.stats, name, tool_id, tool_input, failed, stamp, exit_code_of(output))
        if is_error:
            return []
        return edit_event(self.stats, name, tool_id, tool_input, self.root, stamp, extra.get("type") == "create")

    def subagent_done(self, tool_id: str, extra: dict[str, Any], is_error: bool, output: str, stamp: Any) -> Event:
        """The subagent a Task tool use started has finished (its result names the agent id)."""
        agent = extra.get("agentId")
        if isinstance(agent, str):
            self.agents[agent] = tool_id
        status = "failed" if is_error or extra.get("status") not in (None, "completed") else "completed"
        data = {"subagentId": tool_id, "agentId": agent, "status": status, "result": cut(output, 2000),
                "totalDurationMs": extra.get("totalDurationMs"), "totalTokens": extra.get("totalTokens"),
                "totalToolUseCount": extra.get("totalToolUseCount")}
        return blocks.completed(self.stats, event_id(tool_id, "completed"), data, stamp)
