"""Gemini CLI hook inputs as the Claude Code hook inputs they mean, and the answers back in Gemini's output.

Gemini CLI's hooks (its docs/hooks/reference.md) read one JSON object on stdin with `session_id`,
`transcript_path`, `cwd`, `hook_event_name` and `timestamp`, like Claude Code's, under other names:
BeforeTool/AfterTool (with `tool_name`, `tool_input`, AfterTool's `tool_response` with an optional
`error`), BeforeAgent (`prompt`), AfterAgent, PreCompress, SessionStart (`source`), SessionEnd (`reason`),
Notification. `to_claude` renames the event and the tools whose meaning the daemon reads (write_file and
replace edit a file, run_shell_command runs one), so the same converter records its events and the same
answer serves it; `gemini_output` turns that answer into Gemini's output: `hookSpecificOutput.additionalContext`
where Gemini takes context (SessionStart, BeforeAgent, AfterTool), `decision: "deny"` with its `reason` for
a denied BeforeTool, and a BeforeTool warning as `systemMessage` (Gemini's BeforeTool adds no context).
Gemini's inputs carry no tool call id: one derives from the session, the tool and its input, so a
BeforeTool and its AfterTool name the same call.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

EVENTS = {"SessionStart": "SessionStart", "SessionEnd": "SessionEnd", "BeforeAgent": "UserPromptSubmit",
          "AfterAgent": "Stop", "BeforeTool": "PreToolUse", "AfterTool": "PostToolUse", "PreCompress": "PreCompact",
          "Notification": "Notification"}
TOOLS = {"write_file": "Write", "replace": "Edit", "run_shell_command": "Bash", "read_file": "Read"}


def to_claude(record: Any) -> Any:
    """The Claude Code hook input a Gemini CLI one means; anything else (not an object, another event) as it
    is, for the daemon to count and leave alone."""
    if not isinstance(record, dict) or record.get("hook_event_name") not in EVENTS:
        return record
    event = EVENTS[record["hook_event_name"]]
    out = {**record, "hook_event_name": event}
    if event in ("PreToolUse", "PostToolUse") and isinstance(record.get("tool_name"), str):
        out["tool_name"] = TOOLS.get(record["tool_name"], record["tool_name"])
        out["tool_use_id"] = call_id(record)
        response = record.get("tool_response")
        if event == "PostToolUse" and isinstance(response, dict) and response.get("error"):
            out["hook_event_name"] = "PostToolUseFailure"
            out["error"] = str(response["error"])
        elif event == "PostToolUse" and isinstance(response, dict):
            out["tool_response"] = {"content": response.get("llmContent"), **response}
    return out


def call_id(record: dict[str, Any]) -> str:
    """A tool call's id: the same for its BeforeTool and AfterTool."""
    key = json.dumps([record.get("session_id"), record.get("tool_name"), record.get("tool_input")], sort_keys=True,
                     default=str)
    return "gemini_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def gemini_output(answer: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's hook output as Gemini CLI's."""
    specific = answer.get("hookSpecificOutput")
    if not isinstance(specific, dict):
        return {}
    if specific.get("permissionDecision") == "deny":
        return {"decision": "deny", "reason": specific.get("permissionDecisionReason", "")}
    context = specific.get("additionalContext")
    if not context:
        return {}
    if specific.get("hookEventName") == "PreToolUse":
        return {"systemMessage": context}
    return {"hookSpecificOutput": {"additionalContext": context}}
