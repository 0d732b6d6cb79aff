"""A blocking JSON-RPC client over one WebSocket, in the standard library only: the hook's way to the daemon.

`memento-sessions hook` runs once per Claude Code hook event and must be done within 200 ms including
the interpreter's start; the async client and the websockets library take longer than that just to
import. This speaks the little of RFC 6455 the hook needs (client handshake, masked text frames out,
text/ping/close in) with a deadline on every read and write.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from contextlib import suppress
from typing import Any
from urllib.parse import quote, urlsplit

MAX_MESSAGE = 16 * 1024 * 1024  # a reply larger than this is not one the hook asked for


class WireError(Exception):
    """The daemon could not be reached, refused the handshake, or went away."""


class RpcFailure(Exception):
    """The daemon answered with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('message')} ({error.get('code')})")
        self.code = error.get("code")
        self.data = error.get("data")


class Wire:
    """One connection; `call` sends a request and returns its result, skipping notifications."""

    def __init__(self, url: str, token: str, deadline: float) -> None:
        self.deadline = deadline
        self.next_id = 0
        self.buffer = b""
        parts = urlsplit(url)
        secure = parts.scheme == "wss"
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80)
        try:
            self.sock = socket.create_connection((host, port), timeout=self.remaining())
            if secure:
                import ssl  # only for wss: its import is not free

                self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=host)
            self.handshake(host, port, parts.path or "/ws", token)
        except OSError as exc:
            raise WireError(str(exc)) from None

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WireError("deadline passed")
        return left

    def handshake(self, host: str, port: int, path: str, token: str) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path}?token={quote(token)} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        while b"\r\n\r\n" not in self.buffer:
            self.fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise WireError(f"handshake refused: {status.decode('latin-1')}")

    def fill(self) -> None:
        self.sock.settimeout(self.remaining())
        chunk = self.sock.recv(65536)
        if not chunk:
            raise WireError("connection closed")
        self.buffer += chunk

    def take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            self.fill()
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def send(self, opcode: int, payload: bytes) -> None:
        """One masked frame (a client must mask)."""
        size = len(payload)
        head = bytes([0x80 | opcode])
        if size < 126:
            head += bytes([0x80 | size])
        elif size < 65536:
            head += bytes([0x80 | 126]) + struct.pack("!H", size)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", size)
        mask = os.urandom(4)
        # XOR as one big integer: far faster than a Python loop over the bytes.
        stream = (mask * (size // 4 + 1))[:size]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(size, "big")
        self.sock.settimeout(self.remaining())
        self.sock.sendall(head + mask + masked)

    def receive(self) -> str:
        """The next text message (pings answered, fragments joined); WireError on close."""
        parts: list[bytes] = []
        while True:
            first, second = self.take(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", self.take(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", self.take(8))[0]
            if size > MAX_MESSAGE:
                raise WireError("message too large")
            payload = self.take(size)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise WireError("closed by the daemon")
            if opcode == 0x9:
                self.send(0xA, payload)
            elif opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if first & 0x80:
                    return b"".join(parts).decode()

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """The method's result; RpcFailure for its JSON-RPC error, WireError when the connection fails."""
        self.next_id += 1
        request = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        try:
            self.send(0x1, json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode())
            while True:
                message = json.loads(self.receive())
                if isinstance(message, dict) and message.get("id") == self.next_id:
                    break
        except (OSError, ValueError) as exc:
            raise WireError(str(exc)) from None
        if "error" in message:
            raise RpcFailure(message["error"])
        return message.get("result")

    def close(self) -> None:
        """Send a close frame and drop the socket; errors do not matter any more."""
        with suppress(OSError, WireError):
            self.send(0x8, struct.pack("!H", 1000))
        self.sock.close()
