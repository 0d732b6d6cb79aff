"""What a model call cost, as `usage` events: the tokens of each assistant message as the source reports them.

A source may report one message's usage several times as it grows (a Claude Code transcript writes one
line per content block, each repeating the message's usage; OpenCode updates a message as it streams).
Each `usage` event therefore carries the change since the message's previous report, so the daemon adds
them up without knowing the message; a report identical to the last writes nothing, and its id (the
message id and the totals so far) keeps re-ingesting the same input from counting twice.

`data`: {messageId, apiCalls (1 on a message's first report), model?, inputTokens, outputTokens,
cacheReadTokens, cacheCreationTokens, costUsd?, subagentId?}. The daemon folds them into runs (usage/fold.py).
"""

from __future__ import annotations

import math
from typing import Any

from memento_sessions.ingest.blocks import with_sub
from memento_sessions.ingest.events import MAX_NUMBER, Event, Stats, event_id, make_event

USAGE = "usage"  # the event type
FIELDS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens")
ANTHROPIC = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
Totals = tuple[int, int, int, int, float]


def count(value: Any) -> int:
    """A token count as the source gave it; 0 for anything that is not a count."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return int(min(max(value, 0), MAX_NUMBER))


def money(value: Any) -> float:
    """A cost in USD as the source gave it; 0.0 for anything that is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(min(max(value, 0.0), MAX_NUMBER))


def anthropic_totals(usage: Any) -> Totals | None:
    """An Anthropic `usage` object's token counts (no cost: the messages API gives none)."""
    if not isinstance(usage, dict):
        return None
    tokens = [count(usage.get(name)) for name in ANTHROPIC]
    return tokens[0], tokens[1], tokens[2], tokens[3], 0.0


def reported(stats: Stats, seen: dict[str, Any], message_id: str, totals: Totals, model: Any, sub: str | None,
             stamp: Any) -> list[Event]:
    """The `usage` event of a message's latest report: what changed since its previous one (none if nothing)."""
    first = message_id not in seen
    before: Totals = seen.get(message_id, (0, 0, 0, 0, 0.0))
    if totals == before:
        return []
    seen[message_id] = totals
    data: dict[str, Any] = {"messageId": message_id, "apiCalls": 1 if first else 0}
    if isinstance(model, str) and model:
        data["model"] = model[:128]
    data.update({name: now - then for name, now, then in zip(FIELDS, totals[:4], before[:4], strict=True)})
    if totals[4] != before[4]:
        data["costUsd"] = round(totals[4] - before[4], 9)
    key = "-".join(str(value) for value in totals)
    return [make_event(stats, event_id(message_id, "usage", key), USAGE, with_sub(data, sub), stamp)]
