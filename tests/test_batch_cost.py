"""What a large event.emitBatch costs the daemon's event loop and Redis: its entity ids are checked in pydantic-core,
not by Python code per id, and a bad id anywhere in it refuses the whole batch with the id's own field path; its
Function call publishes no frames to a session nobody subscribes to, and searches no body for a fencing token
when no event carries one, while a stale token anywhere in a batch still refuses it whole."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from memento_sessions.backends import Backends
from memento_sessions.rpc import PART, Request, let_go_of, validate
from memento_sessions.server.daemon import Daemon
from memento_sessions.sessions.functions import FunctionStore
from memento_sessions.sessions.manager import WHOLE_FROM, emit_args, event_body, iso, now_ms, route
from memento_sessions.sessions.methods import EmitBatchParams
from memento_sessions.sessions.models import EventIn
from tests.helpers import command_calls, token
from tests.rpcsocket import rpc
from tests.test_subscriptions import events_until

pytestmark = pytest.mark.anyio
EVENTS, IDS = 300, 256  # 76,800 ids: the noisy-neighbour bench's checkpoint batch


def batch() -> list[dict[str, Any]]:
    return [{"type": "modified", "changeInfo": {"entityIds": [f"{n:03x}.{i:02x}" for i in range(IDS)]}}
            for n in range(EVENTS)]


@contextmanager
def python_calls() -> Iterator[list[int]]:
    """How many Python functions ran in this thread while inside (C functions not counted)."""
    count = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


def test_a_batch_of_76_800_ids_is_validated_without_python_code_per_id() -> None:
    raw = {"sessionId": "s", "events": batch()}
    with python_calls() as calls:
        params = validate(EmitBatchParams, raw)
    assert len(params.events) == EVENTS
    # Two field validators per event (id, type) are Python; a check per id would be 76,800 calls more.
    assert calls[0] < 10 * EVENTS, f"{calls[0]} Python calls to validate {EVENTS * IDS} ids"


@pytest.mark.parametrize("bad", ["a\u0000b", "tab\there", "del\u007f", "c1\u0085"])
async def test_a_control_character_in_the_last_id_refuses_the_whole_batch(daemon: Daemon, namespace: str,
                                                                          bad: str) -> None:
    events = batch()
    events[-1]["changeInfo"]["entityIds"][-1] = bad
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        reply = await peer.send_raw(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "event.emitBatch",
                                                "params": {"sessionId": sid, "events": events}}))
        assert reply["error"]["code"] == -32602
        assert reply["error"]["data"] == [{"field": f"events.{EVENTS - 1}.changeInfo.entityIds.{IDS - 1}",
                                           "message": "Value error, must not contain control characters "
                                                      "(U+0000-U+001F, U+007F-U+009F)"}]
        got = await peer.call("session.get", {"sessionId": sid})
        assert got["session"]["seq"] == 0 and got["events"] == []
        # The same batch without the bad id is stored whole, in order.
        events[-1]["changeInfo"]["entityIds"][-1] = "fine"
        stored = await peer.call("event.emitBatch", {"sessionId": sid, "events": events})
        assert stored["seqs"] == list(range(1, EVENTS + 1))


async def test_a_batch_nobody_subscribes_to_publishes_no_frames_and_a_later_subscriber_misses_nothing(
        daemon: Daemon, backends: Backends, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as a, rpc(daemon.port, token("bob", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        before = await command_calls(backends, "publish", "spublish")
        assert (await a.call("event.emitBatch", {"sessionId": sid, "events": batch()}))["seqs"][-1] == EVENTS
        # One frame per event was published before, to nobody; the daemon's other traffic publishes a few.
        assert await command_calls(backends, "publish", "spublish") - before < EVENTS // 10
        await b.call("session.subscribe", {"sessionId": sid, "since": 0})
        assert await events_until(b, EVENTS) == list(range(1, EVENTS + 1)), "the stored events, replayed"
        before = await command_calls(backends, "publish", "spublish")
        await a.call("event.emitBatch", {"sessionId": sid, "events": batch()})
        assert await events_until(b, 2 * EVENTS) == list(range(EVENTS + 1, 2 * EVENTS + 1)), "then live frames"
        assert await command_calls(backends, "publish", "spublish") - before >= EVENTS


async def test_a_stale_fencing_token_on_one_event_of_a_large_batch_refuses_all_of_it(daemon: Daemon,
                                                                                     namespace: str) -> None:
    """The Function skips its search for tokens only when no event of the call carries one."""
    async with rpc(daemon.port, token("alice", namespace)) as a, rpc(daemon.port, token("bob", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        old = (await a.call("lease.acquire", {"entityIds": ["fn:x"], "mode": "exclusive", "ttl": 60}))
        await a.call("lease.release", {"leaseId": old["leaseId"]})
        await b.call("lease.acquire", {"entityIds": ["fn:x"], "mode": "exclusive", "ttl": 60})
        events = batch()
        events[-1] = {"type": "modified", "changeInfo": {"entityIds": ["fn:x"]}, "fencingToken": old["fencingToken"]}
        error = await a.error("event.emitBatch", {"sessionId": sid, "events": events})
        assert error["code"] == -32009 and error["data"]["reason"] == "stale_lease"
        got = await a.call("session.get", {"sessionId": sid})
        assert got["session"]["seq"] == 0 and got["events"] == []


async def test_an_answered_batch_is_let_go_of_a_part_at_a_time() -> None:
    """Its events, and the raw ones they were validated from, emptied PART at a time with turns for others between:
    not freed at once (2 ms of the event loop for 76,800 ids) when the request goes."""
    raw = json.loads(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "event.emitBatch",
                                 "params": {"sessionId": "s", "events": batch()}}))
    params = validate(EmitBatchParams, raw["params"])
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await anyio.lowlevel.checkpoint()
            turns += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(count_turns)
        await let_go_of(Request(raw, None, params))
        tg.cancel_scope.cancel()
    assert params.events == [] and raw["params"]["events"] == []
    assert turns >= 2 * EVENTS // PART - 1, "a turn for others after each part of each list"


async def test_a_large_batch_sent_as_whole_members_reads_back_and_streams_as_sent(daemon: Daemon,
                                                                                 namespace: str) -> None:
    """A batch of WHOLE_FROM bytes or more goes to the Function with each event's member built under the seq
    it should get: the stored events and the live frames are those of any other emit."""
    events = batch()
    assert len(json.dumps(events)) >= WHOLE_FROM
    async with rpc(daemon.port, token("alice", namespace)) as a, rpc(daemon.port, token("bob", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "note", "data": {"text": "first"}}})
        await b.call("session.subscribe", {"sessionId": sid, "since": 1})
        assert (await a.call("event.emitBatch", {"sessionId": sid, "events": events}))["seqs"] == \
            list(range(2, EVENTS + 2))
        assert await events_until(b, EVENTS + 1) == list(range(2, EVENTS + 2))
        got = await a.call("session.get", {"sessionId": sid, "since": 1})
    assert [event["seq"] for event in got["events"]] == list(range(2, EVENTS + 2))
    assert [event["changeInfo"]["entityIds"] for event in got["events"]] == \
        [event["changeInfo"]["entityIds"] for event in events]
    assert {event["actor"] for event in got["events"]} == {"alice"}


@pytest.mark.parametrize("guess", [0, 1, 2, 3, 10, 99])
async def test_a_member_sent_under_a_wrong_seq_is_stored_under_its_own(daemon: Daemon, backends: Backends,
                                                                       namespace: str, guess: int) -> None:
    """The daemon reads the session's seq just before a large call; another emit may come first, and an id
    stored before takes no new seq. Each member whose seq was guessed wrong is rebuilt from its body."""
    async with rpc(daemon.port, token("alice", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        for n in (1, 2):
            await a.call("event.emit", {"sessionId": sid, "event": {"type": "note", "id": f"e{n}"}})
        events = [EventIn.model_validate({"type": "note", "id": f"e{n}", "data": {"n": n}}) for n in (3, 1, 4, 2, 5)]
        skeys, channel, session_json = route(namespace, sid)
        stamp = iso(now_ms())
        bodies = [event_body(event, "alice", session_json, stamp) for event in events]
        head: list[str | int] = [now_ms(), "alice", channel, session_json, 1000]
        flat = await FunctionStore(backends.redis).call("ms_emit", skeys, *head, *emit_args(events, bodies, guess))
        assert [int(value) for value in flat] == [3, 0, 1, 1, 4, 0, 2, 1, 5, 0]
        got = await a.call("session.get", {"sessionId": sid})
    assert [(event["seq"], event["id"]) for event in got["events"]] == [(n, f"e{n}") for n in range(1, 6)]
    assert [event["data"] for event in got["events"][2:]] == [{"n": 3}, {"n": 4}, {"n": 5}]
