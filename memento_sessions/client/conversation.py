"""The conversation state of a session on the client side, by the daemon's own reducer.

`LiveConversation` folds a session's events as they arrive (a `Subscription`, deltas and all) with the
reducer the daemon's `session.conversation` uses (memento_sessions.ingest), so an app that streams a
session sees the same blocks, subagents and condensed view it would get by loading it afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from memento_sessions.client.feeds import Event, Subscription
from memento_sessions.client.methods import Methods
from memento_sessions.ingest import Conversation


class LiveConversation:
    """A session's conversation state, updated one event at a time; `view()` is the reducer's JSON."""

    def __init__(self) -> None:
        self.state = Conversation()
        self.last_seq = 0

    def apply(self, event: Event | Mapping[str, Any]) -> None:
        """Fold one event: a subscription's `Event` or a stored event as `session.get` returns it."""
        body = event.event if isinstance(event, Event) else dict(event)
        seq = body.get("seq")
        if isinstance(seq, int):
            if seq <= self.last_seq:  # a replay after a reconnect repeats nothing
                return
            self.last_seq = seq
        self.state.apply(body)

    def view(self) -> dict[str, Any]:
        """{blocks, subagents, idle, metadata, condensed: {tools, prompts, todos, tasks}}."""
        return self.state.view()

    async def follow(self, subscription: Subscription) -> AsyncIterator[dict[str, Any]]:
        """Fold each event of the subscription and yield the event's body once it is applied."""
        async for event in subscription:
            self.apply(event)
            yield event.event


async def load_conversation(client: Methods, session_id: str) -> LiveConversation:
    """The conversation of every stored event of the session, read page by page."""
    live = LiveConversation()
    async for event in client.iter_events(session_id):
        live.apply(event)
    return live
