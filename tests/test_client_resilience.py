"""The client across refusals that pass: a resubscribe refused for now is retried, not given up."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest

from memento_sessions.client import Client, Subscription
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from tests.helpers import make_settings, token

pytestmark = pytest.mark.anyio


async def test_subscriptions_refused_by_the_rate_limit_on_resubscribe_are_retried_not_ended(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    # 2 requests/s per connection: the 6 resubscribes after a cut mostly get -32029 at first.
    settings = make_settings(backend_urls, tmp_path, ws_rate_limit=2.0)
    async with running(settings) as daemon, \
            Client(f"ws://127.0.0.1:{daemon.port}/ws", token("reader", namespace), backoff=(0.05, 0.5)) as reader, \
            Client(f"ws://127.0.0.1:{daemon.port}/ws", token("writer", namespace), backoff=(0.05, 0.5)) as writer:
        sids = []
        for _ in range(6):
            sids.append((await writer.create_session())["sessionId"])
            await anyio.sleep(0.5)
        async with AsyncExitStack() as stack:
            subs = []
            for sid in sids:
                subs.append(await stack.enter_async_context(reader.subscribe(sid, since=0)))
                await anyio.sleep(0.5)
            await cut_and_check(reader, writer, sids, subs)


async def cut_and_check(reader: Client, writer: Client, sids: list[str], subs: list[Subscription]) -> None:
    """Cut the reader's connection, emit one event into each session, and expect each subscription to get it."""
    assert reader.connection is not None
    reader.connection.transport.abort()  # a network cut: the client reconnects and resubscribes all six
    for sid in sids:
        await writer.emit(sid, {"type": "modified", "id": "after-cut"})
        await anyio.sleep(0.5)
    for sub in subs:
        with anyio.fail_after(30):
            event = await anext(aiter(sub))
        assert event.seq == 1 and event.event["id"] == "after-cut", "every subscription survived the refusals"
    assert reader.reconnects >= 1
