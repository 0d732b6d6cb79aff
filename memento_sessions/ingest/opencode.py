"""OpenCode server events (`{type, properties}` from its SSE stream) to unified events.

message.updated tells a message's role (user parts are prompts) and its project root; message.part.updated
upserts a part's block (text, reasoning, tool), message.part.delta appends to it; a `task` tool part is a
subagent whose child session's parts become the subagent's blocks; session.idle/status/error end queries.
Parts are upserted many times as they grow: each upsert's id carries a hash of the part, so every
distinct version is kept once, and re-reading the same stream writes nothing new.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.ingest import blocks
from memento_sessions.ingest.anthropic import Bounded
from memento_sessions.ingest.events import Converter, Event, cut, digest, event_id, make_event, obj
from memento_sessions.ingest.signals import EDIT_TOOLS, SHELL_TOOLS, edit_event, file_entity, outcome_event
from memento_sessions.ingest.usage import count, money, reported

_TEXT_KINDS = {"text": "assistant_text", "reasoning": "thinking"}
_WATCH = {"add": "file:created", "change": "file:modified", "unlink": "file:deleted"}


class OpenCode(Converter):
    """Stateful converter of one OpenCode event stream, in order."""

    def __init__(self, project_root: str | None = None) -> None:
        super().__init__(project_root)
        self.roles = Bounded()  # message id -> role
        self.children = Bounded()  # child session id -> subagent id (the task tool's call id)
        self.spawned = Bounded()  # task parts whose subagent was announced
        self.counts = Bounded()  # per-key counters for events a stream repeats identically (deltas, idles)
        self.usage = Bounded()  # message id -> its tokens and cost last reported (ingest/usage.py)

    def convert(self, record: dict[str, Any]) -> list[Event]:
        """The events of one OpenCode event (a bare `{type, properties}` or a global `{payload}` wrapper)."""
        if "type" not in record and isinstance(record.get("payload"), dict):
            record = record["payload"]
        kind, props = record.get("type"), record.get("properties")
        if not isinstance(props, dict):
            return self.stats.skip(f"no_properties:{kind}")
        handler = _HANDLERS.get(str(kind))
        if handler is None:
            return self.stats.skip(f"unknown_type:{kind}")
        events: list[Event] = handler(self, props)
        return events

    def nth(self, key: str) -> int:
        """How many times `key` was seen before: ids for events a stream may repeat word for word."""
        count: int = self.counts.get(key, 0)
        self.counts[key] = count + 1
        return count

    def message(self, props: dict[str, Any]) -> list[Event]:
        """A message's role and root are remembered; a user message starts a query, an error fails it."""
        info = props["info"]
        msg_id, role = str(info["id"]), info.get("role")
        self.roles[msg_id] = role
        path = info.get("path")
        if self.root is None and isinstance(path, dict) and isinstance(path.get("root"), str):
            self.root = path["root"]
        stamp = obj(info.get("time")).get("created")
        if role == "user" and self.sub(info) is None:
            return [make_event(self.stats, event_id(msg_id, "query"), "query:started", {"messageId": msg_id}, stamp)]
        if role != "assistant":
            return self.stats.skip(f"message.updated:{role}")
        events = self.tokens(info, msg_id, stamp)
        if isinstance(info.get("error"), dict):
            events.append(make_event(self.stats, event_id(msg_id, "failed"), "query:failed", {"error": info["error"]},
                                     stamp))
        return events or self.stats.skip("message.updated:assistant")

    def tokens(self, info: dict[str, Any], msg_id: str, stamp: Any) -> list[Event]:
        """An assistant message's tokens and cost so far (reasoning is billed as output)."""
        tokens = obj(info.get("tokens"))
        cache = obj(tokens.get("cache"))
        totals = (count(tokens.get("input")), count(tokens.get("output")) + count(tokens.get("reasoning")),
                  count(cache.get("read")), count(cache.get("write")), money(info.get("cost")))
        return reported(self.stats, self.usage, msg_id, totals, info.get("modelID"), self.sub(info), stamp)

    def sub(self, item: dict[str, Any]) -> str | None:
        """The subagent a part or message belongs to (its session is a task's child session)."""
        found = self.children.get(str(item.get("sessionID")))
        return str(found) if found else None

    def part(self, props: dict[str, Any]) -> list[Event]:
        """A part's block: text and reasoning, or a tool call with its signals."""
        part = props["part"]
        kind = part.get("type")
        if kind in _TEXT_KINDS:
            return self.text_part(part)
        if kind == "tool" and isinstance(part.get("state"), dict) and isinstance(part.get("tool"), str):
            return self.tool_part(part)
        return self.stats.skip(f"part:{kind}")

    def text_part(self, part: dict[str, Any]) -> list[Event]:
        """Text or reasoning; a user message's text is the prompt."""
        part_id, user = str(part["id"]), self.roles.get(str(part.get("messageID"))) == "user"
        times = obj(part.get("time"))
        done = user or "end" in times
        block = {"id": part_id, "kind": "user_message" if user else _TEXT_KINDS[part["type"]],
                 "status": "complete" if done else "pending", "content": str(part.get("text") or "")}
        eid = event_id(part_id, digest(block))
        return [blocks.upsert(self.stats, eid, block, self.sub(part), times.get("start"))]

    def tool_part(self, part: dict[str, Any]) -> list[Event]:
        """A tool call: pending or running, then completed or error with its output and signals."""
        part_id, tool, state = str(part["id"]), part["tool"], part["state"]
        status, sub = state.get("status"), self.sub(part)
        done = status in ("completed", "error")
        output = state.get("output") if status == "completed" else state.get("error")
        block = {"id": part_id, "kind": "tool_use", "status": "complete" if done else "pending", "toolName": tool,
                 "input": state.get("input"), "isError": status == "error"}
        if done:
            block["output"] = self.stats.cap(str(output or ""))
        stamp = obj(state.get("time")).get("start")
        events = [blocks.upsert(self.stats, event_id(part_id, digest(block)), block, sub, stamp)]
        if tool in blocks.TASK_TOOLS:
            return events + self.task(part_id, state, sub, stamp)
        return events + (self.signals(part_id, tool, state, stamp) if done else [])

    def task(self, part_id: str, state: dict[str, Any], sub: str | None, stamp: Any) -> list[Event]:
        """A task tool's subagent: spawned when first seen, its child session mapped, completed at the end."""
        meta = obj(state.get("metadata"))
        if isinstance(meta.get("sessionId"), str):
            self.children[meta["sessionId"]] = part_id
        events = []
        if part_id not in self.spawned:
            self.spawned[part_id] = True
            events.append(blocks.spawned(self.stats, event_id(part_id, "spawned"), part_id, state.get("input"), sub,
                                         stamp))
        status = state.get("status")
        if status in ("completed", "error"):
            data = {"subagentId": part_id, "status": "completed" if status == "completed" else "failed",
                    "result": cut(str(state.get("output") or state.get("error") or ""), 2000)}
            events.append(blocks.completed(self.stats, event_id(part_id, "completed"), data, stamp))
        return events

    def signals(self, part_id: str, tool: str, state: dict[str, Any], stamp: Any) -> list[Event]:
        """`modified` for a finished edit or write, `test_pass`/`broke` for a test command's exit status."""
        failed = state.get("status") == "error"
        meta = obj(state.get("metadata"))
        if tool in SHELL_TOOLS:
            code = meta.get("exit")
            code = code if isinstance(code, int) and not isinstance(code, bool) else None
            return outcome_event(self.stats, tool, part_id, state.get("input"), failed or bool(code), stamp, code)
        if tool in EDIT_TOOLS and not failed:
            return edit_event(self.stats, tool, part_id, state.get("input"), self.root, stamp)
        return []

    def delta(self, props: dict[str, Any]) -> list[Event]:
        """Text streamed into a part."""
        part_id, text = str(props["partID"]), props.get("delta")
        if props.get("field") != "text" or not isinstance(text, str):
            return self.stats.skip(f"message.part.delta:{props.get('field')}")
        eid = event_id(part_id, f"d{self.nth(part_id)}")
        return [blocks.delta(self.stats, eid, part_id, text, self.sub(props))]

    def idle(self, props: dict[str, Any]) -> list[Event]:
        """The session stopped working: its query is complete and pending blocks final."""
        session = str(props["sessionID"])
        if session in self.children:
            return self.stats.skip("session.idle:subagent")
        n = self.nth(f"idle:{session}")
        return [make_event(self.stats, event_id(session, "done", n), "query:completed", {"sessionId": session}),
                make_event(self.stats, event_id(session, "idle", n), "session:idle", {"sessionId": session})]

    def status(self, props: dict[str, Any]) -> list[Event]:
        """Busy and retry are metadata; idle is left to session.idle, which always follows it."""
        status = props["status"]
        if status.get("type") == "idle":
            return self.stats.skip("session.status:idle")
        session = str(props["sessionID"])
        eid = event_id(session, "status", self.nth(f"status:{session}"))
        return [make_event(self.stats, eid, "metadata:update", {"status": status})]

    def error(self, props: dict[str, Any]) -> list[Event]:
        """A session error fails the query."""
        session = str(props.get("sessionID"))
        eid = event_id(session, "error", self.nth(f"error:{session}"))
        return [make_event(self.stats, eid, "query:failed", {"error": props.get("error")})]

    def todos(self, props: dict[str, Any]) -> list[Event]:
        """The session's todo list as it is now."""
        todos = props["todos"]
        if not isinstance(todos, list):
            return self.stats.skip("todo.updated:bad_todos")
        eid = event_id(str(props.get("sessionID")), "todos", digest(todos))
        return [make_event(self.stats, eid, "metadata:update", {"todos": todos})]

    def file(self, props: dict[str, Any], etype: str) -> list[Event]:
        """A file the agent edited, or the watcher saw change."""
        entity = file_entity(props.get("file"), self.root)
        if entity is None:
            return self.stats.skip(f"{etype}:bad_path")
        eid = event_id(etype, digest(entity), self.nth(f"{etype}:{entity}"))
        return [make_event(self.stats, eid, etype, {"path": entity[len("file:"):]})]

    def watched(self, props: dict[str, Any]) -> list[Event]:
        """file.watcher.updated: created, modified or deleted."""
        etype = _WATCH.get(str(props.get("event")))
        return self.file(props, etype) if etype else self.stats.skip("file.watcher.updated:bad_event")

    def session_info(self, props: dict[str, Any]) -> list[Event]:
        """A session created or updated: a child of a known session is a subagent's (mapped by its task)."""
        info = props["info"]
        data = {"session": {key: info.get(key) for key in ("id", "title", "parentID") if key in info}}
        return [make_event(self.stats, event_id(str(info["id"]), "info", digest(data)), "metadata:update", data)]


_HANDLERS: dict[str, Any] = {
    "message.updated": OpenCode.message, "message.part.updated": OpenCode.part,
    "message.part.delta": OpenCode.delta, "session.idle": OpenCode.idle, "session.status": OpenCode.status,
    "session.error": OpenCode.error, "todo.updated": OpenCode.todos, "session.created": OpenCode.session_info,
    "session.updated": OpenCode.session_info, "file.watcher.updated": OpenCode.watched,
    "file.edited": lambda self, props: OpenCode.file(self, props, "file:modified"),
}
