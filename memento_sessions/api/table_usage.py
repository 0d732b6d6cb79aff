"""The usage method, declared: usage.get (what the agents cost); its fold after every emit is a step of
event.emit and event.emitBatch (table_sessions.py)."""

from __future__ import annotations

from memento_sessions.api.args import UsageAgent, UsageCursor, UsageLimit, UsageSession, UsageSince
from memento_sessions.api.spec import READ, Arg, Declared, Tool
from memento_sessions.client.results import Usage
from memento_sessions.usage.methods import PAGE, UsageParams

USAGE: tuple[Declared, ...] = (
    Declared(
        "usage.get",
        UsageParams,
        Usage,
        READ,
        lambda s: s.usage.get,
        "Tokens, tool calls, time and cost per run, of a session, an agent or the namespace.",
        tools=(
            Tool(
                "usage",
                28,
                "read",
                (
                    Arg("sessionId", UsageSession, None),
                    Arg("agentId", UsageAgent, None),
                    Arg("since", UsageSince, None),
                    Arg("cursor", UsageCursor, None),
                    Arg("limit", UsageLimit, PAGE),
                ),
                """What agents cost: tokens (input, output, cache read, cache creation), tool calls, API calls, time and
                cost in USD, per run (one prompt's turn), for a session, an agent, or your whole namespace. costUsd is
                null where the source gave no cost (no price is guessed). totals are from the most trusted source
                (otel, the agent's own OpenTelemetry, then otel-metrics, then events from transcripts); bySource
                splits them. When the reply has nextCursor, call again with cursor=nextCursor for more runs.""",
            ),
        ),
    ),
)
