"""The two roles of a chaos run: the agent that emits, and the subscribers that watch.

The agent sends batches of events, each event with its own client id, and sends a batch again, with
the same ids, after any error or timeout (on the other daemon when the first fails): the server
dedups by id, so a retry never doubles an event. Subscribers use the package's Python client, which
resumes after the last seq it delivered, with the epoch it last saw, whenever its connection drops.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import anyio
from websockets.exceptions import WebSocketException

from memento_sessions.client import Client, HistoryLost, MementoError, RpcError

RETRYABLE = (MementoError, OSError, TimeoutError, WebSocketException)


class Agent:
    """Emits `events` events in batches, `inflight` batches at once, at most `rate` events a second."""

    def __init__(self, urls: list[str], token: str, session_id: str, opts: Any) -> None:
        self.urls, self.token, self.session_id = urls, token, session_id
        self.events, self.batch, self.inflight, self.rate = opts.events, opts.batch, opts.inflight, opts.rate
        self.timeout = opts.timeout
        self.acked: dict[str, int] = {}
        self.seq_changed = 0  # an id acked twice with two different seqs (a retry that was not deduped)
        self.errors: Counter[str] = Counter()
        self.retries = 0
        self._clients: dict[str, Client] = {}
        self._slot = time.monotonic()
        self._next_batch = 0

    async def run(self, deadline: float) -> None:
        """Send every batch (or stop at `deadline`); then close the clients."""
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self.inflight):
                    tg.start_soon(self._worker, deadline)
        finally:
            for client in self._clients.values():
                await client.aclose()

    async def _worker(self, deadline: float) -> None:
        while self._next_batch < self.events and time.monotonic() < deadline:
            start = self._next_batch
            self._next_batch = min(start + self.batch, self.events)
            events = [{"id": f"ev-{i}", "type": "modified", "data": {"i": i}} for i in range(start, self._next_batch)]
            await self._pace(len(events))
            await self._send(start // self.batch, events, deadline)

    async def _pace(self, count: int) -> None:
        now = time.monotonic()
        at = max(now, self._slot)
        self._slot = at + count / self.rate
        await anyio.sleep(at - now)

    async def _send(self, number: int, events: list[dict[str, Any]], deadline: float) -> None:
        """One batch until it is acknowledged, the same ids every time, alternating daemons on failure."""
        for attempt in range(1_000_000):
            if time.monotonic() > deadline:
                return
            url = self.urls[(number + attempt) % len(self.urls)]
            try:
                with anyio.fail_after(self.timeout + 1):
                    result = await (await self._client(url)).emit_batch(self.session_id, events)
            except RETRYABLE as exc:
                self._failed(url, exc)
                await anyio.sleep(min(0.05 * 2 ** min(attempt, 5), 1.0))
                continue
            self._record(events, result["seqs"])
            return

    def _failed(self, url: str, exc: BaseException) -> None:
        code = f" {exc.code}" if isinstance(exc, RpcError) else ""
        self.errors[f"{type(exc).__name__}{code}"] += 1
        self.retries += 1
        if not isinstance(exc, RpcError):
            self._clients.pop(url, None)  # a fresh client next time: this one may be closed for good

    async def _client(self, url: str) -> Client:
        client = self._clients.get(url)
        if client is None:
            client = Client(url, self.token, request_timeout=self.timeout, backoff=(0.05, 1.0))
            await client.__aenter__()
            self._clients[url] = client
        return client

    def _record(self, events: list[dict[str, Any]], seqs: list[int]) -> None:
        for event, seq in zip(events, seqs, strict=True):
            before = self.acked.setdefault(event["id"], seq)
            if before != seq:
                self.seq_changed += 1


class Watcher:
    """One subscriber on one daemon: every seq and id it is handed, in the order it is handed them."""

    def __init__(self, name: str, url: str, token: str, session_id: str) -> None:
        self.name, self.url, self.token, self.session_id = name, url, token, session_id
        self.seqs: list[int] = []
        self.ids: list[str | None] = []
        self.history_lost = 0
        self.restarts = 0  # the subscription ended with an error and was made anew, resuming after the last seq
        self.restart_reasons: Counter[str] = Counter()
        self.client: Client | None = None
        self.epoch: str | None = None

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def reconnects(self) -> int:
        return self.client.reconnects if self.client is not None else 0

    async def run(self) -> None:
        """Subscribe from seq 0 and keep watching until cancelled."""
        while True:
            try:
                await self._watch()
            except RETRYABLE as exc:
                self.restarts += 1
                self.restart_reasons[f"{type(exc).__name__}{f' {exc.code}' if isinstance(exc, RpcError) else ''}"] += 1
                await anyio.sleep(0.2)

    async def _watch(self) -> None:
        async with Client(self.url, self.token, request_timeout=10, max_queue=200_000,
                          backoff=(0.05, 1.0)) as client:
            self.client = client
            since = self.last_seq if self.seqs else 0
            async with client.subscribe(self.session_id, since=since, epoch=self.epoch) as sub:
                while True:
                    try:
                        event = await sub.__anext__()
                    except HistoryLost:
                        self.history_lost += 1
                        continue
                    except StopAsyncIteration:
                        return
                    self.epoch = sub.epoch
                    self.seqs.append(event.seq)
                    self.ids.append(event.event.get("id"))

    def cut(self) -> bool:
        """Drop the subscriber's TCP connection without a close frame, as a network cut would."""
        ws = self.client.connection if self.client is not None else None
        if ws is None:
            return False
        ws.transport.abort()
        return True
