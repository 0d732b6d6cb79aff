"""The plain text a hook's answer puts in an agent's context: short lines an LLM reads, bounded.

Every piece is cut to its own share and the whole to MAX_CONTEXT characters; what did not fit is said in
one last line (how many items, and the tool that shows them), never silently dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic_core

Result = dict[str, Any]
MAX_CONTEXT = 4000  # characters of one answer's additionalContext
MAX_LINE = 300  # characters of one item
KINDS = {"lease.conflict": "conflict", "session.broke": "broke", "session.fixed": "fixed"}  # a notice's kind
MAX_NOTICE_BODY = 2000  # characters of a notice's body (encoded); a longer one is cut, read_inbox has it whole


def cut(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def message_line(message: Result) -> str:
    """One message as a line: who sent it, its subject and its body (a conflict alert said as one)."""
    if message.get("subject") == "lease.conflict" and isinstance(message.get("body"), dict):
        body = message["body"]
        return cut(f"- conflict: {body.get('by')} changed {body.get('entityId')}, which you lease "
                   f"({body.get('leaseId')}), in session {body.get('sessionId')} (event {body.get('eventType')}).")
    if message.get("subject") in ("session.broke", "session.fixed") and isinstance(message.get("body"), dict):
        body = message["body"]
        did = "broke the build" if body.get("state") == "broken" else "fixed the build"
        return cut(f"- {body.get('by')} {did} ({body.get('command')}) in session {body.get('sessionId')} after "
                   f"changing {', '.join(body.get('entityIds') or [])}, which you lease.")
    body = message.get("body")
    text = body if isinstance(body, str) else pydantic_core.to_json(body).decode()
    subject = f" [{message['subject']}]" if message.get("subject") else ""
    return cut(f"- message {message.get('messageId')} from {message.get('from')}{subject}: {text}")


def notice(message: Result) -> Result:
    """A message as an MCP tool result's notice: `kind` (message or conflict), who, what, when; a long body
    cut to text (`truncated`)."""
    kind = KINDS.get(str(message.get("subject")), "message")
    item = {"kind": kind, **{key: message.get(key) for key in ("messageId", "from", "subject", "sentAt", "body")}}
    text = pydantic_core.to_json(item["body"]).decode()
    if len(text) > MAX_NOTICE_BODY:
        item.update(body=cut(text, MAX_NOTICE_BODY), truncated=True)
    return item


def lease_line(lease: Result) -> str:
    reason = f", reason: {lease['reason']}" if lease.get("reason") else ""
    return f"{', '.join(lease.get('entityIds') or [])} (until {lease.get('expiresAt')}{reason})"


def event_line(raw: str) -> str:
    """A stored event in a few words: its seq, type and what it names."""
    event = pydantic_core.from_json(raw)
    data: Result = event["data"] if isinstance(event.get("data"), dict) else {}
    block: Result = data["block"] if isinstance(data.get("block"), dict) else {}
    what = block.get("toolName") or data.get("file") or data.get("hook") or ""
    entities = (event.get("changeInfo") or {}).get("entityIds") or []
    named = " ".join(str(item) for item in [what, *entities[:3]] if item)
    return cut(f"#{event.get('seq')} {event.get('type')} {named}".rstrip(), 160)


def fit(title: str, sections: Sequence[tuple[str, Sequence[str]]], limit: int = MAX_CONTEXT) -> str:
    """The title and each non-empty section's heading and lines, within `limit` characters; a last line says
    how many lines were left out."""
    room = limit - 140  # kept for the last line
    lines, size, left = [title], len(title), 0
    for heading, items in sections:
        if not items:
            continue
        if left or size + len(heading) + len(items[0]) + 2 > room:
            left += len(items)
            continue
        lines.append(heading)
        size += len(heading) + 1
        for index, line in enumerate(items):
            if size + len(line) + 1 > room:
                left += len(items) - index
                break
            lines.append(line)
            size += len(line) + 1
    if left:
        lines.append(f"({left} more item(s) left out for length: read_inbox, list_leases and who_is_here show them.)")
    return "\n".join(lines)
