"""10,000 seeded hostile frames on ONE connection: each answered, the socket kept, nothing bad stored.

The frames (tests/fuzzframes.py) cover wrong types, deep nesting, huge batches, NaN/Infinity and
numbers over 1e12, control characters in ids, another namespace's sessions, unknown methods,
non-object params, JSON-RPC batch arrays, oversized strings, malformed envelopes and lone surrogates.
After each frame a probe request is sent: every reply before the probe's belongs to that frame, and
the probe's own reply proves the connection is still open. Then no error or traceback may have been
logged, every stored event of the namespace must pass tests/storedcheck.py, the other namespace's
session must be untouched, and a checkpoint of every session (FalkorDB and Postgres) must succeed.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect

from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon
from memento_sessions.settings import Settings
from tests.fuzzframes import Frame, Target, frames
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc
from tests.storedcheck import problems, stored_events

pytestmark = pytest.mark.anyio

SEED = 20261123
COUNT = 10_000
WINDOW = 64  # frames (each with its probe) in flight at once
Failures = dict[str, list[str]]


@pytest.fixture
def settings(backend_urls: Endpoints, tmp_path: Path) -> Settings:
    """No rate limit: 20,000 frames must reach the methods, not the bucket."""
    return make_settings(backend_urls, tmp_path, ws_rate_limit=0)


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.redis_url or "")
    yield client
    await client.aclose()


async def seed_sessions(port: int, namespace: str, agent: str, count: int) -> list[str]:
    """`count` sessions of `namespace` with two events each."""
    async with rpc(port, token(agent, namespace)) as peer:
        sids = [(await peer.call("session.create", {}))["sessionId"] for _ in range(count)]
        for sid in sids:
            for kind in ("modified", "test_pass"):
                await peer.call("event.emit", {"sessionId": sid, "event": {"type": kind}})
    return sids


def probe(n: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": f"probe-{n}", "method": "fuzz.probe"})


async def replies_until(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    """The replies (not notifications) before probe `n`'s reply."""
    found: list[dict[str, Any]] = []
    while True:
        message = json.loads(await ws.recv())
        if message.get("id") == f"probe-{n}":
            return found
        if "method" not in message:
            found.append(message)


def judge(frame: Frame, replies: list[dict[str, Any]]) -> str | None:
    """What is wrong with the answer to `frame` (None when it is right)."""
    if len(replies) != 1:
        return f"{len(replies)} replies"
    reply = replies[0]
    if reply.get("jsonrpc") != "2.0" or ("result" in reply) == ("error" in reply):
        return "not a JSON-RPC response"
    if "result" in reply:
        return "accepted, must be refused" if frame.expect == "error" else None
    error = reply["error"]
    if not isinstance(error.get("code"), int) or not isinstance(error.get("message"), str):
        return "malformed error object"
    if frame.expect == "result":
        return f"refused with {error['code']}, must be accepted"
    return None if error["code"] in frame.codes else f"error code {error['code']} ({error['message'][:80]})"


async def fire(ws: ClientConnection, batch: list[tuple[int, Frame]], failures: Failures) -> None:
    """Send a window of frames, each followed by its probe, and judge every answer."""
    for n, frame in batch:
        await ws.send(frame.payload)
        await ws.send(probe(n))
    for n, frame in batch:
        replies = await replies_until(ws, n)
        problem = judge(frame, replies)
        if problem is not None:
            sent = frame.payload if isinstance(frame.payload, str) else repr(frame.payload)
            failures[frame.category].append(f"#{n} {problem}: sent {sent[:160]!r} got {str(replies)[:240]}")


async def fuzz(port: int, agent: str, namespace: str, target: Target) -> tuple[Failures, Counter[str]]:
    """Every frame on one connection; a closed connection fails the test at the frame that closed it."""
    plan = frames(SEED, COUNT, target)
    failures: Failures = defaultdict(list)
    headers = {"Authorization": f"Bearer {token(agent, namespace)}"}
    async with connect(f"ws://127.0.0.1:{port}/ws", additional_headers=headers, max_size=None) as ws:
        for start in range(0, COUNT, WINDOW):
            batch = list(enumerate(plan[start:start + WINDOW], start))
            with anyio.fail_after(30):
                await fire(ws, batch, failures)
    return failures, Counter(frame.category for frame in plan)


async def checkpoint_all(port: int, agent: str, namespace: str, sids: list[str]) -> list[str]:
    """Checkpoint every session: a stored poison would fail in FalkorDB or Postgres here."""
    failed = []
    async with rpc(port, token(agent, namespace)) as peer:
        for sid in sids:
            reply = await peer.request("session.checkpoint", {"sessionId": sid})
            if "error" in reply:
                failed.append(f"{sid}: {reply['error']}")
    return failed


def report(failures: Failures, sent: Counter[str]) -> str:
    lines = [f"seed {SEED}: {sum(map(len, failures.values()))} of {COUNT} frames answered wrongly"]
    for category, items in sorted(failures.items()):
        lines.append(f"  {category}: {len(items)} of {sent[category]}")
        lines += [f"    {item}" for item in items[:3]]
    return "\n".join(lines)


def bad_logs(entries: list[MutableMapping[str, Any]], records: list[logging.LogRecord]) -> list[str]:
    """Errors and tracebacks logged by structlog (entries) or the standard library (records)."""
    found = [str(e)[:300] for e in entries if e.get("log_level") in ("error", "critical") or e.get("exc_info")]
    return found + [r.getMessage()[:300] for r in records if r.levelno >= logging.ERROR or r.exc_info]


async def test_ten_thousand_hostile_frames_on_one_connection(daemon: Daemon, namespace: str, redis: aioredis.Redis,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    other = namespace + "o"
    foreign = await seed_sessions(daemon.port, other, "bob", 2)
    foreign_before = await stored_events(redis, other)
    own = await seed_sessions(daemon.port, namespace, "fuzzer", 3)
    target = Target(own=own, foreign=foreign, agent="fuzzer")
    with capture_logs() as entries, caplog.at_level(logging.WARNING):
        failures, sent = await fuzz(daemon.port, "fuzzer", namespace, target)
        stored = await stored_events(redis, namespace)
        not_checkpointed = await checkpoint_all(daemon.port, "fuzzer", namespace, [s for s in stored if stored[s]])
        await anyio.sleep(0.5)  # automatic checkpoints run in the background
    poisoned = {sid: [(raw[:120], p) for raw in events if (p := problems(raw))] for sid, events in stored.items()}
    found = {
        "frames answered wrongly": report(failures, sent) if failures else "",
        "invalid stored events": str({sid: bad for sid, bad in poisoned.items() if bad})[:2000] if any(
            poisoned.values()) else "",
        "another namespace's session changed": await stored_events(redis, other) != foreign_before,
        "checkpoints failed": not_checkpointed[:5],
        "errors or tracebacks logged": bad_logs(entries, caplog.records)[:5],
        "no valid emit stored (the fuzz aimed at nothing)": sum(map(len, stored.values())) <= 3 * 2,
    }
    assert not any(found.values()), "\n".join(f"{what}: {detail}" for what, detail in found.items() if detail)
