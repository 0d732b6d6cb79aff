"""Claude Code transcripts (`~/.claude/projects/<project>/<uuid>.jsonl`) to unified events.

Records: user, assistant, progress, system, summary, file-history-snapshot, queue-operation. A subagent's
messages arrive as `progress` records of type `agent_progress` (their `parentToolUseID` is the Task tool
use that started it) or, in a subagent's own file, as sidechain records naming their `agentId`.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.ingest import blocks
from memento_sessions.ingest.anthropic import AnthropicConverter
from memento_sessions.ingest.events import Event, digest, event_id, make_event, obj

IGNORED = frozenset({"file-history-snapshot", "queue-operation"})  # editor bookkeeping, nothing of the work


class ClaudeCodeTranscript(AnthropicConverter):
    """Stateful converter of one transcript's records, in file order."""

    def convert(self, record: dict[str, Any]) -> list[Event]:
        """The events of one transcript record."""
        kind = record.get("type")
        if kind in IGNORED:
            return self.stats.skip(f"type:{kind}")
        if kind in ("user", "assistant"):
            return self.message(record)
        if kind == "progress":
            return self.progress(record)
        if kind == "system":
            return self.system(record)
        if kind == "summary" and isinstance(record.get("summary"), str):
            eid = event_id("summary", record.get("leafUuid") or digest(record))
            return [make_event(self.stats, eid, "metadata:update", {"summary": record["summary"]})]
        return self.stats.skip(f"unknown_type:{kind}")

    def message(self, record: dict[str, Any], sub: str | None = None) -> list[Event]:
        """A user or assistant record, in the main conversation or a subagent's."""
        events: list[Event] = []
        if self.root is None and isinstance(record.get("cwd"), str):
            self.root = record["cwd"]  # where the session started: file entities are relative to it
        if sub is None:
            sub, events = self.sidechain(record)
        if record.get("type") == "assistant":
            return events + self.assistant(record, sub)
        return events + self.user(record, sub, record.get("toolUseResult"))

    def sidechain(self, record: dict[str, Any]) -> tuple[str | None, list[Event]]:
        """The subagent a sidechain record belongs to; one seen first here is spawned here."""
        agent = record.get("agentId")
        if not record.get("isSidechain") or not isinstance(agent, str):
            return None, []
        if agent in self.agents:
            return str(self.agents[agent]), []
        self.agents[agent] = agent
        data = {"subagentId": agent, "agentId": agent}
        return agent, [make_event(self.stats, event_id(agent, "spawned"), "subagent:spawned", data,
                                  record.get("timestamp"))]

    def progress(self, record: dict[str, Any]) -> list[Event]:
        """A subagent's message (agent_progress); hook and command progress are skipped."""
        data = obj(record.get("data"))
        kind, parent, nested = data.get("type"), record.get("parentToolUseID"), data.get("message")
        if kind != "agent_progress" or not isinstance(parent, str) or not isinstance(nested, dict):
            return self.stats.skip(f"progress:{kind}")
        if isinstance(data.get("agentId"), str):
            self.agents[data["agentId"]] = parent
        if nested.get("type") not in ("user", "assistant"):
            return self.stats.skip(f"progress:agent_progress:{nested.get('type')}")
        return self.message({"timestamp": record.get("timestamp"), **nested}, sub=parent)

    def system(self, record: dict[str, Any]) -> list[Event]:
        """A system line (local command output, compaction boundary, API error) as a system block."""
        content = record.get("content")
        block_id = str(record.get("uuid") or digest(record))
        block = {"id": block_id, "kind": "system", "status": "complete",
                 "content": content if isinstance(content, str) else "", "subtype": record.get("subtype")}
        return [blocks.upsert(self.stats, event_id(block_id), block, None, record.get("timestamp"))]
