"""Converters of real agents' activity into the daemon's events, and the reducer of conversation state.

Converters: claude_code.py (Claude Code transcripts), claude_hooks.py (Claude Code hook inputs),
gemini_hooks.py (Gemini CLI hook inputs, and the answers back), stream_json.py (`claude -p` stream-json),
opencode.py (OpenCode server events), anthropic.py (Anthropic messages), usage.py (what a model call
cost), signals.py (edits, test and build outcomes). Beside them: blocks.py (the unified conversation
events), events.py (daemon events from source records: ids, caps, storable values), lines.py (JSON
Lines to events, the format picked), reducer.py (the one reducer of conversation state).

Pure code with no I/O and only the standard library, so the hook command starts fast. The public API:

- `convert_lines(lines, fmt="auto", project_root=None) -> Conversion(events, stats)`: a whole JSON Lines
  input (a Claude Code transcript, stream-json output, an OpenCode event log); `fmt` is one of
  `FORMATS` (claude-code, stream-json, opencode, hook) or "auto".
- `LineReader(fmt="auto", project_root=None, parse=...)`: the same one line at a time, `.feed(line) -> events`,
  `.finish() -> Stats` (for a caller that sends events while it reads).
- `converter(fmt, project_root=None)`: a stateful converter; `.feed(record) -> list[event]` per parsed
  record, in order, never raising; `.stats` counts records, events, skipped (by reason) and capped.
- `convert_hook(record, at=None, project_root=None) -> (events, stats)`: one Claude Code hook input;
  `at` is the ISO time the hook read it (ids of inputs without an id of their own depend on it).
- `reduce(events) -> Conversation`; `Conversation.apply(event)` for a live stream; `.view()` gives
  `{blocks, subagents, idle, metadata, condensed: {tools, prompts, todos, tasks}}`.

Every event is `{id, type, timestamp?, changeInfo?, stateTransition?, data?}` as `event.emitBatch` takes it,
its id derived from the source record, so ingesting the same input twice writes nothing new.

A leaf: it imports nothing else of the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memento_sessions.ingest.claude_hooks import convert_hook
    from memento_sessions.ingest.events import Event, Stats
    from memento_sessions.ingest.lines import FORMATS, Conversion, LineReader, convert_lines, converter, detect
    from memento_sessions.ingest.reducer import Conversation, reduce

# Each name is imported from its module when first asked: `memento-sessions hook` needs only the hook
# converter, and every module it does not import is time the agent's tool call does not wait.
_HOME = {"convert_hook": "claude_hooks", "Event": "events", "Stats": "events", "FORMATS": "lines",
         "Conversion": "lines", "LineReader": "lines", "convert_lines": "lines", "converter": "lines",
         "detect": "lines", "Conversation": "reducer", "reduce": "reducer"}


def __getattr__(name: str) -> Any:
    """The public names, imported lazily from their modules."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)

__all__ = ["FORMATS", "Conversation", "Conversion", "Event", "LineReader", "Stats", "convert_hook", "convert_lines",
           "converter", "detect", "reduce"]
