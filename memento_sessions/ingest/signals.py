"""Coding signals: a file edit becomes `modified`, a test or build command's outcome `test_pass` or `broke`.

These are the events the checkpointer and the bridge reason about; every converter derives them here
so Claude Code, the Agent SDK and OpenCode give the same signals for the same work.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from memento_sessions.ingest.events import Event, Stats, event_id, make_event

# Tool names (Claude Code and OpenCode) whose use writes a file, and the input key naming it.
EDIT_TOOLS = {"Edit": "file_path", "Write": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path",
              "edit": "filePath", "write": "filePath"}
SHELL_TOOLS = frozenset({"Bash", "bash"})
MAX_ENTITY = 256

# Commands that run tests or a build, matched on one simple command with its runner prefixes removed.
_TEST = re.compile(
    r"^(?:pytest|py\.test|tox|nox|jest|vitest|mocha|rspec|phpunit|ctest"
    r"|go\s+test|cargo\s+(?:test|nextest)|(?:npm|pnpm|yarn|bun)\s+(?:run\s+)?test\S*|deno\s+test|mix\s+test"
    r"|(?:mvn|gradle|gradlew|dotnet)\s+test|make\s+(?:test\S*|check)|bundle\s+exec\s+rspec)(?:\s|$)")
_BUILD = re.compile(
    r"^(?:go\s+build|cargo\s+(?:build|check)|(?:npm|pnpm|yarn|bun)\s+(?:run\s+)?build\S*|tsc|make\s+build"
    r"|(?:mvn|gradle|gradlew)\s+(?:build|package|compile)|dotnet\s+build|mix\s+compile)(?:\s|$)")
_PREFIX = re.compile(
    r"^(?:(?:\w+=\S*|timeout\s+\S+|time|env|exec|nice|npx|pnpx|bunx|uv\s+run|poetry\s+run|pdm\s+run|hatch\s+run"
    r"|pipenv\s+run|python3?\s+-m)\s+)+")
_PATH = re.compile(r"^[^\s=]*/")
_SPLIT = re.compile(r"&&|\|\||;|\||\n")
_EXIT = re.compile(r"^Exit code (\d+)")


def check_kind(command: str) -> str | None:
    """'test' or 'build' when a shell command runs tests or a build; None otherwise."""
    kind = None
    for part in _SPLIT.split(command):
        # Paths go before and after runner prefixes: .venv/bin/python -m pytest, uv run ./node_modules/.bin/jest.
        words = _PATH.sub("", _PREFIX.sub("", _PATH.sub("", part.strip())))
        if _TEST.match(words):
            return "test"
        if _BUILD.match(words):
            kind = "build"
    return kind


def file_entity(path: Any, root: str | None) -> str | None:
    """`file:<path relative to the project root>`; None for a missing path or an id over 256 characters."""
    if not isinstance(path, str) or not path.strip():
        return None
    norm = posixpath.normpath(path.replace("\\", "/"))
    if root and posixpath.isabs(norm):
        base = posixpath.normpath(root.replace("\\", "/"))
        if norm == base or norm.startswith(base.rstrip("/") + "/"):
            norm = posixpath.relpath(norm, base)
    entity = f"file:{norm}"
    return entity if len(entity) <= MAX_ENTITY else None


def edit_event(stats: Stats, tool: str, tool_id: str, tool_input: Any, root: str | None,
               timestamp: Any = None, created: bool = False) -> list[Event]:
    """A `modified` event for a successful edit or write tool use; nothing for other tools."""
    key = EDIT_TOOLS.get(tool)
    if key is None or not isinstance(tool_input, dict):
        return []
    entity = file_entity(tool_input.get(key), root)
    if entity is None:
        return stats.skip("edit_without_usable_path")
    change = {"elementType": "file", "entityIds": [entity], "operation": "added" if created else "modified"}
    return [make_event(stats, event_id(tool_id, "modified"), "modified", {"tool": tool, "toolUseId": tool_id},
                       timestamp, changeInfo=change)]


def outcome_event(stats: Stats, tool: str, tool_id: str, tool_input: Any, failed: bool | None,
                  timestamp: Any = None, exit_code: int | None = None) -> list[Event]:
    """`test_pass` or `broke` for a finished test or build command; nothing for other commands or no outcome."""
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if tool not in SHELL_TOOLS or not isinstance(command, str) or failed is None:
        return []
    kind = check_kind(command)
    if kind is None:
        return []
    etype, state = ("broke", "broken") if failed else ("test_pass", "working")
    data: dict[str, Any] = {"command": command[:512], "toolUseId": tool_id, "check": kind}
    if exit_code is not None:
        data["exitCode"] = exit_code
    transition = {"to": state, "verifiedBy": kind}
    return [make_event(stats, event_id(tool_id, "outcome"), etype, data, timestamp, stateTransition=transition)]


def exit_code_of(text: Any) -> int | None:
    """The exit status Claude Code writes at the head of a failed command's result ("Exit code 2")."""
    if isinstance(text, str):
        found = _EXIT.match(text)
        if found:
            return int(found.group(1))
    return None

