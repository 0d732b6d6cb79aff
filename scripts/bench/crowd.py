"""A crowd of lean clients in a process of its own, so that their CPU is neither the daemon's nor the bench's.

`crowd(spec)` runs this module as `python -m bench.crowd '<spec>'`. The child opens the clients in batches,
prints one JSON line (`{"opened": n, "error": "..."}`), waits for a line on stdin, prints
`{"delivered": n}` (the `session.event` frames, or RESP messages, its clients got) and exits, closing every
socket. A spec is a JSON object:

    kind        "ws": WebSocket clients of the daemon; "pubsub": bare RESP subscribers of Redis
    count       how many clients
    port        (ws) the daemon's port; agents are `<prefix><n>` in `namespace`
    sessions    (ws) client n subscribes to sessions[n % len]; none: the client stays idle once upgraded
    watch       (ws) each client also calls sessions.watch
    url         (pubsub) the Redis URL; channel: the channel each subscribes to, or channels: client n
                subscribes to channels[n % len]

Opening stops at the first batch with a failure (no more descriptors, ports or the daemon's cap); the
line says how many were opened and why it stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from bench.harness import SECRET
from bench.receivers import LeanWebSocket, Receiver, lean_pubsub, upgraded
from memento_sessions.auth import issue_token

BATCH = 200  # clients opened at once: well under the daemon's accept backlog (uvicorn's 2,048)
EVERY = 10**12  # a crowd's clients count every frame they get (Receiver stops at `count`)
LINE_MAX = 1 << 16
SCRIPTS = Path(__file__).resolve().parent.parent  # the bench package's parent, then the project: the child's path


async def request(proto: LeanWebSocket, method: str, params: dict[str, Any]) -> None:
    """One JSON-RPC call on an idle client; raises RuntimeError on an error reply."""
    proto.replied = asyncio.get_running_loop().create_future()
    proto.send_text(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
    reply = await proto.replied
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")


async def open_one(spec: dict[str, Any], n: int, samples: list[float]) -> Receiver:
    """Client n of the crowd, connected (and subscribed) as the spec says."""
    if spec["kind"] == "pubsub":
        channels = spec.get("channels") or [spec["channel"]]
        return await lean_pubsub(spec["url"], channels[n % len(channels)], samples, EVERY)
    token = issue_token(SECRET, f"{spec.get('prefix', 'crowd')}{n}", spec["namespace"], "sessions:read", 3600)
    proto = await upgraded(spec["port"], token, lambda: LeanWebSocket(samples, EVERY))
    if spec.get("sessions"):
        await request(proto, "session.subscribe", {"sessionId": spec["sessions"][n % len(spec["sessions"])]})
    if spec.get("watch"):
        await request(proto, "sessions.watch", {})
    return proto


async def open_all(spec: dict[str, Any], samples: list[float]) -> tuple[list[Receiver], str]:
    """Every client the spec asks for, BATCH at a time; stops at the first failure (and says which)."""
    opened: list[Receiver] = []
    for start in range(0, spec["count"], BATCH):
        batch = range(start, min(start + BATCH, spec["count"]))
        results = await asyncio.gather(*(open_one(spec, n, samples) for n in batch), return_exceptions=True)
        failures = [repr(r) for r in results if isinstance(r, BaseException)]
        opened += [r for r in results if isinstance(r, Receiver)]
        if failures:
            return opened, f"{len(failures)} of a batch failed, e.g. {failures[0]}"
    return opened, ""


async def child(spec: dict[str, Any]) -> None:
    """The child process: open, report, wait for the parent's line, report the deliveries."""
    samples: list[float] = []
    opened, error = await open_all(spec, samples)
    print(json.dumps({"opened": len(opened), "error": error}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(json.dumps({"delivered": sum(r.got for r in opened)}), flush=True)
    for receiver in opened:
        if receiver.transport is not None:
            receiver.transport.close()


@dataclass
class Crowd:
    """The parent's handle on a running crowd."""

    proc: Process
    lines: BufferedByteReceiveStream
    opened: int
    error: str

    async def stop(self) -> int:
        """Tell the crowd to stop; the deliveries its clients counted."""
        assert self.proc.stdin is not None
        await self.proc.stdin.send(b"stop\n")
        with anyio.fail_after(30):
            return int(json.loads(await self.lines.receive_until(b"\n", LINE_MAX))["delivered"])


@asynccontextmanager
async def crowd(spec: dict[str, Any], timeout: float = 120) -> AsyncIterator[Crowd]:
    """A crowd process, its clients open (up to `timeout` s to open them); ended on exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(SCRIPTS.parent)])}
    proc = await anyio.open_process([sys.executable, "-m", "bench.crowd", json.dumps(spec)], env=env, stderr=None)
    try:
        assert proc.stdout is not None
        lines = BufferedByteReceiveStream(proc.stdout)
        with anyio.fail_after(timeout):
            ready = json.loads(await lines.receive_until(b"\n", LINE_MAX))
        yield Crowd(proc, lines, int(ready["opened"]), str(ready["error"]))
    finally:
        with anyio.move_on_after(30, shield=True):
            if proc.returncode is None and proc.stdin is not None:
                await proc.stdin.aclose()  # the child's readline returns: it reports, closes and exits
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()


if __name__ == "__main__":
    asyncio.run(child(json.loads(sys.argv[1])))
