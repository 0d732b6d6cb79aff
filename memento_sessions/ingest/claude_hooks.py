"""Claude Code hook input (the JSON a hook command reads on stdin) to unified events.

Stateless: each hook input carries what its events need (PostToolUse has the tool's input and response).
Tool events take their ids from `tool_use_id`, the same ids the transcript converter gives, so ingesting
the transcript after the hooks writes nothing twice. Other hook inputs carry no id or time of their own:
pass `at` (when the hook command read its input) so two identical Stop inputs stay two events.
"""

from __future__ import annotations

import json
from typing import Any

from memento_sessions.ingest import blocks
from memento_sessions.ingest.events import Converter, Event, Stats, cut, digest, event_id, make_event

# Every hook event the converter reads a meaning from (any other named event becomes a bare metadata:update;
# the hook command and POST /hooks/claude-code take no other): the README's settings blocks register each.
HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "SubagentStart",
               "SubagentStop", "Stop", "PreCompact", "Notification", "SessionEnd")
_META = {"SessionStart": ("source", "model"), "SessionEnd": ("reason",),
         "PreCompact": ("trigger", "custom_instructions"), "Notification": ("message", "notification_type", "title")}


class ClaudeHooks(Converter):
    """Converter of hook inputs; `at` (ISO time the input was read) keeps id-less inputs apart."""

    def __init__(self, project_root: str | None = None) -> None:
        super().__init__(project_root)
        self.at: str | None = None

    def convert(self, record: dict[str, Any]) -> list[Event]:
        """The events of one hook input."""
        name = record.get("hook_event_name")
        root = self.root or (record["cwd"] if isinstance(record.get("cwd"), str) else None)
        tool_id = record.get("tool_use_id")
        if name in ("PreToolUse", "PostToolUse", "PostToolUseFailure"):
            if not isinstance(tool_id, str) or not isinstance(record.get("tool_name"), str):
                return self.stats.skip(f"{name}:no_tool")
            return self.tool(str(name), record, tool_id, root)
        if name == "UserPromptSubmit" and isinstance(record.get("prompt"), str):
            return self.prompt(record)
        if name in ("Stop", "SubagentStop"):
            return self.stop(str(name), record)
        if isinstance(name, str) and name:
            keys = _META.get(name, ())
            data = {"hook": name, **{key: record[key] for key in keys if key in record}}
            return [make_event(self.stats, self.key(record, "meta"), "metadata:update", data, self.at)]
        return self.stats.skip("hook:no_event_name")

    def key(self, record: dict[str, Any], suffix: str) -> str:
        """An id for an input without one of its own: its content and the time it was read."""
        return event_id("hook", digest({"record": record, "at": self.at}), suffix)

    def tool(self, name: str, record: dict[str, Any], tool_id: str, root: str | None) -> list[Event]:
        """A tool use (PreToolUse) or its end (PostToolUse, PostToolUseFailure) with its signals."""
        tool, tool_input = record["tool_name"], record.get("tool_input")
        if name == "PreToolUse":
            block = {"id": tool_id, "kind": "tool_use", "status": "pending", "toolName": tool, "input": tool_input}
            events = [blocks.upsert(self.stats, event_id(tool_id, "use"), block, None, self.at)]
            if tool in blocks.TASK_TOOLS:
                events.append(blocks.spawned(self.stats, event_id(tool_id, "spawned"), tool_id, tool_input, None,
                                             self.at))
            return events
        failed = name == "PostToolUseFailure"
        response = record.get("tool_response") if not failed else record.get("error")
        block = {"id": tool_id, "kind": "tool_use", "status": "complete", "toolName": tool, "input": tool_input,
                 "output": self.stats.cap(_output(response)),
                 "isError": failed}
        events = [blocks.upsert(self.stats, event_id(tool_id, "result"), block, None, self.at)]
        return events + self.signals(tool, tool_id, tool_input, response, failed, record)

    def signals(self, tool: str, tool_id: str, tool_input: Any, response: Any, failed: bool,
                record: dict[str, Any]) -> list[Event]:
        """The coding signals and subagent end of a finished tool (the signals' module, which compiles its
        command patterns at import, is imported here: `memento-sessions hook` converts one input per process,
        and only a finished tool needs it)."""
        from memento_sessions.ingest.signals import SHELL_TOOLS, edit_event, exit_code_of, outcome_event

        extra = response if isinstance(response, dict) else {}
        if tool in blocks.TASK_TOOLS:
            data = {"subagentId": tool_id, "agentId": extra.get("agentId"),
                    "status": "failed" if failed else "completed",
                    "result": cut(blocks.text_of(extra.get("content")), 2000)}
            return [blocks.completed(self.stats, event_id(tool_id, "completed"), data, self.at)]
        if tool in SHELL_TOOLS:
            interrupted = extra.get("interrupted") is True or record.get("is_interrupt") is True
            code = extra.get("exit_code", extra.get("exitCode"))
            code = code if isinstance(code, int) and not isinstance(code, bool) else exit_code_of(response)
            # A failure (PostToolUseFailure, a non-zero exit code) breaks; a zero exit code passes; no exit code
            # at all is no outcome, not a pass (an interrupted run is none either).
            fails = None if interrupted else True if failed else None if code is None else bool(code)
            return outcome_event(self.stats, tool, tool_id, tool_input, fails, self.at, code)
        if failed:
            return []
        root = self.root or record.get("cwd")
        return edit_event(self.stats, tool, tool_id, tool_input, root if isinstance(root, str) else None, self.at,
                          extra.get("type") == "create")

    def prompt(self, record: dict[str, Any]) -> list[Event]:
        """A prompt the user submitted: a user block and the query it starts."""
        block_id = self.key(record, "prompt")
        block = {"id": block_id, "kind": "user_message", "status": "complete", "content": record["prompt"]}
        query = {"prompt": cut(record["prompt"], 1000)}
        return [blocks.upsert(self.stats, block_id, block, None, self.at),
                make_event(self.stats, self.key(record, "query"), "query:started", query, self.at)]

    def stop(self, name: str, record: dict[str, Any]) -> list[Event]:
        """Stop: the query is done and the agent idle. SubagentStop: that subagent is done."""
        if name == "SubagentStop":
            data = {"agentId": record.get("agent_id"), "agentType": record.get("agent_type"), "status": "completed",
                    "result": cut(record.get("last_assistant_message"), 2000)}
            if not isinstance(data["agentId"], str):
                return self.stats.skip("SubagentStop:no_agent_id")
            return [blocks.completed(self.stats, self.key(record, "subagent"), data, self.at)]
        return [make_event(self.stats, self.key(record, "done"), "query:completed", {}, self.at),
                make_event(self.stats, self.key(record, "idle"), "session:idle", {}, self.at)]


def _output(response: Any) -> str:
    """What a tool response shows: a Bash response's stdout and stderr, its content, or the whole as JSON."""
    if isinstance(response, str):
        return response
    if isinstance(response, dict) and "stdout" in response:
        return "\n".join(str(response.get(key) or "") for key in ("stdout", "stderr")).strip()
    if isinstance(response, dict) and isinstance(response.get("content"), str | list):
        return blocks.text_of(response["content"])
    return json.dumps(response, ensure_ascii=False, default=str)


def convert_hook(record: Any, at: str | None = None, project_root: str | None = None) -> tuple[list[Event], Stats]:
    """The events of one hook input and the converter's stats: the hook command's one call."""
    converter = ClaudeHooks(project_root)
    converter.at = at
    return converter.feed(record), converter.stats
