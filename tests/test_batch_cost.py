"""What a large event.emitBatch costs the daemon's event loop: its entity ids are checked in pydantic-core, not by
Python code per id, and a bad id anywhere in it refuses the whole batch with the id's own field path."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from memento_sessions.rpc import validate
from memento_sessions.server.daemon import Daemon
from memento_sessions.sessions.methods import EmitBatchParams
from tests.helpers import token
from tests.rpcsocket import rpc

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
