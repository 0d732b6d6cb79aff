"""Coordination: lease acquire latency, mailbox send-to-live-delivery latency and throughput, and emit
throughput with 1,000 live leases, each beside a floor of bare redis-py doing the same Redis work.

- lease acquire: one `lease.acquire` of a file of the generated codebase graph (exclusive, so also of the 1 to
  3 symbols it DEFINES: the coverage path) over WebSocket, sequential, each a file of its own, from a lean
  client; the floor is FCALL mc_acquire with the same keys and arguments, the symbols included, from a
  lean one too (the daemon expands coverage from its cached containment, checked by the graph version
  inside that call: no other call).
- mailbox live: from one agent's `mailbox.send` to the recipient's `mailbox.message` frame, both connected
  to the daemon; the floor is redis-py's FCALL mc_send + PUBLISH to a redis-py subscriber.
- mailbox throughput: 16 senders at once to one connected recipient, counted where it arrives; the floor
  is 16 redis-py tasks doing FCALL mc_send.
- emit with leases: one agent's sequential `event.emit` of PAYLOAD (two entities) over WebSocket while
  1,000 leases on other entities are live, against the same without leases, rounds alternated.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from websockets.asyncio.client import connect

from bench.harness import PAYLOAD, Env, Figure, Target, concurrently, latency_extra, pct, rate, timed, ws
from bench.receivers import LeanCaller, masked_frame, upgraded
from bench.watch import quiet
from memento_sessions import keys
from memento_sessions.coordination.coverage import GRAPH_FIELD
from memento_sessions.kg.fixture import generate
from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import parse_lines, upsert
from memento_sessions.redisio.pipe import Pipe
from memento_sessions.sessions.manager import now_ms

SENDERS = 16
DEFINERS = "MATCH (f:CodebaseEntity)-[:DEFINES]->(s) RETURN f.id, collect(s.id) ORDER BY f.id LIMIT $limit"


async def lease_acquire(env: Env) -> Figure:
    """p99 of lease.acquire of a file (and so the symbols it DEFINES) over WebSocket beside the bare FCALL.

    Both sides use lean clients with every request built before the clock starts: one masked frame per
    call (receivers.LeanCaller) and the Pipe without its spin for the FCALL. The full websockets client
    took 0.3-0.4 ms of this process's CPU per call, and on two vCPUs that CPU competes with the daemon and
    Redis under measurement (their run-queue waits, /proc/<pid>/schedstat, grew with it); redis-py
    took about 0.1 ms. Each reply is checked after the clock stops.
    """
    count = 300 if env.quick else 2000
    run = uuid.uuid4().hex[:8]
    files = await defining_files(env, 2 * count + 1)  # the floor leases other files: no conflict refuses it
    await quiet(env)  # a graph load just now may have grown the AOF past a rewrite
    caller = await upgraded(env.port, env.token(f"leaser-{run}"), LeanCaller)
    try:
        warm = granted(await caller.call(acquire_frame(files[0][0], 0)))  # loads the coverage cache
        if sorted(warm["covers"]) != sorted(files[0][1]):
            raise RuntimeError(f"the lease covers {warm['covers']}, not the file's symbols {files[0][1]}")
        frames = [acquire_frame(file, i + 1) for i, (file, _) in enumerate(files[1:count + 1])]
        replies: list[bytes] = []

        async def one(i: int) -> None:
            replies.append(await caller.call(frames[i]))

        ours = await timed(count, one, remote=True)
    finally:
        assert caller.transport is not None
        caller.transport.close()
    for reply in replies:
        granted(reply)
    floor = await _bare_acquires(env, run, files[count + 1:])
    covered = sum(len(symbols) for _, symbols in files) / len(files)
    return Figure("lease.acquire of a file and its symbols, over WebSocket", "ms p99", pct(ours, 0.99),
                  pct(floor, 0.99), Target.below_ms(2), higher_is_better=False,
                  extra=latency_extra(ours, floor) | {"symbols_per_file": covered})


def acquire_frame(file: str, request_id: int) -> bytes:
    """The masked request frame of an exclusive lease.acquire of `file` for 60 s."""
    return masked_frame(0x1, json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "lease.acquire",
                                         "params": {"entityIds": [file], "ttl": 60}}).encode())


def granted(reply: bytes) -> dict[str, Any]:
    """A lease.acquire reply's result; raises unless the lease was granted."""
    result = json.loads(reply).get("result")
    if not isinstance(result, dict) or not result.get("granted"):
        raise RuntimeError(f"lease.acquire was not granted: {reply[:300]!r}")
    return result


async def _bare_acquires(env: Env, run: str, files: list[tuple[str, list[str]]]) -> list[float]:
    """FCALL mc_acquire of each file with its symbols, as the daemon sends it, over a Pipe that sleeps
    until each reply; the arguments but the clock are built before the clock starts."""
    lkeys = keys.lease_keys(env.namespace).all()
    version = str(await env.redis.hget(keys.lease_keys(env.namespace).fence, GRAPH_FIELD) or "")
    calls: list[list[str | int]] = []
    for i, (file, symbols) in enumerate(files):
        tail = json.dumps({"leaseId": f"floor-{run}-{i}", "agentId": f"floor-{run}", "mode": "exclusive"})[:-1]
        pairs = [item for symbol in symbols for item in (symbol, file)]
        calls.append([f"floor-{run}", f"floor-{run}-{i}", "exclusive", 60_000, 10_000_000, tail, version, 100, 256,
                      2 + len(pairs), file, "", *pairs])  # then no containers to check (a file has none)
    pipe = Pipe(env.redis_url, 0)
    try:
        samples = await timed(len(calls), lambda i: pipe.call("FCALL", "mc_acquire", len(lkeys), *lkeys, now_ms(),
                                                              *calls[i]), remote=True)
    finally:
        pipe.close()
    return samples


async def defining_files(env: Env, count: int) -> list[tuple[str, list[str]]]:
    """`count` entities of the bench namespace's graph with the symbols each DEFINES (the generated codebase
    is loaded first when the graph has too few: none yet, or only the checkpoint section's entities; the
    bridge section loads it too), then a new graph version, as a write through the daemon makes, so its
    coverage cache is current."""
    async with env.backends() as backends:
        graph = await Graphs(backends).get(env.namespace)
        rows = (await graph.ro_query(DEFINERS, {"limit": count})).result_set
        if len(rows) < count:
            await upsert(graph, *parse_lines(json.dumps(r) for r in generate(count)))
            rows = (await graph.ro_query(DEFINERS, {"limit": count})).result_set
    await env.redis.fcall("mc_graph_changed", 1, keys.lease_keys(env.namespace).fence, uuid.uuid4().hex)
    if len(rows) < count:
        raise RuntimeError(f"the bench graph has {len(rows)} files that define symbols, not {count}")
    return [(str(file), [str(symbol) for symbol in symbols]) for file, symbols in rows]


async def mailbox_live(env: Env) -> list[Figure]:
    """p99 send-to-delivery and messages/s through one daemon, each beside its bare-Redis floor."""
    run = uuid.uuid4().hex[:8]
    recipient = f"inbox-{run}"
    url = f"ws://127.0.0.1:{env.port}/ws?token={env.token(recipient)}"
    async with connect(url, max_size=2**24, max_queue=None, compression=None) as conn:  # pushed to from the accept
        latency = await _live_latency(env, conn, recipient, 200 if env.quick else 1000)
    throughput = await _throughput(env, f"bulk-{run}", 100 if env.quick else 500)
    return [latency, throughput]


async def _live_latency(env: Env, conn: Any, recipient: str, count: int) -> Figure:
    async with ws(env, f"sender-{recipient}") as rpc:
        async def one(i: int) -> None:
            await rpc.ws.send(json.dumps({"jsonrpc": "2.0", "id": 10**6 + i, "method": "mailbox.send",
                                          "params": {"to": recipient, "body": {"i": i}}}))
            while b'"mailbox.message"' not in (frame := await conn.recv(decode=False)):
                del frame
            await rpc.ws.recv()  # the sender's reply, sent before or after the push

        ours = await timed(count, one, remote=True)
    async with ws(env, recipient) as reader:  # an inbox fetch of 20 messages, for docs/peers.md
        reads = await timed(count, lambda _: reader.call("mailbox.read", {"limit": 20}), remote=True)
    floor = await _bare_latency(env, count)
    return Figure("mailbox.send to live mailbox.message", "ms p99", pct(ours, 0.99), pct(floor, 0.99),
                  Target.below_ms(5), higher_is_better=False,
                  extra=latency_extra(ours, floor) | {"read20_p50_ms": pct(reads, 0.5)})


async def _bare_latency(env: Env, count: int) -> list[float]:
    """FCALL mc_send (store and PUBLISH), received by a redis-py subscriber."""
    agent, channel = f"bare-{uuid.uuid4().hex[:8]}", f"bench:bare:{uuid.uuid4().hex}"
    mkeys = keys.mailbox_keys(env.namespace, agent)
    async with env.redis.pubsub() as sub:
        await sub.subscribe(channel)
        await sub.get_message(timeout=1.0)

        async def one(i: int) -> None:
            await env.redis.fcall("mc_send", 3, *mkeys, f"m{i}", '"body":1}', 1000, until(), channel,
                                  "mailbox.message")
            while (await sub.get_message(timeout=1.0)) is None:
                pass

        return await timed(count, one, remote=True)


def until(ttl: int = 600) -> int:
    """The unix second a message sent now expires (mc_send's `until`)."""
    return int(time.time()) + ttl


class Inbox(LeanCaller):
    """A lean recipient that counts the `mailbox.message` frames it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.got, self.total, self.arrived = 0, 0, asyncio.Event()

    def _frame(self, opcode: int, payload: bytes, now: int) -> None:
        if opcode == 0x1 and b'"mailbox.message"' in payload[:60]:
            self.got += 1
            if self.got >= self.total:
                self.arrived.set()
        else:
            super()._frame(opcode, payload, now)


async def _throughput(env: Env, recipient: str, per_sender: int) -> Figure:
    """16 lean senders (one request frame built once each) to one lean recipient, counted on arrival: a full
    client library per connection would cost the bench's process as much CPU as the daemon it measures."""
    inbox = await upgraded(env.port, env.token(recipient), Inbox)
    inbox.total = SENDERS * per_sender  # it sends nothing: its pushes start when the daemon accepts it
    senders = [await upgraded(env.port, env.token(f"s{n}-{recipient}"), LeanCaller) for n in range(SENDERS)]
    frame = masked_frame(0x1, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "mailbox.send",
                                          "params": {"to": recipient, "body": {"n": 1}}}).encode())

    async def sender(n: int) -> None:
        for _ in range(per_sender):
            reply = await senders[n].call(frame)
            if b'"result"' not in reply:
                raise RuntimeError(f"mailbox.send failed: {reply[:200]!r}")

    start = time.perf_counter()
    await concurrently(SENDERS, sender)
    await asyncio.wait_for(inbox.arrived.wait(), 30)
    ours = inbox.total / (time.perf_counter() - start)
    for caller in (*senders, inbox):
        assert caller.transport is not None
        caller.transport.close()
    mkeys = keys.mailbox_keys(env.namespace, f"bare-{uuid.uuid4().hex[:8]}")

    async def bare(n: int) -> None:
        for i in range(per_sender):
            await env.redis.fcall("mc_send", 3, *mkeys, f"m{n}-{i}", '"body":1}', 1_000_000, until(),
                                  f"bench:bare:{n}", "mailbox.message")

    floor = await concurrently(SENDERS, bare) * per_sender
    return Figure("mailbox.send to live delivery, 16 senders", "messages/s", ours, floor,
                  Target.at_least(5000, "messages/s"))


async def emit_with_leases(env: Env) -> Figure:
    """Sequential event.emit of PAYLOAD with 1,000 live leases (on other entities) against none, alternated."""
    count, rounds = (300, 1) if env.quick else (2000, 3)
    run = uuid.uuid4().hex[:8]
    without, with_leases = [], []
    async with ws(env, f"emitter-{run}") as rpc, ws(env, f"holder-{run}") as holder:
        sid = (await rpc.call("session.create", {}))["sessionId"]
        params = {"sessionId": sid, "event": PAYLOAD}
        await rate(100, lambda _: rpc.call("event.emit", params))  # warm
        for _ in range(rounds):
            without.append(await rate(count, lambda _: rpc.call("event.emit", params)))
            leases = [(await holder.call("lease.acquire", {"entityIds": [f"held:{run}:{n}"], "ttl": 600}))["leaseId"]
                      for n in range(1000)]
            with_leases.append(await rate(count, lambda _: rpc.call("event.emit", params)))
            for lease in leases:
                await holder.call("lease.release", {"leaseId": lease})
    ours, floor = sum(with_leases) / len(with_leases), sum(without) / len(without)
    return Figure("event.emit with 1,000 live leases", "events/s", ours, floor,
                  Target.ratio_at_least(0.8, "the same emits without leases"),
                  extra={f"round{i + 1}_without": v for i, v in enumerate(without)}
                  | {f"round{i + 1}_with": v for i, v in enumerate(with_leases)})
