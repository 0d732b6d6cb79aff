"""A bare JSON-RPC-over-WebSocket peer for tests: raw frames in, raw frames out."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from websockets.asyncio.client import ClientConnection, connect


class RpcSocket:
    """Sends requests and collects replies; notifications are kept aside in order."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.notifications: list[dict[str, Any]] = []

    async def request(self, method: str, params: Any = None) -> dict[str, Any]:
        """Send one request and return the whole reply object."""
        request_id = next(self.ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.ws.send(json.dumps(message))
        return await self.reply(request_id)

    async def send_raw(self, frame: str | bytes) -> dict[str, Any]:
        """Send a frame as it is and return the next reply."""
        await self.ws.send(frame)
        return await self.reply(None, any_id=True)

    async def reply(self, request_id: Any, any_id: bool = False) -> dict[str, Any]:
        with anyio.fail_after(10):
            while True:
                message: dict[str, Any] = json.loads(await self.ws.recv())
                if "id" not in message:
                    self.notifications.append(message)
                elif any_id or message["id"] == request_id:
                    return message

    async def call(self, method: str, params: Any = None) -> Any:
        """The result of a call; fails the test on an error reply."""
        reply = await self.request(method, params)
        assert "error" not in reply, reply
        return reply["result"]

    async def error(self, method: str, params: Any = None) -> dict[str, Any]:
        """The error of a call that must fail."""
        reply = await self.request(method, params)
        assert "error" in reply, reply
        error: dict[str, Any] = reply["error"]
        return error

    async def notification(self, method: str, timeout: float = 5.0) -> dict[str, Any]:
        """The next notification of `method` (from those kept aside first)."""
        with anyio.fail_after(timeout):
            while True:
                for i, message in enumerate(self.notifications):
                    if message["method"] == method:
                        return self.notifications.pop(i)
                self.notifications.append(json.loads(await self.ws.recv()))


@asynccontextmanager
async def rpc(port: int, token: str) -> AsyncIterator[RpcSocket]:
    """An authenticated connection to a daemon on `port`."""
    headers = {"Authorization": f"Bearer {token}"}
    async with connect(f"ws://127.0.0.1:{port}/ws", additional_headers=headers, max_size=2**24) as ws:
        yield RpcSocket(ws)
