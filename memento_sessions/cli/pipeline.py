"""JSON-RPC requests pipelined on one blocking WebSocket (cli/wire.py's): how `memento-sessions ingest` sends.

The async client and the websockets library cost about 0.15 s of CPU just to import (asyncio, ssl,
importlib.metadata, email, structlog), a seventh of a 20,000-record ingest, spent before the first batch
goes out while the daemon waits. The ingest needs little of them: requests out in order, several in
flight, their replies in the order the daemon gives them (it answers a connection's requests one after
the other), and the requests not yet answered sent again, in order, on a new connection when one is lost.
That is safe for what ingest sends: every event carries an id the daemon writes once per session, and
creating a session that exists is refused as a conflict.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from memento_sessions.cli.wire import RpcFailure, Wire, WireError
from memento_sessions.retry import backoff_delay

RETRIES = 5  # connections lost in a row, with no reply in between, before the run gives up
BACKOFF = (0.05, 5.0)  # seconds before the first redial, and the most between two


class Pipeline:
    """One connection to the daemon; `send` returns at once, `reply` takes the next reply."""

    def __init__(self, url: str, token: str, timeout: float) -> None:
        self.url, self.token, self.timeout = url, token, timeout
        self.ids = itertools.count(1)
        self.unanswered: dict[int, bytes] = {}  # request id -> its frame, in the order sent
        self.losses = 0  # connections lost since the last reply
        self.wire = self.dial()

    def dial(self) -> Wire:
        """A new connection (WireError when the daemon cannot be reached or refuses the token)."""
        return Wire(self.url, self.token, time.monotonic() + self.timeout)

    def send(self, method: str, params: bytes) -> int:
        """Send a request whose params are JSON already; its id, for matching the reply."""
        request_id = next(self.ids)
        frame = b'{"jsonrpc":"2.0","id":%d,"method":%b,"params":%b}' % (request_id, json.dumps(method).encode(),
                                                                         params)
        self.unanswered[request_id] = frame
        try:
            self.wire.deadline = time.monotonic() + self.timeout
            self.wire.send(0x1, frame)
        except (WireError, OSError):
            self.recover()  # sends every unanswered request again, this one included
        return request_id

    def reply(self) -> tuple[int, Any]:
        """The next reply: (the id of the request it answers, its result, or the RpcFailure of an error reply)."""
        while True:
            try:
                self.wire.deadline = time.monotonic() + self.timeout
                message = json.loads(self.wire.receive())
            except ValueError:
                raise WireError("the daemon sent a reply that is not JSON") from None
            except (WireError, OSError) as exc:
                if isinstance(exc, TimeoutError) or time.monotonic() >= self.wire.deadline:
                    raise WireError(f"no reply within {self.timeout:g} s") from None
                self.recover()
                continue
            if isinstance(message, dict) and message.get("id") in self.unanswered:
                break  # anything else is a notification
        request_id = message["id"]
        del self.unanswered[request_id]
        self.losses = 0
        return request_id, RpcFailure(message["error"]) if "error" in message else message.get("result")

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """One request's result (RpcFailure raised for an error), with nothing else in flight."""
        self.send(method, json.dumps(params).encode())
        result = self.reply()[1]
        if isinstance(result, RpcFailure):
            raise result
        return result

    def recover(self) -> None:
        """The connection was lost: redial with backoff for up to `timeout` seconds, then send the unanswered
        requests again in order; WireError after RETRIES losses without a reply in between."""
        self.losses += 1
        if self.losses > RETRIES:
            raise WireError(f"connection lost {RETRIES} times without a reply")
        self.wire.close()
        give_up = time.monotonic() + self.timeout
        for attempt in itertools.count():
            time.sleep(backoff_delay(attempt, *BACKOFF))
            try:
                self.wire = self.dial()
                for frame in self.unanswered.values():
                    self.wire.send(0x1, frame)
                return
            except (WireError, OSError) as exc:
                if time.monotonic() >= give_up:
                    raise WireError(f"connection lost and not regained within {self.timeout:g} s: {exc}") from None

    def close(self) -> None:
        """Close the connection."""
        self.wire.close()
