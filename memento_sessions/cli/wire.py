"""A blocking JSON-RPC client over one WebSocket, in the standard library only: the hook's way to the daemon.

`memento-sessions hook` runs once per Claude Code hook event and must be done within 200 ms including
the interpreter's start; the async client and the websockets library take longer than that just to
import. This speaks the little of RFC 6455 the hook needs (client handshake, masked text frames out,
text/ping/close in) with a deadline on every read and write.

It keeps below even the standard library's conveniences, each measured on the hook's path: the C module
`_socket` rather than `socket` (whose import turns hundreds of constants into enums: ~7 ms of CPU), the
host given to getaddrinfo as bytes (a str goes through the `idna` codec, which imports stringprep and
unicodedata: ~2.5 ms), binascii and int.to_bytes rather than base64 and struct, a few lines of URL
parsing rather than urllib.parse (which pulls ipaddress), and no typing or contextlib at run time.
"""

from __future__ import annotations

import _socket
import binascii
import os
import time

from memento_sessions.cli import fastjson

TYPE_CHECKING = False  # not `typing`: see above (mypy takes any name TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

MAX_MESSAGE = 16 * 1024 * 1024  # a reply larger than this is not one the hook asked for


class WireError(Exception):
    """The daemon could not be reached, refused the handshake, or went away."""


class RpcFailure(Exception):
    """The daemon answered with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('message')} ({error.get('code')})")
        self.code = error.get("code")
        self.data = error.get("data")


def split_url(url: str) -> tuple[bool, str, int, str]:
    """(wss?, host, port, path) of a ws:// or wss:// URL; its query and fragment are dropped."""
    scheme, _, rest = url.partition("://")
    secure = scheme.lower() == "wss"
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rpartition("@")[2]
    if netloc.startswith("["):  # an IPv6 literal: [::1]:8080
        host, _, port = netloc[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = netloc.partition(":")
    try:
        number = int(port) if port else (443 if secure else 80)
    except ValueError:
        raise WireError(f"bad port in {url}") from None
    path = path.partition("?")[0].partition("#")[0]
    return secure, host or "127.0.0.1", number, "/" + path if slash else "/ws"


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~/")


def daemon_url(data_dir: str, url: str | None, host: str | None, port: str | int | None) -> str:
    """Where every command finds the daemon, one rule: the port (and listen address) in the data dir's
    runtime.json, which a running daemon writes in every mode (unless the process that wrote it is gone);
    else `url` (MEMENTO_URL); else `host` and `port` (MEMENTO_HOST / MEMENTO_PORT, default 127.0.0.1:8765).
    A wildcard listen address means loopback."""
    try:
        with open(os.path.join(data_dir, "runtime.json"), encoding="utf-8") as file:
            runtime = fastjson.loads(file.read())
        if _alive(runtime.get("pid")):  # a daemon killed with -9 left its file behind
            return _ws_url(runtime.get("host"), int(runtime["port"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    if url:
        return url
    return _ws_url(host, int(port or 8765))


def _alive(pid: object) -> bool:
    """Whether the process that wrote runtime.json still runs (True when the file names none)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        return True
    return True


def _ws_url(host: str | None, port: int) -> str:
    host = "127.0.0.1" if host in (None, "", "0.0.0.0", "::") else host
    return f"ws://[{host}]:{port}/ws" if ":" in str(host) else f"ws://{host}:{port}/ws"


def quote(text: str) -> str:
    """Percent-encoded for a query string (as urllib.parse.quote; a token is ASCII already)."""
    return "".join(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}" for byte in text.encode())


def connect(host: str, port: int, timeout: float) -> _socket.socket:
    """A TCP connection to the first of the host's addresses that accepts one (as socket.create_connection)."""
    name = host.encode() if host.isascii() else host.encode("idna")
    failure = OSError(f"no address for {host}")
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        return sock
    raise failure


def post(url: str, token: str, path: str, body: bytes, headers: dict[str, str],
         deadline: float) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 POST to the daemon whose WebSocket is at `url` (ws:// only): (status, headers with lower-case
    names, body). WireError when it cannot be reached or answers past the deadline. The body ends at its
    Content-Length (else when the daemon closes: `Connection: close`), at most MAX_MESSAGE bytes."""
    secure, host, port, _ = split_url(url)
    if secure:
        raise WireError("wss: the hook posts over plain http only")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Authorization: Bearer {token}",
             "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close",
             *(f"{name}: {value}" for name, value in headers.items())]
    try:
        sock = connect(host, port, max(0.001, deadline - time.monotonic()))
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "replace") + body)
            received, length = bytearray(), -1
            while len(received) <= MAX_MESSAGE and (length < 0 or len(received) < length):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WireError("deadline passed")
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
                if length < 0 and b"\r\n\r\n" in received:  # the head: stop at the body's end, not the close
                    top = bytes(received[:received.index(b"\r\n\r\n") + 4])
                    size = reply_head(top)[1].get("content-length", "")
                    length = len(top) + int(size) if size.isdigit() else MAX_MESSAGE + 1
        finally:
            sock.close()
    except OSError as exc:
        raise WireError(str(exc)) from None
    head, _, content = bytes(received).partition(b"\r\n\r\n")
    status, found = reply_head(head)
    return status, found, content


def reply_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers (lower-case names) of an HTTP reply's head; WireError when it is not one."""
    status, *fields = head.decode("latin-1").split("\r\n")
    parts = status.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise WireError(f"not an HTTP reply: {status[:80]!r}")
    return int(parts[1]), {name.strip().lower(): value.strip() for name, _, value in
                           (field.partition(":") for field in fields if field)}


class Wire:
    """One connection; `call` sends a request and returns its result, skipping notifications."""

    def __init__(self, url: str, token: str, deadline: float, session: str | None = None) -> None:
        """`session`: act as that Claude Code session's own agent (the daemon derives it from the token)."""
        self.deadline = deadline
        self.session = session
        self.next_id = 0
        self.buffer = b""
        secure, host, port, path = split_url(url)
        try:
            self.sock = connect(host, port, self.remaining())
            if secure:
                import socket  # only for wss: ssl wraps a socket.socket, and its import is not free either
                import ssl

                plain = socket.socket(fileno=self.sock.detach())
                self.sock = ssl.create_default_context().wrap_socket(plain, server_hostname=host)
            self.handshake(host, port, path, token)
        except OSError as exc:
            raise WireError(str(exc)) from None

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WireError("deadline passed")
        return left

    def handshake(self, host: str, port: int, path: str, token: str) -> None:
        key = binascii.b2a_base64(os.urandom(16), newline=False).decode()
        query = f"token={quote(token)}" + (f"&session={quote(self.session)}" if self.session else "")
        request = (f"GET {path}?{query} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
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
            head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
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
                size = int.from_bytes(self.take(2), "big")
            elif size == 127:
                size = int.from_bytes(self.take(8), "big")
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
            self.send(0x1, fastjson.dumps(request).encode())
            while True:
                message = fastjson.loads(self.receive())
                if isinstance(message, dict) and message.get("id") == self.next_id:
                    break
        except (OSError, ValueError) as exc:
            raise WireError(str(exc)) from None
        if "error" in message:
            raise RpcFailure(message["error"])
        return message.get("result")

    def close(self) -> None:
        """Send a close frame and drop the socket; errors do not matter any more."""
        try:  # noqa: SIM105 - contextlib.suppress would import contextlib
            self.send(0x8, (1000).to_bytes(2, "big"))
        except (OSError, WireError):
            pass
        self.sock.close()
